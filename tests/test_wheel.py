"""`pip install` of the wheel, as a user meets it: `make wheel`'s script builds the sdist and the
manylinux wheel (from that sdist), a fresh venv outside the source tree installs the wheel
(dependencies from the package index), and there `onnxmlu --version`, `onnxmlu zoo`,
`onnxmlu fuse --check` and a plain-onnxruntime run with onnxmlu.custom_ops_library()
registered all work. Marked ``wheel``: `make test` runs it after the parallel suite (a few
minutes: a build, a venv and pip)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

import onnxmlu

pytestmark = pytest.mark.wheel
ROOT = Path(__file__).resolve().parents[1]

PLAIN_ONNXRUNTIME = textwrap.dedent("""
    import numpy as np, onnx, onnxruntime as ort, onnxmlu
    from pathlib import Path
    library = onnxmlu.custom_ops_library()
    assert Path(library).is_relative_to(Path(onnxmlu.__file__).parent), library
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    fused = ort.InferenceSession("resnet18.fused.onnx", options, providers=["CPUExecutionProvider"])
    original = ort.InferenceSession("resnet18.onnx", providers=["CPUExecutionProvider"])
    got, want = fused.run(None, {"input": x})[0], original.run(None, {"input": x})[0]
    print(f"plain onnxruntime {ort.__version__} + {Path(library).name}: logits {list(got.shape)}, "
          f"max abs diff vs original {float(np.abs(got - want).max()):.2e}")
    np.testing.assert_allclose(got, want, atol=1e-3, rtol=1e-3)
""")


def run(args, cwd, env, timeout=900) -> str:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


VENDORED = "custom_ops/third_party/onnxruntime"
VENDORED_FILES = ("LICENSE", "include/onnxruntime_c_api.h", "include/onnxruntime_cxx_api.h",
                  "include/onnxruntime_cxx_inline.h", "include/onnxruntime_float16.h")


def test_the_header_lookup_needs_no_network(tmp_path):
    """A source tree (or unpacked sdist) with nothing else: the lookup answers with the vendored
    headers, before any system folder or download (no apt-get on PATH here)."""
    tree = tmp_path / "src"
    shutil.copytree(ROOT / VENDORED, tree / VENDORED)
    (tree / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "fetch_ort_headers.sh", tree / "scripts")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    found = subprocess.run(["bash", tree / "scripts" / "fetch_ort_headers.sh"], capture_output=True, text=True,
                           env=env, check=True).stdout.strip()
    assert found == str(tree / VENDORED / "include")
    with pytest.raises(FileNotFoundError):
        (tree / ".cache").stat()  # nothing was fetched


def test_wheel_installs_and_runs_in_a_fresh_venv(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "ONNXMLU_CUSTOM_OPS_LIBRARY", "PYTHONHOME")}
    dist = tmp_path / "dist"
    out = run(["bash", ROOT / "scripts" / "build_wheel.sh", dist], cwd=ROOT, env=env)
    print(out)
    [wheel] = dist.glob("*.whl")
    [sdist] = dist.glob("*.tar.gz")
    assert wheel.name.startswith(f"onnxmlu-{onnxmlu.__version__}-py3-none-manylinux_"), wheel.name
    assert wheel.name.endswith("_x86_64.whl") or wheel.name.endswith("_aarch64.whl"), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {"onnxmlu/_lib/libonnxmlu_ops.so", "onnxmlu/schemas/fuse.json", "onnxmlu/plan/perf/profiles/mlu100.json"} <= names
    with tarfile.open(sdist) as archive:
        members = {m.split("/", 1)[1] for m in archive.getnames() if "/" in m}
    assert {"custom_ops/CMakeLists.txt", "custom_ops/mlu_fusion_block.cc", "scripts/fetch_ort_headers.sh",
            "pyproject.toml"} <= members
    assert {f"{VENDORED}/{name}" for name in VENDORED_FILES} <= members  # the sdist builds offline

    work = tmp_path / "user"
    work.mkdir()
    venv = tmp_path / "venv"
    run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv], cwd=work, env=env)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel], cwd=work, env=env)
    version = run([bin_dir / "onnxmlu", "--version"], cwd=work, env=env)
    assert version.strip() == f"onnxmlu {onnxmlu.__version__}"
    location = run([python, "-c", "import onnxmlu; print(onnxmlu.__file__)"], cwd=work, env=env)
    assert Path(location.strip()).is_relative_to(venv), location  # the installed copy, not the checkout
    run([bin_dir / "onnxmlu", "zoo", "resnet18", "resnet18.onnx"], cwd=work, env=env)
    fused = run([bin_dir / "onnxmlu", "fuse", "resnet18.onnx", "resnet18.fused.onnx", "--check"], cwd=work, env=env)
    assert "check passed" in fused, fused
    print(run([python, "-c", PLAIN_ONNXRUNTIME], cwd=work, env=env))
