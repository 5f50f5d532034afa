"""com.microsoft EmbedLayerNormalization rewritten (onnxmlu/rewrite/embedlayernorm.py), against
onnxruntime's CPU kernel over random shapes and optional inputs: segment ids and table, mask
(entries 0, 1 and 2: the kernel counts the ones), position ids ([B, S] or [1, S]) or none,
the embedding-sum output, float16 tables. Tolerance 1e-4 in float32 (a LayerNorm's
mean/variance pass in another order), two float16 ulps in float16 (the kernel normalizes in
float32 and rounds once, as the rewrite does).
"""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from rw_util import assert_close, full_check, run_ort

from onnxmlu.rewrite import rewrite_model

MS = "com.microsoft"
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def embed_model(rng, batch: int, seq: int, d: int, half: bool, segment: bool, mask: bool, positions: str,
                outputs: tuple[str, ...], epsilon: float | None):
    """One EmbedLayerNormalization node, ids and mask graph inputs, tables initializers."""
    vocab, npos = 11, seq + 3
    ftype = np.float16 if half else np.float32
    tables = {"word": rng.standard_normal((vocab, d)), "pos": rng.standard_normal((npos, d)),
              "seg": rng.standard_normal((2, d)), "gamma": 1 + 0.1 * rng.standard_normal(d),
              "beta": 0.1 * rng.standard_normal(d)}
    feeds = {"ids": rng.integers(0, vocab, (batch, seq)).astype(np.int32)}
    if segment:
        feeds["segment_ids"] = rng.integers(0, 2, (batch, seq)).astype(np.int32)
    if mask:
        feeds["mask"] = rng.integers(0, 3, (batch, seq)).astype(np.int32)
    if positions != "none":
        rows = 1 if positions == "1S" else batch
        feeds["position_ids"] = rng.integers(0, npos, (rows, seq)).astype(np.int32)
    names = ["ids", "segment_ids" if segment else "", "word", "pos", "seg" if segment else "", "gamma",
             "beta", "mask" if mask else "", "position_ids" if positions != "none" else ""]
    while len(names) > 7 and not names[-1]:  # the schema takes 7 to 9 inputs
        names.pop()
    attrs = {} if epsilon is None else {"epsilon": epsilon}
    node = helper.make_node("EmbedLayerNormalization", names, list(outputs), domain=MS, **attrs)
    inits = [numpy_helper.from_array(v.astype(ftype), k) for k, v in tables.items() if k in names]
    elem = TensorProto.FLOAT16 if half else TensorProto.FLOAT
    types = {"out": elem, "mask_index": TensorProto.INT32, "sum": elem}
    graph = helper.make_graph(
        [node], "embed", [helper.make_tensor_value_info(k, TensorProto.INT32, v.shape) for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, types[o], None) for o in outputs if o], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model, feeds


@settings(max_examples=40, **SETTINGS)
@given(batch=st.integers(1, 3), seq=st.integers(1, 7), d=st.sampled_from([4, 8, 32]), half=st.booleans(),
       segment=st.booleans(), mask=st.booleans(), positions=st.sampled_from(["none", "BS", "1S"]),
       outputs=st.sampled_from([("out", "mask_index"), ("out", "mask_index", "sum")]),
       epsilon=st.sampled_from([None, 1e-5]), seed=st.integers(0, 2**16))
def test_embed_layernorm_matches_the_kernel(batch, seq, d, half, segment, mask, positions, outputs, epsilon, seed):
    rng = np.random.default_rng(seed)
    model, feeds = embed_model(rng, batch, seq, d, half, segment, mask, positions, outputs, epsilon)
    rewritten, report = rewrite_model(model, only=["embedlayernorm"])
    assert report.applied["embedlayernorm"] == 1, report.skipped
    assert "EmbedLayerNormalization" not in [n.op_type for n in rewritten.graph.node]
    full_check(onnx.shape_inference.infer_shapes(rewritten))
    want, got = run_ort(model, feeds), run_ort(rewritten, feeds)
    for name, w, g in zip([o for o in outputs if o], want, got):
        if name == "mask_index":
            np.testing.assert_array_equal(g, w)
        elif half:
            np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2.0**-9, atol=4e-3)
        else:
            assert_close(g, w, what=name)


def test_int64_ids_are_refused_with_the_reason():
    node = helper.make_node("EmbedLayerNormalization", ["ids", "", "word", "pos", "", "gamma", "gamma"], ["out", "mask_index"], domain=MS)
    inits = [numpy_helper.from_array(np.ones((4, 8), np.float32), n) for n in ("word", "pos")]
    inits.append(numpy_helper.from_array(np.ones(8, np.float32), "gamma"))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid(MS, 1)])
    _, report = rewrite_model(model, only=["embedlayernorm"])
    assert report.applied["embedlayernorm"] == 0
    assert any("int64" in str(entry) for entry in report.skipped), report.skipped
