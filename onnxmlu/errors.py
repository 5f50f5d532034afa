"""Errors that mean "the input or the request is wrong", as opposed to bugs.

The CLI turns an :class:`OnnxMluError` into one readable line and exit code 2; anything
else is a bug and keeps its traceback under ``--debug``.
"""

import re


class OnnxMluError(Exception):
    """A user-facing error: bad model, bad option, bad plan. Message is one line."""


class ModelLoadError(OnnxMluError):
    """The model file cannot be read or is not a valid ONNX model."""


class PlanError(OnnxMluError):
    """A fusion plan does not fit the model's layers or the hardware."""


class RuntimeLibraryError(OnnxMluError):
    """The custom-op library is missing or cannot be loaded."""


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:limit]


#: onnxruntime's framing around what went wrong: the status prefix, and the C++ source place
#: and function signature before the condition that failed.
_RUNTIME_NOISE = (re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : "),
                  re.compile(r"(?:/\S+|\S+\.(?:h|cc|cpp)):\d+ [\w:~<>]+\([^)]*\)(?: const)?\s*"))


def runtime_message(exc: BaseException, limit: int = 300) -> str:
    """onnxruntime's error as one line a person reads: its framing removed (the status code,
    the source file and C++ signature), cut at ``limit`` characters with an ellipsis."""
    text = " ".join((str(exc).strip() or type(exc).__name__).split())
    for noise in _RUNTIME_NOISE:
        text = noise.sub("", text)
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


class DuplicateNameError(OnnxMluError, ValueError):
    """A rewriter or strategy is registered under a name that is already taken."""
