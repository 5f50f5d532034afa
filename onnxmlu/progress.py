"""The progress display of the pipeline run in progress, for work deep inside a pass.

A pass's own line comes from the pass manager (:class:`onnxmlu.pipeline.ShowProgress`), but a
long step inside one -- ``--precision auto`` runs dozens of trial plans on every sample, for
minutes -- has a count to show (trials run of how many) that its caller's signature does not
carry. The pass manager makes the run's display :func:`current` while it runs (a context
variable: nested runs, such as the subgraphs of control flow, get theirs and give it back);
outside a run, :func:`current` is a display that shows nothing.
"""

from __future__ import annotations

import contextvars
from typing import Any

_display: contextvars.ContextVar[Any] = contextvars.ContextVar("onnxmlu_progress", default=None)


class _Silent:
    def say(self, text: str) -> None:
        pass

    def total(self, units: int) -> None:
        pass

    def advance(self) -> None:
        pass


def current():
    """The display of the run in progress (``say``, ``total``, ``advance``), or a silent one."""
    display = _display.get()
    return _Silent() if display is None else display


def enter(display) -> contextvars.Token:
    """Make ``display`` :func:`current`; give the token back to :func:`leave`."""
    return _display.set(display)


def leave(token: contextvars.Token) -> None:
    _display.reset(token)
