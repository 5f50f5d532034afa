"""What onnxruntime's exact INT8 kernels cost: each INT8 block body of a zoo model's
``--precision int8`` fuse, run as the library runs it (onnxruntime, all optimizations, T
intra-op threads) with ``session.x64quantprecision`` = 1 (exact u8 x u8 kernels, what the
package's sessions use on x86 without AVX-512 VNNI: onnxmlu/sessions.py) and without it
(onnxruntime's default u8 x s8 kernels: exact with VNNI, saturating without), timed in turns in
one process. Also the largest difference between the two outputs on the same seeded inputs: 0
on a host whose default kernels are exact.

    python scripts/int8_exact_cost.py [--models resnet18 mobilenetv2] [--threads 2] [--rounds 8]
"""

from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort

from onnxmlu import api
from onnxmlu.frontend.feeds import random_inputs
from onnxmlu.schema import block_precision, body_model, is_fusion_block
from onnxmlu.sessions import EXACT_INT8_KEY, new_options
from onnxmlu.tools.timing import time_in_turns
from onnxmlu.tools.zoo import build_model


def _session(body, threads: int, exact: bool) -> ort.InferenceSession:
    options = new_options("all", log_severity=3, exact=False)
    options.intra_op_num_threads = threads
    if exact:  # forced, also where the package leaves the default kernels (a VNNI host)
        options.add_session_config_entry(EXACT_INT8_KEY, "1")
    return ort.InferenceSession(body.SerializeToString(), options, providers=["CPUExecutionProvider"])


def measure(name: str, threads: int, rounds: int) -> tuple[int, float, float, float]:
    """(INT8 blocks, default ms, exact ms, largest |exact - default|) summed over the blocks."""
    fused = api.fuse(build_model(name), precision="int8").model
    blocks = [body_model(n) for n in fused.graph.node if is_fusion_block(n) and block_precision(n) == "int8"]
    default_ms = exact_ms = 0.0
    worst = 0.0
    for body in blocks:
        feeds = random_inputs(body, seed=0)
        sessions = {"default": _session(body, threads, False), "exact": _session(body, threads, True)}
        times = time_in_turns(sessions, feeds, rounds=rounds)
        default_ms += times["default"].median_ms
        exact_ms += times["exact"].median_ms
        got = [sessions[k].run(None, feeds) for k in ("default", "exact")]
        worst = max([worst, *(float(np.max(np.abs(a - b))) for a, b in zip(*got))])
    return len(blocks), default_ms, exact_ms, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenetv2"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    print("| model | INT8 blocks | default kernels ms | exact kernels ms | exact / default | max abs difference |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        count, default_ms, exact_ms, worst = measure(name, args.threads, args.rounds)
        print(f"| {name} | {count} | {default_ms:.2f} | {exact_ms:.2f} | {exact_ms / default_ms:.2f}× | {worst:.3g} |")


if __name__ == "__main__":
    main()
