"""Loading and normalizing ONNX models, and the graph facts every later stage needs.

``load_model`` reads a model (external data included) and turns every way it can be broken
into one :class:`ModelLoadError` line. ``normalize`` makes the graph regular for the rest of
the pipeline:

1. input-shape overrides (``--input-shape NAME:1,3,224,224``) pin symbolic dimensions;
2. onnx-graphsurgeon folds ``Constant`` nodes and constant sub-expressions into initializers
   (exporters such as tf2onnx and older PyTorch emit weights as ``Constant`` nodes);
3. shape inference: onnx's, then onnxruntime's symbolic shape inference where onnx leaves
   tensors without a type, so every tensor that may cross a block boundary has a type.

:class:`GraphIndex` answers producer/consumer/type questions in O(1) after one pass.
"""

from __future__ import annotations

import heapq
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import onnx

from onnxmlu.errors import ModelLoadError, OnnxMluError
from onnxmlu.large_models import infer_on_skeleton, itemsize, tensor_array, tensor_payload_bytes

MIN_OPSET = 7
MAX_PROTO_BYTES = 2**31 - 1
#: Above this many bytes of tensor data, shape inference runs on a skeleton of the model
#: (see :func:`infer_shapes`) and graphsurgeon's constant folding is skipped.
LIGHT_INFERENCE_BYTES = 2**30


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Read an ONNX file (and its external data) or raise a one-line ModelLoadError."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"model file {p} does not exist")
    if p.is_dir():
        raise ModelLoadError(f"{p} is a directory, not an ONNX model file")
    if p.stat().st_size == 0:
        raise ModelLoadError(f"model file {p} is empty")
    try:
        model = onnx.load(str(p), load_external_data=True)
    except Exception as exc:  # protobuf's DecodeError, OSError for missing external data, ...
        raise ModelLoadError(f"cannot read {p} as an ONNX model: {_first_line(exc)}") from None
    if not model.HasField("graph") or not model.graph.node:
        raise ModelLoadError(f"{p} holds no ONNX graph (is it an ONNX model?)")
    return model


def parse_input_shapes(specs: Iterable[str]) -> dict[str, list[int | str]]:
    """Parse ``NAME:1,3,224,224`` items; a non-integer dim stays symbolic."""
    shapes: dict[str, list[int | str]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition(":")
        if not sep or not name or not dims:
            raise OnnxMluError(f"--input-shape {spec!r} is not NAME:D1,D2,... (e.g. input:1,3,224,224)")
        shapes[name] = [int(d) if d.strip().lstrip("-").isdigit() else d.strip() for d in dims.split(",")]
    return shapes


def opset_version(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    raise OnnxMluError("model imports no version of the standard ONNX domain")


def check_opset(model: onnx.ModelProto) -> None:
    version = opset_version(model)
    latest = onnx.defs.onnx_opset_version()
    if version < MIN_OPSET:
        raise OnnxMluError(f"model uses opset {version}; onnxmlu supports opsets {MIN_OPSET}..{latest}")
    if version > latest:
        raise OnnxMluError(f"model uses opset {version}, newer than this onnx knows ({latest})")


def normalize(model: onnx.ModelProto, input_shapes: dict[str, list[int | str]] | None = None,
              fold_constants: bool = True, *, owned: bool = False) -> onnx.ModelProto:
    """Overrides, constant folding and shape inference; returns a new model, or ``model``
    itself changed in place when the caller ``owned`` it (no copy of every weight)."""
    check_opset(model)
    check_nodes(model)
    if not owned:
        model = _copy(model)
    if input_shapes:
        _override_input_shapes(model, input_shapes)
    if fold_constants and needs_folding(model.graph) and tensor_payload_bytes(model) <= LIGHT_INFERENCE_BYTES:
        model = _fold_constants(model)  # graphsurgeon copies every weight: skipped for huge models
    return infer_shapes(model)


#: Ops graphsurgeon may fold even with non-constant inputs (their value follows from shapes).
_SHAPE_OPS = frozenset({"Constant", "Shape", "Size"})


def needs_folding(graph: onnx.GraphProto) -> bool:
    """Whether graphsurgeon's fold + cleanup could change the graph: a Constant/Shape/Size node,
    a node whose inputs are all constants, a dead node, or a subgraph (folded recursively).

    One O(nodes) pass, so the import/fold/export round trip (a copy of every weight) is only
    paid by graphs that have something to fold.
    """
    constants = {t.name for t in graph.initializer} - {i.name for i in graph.input}
    for node in graph.node:
        if node.op_type in _SHAPE_OPS or any(_subgraphs(a) for a in node.attribute):
            return True
        inputs = [n for n in node.input if n]
        if inputs and all(n in constants for n in inputs):
            return True
    return _has_dead_nodes(graph)


def _has_dead_nodes(graph: onnx.GraphProto) -> bool:
    live = {o.name for o in graph.output}
    for node in reversed(graph.node):  # file order is usually topological; else fold anyway
        if not any(o in live for o in node.output):
            return True
        live.update(node.input)
    return False


def check_nodes(model: onnx.ModelProto) -> None:
    """The ONNX checker's per-node rules (schema, arity, attributes) and single assignment.

    The whole-model checker is stricter than onnxruntime (it wants a shape on every graph
    input and output, and nodes in file order), so only the node rules that onnxruntime also
    enforces are applied; cycles and dangling inputs get their own messages later.
    """
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = model.ir_version or onnx.IR_VERSION
    ctx.opset_imports = {imp.domain: imp.version for imp in model.opset_import}
    producers: dict[str, str] = {}
    for node in model.graph.node:
        label = f"node {node.name or node.op_type!r} ({node.op_type})"
        if not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            try:
                onnx.checker.check_node(node, ctx)
            except onnx.checker.ValidationError as exc:
                raise OnnxMluError(f"model fails the ONNX checker: {label}: {_first_line(exc)}") from None
        for name in node.output:
            if name and name in producers:
                raise OnnxMluError(f"model fails the ONNX checker: tensor {name!r} is produced by both "
                                   f"{producers[name]} and {label}; ONNX graphs are single-assignment")
            producers[name] = label


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx shape inference, completed by onnxruntime's symbolic inference when needed.

    onnx's inference serializes the model it is given (protobuf's 2 GB limit, and a copy of
    every weight: 3 serializations of ResNet-50 took 0.9 s), so it runs on a skeleton
    without the large weights and the inferred types are set on ``model`` in place.
    """
    return infer_on_skeleton(model, _infer_shapes_full)


def _infer_shapes_full(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise OnnxMluError(f"shape inference failed: {_first_line(exc)}") from None
    if not untyped_tensors(inferred):
        return inferred
    return _symbolic_infer(inferred)


def untyped_tensors(model: onnx.ModelProto) -> list[str]:
    """Node outputs of the main graph that carry no element type after inference."""
    typed = {v.name for v in _all_value_infos(model.graph) if v.type.tensor_type.elem_type}
    typed |= {t.name for t in model.graph.initializer}
    return [o for n in model.graph.node for o in n.output if o and o not in typed]


def _symbolic_infer(model: onnx.ModelProto) -> onnx.ModelProto:
    try:  # needs sympy, which onnxruntime does not install: without it onnx's result stands
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        out = SymbolicShapeInference.infer_shapes(model, auto_merge=True, guess_output_rank=True)
    except Exception:  # it raises on ops it does not know; onnx's partial result stands
        return model
    return out if out is not None else model


def _override_input_shapes(model: onnx.ModelProto, shapes: dict[str, list[int | str]]) -> None:
    inputs = {i.name: i for i in model.graph.input}
    for name, dims in shapes.items():
        if name not in inputs:
            raise OnnxMluError(f"--input-shape names {name!r}, which is not a model input "
                               f"(inputs: {', '.join(inputs)})")
        tensor_type = inputs[name].type.tensor_type
        tensor_type.shape.Clear()
        for d in dims:
            dim = tensor_type.shape.dim.add()
            if isinstance(d, int):
                dim.dim_value = d
            else:
                dim.dim_param = d
    # Stale intermediate shapes would contradict the override: let inference redo them.
    del model.graph.value_info[:]


def _fold_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnx_graphsurgeon as gs

    from onnx_graphsurgeon.logger import G_LOGGER

    G_LOGGER.severity = G_LOGGER.ERROR  # failures to fold are expected and harmless
    graph = gs.import_onnx(model)
    try:
        graph.fold_constants(error_ok=True)
    except Exception:  # folding is an optimization: a model it cannot fold is still valid
        pass
    graph.cleanup(remove_unused_graph_inputs=False)
    folded = gs.export_onnx(graph, do_type_check=False)
    copy_model_fields(folded, model)
    return folded


def copy_model_fields(target: onnx.ModelProto, source: onnx.ModelProto) -> None:
    """Model-level fields (IR, opsets, producer, metadata, local functions) of ``source``."""
    target.ir_version = source.ir_version
    del target.opset_import[:]
    target.opset_import.extend(source.opset_import)
    for field_name in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(target, field_name, getattr(source, field_name))
    del target.metadata_props[:]
    target.metadata_props.extend(source.metadata_props)
    del target.functions[:]
    target.functions.extend(source.functions)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _all_value_infos(graph: onnx.GraphProto) -> Iterable[onnx.ValueInfoProto]:
    yield from graph.input
    yield from graph.output
    yield from graph.value_info


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


# --------------------------------------------------------------------------------------
# Graph facts
# --------------------------------------------------------------------------------------
@dataclass
class GraphIndex:
    """Producers, consumers, constants and value infos of one graph, built in one pass."""

    graph: onnx.GraphProto
    producer: dict[str, int] = field(default_factory=dict)
    consumers: dict[str, list[int]] = field(default_factory=dict)
    initializers: dict[str, onnx.TensorProto] = field(default_factory=dict)
    value_infos: dict[str, onnx.ValueInfoProto] = field(default_factory=dict)
    graph_outputs: set[str] = field(default_factory=set)
    #: Per node: :func:`node_inputs` and the non-empty outputs, read once (protobuf field
    #: access and the subgraph scan are slow enough to matter at 20k nodes).
    inputs: list[list[str]] = field(default_factory=list)
    outputs: list[list[str]] = field(default_factory=list)
    _shapes: dict[str, list | None] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, graph: onnx.GraphProto) -> "GraphIndex":
        idx = cls(graph)
        idx.initializers = {t.name: t for t in graph.initializer}
        idx.value_infos = {v.name: v for v in _all_value_infos(graph)}
        idx.graph_outputs = {o.name for o in graph.output}
        for i, node in enumerate(graph.node):
            outputs = [n for n in node.output if n]
            inputs = node_inputs(node)
            idx.outputs.append(outputs)
            idx.inputs.append(inputs)
            for name in outputs:
                idx.producer[name] = i
            for name in inputs:
                idx.consumers.setdefault(name, []).append(i)
        return idx

    def is_constant(self, name: str) -> bool:
        return name in self.initializers

    def constant(self, name: str) -> np.ndarray | None:
        tensor = self.initializers.get(name)
        return None if tensor is None else tensor_array(tensor)

    def elem_type(self, name: str) -> int:
        if name in self.initializers:
            return self.initializers[name].data_type
        vi = self.value_infos.get(name)
        return vi.type.tensor_type.elem_type if vi is not None else 0

    def shape(self, name: str) -> list[int | str | None] | None:
        """Dims (int, symbolic name, or None for unknown), None when the rank is unknown."""
        if name not in self._shapes:  # analysis asks for each tensor several times
            self._shapes[name] = self._read_shape(name)
        dims = self._shapes[name]
        return None if dims is None else list(dims)

    def _read_shape(self, name: str) -> list[int | str | None] | None:
        if name in self.initializers:
            return list(self.initializers[name].dims)
        vi = self.value_infos.get(name)
        if vi is None or not vi.type.tensor_type.HasField("shape"):
            return None
        return [_dim(d) for d in vi.type.tensor_type.shape.dim]

    def static_shape(self, name: str, default: int = 1) -> list[int] | None:
        """Shape with symbolic/unknown dims replaced by ``default`` (analysis assumes batch 1)."""
        dims = self.shape(name)
        if dims is None:
            return None
        return [d if isinstance(d, int) and d > 0 else default for d in dims]


def _dim(d: onnx.TensorShapeProto.Dimension) -> int | str | None:
    if d.HasField("dim_value"):
        return d.dim_value
    if d.HasField("dim_param"):
        return d.dim_param
    return None


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """Explicit inputs plus the outer-scope names its subgraphs read (If/Loop/Scan bodies)."""
    names = [n for n in node.input if n]
    if node.op_type not in _SUBGRAPH_OPS and node.domain in ("", "ai.onnx"):
        return names  # skips reading every attribute of every plain node
    for attr in node.attribute:
        for sub in _subgraphs(attr):
            names.extend(n for n in outer_scope_names(sub) if n not in names)
    return names


#: Standard ops with GRAPH attributes; other domains are scanned (a custom op may have one).
_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def outer_scope_names(graph: onnx.GraphProto) -> list[str]:
    """Names a subgraph uses but does not define itself (its implicit inputs)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: list[str] = []
    for node in graph.node:
        for name in node_inputs(node):
            if name not in defined and name not in used:
                used.append(name)
        defined.update(node.output)
    used.extend(o.name for o in graph.output if o.name not in defined and o.name not in used)
    return used


def _subgraphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attr.type == onnx.AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == onnx.AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


def topological_order(graph: onnx.GraphProto, prefer: Callable[[int], bool],
                      index: GraphIndex | None = None) -> list[int]:
    """A topological order of the node indices that keeps ``prefer``-ed nodes in long runs.

    Kahn's algorithm with two ready queues: while the current run is of preferred nodes it
    keeps taking ready preferred nodes, so host nodes gather between runs instead of
    splitting them. Ties keep the file's order. Raises OnnxMluError on a cycle or on a
    node input that nothing produces.
    """
    idx = index if index is not None else GraphIndex.build(graph)
    known = set(idx.initializers) | {i.name for i in graph.input}
    indegree = [0] * len(graph.node)
    for i, inputs in enumerate(idx.inputs):
        for name in set(inputs):
            if name in idx.producer:
                indegree[i] += 1
            elif name not in known:
                node = graph.node[i]
                raise OnnxMluError(f"node {node.name or node.op_type!r} reads tensor {name!r}, "
                                   "which no node, input or initializer provides")
    ready: tuple[list[int], list[int]] = ([], [])  # (preferred, others)
    for i, deg in enumerate(indegree):
        if deg == 0:
            heapq.heappush(ready[0 if prefer(i) else 1], i)
    order: list[int] = []
    in_preferred_run = True
    while ready[0] or ready[1]:
        queue = ready[0] if (ready[0] and (in_preferred_run or not ready[1])) else ready[1]
        i = heapq.heappop(queue)
        in_preferred_run = queue is ready[0]
        order.append(i)
        for name in set(idx.outputs[i]):
            for c in set(idx.consumers.get(name, ())):
                indegree[c] -= 1
                if indegree[c] == 0:
                    heapq.heappush(ready[0 if prefer(c) else 1], c)
    if len(order) != len(graph.node):
        stuck = [graph.node[i].name or graph.node[i].op_type for i, d in enumerate(indegree) if d > 0]
        raise OnnxMluError(f"graph has a cycle through node(s) {', '.join(stuck[:5])}")
    return order


def tensor_nbytes(elem_type: int, dims: Sequence[int]) -> int:
    return math.prod(int(d) for d in dims) * (itemsize(elem_type) if elem_type else 4)
