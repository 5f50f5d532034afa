"""make demo: build the zoo ResNet-18, fuse it, check it, and time original vs fused.

Everything goes through the ``onnxmlu`` command line, as a user would type it; the last
step times both models side by side in onnxruntime.
"""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from onnxmlu.sessions import new_options
from onnxmlu import InferenceSession
from onnxmlu.cli import app
from onnxmlu.frontend.load import load_model
from onnxmlu.tools.timing import plain_session, time_in_turns
from onnxmlu.tools.verify import random_inputs


def onnxmlu(*args: str) -> None:
    print(f"\n$ onnxmlu {shlex.join(args)}", flush=True)
    app(list(args), standalone_mode=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("out"))
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--strategy", default="dlfusion")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    original, fused = args.out / f"{args.model}.onnx", args.out / f"{args.model}.fused.onnx"
    onnxmlu("zoo", args.model, str(original))
    onnxmlu("fuse", str(original), str(fused), "--strategy", args.strategy, "--check")
    print_latency(original, fused)


def print_latency(original: Path, fused: Path) -> None:
    threads = min(2, os.cpu_count() or 1)
    options = new_options()
    options.intra_op_num_threads = threads  # the fused side gets the same budget as the original
    sessions = {
        "original (onnxruntime)": plain_session(original, threads),
        "fused (onnxmlu.InferenceSession)": InferenceSession(str(fused), options),
    }
    feeds = random_inputs(load_model(original), seed=0)
    timings = time_in_turns(sessions, feeds, rounds=6, chunk=5)  # each session's pool spins only into its own runs
    print(f"\nCPU latency in onnxruntime, {threads} threads, median of 30 runs timed in turns:")
    for name, t in timings.items():
        print(f"  {name:34s} {t.median_ms:8.2f} ms  (min {t.min_ms:.2f}, max {t.max_ms:.2f})")
    base, fused_t = (t.median_ms for t in timings.values())
    print(f"  fused / original = {fused_t / base:.3f}")


if __name__ == "__main__":
    main()
