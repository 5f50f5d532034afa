"""ONNX backend node test data (a peer's test suite), fetched once from the onnx 1.22.0 wheel.

The onnx wheel in the venv ships without ``backend/test/data``; the 1.22.0 wheel still has it.
``pip download`` fetches the wheel into ``<repo>/.cache/onnx-backend-1.22.0`` (gitignored) and all
node-test directories are unpacked to ``node/`` next to it, once; concurrent test runs are safe (unpack into a
temporary directory, then an atomic rename). Use :func:`backend_root` to get the directory
(``None`` plus a reason when pip cannot reach the index) and :func:`load_case` for one case.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ONNX_VERSION = "1.22.0"
REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache" / f"onnx-backend-{ONNX_VERSION}"
NODE_DIR = CACHE_DIR / "node"
NODE_PREFIX = "onnx/backend/test/data/node/"

# Every node-test directory of onnx 1.22.0 for the rewritten families (layout 1 = *_batchwise).
FAMILIES: dict[str, tuple[str, ...]] = {
    "bn": (
        "test_batchnorm_epsilon",
        "test_batchnorm_epsilon_training_mode",
        "test_batchnorm_example",
        "test_batchnorm_example_training_mode",
    ),
    "gemm": (
        "test_gemm_all_attributes",
        "test_gemm_alpha",
        "test_gemm_beta",
        "test_gemm_default_matrix_bias",
        "test_gemm_default_no_bias",
        "test_gemm_default_scalar_bias",
        "test_gemm_default_single_elem_vector_bias",
        "test_gemm_default_vector_bias",
        "test_gemm_default_zero_bias",
        "test_gemm_transposeA",
        "test_gemm_transposeB",
    ),
    "lstm": (
        "test_lstm_batchwise",
        "test_lstm_defaults",
        "test_lstm_with_initial_bias",
        "test_lstm_with_peepholes",
    ),
    "gru": (
        "test_gru_batchwise",
        "test_gru_defaults",
        "test_gru_seq_length",
        "test_gru_with_initial_bias",
    ),
    "rnn": (
        "test_rnn_seq_length",
        "test_simple_rnn_batchwise",
        "test_simple_rnn_defaults",
        "test_simple_rnn_with_initial_bias",
    ),
}
MARKER = ".complete"  # written last; its content says what was unpacked
MARKER_TEXT = f"onnx {ONNX_VERSION}: all node tests"


@dataclass
class BackendCase:
    """One node-test directory: the model and its (inputs, expected outputs) data sets."""

    name: str
    model: onnx.ModelProto
    datasets: list[tuple[list[np.ndarray], list[np.ndarray]]]

    @property
    def input_names(self) -> list[str]:
        inits = {i.name for i in self.model.graph.initializer}
        return [i.name for i in self.model.graph.input if i.name not in inits]


def _download_wheel() -> tuple[Path | None, str]:
    wheels = sorted(CACHE_DIR.glob(f"onnx-{ONNX_VERSION}-*.whl"))
    if wheels:
        return wheels[0], ""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", f"onnx=={ONNX_VERSION}",
        "--only-binary=:all:", "--disable-pip-version-check", "--timeout", "30", "-d", str(CACHE_DIR),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wheels = sorted(CACHE_DIR.glob(f"onnx-{ONNX_VERSION}-*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"pip could not download onnx=={ONNX_VERSION}: {tail[0]}"
    return wheels[0], ""


def _extract(wheel: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="node-", dir=CACHE_DIR))
    try:
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                if not member.startswith(NODE_PREFIX):
                    continue
                if member.endswith("/"):
                    continue
                target = tmp / member[len(NODE_PREFIX) :]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(member))
        (tmp / MARKER).write_text(MARKER_TEXT)
        os.chmod(tmp, 0o755)
        if NODE_DIR.exists() and not _complete():  # an older partial unpack: replace it
            stale = Path(tempfile.mkdtemp(prefix="stale-", dir=CACHE_DIR))
            try:
                os.rename(NODE_DIR, stale / "node")
            except OSError:
                pass
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, NODE_DIR)
        except OSError:  # another run finished first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _complete() -> bool:
    marker = NODE_DIR / MARKER
    return marker.exists() and marker.read_text() == MARKER_TEXT


def backend_root() -> tuple[Path | None, str]:
    """The unpacked node-test directory (all ~1,800 cases, ~11 MB), or (None, why) when the
    wheel cannot be fetched."""
    if _complete():
        return NODE_DIR, ""
    wheel, why = _download_wheel()
    if wheel is None:
        return None, why
    _extract(wheel)
    return NODE_DIR, ""


def load_case(root: Path, name: str) -> BackendCase:
    case_dir = root / name
    model = onnx.load(str(case_dir / "model.onnx"))
    datasets = []
    for data_dir in sorted(case_dir.glob("test_data_set_*")):
        arrays = []
        for kind in ("input", "output"):
            files = sorted(data_dir.glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
            arrays.append([numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files])
        datasets.append((arrays[0], arrays[1]))
    return BackendCase(name, model, datasets)
