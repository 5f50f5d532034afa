"""``fuse --precision auto`` picks the same plan on every host from the same data: auto's
evaluation of a model whose INT8 trials saturate onnxruntime's u8 x s8 kernels where they can
(auto_plan_check.py) is run here and under ``qemu-x86_64 -cpu Skylake-Client`` (AVX2, no VNNI),
and the two must agree: the plan exactly, every accuracy auto measured to float rounding (the
FP32 layers' kernels differ between the CPUs in their summation order, which can move one
value across a rounding boundary of the INT8 layer after it: a top-1 row or two).

The same process also evaluates with the package's sessions made as on a CPU whose default
kernels are exact (no ``session.x64quantprecision``): under the emulation that evaluation must
differ, or the comparison could not fail there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from ci import unavailable
from auto_plan_check import evaluation

HERE = Path(__file__).resolve().parent
#: Tolerances of the measured figures (module docstring): cosine-based ones, top-1 agreement.
COSINE_TOL, TOP1_TOL = 1e-6, 2e-3


def _figures(node, path: str = ""):
    """(path, value) of every number in an evaluation's JSON."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _figures(value, f"{path}/{key}")
    elif isinstance(node, list):
        for k, value in enumerate(node):
            yield from _figures(value, f"{path}[{k}]")
    elif isinstance(node, float):
        yield path, node


def _differences(here: dict, there: dict) -> list[str]:
    said = [f"plan {here['plan']} here, {there['plan']} there"] if here["plan"] != there["plan"] else []
    a, b = dict(_figures(here)), dict(_figures(there))
    if a.keys() != b.keys():
        return [*said, f"measured {sorted(a.keys() ^ b.keys())} on one host only"]
    for path, value in a.items():
        tol = TOP1_TOL if path.endswith("top1") else COSINE_TOL
        if not abs(value - b[path]) <= tol:  # NaN (no class axis) on both is equal
            said += [] if value != value and b[path] != b[path] else [f"{path}: {value} here, {b[path]} there"]
    return said


def test_auto_picks_the_same_plan_on_an_emulated_cpu_without_vnni(library):
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        unavailable("qemu-x86_64 is not installed (Debian: apt-get install qemu-user)")
    done = subprocess.run([qemu, "-cpu", "Skylake-Client", sys.executable, str(HERE / "auto_plan_check.py")], cwd=HERE,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    there = json.loads(done.stdout.strip().splitlines()[-1])
    here = evaluation()
    assert _differences(here, there["inexact"]), "the emulated CPU's default kernels did not change the evaluation"
    assert not _differences(here, there["exact"]), _differences(here, there["exact"])
