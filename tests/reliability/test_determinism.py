"""Determinism: the same input and options give a byte-identical fused file.

Each fuse runs in its own process with a different PYTHONHASHSEED, so an order that depends
on set or dict iteration over strings (randomized per process) would show up as a difference.
The second process also runs in another working directory, reads the model by a relative
path and may use one CPU only (thread pools sized by the CPUs it sees).

Models with symbolic dims that onnxruntime's symbolic shape inference merges are the case it
names by rule (:mod:`onnxmlu.frontend.symbolic`): one built here (``rel_models.merged_dims``,
whose merged dims, named in string-hash order before, differed between these two seeds) and
the corpus models where a ``dim_param`` name differed between seeds (a spox-exported VAD with
LSTMs inside ``If`` branches, a quantized OCR model).
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
sys.path.insert(0, str(REPO / "tests" / "realworld"))
import corpus  # noqa: E402
from ci import unavailable  # noqa: E402


def fuse_in_subprocess(src: Path, out: Path, hash_seed: int, *options: str, cwd: Path | None = None,
                       one_cpu: bool = False) -> bytes:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED=str(hash_seed))
    pin = (lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})) if one_cpu and hasattr(
        os, "sched_setaffinity") else None
    proc = subprocess.run([sys.executable, "-m", "onnxmlu", "fuse", str(src), str(out), "-q", *options],
                          capture_output=True, text=True, env=env, timeout=1200, cwd=cwd, preexec_fn=pin)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return (cwd / out if cwd else out).read_bytes()


def assert_deterministic(tmp_path: Path, model: onnx.ModelProto | Path, *options: str) -> None:
    """Fused under hash seeds 2 and 3; the second in another directory, by a relative path, on one CPU."""
    src = tmp_path / "model.onnx"
    if isinstance(model, Path):
        src.symlink_to(model)
    else:
        src.write_bytes(model.SerializeToString())
    first = fuse_in_subprocess(src, tmp_path / "a.onnx", 2, *options)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    second = fuse_in_subprocess(Path("..") / src.name, Path("b.onnx"), 3, *options, cwd=elsewhere, one_cpu=True)
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


def test_dims_the_symbolic_inference_merges_fuse_byte_identically(tmp_path):
    assert_deterministic(tmp_path, models.merged_dims())


def test_a_merged_dim_takes_the_name_the_model_gives_it():
    """``p_i`` (the model's name) and the name onnxruntime makes up for ``y_i``'s unnamed dim are
    one dim: it is called ``p_i``, in the outputs and inside the If branches."""
    from onnxmlu import api
    from onnxmlu.ir import iter_graphs

    fused = api.fuse(models.merged_dims()).model
    declared = {vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
                for g in iter_graphs(fused.graph) for vi in (*g.value_info, *g.output) if vi.name[0] in "oz"}
    for i in range(3):
        assert declared[f"z{i}"] == ["N", f"p{i}"]
        assert declared[f"o{i}t"] == declared[f"o{i}e"] == ["N", f"p{i}"], declared


@pytest.mark.realworld
@pytest.mark.parametrize("case", [c for c in corpus.MODELS if c.id in ("silero_v6", "ddddocr_common")],
                         ids=lambda c: c.id)
def test_corpus_models_with_merged_dims_fuse_byte_identically(tmp_path, case):
    try:
        src = corpus.model_path(case)
    except corpus.FetchError as error:
        unavailable(str(error))
    assert_deterministic(tmp_path, src, *case.shape_args())
