"""``check`` on models whose kernels round activations to int8 at run time: a MatMulNBits at
accuracy_level 4 quantizes each block of A, so a float rounding difference upstream (our norms
and attention vs onnxruntime's fused kernels) can move one int8 value and the output by far more
than 1e-4. Such an output, off the float rule, is judged against the original with float
activations (the float twin, :mod:`onnxmlu.tools.verify`): a faithful fused model passes and says
so, a wrong weight still fails, and a model without such a node never pays for the twin."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnxmlu import api, schemas
from onnxmlu.cli import app
from onnxmlu.ir import attribute_value, iter_graphs
from onnxmlu.tools import verify

sys.path.insert(0, str(Path(__file__).resolve().parent / "realworld"))
import built  # noqa: E402


def _files(tmp_path: Path, original: onnx.ModelProto, fused_from: onnx.ModelProto | None = None) -> tuple[Path, Path]:
    """The original saved, and the fused file of ``fused_from`` (default: the original)."""
    src, other, out = tmp_path / "model.onnx", tmp_path / "fused_from.onnx", tmp_path / "model.fused.onnx"
    onnx.save(original, src)
    onnx.save(fused_from if fused_from is not None else original, other)
    api.fuse_to_file(str(other), out)
    return src, out


def _scaled(model: onnx.ModelProto, name: str, factor: float) -> onnx.ModelProto:
    """A copy of ``model`` with initializer ``name`` multiplied by ``factor``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    tensor = next(t for t in out.graph.initializer if t.name == name)
    tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * np.float32(factor), name))
    return out


def test_a_faithful_int8_decoder_passes_within_the_originals_rounding(library, tmp_path, monkeypatch):
    # 8-bit weights: A's int8 rounding moves the logits (|ref| ~40) by ~17; the fused model's flips by 0.3
    src, fused = _files(tmp_path, built.llama_matmulnbits_decoder(bits=8))
    report = api.check(src, fused)
    (logits,) = report.diffs
    assert report.ok and logits.ok, logits
    assert logits.rule(report) == f"within int8 rounding (max |orig-float| {logits.float_twin_orig:.2g})"
    assert logits.max_abs > 1e-3 and logits.max_abs < logits.float_twin_orig  # off the float rule, in the rounding
    assert logits.float_twin_fused_mean <= verify.TWIN_MEAN_FACTOR * logits.float_twin_orig_mean
    monkeypatch.setattr(verify.FloatTwin, "of", classmethod(lambda cls, model: None))
    assert not api.check(src, fused).ok  # the float rule alone fails it


def test_check_prints_and_writes_the_twin_rule_and_figures(library, tmp_path):
    src, fused = _files(tmp_path, built.llama_matmulnbits_decoder(bits=8))
    text = CliRunner().invoke(app, ["check", str(src), str(fused)], env={"COLUMNS": "80"})
    assert text.exit_code == 0, text.output
    assert "within int8 rounding (max |orig-float|" in text.output
    assert "logits: judged against the original with float activations (accuracy_level 0):" in text.output
    assert all(len(line) <= 80 for line in text.output.splitlines()), text.output
    result = CliRunner().invoke(app, ["check", str(src), str(fused), "--json", "-"])
    report = json.loads(result.stdout)
    jsonschema.validate(report, schemas.load("check"))
    (logits,) = report["outputs"]
    assert logits["ok"] and logits["rule"].startswith("within int8 rounding")
    assert 0 < logits["float_twin_orig_mean"] < logits["float_twin_orig"]
    assert logits["max_abs"] < logits["float_twin_orig"] and logits["float_twin_fused"] > 0


@pytest.mark.parametrize("bits", [4, 8])
def test_a_wrong_scale_in_a_level4_block_fails_under_the_twin_rule(library, tmp_path, bits):
    """The LM head's scales 5 % off, in the fused file only. With 8-bit weights the original's
    own rounding (max 17) is larger than the error this makes (max ~2): only the mean rule
    (|fused-float| on average within 1.25x the original's) catches it."""
    original = built.llama_matmulnbits_decoder(bits=bits)
    src, fused = _files(tmp_path, original, _scaled(original, "lm_head_s", 1.05))
    report = api.check(src, fused)
    (logits,) = report.diffs
    assert not report.ok and not logits.ok
    assert logits.float_twin_orig is not None, "judged against the float twin, and still failed"
    assert logits.float_twin_fused_mean > verify.TWIN_MEAN_FACTOR * logits.float_twin_orig_mean


def _no_twin(monkeypatch) -> None:
    """Any use of the twin -- the import that detects its nodes, or a run -- fails the test."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("the float twin was built or run")
    monkeypatch.setattr(verify.gs, "import_onnx", refuse)
    monkeypatch.setattr(verify.FloatTwin, "run", refuse)


def test_a_float_activation_model_is_judged_by_the_float_rule_alone(library, tmp_path, monkeypatch):
    # accuracy_level 0: A stays float, nothing to excuse; the LM head's scales 5 % off in the fused
    # file make it miss 1e-4 on every host (a summation-order miss would depend on the CPU)
    original = built.llama_matmulnbits_decoder(bits=8, accuracy_level=0)
    src, fused = _files(tmp_path, original, _scaled(original, "lm_head_s", 1.05))
    _no_twin(monkeypatch)
    report = api.check(src, fused)
    (logits,) = report.diffs
    assert not report.ok and logits.rule(report) == verify.FLOAT_RULE and logits.float_twin_orig is None


def test_the_twin_runs_only_for_an_output_off_the_float_rule(library, monkeypatch):
    # the level-4 model against itself: the float rule passes it on every host (whether a fused
    # model flips an int8 value depends on the CPU's summation order)
    model = built.llama_matmulnbits_decoder()
    _no_twin(monkeypatch)  # nor is the model imported to find its int8 kernels
    report = verify.check_models(model, model)
    assert report.ok and report.diffs[0].rule(report) == verify.FLOAT_RULE


def _nbits(name: str, x: str, out: str, **kw) -> tuple[onnx.NodeProto, list]:
    return built._nbits_linear(np.random.default_rng(0), name, x, out, 32, 8, **kw)


def test_the_twin_finds_int8_kernels_in_every_graph_and_leaves_the_input_untouched():
    """A level-4 MatMulNBits inside an If branch is found; one with float zero points (the
    kernel keeps A float) and one at level 0 are not; the twin is a copy at level 0."""
    inner, inner_w = _nbits("inner", "x", "y_then")
    branch = helper.make_graph([inner], "then", [], [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["y_else"])], "else", [],
                              [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, None)])
    floating, floating_w = _nbits("float_zp", "x", "z", zero_points=False)
    floating.input.append("zp_float")
    level0, level0_w = _nbits("level0", "x", "w", accuracy_level=0)
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other), floating, level0], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z", "w")],
        inner_w + floating_w + level0_w + [numpy_helper.from_array(np.full((8, 1), 8.0, np.float32), "zp_float")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    before = model.SerializeToString()
    then_index = next(k for k, g in enumerate(iter_graphs(model.graph)) if g.name == "then")
    assert verify.int8_activation_nodes(model) == [(then_index, 0)]
    twin = verify.FloatTwin.of(model).model()
    levels = {n.name: attribute_value(n, "accuracy_level")
              for g in iter_graphs(twin.graph) for n in g.node if n.op_type == "MatMulNBits"}
    assert levels == {"inner": 0, "float_zp": 4, "level0": 0}
    assert model.SerializeToString() == before


def test_the_html_report_shows_the_twin_rule_and_figures(library, tmp_path):
    src = tmp_path / "model.onnx"
    onnx.save(built.llama_matmulnbits_decoder(bits=8), src)
    page = api.report(src, tmp_path / "report.html", check=True).read_text()
    assert "within int8 rounding (max |orig-float|" in page
    assert "logits: judged against the original with float activations (accuracy_level 0):" in page
    assert "|fused-float| max" in page
