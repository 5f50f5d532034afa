"""Coverage: how much of a model's heavy work the plan puts on the accelerator.

"Fuses" is not "accelerated": a model whose convolutions stay on the host fuses and matches
and gains nothing. *Heavy* nodes are those that carry the arithmetic: Conv, ConvTranspose,
MatMul, Gemm, Einsum, LSTM/GRU/RNN and their quantized forms (:data:`HEAVY_OPS`, any domain).
They are counted in every graph after the rewrite: the main graph's layers (each in a block),
its host nodes, and every node inside a host node's subgraphs (an ``If`` branch, a ``Loop``
body), which runs on the host with its parent. A rewritten LSTM counts as the MatMuls of its
cells. Shares:

* ``heavy_share = heavy nodes in blocks / heavy nodes`` (1.0 for a model without any);
* ``gops_share = heavy GOPs in blocks / (heavy GOPs in blocks + GOPs of the heavy host
  nodes)``, the host nodes priced like layers ([DLFusion] Eq. 1-2) where their op and sizes
  allow; the others (a Gemm or LSTM the rewriters refused, a node in a branch) are counted in
  ``unpriced`` and left out of the share.

Each heavy node on the host is listed with the reason the analysis gave it (or its parent's,
for a node inside a subgraph).

A subgraph whose blocks were planned (:mod:`onnxmlu.collapse.branches`) is counted by its own
coverage instead, computed the same way over its own analysis (:func:`branch_coverage`): its
layers in blocks, its host nodes with their reasons, its own planned subgraphs below it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from onnxmlu.analyze.layers import Analysis, describe_layer, node_label
from onnxmlu.analyze.optable import OP_KINDS, support_reason
from onnxmlu.ir import node_subgraphs, subgraphs
from onnxmlu.wording import plural

#: Op types that carry a model's arithmetic, in any domain (com.microsoft's quantized forms).
HEAVY_OPS: frozenset[str] = frozenset({
    "Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN",
    "QLinearConv", "ConvInteger", "QLinearMatMul", "MatMulInteger", "QGemm", "MatMulIntegerToFloat",
    "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "QAttention", "FusedConv", "FusedMatMul", "FusedGemm",
    # attention and weight-only quantized linear layers: heavy where a rewriter leaves them on the host
    "Attention", "MultiHeadAttention", "GroupQueryAttention", "MatMulNBits",
})


@dataclass
class Coverage:
    heavy_nodes: int = 0
    heavy_in_blocks: int = 0
    gops_in_blocks: float = 0.0
    gops_on_host: float = 0.0
    unpriced: int = 0  # heavy host nodes whose work could not be sized
    heavy_on_host: list[dict] = field(default_factory=list)

    @property
    def heavy_share(self) -> float:
        return self.heavy_in_blocks / self.heavy_nodes if self.heavy_nodes else 1.0

    @property
    def gops_share(self) -> float | None:
        """None when no heavy work could be priced (every heavy node on the host unsized)."""
        total = self.gops_in_blocks + self.gops_on_host
        if total > 0:
            return self.gops_in_blocks / total
        return None if self.unpriced else 1.0

    def summary(self) -> str:
        """The shares in one line. The GOPs share is over the priced heavy nodes only, and
        says so when some are unpriced: ``1/2 heavy nodes in blocks (50.0%), 100.0% of the
        GOPs of the 1 priced; 1 heavy host node unpriced`` (never "100% of their GOPs" while
        a host Conv was not sized)."""
        nodes = f"{self.heavy_in_blocks}/{self.heavy_nodes} heavy nodes in blocks ({self.heavy_share:.1%})"
        if not self.unpriced:
            gops = "n/a" if self.gops_share is None else f"{self.gops_share:.1%}"
            return f"{nodes}, {gops} of their GOPs"
        priced = self.heavy_nodes - self.unpriced
        share = "none" if self.gops_share is None else f"{self.gops_share:.1%}"
        unpriced = plural(self.unpriced, "heavy host node")
        return f"{nodes}, {share} of the GOPs of the {priced} priced; {unpriced} unpriced"

    @classmethod
    def from_dict(cls, payload: dict) -> "Coverage":
        """The coverage a report's ``coverage`` object holds (:meth:`to_dict`), so that a page
        built from the JSON says :meth:`summary` in the same words."""
        return cls(payload["heavy_nodes"], payload["heavy_in_blocks"], payload["gops_in_blocks"],
                   payload["gops_on_host"], payload["unpriced"], list(payload["heavy_on_host"]))

    def to_dict(self) -> dict:
        return {"heavy_nodes": self.heavy_nodes, "heavy_in_blocks": self.heavy_in_blocks,
                "heavy_share": self.heavy_share, "gops_in_blocks": self.gops_in_blocks,
                "gops_on_host": self.gops_on_host, "gops_share": self.gops_share, "unpriced": self.unpriced,
                "heavy_on_host": list(self.heavy_on_host)}


def coverage(analysis: Analysis, branches: dict[str, Coverage] | None = None) -> Coverage:
    """The coverage of a plan over ``analysis`` (every layer is in a block); ``branches``: the
    coverage of each planned subgraph, by its key ``NODE.ATTR`` (:func:`branch_coverage`)."""
    branches = branches or {}
    found = Coverage()
    for layer in analysis.layers:
        if layer.op_type in HEAVY_OPS:
            found.heavy_nodes += 1
            found.heavy_in_blocks += 1
        found.gops_in_blocks += layer.gops if layer.op_type in HEAVY_OPS else 0.0
    nodes = analysis.model.graph.node
    for i, reason in sorted(analysis.host_reasons.items()):
        node = nodes[i]
        if node.op_type in HEAVY_OPS:
            _count_host(found, node, reason, "", _gops(node, analysis))
        for attr in node.attribute if node_subgraphs(node) else ():
            key = f"{node_label(node)}.{attr.name}"
            if key in branches:
                _merge(found, branches[key], key)
            else:
                for sub in subgraphs(attr):
                    _count_subgraph(found, sub, f"{node_label(node)} ({node.op_type})")
    return found


def branch_coverage(branches) -> dict[str, Coverage]:
    """Key -> coverage of each planned subgraph (objects with ``key``, ``analysis`` and their
    own ``branches``, as :class:`~onnxmlu.pipeline.BranchPlan`), nested ones included."""
    return {b.key: coverage(b.analysis, branch_coverage(b.branches)) for b in branches}


def _merge(found: Coverage, branch: Coverage, key: str) -> None:
    found.heavy_nodes += branch.heavy_nodes
    found.heavy_in_blocks += branch.heavy_in_blocks
    found.gops_in_blocks += branch.gops_in_blocks
    found.gops_on_host += branch.gops_on_host
    found.unpriced += branch.unpriced
    found.heavy_on_host.extend({**row, "graph": row["graph"] or key} for row in branch.heavy_on_host)


def _count_host(found: Coverage, node: onnx.NodeProto, reason: str, graph: str, gops: float | None) -> None:
    found.heavy_nodes += 1
    found.heavy_on_host.append({"node": node_label(node), "op_type": node.op_type, "graph": graph, "reason": reason})
    if gops is None:
        found.unpriced += 1
    else:
        found.gops_on_host += gops


def _count_subgraph(found: Coverage, graph: onnx.GraphProto, parent: str) -> None:
    reason = f"inside {parent}, whose subgraphs run on the host"
    for node in graph.node:
        if node.op_type in HEAVY_OPS:
            _count_host(found, node, reason, graph.name, None)
        for sub in node_subgraphs(node):
            _count_subgraph(found, sub, parent)


def _gops(node: onnx.NodeProto, analysis: Analysis) -> float | None:
    """The node's GOPs priced as a layer, or None when its op or sizes do not allow it."""
    if node.op_type not in OP_KINDS or node.domain not in ("", "ai.onnx"):
        return None
    reason = support_reason(node, analysis.index)
    if reason is not None and "cannot size" in reason:
        return None
    try:
        return describe_layer(node, analysis.index, 0, 0).gops
    except (KeyError, IndexError, ValueError, TypeError):
        return None


