"""``--precision auto`` on the command line: the fused model written keeps the budget when run
in plain onnxruntime with the library, the report states estimated and measured accuracy,
``plan --pareto`` draws the plans considered, and options auto cannot honour are refused in
one line before anything is written."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from onnxmlu.precision.accuracy import measure
from onnxmlu.runtime import reference_session
from onnxmlu.schema import block_precision, is_fusion_block
from onnxmlu.precision.calibration import HELD_OUT_SEED
from onnxmlu.tools.verify import random_inputs
from precision_models import RESIDUAL_FILE_SEED, SIZE, invoke, plain_session, residual_model


@pytest.mark.parametrize("budget", ["cosine>=0.9999", "top1>=0.6"])  # 8/8 rows certify top-1 >= 0.688
def test_fused_auto_model_keeps_its_budget_when_run_with_the_library(residual_file, tmp_path, library, budget):
    out = tmp_path / "auto.onnx"
    result = invoke("fuse", residual_file, out, "--precision", "auto", "--accuracy", budget, "--json", "-")
    assert result.exit_code == 0, result.output
    auto = json.loads(result.stdout)["auto"]
    assert auto["met"] and auto["budget"] == budget and auto["calibration"]["random"]
    assert auto["speedup"] >= 1.0 and auto["latency_us"] <= auto["fp32_latency_us"]
    fused = onnx.load(out)
    precisions = [block_precision(n) for n in fused.graph.node if is_fusion_block(n)]
    assert precisions and set(precisions) <= {"fp32", "fp16", "int8"}
    # the seeded random samples auto judged on, held out from the calibrating seeds 0..7
    assert auto["validation"]["held_out"] and "seeds 1000" in auto["validation"]["rule"]
    model = residual_model(seed=RESIDUAL_FILE_SEED)
    feeds = [random_inputs(model, HELD_OUT_SEED + k) for k in range(auto["validation"]["samples"])]
    reference = [reference_session(model).run(None, f) for f in feeds]
    session = plain_session(fused, library)
    accuracy = measure(reference, [session.run(None, f) for f in feeds])
    metric, threshold = budget.split(">=")
    assert accuracy.value(metric) >= float(threshold)
    assert accuracy.cosine == pytest.approx(auto["measured"]["cosine"], abs=1e-6)


def test_a_top1_budget_too_strict_for_the_samples_is_not_certified(residual_file, tmp_path):
    result = invoke("fuse", residual_file, tmp_path / "auto.onnx", "--precision", "auto", "--accuracy", "top1>=0.99",
                    "--best-effort", "--json", "-")  # unmet: kept, exit 0, only because asked
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert not report["auto"]["met"] and report["auto"]["top1_lower_bound"] < 0.99
    assert all(b["precision"] == "fp32" for b in report["blocks"])  # fell back to the FP32 optimum
    said = [d["message"] for d in report["diagnostics"] if d["rule"] == "budget-uncertified"]
    assert said and "299 rows" in said[0]


def test_plan_auto_draws_the_plans_it_considered(residual_file, tmp_path):
    png = tmp_path / "pareto.png"
    result = invoke("plan", residual_file, "--precision", "auto", "--pareto", png, "--json", "-")
    assert result.exit_code == 0, result.output
    auto = json.loads(result.stdout)["auto"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(c["measured"] is not None for c in auto["candidates"])  # --pareto runs every plan it plots
    assert auto["candidates"][-1]["precisions"]["fp32"] == auto["candidates"][-1]["blocks"]  # the FP32 optimum
    plain = invoke("plan", residual_file, "--precision", "auto")
    assert "auto: cosine>=0.999 met: held-out" in plain.output and "seeded random samples" in plain.output


def test_auto_measures_on_the_calibration_folder(residual_file, tmp_path):
    folder = tmp_path / "calib"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for k in range(3):
        np.savez(folder / f"s{k}.npz", x=rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32))
    result = invoke("plan", residual_file, "--precision", "auto", "--calibration", folder, "--json", "-")
    assert result.exit_code == 0, result.output
    auto = json.loads(result.stdout)["auto"]
    # split in sorted name order: s0, s2 calibrate, s1 judges
    assert auto["calibration"] == {"source": f"{folder} (even positions)", "random": False, "samples": 2}
    assert auto["validation"]["samples"] == 1 and auto["validation"]["held_out"]
    assert "odd positions judge" in auto["validation"]["rule"]
    judge = tmp_path / "judge"
    judge.mkdir()
    for k in range(2):
        np.savez(judge / f"v{k}.npz", x=rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32))
    given = invoke("plan", residual_file, "--precision", "auto", "--calibration", folder, "--validation", judge,
                   "--json", "-")
    assert given.exit_code == 0, given.output
    auto = json.loads(given.stdout)["auto"]
    assert auto["calibration"]["samples"] == 3 and auto["validation"]["samples"] == 2
    assert auto["validation"]["rule"] == f"--validation {judge}"
    missing = invoke("plan", residual_file, "--precision", "auto", "--validation", tmp_path / "nowhere")
    assert missing.exit_code == 2 and "validation folder" in missing.output
    assert len(missing.output.strip().splitlines()) == 1


@pytest.mark.parametrize("options, said", [
    (["--accuracy", "cosine>=0.99"], "--accuracy is the budget of --precision auto"),
    (["--precision", "auto", "--accuracy", "psnr>=30"], "accuracy metric must be one of cosine, top1"),
    (["--precision", "auto", "--accuracy", "top1>=2"], "top1 budget must lie in [0, 1]"),
    (["--precision", "auto", "--mp", "4"], "--precision auto chooses blocks and MPs itself"),
])
def test_options_auto_cannot_honour_are_refused_in_one_line(residual_file, tmp_path, options, said):
    out = tmp_path / "out.onnx"
    result = invoke("fuse", residual_file, out, *options)
    assert result.exit_code == 2 and said in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()
    pareto = invoke("plan", residual_file, "--pareto", tmp_path / "p.png")
    assert pareto.exit_code == 2 and "--pareto plots the plans --precision auto considered" in pareto.output


def test_compare_auto_column_is_one_joint_plan_per_network(residual_file):
    result = invoke("compare", residual_file, "--strategies", "dlfusion,optimal", "--precision", "fp16,auto",
                    "--accuracy", "top1>=0.99", "--json", "-")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["precisions"] == ["fp16", "auto"]
    rows = report["networks"]["residual"]
    autos = {r["precisions"]["auto"]["sim_latency_us"] for r in rows}
    assert len(autos) == 1  # the same plan in every row
    optimal = next(r for r in rows if r["strategy"] == "optimal")
    assert optimal["precisions"]["auto"]["sim_latency_us"] <= optimal["sim_latency_us"] + 1e-6
    refused = invoke("compare", residual_file, "--accuracy", "top1>=0.99")
    assert refused.exit_code == 2 and "add auto to --precision" in refused.output


def test_fuse_auto_check_is_judged_by_the_budget_and_check_takes_one(residual_file, tmp_path):
    out = tmp_path / "auto.onnx"
    result = invoke("fuse", residual_file, out, "--precision", "auto", "--accuracy", "cosine>=0.999", "--check",
                    "--json", "-")
    assert result.exit_code == 0, result.output
    check = json.loads(result.stdout)["check"]
    assert check["ok"] and check["budget"] == "cosine>=0.999" and check["accuracy"]["cosine"] >= 0.999
    fp16 = tmp_path / "fp16.onnx"
    assert invoke("fuse", residual_file, fp16, "--precision", "fp16", "-q").exit_code == 0
    strict = invoke("check", residual_file, fp16, "--json", "-")  # FP16 is not within 1e-4 of FP32
    assert strict.exit_code == 1 and json.loads(strict.stdout)["budget"] is None
    budget = invoke("check", residual_file, fp16, "--accuracy", "cosine>=0.9999")
    assert budget.exit_code == 0 and "judged by cosine>=0.9999" in budget.output
    refused = invoke("check", residual_file, fp16, "--accuracy", "cosine=1")
    assert refused.exit_code == 2 and "METRIC>=VALUE" in refused.output


def test_a_user_metric_judges_auto(residual_file, tmp_path, monkeypatch):
    """--metric module:function is called per sample on FP32 and candidate outputs; its mean
    decides metric>=X. This one scores 1 - the relative L2 error of the first output."""
    (tmp_path / "my_scores.py").write_text(
        "import numpy as np\n"
        "calls = []\n"
        "def closeness(reference, outputs):\n"
        "    calls.append(1)\n"
        "    r, y = reference[0], outputs[0]\n"
        "    return 1.0 - float(np.linalg.norm(r - y) / np.linalg.norm(r))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = invoke("plan", residual_file, "--precision", "auto", "--metric", "my_scores:closeness",
                    "--accuracy", "metric>=0.95", "--json", "-")
    assert result.exit_code == 0, result.output
    auto = json.loads(result.stdout)["auto"]
    assert auto["met"] and auto["metric"] >= 0.95 and auto["budget"] == "metric>=0.95"
    import my_scores

    assert my_scores.calls  # it really ran
    for options, said in [(["--metric", "my_scores:absent"], "cannot load it"),
                          (["--metric", "nocolon"], "must read module:function"),
                          (["--accuracy", "metric>=0.9"], "give --metric module:function")]:
        refused = invoke("plan", residual_file, "--precision", "auto", *options)
        assert refused.exit_code == 2 and said in refused.output, refused.output
        assert len(refused.output.strip().splitlines()) == 1


def test_check_runs_on_the_real_samples_it_was_given_and_says_which(residual_file, tmp_path):
    rng = np.random.default_rng(5)
    folders = {}
    for name in ("calib", "judge"):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        for k in range(3):
            np.savez(folders[name] / f"{k}.npz", x=rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32))
    out = tmp_path / "int8.onnx"
    base = ["fuse", residual_file, out, "--precision", "int8", "--calibration", folders["calib"], "--check",
            "--json", "-"]
    inside = json.loads(invoke(*base).stdout)["check"]
    assert inside["data"].startswith("3 calibration samples") and "in-sample" in inside["data"]
    assert inside["seeds"] == []
    held = json.loads(invoke(*base, "--validation", folders["judge"]).stdout)["check"]
    assert held["data"] == f"3 validation samples from {folders['judge']}"
    plain = invoke("check", residual_file, out, "--inputs", folders["judge"], "--accuracy", "cosine>=0.9")
    assert plain.exit_code == 0 and "3 samples from" in plain.output and "(--inputs)" in plain.output
    alone = invoke("fuse", residual_file, tmp_path / "x.onnx", "--validation", folders["judge"])
    assert alone.exit_code == 2 and "--validation holds the samples" in alone.output
