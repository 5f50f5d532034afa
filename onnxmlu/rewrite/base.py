"""Rewriter protocol, registry, driver and the model-level plumbing shared by all rewriters.

A rewriter turns one ONNX node that the accelerator cannot run into accelerator primitives.
It has a ``name`` (the key users pass to ``only=``), the ``op_types`` it looks at, a
``check(node, ctx)`` that returns the reason it does *not* apply (``None`` when it does) and an
``apply(node, ctx)`` that replaces exactly that node. :func:`run_rewriter` walks a graph and
its subgraphs (``If`` branches, ``Loop``/``Scan`` bodies), records each refusal as a
:class:`~onnxmlu.diagnostics.Diagnostic` and returns the count.

Graph edits go through onnx-graphsurgeon (import, inference and export live in
:mod:`onnxmlu.ir.graphsurgeon`).
New names are drawn from one allocator
that knows every node and tensor name of the model (subgraphs included), so they never collide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxmlu.diagnostics import Diagnostic
from onnxmlu.ir import is_default_domain, iter_graphs
from onnxmlu.ir.graphsurgeon import constant_array, gs_subgraphs
from onnxmlu.ir.weights import WeightStore

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


# --------------------------------------------------------------------------------------------
# Report


@dataclass
class RewriteReport:
    """What the rewriters did: counts per rewriter, and a :class:`Diagnostic` per node a
    rewriter refused (stage ``rewrite``, rule = the rewriter's name, message = the reason)."""

    applied: dict[str, int] = field(default_factory=dict)
    skipped: list[Diagnostic] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.applied.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "applied": dict(self.applied),
            "skipped": [{"rewriter": d.rule, "node": d.node, "reason": d.message} for d in self.skipped],
            "total": self.total,
        }


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


# --------------------------------------------------------------------------------------------
# Context, protocol, driver


@dataclass
class RewriteContext:
    """Where a rewriter works: the (sub)graph of the node, the model opset, the name allocator,
    and the store that holds the model's large weights (None: they are in the graph)."""

    graph: gs.Graph
    opset: int
    names: NameAllocator
    options: Mapping[str, Any] = field(default_factory=dict)
    caches: dict[int, dict] = field(default_factory=dict)
    weights: WeightStore | None = None

    def for_graph(self, graph: gs.Graph) -> RewriteContext:
        return RewriteContext(graph, self.opset, self.names, self.options, self.caches, self.weights)

    def is_used(self, tensor: gs.Tensor | None) -> bool:
        """Consumed by a node (subgraph nodes included) or a graph output of this graph."""
        return tensor is not None and (bool(tensor.outputs) or tensor in self.graph.outputs)

    def builder(self, node: gs.Node, dtype: np.dtype):
        from onnxmlu.rewrite.builder import Builder

        prefix = node.name or self.names.node(node.op.lower() if node.op else "node")
        cache = self.caches.setdefault(id(self.graph), {})
        return Builder(self.graph, self.opset, self.names, prefix, np.dtype(dtype), cache, self.weights)


def detach(node: gs.Node, graph: gs.Graph) -> list[gs.Tensor]:
    """Disconnect ``node`` (no inputs, no outputs); return its former outputs (now without
    producer). The husk leaves ``graph.nodes`` in :func:`drop_detached`, once per pass:
    finding each node in the list made rewriting 20k-node graphs quadratic."""
    outputs = list(node.outputs)
    node.inputs.clear()
    node.outputs.clear()
    return outputs


def drop_detached(graph: gs.Graph) -> None:
    """Remove the nodes :func:`detach` disconnected (a live node always has an output)."""
    graph.nodes[:] = [n for n in graph.nodes if n.outputs]


def node_label(node: gs.Node) -> str:
    if node.name:
        return node.name
    first = next((t.name for t in node.outputs if not t.is_empty()), "?")
    return f"{node.op}->{first}"


class Rewriter(Protocol):
    name: str
    op_types: tuple[str, ...]

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None: ...

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None: ...


def in_domain(domain: str | None, rewriter) -> bool:
    """Whether a node of ``domain`` is the rewriter's: the standard domain unless the rewriter
    names another in its ``domain`` attribute (com.microsoft's contrib ops)."""
    wanted = getattr(rewriter, "domain", "")
    return is_default_domain(domain) if is_default_domain(wanted) else domain == wanted


def run_rewriter(rewriter: Rewriter, ctx: RewriteContext, report: RewriteReport) -> int:
    """Apply ``rewriter`` to every matching node of ``ctx.graph`` and its subgraphs."""
    count = 0
    for node in list(ctx.graph.nodes):
        for sub in gs_subgraphs(node):
            count += run_rewriter(rewriter, ctx.for_graph(sub), report)
        if node.op not in rewriter.op_types or not in_domain(node.domain, rewriter):
            continue
        if not node.outputs:  # already replaced as part of another rewrite
            continue
        reason = rewriter.check(node, ctx)
        if reason is None:
            rewriter.apply(node, ctx)
            count += 1
        else:
            report.skipped.append(Diagnostic("rewrite", rewriter.name, node_label(node), reason))
    drop_detached(ctx.graph)
    return count
