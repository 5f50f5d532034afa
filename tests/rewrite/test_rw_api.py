"""rewrite_model's contract: options, report, registry, subgraphs, names, what is preserved."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from rw_util import assert_close, full_check, op_types, run_ort

from onnxmlu.errors import OnnxMluError
from onnxmlu.rewrite import REWRITER_NAMES, REWRITERS, RewriteReport, constant_value, rewrite_model
from onnxmlu.registry import Registry
from onnxmlu.rewrite.gemm import GemmRewriter

F = TensorProto.FLOAT


def _gemm_model(opset=13, extra_nodes=(), ir_version=8, initializers_as_inputs=False):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.uniform(-1, 1, (3, 4)).astype(np.float32), "w")
    c = numpy_helper.from_array(rng.uniform(-1, 1, (4,)).astype(np.float32), "c")
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="fc", beta=0.5), *extra_nodes]
    inputs = [helper.make_tensor_value_info("x", F, [2, 3])]
    if initializers_as_inputs:
        inputs += [helper.make_tensor_value_info("w", F, [3, 4]), helper.make_tensor_value_info("c", F, [4])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", F, None)], [w, c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    model.metadata_props.add(key="origin", value="test")
    return model


FEEDS = {"x": np.random.default_rng(1).uniform(-1, 1, (2, 3)).astype(np.float32)}


def test_public_names():
    assert REWRITER_NAMES == REWRITERS.names()
    assert REWRITER_NAMES.index("bn") < REWRITER_NAMES.index("gemm")  # a BN folds into a Gemm before it is rewritten
    assert callable(constant_value)


@pytest.mark.parametrize("kwargs", [{"bn_mode": "merge"}, {"only": ["lstm"]}, {"only": ["bn", "nope"]}])
def test_bad_options_raise(kwargs):
    with pytest.raises(OnnxMluError):
        rewrite_model(_gemm_model(), **kwargs)


def test_only_selects_and_report():
    model = _gemm_model()
    kept, report = rewrite_model(model, only=["bn", "rnn"])
    assert report.applied == {"bn": 0, "rnn": 0} and report.total == 0
    assert kept.SerializeToString() == model.SerializeToString()  # untouched copy
    assert kept is not model
    rewritten, report = rewrite_model(model, only="gemm")
    assert report.applied == {"gemm": 1} and report.total == 1
    assert report.to_dict() == {"applied": {"gemm": 1}, "skipped": [], "total": 1}


def test_input_not_mutated_and_model_fields_kept():
    model = _gemm_model(opset=9)
    before = model.SerializeToString()
    rewritten, _ = rewrite_model(model)
    assert model.SerializeToString() == before
    assert [(o.domain, o.version) for o in rewritten.opset_import] == [("", 9)]
    assert rewritten.ir_version == 8 and rewritten.metadata_props[0].value == "test"
    full_check(rewritten)
    assert_close(run_ort(rewritten, FEEDS), run_ort(model, FEEDS))


def test_idempotent():
    once, _ = rewrite_model(_gemm_model())
    twice, report = rewrite_model(once)
    assert report.total == 0 and twice.SerializeToString() == once.SerializeToString()


def test_skipped_entries_are_diagnostics():
    node = helper.make_node("Gemm", ["a", "b"], ["y"], name="int_gemm")
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, TensorProto.INT64, [2, 2]) for n in "ab"],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
    )  # fmt: skip
    _, report = rewrite_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    (entry,) = report.skipped
    assert (entry.stage, entry.rule, entry.node) == ("rewrite", "gemm", "int_gemm") and isinstance(entry.message, str)
    assert report.to_dict()["skipped"] == [{"rewriter": "gemm", "node": "int_gemm", "reason": entry.message}]


def test_registry_rejects_duplicates_and_unknown():
    reg = Registry("rewriter")
    reg.register("x", GemmRewriter)
    with pytest.raises(OnnxMluError):
        reg.register("x", GemmRewriter)
    with pytest.raises(OnnxMluError):
        reg.get("y")
    assert reg.get("x")().name == "gemm"
    assert isinstance(RewriteReport().total, int)


def test_new_names_avoid_existing_ones():
    """A tensor already called 'fc/matmul' must not be shadowed by the new MatMul output."""
    clash = helper.make_node("Identity", ["x"], ["fc/matmul"], name="fc/matmul")
    model = _gemm_model(extra_nodes=[clash])
    model.graph.output.append(helper.make_tensor_value_info("fc/matmul", F, None))
    rewritten, _ = rewrite_model(model)
    full_check(rewritten)
    names = [o for n in rewritten.graph.node for o in n.output]
    assert len(names) == len(set(names))
    assert_close(run_ort(rewritten, FEEDS), run_ort(model, FEEDS))


def test_ir3_initializers_listed_as_inputs_are_kept():
    """IR < 4 lists initializers as graph inputs; the rewrite keeps the input list intact for
    tensors still present (graphsurgeon alone would drop them)."""
    model = _gemm_model(ir_version=3, opset=7, initializers_as_inputs=True)
    rewritten, report = rewrite_model(model)
    assert report.total == 1
    # c was folded into beta*c, so it is gone; the new initializer is listed as IR 3 requires
    assert [i.name for i in rewritten.graph.input] == ["x", "w", "fc/bias"]
    full_check(rewritten)
    assert_close(run_ort(rewritten, FEEDS), run_ort(model, FEEDS))


def _lstm_body_model(ir_version=8, opset=14):
    """Loop whose body runs an LSTM over the loop-carried value seen as a [2, 1, 3] sequence;
    its weights live in the outer graph; plus an If with a Gemm in each branch."""
    rng = np.random.default_rng(2)
    w = rng.uniform(-1, 1, (1, 8, 3)).astype(np.float32)
    r = rng.uniform(-1, 1, (1, 8, 2)).astype(np.float32)
    gw = rng.uniform(-1, 1, (3, 3)).astype(np.float32)
    if opset >= 13:
        axes = numpy_helper.from_array(np.array([1], np.int64))
        unsqueeze = [helper.make_node("Constant", [], ["axes"], value=axes),
                     helper.make_node("Unsqueeze", ["v_in", "axes"], ["seq"])]  # fmt: skip
    else:
        unsqueeze = [helper.make_node("Unsqueeze", ["v_in"], ["seq"], axes=[1])]
    body_nodes = [
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        *unsqueeze,
        helper.make_node("LSTM", ["seq", "W", "R"], ["", "h"], hidden_size=2, name="cell"),
        helper.make_node("Gemm", ["v_in", "gw", "gc"], ["v_out"], name="loop_fc", alpha=0.5),
    ]
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", F, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", F, [2, 3]),
         helper.make_tensor_value_info("h", F, [1, 1, 2])],
    )  # fmt: skip

    def branch(tag, alpha):
        node = helper.make_node("Gemm", ["x", "gw", "gc"], [f"{tag}_y"], name=f"{tag}_fc", alpha=alpha)
        return helper.make_graph([node], tag, [], [helper.make_tensor_value_info(f"{tag}_y", F, [2, 3])])

    nodes = [
        helper.make_node("Loop", ["trip", "", "x"], ["v_final", "hs"], body=body, name="loop"),
        helper.make_node("If", ["flag"], ["z"], then_branch=branch("then", 2.0), else_branch=branch("else", -1.0)),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in
             {"W": w, "R": r, "gw": gw, "gc": gw[0], "trip": np.array(3, np.int64)}.items()]  # fmt: skip
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", F, [2, 3]), helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(n, F, s) for n, s in (("v_final", [2, 3]), ("hs", [3, 1, 1, 2]), ("z", [2, 3]))],
        inits,
    )  # fmt: skip
    if ir_version < 4:
        graph.input.extend(helper.make_tensor_value_info(i.name, i.data_type, i.dims) for i in inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


@pytest.mark.parametrize(("ir_version", "opset"), [(8, 14), (3, 7)])
def test_subgraphs_are_rewritten(ir_version, opset):
    model = _lstm_body_model(ir_version, opset)
    rewritten, report = rewrite_model(model)
    assert report.applied == {**dict.fromkeys(REWRITER_NAMES, 0), "gemm": 3, "rnn": 1}, report.skipped
    assert not {"Gemm", "LSTM"} & set(op_types(rewritten))
    full_check(rewritten)
    x = np.random.default_rng(3).uniform(-1, 1, (2, 3)).astype(np.float32)
    for flag in (True, False):
        feeds = {"x": x, "flag": np.array(flag)}
        assert_close(run_ort(rewritten, feeds), run_ort(model, feeds))
    outer = {i.name for i in rewritten.graph.initializer}
    body = next(a.g for n in rewritten.graph.node for a in n.attribute if a.name == "body")
    assert not outer & {i.name for i in body.initializer}, "outer weights copied into the body"


def test_rewritten_model_round_trips_through_bytes():
    rewritten, _ = rewrite_model(_lstm_body_model())
    again = onnx.load_from_string(rewritten.SerializeToString())
    full_check(again)
