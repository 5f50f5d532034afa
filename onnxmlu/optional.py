"""Heavy and optional dependencies, imported when first used: the one import inside a function.

Every other import in the package sits at the top of its module, so a module's dependencies
are what its first lines say and the import graph is what docs/architecture.md draws
(tests/test_layers.py walks it). A few modules are imported only when a function needs them,
each for the reason :data:`LAZY` gives, always through :func:`optional_import`:

* heavy ones, which a run that does not use them should not pay for: onnxruntime (a plain FP32
  ``fuse`` never starts it), its quantizer (only INT8 blocks need it), and :mod:`onnxmlu.api`
  from the CLI (``--help``, ``--version`` and a usage error answer without loading the compiler);
* optional ones, from a pip extra: a missing one is the one-line error naming the extra.

A target missing from :data:`LAZY` is a bug (an import hidden without a reason), refused here.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from onnxmlu.errors import OnnxMluError

#: Module -> (the pip extra that installs it, or None for a required dependency; why it is late).
LAZY: dict[str, tuple[str | None, str]] = {
    "onnxruntime": (None, "about 50 ms; a plain FP32 fuse never runs a model"),
    "onnxruntime.quantization": (None, "about 100 ms on top of onnxruntime; only INT8 blocks quantize"),
    "onnxruntime.tools.symbolic_shape_infer": (None, "loads onnxruntime and sympy; only where onnx's inference stops"),
    "onnxruntime.capi.onnxruntime_pybind11_state": (None, "loads onnxruntime; only an unknown operator asks it"),
    "onnxmlu.runtime": (None, "the custom-op library's sessions: loads onnxruntime"),
    "onnxmlu.api": (None, "the compiler, from the CLI: --help and --version answer without it"),
    "rich.progress": (None, "the CLI's live progress display, drawn only on an interactive terminal"),
    # what only some commands run, so that a fuse loads what it runs (together ~30 ms a run)
    "onnxmlu.precision.auto": (None, "the budgeted search and its evaluator: --precision auto, compare's auto "
                                     "column, --pareto"),
    "onnxmlu.precision.bodies": (None, "FP16/INT8 body transforms: only a plan with such blocks"),
    "onnxmlu.precision.calibration": (None, "sample folders: --calibration, --validation, --inputs DIR"),
    "onnxmlu.precision.int8": (None, "the INT8 scheme's options: --calibrator"),
    "onnxmlu.tools.fused_info": (None, "reading a fused file: inspect and report of one"),
    "onnxmlu.tools.html_report": (None, "onnxmlu report"),
    "onnxmlu.tools.run": (None, "onnxmlu run and its --inputs files"),
    "onnxmlu.tools.zoo": (None, "the zoo's builders: onnxmlu zoo, compare --zoo"),
    "matplotlib": ("plot", "charts (--plot, --pareto)"),
    "matplotlib.pyplot": ("plot", "charts (--plot, --pareto)"),
    "matplotlib.colors": ("plot", "charts (--plot, --pareto)"),
    "netron": ("view", "onnxmlu view"),
    "playwright.sync_api": ("browser", "pictures of Netron in a headless browser (docs, browser tests)"),
}
#: What each extra is for, in its one-line error.
_PURPOSE = {"plot": "plots need matplotlib", "view": "viewing needs netron",
            "browser": "browser snapshots need netron and playwright"}


def optional_import(name: str) -> ModuleType:
    """The module ``name`` (one of :data:`LAZY`), imported now; for a module of a pip extra
    that is not installed, an :class:`OnnxMluError` naming the extra."""
    extra = _extra(name)
    try:
        return importlib.import_module(name)
    except ImportError:
        if extra is None:
            raise
        raise OnnxMluError(f"{_PURPOSE[extra]}: pip install 'onnxmlu[{extra}]'") from None


def require(name: str) -> None:
    """The one-line error of :func:`optional_import` now, without importing ``name``: a
    command that will need it checks before any work (``compare --plot`` spent 20 s first)."""
    extra = _extra(name)
    if extra is not None and importlib.util.find_spec(name.partition(".")[0]) is None:
        raise OnnxMluError(f"{_PURPOSE[extra]}: pip install 'onnxmlu[{extra}]'")


def _extra(name: str) -> str | None:
    if name not in LAZY:
        raise AssertionError(f"{name} is imported late without a reason: add it to onnxmlu.optional.LAZY")
    return LAZY[name][0]
