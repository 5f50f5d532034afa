"""Runtime overhead of fused models: fused / original latency in onnxruntime.

For every zoo model x strategy x thread count, the original model (plain onnxruntime, all
graph optimizations, ``intra_op_num_threads = T``) and the fused model
(``onnxmlu.InferenceSession``: outer session 1 thread, inner block sessions T threads via
``ONNXMLU_INNER_THREADS``) are timed interleaved in the same process: median of N runs after
a warm-up. The ratio is fused median / original median; 1.00 is the physical limit since the
inner sessions run the same kernels.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import onnxruntime as ort

from onnxmlu import api
from onnxmlu.runtime import InferenceSession
from onnxmlu.timing import plain_session, time_interleaved
from onnxmlu.verify import random_inputs
from onnxmlu.zoo import ZOO_NAMES, build_model


def fused_session(fused, threads: int):
    os.environ["ONNXMLU_INNER_THREADS"] = str(threads)  # read when each block's kernel is created
    try:
        return InferenceSession(fused)
    finally:
        del os.environ["ONNXMLU_INNER_THREADS"]


def bench(models, strategies, threads_list, batch, runs):
    rows = []
    for name in models:
        model = build_model(name, batch=batch)
        feeds = random_inputs(model, seed=0)
        fused = {s: api.fuse(model, strategy=s) for s in strategies}
        for threads in threads_list:
            sessions = {"original": plain_session(model, threads)}
            sessions |= {s: fused_session(r.model, threads) for s, r in fused.items()}
            timings = time_interleaved(sessions, feeds, runs=runs)
            base = timings["original"].median_ms
            for s in strategies:
                t = timings[s]
                rows.append((name, batch, s, len(fused[s].plan.blocks), threads, base, t.median_ms,
                             t.median_ms / base, t.min_ms, t.max_ms))
                print_row(rows[-1])
    return rows


HEADER = ("model", "batch", "strategy", "blocks", "threads", "orig ms", "fused ms", "ratio", "fused min", "fused max")


def print_row(row) -> None:
    name, batch, s, blocks, threads, base, med, ratio, lo, hi = row
    print(f"| {name:11s} | {batch:5} | {s:10s} | {blocks:6d} | {threads:7d} | {base:8.2f} | {med:8.2f} | "
          f"{ratio:5.3f} | {lo:8.2f} | {hi:8.2f} |", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(ZOO_NAMES))
    parser.add_argument("--strategies", nargs="+", default=["none", "all-fusion"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args(argv)
    print(f"# runtime overhead · {os.cpu_count()} cores · onnxruntime {ort.__version__} · "
          f"median of {args.runs} interleaved runs · {time.strftime('%Y-%m-%d')}")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    bench(args.models, args.strategies, args.threads, args.batch, args.runs)


if __name__ == "__main__":
    sys.exit(main())
