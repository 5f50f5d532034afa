"""Block layouts: NCHWc across block boundaries, a graph pass over fused models.

Inside a block onnxruntime computes convolutions in its blocked NCHWc layout, but a block's
inputs and outputs are plain NCHW, so every boundary costs a ReorderOutput in the producing
block and a ReorderInput in each consumer, and a residual Add whose skip input comes from
outside the block stays unfused in NCHW (Add, Relu and two more reorders; once the residual
path is NCHW it stays so to the end of the block). Measured at batch 8, 1 thread, bodies
profiled one by one (in ms; original model 40.0 for MobileNetV2, 157.9 for ResNet-50):

* MobileNetV2 dlfusion: reorders +8.7, unfused Add +0.4, convolutions +0.2
* ResNet-50 dlfusion:   reorders +16.5, unfused Add and Relu +15.9, convolutions -6.2

while the kernel and the outer session add nothing measurable. :func:`optimize_block_layouts`
takes each body as onnxruntime optimizes it (the same transformers the inner session would
run) and finishes the job onnxruntime cannot do across a session boundary:

1. a residual Add (and a following Relu) is folded into the NCHWc Conv that produces its
   other operand, as onnxruntime does inside one graph, the skip input reordered once;
2. a tensor passed from block to block whose producer ends in ReorderOutput and whose
   consumers start with ReorderInput travels in NCHWc: both reorders are dropped;
3. in a block on more than one thread, where such a fused Add must copy its tensor because it
   is a block input or its result a block output (a session never writes in place across its
   edge), the copy becomes a ``Max(x, x)`` that runs on every thread of the block instead of
   the kernel's one-thread ``memcpy``.

The NCHWc shape of such a tensor equals its NCHW shape when channels are a multiple of the
block size (8 with AVX2, 16 with AVX-512), so only those tensors are passed through; the
outer graph is unchanged. The optimized bodies are machine-specific, which is fine: they
exist only in this process. A block the pass cannot optimize is left as it is (the library
then judges it), and so is one whose optimized body would no longer bear its ``precision`` out
(INT8 weights written as a ``Cast`` and a scale, folded to float weights by onnxruntime), each
said so in a :class:`~onnxmlu.diagnostics.Diagnostic` of stage ``layout``.
"""

from __future__ import annotations

import os
import tempfile

import onnx
import onnxruntime as ort

from onnxmlu import ortlog
from onnxmlu.diagnostics import Diagnostic
from onnxmlu.sessions import new_options
from onnxmlu.errors import first_line
from onnxmlu.ir import attribute_value, copy_model, is_fusion_block, sort_graphs
from onnxmlu.schema import (BodyDigestError, block_precision, file_references, label_mismatch, set_body_digest,
                            shared_names, verify_body)

_NCHWC = "com.microsoft.nchwc"
#: The library's override of every inner session's thread count (``kInnerThreadsEnv``).
INNER_THREADS_ENV = "ONNXMLU_INNER_THREADS"
_NCHWC_CHANNEL_MULTIPLE = 16  # largest MLAS NCHWc block size: shapes stay equal below it
_DEFAULT_PROVIDERS = ("CPUExecutionProvider",)


def optimize_block_layouts(model: onnx.ModelProto, *, per_session_threads: bool = True, inner_threads: int = 0,
                           diagnostics: list[Diagnostic] | None = None) -> tuple[onnx.ModelProto, int]:
    """A copy of ``model`` whose blocks exchange NCHWc tensors where that is safe; also the
    number of layout nodes (reorders, Add, Relu) removed (see :func:`optimize_layouts_in_place`)."""
    copy = copy_model(model)
    return copy, optimize_layouts_in_place(copy, per_session_threads=per_session_threads,
                                           inner_threads=inner_threads, diagnostics=diagnostics)


def optimize_layouts_in_place(model: onnx.ModelProto, *, per_session_threads: bool = True, inner_threads: int = 0,
                              diagnostics: list[Diagnostic] | None = None) -> int:
    """:func:`optimize_block_layouts` on ``model`` itself; the number of layout nodes removed.
    Blocks whose body onnxruntime cannot load or onnx cannot type are left as they are (each
    named in ``diagnostics``), so the library reports them.
    ``per_session_threads = False`` in a process with global thread pools (onnxruntime's Python
    API refuses per-session sessions there, which would leave every block unoptimized).
    ``inner_threads``: the threads each block's inner session runs on (0: the library's choice,
    its MP capped at the hardware threads); a block on more than one gets parallel copies
    (:func:`_copy_sums_in_parallel`)."""
    notes = diagnostics if diagnostics is not None else []
    bodies = {}  # node index -> (body attribute, optimized body)
    removed = 0
    for i, node in enumerate(model.graph.node):
        optimized = _optimized_block(node, per_session_threads, notes) if is_fusion_block(node) else None
        if optimized is not None:
            bodies[i] = optimized[0], optimized[1]
            removed += optimized[2]
    removed += _pass_nchwc_between_blocks(model.graph, {i: b for i, (_, b) in bodies.items()})
    for i, (_, optimized) in bodies.items():
        removed += _drop_dead_reorders(optimized.graph)
        if _block_threads(model.graph.node[i], inner_threads) > 1:
            _copy_sums_in_parallel(optimized.graph)
    for i, (attribute, optimized) in bodies.items():
        data = optimized.SerializeToString()
        attribute.t.raw_data, attribute.t.dims[:] = data, [len(data)]
        set_body_digest(model.graph.node[i], data)
    return removed


def _optimized_block(node: onnx.NodeProto, per_session_threads: bool, notes: list[Diagnostic]):
    """(body attribute, optimized body, nodes removed by residual folding) for one block, or
    None when the block is left as it is (the reason goes to ``notes``)."""
    attribute, body = _body_attribute(node)
    if body is None or not _digest_matches(node, body, notes):
        return None
    try:
        original = onnx.load_from_string(body)
    except Exception as exc:  # noqa: BLE001 - not a model: the library refuses it, naming the block
        notes.append(Diagnostic("layout", "body-not-optimized", node.name, f"body does not parse: {first_line(exc)}"))
        return None
    if file_references(original, shared_names(node)):  # never let onnxruntime open a file for a body
        notes.append(Diagnostic("layout", "body-file-reference", node.name, "body refers to a file"))
        return None
    if shared_names(node):  # its placeholders are filled by the library, which optimizes the body itself
        notes.append(Diagnostic("layout", "body-shared-weights", node.name, "its shared weights are inputs of the "
                                "node: the inner session optimizes it, without layouts exchanged with other blocks"))
        return None
    optimized = _ort_optimized(body, per_session_threads, node.name, notes)
    if optimized is None or not _same_interface(node, optimized):
        return None
    if label_mismatch(block_precision(node), optimized) and not label_mismatch(block_precision(node), original):
        # onnxruntime folded what bears the label out (INT8 weights cast to float become float
        # weights): the block keeps its own body, which the inner session optimizes the same way
        notes.append(Diagnostic("layout", "body-label", node.name, "optimizing would fold away what its label says"))
        return None
    try:
        removed = _fold_residual_adds(optimized, original)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        notes.append(Diagnostic("layout", "body-untyped", node.name, f"onnx cannot type the body: {first_line(exc)}"))
        return None  # e.g. a missing opset import: the library decides
    return attribute, optimized, removed


def _digest_matches(node: onnx.NodeProto, body: bytes, notes: list[Diagnostic]) -> bool:
    """False when the node's body does not match its body_crc32 (the library then refuses it,
    naming the block; rewriting it would give a damaged body a valid digest); True when it
    matches or the node has no digest."""
    try:
        verify_body(node, body)
        return True
    except BodyDigestError as exc:
        notes.append(Diagnostic("layout", "body-digest", node.name, str(exc)))
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
            if tensor.data_type != onnx.TensorProto.UINT8 or tensor.external_data:
                continue
            data = tensor.raw_data  # protobuf copies the body on every read: once
            if data:
                return attribute, data
    return None, None


def _ort_optimized(body: bytes, per_session_threads: bool, block: str,
                   notes: list[Diagnostic]) -> onnx.ModelProto | None:
    """The body after onnxruntime's graph optimizations (ALL: NCHWc), or None if it fails."""
    with tempfile.TemporaryDirectory(prefix="onnxmlu-") as folder:
        # exact INT8, as the library's inner session that runs the result (its u8 weights)
        options = new_options("all")
        options.optimized_model_filepath = os.path.join(folder, "body.onnx")
        options.log_severity_level = max(3, ortlog.severity())  # "hardware specific optimizations": expected
        options.use_per_session_threads = per_session_threads
        try:
            ort.InferenceSession(body, options, providers=list(_DEFAULT_PROVIDERS))
            return onnx.load(options.optimized_model_filepath)
        except Exception as exc:  # noqa: BLE001 - any failure: leave the block to the library's checks
            notes.append(Diagnostic("layout", "body-not-optimized", block,
                                    f"onnxruntime cannot optimize the body: {first_line(exc)}"))
            return None


def _is(node, op_type: str, domain: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain == domain


def _is_plain_reorder(node, op_type: str) -> bool:
    return _is(node, op_type, _NCHWC) and not attribute_value(node, "channels_last", 0)


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
        sort_graphs(body.graph)  # the edits appended nodes
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
                and attribute_value(conv, "activation") is None):
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
        channels = attribute_value(reorder, "channels")
        g.graph.node.append(onnx.helper.make_node("ReorderOutput", [nchwc], [result], domain=_NCHWC,
                                                  channels=channels, channels_last=0, name=f"{result}_reorder"))
        return len(removed) - 2
    return len(removed) - 1


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


def _block_threads(node: onnx.NodeProto, inner_threads: int) -> int:
    """The threads the library gives this block's inner session (``ONNXMLU_INNER_THREADS``,
    else ``inner_threads``, else the block's MP capped at the threads this process may use)."""
    override = os.environ.get(INNER_THREADS_ENV, "")
    if override.isdigit() and int(override) > 0:
        return int(override)
    if inner_threads > 0:
        return inner_threads
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # an mp that is not an INT: 1 here, and the library refuses the node with its message
    mp = next((a.i for a in node.attribute if a.name == "mp" and a.type == onnx.AttributeProto.INT), 1)
    return min(mp, usable)


def _copy_sums_in_parallel(graph: onnx.GraphProto) -> int:
    """Give each NCHWc Conv whose fused residual Add would copy its tensor a parallel copy
    instead; returns how many copies were made parallel.

    The Conv accumulates into the added tensor's buffer (input 3), in place where that tensor
    dies there. A session never writes into its inputs nor gives an intermediate's buffer to an
    output, so where the added tensor is a body input, or the Conv's result a body output, the
    kernel copies it first with one ``memcpy`` on one thread (up to 25 MB per boundary of
    ResNet-50 at batch 8). ``Max(x, x)`` is the same copy, exactly (elementwise, whatever the layout),
    and onnxruntime splits it over the session's threads: the input side gets a copy the Conv
    then overwrites in place, the output side a Conv in place and a copy into the output. Only
    for blocks on more than one thread: on one, ``Max`` is no faster than ``memcpy``
    (ResNet-50 dlfusion b8 at 2 threads, fused/original 1.129-1.132 -> 1.054-1.078; at 1
    thread 1.062-1.078 -> 1.081-1.091, so it is not done there)."""
    g = _Graph(graph)
    copies = [(conv, side) for conv, side in edge_copying_convs(graph) if conv.domain == _NCHWC]
    for conv, side in copies:
        if side == ADDED_INPUT:
            source, conv.input[3] = conv.input[3], f"{conv.input[3]}_sum_copy"
            graph.node.append(_copy_node(source, conv.input[3], f"{conv.name}_sum_copy"))
        else:
            result, conv.output[0] = conv.output[0], f"{conv.output[0]}_in_place"
            graph.node.append(_copy_node(conv.output[0], result, f"{conv.name}_out_copy"))
            g.rename_uses(result, conv.output[0])  # readers inside the body need not wait for the copy
    if copies:
        sort_graphs(graph)
    return len(copies)


#: The side of a block's edge that makes a fused residual Add copy its tensor.
ADDED_INPUT, RESULT_OUTPUT = "added tensor a block input", "result a block output"


def edge_copying_convs(graph: onnx.GraphProto) -> list[tuple[onnx.NodeProto, str]]:
    """The Convs of an onnxruntime-optimized body whose fused residual Add (input 3: NCHWc
    Conv's Sum, FusedConv's ``Z``) cannot run in place, each with the side of the edge that
    stops it (:data:`ADDED_INPUT` or :data:`RESULT_OUTPUT`)."""
    inputs, outputs = {v.name for v in graph.input}, {v.name for v in graph.output}
    found = []
    for node in graph.node:
        if node.op_type not in ("Conv", "FusedConv") or len(node.input) < 4 or not node.input[3]:
            continue
        if node.input[3] in inputs:
            found.append((node, ADDED_INPUT))
        elif node.output[0] in outputs:
            found.append((node, RESULT_OUTPUT))
    return found


def _copy_node(source: str, target: str, name: str) -> onnx.NodeProto:
    """``target = Max(source, source)``: an exact copy that onnxruntime runs on all the session's
    threads (``Identity`` is one ``memcpy``: 25 MB in 1.7 ms at 1 and at 2 threads, ``Max``
    1.7 and 0.9 ms; an ``Add`` of zero would turn -0.0 into +0.0)."""
    return onnx.helper.make_node("Max", [source, source], [target], name=name)


def _pass_through(producer: onnx.ModelProto, index: int, uses) -> int:
    """Make body output ``index`` of ``producer`` NCHWc and the matching inputs of its users
    read it as such, when every side ends/starts in a plain reorder; returns nodes removed."""
    pg = _Graph(producer.graph)
    output = producer.graph.output[index].name
    reorder = pg.producer.get(output)
    if not _is_plain_reorder(reorder, "ReorderOutput"):
        return 0
    if attribute_value(reorder, "channels", 0) % _NCHWC_CHANNEL_MULTIPLE:
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
