"""The memory rule (README, "Memory"): no shape probe, and no run of ``check`` or ``fuse
--check``, allocates beyond the budget.

The model (``rel_models.attention_over_pixels``) runs self-attention over its pixels, so a run
at the 224 x 224 default of its symbolic H and W holds over 1.2 GB of scores; before the
budget, the default-size probe ran there whatever the host had (a 20 GB UNet was killed by the
OOM killer). Each fuse runs in a child process whose address space is capped too, so a
regression fails the test instead of taking the machine down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import rel_models as models
from onnxmlu.errors import OnnxMluError
from onnxmlu.frontend.memory import parse_size, probe_bound
from onnxmlu.frontend.shapes import probe_need

REPO = Path(__file__).resolve().parents[2]
#: The child's address space: room for Python, onnx and onnxruntime, not for a 224 x 224 run.
CHILD_ADDRESS_SPACE = 3 << 30
BUDGET = 512 << 20


def _cap() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE, CHILD_ADDRESS_SPACE))


def cli_child(*args: str) -> subprocess.CompletedProcess:
    """``onnxmlu ARGS`` in a child process whose address space is capped."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "onnxmlu", *args], capture_output=True, text=True, env=env,
                          timeout=300, preexec_fn=_cap)


def fuse_child(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    src, out = tmp_path / "unet.onnx", tmp_path / "unet.fused.onnx"
    onnx.save(models.attention_over_pixels(), src)
    return cli_child("fuse", str(src), str(out), *options)


@pytest.mark.skipif(sys.platform != "linux", reason="the child's cap is set with Linux's RLIMIT_AS")
def test_an_exploding_default_size_is_planned_smaller_within_the_budget(tmp_path):
    proc = fuse_child(tmp_path, "--max-memory", "512M", "--json", "-", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["memory"]["budget_bytes"] == BUDGET
    assert 0 < report["memory"]["peak_rss_bytes"] <= BUDGET, report["memory"]  # the whole process
    said = [d["message"] for d in report["diagnostics"] if d["rule"] == "default-shape"]
    assert len(said) == 1 and "more than the memory budget (512.0M" in said[0], report["diagnostics"]
    planned = said[0].split("it is planned at latent:")[1].split(":")[0]
    assert planned.startswith("1x4x") and int(planned.split("x")[2]) < 224, said[0]


@pytest.mark.skipif(sys.platform != "linux", reason="the child's cap is set with Linux's RLIMIT_AS")
def test_no_size_within_the_budget_is_one_line_naming_the_input(tmp_path):
    proc = fuse_child(tmp_path, "--max-memory", "1M")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "latent" in lines[0] and "--input-shape" in lines[0] and "memory budget (1.0M)" in lines[0], lines[0]
    assert not (tmp_path / "unet.fused.onnx").exists()


def _one_line_naming_the_input(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "latent" in lines[0] and "--input-shape" in lines[0] and "memory budget (512.0M)" in lines[0], lines[0]
    return lines[0]


#: At 160 x 160 a run of the model needs up to 628 MB (probe_need), over the 512M budget; at
#: 128 x 128 258 MB, and its check's other shapes (a batch of 2, H or W doubled) 516 MB to 1 GB.
@pytest.mark.skipif(sys.platform != "linux", reason="the child's cap is set with Linux's RLIMIT_AS")
def test_check_stops_with_one_line_where_its_first_shape_exceeds_the_budget(tmp_path):
    assert fuse_child(tmp_path, "--input-shape", "latent:1,4,32,32", "-q").returncode == 0
    proc = cli_child("check", str(tmp_path / "unet.onnx"), str(tmp_path / "unet.fused.onnx"),
                     "--input-shape", "latent:1,4,160,160", "--max-memory", "512M")
    assert "pinned shape (latent:1x4x160x160) needs up to 628.1M" in _one_line_naming_the_input(proc)


@pytest.mark.skipif(sys.platform != "linux", reason="the child's cap is set with Linux's RLIMIT_AS")
def test_check_skips_the_other_shapes_that_exceed_the_budget_and_says_so(tmp_path):
    assert fuse_child(tmp_path, "--input-shape", "latent:1,4,32,32", "-q").returncode == 0
    proc = cli_child("check", str(tmp_path / "unet.onnx"), str(tmp_path / "unet.fused.onnx"),
                     "--input-shape", "latent:1,4,128,128", "--max-memory", "512M", "--json", "-", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    shapes = json.loads(proc.stdout)["shapes"]
    assert shapes[0]["status"] == "ok" and shapes[0]["inputs"] == {"latent": [1, 4, 128, 128]}
    skipped = [s for s in shapes[1:] if s["status"] == "skipped"]
    assert len(skipped) == len(shapes) - 1 == 3, shapes
    assert all("more than the memory budget (512.0M, --max-memory)" in s["note"] for s in skipped), skipped


@pytest.mark.skipif(sys.platform != "linux", reason="the child's cap is set with Linux's RLIMIT_AS")
def test_fuse_check_stops_with_one_line_and_keeps_no_output(tmp_path):
    proc = fuse_child(tmp_path, "--input-shape", "latent:1,4,160,160", "--max-memory", "512M", "--check")
    _one_line_naming_the_input(proc)
    assert not (tmp_path / "unet.fused.onnx").exists()


def test_the_bound_covers_every_tensor_of_the_run():
    """probe_need at 64 x 64 is at least the bytes of every tensor the run makes, weights and feed."""
    model = models.attention_over_pixels()
    shapes = {"latent": [1, 4, 64, 64]}
    need = probe_need(model, shapes, None)
    names = [o for node in model.graph.node for o in node.output]
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names[:-1])
    session = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    made = sum(v.nbytes for v in session.run(names, {"latent": np.zeros(shapes["latent"], np.float32)}))
    weights = sum(onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    assert need is not None and need >= made + weights + 4 * 64 * 64 * 4, (need, made)
    assert need < 8 * (made + weights), "a bound this loose would refuse sizes that fit"


def test_a_tensor_inference_cannot_size_leaves_the_run_unbounded():
    """A NonZero's length is read from data: no bound, so such a run is only ever capped."""
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("NonZero", ["x"], ["nz"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [onnx.helper.make_tensor_value_info("nz", onnx.TensorProto.INT64, None)]))
    inferred = onnx.shape_inference.infer_shapes(model)
    assert probe_bound(inferred, 0, 16) is None


@pytest.mark.parametrize("text, value", [("4G", 4 << 30), ("512M", 512 << 20), ("1.5G", 3 << 29),
                                         ("2GiB", 2 << 30), ("1048576", 1 << 20), ("64m", 64 << 20)])
def test_max_memory_reads_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "4X", "G", "-1G", "100K"])
def test_max_memory_refuses_what_is_not_a_usable_size(text):
    with pytest.raises(OnnxMluError, match="--max-memory"):
        parse_size(text)
