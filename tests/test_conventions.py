"""The conventions of the field: ``-q`` and ``-v`` on either side of any command, help without
type noise or braces, tables that fit 80 columns without cutting a number, no onnxruntime log
line unless asked for (``-v``), and progress that counts, with an ETA."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import typer
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnxmlu import api
from onnxmlu.cli import Steps, app, main

runner = CliRunner()


def run_main(monkeypatch, capsys, *args) -> tuple[int, str]:
    """``onnxmlu ARGS`` as the console script runs it (global flags hoisted): exit code, stdout."""
    monkeypatch.setattr(sys, "argv", ["onnxmlu", *map(str, args)])
    with pytest.raises(SystemExit) as stop:
        main()
    return stop.value.code, capsys.readouterr().out


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_on_either_side_of_the_command(tmp_path, chain_model, monkeypatch, capsys, where):
    src = tmp_path / "m.onnx"
    onnx.save(chain_model, src)
    args = ["fuse", src, tmp_path / "f.onnx"]
    code, out = run_main(monkeypatch, capsys, *(["-q", *args] if where == "before" else [*args, "-q"]))
    assert code == 0 and out == "" and (tmp_path / "f.onnx").exists()
    code, out = run_main(monkeypatch, capsys, "inspect", src, "-v")  # -v after the command, too
    assert code == 0 and "accelerator layers" in out
    assert runner.invoke(app, ["-q", "inspect", str(src)]).output == ""  # the group's own -q


def test_help_names_arguments_plainly_and_flags_without_a_type():
    group = typer.main.get_command(app)
    for name in group.commands:
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "120"})
        assert result.exit_code == 0, result.output
        assert "<bool>" not in result.output and "{" not in result.output.splitlines()[1], result.output
    usage = runner.invoke(app, ["fuse", "--help"], env={"COLUMNS": "120"}).output
    assert "Usage: onnxmlu fuse [OPTIONS] MODEL OUTPUT" in usage and "NAME:DIMS" in usage


def test_help_keeps_a_paragraph_one_paragraph():
    """A docstring's line breaks are the source's: in the command list they broke sentences
    mid-line (``one other size`` / ``of``)."""
    for name, command in typer.main.get_command(app).commands.items():
        first = (command.help or "").split("\n\n")[0]
        assert "\n" not in first, f"{name}: {first!r}"


def long_names_model() -> onnx.ModelProto:
    """Three Convs with torch-style names that share their first 15 characters."""
    nodes, weights, x = [], [], "input"
    for i in range(3):
        w = f"w{i}"
        weights.append(numpy_helper.from_array(np.zeros((64, 64 if i else 3, 3, 3), np.float32), w))
        nodes.append(helper.make_node("Conv", [x, w], [f"c{i}"], pads=[1, 1, 1, 1],
                                      name=f"/layer{i}/layer{i}.0/conv{i}/Conv_with_a_long_torch_name_{i}"))
        x = f"c{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 112, 112])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cli(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "onnxmlu", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_tables_fit_80_columns_without_cutting_a_number(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(long_names_model(), src)
    done = cli("inspect", src, env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines and max(len(line) for line in lines) <= 80, done.stdout
    rows = [line for line in lines if "Conv" in line]
    assert len(rows) == 3 and all(n in rows[1] for n in ("0.9248", "112×112", "3136", "144")), done.stdout
    assert all(row.split()[1].endswith(f"name_{i}") and "…" in row for i, row in enumerate(rows)), done.stdout


def refused_batch_model() -> onnx.ModelProto:
    """x [N, 48] reshaped to [1, 48]: only N = 1 runs, so check's other batch is refused; a
    constant Mul gives the folder something to fold first."""
    inits = [numpy_helper.from_array(np.ones((48, 16), np.float32), "W"),
             numpy_helper.from_array(np.array([1, 48], np.int64), "s"),
             numpy_helper.from_array(np.array([2.0], np.float32), "a")]
    nodes = [helper.make_node("Mul", ["a", "a"], ["aa"]), helper.make_node("Reshape", ["x", "s"], ["r"]),
             helper.make_node("Mul", ["r", "aa"], ["r2"]), helper.make_node("MatMul", ["r2", "W"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 48])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_no_onnxruntime_log_line_without_verbose(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(refused_batch_model(), src)
    quiet = cli("fuse", src, tmp_path / "f.onnx", "--check")
    assert quiet.returncode == 0, quiet.stderr
    assert "the original refuses it" in quiet.stdout and "[E:onnxruntime" not in quiet.stderr, quiet.stderr
    loud = cli("fuse", src, tmp_path / "f.onnx", "--check", "-v")
    assert "[E:onnxruntime" in loud.stderr


class Recorder(Steps):
    """The CLI's display, recording each line it would draw."""

    def __init__(self) -> None:
        super().__init__(tally=True)
        self.lines: list[str] = []

    def _show(self) -> None:
        self.lines.append(self._text + self.count_text())


def test_auto_counts_its_trials_with_an_eta(chain_model):
    shown = Recorder()
    api.fuse(chain_model, precision="auto", progress=shown)
    trials = [line for line in shown.lines if line.startswith("auto: sensitivity trials")]
    assert trials and trials[-1].split(" · ")[1:] == [trials[-1].split(" · ")[1], "ETA 0:00"], trials
    done, total = trials[-1].split(" · ")[1].split("/")
    assert done == total and int(total) >= 2
    assert any(line.endswith("1 so far") for line in shown.lines if line.startswith("auto: plans run"))
