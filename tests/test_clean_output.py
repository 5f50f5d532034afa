"""Clean output: onnxruntime's logger is quiet unless --verbose, tables keep their width when
piped, the check's per-row column does not contradict a budget's verdict, optional
dependencies are checked before any work, and -h, -V/--version, -v/--verbose and --debug are
accepted on every command (before or after its name)."""

from __future__ import annotations

import os
import subprocess
import sys

import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from onnxmlu import api
from onnxmlu.cli import app, hoist_global_flags
from onnxmlu.errors import OnnxMluError
from onnxmlu.tools.testing import conv_chain_model
from runtime_helpers import block_node, fused_model, vi
from runtime_helpers import body_model as make_body


def onnxmlu(*args, cwd=None, env=None):
    """The installed command line in a fresh process, stdout and stderr piped (not a terminal)."""
    return subprocess.run([sys.executable, "-m", "onnxmlu", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=env)


@pytest.fixture
def chain_file(tmp_path):
    path = tmp_path / "chain.onnx"
    onnx.save(conv_chain_model(), path)
    return path


@pytest.fixture
def refused_file(tmp_path):
    """A fused model onnxruntime refuses at session creation (a body with external data)."""
    w = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    w.external_data.add(key="location", value="w.bin")
    body = make_body([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", TensorProto.FLOAT, [4])],
                     [vi("y", TensorProto.FLOAT, [4])], [w])
    model = fused_model([block_node("blk", ["x"], ["y"], body, mp=1)], [vi("x", TensorProto.FLOAT, [4])],
                        [vi("y", TensorProto.FLOAT, [4])])
    path = tmp_path / "refused.onnx"
    onnx.save(model, path)
    return path


def test_onnxruntime_logs_only_with_verbose(library, refused_file):
    quiet = onnxmlu("run", refused_file)
    assert quiet.returncode == 2
    assert quiet.stderr.splitlines() == [line for line in quiet.stderr.splitlines() if line.startswith("error:")]
    assert len(quiet.stderr.splitlines()) == 1 and "body refers to a file" in quiet.stderr
    loud = onnxmlu("run", refused_file, "--verbose")
    assert loud.returncode == 2 and "onnxruntime" in loud.stderr.split("error:")[0]  # its own log line, first


def test_global_flags_work_after_the_command_name(chain_file, tmp_path):
    assert hoist_global_flags(["fuse", "a", "b", "--debug", "-v", "--", "--debug"]) == \
        ["--debug", "-v", "fuse", "a", "b", "--", "--debug"]
    version = onnxmlu("-V")
    assert version.returncode == 0 and version.stdout.startswith("onnxmlu ")
    for command in ("fuse", "check", "run", "inspect", "zoo", "plan", "compare", "rewrite", "view"):
        shown = onnxmlu(command, "-h")
        assert shown.returncode == 0 and "Usage:" in shown.stdout, (command, shown.stderr)
    debug = onnxmlu("fuse", tmp_path / "missing.onnx", tmp_path / "x.onnx", "--debug")
    assert "Traceback" in debug.stderr and "does not exist" in debug.stderr  # --debug: the traceback
    verbose = onnxmlu("inspect", chain_file, "-v", "-q")
    assert verbose.returncode == 0, verbose.stderr


def test_tables_keep_their_width_when_piped(chain_file):
    unset = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # a width set (COLUMNS=80) holds: not here
    shown = onnxmlu("inspect", chain_file, "--rewrite", env=unset)
    assert shown.returncode == 0 and "…" not in shown.stdout
    assert max(len(line) for line in shown.stdout.splitlines()) > 80  # wider than rich's default


def test_the_per_row_column_follows_a_budget(library, tmp_path, chain_file):
    fused = tmp_path / "int8.onnx"
    onnx.save(api.fuse(conv_chain_model(), precision="int8").model, fused)
    result = CliRunner().invoke(app, ["check", str(chain_file), str(fused), "--accuracy", "cosine>=0.5"])
    report = api.check(chain_file, fused, accuracy="cosine>=0.5")
    assert report.ok and not all(d.ok for d in report.diffs)  # the budget passes where the tolerances do not
    assert result.exit_code == 0 and "check passed" in result.stdout
    assert "NO" not in result.stdout and "within tol" in result.stdout


def test_a_missing_plot_dependency_fails_before_any_work(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    said = []
    with pytest.raises(OnnxMluError, match="plots need matplotlib"):
        api.compare(zoo=True, plot=tmp_path / "p.png", progress=said.append)
    with pytest.raises(OnnxMluError, match="plots need matplotlib"):
        api.plan(conv_chain_model(), plot=tmp_path / "p.png", progress=said.append)
    assert said == [] and not (tmp_path / "p.png").exists()


def test_a_missing_netron_fails_before_the_model_is_read(monkeypatch, tmp_path):
    import importlib.util

    from onnxmlu.tools import view

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "netron" else real(name, *a))
    monkeypatch.setattr(view, "explode", lambda model: pytest.fail("the model was exploded first"))
    with pytest.raises(OnnxMluError, match="viewing needs netron"):
        api.view(tmp_path / "missing.onnx", explode=True, browse=False)
