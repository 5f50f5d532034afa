"""The bad-input battery (issue 7, item 1): every case through the CLI and the Python API.

Each bad input must give one clear line and exit code 2 (the API: one OnnxMluError with a
one-line message), no traceback without --debug, the input file's bytes unchanged, and no
output file nor temporary file left behind. Inputs that are unusual but valid (unknown-domain
ops, training-mode BatchNormalization) fuse with those nodes on the host and say why.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import rel_models as models
from onnxmlu import api
from onnxmlu.cli import app
from onnxmlu.errors import OnnxMluError
from onnxmlu.runtime import InferenceSession, reference_session
from onnxmlu.schema import is_fusion_block

runner = CliRunner()


@dataclass
class Case:
    """One bad input: how to write it, the options, and the words the error must contain."""

    write: Callable[[Path], None] | None  # writes the model file (None: the file does not exist)
    message: str
    options: dict = field(default_factory=dict)  # api.fuse keyword arguments (CLI flags derived)
    output: str = "out.onnx"  # relative to the case's folder; "{input}" means the input itself
    plan: str | None = None  # plan file text, passed as --plan / plan=


def _bytes(data: bytes):
    return lambda path: path.write_bytes(data)


def _model(build):
    return lambda path: path.write_bytes(build().SerializeToString())


def _fused(path: Path) -> None:
    path.write_bytes(api.fuse(models.conv_chain_model(), strategy="all-fusion").model.SerializeToString())


GOOD = _bytes(models.good_bytes())
PLAN_WRONG_LAYERS = json.dumps({"format": "onnxmlu-plan", "version": 1, "blocks": [{"start": 0, "stop": 99, "mp": 4}]})

CASES = {
    "missing file": Case(None, "does not exist"),
    "empty file": Case(_bytes(b""), "is empty"),
    "random bytes": Case(_bytes(np.random.default_rng(7).bytes(3000)), "cannot read"),
    "truncated model": Case(_bytes(models.good_bytes()[: len(models.good_bytes()) // 2]), "cannot read"),
    "a directory": Case(lambda p: p.mkdir(), "is a directory"),
    "fails the onnx checker": Case(_model(models.checker_failure), "fails the ONNX checker"),
    "graph with a cycle": Case(_model(models.cycle), "graph has a cycle"),
    "input no node produces": Case(_model(models.dangling_input), "which no node, input or initializer provides"),
    "opset below 7, invalid once converted": Case(_model(lambda: models.opset(5)), "fails the ONNX checker"),
    "opset newer than onnx": Case(_model(lambda: models.opset(99)), "newer than this onnx knows"),
    "already fused": Case(_fused, "already fused"),
    "output is the input": Case(GOOD, "is the input file", output="{input}"),
    "output folder missing": Case(GOOD, "does not exist", output="nowhere/out.onnx"),
    "output is a directory": Case(GOOD, "is a directory", output="."),
    "plan file not json": Case(GOOD, "not valid JSON", plan="{not json"),
    "plan file of another model": Case(GOOD, "the model has", plan=PLAN_WRONG_LAYERS),
    "plan file not a plan": Case(GOOD, "not an onnxmlu plan", plan="[1, 2, 3]"),
    "plan file missing": Case(GOOD, "cannot read plan file", plan="<missing>"),
    "unknown strategy": Case(GOOD, "unknown strategy 'bogus'", options={"strategy": "bogus"}),
    "unknown hardware profile": Case(GOOD, "unknown hardware profile 'nosuchchip'", options={"hardware": "nosuchchip"}),
    "bad --input-shape spec": Case(GOOD, "is not NAME:D1,D2", options={"input_shapes": "x"}),
    "--input-shape of no input": Case(GOOD, "which is not a model input", options={"input_shapes": "nope:1,2"}),
    "--mp out of range": Case(GOOD, "outside 1..32", options={"mp": 0}),
}


@dataclass
class Setup:
    folder: Path
    src: Path
    out: Path
    plan: Path | None
    before: str | None  # sha256 of the input, None when there is no input file

    def cli_args(self, case: Case) -> list[str]:
        args = ["fuse", str(self.src), str(self.out)]
        flags = {"strategy": "--strategy", "hardware": "--hw", "mp": "--mp", "input_shapes": "--input-shape"}
        for key, value in case.options.items():
            args += [flags[key], str(value)]
        if self.plan is not None:
            args += ["--plan", str(self.plan)]
        return args

    def api_kwargs(self, case: Case) -> dict:
        kwargs = dict(case.options)
        if "input_shapes" in kwargs:
            from onnxmlu.frontend.pins import parse_input_shapes

            kwargs["input_shapes"] = parse_input_shapes([kwargs["input_shapes"]])  # the CLI's parser
        if self.plan is not None:
            kwargs["plan"] = self.plan
        return kwargs

    def assert_untouched(self) -> None:
        if self.before is not None and self.src.is_file():
            assert models.sha256(self.src) == self.before, "the input file changed"
        if self.out != self.src:
            assert not self.out.is_file(), "an output file was written"
        leftovers = [p.name for p in self.folder.rglob("*") if p.name.endswith(".tmp")]
        assert not leftovers, f"temporary files left: {leftovers}"


def setup(case: Case, folder: Path) -> Setup:
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "model.onnx"
    if case.write is not None:
        case.write(src)
    out = src if case.output == "{input}" else folder / case.output
    plan = None
    if case.plan is not None:
        plan = folder / "plan.json"
        if case.plan != "<missing>":
            plan.write_text(case.plan)
    before = models.sha256(src) if src.is_file() else None
    return Setup(folder, src, out, plan, before)


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("name", list(CASES))
def test_cli_one_line_exit_2_nothing_written(name, tmp_path):
    case = CASES[name]
    s = setup(case, tmp_path / "case")
    result = runner.invoke(app, s.cli_args(case), catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = error_lines(result.output)
    assert len(lines) == 1 and case.message in lines[0], result.output
    assert result.output.strip() == lines[0], "more than the one error line was printed"
    assert "Traceback" not in result.output and "--debug" not in lines[0], result.output
    s.assert_untouched()


@pytest.mark.parametrize("name", list(CASES))
def test_api_raises_one_line_error_nothing_written(name, tmp_path):
    case = CASES[name]
    s = setup(case, tmp_path / "case")
    with pytest.raises(OnnxMluError) as info:
        result = api.fuse(s.src, **s.api_kwargs(case))
        api.save_model(result.model, s.out, input_path=s.src)
    message = str(info.value)
    assert case.message in message and "\n" not in message
    s.assert_untouched()


@pytest.mark.parametrize("name", ["missing file", "graph with a cycle", "unknown strategy"])
def test_debug_shows_the_traceback(name, tmp_path):
    case = CASES[name]
    s = setup(case, tmp_path / "case")
    result = runner.invoke(app, ["--debug", *s.cli_args(case)])
    assert isinstance(result.exception, OnnxMluError) and case.message in str(result.exception)
    s.assert_untouched()


# --- not writable --------------------------------------------------------------------------


def test_output_folder_not_writable_by_permissions(tmp_path):
    folder = tmp_path / "readonly"
    folder.mkdir()
    src = tmp_path / "model.onnx"
    src.write_bytes(models.good_bytes())
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as root: permissions do not stop writes (see the injected test below)")
        result = runner.invoke(app, ["fuse", str(src), str(folder / "out.onnx"), "-s", "none"], catch_exceptions=False)
        assert result.exit_code == 2 and "is not writable" in error_lines(result.output)[0]
        with pytest.raises(OnnxMluError, match="is not writable"):
            api.save_model(onnx.load(src), folder / "out.onnx")
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o700)


@pytest.mark.parametrize("where", ["mkstemp", "replace"])
def test_output_write_fails_at_the_os_level(tmp_path, monkeypatch, where):
    """EACCES/ENOSPC from the OS (what root meets on read-only mounts, or a full disk)."""
    import onnxmlu.collapse.atomic as atomic

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    target = atomic.tempfile if where == "mkstemp" else atomic.os
    monkeypatch.setattr(target, where if where == "mkstemp" else "replace", refuse)
    src = tmp_path / "model.onnx"
    src.write_bytes(models.good_bytes())
    before = models.sha256(src)
    out = tmp_path / "out.onnx"
    result = runner.invoke(app, ["fuse", str(src), str(out), "-s", "none"], catch_exceptions=False)
    assert result.exit_code == 2
    assert error_lines(result.output) == [f"error: cannot write {out}: Permission denied"]
    with pytest.raises(OnnxMluError, match="Permission denied"):
        api.save_model(onnx.load(src), out)
    assert models.sha256(src) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


# --- valid but unusual inputs: fused, with the reason they stay on the host -----------------


def _fuse_ok(tmp_path, model: onnx.ModelProto, *extra):
    src, out = tmp_path / "model.onnx", tmp_path / "fused.onnx"
    src.write_bytes(model.SerializeToString())
    before = models.sha256(src)
    result = runner.invoke(app, ["fuse", str(src), str(out), "-s", "all-fusion", *extra], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert models.sha256(src) == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    return result, onnx.load(out)


def test_unknown_domain_op_stays_on_the_host(tmp_path):
    result, fused = _fuse_ok(tmp_path, models.unknown_domain(typed=True))
    assert [n.op_type for n in fused.graph.node] == ["MLUFusionBlock", "Foo", "MLUFusionBlock"]
    assert "host: foo (Foo): op com.example::Foo is outside the standard domain" in result.output
    fused_api = api.fuse(models.unknown_domain(typed=True), strategy="all-fusion").model
    assert [n.domain for n in fused_api.graph.node if not is_fusion_block(n)] == ["com.example"]


def test_untyped_output_of_an_unknown_op_keeps_its_consumer_on_the_host(tmp_path):
    """Nothing can type Foo's output (onnxruntime cannot run com.example::Foo to probe it): the
    Relu reading it stays on the host with that reason instead of failing the whole model."""
    result, fused = _fuse_ok(tmp_path, models.unknown_domain(typed=False))
    assert [n.op_type for n in fused.graph.node] == ["MLUFusionBlock", "Foo", "Relu"]
    assert "host: relu1 (Relu): input 'b' has no known type (its producer 'foo' is com.example::Foo)" in result.output


def test_a_model_that_runs_at_no_default_size_fuses_and_names_the_pin(tmp_path):
    """Only H*W = 16 runs (the MatMul's K is 128 = 8*H*W): at no default or fallback size does the
    model run, so it is planned at the defaults, the output says to pass --input-shape, and the
    fused model (still symbolic) matches the original at a size it runs at (exit 0)."""
    result, fused = _fuse_ok(tmp_path, models.data_dependent_reshape())
    assert "runs at none of the sizes tried" in result.output and "--input-shape" in result.output
    x = np.random.default_rng(0).standard_normal((2, 8, 2, 8)).astype(np.float32)
    want = reference_session(models.data_dependent_reshape()).run(None, {"x": x})[0]
    np.testing.assert_allclose(InferenceSession(fused).run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


def test_training_batchnorm_stays_on_the_host_and_says_why(tmp_path):
    result, fused = _fuse_ok(tmp_path, models.training_batchnorm())
    assert [n.op_type for n in fused.graph.node] == ["BatchNormalization", "MLUFusionBlock"]
    host_lines = [line for line in result.output.splitlines() if "training" in line]
    assert any(line.startswith("host: bn (BatchNormalization)") for line in host_lines), result.output
    report = api.fuse(models.training_batchnorm(), strategy="all-fusion").rewrite_report
    assert [d.node for d in report.skipped] == ["bn"]


def test_input_shape_sizes_what_symbolic_dims_could_not(tmp_path):
    result, fused = _fuse_ok(tmp_path, models.data_dependent_reshape(), "--input-shape", "x:1,8,4,4")
    analysis = api.fuse(models.data_dependent_reshape(), strategy="all-fusion",
                        input_shapes={"x": [1, 8, 4, 4]}).analysis
    fc = next(layer for layer in analysis.layers if layer.name == "fc")
    assert fc.ops == 2 * 128 * 10  # K = 8*4*4 once the reshape target is known
    assert sum(is_fusion_block(n) for n in fused.graph.node) >= 1


def test_already_fused_is_refused_before_any_work():
    fused = api.fuse(models.conv_chain_model(), strategy="all-fusion").model
    with pytest.raises(OnnxMluError, match=r"already fused \(2 MLUFusionBlock nodes\); fuse the original"):
        api.refuse_fused(fused)
