"""An opset-23 decoder layer end to end: RMSNormalization -> Q/K/V MatMuls -> RotaryEmbedding ->
grouped-query Attention with a KV cache -> output MatMul -> residual -> RMSNormalization -> SwiGLU
MLP -> residual (``built.opset23_decoder_layer``, also a corpus model) fuses into ONE block once the
rmsnorm, rotary and attention rewriters have run, and the fused model, run with the custom-op
library, matches the original (onnxruntime, optimizations off) at 1e-4: at the pinned shape and
at other batch, sequence and past lengths (a decode step of one token after a long past, a
prefill without past), since pins choose the plan, never the fused model's interface.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from rw_util import assert_close, run_ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "realworld"))

import built  # noqa: E402

from onnxmlu import api  # noqa: E402
from onnxmlu.runtime import InferenceSession  # noqa: E402
from onnxmlu.schema import ensure_registered, is_fusion_block  # noqa: E402

HIDDEN, KV_HEADS, HEAD = 64, 2, 8
PINS = {"x": [1, 4, HIDDEN], "position_ids": [1, 4], "past_key": [1, KV_HEADS, 12, HEAD],
        "past_value": [1, KV_HEADS, 12, HEAD]}


def _feeds(batch: int, seq: int, past: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    cache = (batch, KV_HEADS, past, HEAD)
    return {"x": rng.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
            "position_ids": np.tile(past + np.arange(seq), (batch, 1)).astype(np.int64),
            "past_key": rng.standard_normal(cache).astype(np.float32),
            "past_value": rng.standard_normal(cache).astype(np.float32)}


@pytest.fixture(scope="module")
def layer():
    model = built.opset23_decoder_layer()
    return model, api.fuse(model, input_shapes=PINS).model


def test_the_layer_is_one_block(layer):
    model, fused = layer
    assert {n.op_type for n in model.graph.node} >= {"RMSNormalization", "RotaryEmbedding", "Attention"}
    assert len(fused.graph.node) == 1 and is_fusion_block(fused.graph.node[0])


@pytest.mark.parametrize(("batch", "seq", "past"), [(1, 4, 12), (2, 1, 40), (1, 6, 0), (3, 2, 5)],
                         ids=["pinned", "decode-long-past", "prefill-no-past", "batch3"])
def test_the_fused_layer_matches_the_original(layer, batch, seq, past):
    model, fused = layer
    ensure_registered()
    feeds = _feeds(batch, seq, past, seed=seq + past)
    got = InferenceSession(fused).run(None, feeds)
    assert_close(got, run_ort(model, feeds), what=f"batch {batch}, seq {seq}, past {past}")
