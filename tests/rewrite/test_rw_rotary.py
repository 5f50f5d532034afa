"""RotaryEmbedding (opset 23) rewriter against onnxruntime's kernel and ONNX's reference evaluator.

Draws 3-D ([B, S, H*D] with ``num_heads``) and 4-D ([B, H, S, D]) inputs, ``interleaved`` or
not, full or partial rotation (``rotary_embedding_dim``), caches indexed by ``position_ids`` or
given per token, constant or fed caches, fixed or symbolic batch and sequence; float32 at
rtol = atol = 1e-4 against both (the rewrite computes the definition's products and sums, bit for bit).
float16 against onnxruntime at 2e-3 (a float16 ulp at the values' size).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from rw_util import rewritten_once, assert_close, op_types, run_ort

from onnxmlu.rewrite import rewrite_model

MAX_POSITIONS = 16


def rotary_model(rank, batch, seq, heads, head, *, interleaved=0, rotary=0, positions=True, const_cache=False,
                 symbolic=False, elem=TensorProto.FLOAT, seed=0):
    rng = np.random.default_rng(seed)
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    half = (rotary or head) // 2
    x_shape = [batch, heads, seq, head] if rank == 4 else [batch, seq, heads * head]
    cache_shape = [MAX_POSITIONS, half] if positions else [batch, seq, half]
    angles = rng.uniform(0, 2 * np.pi, cache_shape)
    caches = {"cos": np.cos(angles).astype(dtype), "sin": np.sin(angles).astype(dtype)}
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rotary, **({"num_heads": heads} if rank == 3 else {})}
    names = ["x", "cos", "sin", *(["pos"] if positions else [])]
    node = helper.make_node("RotaryEmbedding", names, ["y"], name="rope", **attrs)
    seq_axis = 2 if rank == 4 else 1
    x_dims = [("B" if i == 0 else "S") if symbolic and i in (0, seq_axis) else d for i, d in enumerate(x_shape)]
    inputs = [helper.make_tensor_value_info("x", elem, x_dims)]
    if positions:
        inputs.append(helper.make_tensor_value_info("pos", TensorProto.INT64, ["B", "S"] if symbolic else [batch, seq]))
    inits = [numpy_helper.from_array(v, k) for k, v in caches.items()] if const_cache else []
    if not const_cache:
        inputs += [helper.make_tensor_value_info(k, elem, cache_shape) for k in caches]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", elem, x_dims)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    feeds = {"x": rng.standard_normal(x_shape).astype(dtype), **({} if const_cache else caches)}
    if positions:
        feeds["pos"] = rng.integers(0, MAX_POSITIONS, (batch, seq))
    return model, feeds


def _rewritten(model):
    return rewritten_once(model, "rotary", "RotaryEmbedding")


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(rank=st.sampled_from([3, 4]), batch=st.integers(1, 3), seq=st.integers(1, 5), heads=st.integers(1, 4),
       head=st.sampled_from([2, 4, 8, 12]), interleaved=st.sampled_from([0, 1]), partial=st.booleans(),
       positions=st.booleans(), const_cache=st.booleans(), symbolic=st.booleans(), seed=st.integers(0, 2**16))
def test_rotary_property(rank, batch, seq, heads, head, interleaved, partial, positions, const_cache, symbolic, seed):
    rotary = max(2, head // 2 - (head // 2) % 2) if partial else 0
    model, feeds = rotary_model(rank, batch, seq, heads, head, interleaved=interleaved, rotary=rotary,
                                positions=positions, const_cache=const_cache, symbolic=symbolic, seed=seed)
    got = run_ort(_rewritten(model), feeds)
    assert_close(got, run_ort(model, feeds), what="vs onnxruntime")
    assert_close(got, ReferenceEvaluator(model).run(None, feeds), what="vs reference")


@pytest.mark.parametrize("interleaved", [0, 1])
def test_float16_matches_onnxruntime(interleaved):
    model, feeds = rotary_model(3, 2, 5, 4, 16, interleaved=interleaved, rotary=8, elem=TensorProto.FLOAT16)
    assert_close(run_ort(_rewritten(model), feeds), run_ort(model, feeds), rtol=2e-3, atol=2e-3, what="float16")


def test_symbolic_sequence_runs_at_other_lengths():
    """Nothing of the first shape is baked in: the rewritten graph runs at other batch/sequence sizes."""
    model, _ = rotary_model(3, 2, 3, 4, 8, symbolic=True, const_cache=True)
    rewritten = _rewritten(model)
    for batch, seq in ((1, 1), (3, 7)):
        _, feeds = rotary_model(3, batch, seq, 4, 8, const_cache=True, seed=seq)
        assert_close(run_ort(rewritten, feeds), run_ort(model, feeds), what=f"{batch}x{seq}")


@pytest.mark.parametrize(("change", "reason"), [
    ("num_heads", "num_heads"), ("hidden", "fixed number"), ("odd", "must be even"),
])
def test_refusals_are_diagnostics(change, reason):
    model, _ = rotary_model(3, 2, 3, 4, 8, rotary=4)
    attrs = model.graph.node[0].attribute
    if change == "num_heads":
        attrs.remove(next(a for a in attrs if a.name == "num_heads"))
    elif change == "hidden":
        model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "hidden"
    else:
        next(a for a in attrs if a.name == "rotary_embedding_dim").i = 3
    rewritten, report = rewrite_model(model, only=["rotary"])
    assert report.total == 0 and op_types(rewritten) == ["RotaryEmbedding"]
    [diagnostic] = report.skipped
    assert diagnostic.rule == "rotary" and reason in diagnostic.message


def test_two_nodes_on_the_same_caches_share_one_gather_each():
    """Q and K of a layer read the same caches at the same positions: one Gather per cache."""
    model, feeds = rotary_model(3, 2, 3, 4, 8, const_cache=True)
    graph = model.graph
    graph.node.append(helper.make_node("RotaryEmbedding", ["x2", "cos", "sin", "pos"], ["y2"], num_heads=2))
    graph.input.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, [2, 3, 16]))
    graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, [2, 3, 16]))
    feeds["x2"] = np.random.default_rng(1).standard_normal((2, 3, 16)).astype(np.float32)
    rewritten, report = rewrite_model(model, only=["rotary"])
    assert report.applied == {"rotary": 2}
    assert op_types(rewritten).count("Gather") == 2 and op_types(rewritten).count("Unsqueeze") == 2
    assert_close(run_ort(rewritten, feeds), run_ort(model, feeds), what="two nodes")
