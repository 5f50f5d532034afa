"""``onnxmlu run``: any model (fused or not) in onnxruntime with the custom-op library, on
given or seeded inputs; its outputs, its latency and, on request, each node's measured CPU
time next to its simulated time."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from onnxmlu.errors import OnnxMluError
from onnxmlu.reports import RunReport
from onnxmlu.frontend.load import load_model
from onnxmlu.frontend.pins import concrete_shapes
from onnxmlu.optional import optional_import
from onnxmlu.tools.profiling import profile_nodes
from onnxmlu.tools.timing import time_interleaved
from onnxmlu.tools.verify import random_inputs


def run_model(model: str | os.PathLike, *, inputs: dict | None, seed: int, input_shapes: dict | None, repeat: int,
              profile: bool, save: str | os.PathLike | None, progress) -> RunReport:
    runtime = optional_import("onnxmlu.runtime")
    progress.say(f"loading {Path(model).name}")
    proto = load_model(model)
    shapes = concrete_shapes(proto, input_shapes)  # a range runs at its opt
    feeds = random_inputs(proto, seed, shapes=shapes, given=inputs)
    progress.say("creating the session")
    before = runtime.thread_report()
    session = runtime.InferenceSession(proto)
    pools = runtime.thread_report() - before
    names = [o.name for o in session.get_outputs()]
    outputs = session.run(names, feeds)
    progress.say(f"timing {repeat} runs")
    timing = time_interleaved({"model": session}, feeds, runs=repeat, warmup=1)["model"]
    report = RunReport([output_summary(n, o) for n, o in zip(names, outputs)], timing)
    if profile:
        progress.say(f"profiling {repeat} runs")
        report.profile = profile_nodes(proto, feeds, repeat=repeat)
        report.thread_note = runtime.pool_note(pools)
    if save is not None:
        np.savez(save, **dict(zip(names, outputs)))
    return report


def load_feeds(path: str | os.PathLike) -> dict:
    """The arrays of an .npz file by name (``--inputs``)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise OnnxMluError(f"cannot read --inputs {path} as a .npz of arrays: {exc}") from None


def output_summary(name: str, value) -> dict:
    arr = np.asarray(value)
    numeric = arr.dtype.kind in "biuf" and arr.size
    stats = {k: float(getattr(arr.astype(np.float64), k)()) for k in ("mean", "std", "min", "max")} if numeric else {}
    return {"name": name, "shape": list(arr.shape), "dtype": str(arr.dtype), **stats}
