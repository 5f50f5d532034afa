"""Runtime overhead of fused models: fused / original latency in onnxruntime.

For every zoo model x strategy x thread count T, the original model (plain onnxruntime, all
graph optimizations, ``intra_op_num_threads = T``: :func:`original_session`) and the
fused model are timed in the same process, by each API path (``--apis``):

* ``onnxmlu``: what a user gets who hands ``onnxmlu.InferenceSession`` the same options:
  ``intra_op_num_threads = T`` becomes the inner thread count, consecutive blocks run as one
  inner session, inner pools spin only while their block runs;
* ``onnxmlu-per-block``: the same with ``merge_blocks=False``, one inner session (and, without
  a global pool, one thread pool) per block, as before blocks were merged at load time;
* ``plain``: plain onnxruntime with only the library registered in the user's options, the
  file as it is (one inner session per block).

``--together`` (default) loads the original and every strategy's fused model in one process
and times them in turns, as a server holding several models does (three fused models with the
default strategies); ``--apart`` loads one fused model beside the original at a time.
``--global-pools`` runs each thread count in a child process whose env has onnxruntime's global
thread pool (``set_global_thread_pool_sizes(T, 1)``, every session ``use_per_session_threads =
False``), the set-up the README gives for plain onnxruntime. Thread counts default to 1, 2, 4, ...
up to ``os.cpu_count()``; the header line says the machine's core count.

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
import subprocess
import sys
import time
from typing import NamedTuple, Sequence

import onnxruntime as ort

from onnxmlu.sessions import new_options
from onnxmlu import api
from onnxmlu.runtime import InferenceSession, custom_ops_library
from onnxmlu.tools.timing import time_in_turns
from onnxmlu.tools.verify import random_inputs
from onnxmlu.tools.zoo import ZOO_NAMES, build_model

APIS = ("onnxmlu", "onnxmlu-per-block", "plain")


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
    api: str = "onnxmlu"
    pools: str = "per-session"   # or "global"
    in_process: int = 1          # fused models loaded in the process beside the original


def thread_counts(cores: int | None = None) -> list[int]:
    """1, 2, 4, ... up to the core count, the core count itself included."""
    cores = cores or os.cpu_count() or 1
    counts = [1 << k for k in range(cores.bit_length()) if 1 << k <= cores]
    return counts + ([cores] if counts[-1] != cores else [])


def _options(threads: int, global_pools: bool) -> ort.SessionOptions:
    options = new_options()
    if global_pools:  # the pool's own size; onnxruntime warns that a session's count is ignored
        options.use_per_session_threads = False  # and requires this of every session
    else:
        options.intra_op_num_threads = threads
    return options


def original_session(model, threads: int, global_pools: bool = False):
    """Plain onnxruntime (no library), all graph optimizations, ``threads`` intra-op threads."""
    return ort.InferenceSession(model.SerializeToString(), _options(threads, global_pools),
                                providers=["CPUExecutionProvider"])


def fused_session(fused, threads: int, api_path: str = "onnxmlu", global_pools: bool = False):
    """The fused model as a user runs it with the original's options, by ``api_path`` (APIS)."""
    options = _options(threads, global_pools)
    if api_path == "plain":
        options.register_custom_ops_library(custom_ops_library())
        return ort.InferenceSession(fused.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return InferenceSession(fused, options, merge_blocks=api_path != "onnxmlu-per-block")


def bench(models: Sequence[str], strategies: Sequence[str], threads_list: Sequence[int], batch: int,
          runs: int, *, verbose: bool = True, apis: Sequence[str] = ("onnxmlu",), together: bool = True,
          global_pools: bool = False) -> list[Row]:
    """Rows of fused/original latency; ``runs`` timed runs per session (rounded up so that
    every session gets at least 3 turns)."""
    rows = []
    for name in models:
        model = build_model(name, batch=batch)
        feeds = random_inputs(model, seed=0)
        fused = {s: api.fuse(model, strategy=s) for s in strategies}
        groups = [list(strategies)] if together else [[s] for s in strategies]
        for threads in threads_list:
            for api_path in apis:
                for group in groups:
                    timings = _time_group(model, feeds, {s: fused[s] for s in group}, threads, api_path,
                                          global_pools, runs)
                    base = timings["original"].median_ms
                    for s in group:
                        t = timings[s]
                        rows.append(Row(name, batch, s, len(fused[s].plan.blocks), threads, base, t.median_ms,
                                        t.median_ms / base, t.min_ms, t.max_ms, api_path,
                                        "global" if global_pools else "per-session", len(group)))
                        if verbose:
                            print_row(rows[-1])
    return rows


def _time_group(model, feeds, fused: dict, threads: int, api_path: str, global_pools: bool, runs: int) -> dict:
    """The original and the ``fused`` results' models loaded together, timed in turns."""
    chunk = max(1, min(5, runs // 3))
    sessions = {"original": original_session(model, threads, global_pools)}
    sessions |= {s: fused_session(r.model, threads, api_path, global_pools) for s, r in fused.items()}
    return time_in_turns(sessions, feeds, rounds=-(-runs // chunk), chunk=chunk)


HEADER = ("model", "batch", "strategy", "blocks", "threads", "api", "pools", "fused in process", "orig ms",
          "fused ms", "ratio", "fused min", "fused max")


def print_row(row: Row) -> None:
    print(f"| {row.model:11s} | {row.batch:5} | {row.strategy:10s} | {row.blocks:6d} | {row.threads:7d} | "
          f"{row.api:17s} | {row.pools:11s} | {row.in_process:16d} | {row.original_ms:8.2f} | {row.fused_ms:8.2f} | "
          f"{row.ratio:5.3f} | {row.fused_min_ms:8.2f} | {row.fused_max_ms:8.2f} |", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(ZOO_NAMES))
    parser.add_argument("--strategies", nargs="+", default=["all-fusion", "dlfusion", "optimal"])
    parser.add_argument("--threads", nargs="+", type=int, default=thread_counts())
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--apis", nargs="+", choices=APIS, default=list(APIS))
    parser.add_argument("--apart", dest="together", action="store_false",
                        help="one fused model beside the original at a time (default: all together)")
    parser.add_argument("--global-pools", action="store_true", help="onnxruntime's global thread pool, per thread count")
    parser.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)  # the child processes
    args = parser.parse_args(argv)
    if not args.no_header:
        print(f"# runtime overhead · {os.cpu_count()} cores · onnxruntime {ort.__version__} · "
              f"median of {args.runs} runs in turns · {time.strftime('%Y-%m-%d %H:%M')}")
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
    if args.global_pools and len(args.threads) > 1:  # the pool's size is fixed per process
        for threads in args.threads:
            given = list(argv if argv is not None else sys.argv[1:])  # the last --threads wins
            subprocess.run([sys.executable, __file__, *given, "--threads", str(threads), "--no-header"], check=True)
        return
    if args.global_pools:
        ort.set_global_thread_pool_sizes(args.threads[0], 1)  # before the process's first session
    for batch in args.batch:
        bench(args.models, args.strategies, args.threads, batch, args.runs, apis=args.apis,
              together=args.together, global_pools=args.global_pools)


if __name__ == "__main__":
    sys.exit(main())
