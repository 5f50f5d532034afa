"""Constant folding that is exact, bounded and checked.

Three folders take turns (see :func:`onnxmlu.frontend.normalize.normalize`):

* :func:`fold_shape_ops` replaces ``Shape`` and ``Size`` nodes whose result the model's fixed
  dims decide by ``Constant`` nodes (a symbolic dim is never folded: input-shape pins only
  choose the planner's pricing shape). ``Shape`` honours ``start``/``end`` (opset 15): the result is
  ``dims[start:end]`` with negative bounds counted from the rank and both clamped to
  ``[0, rank]``, exactly as onnxruntime computes it.
* :func:`flatten_constant_ifs` replaces an ``If`` whose condition is a constant by the branch
  it takes (``Identity`` nodes carry the branch outputs to the ``If``'s names), so the
  shapes inside the branch reach the rest of the graph.
* :func:`fold_constant_nodes` evaluates every node whose inputs are all constants with
  onnxruntime (onnx-graphsurgeon's folder), in every subgraph. It never writes a constant
  much larger than what it is computed from: a node whose result would exceed
  ``max(FOLD_FREE_BYTES, FOLD_GROWTH x the constant inputs it frees)`` (a ``ConstantOfShape``,
  ``Expand``, ``Tile`` or ``Range`` broadcast; a ``Cast`` of large int8 weights; a
  ``Transpose`` of a weight another node reads too -- a tied embedding's LM head, whose folded
  result would be a second copy next to the embedding the ``Gather`` keeps) is left to
  run at inference time, as onnxsim and onnxslim bound folding, so a fused file stays about
  the size of the original. ``QuantizeLinear``, ``DequantizeLinear`` and
  ``DynamicQuantizeLinear`` are never folded, whatever their size: a model that arrives
  quantized keeps its INT8 weights, scales and zero points exactly as stored, and analysis
  carries a weight's ``DequantizeLinear`` into the block that reads it
  (:mod:`onnxmlu.analyze.quantized`). (graphsurgeon's folder skips them too; the bound says
  so itself rather than rely on it.)

Every result is checked: a folded model in which some node reads a name that no enclosing
scope defines is dropped and the unfolded model kept (graphsurgeon's own ``If`` flattening
left nested consumers of a flattened output behind, so it is not used). Each outcome is a
:class:`~onnxmlu.diagnostics.Diagnostic`, never an exception.
"""

from __future__ import annotations

import math
import re
from typing import Callable, Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx_graphsurgeon.logger import G_LOGGER
import onnx_graphsurgeon as gs

from onnxmlu.diagnostics import Diagnostic
from onnxmlu.sessions import new_options
from onnxmlu.errors import first_line
from onnxmlu.ir import copy_model, copy_model_fields, graphs_by_branch, is_default_domain, iter_graphs, node_inputs
from onnxmlu.ir import nested_graphs, node_subgraphs, subgraph, unresolved_names
from onnxmlu.ir.graphsurgeon import bind_stored, hoist_copied_initializers
from onnxmlu.ir.weights import WeightStore, skeleton
from onnxmlu import ortlog
from onnxmlu.optional import optional_import

#: Folding may write a constant up to this size, or up to FOLD_GROWTH times its inputs.
FOLD_FREE_BYTES = 1 << 16
FOLD_GROWTH = 1.5
_BROADCAST_OPS = frozenset({"ConstantOfShape", "Expand", "Tile", "Range"})
#: Never folded: they hold a quantized model's own parameters (see the module docstring).
_QUANTIZATION_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


# ------------------------------------------------------------------------- Shape and Size
def fold_shape_ops(model: onnx.ModelProto, frozen: frozenset[str] = frozenset()) -> int:
    """Replace ``Shape``/``Size`` nodes whose result the model's own fixed dims decide by
    ``Constant`` nodes (outside the ``frozen`` main-graph branches, see :func:`invalid_branch`);
    the count. A ``Shape`` slice (``start``/``end``) of fixed dims folds even when other dims of
    its input are symbolic; nothing that reads a symbolic dim folds."""
    graphs = [g for g in _thawed_graphs(model, frozen) if any(n.op_type in ("Shape", "Size") for n in g.node)]
    dims = _known_dims(model) if graphs else {}
    count = 0
    for graph in graphs:
        for node in graph.node:
            if node.op_type not in ("Shape", "Size") or not is_default_domain(node.domain):
                continue
            shape = dims.get(node.input[0]) if node.input else None
            value = _shape_op_value(node, shape) if shape is not None else None
            if value is not None:
                _become_constant(node, value)
                count += 1
    return count


def _known_dims(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Names (all scopes: ONNX names are unique across them) of known rank -> their dims, a
    number where the model fixes it, else None."""
    known: dict[str, list[int | None]] = {}
    for graph in iter_graphs(model.graph):
        for vi in (*graph.input, *graph.value_info, *graph.output):
            tt = vi.type.tensor_type
            if vi.type.HasField("tensor_type") and tt.HasField("shape"):
                known[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        known.update((t.name, list(t.dims)) for t in graph.initializer)
    return known


def _shape_op_value(node: onnx.NodeProto, shape: list[int | None]) -> np.ndarray | None:
    """The value of ``node`` (Shape or Size) on an input of dims ``shape``; None when it reads
    a dim that is not fixed."""
    if node.op_type == "Size":
        return None if None in shape else np.array(math.prod(shape), dtype=np.int64)
    attrs = {a.name: a.i for a in node.attribute}
    rank = len(shape)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    picked = shape[start:end]
    return None if None in picked else np.array(picked, dtype=np.int64)


def _become_constant(node: onnx.NodeProto, value: np.ndarray) -> None:
    node.op_type, node.domain = "Constant", ""
    del node.input[:]
    del node.attribute[:]
    node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value)))


# ------------------------------------------------------------------------- If with a constant condition
def flatten_constant_ifs(model: onnx.ModelProto, frozen: frozenset[str] = frozenset()) -> int:
    """Replace every ``If`` whose condition is a constant by the nodes of the branch it takes,
    then ``Identity`` nodes from the branch's outputs to the ``If``'s; the count.

    Names are unique across all scopes in ONNX, so the branch's nodes and initializers can
    move into the enclosing graph unchanged; its outer-scope reads resolve there as before.
    """
    graphs = [g for g in _thawed_graphs(model, frozen) if any(n.op_type == "If" for n in g.node)]
    constants = _scalar_constants(model) if graphs else {}
    count = 0
    for graph in graphs:  # branches moved up are visited next round
        nodes: list[onnx.NodeProto] = []
        for node in graph.node:
            taken = _taken_branch(node, constants)
            if taken is None:
                nodes.append(node)
                continue
            nodes.extend(taken.node)
            graph.initializer.extend(taken.initializer)
            nodes.extend(helper.make_node("Identity", [b.name], [o], name=f"{o}/taken")
                         for b, o in zip(taken.output, node.output) if o)
        if len(nodes) != len(graph.node) or any(a is not b for a, b in zip(nodes, graph.node)):
            count += 1
            del graph.node[:]
            graph.node.extend(nodes)
    return count


def _thawed_graphs(model: onnx.ModelProto, frozen: frozenset[str]) -> Iterator[onnx.GraphProto]:
    return (g for key, g in graphs_by_branch(model.graph) if key not in frozen)


def invalid_branch(model: onnx.ModelProto) -> str | None:
    """The main-graph branch (a :func:`~onnxmlu.ir.graphs_by_branch` key) holding a node for
    which onnxruntime refuses the model, ``""`` for the main graph, None when it loads.

    Pinned shapes specialize every branch, also one the pins never take: silero's 8 kHz branch
    fed a 16 kHz chunk folds into an LSTM of rank-5 input, and onnxruntime type-checks every
    branch when it loads the model. Such a branch is kept as exported
    (:func:`onnxmlu.frontend.normalize.normalize`). The check loads the weight-free skeleton."""
    ort = optional_import("onnxruntime")

    options = new_options("disable", log_severity=4)
    try:
        ort.InferenceSession(skeleton(model).SerializeToString(), options, providers=["CPUExecutionProvider"])
        return None
    except Exception as exc:  # noqa: BLE001 - onnxruntime reports every refusal as Fail/InvalidGraph
        names = re.findall(r"Node \(([^)]*)\)", str(exc))
    name = names[-1] if names else None  # the innermost node of a nested report
    return next((key for key, g in graphs_by_branch(model.graph) if any(n.name == name for n in g.node)), "")


def _scalar_constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Small constants of every scope: initializers and ``Constant`` node values."""
    found: dict[str, np.ndarray] = {}
    for graph in iter_graphs(model.graph):
        found.update((t.name, numpy_helper.to_array(t)) for t in graph.initializer if math.prod(t.dims) == 1)
        for node in graph.node:
            if node.op_type == "Constant" and is_default_domain(node.domain) and node.attribute:
                attr = node.attribute[0]
                if attr.name == "value" and math.prod(attr.t.dims) == 1:
                    found[node.output[0]] = numpy_helper.to_array(attr.t)
    return found


def _taken_branch(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> onnx.GraphProto | None:
    if node.op_type != "If" or not is_default_domain(node.domain) or node.input[0] not in constants:
        return None
    branch = "then_branch" if bool(constants[node.input[0]].reshape(-1)[0]) else "else_branch"
    return subgraph(node, branch)


# ------------------------------------------------------------------------- all-constant nodes
def fold_constant_nodes(model: onnx.ModelProto, note: Callable[[Diagnostic], None],
                        weights: WeightStore | None = None) -> onnx.ModelProto:
    """graphsurgeon's folder over ``model`` (a new model), checked; ``model`` itself when the
    result is unsound or the folder fails (``note`` is told why). ``weights``: the store whose
    markers ``model`` holds; those a node the folder may evaluate reads are filled in first
    (onnxruntime evaluates those nodes; graphsurgeon, given a partition it cannot load, retries
    it until Python's recursion limit), the others stay markers."""
    if weights is not None:
        weights.fill_markers(model.graph, folded_inputs(model))
    try:
        folded = _graphsurgeon_fold(model, weights)
    except Exception as exc:  # noqa: BLE001 - folding is an optimization; the model stays valid
        note(Diagnostic("normalize", "fold-failed", "", f"constant folding failed ({first_line(exc)}); "
                        "the model is planned unfolded"))
        return model
    problems = unresolved_names(folded.graph)
    if problems:
        note(Diagnostic("normalize", "fold-unsound", "", f"constant folding left {_problems_text(problems)}; "
                        "the model is planned unfolded"))
        return model
    return folded


def _problems_text(problems: list[str]) -> str:
    more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
    return "unresolved names " + ", ".join(problems[:3]) + more


def folded_inputs(model: onnx.ModelProto) -> set[str]:
    """The names graphsurgeon's folder may hand onnxruntime: every input of a node whose inputs
    (its subgraphs' outer names included) are all constants -- initializers that are not graph
    inputs, and the outputs of such nodes -- in graph order, in every scope."""
    graphs = list(iter_graphs(model.graph))
    constant = {t.name for g in graphs for t in g.initializer} - {i.name for g in graphs for i in g.input}
    read: set[str] = set()
    for graph in graphs:
        for node in graph.node:
            inputs = node_inputs(node)
            if all(name in constant for name in inputs):
                read.update(inputs)
                constant.update(o for o in node.output if o)
    return read


def _graphsurgeon_fold(model: onnx.ModelProto, weights: WeightStore | None) -> onnx.ModelProto:
    """The folder's result as a new model; the markers of ``weights`` left in ``model`` read
    from the store if the folder asks for a value, and are exported as they are, never copied."""
    G_LOGGER.severity = G_LOGGER.ERROR  # nodes it cannot evaluate are expected and harmless
    if any(node_subgraphs(node) for node in model.graph.node):
        model = copy_model(model)  # the folder writes into the subgraph protos it imported
    graph = gs.import_onnx(model)
    if weights is not None:
        bind_stored(graph, weights)
    with ortlog.at_least(3):  # its optimizer's notes about the folded pieces
        _fold_scopes(graph)
    graph.cleanup(remove_unused_graph_inputs=False)
    folded = gs.export_onnx(graph, do_type_check=False)
    copy_model_fields(folded, model)
    hoist_copied_initializers(folded.graph, model.graph)  # graphsurgeon copies them into each subgraph
    if weights is not None:  # a subgraph's own markers: only the main graph's are read through the store
        for sub in nested_graphs(folded.graph):
            weights.fill_markers(sub)
    return folded


def _fold_scopes(graph: gs.Graph, top: bool = True) -> None:
    """graphsurgeon's folder over ``graph``, then over each of its subgraphs the same way: its own
    recursion into subgraphs does not pass ``should_exclude_node`` on, so an ``If`` branch was
    folded without the bound (a tied LM head's ``Transpose`` of an outer-scope embedding
    written as a second copy of it)."""
    graph.fold_constants(fold_shapes=False, partitioning="basic", flatten_subgraphs=False, recurse_subgraphs=False,
                         should_exclude_node=_grows_the_model, recurse_functions=top)
    for sub in graph.subgraphs():
        _fold_scopes(sub, False)


def _grows_the_model(node) -> bool:
    """Whether folding graphsurgeon node ``node`` would write a constant much larger than the
    constant inputs it frees (:func:`_freed_bytes`): a broadcast (``ConstantOfShape``,
    ``Expand``, ``Tile``, ``Range``), an up-cast of stored weights (``Cast`` of int8 weights is
    4x), a transform of a weight that a node which stays reads too -- or a quantization node,
    which is never folded."""
    if node.op in _QUANTIZATION_OPS:
        return True

    values = [t.values if isinstance(t, gs.Constant) else None for t in node.inputs if not t.is_empty()]
    if any(v is None for v in values):
        return False  # not foldable anyway
    out_bytes = _output_bytes(node, values)
    if out_bytes is None or out_bytes <= FOLD_FREE_BYTES:
        return False
    return out_bytes > FOLD_GROWTH * _freed_bytes(node)


def _freed_bytes(node) -> int:
    """The bytes of ``node``'s constant inputs that folding frees: those whose every other reader
    is folded too (:func:`_folds`; the gate Slices of an LSTM weight). A weight that a node which
    stays reads too (a tied embedding: its ``Gather`` of the token ids next to the LM head's
    ``Transpose``) is not freed: the folded result would be a second copy of it."""
    constants = {id(t): t for t in node.inputs if isinstance(t, gs.Constant)}.values()
    return sum(int(np.asarray(t.values).nbytes) for t in constants
               if all(reader is node or _folds(reader) for reader in t.outputs))


def _folds(node) -> bool:
    """Whether every input of ``node`` is a constant or computed from constants only (no graph
    input, no node holding a subgraph on the way): the folder evaluates it."""
    stack, seen = list(node.inputs), set()
    while stack:
        tensor = stack.pop()
        if id(tensor) in seen or isinstance(tensor, gs.Constant) or tensor.is_empty():
            continue
        seen.add(id(tensor))
        if not tensor.inputs:
            return False  # a graph input (or a name of an enclosing scope's input)
        producer = tensor.inputs[0]
        if any(isinstance(value, gs.Graph) for value in producer.attrs.values()):
            return False
        stack.extend(producer.inputs)
    return True


def _output_bytes(node, values: list) -> int | None:
    """The bytes ``node``'s outputs will take: from the constant inputs for a broadcast, else
    from the inferred output types (None when they are unknown)."""
    if node.op in _BROADCAST_OPS:
        itemsize = 8 if node.op == "Range" else _out_itemsize(node, values)
        return _broadcast_elements(node.op, values) * itemsize
    total = 0
    for out in node.outputs:
        shape, dtype = out.shape, out.dtype
        if shape is None or dtype is None or not all(isinstance(d, int) for d in shape):
            return None
        total += math.prod(shape) * np.dtype(dtype).itemsize
    return total


def _broadcast_elements(op: str, values: list) -> int:
    if op == "ConstantOfShape":
        return math.prod(int(d) for d in np.asarray(values[0]).reshape(-1))
    if op == "Expand":
        data, shape = np.asarray(values[0]), [int(d) for d in np.asarray(values[1]).reshape(-1)]
        return math.prod(np.broadcast_shapes(data.shape, tuple(shape)))
    if op == "Tile":
        return np.asarray(values[0]).size * math.prod(int(r) for r in np.asarray(values[1]).reshape(-1))
    start, limit, delta = (float(np.asarray(v).reshape(-1)[0]) for v in values[:3])
    return max(math.ceil((limit - start) / delta), 0) if delta else 0


def _out_itemsize(node, values: list) -> int:
    if node.op == "ConstantOfShape":
        value = node.attrs.get("value")
        return int(np.asarray(value.values).itemsize) if value is not None else 4
    return int(np.asarray(values[0]).itemsize)

