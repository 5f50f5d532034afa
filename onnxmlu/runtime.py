"""Run fused onnxmlu models in onnxruntime with the custom-op library registered.

A fused model is an ordinary ONNX model whose blocks are ``com.onnxmlu::MLUFusionBlock``
nodes. ``libonnxmlu_ops.so`` (built from ``custom_ops/`` by ``make install``) implements that
op: each node's kernel builds an *inner* onnxruntime session from the block's ``body`` and runs
it, so a fused model runs in plain onnxruntime once the library is registered.

Thread set-up (measured, see DESIGN.md section 6). Two levels of sessions each own a thread
pool, and spinning pools starve each other: with every pool spinning, two-thread runs were
2-30x slower. The set-up :func:`InferenceSession` applies by default:

* the outer session gets **1** intra-op thread with spinning off: it only dispatches blocks
  (and runs the few host ops between them);
* each inner session gets ``min(mp, hardware threads)`` intra-op threads with spinning off, so
  a block's ``mp`` (its core count on the simulated accelerator) is also its CPU parallelism
  (``ONNXMLU_INNER_THREADS`` overrides it, for benchmarks; set in the C++ library);
* graph optimizations are on at both levels: onnxruntime's own fusions inside a block are
  wanted, and the outer graph is mostly MLUFusionBlock nodes it cannot touch.

:func:`reference_session` is the numerical reference: plain onnxruntime with every graph
optimization disabled, so onnxruntime's fusions cannot hide a bug in ours.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence, Union

import onnxruntime as ort

from onnxmlu.errors import RuntimeLibraryError

#: Environment variable that points at another build of the library (e.g. the ASan one).
LIBRARY_ENV = "ONNXMLU_CUSTOM_OPS_LIBRARY"
#: Session config entry the library itself sets when it is registered into a SessionOptions
#: (onnxruntime offers no query for registered libraries; the library also ignores a second
#: registration, which onnxruntime would otherwise reject with "Domain already set in registry").
_REGISTERED_KEY = "onnxmlu.custom_ops_registered"
_DEFAULT_PROVIDERS = ("CPUExecutionProvider",)

ModelArg = Union[str, os.PathLike, bytes, Any]  # Any: an onnx.ModelProto


def custom_ops_library() -> str:
    """Absolute path of the custom-op library; raises RuntimeLibraryError when it is missing."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        path = Path(override).expanduser().resolve()
        if not path.is_file():
            raise RuntimeLibraryError(f"custom-op library not found at {path} (set by ${LIBRARY_ENV})")
        return str(path)
    path = Path(__file__).resolve().parent / "_lib" / "libonnxmlu_ops.so"
    if not path.is_file():
        raise RuntimeLibraryError(f"custom-op library not built: run `make install` (expected at {path})")
    return str(path)


def register_library(options: ort.SessionOptions) -> ort.SessionOptions:
    """Register the custom-op library into ``options`` unless it already is; returns them."""
    if not _is_registered(options):
        options.register_custom_ops_library(custom_ops_library())
    return options


def _is_registered(options: ort.SessionOptions) -> bool:
    try:
        return options.get_session_config_entry(_REGISTERED_KEY) == "1"
    except RuntimeError:  # "SessionOptions does not have configuration with key: ..."
        return False


def session_options(*, intra_op_threads: int = 1, optimize: bool = True) -> ort.SessionOptions:
    """SessionOptions for a fused model: library registered, spinning off, given outer threads."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    return register_library(options)


def InferenceSession(  # noqa: N802 - mirrors onnxruntime's name
    model: ModelArg,
    sess_options: ort.SessionOptions | None = None,
    providers: Sequence[Any] | None = None,
    **kwargs: Any,
) -> ort.InferenceSession:
    """An onnxruntime session for ``model`` (path, bytes or ModelProto) that can run blocks.

    Without ``sess_options`` the best measured set-up is used (see the module docstring);
    given ones get the library registered (once) and are otherwise left alone.
    """
    options = session_options() if sess_options is None else register_library(sess_options)
    return ort.InferenceSession(
        _model_source(model),
        sess_options=options,
        providers=list(providers) if providers is not None else list(_DEFAULT_PROVIDERS),
        **kwargs,
    )


def reference_session(model: ModelArg) -> ort.InferenceSession:
    """Plain onnxruntime, every graph optimization off: the numerical reference."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    register_library(options)  # harmless for original models, lets fused ones run too
    return ort.InferenceSession(_model_source(model), sess_options=options, providers=list(_DEFAULT_PROVIDERS))


def _model_source(model: ModelArg) -> str | bytes:
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if hasattr(model, "SerializeToString"):
        return model.SerializeToString()
    raise TypeError(f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}")
