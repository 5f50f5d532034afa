"""Run fused onnxmlu models in onnxruntime with the custom-op library registered.

A fused model is an ordinary ONNX model whose blocks are ``com.onnxmlu::MLUFusionBlock``
nodes. ``libonnxmlu_ops.so`` (built from ``custom_ops/`` by ``make install``) implements that
op: each node's kernel builds an *inner* onnxruntime session from the block's ``body`` and runs
it, so a fused model runs in plain onnxruntime once the library is registered.

Thread set-up (measured, see DESIGN.md section 6 and scripts/bench_runtime.py). Two levels of
sessions each own a thread pool. Blocks run one after another, so only one inner pool works at
a time; the outer pool only dispatches blocks (and the few host ops between them).

* Inner sessions do the compute. Their intra-op thread count is the user's budget: the
  ``intra_op_num_threads`` of the options given to :func:`InferenceSession` (copied into the
  ``onnxmlu.inner_threads`` config entry), or ``min(mp, hardware threads)`` when that is 0 or
  no options are given, so a block's ``mp`` is also its CPU parallelism.
  ``ONNXMLU_INNER_THREADS`` overrides both (set in the C++ library, for experiments).
* Inner pools spin while their block runs and stop the moment it returns
  (``session.force_spinning_stop``). At 2 threads on an otherwise idle 2-core machine this
  gives 1.00-1.01x of plain onnxruntime on ResNet-18; never spinning costs a thread wake-up per
  parallel kernel (1.04-1.06x); spinning without the stop lets a finished block's pool steal a
  core from the next block (1.4-1.5x). ``onnxmlu.inner_spinning = "0"`` (or the user turning
  ``session.intra_op.allow_spinning`` off) disables it, which wins when the cores are contended.
* The outer session's own threads hardly matter (1 or T measured the same); by default it gets
  1 thread, spinning off. Options a user passes keep their outer settings.
* Graph optimizations are on at both levels: onnxruntime's own fusions inside a block are
  wanted, and the outer graph is mostly MLUFusionBlock nodes it cannot touch.

The inner set-up is read when the library is registered into a SessionOptions, so config
entries must be set before that (:func:`InferenceSession` does it).

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
#: Config entries the library reads at registration (custom_ops/mlu_fusion_block.h).
INNER_THREADS_KEY = "onnxmlu.inner_threads"
INNER_SPINNING_KEY = "onnxmlu.inner_spinning"
_ALLOW_SPINNING_KEY = "session.intra_op.allow_spinning"
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
    return _config_entry(options, _REGISTERED_KEY) == "1"


def _config_entry(options: ort.SessionOptions, key: str) -> str | None:
    try:
        return options.get_session_config_entry(key)
    except RuntimeError:  # "SessionOptions does not have configuration with key: ..."
        return None


def session_options(*, intra_op_threads: int = 1, optimize: bool = True, inner_threads: int = 0,
                    inner_spinning: bool = True) -> ort.SessionOptions:
    """SessionOptions for a fused model, library registered: ``intra_op_threads`` outer threads
    (spinning off), ``inner_threads`` per block (0: min(mp, hardware threads)), inner pools
    spinning only while their block runs unless ``inner_spinning`` is False."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.add_session_config_entry(_ALLOW_SPINNING_KEY, "0")
    options.add_session_config_entry(INNER_THREADS_KEY, str(int(inner_threads)))
    options.add_session_config_entry(INNER_SPINNING_KEY, "1" if inner_spinning else "0")
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    return register_library(options)


def _adopt_user_options(options: ort.SessionOptions) -> ort.SessionOptions:
    """Give the inner sessions the user's thread budget and spinning choice (unless the inner
    entries are set already), then register. Only config entries are added: the outer session
    keeps the user's settings (its thread count measured as irrelevant)."""
    if not _is_registered(options):
        if _config_entry(options, INNER_THREADS_KEY) is None:
            options.add_session_config_entry(INNER_THREADS_KEY, str(max(0, options.intra_op_num_threads)))
        if _config_entry(options, INNER_SPINNING_KEY) is None and _config_entry(options, _ALLOW_SPINNING_KEY) == "0":
            options.add_session_config_entry(INNER_SPINNING_KEY, "0")
    return register_library(options)


def InferenceSession(  # noqa: N802 - mirrors onnxruntime's name
    model: ModelArg,
    sess_options: ort.SessionOptions | None = None,
    providers: Sequence[Any] | None = None,
    **kwargs: Any,
) -> ort.InferenceSession:
    """An onnxruntime session for ``model`` (path, bytes or ModelProto) that can run blocks.

    Without ``sess_options`` the best measured set-up is used (see the module docstring).
    Given ones are the user's budget: their ``intra_op_num_threads`` becomes each block's inner
    thread count (and spinning turned off turns it off inside too); then the library is
    registered (once). Their other settings are left alone.
    """
    options = session_options() if sess_options is None else _adopt_user_options(sess_options)
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
