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


def plain_session(model: onnx.ModelProto | str, threads: int):
    """Plain onnxruntime (no custom-op library), all graph optimizations, ``threads`` intra-op
    threads: the "original model" side of every side-by-side measurement."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
