"""Precision on the command line: ``fuse``/``plan``/``compare --precision``, ``fuse
--calibration DIR --calibrator NAME``, the precision columns and keys of the reports, and bad
values refused in one line before anything is written."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from onnxmlu.schema import block_precision, is_fusion_block
from onnxmlu.precisions import PRECISIONS
from precision_models import RESIDUAL_FILE_SEED, SIZE, invoke, residual_model, run_plain_and_reference


@pytest.fixture
def calibration_dir(tmp_path):
    """Four .npz samples of the residual model's input."""
    folder = tmp_path / "calib"
    folder.mkdir()
    rng = np.random.default_rng(11)
    for k in range(4):
        np.savez(folder / f"sample{k}.npz", x=rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32))
    return folder


def fused_blocks(path) -> list[onnx.NodeProto]:
    return [n for n in onnx.load(path).graph.node if is_fusion_block(n)]


def fuse_json(model, out, *options) -> dict:
    result = invoke("fuse", model, out, *options, "--json", "-")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_fuse_fp16_writes_fp16_blocks_that_run_with_the_library(residual_file, tmp_path, library):
    out = tmp_path / "fp16.onnx"
    result = invoke("fuse", residual_file, out, "-s", "all-fusion", "--precision", "fp16")
    assert result.exit_code == 0, result.output
    assert "precision" in result.output and "fp16" in result.output  # the block table's column
    assert [block_precision(n) for n in fused_blocks(out)] == ["fp16"]
    report = fuse_json(residual_file, tmp_path / "again.onnx", "-s", "all-fusion", "--precision", "fp16")
    assert [b["precision"] for b in report["blocks"]] == ["fp16"] and report["calibration"] is None
    assert not [d for d in report["diagnostics"] if d["stage"] == "precision"]
    (y, h), (y_ref, h_ref) = run_plain_and_reference(residual_model(seed=RESIDUAL_FILE_SEED), onnx.load(out), library, 0)
    np.testing.assert_allclose(y, y_ref, rtol=2e-2, atol=2e-2)


def test_fuse_int8_with_a_calibration_folder_and_calibrator(residual_file, calibration_dir, tmp_path, library):
    out = tmp_path / "int8.onnx"
    report = fuse_json(residual_file, out, "--precision", "int8", "--calibration", calibration_dir,
                       "--calibrator", "entropy")
    assert {b["precision"] for b in report["blocks"]} == {"int8"}
    assert report["calibration"] == {"source": str(calibration_dir), "samples": 4, "random": False,
                                     "calibrator": "entropy", "description": f"4 samples from {calibration_dir}"}
    assert "random-calibration" not in {d["rule"] for d in report["diagnostics"]}
    blocks = fused_blocks(out)
    assert all(block_precision(n) == "int8" and f"4 samples from {calibration_dir}" in n.doc_string for n in blocks)
    (y, _), (y_ref, _) = run_plain_and_reference(residual_model(seed=RESIDUAL_FILE_SEED), onnx.load(out), library, 1)
    assert float(y.ravel() @ y_ref.ravel() / np.linalg.norm(y) / np.linalg.norm(y_ref)) > 0.99
    shown = invoke("fuse", residual_file, tmp_path / "shown.onnx", "--precision", "int8", "--calibration",
                   calibration_dir)
    assert f"INT8 blocks calibrated on 4 samples from {calibration_dir} (minmax)" in shown.output


def test_fuse_int8_without_calibration_says_it_used_random_samples(residual_file, tmp_path):
    result = invoke("fuse", residual_file, tmp_path / "o.onnx", "--precision", "int8")
    assert result.exit_code == 0, result.output
    assert "precision: INT8 blocks calibrated on 8 seeded random samples" in result.output.replace("\n", " ")
    report = fuse_json(residual_file, tmp_path / "j.onnx", "--precision", "int8")
    assert report["calibration"]["random"] is True and report["calibration"]["source"] == "random"
    assert [d["rule"] for d in report["diagnostics"] if d["stage"] == "precision"][:1] == ["random-calibration"]


def test_fuse_without_precision_is_fp32_as_before(residual_file, tmp_path):
    plain = fuse_json(residual_file, tmp_path / "a.onnx")
    fp32 = fuse_json(residual_file, tmp_path / "b.onnx", "--precision", "fp32")
    assert {b["precision"] for b in plain["blocks"]} == {"fp32"} and plain["calibration"] is None
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    assert [b["sim_latency_us"] for b in fp32["blocks"]] == [b["sim_latency_us"] for b in plain["blocks"]]
    assert all(a.name != "precision" for n in fused_blocks(tmp_path / "a.onnx") for a in n.attribute)


def test_plan_precision_reaches_the_plan_file_and_fuse_reads_it_back(residual_file, tmp_path):
    plan_file = tmp_path / "plan.json"
    result = invoke("plan", residual_file, "--precision", "int8", "-o", plan_file)
    assert result.exit_code == 0, result.output
    assert "int8" in result.output
    assert {b["precision"] for b in json.loads(plan_file.read_text())["blocks"]} == {"int8"}
    report = json.loads(invoke("plan", residual_file, "--precision", "int8", "--json", "-").stdout)
    assert {b["precision"] for b in report["blocks"]} == {"int8"}
    from_file = fuse_json(residual_file, tmp_path / "f.onnx", "--plan", plan_file)
    assert {b["precision"] for b in from_file["blocks"]} == {"int8"}  # no --precision: the plan file's
    overridden = fuse_json(residual_file, tmp_path / "g.onnx", "--plan", plan_file, "--precision", "fp16")
    assert {b["precision"] for b in overridden["blocks"]} == {"fp16"}
    assert [b["sim_latency_us"] for b in report["blocks"]] == pytest.approx(
        [b["sim_latency_us"] for b in from_file["blocks"]])


def test_compare_precision_adds_a_column_per_precision(residual_file):
    result = invoke("compare", residual_file, "--strategies", "dlfusion,optimal", "--precision", "fp16,int8",
                    "--json", "-")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["precisions"] == ["fp16", "int8"]
    for row in report["networks"]["residual"]:
        assert list(row["precisions"]) == ["fp16", "int8"]
        for column in row["precisions"].values():
            assert column["speedup_vs_fp32"] == pytest.approx(row["sim_latency_us"] / column["sim_latency_us"])
            assert column["sim_latency_us"] <= row["sim_latency_us"]  # a lower precision is never slower
    shown = invoke("compare", residual_file, "--strategies", "dlfusion", "--precision", "int8")
    assert shown.exit_code == 0 and "int8 µs" in shown.output
    plain = json.loads(invoke("compare", residual_file, "--strategies", "dlfusion", "--json", "-").stdout)
    assert plain["precisions"] == [] and all(r["precisions"] == {} for r in plain["networks"]["residual"])


@pytest.mark.parametrize("options, message", [
    (["--precision", "fp8"], f"--precision must be one of {', '.join(PRECISIONS)}, auto, not 'fp8'"),
    (["--precision", "int8", "--calibrator", "kl"], "calibration method must be one of minmax, entropy, percentile"),
    (["--precision", "int8", "--calibration", "{tmp}/nowhere"], "does not exist or is not a folder"),
    (["--precision", "int8", "--calibration", "{tmp}/empty"], "holds no sample"),
    (["--precision", "int8", "--calibration", "{tmp}/wrong"], "calibration sample 0"),
])
def test_bad_precision_options_get_one_line_and_exit_2(residual_file, tmp_path, options, message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "wrong").mkdir()
    np.savez(tmp_path / "wrong" / "s.npz", image=np.zeros((1, 3, SIZE, SIZE), np.float32))
    out = tmp_path / "out.onnx"
    result = invoke("fuse", residual_file, out, *[o.format(tmp=tmp_path) for o in options])
    assert result.exit_code == 2, result.output
    assert message in result.output.replace("\n", " ") and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 2  # one line (wrapped at most once on a narrow terminal)
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("command", ["plan", "compare"])
def test_plan_and_compare_refuse_an_unknown_precision(residual_file, command):
    result = invoke(command, residual_file, "--precision", "fp8x")
    assert result.exit_code == 2 and f"--precision must be one of {', '.join(PRECISIONS)}, auto, not 'fp8x'" in result.output


def test_run_profile_shows_each_blocks_precision(residual_file, tmp_path, library):
    out = tmp_path / "fp16.onnx"
    assert invoke("fuse", residual_file, out, "-s", "all-fusion", "--precision", "fp16", "-q").exit_code == 0
    report = json.loads(invoke("run", out, "--repeat", "1", "--profile", "--json", "-").stdout)
    assert {p["precision"] for p in report["profile"] if p["mp"] is not None} == {"fp16"}


def test_streamed_int8_fuse_equals_the_in_memory_one(tmp_path, zoo, monkeypatch):
    """``fuse`` without --check streams (the weight store holds the large weights): INT8
    calibration runs on the model with its weights filled in, and the file equals what
    api.fuse makes in memory."""
    from onnxmlu import api
    from onnxmlu.ir.weights import STORE_MIN_TENSOR_BYTES, is_marker
    from onnxmlu.precision import bodies

    model = zoo("resnet18")
    assert any(t.ByteSize() > STORE_MIN_TENSOR_BYTES for t in model.graph.initializer)  # the store is used
    source, out = tmp_path / "r18.onnx", tmp_path / "r18.int8.onnx"
    onnx.save(model, source)
    filled = []
    runnable = bodies.runnable_model

    def markers_then_filled(analysis):
        model = runnable(analysis)
        filled.append((any(is_marker(t) for t in analysis.model.graph.initializer),
                       any(is_marker(t) for t in model.graph.initializer)))
        return model

    monkeypatch.setattr(bodies, "runnable_model", markers_then_filled)
    report = fuse_json(source, out, "--precision", "int8")
    assert filled == [(True, False)] and report["calibration"]["random"] is True
    assert onnx.load(out) == api.fuse(model, precision="int8").model
