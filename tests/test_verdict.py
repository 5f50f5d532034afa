"""A verdict that can be trusted: ``check`` and ``fuse --check`` fail on NaN/Inf, judge quantized
outputs in steps of their scale and float ones by a stated rule, draw integer ids inside the
model's vocabulary, run where ``fuse`` priced, never publish a model that failed (nor one whose
``--precision auto`` budget is unmet, unless ``--best-effort``), and say onnxruntime's refusal once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnxmlu import api
from onnxmlu.cli import app
from onnxmlu.errors import OnnxMluError
from onnxmlu.frontend.feeds import integer_bounds, random_inputs
from onnxmlu.precision.calibration import conform_sample
from onnxmlu.tools import verify
from onnxmlu.tools.testing import make_model

sys.path.insert(0, str(Path(__file__).resolve().parent / "precision"))
from precision_models import residual_model  # noqa: E402
from quantized_models import float_cnn, quantized  # noqa: E402

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _unary(op: str, shape=(2, 4), **attrs) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], name=op.lower(), **attrs)], op.lower(),
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])
    return make_model(graph, 17)


# ------------------------------------------------------------------------------ NaN and Inf
def test_nan_in_both_outputs_fails_unless_allowed():
    """Log of N(0, 1) draws: NaN in the reference and in the 'fused' model at the same places.
    It used to pass (NaN compared equal); now it fails, and --allow-nan passes it."""
    model = _unary("Log")
    report = verify.check_models(model, model)
    assert not report.ok and report.diffs[0].nonfinite == verify.NAN_IN_BOTH
    assert report.shapes[0].status == "failed" and "NaN/Inf in both" in report.shapes[0].note
    assert verify.check_models(model, model, allow_nan=True).ok


def test_nan_where_the_reference_is_finite_fails_even_when_allowed_and_under_a_budget():
    report = verify.check_models(_unary("Abs"), _unary("Log"), allow_nan=True)
    assert not report.ok and "fused output where the reference is finite" in report.diffs[0].nonfinite
    budget = verify.check_models(_unary("Log"), _unary("Log"), budget=api.Budget.of("cosine>=0"))
    assert not budget.ok  # a budget never turns NaN into a pass


def test_inf_of_the_other_sign_is_a_different_pattern():
    diff = verify.compare_outputs(["y"], [np.array([np.inf, 1.0])], [np.array([-np.inf, 1.0])], 1e-4, 1e-4)[0]
    assert diff.nonfinite and diff.nonfinite != verify.NAN_IN_BOTH


def test_check_cli_says_nan_and_the_rule(tmp_path):
    path = tmp_path / "log.onnx"
    onnx.save(_unary("Log"), path)
    result = invoke("check", path, path)
    assert result.exit_code == 1, result.output
    assert "NaN/Inf in both" in result.output and "--allow-nan" in result.output
    assert "|a-b| <= atol + rtol*|ref|" in result.output  # the rule, beside the columns
    assert invoke("check", path, path, "--allow-nan").exit_code == 0


# ------------------------------------------------------------------------------ integer ids
def _embedding(vocabulary: int) -> onnx.ModelProto:
    table = numpy_helper.from_array(np.arange(vocabulary * 4, dtype=np.float32).reshape(vocabulary, 4), "table")
    nodes = [helper.make_node("Cast", ["ids"], ["ids64"], name="cast", to=TensorProto.INT64),
             helper.make_node("Gather", ["table", "ids64"], ["y"], name="lookup")]
    graph = helper.make_graph(nodes, "embed", [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 16]),
                                               helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 4]),
                               helper.make_tensor_value_info("m", TensorProto.INT64, [1])], [table])
    graph.node.append(helper.make_node("Identity", ["n"], ["m"], name="pass"))
    return make_model(graph, 17)


def test_ids_are_drawn_inside_the_vocabulary_and_loose_integers_are_flagged():
    """A table of 3 rows: ids drawn in [0, 10) used to run out of it (onnxruntime refused every
    shape); now they stay below 3, and the integer input nothing bounds is named in a note."""
    model = _embedding(3)
    assert integer_bounds(model) == {"ids": 3}
    assert random_inputs(model, 0)["ids"].max() < 3
    report = verify.check_models(model, model)
    assert report.ok
    assert len(report.notes) == 1 and "n drawn in [0, 10)" in report.notes[0] and "out of range" in report.notes[0]
    assert "notes" in report.to_dict()


def test_ids_into_an_int8_table_are_bounded_by_its_rows():
    """An exporter's INT8 embedding, Cast(int8 table) * scale -> Gather: the table's rows bound
    the ids as an initializer's would."""
    table = numpy_helper.from_array(np.ones((2, 4), np.int8), "table_q")
    nodes = [helper.make_node("Cast", ["table_q"], ["table_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["table_f", "scale"], ["table"]),
             helper.make_node("Gather", ["table", "ids"], ["y"])]
    graph = helper.make_graph(nodes, "int8_embed", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4])],
                              [table, numpy_helper.from_array(np.float32(0.5), "scale")])
    assert integer_bounds(make_model(graph, 17)) == {"ids": 2}


def test_ids_into_a_contrib_embedding_are_bounded_by_each_table():
    """onnxruntime's BERT optimizer writes the embeddings as one EmbedLayerNormalization: word ids
    index its third input, segment ids its fifth. Drawn in [0, 10) the segment ids ran out of a
    2-row table and onnxruntime refused every shape the check tried."""
    rng = np.random.default_rng(0)
    tables = {"word": (30, 8), "position": (16, 8), "segment": (2, 8), "gamma": (8,), "beta": (8,)}
    inits = [numpy_helper.from_array(rng.normal(size=dims).astype(np.float32), name) for name, dims in tables.items()]
    node = helper.make_node("EmbedLayerNormalization", ["ids", "seg", *tables], ["y", "mask_index"],
                            domain="com.microsoft", epsilon=1e-12)
    ints = [helper.make_tensor_value_info(n, TensorProto.INT32, [1, 6]) for n in ("ids", "seg")]
    graph = helper.make_graph([node], "embed_ln", ints, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    assert integer_bounds(model) == {"ids": 30, "seg": 2}
    assert verify.check_models(model, model).ok


# ------------------------------------------------------------------------------ quantized outputs
def _qdq_conv(offset_steps: float = 0.0) -> onnx.ModelProto:
    """x -> Q/DQ -> Conv (DQ'd int8 weights) -> Q/DQ -> y; ``offset_steps`` steps of the output
    scale added after the last DequantizeLinear (a fused form off by that much)."""
    rng = np.random.default_rng(0)
    scale_out = np.float32(0.05)
    inits = [numpy_helper.from_array(np.float32(0.02), "s_in"), numpy_helper.from_array(np.uint8(128), "z_in"),
             numpy_helper.from_array(rng.integers(-60, 60, (4, 3, 3, 3)).astype(np.int8), "w_q"),
             numpy_helper.from_array(np.float32(0.01), "s_w"), numpy_helper.from_array(np.int8(0), "z_w"),
             numpy_helper.from_array(scale_out, "s_out"), numpy_helper.from_array(np.uint8(100), "z_out"),
             numpy_helper.from_array(np.float32(offset_steps * scale_out), "shift")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_in", "z_in"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s_in", "z_in"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w_q", "s_w", "z_w"], ["w"]),
             helper.make_node("Conv", ["xd", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "s_out", "z_out"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "s_out", "z_out"], ["d"]),
             helper.make_node("Add", ["d", "shift"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = make_model(graph, 17)
    if not offset_steps:  # the original: its output is the DequantizeLinear's
        model.graph.node.pop()
        model.graph.node[-1].output[0] = "y"
    return model


def test_a_quantized_output_is_judged_in_steps_of_its_scale():
    """One step off (what an integer kernel's rounding gives) passes; five steps (a real bug:
    a wrong zero point, scale or weight) fail. The relative error, huge near zero, is not
    the rule for such an output."""
    original = _qdq_conv()
    assert verify.output_steps(original) == {"y": pytest.approx(0.05)}
    one = verify.check_models(original, _qdq_conv(1.0))  # + the step the optimized QLinearConv may round off
    assert one.ok and 1 - 1e-3 <= one.diffs[0].max_steps <= 2 + 1e-3
    assert "steps of 0.05" in one.to_dict()["outputs"][0]["rule"]
    assert not verify.check_models(original, _qdq_conv(5.0)).ok
    assert not verify.check_models(original, _qdq_conv(1.0), qtol=0.5).ok


@pytest.mark.parametrize("float_model", [float_cnn, residual_model], ids=["cnn", "residual"])
def test_a_faithful_qdq_model_fused_for_real_passes_its_check(tmp_path, library, float_model):
    """onnxruntime's quantize_static (QDQ) of a CNN and of a residual one (a skip Add, two
    outputs), fused: the blocks run the integer kernels, the reference dequantizes, convolves
    in float and re-quantizes; they differ by a step or two of the output scale."""
    source = tmp_path / "qdq.onnx"
    onnx.save(quantized(float_model(), "qdq"), source)
    out = tmp_path / "qdq.fused.onnx"
    result = invoke("fuse", source, out, "--check", "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    check = json.loads((tmp_path / "r.json").read_text())["check"]
    assert check["ok"] and check["outputs"][0]["step"] > 0 and "steps of" in check["outputs"][0]["rule"]
    assert invoke("check", source, out).exit_code == 0


# ------------------------------------------------------------------------------ publishing
def test_fuse_check_that_fails_publishes_nothing(chain_model, tmp_path, monkeypatch):
    source, out = tmp_path / "chain.onnx", tmp_path / "fused.onnx"
    onnx.save(chain_model, source)

    def off(names, fused, reference, *args, **kwargs):
        return [verify.OutputDiff(n, tuple(np.shape(f)), 1.0, 1.0, False) for n, f in zip(names, fused)]

    monkeypatch.setattr(verify, "compare_outputs", off)
    result = invoke("fuse", source, out, "-s", "all-fusion", "--check")
    assert result.exit_code == 1, result.output
    assert not out.exists() and "not written" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.onnx"]  # no staging file left behind
    out.write_bytes(b"previous")
    assert invoke("fuse", source, out, "-s", "all-fusion", "--check").exit_code == 1
    assert out.read_bytes() == b"previous"


def test_an_unmet_accuracy_budget_exits_1_and_writes_nothing_unless_best_effort(chain_model, tmp_path):
    source, out = tmp_path / "chain.onnx", tmp_path / "auto.onnx"
    onnx.save(chain_model, source)
    budget = ("--precision", "auto", "--accuracy", "cosine>=1")  # the FP32 plan itself rounds below it
    result = invoke("fuse", source, out, *budget)
    assert result.exit_code == 1, result.output
    assert not out.exists() and "not written" in result.output
    assert invoke("plan", source, *budget, "-q").exit_code == 1
    kept = invoke("fuse", source, out, *budget, "--best-effort")
    assert kept.exit_code == 0, kept.output
    assert out.exists()
    assert invoke("plan", source, *budget, "-q", "--best-effort").exit_code == 0


# ------------------------------------------------------------------------------ shapes
def test_check_runs_at_the_shape_fuse_priced(chain_model, tmp_path):
    """fuse pinned the symbolic batch at 3: check without --input-shape runs there first."""
    source, out = tmp_path / "chain.onnx", tmp_path / "fused.onnx"
    model = chain_model
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(model, source)
    assert invoke("fuse", source, out, "--input-shape", "x:3,8,16,16", "-q").exit_code == 0
    result = invoke("check", source, out, "--json", tmp_path / "c.json")
    assert result.exit_code == 0, result.output
    shapes = json.loads((tmp_path / "c.json").read_text())["shapes"]
    assert shapes[0]["label"] == "pinned" and shapes[0]["inputs"] == {"x": [3, 8, 16, 16]}


def test_calibration_samples_fit_every_dim_the_model_leaves_free():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "free",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "h", 0])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    graph.input[0].type.tensor_type.shape.dim[2].Clear()  # '?': neither a size nor a name
    sample = {"x": np.zeros((1, 3, 48, 192, 2), np.float32)}
    assert conform_sample(sample, make_model(graph, 17), "sample 0")["x"].shape == (1, 3, 48, 192, 2)
    with pytest.raises(OnnxMluError, match="the model wants"):
        conform_sample({"x": np.zeros((1, 4, 48, 192, 2), np.float32)}, make_model(graph, 17), "sample 0")


def test_onnxruntimes_refusal_is_said_once_and_cut():
    """A Reshape no batch fits: every shape tried fails with the same message, said once."""
    shape = numpy_helper.from_array(np.array([3, 5], np.int64), "shape")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], "bad",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape])
    model = make_model(graph, 17)
    with pytest.raises(OnnxMluError) as caught:
        verify.check_models(model, model)
    text = str(caught.value)
    assert text.count("Status Message") == 1 and "onnxruntime_src" not in text and len(text) < 600, text
    assert "cannot be reshaped" in text  # the gist, past the framing
    assert "other batch" in text and caught.value.__cause__ is not None  # the full text, for --debug
