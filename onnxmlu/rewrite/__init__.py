"""Rewrite what the accelerator cannot run into its primitives (pipeline stage "rewrite").

``rewrite_model`` runs the rewriters in :data:`REWRITER_NAMES` order over the model and all its
subgraphs and returns a new model plus a :class:`RewriteReport`:

* ``bn``   weighted BatchNormalization -> BN-norm + Mul + Add (or folded, ``bn_mode="fold"``);
* ``gemm`` Gemm -> (Transpose) MatMul (+ Mul) (+ Add), constants pre-transposed and pre-scaled;
* ``rnn``  LSTM / GRU / RNN -> unrolled per-step cells of MatMul/Add/Mul/activations.

Each family lives in its own module whose docstring states the maths; ``base`` holds the
rewriter protocol, the registry and the driver. Nodes a rewriter refuses stay on the host and
are listed in ``RewriteReport.skipped`` with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection

from onnxmlu.errors import OnnxMluError
from onnxmlu.rewrite.base import (
    NameAllocator,
    RewriteContext,
    RewriteReport,
    RewriterRegistry,
    constant_value,
    run_rewriter,
)
from onnxmlu.ir import DEFAULT_DOMAINS, copy_model, iter_graphs, opset_version
from onnxmlu.ir.graphsurgeon import export_model, import_graph

if TYPE_CHECKING:
    import onnx

__all__ = [
    "REWRITER_NAMES",
    "REGISTRY",
    "RewriteReport",
    "constant_value",
    "rewrite_model",
]

REWRITER_NAMES = ("bn", "gemm", "rnn")

REGISTRY = RewriterRegistry()
REGISTRY.register("bn", "onnxmlu.rewrite.batchnorm:BatchNormRewriter")
REGISTRY.register("gemm", "onnxmlu.rewrite.gemm:GemmRewriter")
REGISTRY.register("rnn", "onnxmlu.rewrite.rnn:RecurrentRewriter")

BN_MODES = ("substitute", "fold")


def _selected(only: Collection[str] | None) -> tuple[str, ...]:
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


def rewrite_model(
    model: onnx.ModelProto,
    *,
    bn_mode: str = "substitute",
    only: Collection[str] | None = None,
    copy: bool = True,
) -> tuple[onnx.ModelProto, RewriteReport]:
    """Rewrite BN / Gemm / LSTM-GRU-RNN nodes into accelerator primitives.

    The input model is not modified. ``only`` restricts the rewriters (names from
    :data:`REWRITER_NAMES`); ``bn_mode`` is ``"substitute"`` (BN-norm + scale layer) or
    ``"fold"`` (into the producing Conv/ConvTranspose/Gemm/MatMul, else affine Mul + Add).
    When nothing applies the returned model is an unchanged copy (``model`` itself when
    ``copy`` is False: the pipeline owns its model and skips copying every weight).
    """
    if bn_mode not in BN_MODES:
        raise OnnxMluError(f"bn_mode must be one of {', '.join(BN_MODES)}, got {bn_mode!r}")
    names = _selected(only)
    report = RewriteReport(applied={n: 0 for n in names})
    unchanged = copy_model(model) if copy else model
    opset = opset_version(model)
    rewriters = {name: REGISTRY.create(name, bn_mode=bn_mode) for name in names}
    if opset is None or not _has_candidates(model, rewriters.values()):
        return unchanged, report  # the graphsurgeon round trip would copy every weight for nothing
    graph = import_graph(model)
    ctx = RewriteContext(graph, opset, NameAllocator.from_model(model), {"bn_mode": bn_mode})
    for name, rewriter in rewriters.items():
        report.applied[name] = run_rewriter(rewriter, ctx, report)
    if report.total == 0:
        return unchanged, report
    return export_model(graph, model), report


def _has_candidates(model: onnx.ModelProto, rewriters) -> bool:
    """Whether any graph holds a default-domain node one of ``rewriters`` looks at."""
    ops = {op for r in rewriters for op in r.op_types}
    return any(node.op_type in ops and node.domain in DEFAULT_DOMAINS
               for graph in iter_graphs(model.graph) for node in graph.node)
