"""Reading a graphsurgeon graph for a rewrite: fresh names, compile-time constants, the facts
of a tensor (dtype, shape, absent inputs).

Below :mod:`onnxmlu.rewrite.builder` (which makes nodes with them) and
:mod:`onnxmlu.rewrite.base` (the driver, which hands rewriters a builder and re-exports these),
so the two import each other's layer in one direction only.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxmlu.ir import is_default_domain, iter_graphs
from onnxmlu.ir.graphsurgeon import constant_array


# --------------------------------------------------------------------------------------------
# Names


class NameAllocator:
    """Unique node and tensor names for the whole model (outer graph and every subgraph)."""

    def __init__(self, node_names: Iterable[str] = (), tensor_names: Iterable[str] = ()):
        self._nodes = set(node_names)
        self._tensors = set(tensor_names)

    @classmethod
    def from_model(cls, model: onnx.ModelProto) -> NameAllocator:
        nodes: set[str] = set()
        tensors: set[str] = set()
        for graph in iter_graphs(model.graph):
            tensors.update(t.name for t in graph.input)
            tensors.update(t.name for t in graph.output)
            tensors.update(t.name for t in graph.initializer)
            tensors.update(t.name for t in graph.value_info)
            for node in graph.node:
                nodes.add(node.name)
                tensors.update(node.input)
                tensors.update(node.output)
        return cls(nodes, tensors)

    @staticmethod
    def _fresh(taken: set[str], base: str) -> str:
        name, i = base, 1
        while name in taken:
            name = f"{base}_{i}"
            i += 1
        taken.add(name)
        return name

    def node(self, base: str) -> str:
        return self._fresh(self._nodes, base)

    def tensor(self, base: str) -> str:
        return self._fresh(self._tensors, base)


# --------------------------------------------------------------------------------------------
# Constants


def _constant_node_value(node: gs.Node) -> np.ndarray | None:
    attrs = node.attrs
    if "value" in attrs and isinstance(attrs["value"], gs.Constant):
        return constant_array(attrs["value"])
    scalar_kinds = {
        "value_float": np.float32,
        "value_floats": np.float32,
        "value_int": np.int64,
        "value_ints": np.int64,
    }
    for key, dtype in scalar_kinds.items():
        if key in attrs:
            return np.asarray(attrs[key], dtype=dtype)
    return None


def constant_value(tensor: gs.Tensor | None) -> np.ndarray | None:
    """The value of ``tensor`` if it is fixed at compile time, else ``None``.

    Sees through ``Constant`` nodes and chains of ``Identity`` nodes (the usual exporter noise
    in front of weights). Graph inputs are never constant, even when an initializer of the same
    name exists (IR < 4 "overridable" defaults are handled at import, see ``_import``).
    """
    for _ in range(64):  # Identity chains are short; the bound only guards against cycles
        if tensor is None:
            return None
        if isinstance(tensor, gs.Constant):
            return constant_array(tensor)
        if len(tensor.inputs) != 1:
            return None
        producer = tensor.inputs[0]
        if not is_default_domain(producer.domain):
            return None
        if producer.op == "Constant":
            return _constant_node_value(producer)
        if producer.op != "Identity" or not producer.inputs:
            return None
        tensor = producer.inputs[0]
    return None


def is_absent(tensor: gs.Tensor | None) -> bool:
    """Optional input/output left out (missing or the empty name)."""
    return tensor is None or tensor.is_empty()


def node_input(node: gs.Node, index: int) -> gs.Tensor | None:
    """The ``index``-th input, or ``None`` when it is omitted or empty."""
    if index >= len(node.inputs) or is_absent(node.inputs[index]):
        return None
    return node.inputs[index]


def node_output(node: gs.Node, index: int) -> gs.Variable | None:
    if index >= len(node.outputs) or is_absent(node.outputs[index]):
        return None
    return node.outputs[index]


def tensor_dtype(tensor: gs.Tensor | None) -> np.dtype | None:
    if tensor is None:
        return None
    if isinstance(tensor, gs.Constant):
        return constant_array(tensor).dtype
    try:
        return np.dtype(tensor.dtype) if tensor.dtype is not None else None
    except TypeError:  # e.g. bfloat16, which numpy does not know
        return None


def tensor_shape(tensor: gs.Tensor | None) -> list[int | str | None] | None:
    if tensor is None:
        return None
    if isinstance(tensor, gs.Constant):
        return list(constant_array(tensor).shape)
    return None if tensor.shape is None else list(tensor.shape)


def static_dim(dim: Any) -> int | None:
    return int(dim) if isinstance(dim, (int, np.integer)) and int(dim) >= 0 else None
