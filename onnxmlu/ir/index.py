"""Graph facts every later stage needs: one pass over a graph answers producer, consumer,
constant, type and shape questions in O(1) (:class:`GraphIndex`), and one topological sort
keeps accelerator nodes in long runs (:func:`topological_order`).

Constants held by a :class:`~onnxmlu.ir.weights.WeightStore` (markers) are read through the
store the index is built with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import onnx

from onnxmlu.errors import OnnxMluError
from onnxmlu.ir.graphs import kahn_order, node_inputs
from onnxmlu.ir.weights import WeightStore, itemsize, tensor_array


def _all_value_infos(graph: onnx.GraphProto) -> Iterable[onnx.ValueInfoProto]:
    yield from graph.input
    yield from graph.output
    yield from graph.value_info


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
    #: Holds the data of the graph's marker initializers (see :mod:`onnxmlu.ir.weights`).
    weights: WeightStore | None = None
    #: Concrete dims at the pricing shape (:func:`onnxmlu.frontend.shapes.priced_shapes`): the
    #: graph keeps its symbolic dims, the planner prices these.
    sizes: dict[str, tuple[int, list[int]]] = field(default_factory=dict)
    #: What a host reason for a tensor inference could not size advises (the analysis decides:
    #: ``--input-shape`` only where a symbolic dim took a default, so that a pin can change it).
    sizing_hint: str = "try --input-shape"
    _shapes: dict[str, list | None] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, graph: onnx.GraphProto, weights: WeightStore | None = None,
              sizes: dict[str, tuple[int, list[int]]] | None = None) -> "GraphIndex":
        idx = cls(graph, weights=weights, sizes=dict(sizes or {}))
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
        return None if tensor is None else tensor_array(tensor, self.weights)

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

    def concrete_shape(self, name: str) -> list[int] | None:
        """The dims at the pricing shape (``sizes``), else the declared dims when all are
        sizes; None when neither says."""
        if name in self.sizes:
            return list(self.sizes[name][1])
        dims = self.shape(name)
        if dims is None or not all(isinstance(d, int) and d >= 0 for d in dims):
            return None
        return dims

    def static_shape(self, name: str, default: int = 1) -> list[int] | None:
        """The dims at the pricing shape, with any dim still unknown replaced by ``default``."""
        concrete = self.concrete_shape(name)
        if concrete is not None:
            return concrete
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


def topological_order(graph: onnx.GraphProto, prefer: Callable[[int], bool],
                      index: GraphIndex | None = None, early: Callable[[int], bool] | None = None) -> list[int]:
    """A topological order of the node indices that keeps ``prefer``-ed nodes in long runs
    (``early`` nodes first: see :func:`~onnxmlu.ir.graphs.kahn_order`).

    :func:`~onnxmlu.ir.graphs.kahn_order` (the one topological sort, also behind
    :func:`~onnxmlu.ir.sort_graphs`): host nodes gather between runs of accelerator nodes
    instead of splitting them; ties keep the file's order. Raises OnnxMluError on a cycle or
    on a node input that nothing produces.
    """
    idx = index if index is not None else GraphIndex.build(graph)
    known = set(idx.initializers) | {i.name for i in graph.input}
    deps: list[list[int]] = []
    for i, inputs in enumerate(idx.inputs):
        deps.append([idx.producer[name] for name in set(inputs) if name in idx.producer])
        unknown = next((name for name in inputs if name not in idx.producer and name not in known), None)
        if unknown is not None:
            node = graph.node[i]
            raise OnnxMluError(f"node {node.name or node.op_type!r} reads tensor {unknown!r}, "
                               "which no node, input or initializer provides")
    order = kahn_order(deps, prefer, early)
    if len(order) != len(graph.node):
        placed = set(order)
        stuck = [graph.node[i].name or graph.node[i].op_type for i in range(len(graph.node)) if i not in placed]
        raise OnnxMluError(f"graph has a cycle through node(s) {', '.join(stuck[:5])}")
    return order


def tensor_nbytes(elem_type: int, dims: Sequence[int]) -> int:
    return math.prod(int(d) for d in dims) * (itemsize(elem_type) if elem_type else 4)
