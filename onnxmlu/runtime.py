"""Run fused onnxmlu models in onnxruntime with the custom-op library registered.

A fused model is an ordinary ONNX model whose blocks are ``com.onnxmlu::MLUFusionBlock``
nodes. ``libonnxmlu_ops.so`` (built from ``custom_ops/`` by the package build) implements that
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
* Global thread pools: a user whose options have ``use_per_session_threads = False`` (the
  process called ``set_global_thread_pool_sizes``; onnxruntime's Python API then requires it of
  every session) gets inner sessions on that one global pool too (``onnxmlu.inner_global_pool``).
  The pool's size and spinning are then the global ones, and there is no pool to wake per
  block: MobileNetV2 dlfusion batch 1, 2 threads, 2 idle cores, separate processes in turn:
  1.058-1.092x of plain onnxruntime against 1.28-1.36x with a pool per inner session (each
  block wakes its own pool's sleeping worker). Per-session pools stay the default because a
  global pool cannot be set up once the process's env exists.
* Graph optimizations are on at both levels: onnxruntime's own fusions inside a block are
  wanted, and the outer graph is mostly MLUFusionBlock nodes it cannot touch.

Layouts: :func:`InferenceSession` hands the library bodies that exchange onnxruntime's NCHWc
layout between blocks (:func:`optimize_block_layouts`); at batch 8 the NCHW block boundaries
were the whole multi-block overhead (reorders and unfused residual Adds), not the kernel.

The inner set-up is read when the library is registered into a SessionOptions, so config
entries must be set before that (:func:`InferenceSession` does it).

:func:`reference_session` is the numerical reference: plain onnxruntime with every graph
optimization disabled, so onnxruntime's fusions cannot hide a bug in ours.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Sequence, Union

import onnx
import onnxruntime as ort

from onnxmlu.errors import RuntimeLibraryError
from onnxmlu.ir import copy_model
from onnxmlu.schema import BodyDigestError, set_body_digest, verify_body

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
_BLOCK_DOMAIN, _BLOCK_OP = "com.onnxmlu", "MLUFusionBlock"

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
    candidates = [Path(__file__).resolve().parent / "_lib" / _LIBRARY_NAME]
    try:
        from importlib import resources

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
        if _config_entry(options, INNER_GLOBAL_POOL_KEY) is None and not options.use_per_session_threads:
            options.add_session_config_entry(INNER_GLOBAL_POOL_KEY, "1")
    return register_library(options)


def InferenceSession(  # noqa: N802 - mirrors onnxruntime's name
    model: ModelArg,
    sess_options: ort.SessionOptions | None = None,
    providers: Sequence[Any] | None = None,
    *,
    block_layouts: bool = True,
    **kwargs: Any,
) -> ort.InferenceSession:
    """An onnxruntime session for ``model`` (path, bytes or ModelProto) that can run blocks.

    Without ``sess_options`` the best measured set-up is used (see the module docstring).
    Given ones are the user's budget: their ``intra_op_num_threads`` becomes each block's inner
    thread count (and spinning turned off turns it off inside too); then the library is
    registered (once). Their other settings are left alone. ``block_layouts`` lets blocks
    exchange onnxruntime's NCHWc layout (:func:`optimize_block_layouts`); it costs one extra
    optimization pass per block at creation.
    """
    options = session_options() if sess_options is None else _adopt_user_options(sess_options)
    if block_layouts:
        model = _with_block_layouts(model, per_session_threads=options.use_per_session_threads)
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


def _with_block_layouts(model: ModelArg, *, per_session_threads: bool = True) -> ModelArg:
    """``model`` rewritten by optimize_block_layouts when it has blocks and is small enough to
    rewrite in memory (see _MAX_REWRITE_BYTES); otherwise unchanged."""
    proto = _rewritable_proto(model)
    if proto is None or not any(n.domain == _BLOCK_DOMAIN and n.op_type == _BLOCK_OP for n in proto.graph.node):
        return model
    # a proto loaded here from bytes or a path is ours: rewrite it in place, not a copy of it
    return optimize_block_layouts(proto, per_session_threads=per_session_threads, in_place=proto is not model)[0]


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
        except Exception:  # noqa: BLE001 - onnxruntime gives the user the real error
            return None
    elif isinstance(model, onnx.ModelProto):
        proto = model
    else:
        return None
    if _has_external_data(proto):
        return None
    try:
        return proto if proto.ByteSize() <= _MAX_REWRITE_BYTES else None
    except Exception:  # noqa: BLE001 - protobuf refuses sizes above 2 GB
        return None


def _has_external_data(model: onnx.ModelProto) -> bool:
    tensors = list(model.graph.initializer)
    tensors += [a.t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in tensors)


def _model_source(model: ModelArg) -> str | bytes:
    if isinstance(model, (bytes, bytearray)):
        return bytes(model)
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if hasattr(model, "SerializeToString"):
        return model.SerializeToString()
    raise TypeError(f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}")


# --- block layouts: NCHWc across block boundaries ---------------------------------------------
#
# Inside a block onnxruntime computes convolutions in its blocked NCHWc layout, but a block's
# inputs and outputs are plain NCHW, so every boundary costs a ReorderOutput in the producing
# block and a ReorderInput in each consumer, and a residual Add whose skip input comes from
# outside the block stays unfused in NCHW (Add, Relu and two more reorders; once the residual
# path is NCHW it stays so to the end of the block). Measured at batch 8, 1 thread, bodies
# profiled one by one (in ms; original model 40.0 for MobileNetV2, 157.9 for ResNet-50):
#   MobileNetV2 dlfusion: reorders +8.7, unfused Add +0.4, convolutions +0.2
#   ResNet-50 dlfusion:   reorders +16.5, unfused Add and Relu +15.9, convolutions -6.2
# while the kernel and the outer session add nothing measurable. optimize_block_layouts takes
# each body as onnxruntime optimizes it (the same transformers the inner session would run)
# and finishes the job onnxruntime cannot do across a session boundary:
#   1. a residual Add (and a following Relu) is folded into the NCHWc Conv that produces its
#      other operand, as onnxruntime does inside one graph, the skip input reordered once;
#   2. a tensor passed from block to block whose producer ends in ReorderOutput and whose
#      consumers start with ReorderInput travels in NCHWc: both reorders are dropped.
# The NCHWc shape of such a tensor equals its NCHW shape when channels are a multiple of the
# block size (8 with AVX2, 16 with AVX-512), so only those tensors are passed through; the
# outer graph is unchanged. The optimized bodies are machine-specific, which is fine: they
# exist only in this process.

_NCHWC = "com.microsoft.nchwc"
_NCHWC_CHANNEL_MULTIPLE = 16  # largest MLAS NCHWc block size: shapes stay equal below it
#: The pass holds a copy of the model and each optimized body while it runs; above this size
#: (VGG-19 is 548 MB: few blocks, FC-bound) that memory outweighs the layout gain.
_MAX_REWRITE_BYTES = 256 << 20


def optimize_block_layouts(model: onnx.ModelProto, *, per_session_threads: bool = True,
                           in_place: bool = False) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` (``model`` itself when ``in_place``) whose blocks exchange NCHWc
    tensors where that is safe; also the number of layout nodes (reorders, Add, Relu) removed.
    Blocks whose body onnxruntime cannot load or onnx cannot type are left as they are, so the
    library reports them.
    ``per_session_threads = False`` in a process with global thread pools (onnxruntime's Python
    API refuses per-session sessions there, which would leave every block unoptimized)."""
    model = model if in_place else copy_model(model)
    bodies = {}  # node index -> (body attribute, optimized body)
    removed = 0
    for i, node in enumerate(model.graph.node):
        if node.domain != _BLOCK_DOMAIN or node.op_type != _BLOCK_OP:
            continue
        attribute, body = _body_attribute(node)
        if body is not None and not _digest_matches(node, body):
            continue  # a damaged body is never rewritten (that would give it a valid digest)
        optimized = _ort_optimized(body, per_session_threads) if body is not None else None
        if optimized is None or not _same_interface(node, optimized):
            continue
        try:
            removed += _fold_residual_adds(optimized, onnx.load_from_string(body))
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
            continue  # a body onnx cannot type (e.g. a missing opset import): the library decides
        bodies[i] = (attribute, optimized)
    removed += _pass_nchwc_between_blocks(model.graph, {i: b for i, (_, b) in bodies.items()})
    for _, optimized in bodies.values():
        removed += _drop_dead_reorders(optimized.graph)
    for i, (attribute, optimized) in bodies.items():
        data = optimized.SerializeToString()
        attribute.t.raw_data, attribute.t.dims[:] = data, [len(data)]
        set_body_digest(model.graph.node[i], data)
    return model, removed


def _digest_matches(node: onnx.NodeProto, body: bytes) -> bool:
    """False when the node's body does not match its body_crc32 (the library then refuses it,
    naming the block); True when it matches or the node has no digest."""
    try:
        verify_body(node, body)
        return True
    except BodyDigestError:
        return False


def _same_interface(node: onnx.NodeProto, body: onnx.ModelProto) -> bool:
    """The body has one input per node input and one output per node output; a block that
    does not is left to the library, which refuses it with a message."""
    return len(body.graph.input) == len(node.input) and len(body.graph.output) == len(node.output)


def _body_attribute(node: onnx.NodeProto):
    """(attribute, serialized body) for a TENSOR(uint8) body held inline, else (None, None)."""
    for attribute in node.attribute:
        if attribute.name == "body" and attribute.type == onnx.AttributeProto.TENSOR:
            tensor = attribute.t
            if tensor.data_type == onnx.TensorProto.UINT8 and tensor.raw_data and not tensor.external_data:
                return attribute, tensor.raw_data
    return None, None


def _ort_optimized(body: bytes, per_session_threads: bool = True) -> onnx.ModelProto | None:
    """The body after onnxruntime's graph optimizations (ALL: NCHWc), or None if it fails."""
    with tempfile.TemporaryDirectory(prefix="onnxmlu-") as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = os.path.join(folder, "body.onnx")
        options.log_severity_level = 3  # the "hardware specific optimizations" warning is expected
        options.use_per_session_threads = per_session_threads
        try:
            ort.InferenceSession(body, options, providers=list(_DEFAULT_PROVIDERS))
            return onnx.load(options.optimized_model_filepath)
        except Exception:  # noqa: BLE001 - any failure: leave the block to the library's checks
            return None


def _attr(node: onnx.NodeProto, name: str, default=None):
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def _is(node, op_type: str, domain: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain == domain


def _is_plain_reorder(node, op_type: str) -> bool:
    return _is(node, op_type, _NCHWC) and not _attr(node, "channels_last", 0)


class _Graph:
    """Producers and consumers of a graph's values, refreshed after each edit."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.refresh()

    def refresh(self) -> None:
        self.producer = {out: n for n in self.graph.node for out in n.output}
        self.consumers: dict[str, list] = {}
        for n in self.graph.node:
            for name in n.input:
                self.consumers.setdefault(name, []).append(n)
        self.outputs = {o.name for o in self.graph.output}

    def only_use(self, name: str, node) -> bool:
        return name not in self.outputs and self.consumers.get(name, []) == [node]

    def rename_uses(self, old: str, new: str) -> None:
        for n in self.graph.node:
            for k, name in enumerate(n.input):
                if name == old:
                    n.input[k] = new

    def remove(self, *nodes) -> None:
        for n in nodes:
            self.graph.node.remove(n)


def _static_shapes(body: onnx.ModelProto) -> dict[str, tuple]:
    """Fully static shapes of the body's values, by name (onnx shape inference)."""
    inferred = onnx.shape_inference.infer_shapes(body)
    shapes = {}
    g = inferred.graph
    for value in list(g.input) + list(g.value_info) + list(g.output):
        dims = value.type.tensor_type.shape.dim
        if value.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = tuple(d.dim_value for d in dims)
    return shapes


def _fold_residual_adds(body: onnx.ModelProto, source: onnx.ModelProto) -> int:
    """Fold ``Add(ReorderOutput(Conv(...)), skip)`` (and a Relu after it) into the NCHWc Conv's
    Sum input, in graph order so that a residual chain becomes NCHWc link by link. ``source``
    (the body as written, standard ops) gives the shapes that prove the Add does not
    broadcast. Returns the number of nodes removed."""
    shapes = _static_shapes(source)
    g = _Graph(body.graph)
    removed = 0
    for add in [n for n in body.graph.node if _is(n, "Add", "")]:
        plan = _residual_plan(g, add, shapes)
        if plan is not None:
            removed += _apply_residual_plan(g, add, *plan)
            g.refresh()
    if removed:
        _sort_topologically(body.graph)
    return removed


def _residual_plan(g: _Graph, add, shapes):
    """(conv, reorder_output, skip) when ``add`` can be folded into a Conv, else None."""
    if len(add.input) != 2 or shapes.get(add.input[0]) is None or shapes.get(add.input[0]) != shapes.get(add.input[1]):
        return None
    if len(shapes[add.input[0]]) != 4:
        return None
    for k in (0, 1):
        reorder = g.producer.get(add.input[k])
        if not _is_plain_reorder(reorder, "ReorderOutput") or not g.only_use(add.input[k], add):
            continue
        conv = g.producer.get(reorder.input[0])
        if (_is(conv, "Conv", _NCHWC) and g.only_use(reorder.input[0], reorder) and len(conv.input) <= 3
                and _attr(conv, "activation") is None):
            return conv, reorder, add.input[1 - k]
    return None


def _apply_residual_plan(g: _Graph, add, conv, reorder, skip: str) -> int:
    """Conv gets Sum = the skip in NCHWc (and Relu as its activation when one follows); users
    of the Add's (or Relu's) value read the Conv's output, through a ReorderOutput only when
    they need NCHW."""
    removed = [reorder, add]
    result = add.output[0]
    relu = g.consumers.get(result, [None])[0]
    if _is(relu, "Relu", "") and g.only_use(result, relu):
        conv.attribute.append(onnx.helper.make_attribute("activation", "Relu"))
        removed.append(relu)
        result = relu.output[0]
    skip_producer = g.producer.get(skip)
    if _is_plain_reorder(skip_producer, "ReorderOutput"):
        skip_nchwc = skip_producer.input[0]  # already NCHWc upstream: reuse it
    else:
        skip_nchwc = f"{skip}_nchwc_sum"
        g.graph.node.append(onnx.helper.make_node("ReorderInput", [skip], [skip_nchwc], domain=_NCHWC,
                                                  channels_last=0, name=f"{skip_nchwc}_reorder"))
    while len(conv.input) < 3:
        conv.input.append("")  # optional bias left out
    conv.input.append(skip_nchwc)
    nchwc = conv.output[0]
    nchw_users = False
    for user in g.consumers.get(result, []):
        if _is_plain_reorder(user, "ReorderInput"):
            g.rename_uses(user.output[0], nchwc)
            removed.append(user)
        else:
            nchw_users = True
    g.remove(*removed)
    if nchw_users or result in g.outputs:
        channels = _attr(reorder, "channels")
        g.graph.node.append(onnx.helper.make_node("ReorderOutput", [nchwc], [result], domain=_NCHWC,
                                                  channels=channels, channels_last=0, name=f"{result}_reorder"))
        return len(removed) - 2
    return len(removed) - 1


def _sort_topologically(graph: onnx.GraphProto) -> None:
    """Nodes in an order where every value is produced before it is read (edits append)."""
    nodes = list(graph.node)
    produced = {out: i for i, n in enumerate(nodes) for out in n.output}
    order, state = [], [0] * len(nodes)  # 0 new, 1 visiting, 2 done

    def visit(i: int) -> None:
        stack = [(i, iter(nodes[i].input))]
        state[i] = 1
        while stack:
            j, inputs = stack[-1]
            for name in inputs:
                k = produced.get(name)
                if k is not None and state[k] == 0:
                    state[k] = 1
                    stack.append((k, iter(nodes[k].input)))
                    break
            else:
                stack.pop()
                state[j] = 2
                order.append(nodes[j])

    for i in range(len(nodes)):
        if state[i] == 0:
            visit(i)
    del graph.node[:]
    graph.node.extend(order)


def _pass_nchwc_between_blocks(graph: onnx.GraphProto, bodies: dict) -> int:
    """Drop the ReorderOutput/ReorderInput pair of every block-to-block tensor that allows it;
    ``bodies`` maps the index of each rewritable block node to its optimized body."""
    consumers: dict[str, list] = {}  # value -> [(node index, input position)]
    for i, node in enumerate(graph.node):
        for k, name in enumerate(node.input):
            consumers.setdefault(name, []).append((i, k))
    graph_outputs = {o.name for o in graph.output}
    removed = 0
    for i, body in bodies.items():
        for index, name in enumerate(graph.node[i].output):
            uses = consumers.get(name, [])
            if name in graph_outputs or not uses or any(j not in bodies for j, _ in uses):
                continue
            removed += _pass_through(body, index, [(bodies[j], k) for j, k in uses])
    return removed


def _drop_dead_reorders(graph: onnx.GraphProto) -> int:
    """Remove reorders left without readers by the edits; returns how many."""
    dropped = 0
    while True:
        g = _Graph(graph)
        dead = [n for n in graph.node if (_is(n, "ReorderOutput", _NCHWC) or _is(n, "ReorderInput", _NCHWC))
                and n.output[0] not in g.outputs and not g.consumers.get(n.output[0])]
        if not dead:
            return dropped
        g.remove(*dead)
        dropped += len(dead)


def _pass_through(producer: onnx.ModelProto, index: int, uses) -> int:
    """Make body output ``index`` of ``producer`` NCHWc and the matching inputs of its users
    read it as such, when every side ends/starts in a plain reorder; returns nodes removed."""
    pg = _Graph(producer.graph)
    output = producer.graph.output[index].name
    reorder = pg.producer.get(output)
    if not _is_plain_reorder(reorder, "ReorderOutput") or _attr(reorder, "channels", 0) % _NCHWC_CHANNEL_MULTIPLE:
        return 0
    if pg.consumers.get(output):  # read inside the producer too, in NCHW: keep it NCHW
        return 0
    plans = []
    for body, k in uses:
        ug = _Graph(body.graph)
        name = body.graph.input[k].name
        readers = ug.consumers.get(name, [])
        if name in ug.outputs or not readers or not all(_is_plain_reorder(r, "ReorderInput") for r in readers):
            return 0
        plans.append((ug, name, readers))
    for n in producer.graph.node:  # the NCHWc value takes the output's name
        for k, value in enumerate(n.output):
            if value == reorder.input[0]:
                n.output[k] = output
    pg.rename_uses(reorder.input[0], output)
    pg.remove(reorder)
    for ug, name, readers in plans:
        for r in readers:
            ug.rename_uses(r.output[0], name)
        ug.remove(*readers)
    return 1 + sum(len(readers) for _, _, readers in plans)
