"""An opset-23 decoder layer end to end: RMSNormalization -> Q/K/V MatMuls -> RotaryEmbedding ->
grouped-query Attention with a KV cache -> output MatMul -> residual -> RMSNormalization -> SwiGLU
MLP -> residual (``built.opset23_decoder_layer``, also a corpus model) fuses into ONE block once the
rmsnorm, rotary and attention rewriters have run, and the fused model, run with the custom-op
library, matches the original (onnxruntime, optimizations off) at 1e-4: at the pinned shape and
at other batch, sequence and past lengths (a decode step of one token after a long past, a
prefill without past), since pins choose the plan, never the fused model's interface. The
same with a padding mask as exporters feed it (an int64 input [batch, 1, seq, total] cast to
bool): its length is symbolic, so the rewrite pads it to the total length at run time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from rw_util import assert_close, run_ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "realworld"))

import built  # noqa: E402

from onnxmlu import api  # noqa: E402
from onnxmlu.runtime import InferenceSession  # noqa: E402
from onnxmlu.schema import ensure_registered, is_fusion_block  # noqa: E402

HIDDEN, KV_HEADS, HEAD = 64, 2, 8
PINS = {"x": [1, 4, HIDDEN], "position_ids": [1, 4], "past_key": [1, KV_HEADS, 12, HEAD],
        "past_value": [1, KV_HEADS, 12, HEAD]}


def _feeds(batch: int, seq: int, past: int, seed: int = 0, masked: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    cache = (batch, KV_HEADS, past, HEAD)
    feeds = {"x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
             "position_ids": np.tile(past + np.arange(seq), (batch, 1)).astype(np.int64),
             "past_key": rng.standard_normal(cache).astype(np.float32),
             "past_value": rng.standard_normal(cache).astype(np.float32)}
    if masked:  # the first sample's first two cache positions are padding
        feeds["attention_mask"] = np.ones((batch, 1, seq, past + seq), np.int64)
        feeds["attention_mask"][0, ..., :2] = 0
    return feeds


def _with_padding_mask(model: onnx.ModelProto) -> onnx.ModelProto:
    """The layer with an attention mask input [batch, 1, seq, total] (int64, cast to bool)."""
    graph = model.graph
    attention = next(n for n in graph.node if n.op_type == "Attention")
    attention.input[3] = "mask_bool"
    graph.node.insert(list(graph.node).index(attention),
                      helper.make_node("Cast", ["attention_mask"], ["mask_bool"], to=TensorProto.BOOL))
    graph.input.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", 1, "seq", "total"]))
    return model


@pytest.fixture(scope="module", params=[False, True], ids=["causal", "causal+mask"])
def layer(request):
    masked = request.param
    model = built.opset23_decoder_layer()
    pins = dict(PINS)
    if masked:
        model = _with_padding_mask(model)
        pins["attention_mask"] = [1, 1, 4, 16]
    return model, api.fuse(model, input_shapes=pins).model, masked


def test_the_layer_is_one_block(layer):
    model, fused, _ = layer
    assert {n.op_type for n in model.graph.node} >= {"RMSNormalization", "RotaryEmbedding", "Attention"}
    assert len(fused.graph.node) == 1 and is_fusion_block(fused.graph.node[0])


@pytest.mark.parametrize(("batch", "seq", "past"), [(1, 4, 12), (2, 1, 40), (1, 6, 0), (3, 2, 5)],
                         ids=["pinned", "decode-long-past", "prefill-no-past", "batch3"])
def test_the_fused_layer_matches_the_original(layer, batch, seq, past):
    model, fused, masked = layer
    ensure_registered()
    feeds = _feeds(batch, seq, past, seed=seq + past, masked=masked)
    got = InferenceSession(fused).run(None, feeds)
    assert_close(got, run_ort(model, feeds), what=f"batch {batch}, seq {seq}, past {past}")


def _as_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    for i, tensor in enumerate(model.graph.initializer):
        array = onnx.numpy_helper.to_array(tensor)
        if array.dtype == np.float32:
            model.graph.initializer[i].CopyFrom(onnx.numpy_helper.from_array(array.astype(np.float16), tensor.name))
    for vi in [*model.graph.input, *model.graph.output]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    return model


def test_the_float16_layer_is_one_block_and_matches():
    """float16 throughout (RMSNormalization's statistics in float32, its stash_type): one block;
    the outputs agree to about one float16 ulp at their size (y reaches ~12, where an ulp is
    2**-7), since onnxruntime's kernels compute some products in float32 and the primitives in
    float16."""
    model = _as_float16(built.opset23_decoder_layer())
    fused = api.fuse(model, input_shapes=PINS).model
    assert len(fused.graph.node) == 1 and is_fusion_block(fused.graph.node[0])
    ensure_registered()
    session = InferenceSession(fused)
    for batch, seq, past in ((1, 4, 12), (2, 1, 30)):
        feeds = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in _feeds(batch, seq, past).items()}
        assert_close(session.run(None, feeds), run_ort(model, feeds), rtol=1e-2, atol=1e-2, what=f"float16 {seq}/{past}")
