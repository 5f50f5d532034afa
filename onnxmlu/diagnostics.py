"""One record for everything the pipeline decided not to do, and why.

A :class:`Diagnostic` says which stage (``normalize``, ``rewrite``, ``analyze``, ...), which
rule (a short stable key such as ``host-op`` or ``fold-unsound``), which node (its name, or
``""`` for the whole model) and a one-line message. Stages append them to a list the caller
owns; the CLI prints a summary of that list and ``--json`` carries it whole.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Diagnostic:
    stage: str
    rule: str
    node: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

