"""Side-by-side latency measurement for the demo, ``run --profile`` and the benchmarks.

Sessions are timed interleaved (A, B, A, B, ...) after a warm-up, so drift in machine load
hits every candidate alike; the figure reported is the median with its min and max.
Ratios are taken between medians measured in the same run, never across runs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx

from onnxmlu.sessions import new_options
from onnxmlu.optional import optional_import


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    runs: int


def time_interleaved(sessions: Mapping[str, object], feeds: Mapping[str, np.ndarray], *,
                     runs: int = 30, warmup: int = 3) -> dict[str, Timing]:
    """Median latency (ms) of ``session.run(None, feeds)`` for each named session."""
    samples: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(warmup):
        for sess in sessions.values():
            sess.run(None, dict(feeds))
    for _ in range(runs):
        for name, sess in sessions.items():
            start = time.perf_counter()
            sess.run(None, dict(feeds))
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: Timing(statistics.median(s), min(s), max(s), len(s)) for name, s in samples.items()}


def time_in_turns(sessions: Mapping[str, object], feeds: Mapping[str, np.ndarray], *,
                  rounds: int = 12, chunk: int = 5, warmup: int = 1,
                  settle_max_s: float = 0.5) -> dict[str, Timing]:
    """Median latency (ms) of each session, measured in turns: every round each session gets
    ``warmup`` untimed then ``chunk`` timed back-to-back runs; the order rotates each round.

    Use this, not run-by-run interleaving, when a session may own a spinning thread pool
    (onnxruntime's default for intra-op threads > 1): its workers keep spinning after run()
    returns (~30 ms of CPU for a 2-thread ResNet-18 pool), and on a 2-core machine that steals a
    core from whichever session runs next. Here each session's spin tail only meets its own
    next run, as in a user's inference loop, and before each turn the process waits until it
    is idle (no pool spinning), so no session pays for another's.
    """
    names = list(sessions)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            sess = sessions[name]
            _wait_until_idle(settle_max_s)
            for _ in range(warmup):
                sess.run(None, dict(feeds))
            for _ in range(chunk):
                start = time.perf_counter()
                sess.run(None, dict(feeds))
                samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: Timing(statistics.median(s), min(s), max(s), len(s)) for name, s in samples.items()}


def _wait_until_idle(max_s: float, window_s: float = 0.01) -> None:
    """Sleep until this process burns (almost) no CPU over a window: no thread pool spinning."""
    deadline = time.perf_counter() + max_s
    while time.perf_counter() < deadline:
        cpu = time.process_time()
        time.sleep(window_s)
        if time.process_time() - cpu < 0.05 * window_s:
            return


def plain_session(model: onnx.ModelProto | str, threads: int):
    """Plain onnxruntime (no custom-op library), all graph optimizations, ``threads`` intra-op
    threads: the "original model" side of every side-by-side measurement. It loads what every
    session of the package loads (:func:`onnxmlu.runtime.loadable_source`): on a host
    whose default INT8 kernels saturate, the exact kernels a fused model's blocks run, not
    others, and a model whose quantized weight several nodes read loads there too."""
    ort = optional_import("onnxruntime")
    runtime = optional_import("onnxmlu.runtime")

    options = new_options("all")
    options.intra_op_num_threads = threads
    source = model if isinstance(model, onnx.ModelProto) else str(model)
    with runtime.loadable_source(source, options) as loadable:
        return ort.InferenceSession(loadable, options, providers=["CPUExecutionProvider"])
