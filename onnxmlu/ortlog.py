"""onnxruntime's own log lines: one severity for the whole process.

onnxruntime prints coloured lines (``[E:onnxruntime:...] Non-zero status code ...``) through
its default logger, whose severity is process-wide and has no getter. The CLI chooses it once
(FATAL only, 4, unless ``-v``: warnings, 2) with :func:`set_severity`; a pass that silences
onnxruntime for a while (:func:`at_least`) puts back that choice, not onnxruntime's default,
and the sessions onnxmlu makes take it too (:func:`onnxmlu.sessions.new_options`). The custom-op library's
inner sessions log through the same default logger. A library user who never calls
:func:`set_severity` keeps onnxruntime's own default, 2 (warnings).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from onnxmlu.optional import optional_import

#: onnxruntime's default severity (0 verbose, 1 info, 2 warning, 3 error, 4 fatal).
DEFAULT = 2
_chosen = {"severity": DEFAULT}


def set_severity(level: int) -> None:
    """Log onnxruntime's lines of ``level`` and above, from now on, in every session."""
    _chosen["severity"] = level
    optional_import("onnxruntime").set_default_logger_severity(level)


def severity() -> int:
    return _chosen["severity"]


@contextlib.contextmanager
def at_least(level: int) -> Iterator[None]:
    """Only lines of ``level`` and above (or of the chosen severity, if higher) while inside."""
    ort = optional_import("onnxruntime")
    ort.set_default_logger_severity(max(level, severity()))
    try:
        yield
    finally:
        ort.set_default_logger_severity(severity())
