"""Rewriter protocol, registry, driver and the model-level plumbing shared by all rewriters.

A rewriter turns one ONNX node that the accelerator cannot run into accelerator primitives.
It has a ``name`` (the key users pass to ``only=``), the ``op_types`` it looks at, a
``check(node, ctx)`` that returns the reason it does *not* apply (``None`` when it does) and an
``apply(node, ctx)`` that replaces exactly that node. A rewriter of only some forms of an op
the accelerator otherwise runs as it is (a 4-bit ``DequantizeLinear``) also has ``wants(node, ctx)``:
the other forms are not its business, and no refusal is recorded for them. :func:`run_rewriter` walks a graph and
its subgraphs (``If`` branches, ``Loop``/``Scan`` bodies), records each refusal as a
:class:`~onnxmlu.diagnostics.Diagnostic` and returns the count.

Graph edits go through onnx-graphsurgeon (import, inference and export live in
:mod:`onnxmlu.ir.graphsurgeon`).
New names are drawn from one allocator
that knows every node and tensor name of the model (subgraphs included), so they never collide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

import numpy as np
import onnx_graphsurgeon as gs

from onnxmlu.diagnostics import Diagnostic
from onnxmlu.ir import is_default_domain
from onnxmlu.ir.graphsurgeon import gs_subgraphs
from onnxmlu.ir.weights import WeightStore
from onnxmlu.rewrite.builder import Builder
from onnxmlu.rewrite.graph import (  # noqa: F401 - the rewriters' toolkit, read from here
    NameAllocator,
    constant_value,
    is_absent,
    node_input,
    node_output,
    tensor_dtype,
    tensor_shape,
    static_dim,
)

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


def _every_node(node: gs.Node, ctx: RewriteContext) -> bool:
    return True


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
        if not getattr(rewriter, "wants", _every_node)(node, ctx):  # a form of the op the accelerator runs
            continue
        reason = rewriter.check(node, ctx)
        if reason is None:
            rewriter.apply(node, ctx)
            count += 1
        else:
            report.skipped.append(Diagnostic("rewrite", rewriter.name, node_label(node), reason))
    drop_detached(ctx.graph)
    return count
