"""Run fused onnxmlu models in onnxruntime with the custom-op library registered.

A fused model is an ordinary ONNX model whose blocks are ``com.onnxmlu::MLUFusionBlock``
nodes. ``libonnxmlu_ops.so`` (built from ``custom_ops/`` by the package build) implements that
op: each node's kernel builds an *inner* onnxruntime session from the block's ``body`` and runs
it, so a fused model runs in plain onnxruntime once the library is registered.

Thread set-up (measured, see docs/architecture.md "Runtime" and scripts/bench_runtime.py). Two levels of
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
* Global thread pools: where the process's env has onnxruntime's global pools (Python's
  ``set_global_thread_pool_sizes`` before the first session, C's ``CreateEnvWithGlobalThreadPools``)
  the library detects it and every inner session runs on that one pool, whichever API created
  the outer session; a user whose options have ``use_per_session_threads = False`` also gets
  ``onnxmlu.inner_global_pool`` = "1" (which demands it). The pool's size and spinning are then
  the global ones, and there is no pool to wake per block: MobileNetV2 dlfusion batch 1, 2
  threads, 2 idle cores, separate processes in turn: 1.058-1.092x of plain onnxruntime against
  1.28-1.36x with a pool per inner session. A library cannot create one (it must exist before
  the env), so per-session pools stay the default.
* Merged blocks and no idle outer pool: :func:`InferenceSession` runs each run of consecutive
  blocks as one inner session (:mod:`onnxmlu.runtime.merge`), one pool where there were one per
  block, and creates the outer session of a graph of blocks alone on one thread (it runs one
  kernel at a time; the user's options are restored after), so a fused model holds the threads
  its original would. :func:`onnxmlu.runtime.thread_report` counts what remains.
* Graph optimizations are on at both levels: onnxruntime's own fusions inside a block are
  wanted, and the outer graph is mostly MLUFusionBlock nodes it cannot touch.

Layouts: :func:`InferenceSession` hands the library bodies that exchange onnxruntime's NCHWc
layout between blocks (:func:`onnxmlu.runtime.layouts.optimize_block_layouts`); at batch 8 the NCHW block boundaries
were the whole multi-block overhead (reorders and unfused residual Adds), not the kernel.

The inner set-up is read when the library is registered into a SessionOptions, so config
entries must be set before that (:func:`InferenceSession` does it).

:func:`reference_session` is the numerical reference: plain onnxruntime with every graph
optimization disabled, so onnxruntime's fusions cannot hide a bug in ours.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator, Sequence, Union
from importlib import resources

import onnx
import onnx.parser
import onnxruntime as ort
from google.protobuf import json_format, text_format
from google.protobuf.message import EncodeError
from google.protobuf.message import Error as ProtobufError

from onnxmlu.errors import RuntimeLibraryError
from onnxmlu.ir import copy_model, is_fusion_block, iter_graphs, nested_graphs
from onnxmlu.ir.weights import is_external
from onnxmlu.runtime.layouts import optimize_layouts_in_place
from onnxmlu.runtime.merge import merge_consecutive_blocks
from onnxmlu import ortlog
from onnxmlu.sessions import (EXACT_INT8_KEY, config_entry, exact_int8, exact_integer_weights,
                              holds_u8_activation_nodes, loadable_with_exact_entry, needs_default_kernels,
                              new_options)

#: What ``onnx.load`` raises on a path that holds no model it can read: the file system's
#: errors, protobuf's (binary, text and JSON formats), onnx's text parser's, ValueError.
_UNREADABLE = (OSError, ValueError, ProtobufError, text_format.Error, json_format.Error, onnx.parser.ParseError)

#: Environment variable that points at another build of the library (e.g. the ASan one).
LIBRARY_ENV = "ONNXMLU_CUSTOM_OPS_LIBRARY"
#: Session config entry the library itself sets when it is registered into a SessionOptions
#: (onnxruntime offers no query for registered libraries; the library also ignores a second
#: registration, which onnxruntime would otherwise reject with "Domain already set in registry").
_REGISTERED_KEY = "onnxmlu.custom_ops_registered"
#: Config entries the library reads at registration (custom_ops/mlu_fusion_block.h).
INNER_THREADS_KEY = "onnxmlu.inner_threads"
INNER_SPINNING_KEY = "onnxmlu.inner_spinning"
INNER_GLOBAL_POOL_KEY = "onnxmlu.inner_global_pool"
_ALLOW_SPINNING_KEY = "session.intra_op.allow_spinning"
_DEFAULT_PROVIDERS = ("CPUExecutionProvider",)

ModelArg = Union[str, os.PathLike, bytes, Any]  # Any: an onnx.ModelProto


def custom_ops_library() -> str:
    """Absolute path of the custom-op library; raises RuntimeLibraryError when it is missing.

    It lives in the package as ``onnxmlu/_lib/libonnxmlu_ops.so``: put there by the wheel, by
    ``pip install .`` and by ``make install`` (an editable install, whose built files sit in the
    venv beside the source tree: ``importlib.resources`` sees both)."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        path = Path(override).expanduser().resolve()
        if not path.is_file():
            raise RuntimeLibraryError(f"custom-op library not found at {path} (set by ${LIBRARY_ENV})")
        return str(path)
    candidates = [Path(__file__).resolve().parents[1] / "_lib" / _LIBRARY_NAME]
    try:
        packaged = resources.files("onnxmlu") / "_lib" / _LIBRARY_NAME
        if isinstance(packaged, Path) or hasattr(packaged, "__fspath__"):
            candidates.insert(0, Path(os.fspath(packaged)).resolve())
    except (ImportError, OSError, TypeError):  # an unusual loader: the folder beside this file
        pass
    for path in candidates:
        if path.is_file():
            return str(path)
    raise RuntimeLibraryError(_missing_library_message(candidates[-1]))


_LIBRARY_NAME = "libonnxmlu_ops.so"


def _missing_library_message(expected: Path) -> str:
    """What to do, for the kind of install this is: a source checkout, or a pip install."""
    checkout = expected.parents[2]
    if (checkout / "custom_ops" / "CMakeLists.txt").is_file() and (checkout / "Makefile").is_file():
        return (f"custom-op library not built (expected at {expected}): in this source checkout run "
                f"`make install` (or `pip install -e .`), or set ${LIBRARY_ENV} to a built library")
    return (f"custom-op library missing from this onnxmlu install (expected at {expected}): reinstall "
            "with `pip install --force-reinstall onnxmlu` (a platform wheel carries the library; building "
            "from source needs g++ and onnxruntime's headers, see the README's Install section), or set "
            f"${LIBRARY_ENV} to a built library")


def register_library(options: ort.SessionOptions) -> ort.SessionOptions:
    """Register the custom-op library into ``options`` unless it already is; returns them."""
    if not _is_registered(options):
        options.register_custom_ops_library(custom_ops_library())
    return options


def _is_registered(options: ort.SessionOptions) -> bool:
    return config_entry(options, _REGISTERED_KEY) == "1"


def session_options(*, intra_op_threads: int = 1, optimize: bool = True, inner_threads: int = 0,
                    inner_spinning: bool = True) -> ort.SessionOptions:
    """SessionOptions for a fused model, library registered: ``intra_op_threads`` outer threads
    (spinning off), ``inner_threads`` per block (0: min(mp, hardware threads)), inner pools
    spinning only while their block runs unless ``inner_spinning`` is False."""
    options = new_options("all" if optimize else "disable")
    options.intra_op_num_threads = intra_op_threads
    options.add_session_config_entry(_ALLOW_SPINNING_KEY, "0")
    options.add_session_config_entry(INNER_THREADS_KEY, str(int(inner_threads)))
    options.add_session_config_entry(INNER_SPINNING_KEY, "1" if inner_spinning else "0")
    return register_library(options)


def _adopt_user_options(options: ort.SessionOptions) -> ort.SessionOptions:
    """Give the inner sessions the user's thread budget and spinning choice (unless the inner
    entries are set already), then register. Only config entries are added: the outer session
    keeps the user's settings (its thread count measured as irrelevant). Exact INT8 arithmetic
    (:data:`onnxmlu.sessions.EXACT_INT8_KEY`) is added unless the user set that entry."""
    if not _is_registered(options):
        exact_int8(options)
        if config_entry(options, INNER_THREADS_KEY) is None:
            options.add_session_config_entry(INNER_THREADS_KEY, str(max(0, options.intra_op_num_threads)))
        if config_entry(options, INNER_SPINNING_KEY) is None and config_entry(options, _ALLOW_SPINNING_KEY) == "0":
            options.add_session_config_entry(INNER_SPINNING_KEY, "0")
        if config_entry(options, INNER_GLOBAL_POOL_KEY) is None and not options.use_per_session_threads:
            options.add_session_config_entry(INNER_GLOBAL_POOL_KEY, "1")
    return register_library(options)


def InferenceSession(  # noqa: N802 - mirrors onnxruntime's name
    model: ModelArg,
    sess_options: ort.SessionOptions | None = None,
    providers: Sequence[Any] | None = None,
    *,
    block_layouts: bool = True,
    merge_blocks: bool = True,
    **kwargs: Any,
) -> ort.InferenceSession:
    """An onnxruntime session for ``model`` (path, bytes or ModelProto) that can run blocks.

    Without ``sess_options`` the best measured set-up is used (see the module docstring).
    Given ones are the user's budget: their ``intra_op_num_threads`` becomes each block's inner
    thread count (and spinning turned off turns it off inside too); then the library is
    registered (once). Their other settings are left alone, but for the outer session's own
    thread count where its graph is nothing but blocks (below). ``merge_blocks`` runs each
    run of consecutive blocks as one inner session
    (:func:`~onnxmlu.runtime.merge.merge_consecutive_blocks`; off for per-block profiles);
    ``block_layouts`` lets the remaining blocks exchange onnxruntime's NCHWc layout
    (:func:`~onnxmlu.runtime.layouts.optimize_block_layouts`), at the cost of one extra optimization
    pass per block.
    """
    options = session_options() if sess_options is None else _adopt_user_options(sess_options)
    blocks_only = False
    if block_layouts or merge_blocks:
        # the entry is valid here: registering the library checked it
        model, blocks_only = _prepared(model, merge_blocks=merge_blocks, block_layouts=block_layouts,
                                       per_session_threads=options.use_per_session_threads,
                                       inner_threads=int(config_entry(options, INNER_THREADS_KEY) or 0))
    with _outer_threads(options, 1 if blocks_only else None), loadable_source(model, options) as source:
        return ort.InferenceSession(
            source,
            sess_options=options,
            providers=list(providers) if providers is not None else list(_DEFAULT_PROVIDERS),
            **kwargs,
        )


@contextlib.contextmanager
def loadable_source(model: ModelArg, options: ort.SessionOptions) -> Iterator[str | bytes]:
    """``model``'s source for a session of ``options`` (the package's or a user's: the outer
    session here, plain onnxruntime in :func:`onnxmlu.tools.timing.plain_session`) that computes
    its quantized arithmetic exactly, with ``options`` fit for it while inside (onnxruntime
    copies them into the session; they are restored after). Where ``options`` set exact INT8
    arithmetic (:data:`~onnxmlu.sessions.EXACT_INT8_KEY`: the package's do on every host whose
    default kernels saturate), the graph's own quantized nodes need what block bodies get at
    fuse time (u8 weights, a copy of a shared weight per reader), else onnxruntime cannot load
    it ("Attempt to replace the existing tensor") or runs saturating u8 x s8 kernels where its
    pass does not reach: a model small enough to rewrite in memory gets them
    (:func:`~onnxmlu.sessions.loadable_with_exact_entry`), and so does a model file whose
    weights are in external files, whatever their size: its graph is rewritten without reading
    them (a copy refers to the same bytes; a u8 weight is computed from the s8 one by nodes
    onnxruntime folds at load) and given as bytes, onnxruntime told the folder its external files
    are in. Where it also holds a node onnxruntime cannot load under the entry (an s8-activation
    QLinearConv: :func:`~onnxmlu.sessions.needs_default_kernels`) the entry is "0" while inside:
    its other products have u8 weights then, exact without it."""
    entry = config_entry(options, EXACT_INT8_KEY)
    proto, folder = (_rewritable_proto(model), None) if entry == "1" else (None, None)
    if entry == "1" and proto is None:
        proto, folder = _graph_of_external_data(model)
    rewritable = proto is not None and (folder is not None or not _has_external_data(proto))
    loadable = loadable_with_exact_entry(proto) if rewritable else None
    changes = {}
    if loadable is not None and folder is not None:
        changes[_EXTERNAL_FOLDER_KEY] = folder
    if proto is not None and needs_default_kernels(proto):
        changes[EXACT_INT8_KEY] = "0"
    with _entries(options, changes):
        yield _model_source(model) if loadable is None else loadable


#: onnxruntime's session config entry: the folder of a model's external files when the model
#: is given as bytes.
_EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


def _graph_of_external_data(model: ModelArg) -> tuple[onnx.ModelProto | None, str | None]:
    """A model file's graph and the folder of its external files, their bytes not read, where
    its weights are in external files (its file within _MAX_REWRITE_BYTES); else (None, None).
    The folder is None where the graph cannot be given as bytes."""
    if not isinstance(model, (str, os.PathLike)):
        return None, None
    try:
        if os.path.getsize(model) > _MAX_REWRITE_BYTES:
            return None, None
        proto = onnx.load(os.fspath(model), load_external_data=False)
    except _UNREADABLE:  # not a model this reads: onnxruntime gives the user the real error
        return None, None
    if not _has_external_data(proto):
        return None, None
    # onnxruntime resolves an If/Loop/Scan body's external files only for a model loaded from
    # its path (the folder entry reaches the main graph alone): such a graph cannot be rewritten
    nested = any(_holds_external_data(g) for g in nested_graphs(proto.graph))
    return proto, None if nested else str(Path(model).resolve().parent)


@contextlib.contextmanager
def _entries(options: ort.SessionOptions, changes: dict[str, str]) -> Iterator[None]:
    """``options`` with the config entries ``changes`` while inside, each put back after (an
    entry that was not set: ""; onnxruntime reads "" as unset). onnxruntime warns on each
    overwrite, which says nothing here."""
    before = {key: config_entry(options, key) or "" for key in changes}
    with ortlog.at_least(3):
        for key, value in changes.items():
            options.add_session_config_entry(key, value)
    try:
        yield
    finally:
        with ortlog.at_least(3):
            for key, value in before.items():
                options.add_session_config_entry(key, value)


@contextlib.contextmanager
def _outer_threads(options: ort.SessionOptions, threads: int | None):
    """The outer session created with ``threads`` intra-op threads, the user's options restored
    after (onnxruntime copies them into the session). A graph of blocks alone runs one kernel
    at a time, each on its inner session's threads: an outer pool of T - 1 workers would only
    sleep beside them (a thread each, per model in the process)."""
    if threads is None or not options.use_per_session_threads or options.intra_op_num_threads == threads:
        yield
        return
    before = options.intra_op_num_threads
    options.intra_op_num_threads = threads
    try:
        yield
    finally:
        options.intra_op_num_threads = before


def reference_session(model: ModelArg) -> ort.InferenceSession:
    """Plain onnxruntime, every graph optimization off: the numerical reference. Quantized
    arithmetic is held to its exact integer semantics (32-bit accumulation) on every host: the
    model's own u8-activation integer nodes get u8 weights (:func:`onnxmlu.sessions.exact_integer_weights`,
    the same integers), since the optimizer pass that would do so does not run here."""
    options = new_options("disable")
    register_library(options)  # harmless for original models, lets fused ones run too
    return ort.InferenceSession(_exact_source(model), sess_options=options, providers=list(_DEFAULT_PROVIDERS))


def _exact_source(model: ModelArg) -> str | bytes:
    """``model``'s source with exact integer weights, or as given when no node needs them."""
    source = _model_source(model)
    proto = model if isinstance(model, onnx.ModelProto) else None
    if proto is None:  # the nodes first, the weights only when a node needs them
        proto = (onnx.load_from_string(source) if isinstance(source, bytes)
                 else onnx.load(source, load_external_data=False))
    if not holds_u8_activation_nodes(proto):
        return source
    if isinstance(source, str):
        proto = onnx.load(source)
    proto = copy_model(proto)
    exact_integer_weights(proto)
    return proto.SerializeToString()


def _prepared(model: ModelArg, *, merge_blocks: bool, block_layouts: bool, per_session_threads: bool = True,
              inner_threads: int = 0) -> tuple[ModelArg, bool]:
    """``model`` with runs of consecutive blocks merged and rewritten by the block-layout pass
    when it has blocks and is small enough to rewrite in memory (see _MAX_REWRITE_BYTES),
    otherwise unchanged; and whether its main graph is then blocks alone."""
    proto = _rewritable_proto(model)
    if proto is None or not any(is_fusion_block(n) for n in proto.graph.node):
        return model, False
    if proto is model:  # the caller's model: rewrite a copy of it
        proto = copy_model(proto)
    if merge_blocks:
        merge_consecutive_blocks(proto)
    if block_layouts:
        optimize_layouts_in_place(proto, per_session_threads=per_session_threads, inner_threads=inner_threads)
    return proto, all(is_fusion_block(n) for n in proto.graph.node)


def _rewritable_proto(model: ModelArg) -> onnx.ModelProto | None:
    """``model`` as a ModelProto when it is inline and at most _MAX_REWRITE_BYTES, else None
    (models with external data are left to onnxruntime, which reads them lazily)."""
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model)) if len(model) <= _MAX_REWRITE_BYTES else None
    if isinstance(model, (str, os.PathLike)):
        try:
            if os.path.getsize(model) > _MAX_REWRITE_BYTES:
                return None
            proto = onnx.load(os.fspath(model), load_external_data=False)
        except _UNREADABLE:  # not a model this reads: onnxruntime gives the user the real error
            return None
        # its size is the file's, checked above: ByteSize would walk every weight again
        return None if _has_external_data(proto) else proto
    if isinstance(model, onnx.ModelProto):
        proto = model
    else:
        return None
    if _has_external_data(proto):
        return None
    try:
        return proto if proto.ByteSize() <= _MAX_REWRITE_BYTES else None
    except EncodeError:  # protobuf refuses sizes above 2 GB
        return None


def _has_external_data(model: onnx.ModelProto) -> bool:
    """Whether a graph of ``model`` (its subgraphs too) holds a tensor in an external file."""
    return any(_holds_external_data(g) for g in iter_graphs(model.graph))


def _holds_external_data(graph: onnx.GraphProto) -> bool:
    tensors = list(graph.initializer)
    tensors += [a.t for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    return any(is_external(t) for t in tensors)


def _model_source(model: ModelArg) -> str | bytes:
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if hasattr(model, "SerializeToString"):
        return model.SerializeToString()
    raise TypeError(f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}")


#: The pass holds a copy of the model and each optimized body while it runs; above this size
#: (VGG-19 is 548 MB: few blocks, FC-bound) that memory outweighs the layout gain.
_MAX_REWRITE_BYTES = 256 << 20
