"""The progress display of the pipeline run in progress, for work deep inside a pass.

A pass's own line comes from the pass manager (:class:`onnxmlu.pipeline.ShowProgress`), but a
long step inside one -- ``--precision auto`` runs dozens of trial plans on every sample, for
minutes -- has a count to show (trials run of how many) that its caller's signature does not
carry. The pass manager makes the run's display :func:`current` while it runs (a context
variable: nested runs, such as the subgraphs of control flow, get theirs and give it back);
outside a run, :func:`current` is a display that shows nothing.

A display has ``say(text)`` (the step now running), ``total(units)`` (its units of work; 0: a
count with no end known) and ``advance(units=1)``. :class:`Tally` is the count a display shows
after the step: ``3/12 · ETA 0:42``, where the ETA is the mean pace so far times the units left,
``(t - t0) / done * (total - done)``, read from a clock the caller may replace (tests do).
Code that must not know the display (the planning strategies, which import neither onnx nor
rich) gets a plain callback instead, ``report(done, total)``, from :func:`reporter`.
"""

from __future__ import annotations

import contextvars
import time
from typing import Any, Callable

_display: contextvars.ContextVar[Any] = contextvars.ContextVar("onnxmlu_progress", default=None)

#: What code below the display is handed: called with the units done so far and the total
#: (0: not known), as often as it likes.
Report = Callable[[int, int], None]


class Say:
    """A display from a plain ``callable(text)``: its lines, without counts; silent without one."""

    def __init__(self, fn: Callable[[str], None] | None = None) -> None:
        self.fn = fn

    def say(self, text: str) -> None:
        if self.fn is not None:
            self.fn(text)

    def total(self, units: int) -> None:
        pass

    def advance(self, units: int = 1) -> None:
        pass


def current():
    """The display of the run in progress (``say``, ``total``, ``advance``), or a silent one."""
    display = _display.get()
    return Say() if display is None else display


def enter(display) -> contextvars.Token:
    """Make ``display`` :func:`current`; give the token back to :func:`leave`."""
    return _display.set(display)


def leave(token: contextvars.Token) -> None:
    _display.reset(token)


class Tally:
    """The count of one step: ``start(units)``, ``add(units)``, and :meth:`text` for the line."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.units: int | None = None  # None: the step has no count
        self.done, self.since = 0, clock()

    def start(self, units: int) -> None:
        self.units, self.done, self.since = units, 0, self.clock()

    def stop(self) -> None:
        self.units = None

    def add(self, units: int = 1) -> None:
        self.done += units

    def text(self) -> str:
        """`` · 3/12 · ETA 0:42`` (the mean pace so far), `` · 3 so far`` (no total), or ""."""
        if self.units is None:
            return ""
        if not self.units:
            return f" · {self.done} so far"
        eta = ""
        if self.done:
            left = max(0.0, (self.clock() - self.since) / self.done * (self.units - self.done))
            eta = f" · ETA {int(left // 60)}:{int(left % 60):02d}"
        return f" · {self.done}/{self.units}{eta}"


def reporter(display=None) -> Report:
    """A plain ``report(done, total)`` that drives ``display`` (default: :func:`current`): a
    new total starts the count, a larger ``done`` advances it by the difference."""
    shown = current() if display is None else display
    state = {"total": None, "done": 0}

    def report(done: int, total: int) -> None:
        if total != state["total"]:
            shown.total(total)
            state["total"], state["done"] = total, 0
        if done > state["done"]:
            shown.advance(done - state["done"])
            state["done"] = done

    return report


def as_display(progress):
    """``progress`` as a display: itself when it is one, a plain ``callable(text)`` told the
    lines, or (None) a silent one."""
    return progress if hasattr(progress, "say") else Say(progress)


class Prefixed:
    """``display`` with every line led by ``prefix`` (``check: ``); counts pass through."""

    def __init__(self, display, prefix: str) -> None:
        self.display, self.prefix = as_display(display), prefix

    def say(self, text: str) -> None:
        self.display.say(self.prefix + text)

    def total(self, units: int) -> None:
        self.display.total(units)

    def advance(self, units: int = 1) -> None:
        self.display.advance(units)
