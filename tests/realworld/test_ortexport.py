"""The exports of :mod:`ortexport` are what onnxruntime's transformer optimizer is written for:
its fusions fire (a test of the optimizer's output that would otherwise silently test plain
graphs), with the forms the toolkit must rewrite -- BERT's EmbedLayerNormalization whose mask
index feeds every Attention, GPT-2's causal Attention with a packed past and a raw mask --, in
float32 and float16; and the optimized model computes what the export does (right-padded masks:
the mask index keeps only a count of ones)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ortexport  # noqa: E402

from onnxmlu.runtime import reference_session  # noqa: E402

MS = "com.microsoft"


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
def test_the_optimizer_fuses_the_export(kind, half):
    model = ortexport.optimized(kind, float16=half)
    ops = _ops(model)
    assert {op: ops[op] for op in ortexport.EXPECTED[kind]} == ortexport.EXPECTED[kind], (ort.__version__, ops)
    assert not ops["Softmax"] and not ops["ReduceMean"], ops
    assert any(o.domain == MS for o in model.opset_import)
    weights = Counter(t.data_type for t in model.graph.initializer if t.data_type in (1, 10) and len(t.dims) == 2)
    assert set(weights) == ({onnx.TensorProto.FLOAT16} if half else {onnx.TensorProto.FLOAT})
    embed = next(n for n in model.graph.node if n.op_type == "EmbedLayerNormalization")
    attention = [n for n in model.graph.node if n.op_type == "Attention"]
    if kind == "bert":  # the 1-D mask index of the embeddings feeds every Attention
        assert all(n.input[3] == embed.output[1] for n in attention)
    else:  # causal, a packed past in and present out, the raw [B, total] mask
        assert all(onnx.helper.get_attribute_value(a) == 1 for n in attention for a in n.attribute
                   if a.name == "unidirectional") and all(len(n.input) == 5 and n.input[4] for n in attention)
        outputs = {o.name for o in model.graph.output}
        casts = {n.input[0] for n in model.graph.node if n.op_type == "Cast" and n.output[0] in outputs}
        assert all(n.output[1] in outputs | casts for n in attention)  # a graph output (float16: through a Cast)


@pytest.mark.parametrize("variant, ops", [("no_embed_layernorm", {"LayerNormalization": 1, "Attention": 2,
                                                                   "ReduceSum": 1}),
                                          ("mha_raw_mask", {"EmbedLayerNormalization": 1, "MultiHeadAttention": 2})])
def test_the_optimizer_fuses_the_bert_export_as_its_options_say(variant, ops):
    counts = _ops(ortexport.optimized("bert", variant=variant))
    assert {op: counts[op] for op in ops} == ops, (ort.__version__, counts)


def _right_padded(rng, batch: int, length: int) -> np.ndarray:
    mask = np.zeros((batch, length), np.int64)
    for row, keep in enumerate(rng.integers(1, length + 1, batch)):
        mask[row, :keep] = 1
    return mask


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_the_optimized_model_computes_what_the_export_does(kind):
    rng = np.random.default_rng(3)
    if kind == "bert":
        feeds = {"input_ids": rng.integers(0, 128, (2, 8)), "token_type_ids": rng.integers(0, 2, (2, 8)),
                 "attention_mask": _right_padded(rng, 2, 8)}
    else:
        feeds = {"input_ids": rng.integers(0, 96, (2, 3)), "position_ids": np.tile(np.arange(5, 8), (2, 1)),
                 "attention_mask": np.ones((2, 8), np.float32),
                 **{f"past_{i}": rng.standard_normal((2, 2, 4, 5, 8)).astype(np.float32) for i in range(2)}}
    export = ortexport.EXPORTS[kind][0]()
    want = reference_session(export).run(None, feeds)
    got = reference_session(ortexport.optimized(kind)).run(None, feeds)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
