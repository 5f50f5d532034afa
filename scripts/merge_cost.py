"""What the merge pass (onnxmlu/runtime/merge.py) costs at session creation, before and after a
change, timed in turns in one process (default: ResNet-50, dlfusion, batch 8).

    python scripts/merge_cost.py --before /tmp/before/onnxmlu/runtime/merge.py
    python scripts/merge_cost.py --before OLD_MERGE.py --model mobilenetv2 --batch 1 --turns 9

``--before`` is an older ``merge.py`` (e.g. ``git show REV:onnxmlu/runtime/merge.py > FILE``),
loaded as a module of its own beside this tree's package; each turn creates one
``onnxmlu.InferenceSession`` with each pass and times each pass alone on a fresh copy of the
fused model. Medians and minimums are printed with the machine's load average (a shared
machine's figures move with it: compare the two columns of one run, not runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from pathlib import Path

import onnx

import onnxmlu
from onnxmlu import api
from onnxmlu.runtime import session
from onnxmlu.tools.zoo import build_model


def _load(path: str):
    spec = importlib.util.spec_from_file_location("merge_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.merge_consecutive_blocks


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="an older onnxmlu/runtime/merge.py")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--strategy", default="dlfusion")
    parser.add_argument("--turns", type=int, default=7)
    args = parser.parse_args()
    passes = {"before": _load(args.before), "after": session.merge_consecutive_blocks}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fused.onnx"
        api.fuse_to_file(build_model(args.model, batch=args.batch), path, strategy=args.strategy)
        fused = onnx.load(path)
        created, merging = {k: [] for k in passes}, {k: [] for k in passes}
        for _ in range(args.turns):
            for name, merge in passes.items():
                session.merge_consecutive_blocks = merge  # what onnxmlu.InferenceSession calls
                created[name].append(_timed(onnxmlu.InferenceSession, str(path)))
                merging[name].append(_timed(merge, onnx.ModelProto.FromString(fused.SerializeToString())))
        session.merge_consecutive_blocks = passes["after"]
    print(f"{args.model} b{args.batch} {args.strategy}: {len(fused.graph.node)} nodes, {args.turns} turns, "
          f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for name in passes:
        print(f"{name:6s}: session creation median {statistics.median(created[name]):.3f} s "
              f"(min {min(created[name]):.3f}); merge pass median {statistics.median(merging[name]):.3f} s "
              f"(min {min(merging[name]):.3f})")


if __name__ == "__main__":
    main()
