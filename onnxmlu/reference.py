"""``MLUFusionBlock`` for onnx's reference evaluator: fused models run without the library.

``onnx.reference.ReferenceEvaluator(fused, new_ops=[MLUFusionBlock])`` (or
:func:`reference_evaluator`) runs each block's body with a nested reference evaluator, inputs
and outputs matched by position as the library matches them. The body is read by
:func:`onnxmlu.schema.body_model`, so the same digest and file-reference checks refuse a
damaged or file-reading body; a body holding a block is refused (blocks do not nest). Slow
(pure numpy) and exact to the ONNX specification: a second opinion, not a runtime.
"""

from __future__ import annotations

import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from onnxmlu.errors import OnnxMluError
from onnxmlu.schema import DOMAIN, body_model, is_fusion_block
from onnxmlu.wording import plural


class MLUFusionBlock(OpRun):
    """The reference implementation of ``com.onnxmlu::MLUFusionBlock`` (version 1)."""

    op_domain = DOMAIN

    def __init__(self, onnx_node: onnx.NodeProto, run_params: dict):
        super().__init__(onnx_node, run_params)
        body = body_model(onnx_node)
        if any(is_fusion_block(n) for n in body.graph.node):
            raise OnnxMluError(f"MLUFusionBlock {onnx_node.name!r}: body contains an MLUFusionBlock node; "
                               "blocks cannot be nested")
        self._inputs = [i.name for i in body.graph.input if i.name not in {t.name for t in body.graph.initializer}]
        if len(self._inputs) != len(onnx_node.input) or len(body.graph.output) != len(onnx_node.output):
            raise OnnxMluError(f"MLUFusionBlock {onnx_node.name!r}: body has {plural(len(self._inputs), 'input')} and "
                               f"{plural(len(body.graph.output), 'output')}, the node {len(onnx_node.input)} and "
                               f"{len(onnx_node.output)}")
        self._body = ReferenceEvaluator(body)

    def _run(self, *inputs, **_attributes):
        return tuple(self._body.run(None, dict(zip(self._inputs, inputs))))


def reference_evaluator(model, **kwargs) -> ReferenceEvaluator:
    """``onnx.reference.ReferenceEvaluator`` for ``model`` (a path or ModelProto) with
    :class:`MLUFusionBlock` registered."""
    return ReferenceEvaluator(model, new_ops=[MLUFusionBlock, *kwargs.pop("new_ops", [])], **kwargs)
