"""CLI behaviour: output, exit codes (0 ok, 1 check failed, 2 input error), one-line errors,
input files untouched, no partial outputs."""

from __future__ import annotations

import hashlib
import json

import onnx
import pytest
from typer.testing import CliRunner

from onnxmlu.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def chain_file(tmp_path, chain_model):
    path = tmp_path / "chain.onnx"
    onnx.save(chain_model, path)
    return path


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_fuse_writes_model_and_prints_block_table(chain_file, tmp_path):
    out = tmp_path / "fused.onnx"
    before = digest(chain_file)
    result = invoke("fuse", chain_file, out, "--strategy", "all-fusion", "--check", "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert "block" in result.output and "check passed" in result.output
    assert out.exists() and digest(chain_file) == before
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report["blocks"]) == 2 and report["check"]["ok"] is True
    assert not list(tmp_path.glob(".*.tmp"))


def test_fuse_without_check_streams_the_same_model_and_report(chain_file, tmp_path, monkeypatch):
    """No --check: the CLI writes through api.fuse_to_file (never the whole fused model in
    memory) and its file and report equal what api.fuse + save_model give."""
    from onnxmlu import api

    expected = api.fuse(str(chain_file), strategy="all-fusion")
    monkeypatch.setattr(api, "fuse", lambda *a, **k: pytest.fail("fuse without --check must stream"))
    out = tmp_path / "fused.onnx"
    result = invoke("fuse", chain_file, out, "-s", "all-fusion", "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert onnx.load(out) == expected.model
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["blocks"] == json.loads(json.dumps(expected.block_rows()))
    assert report["sim_latency_us"] == pytest.approx(expected.sim_latency_us)
    assert invoke("fuse", chain_file, chain_file, "-q").exit_code == 2  # never over its input
    assert not list(tmp_path.glob(".*.tmp"))


def test_check_command_passes_and_fails_on_tolerance(chain_file, tmp_path):
    out = tmp_path / "fused.onnx"
    assert invoke("fuse", chain_file, out, "-s", "none", "-q").exit_code == 0
    assert invoke("check", chain_file, out, "--seed", "0", "--seed", "1").exit_code == 0
    # a different model with the same interface must fail the comparison with exit code 1
    from onnxmlu.tools.testing import conv_chain_model

    other = tmp_path / "other.onnx"
    onnx.save(conv_chain_model(seed=7), other)
    result = invoke("check", other, out)
    assert result.exit_code == 1 and "FAILED" in result.output


def test_inspect_json_lists_layers_and_host_nodes(chain_file, tmp_path):
    result = invoke("inspect", chain_file, "--json", "-", "--quiet")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert [l["op_type"] for l in data["layers"]][:2] == ["Conv", "Relu"]
    assert data["layers"][0]["gops"] == pytest.approx(2 * 16 * 16 * 9 * 8 * 8 / 1e9)
    assert {h["op_type"] for h in data["host_nodes"]} == {"TopK"}


@pytest.mark.parametrize("make_input, message", [
    (lambda p: None, "does not exist"),
    (lambda p: p.write_bytes(b""), "is empty"),
    (lambda p: p.write_bytes(b"\x08\x07garbage" * 50), "cannot read"),
])
def test_bad_input_gets_one_line_and_exit_2(tmp_path, make_input, message):
    src = tmp_path / "bad.onnx"
    make_input(src)
    out = tmp_path / "out.onnx"
    result = invoke("fuse", src, out)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


def test_refuses_to_overwrite_input(chain_file):
    before = digest(chain_file)
    result = invoke("fuse", chain_file, chain_file, "-s", "none")
    assert result.exit_code == 2 and "is the input file" in result.output
    assert digest(chain_file) == before


def test_unknown_strategy_and_missing_folder(chain_file, tmp_path):
    result = invoke("fuse", chain_file, tmp_path / "o.onnx", "-s", "bogus")
    assert result.exit_code == 2 and "unknown strategy 'bogus'" in result.output
    result = invoke("fuse", chain_file, tmp_path / "nowhere" / "o.onnx", "-s", "none")
    assert result.exit_code == 2 and "does not exist" in result.output


def test_zoo_command_builds_a_model(tmp_path):
    out = tmp_path / "lstm.onnx"
    assert invoke("zoo", "lstm", out, "--batch", "N", "-q").exit_code == 0
    model = onnx.load(out)
    assert model.graph.input[0].type.tensor_type.shape.dim[1].dim_param == "N"
    assert invoke("zoo", "nosuchnet", tmp_path / "x.onnx").exit_code == 2


def test_rewrite_command_reports_counts(tmp_path):
    src, out = tmp_path / "lstm.onnx", tmp_path / "lstm.rw.onnx"
    assert invoke("zoo", "lstm", src, "-q").exit_code == 0
    result = invoke("rewrite", src, out, "--only", "rnn", "--json", tmp_path / "rw.json")
    assert result.exit_code == 0, result.output
    assert "rnn: rewrote 2 nodes" in result.output
    ops = {n.op_type for n in onnx.load(out).graph.node}
    assert "LSTM" not in ops and "Gemm" in ops  # --only rnn leaves the Gemm head alone
    assert invoke("rewrite", src, out, "--only", "nope").exit_code == 2


def test_plan_then_fuse_with_the_plan_file(chain_file, tmp_path):
    plan_file, png = tmp_path / "plan.json", tmp_path / "plan.png"
    result = invoke("plan", chain_file, "-s", "none", "-o", plan_file, "--plot", png)
    assert result.exit_code == 0, result.output
    plan = json.loads(plan_file.read_text())
    assert plan["format"] == "onnxmlu-plan" and all(b["mp"] == 1 for b in plan["blocks"])
    assert png.stat().st_size > 5_000
    plan["blocks"] = [{"start": 0, "stop": 5, "mp": 2}, {"start": 5, "stop": len(plan["blocks"]), "mp": 8}]
    plan_file.write_text(json.dumps(plan))
    out = tmp_path / "fused.onnx"
    result = invoke("fuse", chain_file, out, "--plan", plan_file, "--json", "-", "-q")
    assert result.exit_code == 0, result.output
    assert [b["mp"] for b in json.loads(result.output)["blocks"]] == [2, 8]
    plan["blocks"][1]["mp"] = 99
    plan_file.write_text(json.dumps(plan))
    result = invoke("fuse", chain_file, out, "--plan", plan_file)
    assert result.exit_code == 2 and "mp=99" in result.output


def test_compare_and_hw_commands(chain_file, tmp_path):
    result = invoke("compare", chain_file, "--strategies", "all-fusion", "--json", "-", "-q",
                    "--plot", tmp_path / "c.png")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["networks"]["chain"]
    assert [r["strategy"] for r in rows] == ["none", "all-fusion"]
    assert rows[0]["speedup"] == 1.0 and rows[1]["sim_latency_us"] > 0
    assert (tmp_path / "c.png").stat().st_size > 5_000
    assert invoke("compare").exit_code == 2
    assert "mlu100" in invoke("hw", "list").output
    assert json.loads(invoke("hw", "show", "mlu100").output)["cores"] == 32
    assert invoke("hw", "show", "nosuch").exit_code == 2


def test_run_command_profiles_blocks(chain_file, tmp_path):
    fused = tmp_path / "fused.onnx"
    assert invoke("fuse", chain_file, fused, "-s", "all-fusion", "-q").exit_code == 0
    result = invoke("run", fused, "--repeat", "3", "--profile", "--json", tmp_path / "run.json",
                    "--save", tmp_path / "out.npz")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "run.json").read_text())
    assert [o["name"] for o in report["outputs"]] == ["pooled", "idx1"]
    blocks = [p for p in report["profile"] if p["op_type"] == "MLUFusionBlock"]
    assert len(blocks) == 2 and all(p["measured_us"] > 0 and p["sim_latency_us"] > 0 for p in blocks)
    import numpy as np

    assert set(np.load(tmp_path / "out.npz").files) == {"pooled", "idx1"}


# ---- progress on stderr ---------------------------------------------------------------------
@pytest.fixture
def terminal_stderr(monkeypatch):
    """Make the CLI believe stderr is an interactive terminal, so rich draws its progress."""
    from rich.console import Console

    import onnxmlu.cli as cli

    monkeypatch.setattr(cli, "err_console", Console(stderr=True, force_terminal=True, force_interactive=True, width=120))


def test_progress_goes_to_stderr_and_json_stdout_stays_clean(terminal_stderr, chain_file, tmp_path):
    result = invoke("fuse", chain_file, tmp_path / "f.onnx", "-s", "oracle", "--check", "--json", "-")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["schema"] == "onnxmlu.fuse/1"
    assert "saving f.onnx" in result.stderr and "check: running the reference and the fused model" in result.stderr
    result = invoke("zoo", "lstm,lstm", tmp_path / "models", "--json", "-")
    assert result.exit_code == 0, result.output
    assert [m["path"] for m in json.loads(result.stdout)["models"]] == [str(tmp_path / "models" / "lstm.onnx")] * 2
    assert "building lstm" in result.stderr and "2/2" in result.stderr


def test_quiet_hides_progress(terminal_stderr, chain_file, tmp_path):
    for args in (("fuse", chain_file, tmp_path / "f.onnx", "--check"),
                 ("plan", chain_file, "-s", "optimal", "--json", tmp_path / "plan.json"),
                 ("compare", chain_file, "--strategies", "oracle"),
                 ("zoo", "lstm,lstm", tmp_path / "models")):
        result = invoke(*args, "--quiet")
        assert result.exit_code == 0, result.output
        assert result.stderr == "" and result.stdout == "", args


def test_no_progress_when_stderr_is_not_a_terminal(chain_file, tmp_path):
    result = invoke("check", chain_file, chain_file, "--json", "-")
    assert result.exit_code == 0 and result.stderr == ""  # not even rich's closing blank line
    assert json.loads(result.stdout)["ok"] is True


def test_zoo_several_models_need_a_folder(tmp_path):
    result = invoke("zoo", "lstm,resnet18", tmp_path / "x.onnx")
    assert result.exit_code == 2 and "need a folder" in result.output
    result = invoke("zoo", "lstm,nosuch", tmp_path / "models")
    assert result.exit_code == 2 and "unknown zoo model 'nosuch'" in result.output


def test_version_flag_and_attribute():
    import onnxmlu

    result = invoke("--version")
    assert result.exit_code == 0 and result.output.strip() == f"onnxmlu {onnxmlu.__version__}"
    from importlib.metadata import version

    assert onnxmlu.__version__ == version("onnxmlu")


def test_the_console_width_is_read_when_it_prints_not_at_import(monkeypatch):
    import io

    from onnxmlu import cli as cli_module

    piped = cli_module._Console(file=io.StringIO())
    monkeypatch.setenv("COLUMNS", "61")  # a width the user set holds, on a pipe too
    assert piped.width == piped.options.max_width == 61
    monkeypatch.delenv("COLUMNS")  # a pipe: tables keep their natural width
    assert piped.width == piped.options.max_width == cli_module._PIPED_WIDTH
    piped.width = 70  # a width set on it holds
    assert piped.width == 70
