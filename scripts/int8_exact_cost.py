"""What onnxruntime's exact INT8 kernels cost: each INT8 block body of a zoo model's
``--precision int8`` fuse, run as the library runs it (onnxruntime, all optimizations, T
intra-op threads) with ``session.x64quantprecision`` = 1 (exact u8 x u8 kernels, what the
package's sessions use on x86 without AVX-512 VNNI: onnxmlu/sessions.py) and without it
(onnxruntime's default u8 x s8 kernels: exact with VNNI, saturating without), timed in turns in
one process. Also the largest difference between the two outputs on the same seeded inputs: 0
on a host whose default kernels are exact.

    python scripts/int8_exact_cost.py [--models resnet18 mobilenetv2] [--threads 2] [--rounds 8]

``--qlinearmatmul M K N`` instead times the fused block of one opset-21 QLinearMatMul (u8
activations [M, K], s8 weights [K, N] over the whole range) as the fuse writes it (u8 weights:
onnxmlu/rewrite/qlinearmatmul.py) and before that rewrite (the same body with its s8 weights),
both with onnxruntime's default kernels: what the rewrite costs where those are exact (VNNI).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

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


def _fused_qlinearmatmul(a_shape: tuple[int, int], weight: np.ndarray) -> onnx.ModelProto:
    """The one block body of an opset-21 QLinearMatMul u8 x ``weight`` (s8) as the fuse writes it."""
    inits = [numpy_helper.from_array(v, name) for name, v in (
        ("s", np.float32(1.0)), ("za", np.uint8(0)), ("w", weight), ("zw", np.int8(0)), ("sy", np.float32(4096.0)))]
    node = helper.make_node("QLinearMatMul", ["a", "s", "za", "w", "s", "zw", "sy", "za"], ["y"])
    graph = helper.make_graph([node], "qlinearmatmul", [helper.make_tensor_value_info("a", TensorProto.UINT8, a_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [a_shape[0], weight.shape[1]])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    [body] = [body_model(b) for b in api.fuse(model, precision="int8").model.graph.node if is_fusion_block(b)]
    return body


def qlinearmatmul_bodies(m: int, k: int, n: int) -> dict[str, onnx.ModelProto]:
    """The fused block of an opset-21 QLinearMatMul with full-range weights (u8 weights), the same
    body before the rewrite (its weight and zero point back to s8: ``^ 0x80``), and the fused
    block of the same weights clipped to +-64 (kept s8: they cannot saturate)."""
    weight = np.random.default_rng(0).integers(-128, 128, (k, n)).astype(np.int8)
    after = _fused_qlinearmatmul((m, k), weight)
    before = onnx.ModelProto()
    before.CopyFrom(after)
    [product] = [p for p in before.graph.node if p.op_type == "QLinearMatMul"]
    for tensor in before.graph.initializer:
        if tensor.name in (product.input[3], product.input[5]):
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).view(np.int8) ^ np.int8(-128), tensor.name))
    return {"s8 weights (before the rewrite)": before, "u8 weights (as fused)": after,
            "weights within +-64 (as fused: s8 kept)": _fused_qlinearmatmul((m, k), np.clip(weight, -64, 64))}


def time_qlinearmatmul(shape: list[int], threads: int, rounds: int) -> None:
    bodies = qlinearmatmul_bodies(*shape)
    sessions = {name: _session(body, threads, exact=False) for name, body in bodies.items()}
    feeds = random_inputs(next(iter(bodies.values())), seed=0)
    times = time_in_turns(sessions, feeds, rounds=rounds)
    before, after = (sessions[name].run(None, feeds)[0].astype(np.int64) for name in list(sessions)[:2])
    print(f"QLinearMatMul {shape[0]}x{shape[1]} @ {shape[1]}x{shape[2]}, {threads} threads, default kernels "
          f"(max |before - as fused| {int(np.max(np.abs(before - after)))}):")
    base = times[next(iter(sessions))].median_ms
    for name in sessions:
        print(f"  {name}: {times[name].median_ms:.3f} ms ({times[name].median_ms / base:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenetv2"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--qlinearmatmul", nargs=3, type=int, metavar=("M", "K", "N"))
    args = parser.parse_args()
    if args.qlinearmatmul:
        time_qlinearmatmul(args.qlinearmatmul, args.threads, args.rounds)
        return
    print("| model | INT8 blocks | default kernels ms | exact kernels ms | exact / default | max abs difference |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        count, default_ms, exact_ms, worst = measure(name, args.threads, args.rounds)
        print(f"| {name} | {count} | {default_ms:.2f} | {exact_ms:.2f} | {exact_ms / default_ms:.2f}× | {worst:.3g} |")


if __name__ == "__main__":
    main()
