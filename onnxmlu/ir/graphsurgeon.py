"""Model <-> graphsurgeon plumbing for the rewriters: shape inference, import, export; the one
module that touches onnx-graphsurgeon's internals (``_values``, ``LazyValues``,
``SparseValues``, ``OnnxExporter``), so a new graphsurgeon version is checked here.

Shape inference runs on a *skeleton* of the model: large main-graph initializers (weights) are
declared as typed graph inputs instead of carrying their data, so a 500 MB model does not get
serialized into the inference engine (shape tensors are small and keep their values, so data
propagation still sees them). The inferred types and shapes are then set on the imported
graphsurgeon tensors, and, after the rewrite, on the exported model's ``value_info``.

Export takes the graph graphsurgeon produced and the model-level fields of the original
(opset imports, IR version, producer, metadata, local functions), without copying the original
weights. Three graphsurgeon round-trip artefacts are undone:

* graph inputs that also have an initializer (IR < 4 style) are dropped by graphsurgeon: they
  are listed again;
* outer-scope initializers used in subgraphs get copied into each subgraph: they move back;
* IR < 4 requires every initializer to be a graph input: new main-graph initializers are
  listed as inputs, new subgraph initializers move to the main graph (a Loop/Scan body's inputs
  are fixed by its parent op).

Weights held by a :class:`~onnxmlu.ir.weights.WeightStore` stay markers in the graphsurgeon
graph too: :func:`import_graph` binds each marker constant to the store
(:class:`StoredValues`), and :func:`stored_constant` makes a new one, so a rewrite reads them
with :func:`constant_array` and the export writes the markers back untouched.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx.checker import ValidationError
from onnx.shape_inference import InferenceError
from onnx_graphsurgeon.ir.tensor import LazyValues
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter as Exporter
from onnx_graphsurgeon.ir.tensor import SparseValues

from onnxmlu.ir.graphs import iter_graphs, merge_value_infos, node_subgraphs, sort_graphs
from onnxmlu.ir.weights import WeightStore, copy_field, is_marker, skeleton

_GRAPH_DATA = ("node", "initializer", "sparse_initializer", "value_info", "input", "output")


# -------------------------------------------------------------------------------- inference


def inferred_graphs(model: onnx.ModelProto) -> list[onnx.GraphProto] | None:
    """Shape-inferred copies of the model's graphs (main graph first, then every subgraph in
    :func:`iter_graphs` order), or ``None`` when inference fails."""
    skel = skeleton(model)
    for data_prop in (True, False):
        try:
            inferred = onnx.shape_inference.infer_shapes(skel, data_prop=data_prop)
        except (InferenceError, ValidationError, RuntimeError):  # an aid: a rewriter that needs a
            continue  # shape inference did not give refuses the node, and says so
        return list(iter_graphs(inferred.graph))
    return None


def _type_map(graph: onnx.GraphProto) -> dict[str, tuple[Any, list | None]]:
    found = {}
    for vi in [*graph.value_info, *graph.output, *graph.input]:
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None or not tt.elem_type:
            continue
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except (KeyError, TypeError, ValueError):
            continue
        shape = None
        if tt.HasField("shape"):
            shape = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tt.shape.dim
            ]
        found[vi.name] = (dtype, shape)
    return found


# -------------------------------------------------------------------------------- walking


def gs_subgraphs(node: gs.Node) -> list[gs.Graph]:
    """The subgraphs of a graphsurgeon node (``onnxmlu.ir`` walks ``onnx`` protos)."""
    found: list[gs.Graph] = []
    for value in node.attrs.values():
        if isinstance(value, gs.Graph):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, gs.Graph))
    return found


def gs_graphs(graph: gs.Graph):
    """``graph`` and every graphsurgeon graph nested in it."""
    yield graph
    for node in graph.nodes:
        for sub in gs_subgraphs(node):
            yield from gs_graphs(sub)


# -------------------------------------------------------------------------------- stored weights


class StoredValues(LazyValues):
    """The values of a marker constant: read from its store, never from the (empty) tensor."""

    def __init__(self, marker: onnx.TensorProto, store: WeightStore) -> None:
        super().__init__(marker)
        self.store = store

    def load(self) -> np.ndarray:
        return self.store.array(self.tensor)


def stored_constant(name: str, array: np.ndarray, store: WeightStore) -> gs.Constant:
    """A constant whose value ``store`` holds: exported as a marker, never copied."""
    return gs.Constant(name, StoredValues(store.put(name, array), store))


def constant_array(tensor: gs.Constant) -> np.ndarray:
    """A constant's value; a stored weight is read from its store and the constant keeps its
    marker (exported as is, never copied)."""
    values = tensor._values
    if isinstance(values, StoredValues):
        return values.load()
    return np.asarray(tensor.values)


def bind_stored(graph: gs.Graph, store: WeightStore) -> None:
    """Every marker constant of ``graph`` (subgraphs included) reads from ``store``."""
    for g in gs_graphs(graph):
        for tensor in g.tensors().values():
            values = getattr(tensor, "_values", None)
            if type(values) is LazyValues and is_marker(values.tensor):
                tensor._values = StoredValues(values.tensor, store)


# -------------------------------------------------------------------------------- import


def import_graph(model: onnx.ModelProto, weights: WeightStore | None = None) -> gs.Graph:
    """graphsurgeon graph of ``model`` with inferred dtypes/shapes on its tensors; the markers
    of ``weights`` read from it."""
    graph = gs.import_onnx(model)
    if weights is not None:
        bind_stored(graph, weights)
    inferred = None if _fully_typed(model) else inferred_graphs(model)
    if inferred is None:
        return graph
    types: dict[str, tuple] = {}
    for g in inferred:
        types.update(_type_map(g))
    for g in gs_graphs(graph):
        for tensor in g.tensors().values():
            if isinstance(tensor, gs.Variable) and tensor.name in types:
                dtype, shape = types[tensor.name]
                tensor.dtype = tensor.dtype if tensor.dtype is not None else dtype
                tensor.shape = tensor.shape if tensor.shape is not None else shape
    return graph


def _fully_typed(model: onnx.ModelProto) -> bool:
    """Every node output of every graph has an element type and a shape (``normalize`` ran
    inference): graphsurgeon reads those value infos itself, so inferring again adds nothing."""
    for graph in iter_graphs(model.graph):
        typed = {v.name for v in (*graph.value_info, *graph.output)
                 if v.type.tensor_type.elem_type and v.type.tensor_type.HasField("shape")}
        if any(o and o not in typed for node in graph.node for o in node.output):
            return False
    return True


def _refresh_value_info(model: onnx.ModelProto) -> None:
    """Types for the tensors the rewrite created; what normalize learned beyond onnx's own
    inference (symbolic dims, probed shapes) is kept."""
    inferred = inferred_graphs(model)
    if inferred is None:
        return
    merge_value_infos(iter_graphs(model.graph), inferred)
    for graph in iter_graphs(model.graph):
        known = {i.name for i in graph.input} | {i.name for i in graph.initializer}
        kept = [v for v in graph.value_info if v.name not in known]
        del graph.value_info[:]
        graph.value_info.extend(kept)


# -------------------------------------------------------------------------------- export


def export_model(graph: gs.Graph, original: onnx.ModelProto) -> onnx.ModelProto:
    """The rewritten graph with the model-level fields of ``original``.

    The nodes are put in order by :func:`~onnxmlu.ir.sort_graphs` (Kahn's algorithm, a loop)
    after export, not by graphsurgeon's ``toposort``: that one recurses once per node along a
    dependency chain, and an unrolled reverse LSTM of a few hundred steps whose consumer is
    listed first goes past Python's recursion limit."""
    graph.cleanup()
    model = onnx.ModelProto()
    _export_graph_into(model.graph, graph)
    sort_graphs(model.graph)
    for fd, value in original.ListFields():
        if fd.name != "graph":
            copy_field(model, fd, value)
    for fd, value in original.graph.ListFields():
        if fd.name not in _GRAPH_DATA:
            copy_field(model.graph, fd, value)
    scopes = _initializer_scopes(original.graph)
    _restore_overridable_inputs(model.graph, original.graph)
    _hoist_initializers(model.graph, scopes, [])
    if model.ir_version < 4:
        _ir3_initializers(model.graph, scopes)
    _refresh_value_info(model)
    return model


def _export_graph_into(target: onnx.GraphProto, graph: gs.Graph) -> None:
    """graphsurgeon's ``export_graph``, writing into ``target``: its ``make_graph`` and then
    ``make_model`` copy every weight twice (0.7 s of ResNet-50's 1.6 s fuse); this copies once.
    Subgraphs still go through graphsurgeon's own exporter (inside ``export_node``)."""
    tensors = graph.tensors()
    constants = [t for t in tensors.values() if isinstance(t, gs.Constant)]
    boundary = {t.name for t in [*graph.inputs, *graph.outputs]}
    target.node.extend(Exporter.export_node(node) for node in graph.nodes)
    target.input.extend(Exporter.export_value_info_proto(t, False) for t in graph.inputs)
    target.output.extend(Exporter.export_value_info_proto(t, False) for t in graph.outputs)
    target.initializer.extend(Exporter.export_tensor_proto(t) for t in constants
                              if not isinstance(t._values, SparseValues))
    target.sparse_initializer.extend(Exporter.export_sparse_tensor_proto(t) for t in constants
                                     if isinstance(t._values, SparseValues))
    target.value_info.extend(
        Exporter.export_value_info_proto(t, False) for name, t in tensors.items()
        if name not in boundary and isinstance(t, gs.Variable) and (t.dtype is not None or t.shape is not None))
    target.name = graph.name
    if graph.doc_string:
        target.doc_string = graph.doc_string


def hoist_copied_initializers(graph: onnx.GraphProto, original: onnx.GraphProto) -> None:
    """Move the outer-scope initializers graphsurgeon copied into ``graph``'s subgraphs back to
    the graph that held them in ``original`` (each once): a weight both branches of an ``If``
    read is one tensor, not a copy per branch."""
    _hoist_initializers(graph, _initializer_scopes(original), [])


def _initializer_scopes(graph: onnx.GraphProto, depth: int = 0, out=None) -> dict[str, int]:
    """Name -> nesting depth of the graph that held each initializer in the original model."""
    out = {} if out is None else out
    for init in graph.initializer:
        out.setdefault(init.name, depth)
    for node in graph.node:
        for sub in node_subgraphs(node):
            _initializer_scopes(sub, depth + 1, out)
    return out


def _hoist_initializers(graph: onnx.GraphProto, scopes: dict[str, int], stack: list) -> None:
    """Move outer-scope initializers that graphsurgeon copied into subgraphs back home (once)."""
    depth = len(stack)
    stack.append(graph)
    for node in graph.node:
        for sub in node_subgraphs(node):
            _hoist_initializers(sub, scopes, stack)
    if depth:
        keep = []
        for init in graph.initializer:
            home = scopes.get(init.name)
            if home is None or home >= depth:
                keep.append(init)
                continue
            target = stack[home]
            if all(t.name != init.name for t in target.initializer):
                target.initializer.append(init)
        del graph.initializer[:]
        graph.initializer.extend(keep)
    stack.pop()


def _ir3_initializers(graph: onnx.GraphProto, original: dict[str, int]) -> None:
    """IR < 4: every initializer is an input of its graph (see the module docstring)."""
    for sub in list(iter_graphs(graph))[1:]:
        fresh = [i for i in sub.initializer if i.name not in original]
        kept = [i for i in sub.initializer if i.name in original]
        del sub.initializer[:]
        sub.initializer.extend(kept)
        graph.initializer.extend(fresh)
    listed = {i.name for i in graph.input}
    for init in graph.initializer:
        if init.name not in listed:
            graph.input.append(
                onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )


def _restore_overridable_inputs(graph: onnx.GraphProto, original: onnx.GraphProto) -> None:
    """Keep graph inputs that also have an initializer (IR < 4 style); graphsurgeon drops them."""
    present = {i.name for i in graph.input}
    inits = {i.name for i in graph.initializer}
    wanted = [i for i in original.input if i.name in present or i.name in inits]
    if [i.name for i in wanted] == [i.name for i in graph.input]:
        return
    by_name = {i.name: i for i in graph.input}
    rebuilt = [by_name.get(i.name, i) for i in wanted]
    del graph.input[:]
    graph.input.extend(rebuilt)
