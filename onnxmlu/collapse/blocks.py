"""Collapse: each planned block becomes one ``com.onnxmlu::MLUFusionBlock`` node.

For block ``b`` with node set ``S`` (a contiguous range of the analysis order):

* inputs  = tensors read by ``S`` that ``S`` does not produce and that are not constants,
  in first-use order (constants are copied into the body, so weights travel with it);
* outputs = tensors produced in ``S`` and read outside ``S`` (by a host node, another block,
  a subgraph's outer scope) or listed as graph outputs, in production order.

Because every block is a contiguous range of a topological order, a path leaving a block can
never re-enter it: the collapsed graph is acyclic by construction, and ``collapse`` asserts it
anyway. The body keeps the original value infos, so symbolic dimensions survive and the fused
model accepts every input shape the original accepted.

A block planned at FP16 or INT8 (``Block.precision``) gets the ``precision`` attribute and a
body rewritten by :class:`onnxmlu.precision.bodies.BlockBodies` (built on the FP32 body; INT8
blocks are calibrated first, before any weight is released). FP32 blocks are written exactly
as before, without the attribute.

Every block is labelled with what its body computes (:func:`~onnxmlu.plan.labels.honest_labels`,
applied again here for plans that did not pass the plan stage): a block holding quantized
arithmetic (``Layer.int8_arithmetic``) is INT8 whatever the plan asked, and its body keeps the
model's own quantized nodes and parameters exactly: it is not re-quantized, only marked
(:func:`~onnxmlu.collapse.own.mark_own_int8`), and its float layers stay float. Each FP16 or
INT8 body written is checked against its label (:func:`~onnxmlu.schema.label_mismatch`, the
custom-op library's rule): a mismatch is an error, never a mislabelled file. A weight
dequantization the analysis carried into a block (``Analysis.carried``) is owned by the block of
the layer that reads it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterable, Iterator, Mapping, Protocol, Sequence

import onnx
from onnx import helper

from onnxmlu.analyze import CONSTANT_REASON, Analysis
from onnxmlu.collapse.outputs import mark_output_shapes
from onnxmlu.errors import OnnxMluError
from onnxmlu.ir import topological_order
from onnxmlu.ir import copy_model_fields, is_default_domain, nested_graphs, node_inputs
from onnxmlu.ir.weights import fill_tensor, is_marker
from onnxmlu.plan.plan import Block, Plan
from onnxmlu.plan.labels import holds_int8_arithmetic, honest_labels
from onnxmlu.precisions import DEFAULT_PRECISION
from onnxmlu.collapse.own import OWN_INT8_NOTE, mark_own_int8
from onnxmlu.collapse.shared import shared_constants
from onnxmlu.ir import wire
from onnxmlu.wording import plural
from onnxmlu.schema import (DIGEST, DOMAIN, OP_TYPE, SHARED_ATTRIBUTE, VERSION, add_body, block_node_name,
                            describe_fused_model, fill_body_header, label_mismatch, note_host_reason, placeholder)



class BlockBodies(Protocol):
    """What collapse asks of the bodies at FP16/INT8 (:class:`onnxmlu.precision.bodies.BlockBodies`
    is one): collapse sits below the precision package and calls it only through this."""

    def prepare(self, blocks: Mapping[int, tuple[str, Sequence[str]]]) -> None: ...

    def transform(self, b: int, precision: str, body: onnx.ModelProto) -> onnx.ModelProto: ...

    def note(self, precision: str) -> str: ...

MAX_BODY_BYTES = 2**31 - 1


@dataclass(frozen=True)
class BlockFigures:
    """Per-block numbers written onto the node for people and reports."""

    gops: float
    sim_latency_us: float | None = None


@dataclass(frozen=True)
class BlockInterface:
    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    constants: tuple[str, ...]
    precision: str = DEFAULT_PRECISION
    #: The block holds quantized arithmetic: its body keeps the model's own INT8.
    quantized: bool = False
    #: Constants the block reads as inputs of the node, after ``inputs`` (:mod:`.shared`).
    shared: tuple[str, ...] = ()


def collapse(analysis: Analysis, plan: Plan, figures: Sequence[BlockFigures] | None = None,
             bodies: "BlockBodies | None" = None) -> onnx.ModelProto:
    """The fused model: host nodes as they were, one MLUFusionBlock node per plan block.

    The model is built field by field in place (no ``make_graph``/``make_model``, which copy
    every node and then the whole graph again): each body is serialized once and its bytes
    are copied once, into the node that carries them. ``bodies`` turns FP16/INT8 blocks'
    bodies into their precision (a :class:`~onnxmlu.precision.bodies.BlockBodies`, which the
    caller makes: collapse sits below the precision transforms; needed only when the plan has
    such blocks).
    """
    fused, blocks = fused_without_bodies(analysis, plan, figures)
    add_bodies(fused, analysis, blocks, bodies)
    return fused


def add_bodies(fused: onnx.ModelProto, analysis: Analysis, blocks: dict[int, tuple[int, BlockInterface]],
               bodies: "BlockBodies | None" = None) -> None:
    """Attach each block's body to its node of ``fused`` (from :func:`fused_without_bodies`),
    FP16/INT8 blocks' bodies at their precision (``bodies``, see :func:`prepare_bodies`)."""
    bodies = prepare_bodies(analysis, blocks, bodies)
    for position, (b, iface) in blocks.items():
        _add_body(fused.graph.node[position], analysis, b, iface, bodies=bodies)


def collapse_pieces(analysis: Analysis, plan: Plan, figures: Sequence[BlockFigures] | None = None,
                    bodies: "BlockBodies | None" = None) -> Iterator[wire.Piece]:
    """The fused model of :func:`collapse` as serialized pieces whose concatenation is the
    model file (see :func:`stream_pieces`)."""
    yield from stream_pieces(analysis, *fused_without_bodies(analysis, plan, figures), bodies=bodies)


def prepare_bodies(analysis: Analysis, blocks: dict[int, tuple[int, BlockInterface]],
                   bodies: "BlockBodies | None") -> "BlockBodies | None":
    """``bodies`` ready for the FP16/INT8 blocks among ``blocks``: INT8 blocks' inputs captured
    on the calibration samples. ``bodies`` itself when every block is FP32."""
    wanted = {b: (iface.precision, iface.inputs) for b, iface in blocks.values()
              if iface.precision != DEFAULT_PRECISION and not iface.quantized}
    if not wanted:
        return bodies
    if bodies is None:  # a bug of the caller: the pipeline makes them (pipeline._block_bodies)
        b, (precision, _) = next(iter(wanted.items()))
        raise AssertionError(f"block {b} is {precision} but no BlockBodies was given to transform its body")
    bodies.prepare(wanted)
    return bodies


def stream_pieces(analysis: Analysis, fused: onnx.ModelProto,
                  blocks: dict[int, tuple[int, BlockInterface]],
                  bodies: "BlockBodies | None" = None) -> Iterator[wire.Piece]:
    """``fused`` (from :func:`fused_without_bodies`) as serialized pieces: protobuf merges
    concatenated messages and appends repeated fields in order, so the first piece is the model
    without nodes and each further piece a model holding one node. Only one body exists at a
    time (a 548 MB model peaked at 4x its size when the fused model was built and then
    serialized whole), and a weight held by the analysis' weight store is released once the
    last block that reads it is written."""
    uses = Counter(name for _, iface in blocks.values() for name in iface.constants)
    bodies = prepare_bodies(analysis, blocks, bodies)  # INT8 calibration runs the model: before any release
    _release_unused(analysis, uses)  # host-node weights are already copied into ``fused``
    head = onnx.ModelProto()
    head.CopyFrom(fused)
    head.graph.ClearField("node")
    data = head.SerializeToString()
    del head
    yield data
    del data
    for position, node in enumerate(fused.graph.node):
        if position in blocks:
            pieces = _block_node_pieces(node, analysis, *blocks[position], uses=uses, bodies=bodies)
            yield from pieces
            del pieces  # the weights this block released from the store leave memory once written
            continue
        piece = onnx.ModelProto()
        piece.graph.node.add().CopyFrom(node)
        yield piece.SerializeToString()


def _block_node_pieces(node: onnx.NodeProto, analysis: Analysis, b: int, iface: BlockInterface, uses: Counter,
                       bodies: "BlockBodies | None") -> list[wire.Piece]:
    """The piece of the file holding block ``b``'s node (a model whose graph holds only that
    node) with its body and ``body_crc32``: the bytes :func:`_add_body` and ``SerializeToString``
    give, framed by hand around the weights' own buffers (:mod:`onnxmlu.ir.wire`), so each
    weight is read once, as it is written (the digest is taken from the same chunks)."""
    body = wire.Digested(_body_pieces(analysis, b, iface, uses, bodies))
    target = onnx.NodeProto()
    target.CopyFrom(node)
    length = body.nbytes
    _before_body(target, b, iface, length, bodies)

    def node_piece(crc: int) -> list[wire.Piece]:
        header = onnx.AttributeProto()
        fill_body_header(header, length)
        tensor = wire.splice(header.t, wire.RAW_DATA, [[body]])
        header.ClearField("t")  # framed by hand in ``tensor``, around the body
        attribute = wire.splice(header, wire.field_number(onnx.AttributeProto, "t"), [tensor])
        digest = helper.make_attribute(DIGEST, crc).SerializeToString()
        node_pieces = wire.splice(target, wire.field_number(onnx.NodeProto, "attribute"), [attribute, [digest]])
        return wire.framed(wire.GRAPH, wire.framed(wire.field_number(onnx.GraphProto, "node"), node_pieces))

    return wire.with_digest(node_piece, body)


def _body_pieces(analysis: Analysis, b: int, iface: BlockInterface, uses: Counter,
                 bodies: "BlockBodies | None") -> list[wire.Piece]:
    """Block ``b``'s serialized body as pieces. An FP32 body is framed around its weights'
    buffers: the body without its constants, serialized by protobuf, with each constant spliced
    in (a weight-store marker as its header and its array, released after its last block). An
    FP16/INT8 body is transformed as a whole proto and serialized by protobuf."""
    if iface.quantized or iface.precision != DEFAULT_PRECISION:
        return [_body_bytes(analysis, b, iface, uses, bodies)]
    body = fp32_body(analysis, b, replace(iface, constants=()), spliced=iface.constants)
    entries = [_constant_pieces(analysis, name, uses) for name in iface.constants]
    return wire.with_initializers(body, entries)


def _constant_pieces(analysis: Analysis, name: str, uses: Counter) -> list[wire.Piece]:
    """One constant of a body as pieces (what :func:`_add_constants` puts in the graph)."""
    tensor = analysis.index.initializers[name]
    if not is_marker(tensor):
        return [tensor.SerializeToString()]
    store = analysis.index.weights
    array = store.array(tensor)
    uses[name] -= 1
    if uses[name] == 0:
        store.release(tensor)  # ``array`` lives on in the pieces until the block is written
    piece = wire.ArrayBytes(array, release=store.releaser(array))  # a view of the input file: pages dropped once read
    return wire.splice(store.header(tensor), wire.RAW_DATA, [[piece]])


def _release_unused(analysis: Analysis, uses: Counter) -> None:
    store = analysis.index.weights
    if store is None:
        return
    for t in analysis.model.graph.initializer:
        if is_marker(t) and not uses[t.name]:
            store.release(t)


def fused_without_bodies(analysis: Analysis, plan: Plan, figures: Sequence[BlockFigures] | None,
                         outer: frozenset[str] = frozenset(), overridable: frozenset[str] = frozenset()
                         ) -> tuple[onnx.ModelProto, dict[int, tuple[int, BlockInterface]]]:
    """The fused model with bodiless fusion nodes (checked acyclic), and node position ->
    (block, interface) for each fusion node. ``outer``: the constants the enclosing graph
    defines (a lifted subgraph's), shared by every block that reads them; ``overridable``:
    names never shared, the graph's own inputs besides (:mod:`.shared`)."""
    graph = analysis.model.graph
    plan = honest_labels(plan, analysis.layers)
    owner = _block_of_node(analysis, plan)
    never = overridable | {i.name for i in graph.input}
    interfaces = _with_shared(analysis, owner, plan, block_interfaces(analysis, owner, len(plan.blocks)), outer, never)
    fused = _outer_shell(analysis)
    blocks: dict[int, tuple[int, BlockInterface]] = {}
    emitted: set[int] = set()
    for i in analysis.order:
        b = owner.get(i)
        if b is None:
            fused.graph.node.append(graph.node[i])
            if _worth_a_reason(analysis.host_reasons.get(i, CONSTANT_REASON)):
                note_host_reason(fused.graph.node[-1], analysis.host_reasons[i])
        elif b not in emitted:
            emitted.add(b)
            block = plan.blocks[b]
            quantized = holds_int8_arithmetic(block.layers(analysis.layers))
            blocks[len(fused.graph.node)] = (b, replace(interfaces[b], precision=block.precision, quantized=quantized))
            fig = figures[b] if figures else None
            _fill_fusion_node(fused.graph.node.add(), analysis, plan, b, interfaces[b], fig)
    _finish_outer(fused, analysis, interfaces)
    _assert_acyclic(fused)
    describe_fused_model(fused, hardware=plan.hardware, strategy=plan.strategy,
                         precisions=[b.precision for b in plan.blocks])
    return fused, blocks


def _with_shared(analysis: Analysis, owner: dict[int, int], plan: Plan, interfaces: list[BlockInterface],
                 outer: frozenset[str], never: frozenset[str]) -> list[BlockInterface]:
    """``interfaces`` with the shared constants (:func:`~onnxmlu.collapse.shared.shared_constants`,
    none of ``never``) of each FP32 block moved from its ``constants`` to its ``shared``."""
    index = analysis.index
    eligible = [b for b, block in enumerate(plan.blocks)
                if block.precision == DEFAULT_PRECISION and not holds_int8_arithmetic(block.layers(analysis.layers))]
    kept = {n for i in analysis.order if i not in owner for n in index.inputs[i]} | index.graph_outputs
    shared = shared_constants(index.initializers, (interfaces[b].constants for b in eligible), kept, outer) - never
    result = list(interfaces)
    for b in eligible:
        if any(n in shared for n in interfaces[b].constants):
            result[b] = replace(interfaces[b], constants=tuple(n for n in interfaces[b].constants if n not in shared),
                                shared=tuple(n for n in interfaces[b].constants if n in shared))
    return result


def block_interfaces(analysis: Analysis, owner: dict[int, int], count: int) -> list[BlockInterface]:
    """The interface of every block, in one pass over the order (not one pass per block)."""
    members: list[list[int]] = [[] for _ in range(count)]
    for i in analysis.order:
        b = owner.get(i)
        if b is not None:
            members[b].append(i)
    return [_interface(analysis, owner, b, tuple(nodes)) for b, nodes in enumerate(members)]


def block_interface(analysis: Analysis, owner: dict[int, int], b: int) -> BlockInterface:
    return _interface(analysis, owner, b, tuple(i for i in analysis.order if owner.get(i) == b))


def _interface(analysis: Analysis, owner: dict[int, int], b: int, nodes: tuple[int, ...]) -> BlockInterface:
    index = analysis.index
    produced: set[str] = set()
    seen: set[str] = set()  # membership in sets: list lookups made 5k-node blocks quadratic
    inputs: list[str] = []
    constants: list[str] = []
    for i in nodes:
        for name in index.inputs[i]:
            if name not in produced and name not in seen:
                seen.add(name)
                (constants if index.is_constant(name) else inputs).append(name)
        produced.update(index.outputs[i])
    outputs = [o for i in nodes for o in index.outputs[i] if _used_outside(analysis, owner, b, o)]
    if not inputs:
        raise OnnxMluError(f"block {b} reads no tensor from outside (only constants); "
                           "constant folding should have removed it")
    return BlockInterface(nodes, tuple(inputs), tuple(outputs), tuple(constants))


def _used_outside(analysis: Analysis, owner: dict[int, int], b: int, name: str) -> bool:
    if name in analysis.index.graph_outputs:
        return True
    return any(owner.get(c) != b for c in analysis.index.consumers.get(name, ()))


def _block_of_node(analysis: Analysis, plan: Plan) -> dict[int, int]:
    """Node index -> block number for every block of ``plan`` (validated by the caller)."""
    return block_owner(analysis, enumerate(plan.blocks))


def block_owner(analysis: Analysis, blocks: Iterable[tuple[int, Block]]) -> dict[int, int]:
    """Node index -> k for the nodes of each ``(k, block)``: its layers' nodes, and each weight
    dequantization carried into the block of the layer that reads it (``Analysis.carried``).
    The one rule of which block owns a node: collapse and auto's evaluator both use it."""
    owner = {analysis.layer_nodes[layer]: k for k, block in blocks for layer in range(block.start, block.stop)}
    owner.update((node, owner[reader]) for node, reader in analysis.carried.items() if reader in owner)
    return owner


def _fill_fusion_node(node: onnx.NodeProto, analysis: Analysis, plan: Plan, b: int, iface: BlockInterface,
                      fig: BlockFigures | None) -> None:
    block = plan.blocks[b]
    layers = analysis.layers[block.start : block.stop]
    node.op_type, node.domain, node.name = OP_TYPE, DOMAIN, block_node_name(b, block.mp)
    node.input.extend(iface.inputs + iface.shared)
    node.output.extend(iface.outputs)
    gops = float(sum(l.gops for l in layers))
    node.attribute.extend([helper.make_attribute("gops", gops),
                           helper.make_attribute("layers", [l.name for l in layers]),
                           helper.make_attribute("mp", block.mp),
                           helper.make_attribute("op_types", [l.op_type for l in layers])])
    if block.precision != DEFAULT_PRECISION:  # absent means FP32: FP32 blocks stay byte-identical
        node.attribute.append(helper.make_attribute("precision", block.precision))
    if iface.shared:  # absent means none: a block without shared weights is written as before
        node.attribute.append(helper.make_attribute(SHARED_ATTRIBUTE, len(iface.shared)))
    if fig is not None and fig.sim_latency_us is not None:
        node.attribute.append(helper.make_attribute("sim_latency_us", float(fig.sim_latency_us)))
    node.doc_string = _summary(layers, block.mp, fig, block.precision)
    if holds_int8_arithmetic(layers):
        node.doc_string += f" ({OWN_INT8_NOTE})"


def _add_body(node: onnx.NodeProto, analysis: Analysis, b: int, iface: BlockInterface,
              uses: Counter | None = None, bodies: "BlockBodies | None" = None) -> None:
    """Serialize block ``b`` and attach it to its node (bodies are added last, one at a time).
    ``uses`` counts the blocks still to be written per constant (see :func:`_add_constants`);
    ``bodies`` (from :func:`prepare_bodies`) transforms an FP16/INT8 block's body."""
    data = _body_bytes(analysis, b, iface, uses, bodies)
    _before_body(node, b, iface, len(data), bodies)
    add_body(node, data)  # the body and its digest (body_crc32)


def _before_body(node: onnx.NodeProto, b: int, iface: BlockInterface, length: int,
                 bodies: "BlockBodies | None") -> None:
    """What both writers of a body (in memory, :func:`_add_body`; streamed,
    :func:`_block_node_pieces`) do first: say on ``node`` how an FP16/INT8 body was made, and
    refuse a body of ``length`` bytes over protobuf's 2 GB limit of one message."""
    note = bodies.note(iface.precision) if bodies is not None and not iface.quantized else ""
    if note:
        node.doc_string += f" ({note})"
    if length > MAX_BODY_BYTES:
        raise OnnxMluError(f"block {b} serializes to {plural(length, 'byte')}, over the 2 GB "
                           "protobuf limit of one body; split it with a plan of smaller blocks")


def _worth_a_reason(reason: str) -> bool:
    """Whether a host node's reason goes into the file: every reason but a constant
    expression's (:data:`~onnxmlu.analyze.CONSTANT_REASON`: it runs once, at load). Those come
    by the thousand with one sentence each: the 1,911 weight generators of a caffe2 DenseNet
    took 271 KB of text on a 214 KB model."""
    return reason != CONSTANT_REASON


def _summary(layers, mp: int, fig: BlockFigures | None, precision: str = DEFAULT_PRECISION) -> str:
    counts = Counter(l.op_type for l in layers)
    ops = ", ".join(f"{op}×{n}" if n > 1 else op for op, n in counts.most_common())
    text = f"{plural(len(layers), 'layer')} ({ops}); {sum(l.gops for l in layers):.3f} GOPs; mp={mp}"
    if precision != DEFAULT_PRECISION:
        text += f"; {precision}"
    if fig is not None and fig.sim_latency_us is not None:
        text += f"; {fig.sim_latency_us:.1f} µs simulated"
    return text


def _body_bytes(analysis: Analysis, b: int, iface: BlockInterface, uses: Counter | None = None,
                bodies: "BlockBodies | None" = None) -> bytes:
    """The block as a serialized ModelProto, at its precision; the proto itself is freed on return."""
    body = fp32_body(analysis, b, iface, uses)
    if iface.quantized:
        mark_own_int8(body)
    elif iface.precision != DEFAULT_PRECISION:
        if bodies is None:
            raise AssertionError(f"block {b} is {iface.precision} but collapse prepared no bodies for it")
        body = bodies.transform(b, iface.precision, body)
    mismatch = label_mismatch(iface.precision, body)
    if mismatch:  # the labelling rule and the body transforms disagree: never write it
        remedy = "" if iface.quantized else "; plan it at fp32 (a plan file's \"precision\", or --keep-fp32)"
        raise OnnxMluError(f"block {b} ({', '.join(sorted({n.op_type for n in body.graph.node}))}): {mismatch}"
                           f"{remedy}")
    return body.SerializeToString()


def fp32_body(analysis: Analysis, b: int, iface: BlockInterface, uses: Counter | None = None,
              spliced: Sequence[str] = ()) -> onnx.ModelProto:
    """Block ``b``'s body as analysed (FP32): its nodes, interface value infos and constants;
    ``spliced``: the constants left out (spliced into its bytes later), which the output dims
    inference must still see, so the body's metadata is the same either way."""
    model, index = analysis.model, analysis.index
    nodes = [model.graph.node[i] for i in iface.nodes]
    internal = {o for i in iface.nodes for o in index.outputs[i]} - set(iface.outputs)
    body = onnx.ModelProto(ir_version=model.ir_version, producer_name="onnxmlu", doc_string=f"onnxmlu block {b}")
    body.opset_import.extend(o for o in model.opset_import if is_default_domain(o.domain))
    graph = body.graph
    graph.name = f"block_{b}"
    graph.node.extend(nodes)
    graph.input.extend(_value_info(analysis, n) for n in iface.inputs)
    graph.output.extend(_value_info(analysis, n) for n in iface.outputs)
    _add_constants(graph, analysis, iface.constants, uses)
    graph.initializer.extend(placeholder(index.initializers[n]) for n in iface.shared)
    graph.value_info.extend(index.value_infos[n] for n in sorted(internal) if n in index.value_infos)
    mark_output_shapes(body, [analysis.index.initializers[n] for n in spliced])
    return body


def _add_constants(graph: onnx.GraphProto, analysis: Analysis, names: Sequence[str], uses: Counter | None) -> None:
    """The block's constants, in order; a weight-store marker is written with its data, and
    released from the store when ``uses`` says this is its last block."""
    for name in names:
        tensor = analysis.index.initializers[name]
        if not is_marker(tensor):
            graph.initializer.append(tensor)
            continue
        last = False
        if uses is not None:
            uses[name] -= 1
            last = uses[name] == 0
        fill_tensor(graph.initializer.add(), tensor, analysis.index.weights, release=last)


def _value_info(analysis: Analysis, name: str) -> onnx.ValueInfoProto:
    vi = analysis.index.value_infos.get(name)
    if vi is None or not vi.type.tensor_type.elem_type:
        producer = analysis.index.producer.get(name)
        node = analysis.model.graph.node[producer] if producer is not None else None
        if node is not None and not is_default_domain(node.domain):  # onnx has no schema to infer it
            raise OnnxMluError(f"tensor {name!r} crosses a block boundary but its type is unknown: its producer "
                               f"{node.name or node.op_type!r} is {node.domain}::{node.op_type}, which onnx cannot "
                               "infer; add a value_info with its type to the model")
        raise OnnxMluError(f"tensor {name!r} crosses a block boundary but its type is unknown; "
                           "pass --input-shape so shape inference can type it")
    return vi


def _outer_shell(analysis: Analysis) -> onnx.ModelProto:
    """The fused model's model-level fields and graph name, before any node."""
    src = analysis.model
    fused = onnx.ModelProto()
    copy_model_fields(fused, src)
    if not any(o.domain == DOMAIN for o in fused.opset_import):
        fused.opset_import.append(helper.make_opsetid(DOMAIN, VERSION))
    fused.graph.name = src.graph.name or "fused"
    fused.graph.doc_string = src.graph.doc_string
    return fused


def _finish_outer(fused: onnx.ModelProto, analysis: Analysis, interfaces: Sequence[BlockInterface]) -> None:
    """Graph inputs, outputs, the host nodes' initializers and the value infos of the fused graph."""
    src, graph = analysis.model, fused.graph
    used = {n for node in graph.node for n in node_inputs(node)} | {o.name for o in src.graph.output}
    block_outputs = [o for iface in interfaces for o in iface.outputs]
    alive = used | {o for node in graph.node for o in node.output}
    graph.input.extend(i for i in src.graph.input if i.name in used or i.name not in analysis.index.initializers)
    graph.output.extend(src.graph.output)
    for t in src.graph.initializer:
        if t.name in used:
            fill_tensor(graph.initializer.add(), t, analysis.index.weights)
    graph.value_info.extend(_outer_value_infos(analysis, alive, block_outputs))
    _drop_subgraph_value_infos(graph)


def _drop_subgraph_value_infos(graph: onnx.GraphProto) -> None:
    """Host subgraphs (If branches, Loop bodies) leave without their inferred shapes:
    onnxruntime infers them itself at every shape the model runs at."""
    for sub in nested_graphs(graph):
        del sub.value_info[:]


def _outer_value_infos(analysis: Analysis, alive: set[str], block_outputs: list[str]) -> list:
    graph_io = {v.name for v in analysis.model.graph.input} | analysis.index.graph_outputs
    keep = [v for v in analysis.model.graph.value_info if v.name in alive and v.name not in graph_io]
    kept = {v.name for v in keep}
    keep.extend(_value_info(analysis, n) for n in block_outputs if n not in kept and n not in graph_io)
    return keep


def _assert_acyclic(model: onnx.ModelProto) -> None:
    try:
        topological_order(model.graph, prefer=lambda i: True)
    except OnnxMluError as exc:  # a bug, not a user error: collapse must never do this
        raise AssertionError(f"collapse produced an invalid graph: {exc}") from None
