"""``onnxmlu run``: any model (fused or not) in onnxruntime with the custom-op library, on
given or seeded inputs -- at the ``--input-shape`` pins, else at the shapes a fused model records
its plan was priced at (``onnxmlu.pricing_shape``, where ``check`` runs too); its outputs, its
latency and, on request, each node's measured CPU time next to its simulated time."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from onnxmlu.errors import OnnxMluError
from onnxmlu.reports import RunReport
from onnxmlu.frontend.load import load_model
from onnxmlu.frontend.pins import PricingShape, concrete_shapes
from onnxmlu.schema import model_metadata, recorded_pricing_shape
from onnxmlu.optional import optional_import
from onnxmlu.tools.profiling import profile_nodes, reprice_blocks
from onnxmlu.tools.timing import time_interleaved
from onnxmlu.tools.verify import random_inputs
from onnxmlu.wording import plural


def run_model(model: str | os.PathLike, *, inputs: dict | None, seed: int, input_shapes: dict | None, repeat: int,
              profile: bool, save: str | os.PathLike | None, progress, analyse=None) -> RunReport:
    """``analyse(body, pins)``: a block body's analysis, to re-price blocks at another shape
    (:func:`~onnxmlu.tools.profiling.reprice_blocks`)."""
    runtime = optional_import("onnxmlu.runtime")
    progress.say(f"loading {Path(model).name}")
    proto = load_model(model)
    pricing = _pricing(proto)
    # no pins: the shapes fuse priced at (as check runs there), not the free dims' defaults; a range runs at its opt
    shapes = concrete_shapes(proto, input_shapes or (pricing.as_pins() if pricing is not None else None))
    feeds = random_inputs(proto, seed, shapes=shapes, given=inputs)
    progress.say("creating the session")
    before = runtime.thread_report()
    session = runtime.InferenceSession(proto)
    pools = runtime.thread_report() - before
    names = [o.name for o in session.get_outputs()]
    outputs = session.run(names, feeds)
    progress.say(f"timing {plural(repeat, 'run')}")
    timing = time_interleaved({"model": session}, feeds, runs=repeat, warmup=1)["model"]
    report = RunReport([output_summary(n, o) for n, o in zip(names, outputs)], timing,
                       input_shapes={n: list(np.shape(v)) for n, v in feeds.items()}, pricing=pricing)
    if profile:
        progress.say(f"profiling {plural(repeat, 'run')}")
        report.profile = profile_nodes(proto, feeds, repeat=repeat)
        report.thread_note = runtime.pool_note(pools)
        if report.priced_elsewhere and analyse is not None:
            progress.say("re-pricing the blocks at this run's shape")
            here = reprice_blocks(proto, feeds, analyse)
            report.profile = [replace(p, sim_here_us=here.get(p.name)) for p in report.profile]
    if save is not None:
        np.savez(save, **dict(zip(names, outputs)))
    return report


def _pricing(model) -> PricingShape | None:
    """The shapes a fused model's plan was priced at, None for a model without the record."""
    record = recorded_pricing_shape(model_metadata(model))
    return None if record is None else PricingShape.from_dict(record)


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
