"""Blocks inside control flow: each host ``If`` branch and ``Loop``/``Scan`` body as a model.

The accelerator's host runtime runs control flow (a block is straight-line code), but the
work inside a branch is ordinary layers. So every subgraph of a host ``If``/``Loop``/``Scan``
is lifted into a model of its own, fused by the same passes as the main graph, and grafted
back in place of the subgraph: the control-flow node stays on the host and its branches now
hold ``MLUFusionBlock`` nodes.

Lifting subgraph ``G`` of node ``N`` (:func:`lift`):

* ``G``'s formal inputs stay its inputs, typed from ``N`` where ``G`` leaves them untyped
  (``Loop``: iteration number int64[], condition bool[], carried values as ``N``'s initial
  values; ``Scan``: states as ``N``'s, scan slices as ``N``'s inputs less the scan axis);
* each outer-scope tensor ``G`` reads becomes an input typed as the enclosing graph types it,
  except an outer constant, which is copied in as an initializer (a block carries its weights
  in its body, so a branch's blocks carry the outer weights they read);
* pins: every input at the size the enclosing graph prices it at (``Loop``: a carried value
  at its initial value's size), so the branch's layers are priced at the sizes they run at
  while ``G`` keeps its symbolic dims.

A subgraph without arithmetic (:func:`may_hold_arithmetic`: only data movement and copies) is
not lifted: a block there would cost a launch and do nothing.

Grafting back (:func:`graft`): the fused model's nodes, the initializers it made (not the
copied outer constants, which the enclosing scope still defines: a subgraph may not redefine
them), ``G``'s own inputs and outputs, and the value infos of the tensors defined in ``G``.

Pricing: a branch's blocks are priced per run of the branch; ``runs`` says how many times one
run of the enclosing graph runs it: ``If`` branches 1 (one of the two is taken), a ``Scan`` body
its scan length at the pricing shape, a ``Loop`` body its trip count at the pricing shape when
that is known before the run (a constant, or a dim the pins size: :func:`_scalar`), else
unknown (None). Branch latencies are reported beside the main graph's blocks, never added
to them: which branch runs, and how often, depends on the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
from onnx import TensorProto, helper

from onnxmlu.analyze import Analysis
from onnxmlu.analyze.optable import OP_KINDS
from onnxmlu.ir import attribute_value, is_fusion_block, iter_graphs, outer_scope_names, subgraph
from onnxmlu.ir.index import GraphIndex
from onnxmlu.ir.weights import fill_tensor
from onnxmlu.plan.plan import Plan

#: Control-flow ops whose subgraphs are fused.
CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
#: Element-wise ops that only copy or convert: with data movement, they are no arithmetic.
COPIES = frozenset({"Identity", "Cast", "CastLike", "Dropout"})


class LiftError(Exception):
    """A subgraph that cannot be lifted into a model of its own; the message says why."""


@dataclass(frozen=True)
class Site:
    """One subgraph of a host control-flow node: ``position`` in its graph, the attribute
    holding the subgraph, and a readable key ``NODE.ATTR``."""

    position: int
    attribute: str
    key: str


@dataclass
class Lifted:
    """A subgraph as a model: the model, pins for its inputs, the outer constants copied in."""

    model: onnx.ModelProto
    pins: dict[str, list[int]]
    copied: frozenset[str]
    runs: int | None


def sites(graph: onnx.GraphProto, label) -> list[Site]:
    """The subgraphs of ``graph``'s host control-flow nodes (``label(node)`` names a node)."""
    return [Site(position, attr.name, f"{label(node)}.{attr.name}")
            for position, node in enumerate(graph.node) if node.op_type in CONTROL_FLOW
            for attr in node.attribute if attr.type == onnx.AttributeProto.GRAPH]


def computes(op_type: str, kind: str | None) -> bool:
    """Whether an op of this type and op-table kind is arithmetic: not data movement, not a copy."""
    return kind not in (None, "data") and op_type not in COPIES


def may_hold_arithmetic(sub: onnx.GraphProto) -> bool:
    """Whether ``sub`` (or a graph nested in it) holds an op the accelerator computes with
    (:func:`computes`). A subgraph of ``Squeeze``/``Identity`` gains nothing from a block (a
    launch for no work), so it is not lifted."""
    return any(computes(node.op_type, OP_KINDS.get(node.op_type)) for graph in iter_graphs(sub) for node in graph.node)


def subgraph_of(graph: onnx.GraphProto, site: Site) -> onnx.GraphProto:
    return subgraph(graph.node[site.position], site.attribute)


def lift(outer: onnx.ModelProto, index: GraphIndex, node: onnx.NodeProto, sub: onnx.GraphProto) -> Lifted:
    """``sub`` (a subgraph of ``node`` in the graph ``index`` indexes) as a model of its own."""
    model = onnx.ModelProto(ir_version=outer.ir_version, producer_name="onnxmlu")
    model.opset_import.extend(outer.opset_import)
    graph = model.graph
    graph.CopyFrom(sub)
    pins = {}
    formal = _formal_types(node, index)
    for k, vi in enumerate(graph.input):
        known = formal[k] if k < len(formal) else None
        if known is not None:
            if not vi.type.tensor_type.elem_type:
                vi.type.CopyFrom(known[0].type)
            if known[1] is not None:
                pins[vi.name] = known[1]
    copied = []
    for name in outer_scope_names(sub):
        if index.is_constant(name):
            fill_tensor(graph.initializer.add(), index.initializers[name], index.weights)
            copied.append(name)
            continue
        vi = index.value_infos.get(name)
        if vi is None or not vi.type.tensor_type.elem_type:
            raise LiftError(f"its outer-scope tensor {name!r} has no known type")
        graph.input.append(vi)
        shape = index.concrete_shape(name)
        if shape is not None:
            pins[name] = shape
    return Lifted(model, pins, frozenset(copied), _runs(node, index))


def _formal_types(node: onnx.NodeProto, index: GraphIndex) -> list[tuple[onnx.ValueInfoProto, list[int] | None] | None]:
    """Per formal input of ``node``'s body: a value info typing it and its size, or None."""
    if node.op_type == "Loop":
        scalars = [(helper.make_tensor_value_info("i", TensorProto.INT64, []), []),
                   (helper.make_tensor_value_info("c", TensorProto.BOOL, []), [])]
        return [*scalars, *(_outer(index, name) for name in node.input[2:])]
    if node.op_type == "Scan":
        states = len(node.input) - attribute_value(node, "num_scan_inputs", 0)
        axes = attribute_value(node, "scan_input_axes", [])
        scans = [_outer(index, name, axis=axes[k] if k < len(axes) else 0)
                 for k, name in enumerate(node.input[states:])]
        return [*(_outer(index, name) for name in node.input[:states]), *scans]
    return []


def _outer(index: GraphIndex, name: str, axis: int | None = None):
    vi = index.value_infos.get(name)
    if vi is None and index.is_constant(name):
        t = index.initializers[name]
        vi = helper.make_tensor_value_info(name, t.data_type, list(t.dims))
    if vi is None or not vi.type.tensor_type.elem_type:
        return None
    shape = index.concrete_shape(name)
    typed = onnx.ValueInfoProto()
    typed.CopyFrom(vi)
    if axis is not None:  # one slice of a scanned input: the scan axis is gone
        dims = typed.type.tensor_type.shape.dim
        if len(dims) > axis % max(len(dims), 1):
            del dims[axis % len(dims)]
        shape = None if shape is None else shape[: axis % len(shape)] + shape[axis % len(shape) + 1:]
    return typed, shape


def _runs(node: onnx.NodeProto, index: GraphIndex) -> int | None:
    """How many times one run of the enclosing graph runs ``node``'s body (see module doc)."""
    if node.op_type == "If":
        return 1
    if node.op_type == "Loop":
        return _scalar(index, node.input[0]) if node.input and node.input[0] else None
    states = len(node.input) - attribute_value(node, "num_scan_inputs", 0)
    first = node.input[states] if states < len(node.input) else None
    shape = index.concrete_shape(first) if first else None
    axes = attribute_value(node, "scan_input_axes", [])
    return None if not shape else int(shape[(axes[0] if axes else 0) % len(shape)])


#: Ops that pass a scalar's value through unchanged (a trip count cast, squeezed or reshaped).
_PASS_VALUE = frozenset({"Identity", "Cast", "Squeeze", "Unsqueeze", "Reshape"})


def _scalar(index: GraphIndex, name: str) -> int | None:
    """The value of a one-element integer tensor at the pricing shape: a constant, or a dim
    read by ``Gather(Shape(X), k)`` (exporters' trip counts: a sequence's length), through
    casts and reshapes; None when only the run knows it."""
    value = index.constant(name)
    if value is not None:
        return int(value.reshape(())) if value.size == 1 and value.dtype.kind in "iu" else None
    producer = index.producer.get(name)
    node = index.graph.node[producer] if producer is not None else None
    if node is None:
        return None
    if node.op_type in _PASS_VALUE:
        return _scalar(index, node.input[0])
    shape_of = index.producer.get(node.input[0]) if node.op_type == "Gather" else None
    shape_node = index.graph.node[shape_of] if shape_of is not None else None
    if shape_node is None or shape_node.op_type != "Shape" or attribute_value(node, "axis", 0) != 0:
        return None
    dims, k = index.concrete_shape(shape_node.input[0]), index.constant(node.input[1])
    if dims is None or k is None or k.size != 1:
        return None
    dims = dims[attribute_value(shape_node, "start", 0): attribute_value(shape_node, "end", len(dims))]
    position = int(k.reshape(()))
    return int(dims[position]) if -len(dims) <= position < len(dims) else None


def graft(sub: onnx.GraphProto, fused: onnx.ModelProto, copied: frozenset[str], prefix: str) -> None:
    """Replace ``sub``'s contents by the fused model of its lifted form, in place (module doc);
    block nodes are named after the branch (``prefix``) so every block has its own name."""
    del sub.node[:], sub.initializer[:], sub.value_info[:]  # its own inputs and outputs stay
    for node in fused.graph.node:
        if is_fusion_block(node):
            node.name = f"{prefix}/{node.name}"
    sub.node.extend(fused.graph.node)
    sub.initializer.extend(t for t in fused.graph.initializer if t.name not in copied)
    defined = {o for node in sub.node for o in node.output} - {vi.name for vi in sub.output}
    sub.value_info.extend(vi for vi in fused.graph.value_info if vi.name in defined)


@dataclass
class BranchPlan:
    """The blocks planned inside one subgraph of a host control-flow node (``key``:
    ``NODE.ATTR``): its plan and latencies per run of the branch, ``runs`` per run of the
    enclosing graph (None: not known before the run), its analysis and its own branches."""

    key: str
    op_type: str
    runs: int | None
    plan: Plan
    latencies: list[float]
    analysis: Analysis
    branches: list["BranchPlan"] = field(default_factory=list)

    @property
    def sim_latency_us(self) -> float:
        return float(sum(self.latencies))
