"""Counts in words, one rule for every message: ``1 block``, ``2 blocks``, ``0 blocks``.

A count meets its noun through :func:`plural` (or :func:`noun` where the number is printed
apart, aligned in a column), so no message reads "1 blocks" and none spells the rule again.
"""

from __future__ import annotations


def noun(count: float, singular: str, many: str | None = None) -> str:
    """``singular`` when ``count`` is exactly one, else its plural (``many``, or ``singular + "s"``)."""
    return singular if count == 1 else many or f"{singular}s"


def plural(count: float, singular: str, many: str | None = None, spec: str = "") -> str:
    """``count`` (formatted by ``spec``, e.g. ``"g"`` or ``","``) and its noun: ``plural(1, "block")``
    is ``"1 block"``, ``plural(3, "sample")`` ``"3 samples"``, ``plural(2, "matrix", "matrices")``
    ``"2 matrices"``."""
    return f"{count:{spec}} {noun(count, singular, many)}"
