"""What storing a shared weight once costs at run time (docs/architecture.md, "Shared weights").

A Siamese tower (two convolutions and two dense layers, one set of weights applied to two
images) is cut into one block per tower by a plan, then written twice: as ``fuse`` writes it
(each weight one initializer of the outer graph, read by both blocks as a shared input), and
with sharing off (``MIN_SHARED_BYTES`` above every weight: each body carries its own copy, the
format before shared weights). For each file: its size, the time to create an onnxruntime
session with the custom-op library (the library hands each shared constant to the inner
sessions then), the process's resident memory after creating it, and the latency of one run,
all interleaved (shared, copied, shared, ...) so machine load hits both alike; medians.

    .venv/bin/python scripts/shared_weights_cost.py              # ~35 MB of weights
    .venv/bin/python scripts/shared_weights_cost.py --hidden 512 --runs 50
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import onnxmlu.collapse.shared as shared
from onnxmlu import api, runtime
from onnxmlu.plan.plan import plan_from_ranges
from onnxmlu.sessions import new_options

SIDE = 64


def tower_model(hidden: int) -> onnx.ModelProto:
    """Conv 3->32 -> Relu -> MaxPool -> Conv 32->64 -> Relu -> GAP -> Flatten -> Dense 64->hidden
    -> Relu -> Dense hidden->2*hidden, for ``left`` and ``right``; output the L1 distance."""
    rng = np.random.default_rng(0)
    weights = {"w1": (32, 3, 3, 3), "w2": (64, 32, 3, 3), "d1": (64, hidden), "d2": (hidden, 2 * hidden)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.05).astype(np.float32), n) for n, s in weights.items()]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axes"))
    nodes = []
    for x in ("left", "right"):
        t = lambda name, x=x: f"{x}_{name}"  # noqa: E731
        nodes += [helper.make_node("Conv", [x, "w1"], [t("c1")], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [t("c1")], [t("r1")]),
                  helper.make_node("MaxPool", [t("r1")], [t("p1")], kernel_shape=[2, 2], strides=[2, 2]),
                  helper.make_node("Conv", [t("p1"), "w2"], [t("c2")], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [t("c2")], [t("r2")]), helper.make_node("GlobalAveragePool", [t("r2")], [t("g")]),
                  helper.make_node("Flatten", [t("g")], [t("f")]), helper.make_node("MatMul", [t("f"), "d1"], [t("h")]),
                  helper.make_node("Relu", [t("h")], [t("hr")]), helper.make_node("MatMul", [t("hr"), "d2"], [t("emb")])]
    nodes += [helper.make_node("Sub", ["left_emb", "right_emb"], ["diff"]), helper.make_node("Abs", ["diff"], ["l1"]),
              helper.make_node("ReduceSum", ["l1", "axes"], ["distance"], keepdims=0)]
    image = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 3, SIDE, SIDE])  # noqa: E731
    graph = helper.make_graph(nodes, "siamese", [image("left"), image("right")],
                              [helper.make_tensor_value_info("distance", TensorProto.FLOAT, [1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def fused_files(folder: Path, hidden: int) -> tuple[Path, dict[str, Path]]:
    src = folder / "siamese.onnx"
    onnx.save(tower_model(hidden), src)
    per_tower = 10  # layers of one tower
    plan = plan_from_ranges([(0, per_tower, 1), (per_tower, 2 * per_tower + 3, 1)])
    files = {"shared": folder / "shared.onnx", "copied": folder / "copied.onnx"}
    api.fuse_to_file(src, files["shared"], plan=plan)
    default = shared.MIN_SHARED_BYTES
    shared.MIN_SHARED_BYTES = 1 << 62  # no weight is large enough to share: the copying format
    try:
        api.fuse_to_file(src, files["copied"], plan=plan)
    finally:
        shared.MIN_SHARED_BYTES = default
    return src, files


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(files: dict[str, Path], runs: int, sessions: int) -> dict[str, dict[str, float]]:
    library = runtime.custom_ops_library()
    feeds = {n: np.random.default_rng(1).standard_normal((1, 3, SIDE, SIDE)).astype(np.float32) for n in ("left", "right")}
    create = {k: [] for k in files}
    rss = {k: [] for k in files}
    latency = {k: [] for k in files}
    for _ in range(sessions):
        for key, path in files.items():
            gc.collect()
            before = _rss_mb()
            options = new_options()
            options.register_custom_ops_library(library)
            options.intra_op_num_threads = 1
            start = time.perf_counter()
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            create[key].append(time.perf_counter() - start)
            rss[key].append(_rss_mb() - before)
            session.run(None, feeds)  # warm-up
            for _ in range(runs):
                start = time.perf_counter()
                session.run(None, feeds)
                latency[key].append(time.perf_counter() - start)
            del session
    return {k: {"size_mb": files[k].stat().st_size / 2**20, "create_ms": 1e3 * statistics.median(create[k]),
                "rss_mb": statistics.median(rss[k]), "run_ms": 1e3 * statistics.median(latency[k])} for k in files}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048, help="width of the first dense layer (the second is 2x)")
    parser.add_argument("--runs", type=int, default=30, help="timed runs per session")
    parser.add_argument("--sessions", type=int, default=5, help="sessions created per file, interleaved")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="onnxmlu-shared-") as tmp:
        src, files = fused_files(Path(tmp), args.hidden)
        print(f"original: {src.stat().st_size / 2**20:.1f} MB; two blocks, one per tower; medians of "
              f"{args.sessions} sessions x {args.runs} runs, 1 inner thread")
        print("| file | size MB | session creation ms | RSS after creation MB | run ms |")
        print("|---|---:|---:|---:|---:|")
        for key, row in measure(files, args.runs, args.sessions).items():
            print(f"| {key} | {row['size_mb']:.1f} | {row['create_ms']:.1f} | {row['rss_mb']:.1f} | {row['run_ms']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
