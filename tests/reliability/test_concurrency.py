"""Concurrency (issue 7, item 4): one fused InferenceSession shared by 8 Python threads x 100 runs,
each run with its own input, every output checked against a reference computed beforehand.

onnxruntime releases the GIL in ``run``, so the threads really overlap inside the outer
session and inside the blocks' inner sessions (the kernels are immutable after creation).
The quick test uses the conv chain of onnxmlu.tools.testing (two blocks, a host TopK between them, a
float and an int64 output); the slow one the zoo ResNet-18 at batch 1 fused with all-fusion
(one block), whose 800 runs plus references take about a minute on two cores.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from onnxmlu import api, runtime
from onnxmlu.tools.testing import conv_chain_model

THREADS, RUNS = 8, 100
TOL = dict(atol=1e-4, rtol=1e-4)


pytestmark = pytest.mark.usefixtures("library")


def _feed(name: str, shape, t: int, i: int) -> dict:
    return {name: np.random.default_rng(10_000 * t + i).standard_normal(shape).astype(np.float32)}


def hammer(original, fused, input_name: str, shape) -> int:
    """Run ``fused`` from THREADS threads RUNS times each. Every output must equal, bit for bit,
    what the same session gave for that input when run alone, and match ``original``'s output
    (floats within 1e-4; integer outputs such as TopK indices are left out of that comparison,
    as a near tie between two floats may legitimately order differently after fusion)."""
    reference = runtime.reference_session(original)
    session = runtime.InferenceSession(fused)
    jobs = [(t, i) for t in range(THREADS) for i in range(RUNS)]
    alone = {job: session.run(None, _feed(input_name, shape, *job)) for job in jobs}
    for job in jobs:
        for got, expected in zip(alone[job], reference.run(None, _feed(input_name, shape, *job)), strict=True):
            if got.dtype.kind == "f":
                np.testing.assert_allclose(got, expected, **TOL, err_msg=f"run {job} alone vs the original")
    barrier = threading.Barrier(THREADS)

    def worker(t):
        barrier.wait()  # all threads start together so their runs overlap
        return [session.run(None, _feed(input_name, shape, t, i)) for i in range(RUNS)]

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(worker, range(THREADS)))
    checked = 0
    for t, runs in enumerate(results):
        for i, outputs in enumerate(runs):
            for got, expected in zip(outputs, alone[(t, i)], strict=True):
                np.testing.assert_array_equal(got, expected, err_msg=f"thread {t} run {i}")
                checked += 1
    # Different inputs gave different outputs: a session that mixed up runs could not pass.
    assert not np.array_equal(results[0][0][0], results[1][0][0])
    return checked


def test_eight_threads_share_one_fused_session():
    original = conv_chain_model(channels=16, size=32)
    fused = api.fuse(original, strategy="all-fusion").model
    assert sum(n.op_type == "MLUFusionBlock" for n in fused.graph.node) == 2
    assert hammer(original, fused, "x", (1, 16, 32, 32)) == THREADS * RUNS * 2


@pytest.mark.slow
def test_eight_threads_share_one_fused_resnet18(zoo):
    original = zoo("resnet18", 1)
    fused = api.fuse(original, strategy="all-fusion").model
    assert hammer(original, fused, original.graph.input[0].name, (1, 3, 224, 224)) == THREADS * RUNS
