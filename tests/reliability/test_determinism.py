"""Determinism (issue 7, item 6): the same input and options give a byte-identical fused file.

Each fuse runs in its own process with a different PYTHONHASHSEED, so an order that depends
on set or dict iteration over strings (randomized per process) would show up as a difference.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

import rel_models as models
from onnxmlu.tools.testing import conv_chain_model

REPO = Path(__file__).resolve().parents[2]


def fuse_in_subprocess(src: Path, out: Path, hash_seed: int, *options: str) -> bytes:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED=str(hash_seed))
    proc = subprocess.run([sys.executable, "-m", "onnxmlu", "fuse", str(src), str(out), "-q", *options],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out.read_bytes()


def assert_deterministic(tmp_path: Path, model: onnx.ModelProto, *options: str) -> None:
    src = tmp_path / "model.onnx"
    src.write_bytes(model.SerializeToString())
    first = fuse_in_subprocess(src, tmp_path / "a.onnx", 1, *options)
    second = fuse_in_subprocess(src, tmp_path / "b.onnx", 2, *options)
    assert hashlib.sha256(first).hexdigest() == hashlib.sha256(second).hexdigest(), \
        f"fusing twice with {options} gave different files ({len(first)} and {len(second)} bytes)"


@pytest.mark.parametrize("strategy", ["all-fusion", "none", "dlfusion"])
def test_small_models_fuse_byte_identically(tmp_path, strategy):
    assert_deterministic(tmp_path, conv_chain_model(), "-s", strategy)


def test_mlp_with_a_forced_mp_fuses_byte_identically(tmp_path):
    assert_deterministic(tmp_path, models.mlp(), "-s", "dlfusion", "--mp", "4")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["all-fusion", "none"])
@pytest.mark.parametrize("name", ["resnet18", "lstm"])
def test_zoo_models_fuse_byte_identically(tmp_path, zoo, name, strategy):
    assert_deterministic(tmp_path, zoo(name, 1), "-s", strategy)
