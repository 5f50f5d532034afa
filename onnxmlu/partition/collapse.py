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
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import onnx
from onnx import helper

from onnxmlu.analyze import Analysis
from onnxmlu.errors import OnnxMluError
from onnxmlu.graph import copy_model_fields, node_inputs, topological_order
from onnxmlu.partition.plan import Plan
from onnxmlu.schema import DOMAIN, OP_TYPE, VERSION, body_attribute

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


def collapse(analysis: Analysis, plan: Plan, figures: Sequence[BlockFigures] | None = None) -> onnx.ModelProto:
    """The fused model: host nodes as they were, one MLUFusionBlock node per plan block."""
    graph = analysis.model.graph
    owner = _block_of_node(analysis, plan)
    interfaces = [block_interface(analysis, owner, b) for b in range(len(plan.blocks))]
    fused_nodes, emitted = [], set()
    for i in analysis.order:
        b = owner.get(i)
        if b is None:
            fused_nodes.append(graph.node[i])
        elif b not in emitted:
            emitted.add(b)
            fig = figures[b] if figures else None
            fused_nodes.append(_fusion_node(analysis, plan, b, interfaces[b], fig))
    model = _outer_model(analysis, fused_nodes, interfaces)
    _assert_acyclic(model)
    return model


def block_interface(analysis: Analysis, owner: dict[int, int], b: int) -> BlockInterface:
    graph, index = analysis.model.graph, analysis.index
    nodes = tuple(i for i in analysis.order if owner.get(i) == b)
    produced: set[str] = set()
    inputs: list[str] = []
    constants: list[str] = []
    for i in nodes:
        for name in node_inputs(graph.node[i]):
            bucket = constants if index.is_constant(name) else inputs
            if name not in produced and name not in bucket:
                bucket.append(name)
        produced.update(o for o in graph.node[i].output if o)
    outputs = [o for i in nodes for o in graph.node[i].output if o and _used_outside(analysis, owner, b, o)]
    if not inputs:
        raise OnnxMluError(f"block {b} reads no tensor from outside (only constants); "
                           "constant folding should have removed it")
    return BlockInterface(nodes, tuple(inputs), tuple(outputs), tuple(constants))


def _used_outside(analysis: Analysis, owner: dict[int, int], b: int, name: str) -> bool:
    if name in analysis.index.graph_outputs:
        return True
    return any(owner.get(c) != b for c in analysis.index.consumers.get(name, ()))


def _block_of_node(analysis: Analysis, plan: Plan) -> dict[int, int]:
    """Node index -> block number; the plan was validated against the layers by the caller."""
    return {analysis.layer_nodes[layer]: b
            for b, block in enumerate(plan.blocks) for layer in range(block.start, block.stop)}


def _fusion_node(analysis: Analysis, plan: Plan, b: int, iface: BlockInterface,
                 fig: BlockFigures | None) -> onnx.NodeProto:
    block = plan.blocks[b]
    layers = analysis.layers[block.start : block.stop]
    body = _body_model(analysis, b, iface)
    attr = body_attribute(body)
    if len(attr.t.raw_data) > MAX_BODY_BYTES:
        raise OnnxMluError(f"block {b} serializes to {len(attr.t.raw_data)} bytes, over the 2 GB "
                           "protobuf limit of one body; split it with a plan of smaller blocks")
    node = helper.make_node(
        OP_TYPE, list(iface.inputs), list(iface.outputs), name=f"block_{b} (mp={block.mp})",
        domain=DOMAIN, mp=block.mp, layers=[l.name for l in layers], op_types=[l.op_type for l in layers],
        gops=float(sum(l.gops for l in layers)),
    )
    node.attribute.append(attr)
    if fig is not None and fig.sim_latency_us is not None:
        node.attribute.append(helper.make_attribute("sim_latency_us", float(fig.sim_latency_us)))
    node.doc_string = _summary(layers, block.mp, fig)
    return node


def _summary(layers, mp: int, fig: BlockFigures | None) -> str:
    counts = Counter(l.op_type for l in layers)
    ops = ", ".join(f"{op}×{n}" if n > 1 else op for op, n in counts.most_common())
    text = f"{len(layers)} layers ({ops}); {sum(l.gops for l in layers):.3f} GOPs; mp={mp}"
    if fig is not None and fig.sim_latency_us is not None:
        text += f"; {fig.sim_latency_us:.1f} µs simulated"
    return text


def _body_model(analysis: Analysis, b: int, iface: BlockInterface) -> onnx.ModelProto:
    model, index = analysis.model, analysis.index
    nodes = [model.graph.node[i] for i in iface.nodes]
    internal = {o for n in nodes for o in n.output if o} - set(iface.outputs)
    graph = helper.make_graph(
        nodes, f"block_{b}",
        inputs=[_value_info(analysis, n) for n in iface.inputs],
        outputs=[_value_info(analysis, n) for n in iface.outputs],
        initializer=[index.initializers[n] for n in iface.constants],
        value_info=[index.value_infos[n] for n in sorted(internal) if n in index.value_infos],
    )
    opsets = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    return helper.make_model(graph, opset_imports=opsets, ir_version=model.ir_version,
                             producer_name="onnxmlu", doc_string=f"onnxmlu block {b}")


def _value_info(analysis: Analysis, name: str) -> onnx.ValueInfoProto:
    vi = analysis.index.value_infos.get(name)
    if vi is None or not vi.type.tensor_type.elem_type:
        producer = analysis.index.producer.get(name)
        node = analysis.model.graph.node[producer] if producer is not None else None
        if node is not None and node.domain not in ("", "ai.onnx"):  # onnx has no schema to infer it
            raise OnnxMluError(f"tensor {name!r} crosses a block boundary but its type is unknown: its producer "
                               f"{node.name or node.op_type!r} is {node.domain}::{node.op_type}, which onnx cannot "
                               "infer; add a value_info with its type to the model")
        raise OnnxMluError(f"tensor {name!r} crosses a block boundary but its type is unknown; "
                           "pass --input-shape so shape inference can type it")
    return vi


def _outer_model(analysis: Analysis, nodes: list[onnx.NodeProto],
                 interfaces: Sequence[BlockInterface]) -> onnx.ModelProto:
    src = analysis.model
    used = {n for node in nodes for n in node_inputs(node)} | {o.name for o in src.graph.output}
    block_outputs = [o for iface in interfaces for o in iface.outputs]
    alive = used | {o for node in nodes for o in node.output}
    graph = helper.make_graph(
        nodes, src.graph.name or "fused",
        inputs=[i for i in src.graph.input if i.name in used or i.name not in analysis.index.initializers],
        outputs=list(src.graph.output),
        initializer=[t for t in src.graph.initializer if t.name in used],
        value_info=_outer_value_infos(analysis, alive, block_outputs),
    )
    graph.doc_string = src.graph.doc_string
    fused = helper.make_model(graph)
    copy_model_fields(fused, src)
    if not any(o.domain == DOMAIN for o in fused.opset_import):
        fused.opset_import.append(helper.make_opsetid(DOMAIN, VERSION))
    return fused


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
