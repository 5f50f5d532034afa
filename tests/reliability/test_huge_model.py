"""Huge models (issue 7, item 5): above 2 GB, weights in external data, blocks split under the
single-body limit; and the splitter itself, on a normal model with a tiny limit.

The slow test builds a 2.25 GiB model on disk (huge_model.py), fuses it with the CLI in a child
process (measuring time and peak RSS), checks that the fused model keeps its weights — the block
bodies — in one external data file, loads and runs it in onnxruntime with the library, and
compares with the original. It needs about 5 GB of free disk and 16 GB of free memory.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

import rel_models as models
from onnxmlu import api, runtime
from onnxmlu.plan import planner
from onnxmlu.plan.plan import Block, Plan, split_oversized_blocks
from onnxmlu.plan.perf.layers import Layer
from onnxmlu.schema import is_fusion_block

REPO = Path(__file__).resolve().parents[2]
MAX_PROTO_BYTES = 2**31 - 1


# --- the splitter ------------------------------------------------------------------------------


def _layers(weights):
    return [Layer(i, f"l{i}", "MatMul", "fc", 1e6, weight_bytes=w) for i, w in enumerate(weights)]


@pytest.mark.parametrize("weights, limit, expected", [
    ([10, 10, 10, 10], 25, [(0, 2), (2, 4)]),
    ([10, 10, 10, 10], 40, [(0, 4)]),
    ([30, 5, 5, 30], 25, [(0, 1), (1, 3), (3, 4)]),  # a layer above the limit stays alone
    ([0, 0, 50, 0], 10, [(0, 2), (2, 4)]),
])
def test_split_oversized_blocks(weights, limit, expected):
    layers = _layers(weights)
    plan = Plan((Block(0, 4, 8),), "all-fusion", "mlu100")
    split = split_oversized_blocks(plan, layers, limit)
    assert [(b.start, b.stop) for b in split.blocks] == expected
    assert {b.mp for b in split.blocks} == {8} and split.strategy == "all-fusion"
    split.validate(layers, 32)


def test_split_keeps_a_plan_that_fits_as_it_is():
    layers = _layers([10, 10, 10])
    plan = Plan((Block(0, 1, 2), Block(1, 3, 4)))
    assert split_oversized_blocks(plan, layers, 20) is plan


def test_fuse_splits_blocks_over_the_body_limit(monkeypatch, library):
    """A tiny limit on a normal model: more blocks, same MP, same numbers."""
    original = models.mlp(widths=(64, 128, 128, 128, 32))
    whole = api.fuse(original, strategy="all-fusion", mp=4)
    assert len(whole.plan.blocks) == 1
    monkeypatch.setattr(planner, "BODY_WEIGHT_LIMIT_BYTES", 70_000)  # one 128x128 float weight is 65,536 bytes
    split = api.fuse(original, strategy="all-fusion", mp=4)
    assert len(split.plan.blocks) > 1 and {b.mp for b in split.plan.blocks} == {4}
    for block in split.plan.blocks:
        assert sum(l.weight_bytes for l in block.layers(split.analysis.layers)) <= 70_000
    blocks = [n for n in split.model.graph.node if is_fusion_block(n)]
    assert len(blocks) == len(split.plan.blocks)
    x = {"x": np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)}
    want = runtime.reference_session(original).run(None, x)[0]
    got = runtime.InferenceSession(split.model).run(None, x)[0]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_save_model_external_data_on_request(tmp_path, library):
    fused = api.fuse(models.mlp(), strategy="all-fusion").model
    path = api.save_model(fused, tmp_path / "m.onnx", external_data=True)
    stored = onnx.load(path, load_external_data=False)
    body = next(a for a in stored.graph.node[0].attribute if a.name == "body")
    assert body.t.data_location == onnx.TensorProto.EXTERNAL  # convert_attribute moved the body out
    x = {"x": np.ones((1, 64), np.float32)}
    np.testing.assert_allclose(runtime.InferenceSession(path).run(None, x)[0],
                               runtime.InferenceSession(fused).run(None, x)[0], rtol=0, atol=0)


# --- a model above 2 GB ------------------------------------------------------------------------


def _resources_or_skip(folder: Path) -> None:
    free_disk = shutil.disk_usage(folder).free
    with open("/proc/meminfo") as meminfo:
        available = next(int(l.split()[1]) * 1024 for l in meminfo if l.startswith("MemAvailable:"))
    if free_disk < 6 * 2**30 or available < 16 * 2**30:
        pytest.skip(f"needs 6 GiB of disk and 16 GiB of memory (have {free_disk / 2**30:.1f} / {available / 2**30:.1f})")


def _fuse_in_child(src: Path, out: Path) -> tuple[float, float, str]:
    """Fuse with the CLI in a child process; (seconds, peak RSS in GiB, output)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "onnxmlu", "fuse", str(src), str(out), "-s", "all-fusion"],
                          capture_output=True, text=True, env=env, timeout=1800)
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak >= before
    return seconds, peak / 2**20, proc.stdout


@pytest.mark.slow
def test_model_above_2gb_fuses_to_external_data_and_matches(tmp_path, library):
    from huge_model import build

    _resources_or_skip(tmp_path)
    src, out = tmp_path / "huge.onnx", tmp_path / "huge.fused.onnx"
    data_bytes = build(src, matrices=9)
    assert data_bytes > MAX_PROTO_BYTES

    seconds, peak_gib, output = _fuse_in_child(src, out)
    fused_data = out.with_name(out.name + ".data")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([src.name, src.name + ".data", out.name, fused_data.name])
    assert out.stat().st_size < 2**20 and fused_data.stat().st_size > MAX_PROTO_BYTES

    stored = onnx.load(out, load_external_data=False)
    blocks = [n for n in stored.graph.node if is_fusion_block(n)]
    assert len(blocks) >= 2, "the one all-fusion block must have been split under the body limit"
    assert len({next(a.i for a in n.attribute if a.name == "mp") for n in blocks}) == 1
    for node in blocks:
        body = next(a for a in node.attribute if a.name == "body")
        assert body.t.data_location == onnx.TensorProto.EXTERNAL
        length = int(next(e.value for e in body.t.external_data if e.key == "length"))
        assert length <= MAX_PROTO_BYTES

    x = {"x": np.random.default_rng(0).standard_normal((1, 8192)).astype(np.float32)}
    reference = runtime.reference_session(src)
    want = reference.run(None, x)[0]
    del reference
    started = time.perf_counter()
    session = runtime.InferenceSession(out)
    load_seconds = time.perf_counter() - started
    got = session.run(None, x)[0]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    print(f"\nhuge model: {data_bytes / 2**30:.2f} GiB of weights, {len(blocks)} blocks; fuse {seconds:.0f} s, "
          f"peak RSS {peak_gib:.1f} GiB; fused data {fused_data.stat().st_size / 2**30:.2f} GiB; "
          f"fused session created in {load_seconds:.0f} s; max |diff| {np.abs(got - want).max():.2g}")
