"""Runtime overhead of fused models: fused / original latency in onnxruntime.

For every zoo model x strategy x thread count T, the original model (plain onnxruntime, all
graph optimizations, ``intra_op_num_threads = T``: ``onnxmlu.tools.timing.plain_session``) and the
fused model are timed in the same process. The fused model gets what a user gets who hands
``onnxmlu.InferenceSession`` the same options: ``intra_op_num_threads = T`` becomes each
block's inner thread count, inner pools spin only while their block runs.

Sessions are timed in turns (``onnxmlu.tools.timing.time_in_turns``), not run-by-run interleaved:
the original's spinning pool keeps a core busy for ~30 ms after each run, and with
run-by-run interleaving at 2 threads on 2 cores the session timed next ran at its 1-thread
speed (ResNet-18: 16-19 ms against 8.2 ms; the "unstable 2-thread results" of earlier runs).
The ratio is fused median / original median from the same run; 1.00 is the physical limit
since the inner sessions run the same kernels.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import NamedTuple, Sequence

import onnxruntime as ort

from onnxmlu.sessions import new_options
from onnxmlu import api
from onnxmlu.runtime import InferenceSession
from onnxmlu.tools.timing import plain_session, time_in_turns
from onnxmlu.tools.verify import random_inputs
from onnxmlu.tools.zoo import ZOO_NAMES, build_model


class Row(NamedTuple):
    model: str
    batch: int
    strategy: str
    blocks: int
    threads: int
    original_ms: float  # median
    fused_ms: float     # median
    ratio: float        # fused_ms / original_ms
    fused_min_ms: float
    fused_max_ms: float


def fused_session(fused, threads: int):
    """The fused model as a user runs it with the original's options (T intra-op threads)."""
    options = new_options()
    options.intra_op_num_threads = threads
    return InferenceSession(fused, options)


def bench(models: Sequence[str], strategies: Sequence[str], threads_list: Sequence[int], batch: int,
          runs: int, *, verbose: bool = True) -> list[Row]:
    """Rows of fused/original latency; ``runs`` timed runs per session (rounded up so that
    every session gets at least 3 turns)."""
    rows = []
    chunk = max(1, min(5, runs // 3))
    rounds = -(-runs // chunk)
    for name in models:
        model = build_model(name, batch=batch)
        feeds = random_inputs(model, seed=0)
        fused = {s: api.fuse(model, strategy=s) for s in strategies}
        for threads in threads_list:
            sessions = {"original": plain_session(model, threads)}
            sessions |= {s: fused_session(r.model, threads) for s, r in fused.items()}
            timings = time_in_turns(sessions, feeds, rounds=rounds, chunk=chunk)
            del sessions
            base = timings["original"].median_ms
            for s in strategies:
                t = timings[s]
                rows.append(Row(name, batch, s, len(fused[s].plan.blocks), threads, base, t.median_ms,
                                t.median_ms / base, t.min_ms, t.max_ms))
                if verbose:
                    print_row(rows[-1])
    return rows


HEADER = ("model", "batch", "strategy", "blocks", "threads", "orig ms", "fused ms", "ratio", "fused min", "fused max")


def print_row(row: Row) -> None:
    name, batch, s, blocks, threads, base, med, ratio, lo, hi = row
    print(f"| {name:11s} | {batch:5} | {s:10s} | {blocks:6d} | {threads:7d} | {base:8.2f} | {med:8.2f} | "
          f"{ratio:5.3f} | {lo:8.2f} | {hi:8.2f} |", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(ZOO_NAMES))
    parser.add_argument("--strategies", nargs="+", default=["none", "all-fusion", "dlfusion", "optimal"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args(argv)
    print(f"# runtime overhead · {os.cpu_count()} cores · onnxruntime {ort.__version__} · "
          f"median of {args.runs} runs in turns · {time.strftime('%Y-%m-%d %H:%M')}")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for batch in args.batch:
        bench(args.models, args.strategies, args.threads, batch, args.runs)


if __name__ == "__main__":
    sys.exit(main())
