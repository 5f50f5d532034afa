"""Rewrite what the accelerator cannot run into its primitives (pipeline stage "rewrite").

``rewrite_model`` runs the rewriters of :data:`REWRITERS`, in that order, over the model and
all its subgraphs and returns a new model plus a :class:`RewriteReport`. :data:`REWRITERS` is
the one list of them: the CLI's help, the pass's progress line, the JSON schema and the docs
read it (``rewriter_summary``), so adding a rewriter is its module, its entry here and its test.

Each rewriter lives in its own module whose docstring states the maths; ``base`` holds the
rewriter protocol and the driver. Nodes a rewriter refuses stay on the host; each is a
:class:`~onnxmlu.diagnostics.Diagnostic` in ``RewriteReport.skipped`` with the reason.
"""

from __future__ import annotations

from typing import Collection

import onnx

from onnxmlu.errors import OnnxMluError
from onnxmlu.ir import copy_model, iter_graphs, opset_version
from onnxmlu.ir.graphsurgeon import export_model, import_graph
from onnxmlu.ir.weights import WeightStore
from onnxmlu.registry import Registry
from onnxmlu.rewrite.attention_ms import ContribAttentionRewriter
from onnxmlu.rewrite.base import NameAllocator, RewriteContext, RewriteReport, constant_value, in_domain, run_rewriter
from onnxmlu.rewrite.attention import AttentionRewriter
from onnxmlu.rewrite.batchnorm import BN_MODES, BatchNormRewriter
from onnxmlu.rewrite.contribgelu import ContribGeluRewriter
from onnxmlu.rewrite.dq4 import FourBitDequantizeRewriter
from onnxmlu.rewrite.embedlayernorm import EmbedLayerNormRewriter
from onnxmlu.rewrite.dqlstm import DynamicQuantizeLSTMRewriter
from onnxmlu.rewrite.fusedmatmul import FusedMatMulRewriter
from onnxmlu.rewrite.gemm import GemmRewriter
from onnxmlu.rewrite.gqa import GroupQueryAttentionRewriter
from onnxmlu.rewrite.instancenorm import InstanceNormRewriter
from onnxmlu.rewrite.rmsnorm import RMSNormRewriter
from onnxmlu.rewrite.rnn import RecurrentRewriter
from onnxmlu.rewrite.rotary import RotaryEmbeddingRewriter
from onnxmlu.rewrite.matmulnbits import MatMulNBitsRewriter
from onnxmlu.rewrite.mha import MultiHeadAttentionRewriter
from onnxmlu.rewrite.msrotary import ContribRotaryRewriter
from onnxmlu.rewrite.qlinearmatmul import QLinearMatMulWeightRewriter
from onnxmlu.rewrite.skipnorm import OrtLayerNormRewriter, SimplifiedNormRewriter, SkipNormRewriter

__all__ = [
    "BN_MODES",
    "REWRITERS",
    "REWRITER_NAMES",
    "RewriteReport",
    "constant_value",
    "rewrite_model",
    "rewrite_owned",
    "rewriter_summary",
    "selected_rewriters",
    "rewritten_ops",
]

#: name -> rewriter class (called with the rewrite options); they run in this order.
REWRITERS: Registry[type] = Registry("rewriter", [("bn", BatchNormRewriter), ("gemm", GemmRewriter),
                                                  ("rnn", RecurrentRewriter),
                                                  ("dqlstm", DynamicQuantizeLSTMRewriter),
                                                  ("instancenorm", InstanceNormRewriter),
                                                  ("rmsnorm", RMSNormRewriter),
                                                  ("rotary", RotaryEmbeddingRewriter),
                                                  ("attention", AttentionRewriter),
                                                  # onnxruntime's contrib transformer ops
                                                  ("fusedmatmul", FusedMatMulRewriter),
                                                  ("skipnorm", SkipNormRewriter),
                                                  ("embedlayernorm", EmbedLayerNormRewriter),
                                                  ("simplifiednorm", SimplifiedNormRewriter),
                                                  ("ortlayernorm", OrtLayerNormRewriter),
                                                  ("contribgelu", ContribGeluRewriter),
                                                  ("msrotary", ContribRotaryRewriter),
                                                  ("mha", MultiHeadAttentionRewriter),
                                                  ("msattention", ContribAttentionRewriter),
                                                  ("gqa", GroupQueryAttentionRewriter),
                                                  ("matmulnbits", MatMulNBitsRewriter),
                                                  ("dq4", FourBitDequantizeRewriter),
                                                  # exact INT8 on CPUs without VNNI (onnxmlu.sessions)
                                                  ("qlinearmatmul", QLinearMatMulWeightRewriter)])
REWRITER_NAMES = REWRITERS.names()


def rewritten_ops() -> dict[str, tuple[str, ...]]:
    """rewriter name -> the op types it rewrites, ``domain::op`` outside the standard domain."""
    return {name: tuple(f"{r.domain}::{op}" if getattr(r, "domain", "") else op for op in r.op_types)
            for name, r in REWRITERS.items()}


def rewriter_summary(separator: str = ", ") -> str:
    """The rewriters and what each rewrites, as one line for help texts and labels."""
    return separator.join(f"{name} ({'/'.join(ops)})" for name, ops in rewritten_ops().items())


def selected_rewriters(only: Collection[str] | None) -> tuple[str, ...]:
    """The rewriters ``only`` names (all when None), in the order they run."""
    if only is None:
        return REWRITER_NAMES
    if isinstance(only, str):
        only = (only,)
    unknown = sorted(set(only) - set(REWRITER_NAMES))
    if unknown:
        raise OnnxMluError(
            f"unknown rewriter(s) {', '.join(unknown)}; choose from {', '.join(REWRITER_NAMES)}"
        )
    return tuple(n for n in REWRITER_NAMES if n in set(only))


def rewrite_model(model: onnx.ModelProto, *, bn_mode: str = "substitute",
                  only: Collection[str] | None = None) -> tuple[onnx.ModelProto, RewriteReport]:
    """Run the rewriters of :data:`REWRITERS` over ``model``, which is not
    modified (when nothing applies the returned model is an unchanged copy).

    ``only`` restricts the rewriters (names from :data:`REWRITER_NAMES`); ``bn_mode`` is
    ``"substitute"`` (BN-norm + scale layer) or ``"fold"`` (into the producing
    Conv/ConvTranspose/Gemm/MatMul, else affine Mul + Add).
    """
    rewritten, report = rewrite_owned(model, bn_mode=bn_mode, only=only)
    return (copy_model(model) if rewritten is model else rewritten), report


def rewrite_owned(model: onnx.ModelProto, *, bn_mode: str = "substitute", only: Collection[str] | None = None,
                  weights: WeightStore | None = None) -> tuple[onnx.ModelProto, RewriteReport]:
    """:func:`rewrite_model` for a caller that gives ``model`` away: it comes back itself when
    nothing applies (no copy of every weight). ``weights`` holds the model's marker weights
    and receives the large constants the rewriters make."""
    if bn_mode not in BN_MODES:
        raise OnnxMluError(f"bn_mode must be one of {', '.join(BN_MODES)}, got {bn_mode!r}")
    names = selected_rewriters(only)
    report = RewriteReport(applied={n: 0 for n in names})
    opset = opset_version(model)
    rewriters = {name: REWRITERS.get(name)(bn_mode=bn_mode) for name in names}
    if opset is None or not _has_candidates(model, rewriters.values()):
        return model, report  # the graphsurgeon round trip would copy every weight for nothing
    graph = import_graph(model, weights)
    ctx = RewriteContext(graph, opset, NameAllocator.from_model(model), {"bn_mode": bn_mode}, weights=weights)
    for name, rewriter in rewriters.items():
        report.applied[name] = run_rewriter(rewriter, ctx, report)
    if report.total == 0:
        return model, report
    return export_model(graph, model), report


def _has_candidates(model: onnx.ModelProto, rewriters) -> bool:
    """Whether any graph holds a node one of ``rewriters`` looks at (and, for a rewriter of some
    forms of an op, may want: ``may_want``, so a QDQ model's 8-bit DequantizeLinear nodes do
    not cost the graphsurgeon round trip)."""
    return any(node.op_type in r.op_types and in_domain(node.domain, r)
               and getattr(r, "may_want", _any_form)(node, graph)
               for graph in iter_graphs(model.graph) for node in graph.node for r in rewriters)


def _any_form(node: onnx.NodeProto, graph: onnx.GraphProto) -> bool:
    return True
