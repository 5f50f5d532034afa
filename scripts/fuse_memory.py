"""Peak memory of ``onnxmlu fuse`` on the big zoo models, as a multiple of the model's size.

    python scripts/fuse_memory.py                                  # vgg19 and alexnet, 3 runs
    python scripts/fuse_memory.py --before-src /tmp/old-checkout   # interleaved with an older tree

Each run is a fresh interpreter running what ``onnxmlu fuse`` runs (``api.fuse_to_file``, dlfusion;
scripts/bench.py's worker), which reads its own peak resident set (``VmHWM``) as it ends:
``ru_maxrss`` of a child would also count the parent's RSS at fork. The models are built once by
``onnxmlu zoo`` in a child, so this process never holds one. Target (issue: peak memory): ≤ 2×.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts")]

import bench  # noqa: E402

TARGET = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["vgg19", "alexnet"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before-src", help="a checkout whose onnxmlu runs as 'onnxmlu@before', interleaved")
    args = parser.parse_args()
    tools = ["onnxmlu"] + (["onnxmlu@before"] if args.before_src else [])
    before = str(Path(args.before_src).resolve()) if args.before_src else None
    rows = []
    with tempfile.TemporaryDirectory(prefix="onnxmlu-memory-") as tmp:
        for name in args.models:
            src = Path(tmp, f"{name}.onnx")
            subprocess.run([sys.executable, "-m", "onnxmlu", "zoo", name, str(src), "-q"], check=True)
            size = bench.mib(bench.model_bytes(src))
            peaks: dict[str, list[float]] = {t: [] for t in tools}
            for r in range(args.runs):
                for tool in tools[r % len(tools):] + tools[:r % len(tools)]:
                    run = bench.run_child(tool, src, before_src=before)
                    if run.error:
                        raise SystemExit(f"{tool} on {name}: {run.error}")
                    peaks[tool].append(run.rss_mib)
                    print(f"  {name} {tool} run {r + 1}: {run.rss_mib:.0f} MiB, {run.wall_s:.1f} s", flush=True)
            for tool, values in peaks.items():
                peak = statistics.median(values)
                rows.append((name, f"{size:.0f}", tool, f"{peak:.0f} ({min(values):.0f}–{max(values):.0f})",
                             f"{peak / size:.2f}", bench.verdict(peak / size <= TARGET)))
    print(bench.table(("model", "MiB", "tool", "peak RSS MiB (min–max)", "peak ÷ size", f"≤ {TARGET:g}×"), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
