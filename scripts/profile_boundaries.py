"""What a block boundary costs at run time, by component (default: ResNet-50, dlfusion, batch 8,
1 thread).

    python scripts/profile_boundaries.py                       # resnet50 dlfusion b8, 1 thread
    python scripts/profile_boundaries.py --model mobilenetv2 --no-layouts

Three measurements of the same inputs, in one process:

1. the original model in plain onnxruntime (all optimizations, 1 intra-op thread), profiled:
   kernel time per operator type;
2. each block body of the fused model as onnxruntime runs it inside the block (after
   ``onnxmlu.InferenceSession``'s NCHWc block-layout pass, unless ``--no-layouts``), each in its
   own session with the inner session's settings, profiled the same way: kernel time per
   operator type, and the session's own wall time;
3. the original and the fused model end to end, timed in turns (``onnxmlu.tools.timing``), its
   blocks left unmerged (``merge_blocks=False``: ``onnxmlu.InferenceSession`` would otherwise run
   consecutive blocks as one inner session, and there would be no boundary left to price).

The kernels of the bodies are also split by what onnxruntime cannot do across a session's
edge: a Conv with a fused residual Add (NCHWc ``Conv``'s fourth input, ``FusedConv``'s
``Z``) writes its result into the added tensor's buffer when that tensor dies there, but a
session never writes into its own inputs, nor hands an intermediate's buffer to its outputs,
so where the added tensor is a block input, or the result a block output, the kernel first
copies the added tensor. Those Convs are matched by name with the original's and printed as
rows of their own.

4. the same cut made without onnxmlu: the original model's own subgraphs between the blocks'
   boundaries (``onnx.utils.extract_model``), each a plain onnxruntime session, chained in
   Python, against the block bodies chained the same way (what splitting one graph into
   sessions costs by itself, whatever the bodies hold).

The difference of the fused model from the original then splits into: kernels per operator
type (reorders between layouts, a residual Add/Relu that lost its fusion with a Conv, the
convolutions themselves), each inner ``Run`` around its kernels (body wall − its kernels), and
what is left to the custom op and the outer session (fused wall − the bodies' walls). The
original and the bodies run interleaved (the original, then every body, run after run) and
every figure is the least over the runs (the run least disturbed by other processes on a
shared machine); the machine's load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnx.utils
import onnxruntime as ort

from onnxmlu.sessions import new_options
from onnxmlu import api
from onnxmlu.runtime import InferenceSession
from onnxmlu.runtime.layouts import ADDED_INPUT, RESULT_OUTPUT, edge_copying_convs, optimize_block_layouts
from onnxmlu.schema import body_model, is_fusion_block
from onnxmlu.tools.timing import plain_session, time_in_turns
from onnxmlu.tools.verify import random_inputs
from onnxmlu.tools.zoo import build_model


class Profiled:
    """One profiled plain onnxruntime session (all optimizations, ``threads`` intra-op threads,
    spinning as the inner sessions do) and its wall time per run."""

    def __init__(self, model: onnx.ModelProto, feeds: dict, threads: int, folder: str, tag: str) -> None:
        options = new_options()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(folder, tag)
        options.optimized_model_filepath = os.path.join(folder, f"{tag}.optimized.onnx")
        options.log_severity_level = 3  # not the warning that an NCHWc model is machine-specific
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        self.optimized = onnx.load(options.optimized_model_filepath)  # the graph the kernels below belong to
        self.feeds, self.walls = feeds, []
        self.session.run(None, feeds)  # warm-up: run 0 of the profile, dropped below

    def run(self) -> None:
        start = time.perf_counter()
        self.session.run(None, self.feeds)
        self.walls.append((time.perf_counter() - start) * 1e6)

    def kernels(self, copying: dict[str, str]) -> dict[str, list[float]]:
        """Kernel microseconds per operator type, one entry per timed run; the nodes named in
        ``copying`` are counted under the row it gives them instead."""
        events = json.loads(Path(self.session.end_profiling()).read_text())
        runs = len(self.walls)
        per_run: dict[str, list[float]] = defaultdict(lambda: [0.0] * (runs + 1))
        run = 0  # a run's kernel events come before its "model_run" event; run 0 is the warm-up
        for event in events:
            if event.get("cat") == "Session" and event.get("name") == "model_run":
                run += 1
            elif event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and run <= runs:
                node = event["name"][: -len("_kernel_time")]
                per_run[copying.get(node, event["args"]["op_name"])][run] += float(event["dur"])
        return {op: v[1:] for op, v in per_run.items()}


#: The two rows of Convs that copy their fused Add's tensor because it crosses a session's edge.
COPIED_IN = f"Conv+Add, {ADDED_INPUT} (copied first)"
COPIED_OUT = f"Conv+Add, {RESULT_OUTPUT} (added tensor copied)"


def copying_convs(graph: onnx.GraphProto) -> dict[str, str]:
    """The Convs of an optimized body whose fused residual Add cannot run in place
    (:func:`~onnxmlu.runtime.layouts.edge_copying_convs`), by node name -> their row."""
    return {node.name: COPIED_IN if side == ADDED_INPUT else COPIED_OUT for node, side in edge_copying_convs(graph)}


def summed(profiles: list[Profiled], copying: dict[str, str]) -> tuple[dict[str, list[float]], list[float]]:
    """Kernel time per operator type (``copying``'s nodes under their own rows) and wall per
    run, summed over sessions run by run."""
    ops: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(profiles[0].walls))
    walls = [sum(w) for w in zip(*(p.walls for p in profiles))]
    for p in profiles:
        for op, values in p.kernels(copying).items():
            ops[op] = [a + b for a, b in zip(ops[op], values)]
    return ops, walls


def body_feeds(body: onnx.ModelProto, rng: np.random.Generator) -> dict:
    feeds = {}
    for vi in body.graph.input:
        tt = vi.type.tensor_type
        dims = [d.dim_value for d in tt.shape.dim]
        feeds[vi.name] = rng.standard_normal(dims).astype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
    return feeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--strategy", default="dlfusion")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--no-layouts", action="store_true", help="bodies as fused, without the NCHWc block-layout pass")
    args = parser.parse_args()

    original = build_model(args.model, batch=args.batch)
    fused = api.fuse(original, strategy=args.strategy).model
    feeds = random_inputs(fused, seed=0)
    rng = np.random.default_rng(0)
    run_model = fused if args.no_layouts else optimize_block_layouts(fused, inner_threads=args.threads)[0]

    blocks = [n for n in run_model.graph.node if is_fusion_block(n)]
    with tempfile.TemporaryDirectory() as folder:
        base = Profiled(original, feeds, args.threads, folder, "original")
        bodies = [Profiled(b, body_feeds(b, rng), args.threads, folder, f"block{i}")
                  for i, b in enumerate(body_model(n) for n in blocks)]
        for _ in range(args.runs):  # interleaved: the original, then every body, run after run
            for p in (base, *bodies):
                p.run()
        copying = {name: row for p in bodies for name, row in copying_convs(p.optimized.graph).items()}
        base_ops, base_walls = summed([base], copying)  # the same Convs of the original, for comparison
        block_ops, body_walls = summed(bodies, copying)
    sessions = {"original": plain_session(original, args.threads),
                # blocks unmerged: the boundaries this script prices must still be there
                "fused": InferenceSession(fused, _fused_options(args.threads), block_layouts=not args.no_layouts,
                                          merge_blocks=False)}
    timings = time_in_turns(sessions, feeds, rounds=max(3, args.runs // 2), chunk=2)
    wall = {k: t.min_ms * 1e3 for k, t in timings.items()}

    print(f"{args.model} {args.strategy} batch {args.batch}, {args.threads} thread(s), {len(blocks)} blocks, "
          f"{'no layout pass' if args.no_layouts else 'NCHWc block-layout pass'}; least of {args.runs} runs "
          f"(interleaved); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"end to end (least of {timings['fused'].runs}, in turns): original {wall['original'] / 1e3:.1f} ms, "
          f"fused {wall['fused'] / 1e3:.1f} ms, fused/original {wall['fused'] / wall['original']:.3f}")
    rows = []
    ops = sorted(set(base_ops) | set(block_ops), key=lambda o: -abs(_least(block_ops.get(o)) - _least(base_ops.get(o))))
    for op in ops:
        a, b = _least(base_ops.get(op)), _least(block_ops.get(op))
        if abs(b - a) >= 50 or max(a, b) >= 1000:
            rows.append((f"kernels: {op}", f"{a / 1e3:.2f}", f"{b / 1e3:.2f}", f"{(b - a) / 1e3:+.2f}"))
    kernels_base = min(map(sum, zip(*base_ops.values())))
    kernels_blocks = min(map(sum, zip(*block_ops.values())))
    rows.append(("kernels, all", f"{kernels_base / 1e3:.2f}", f"{kernels_blocks / 1e3:.2f}",
                 f"{(kernels_blocks - kernels_base) / 1e3:+.2f}"))
    around_base, around_blocks = min(base_walls) - kernels_base, min(body_walls) - kernels_blocks
    rows.append(("session Run around the kernels (wall − kernels)", f"{around_base / 1e3:.2f}",
                 f"{around_blocks / 1e3:.2f}", f"{(around_blocks - around_base) / 1e3:+.2f}"))
    rows.append(("custom op + outer session (fused wall − bodies' walls)", "", "",
                 f"{(wall['fused'] - min(body_walls)) / 1e3:+.2f}"))
    print(_table(("component", "original ms", "blocks ms", "difference ms"), rows))
    chained = chained_walls(original, fused, feeds, args.threads, args.runs)
    print("the same cut without onnxmlu (least of %d, ms): " % args.runs
          + ", ".join(f"{k} {v:.1f}" for k, v in chained.items()))
    return 0


def chained_walls(original: onnx.ModelProto, fused: onnx.ModelProto, feeds: dict, threads: int,
                  runs: int) -> dict[str, float]:
    """Least wall (ms) of the original in one session, of its own subgraphs between the blocks'
    boundaries chained as plain sessions, and of the block bodies chained the same way."""
    blocks = [n for n in fused.graph.node if is_fusion_block(n)]
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "original.onnx")
        onnx.save(original, source)
        pieces = []
        for i, node in enumerate(blocks):
            target = os.path.join(folder, f"piece{i}.onnx")
            onnx.utils.extract_model(source, target, list(node.input), list(node.output))
            pieces.append((node, plain_session(onnx.load(target), threads)))
    bodies = [(node, plain_session(body_model(node), threads)) for node in blocks]
    whole = plain_session(original, threads)
    calls = {"original": lambda: whole.run(None, feeds), "its pieces chained": lambda: _chain(pieces, feeds),
             "bodies chained": lambda: _chain(bodies, feeds)}
    walls: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(runs + 1):  # the first round warms every session up
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            walls[name].append((time.perf_counter() - start) * 1e3)
    return {name: min(values[1:]) for name, values in walls.items()}


def _chain(sessions: list, feeds: dict) -> None:
    """Run ``(node, session)`` pairs in order, each fed the node's inputs by position."""
    values = dict(feeds)
    for node, session in sessions:
        names = [i.name for i in session.get_inputs()]
        outputs = session.run(None, {name: values[tensor] for name, tensor in zip(names, node.input)})
        values.update(zip(node.output, outputs))


def _least(values: list[float] | None) -> float:
    return min(values) if values else 0.0


def _fused_options(threads: int) -> ort.SessionOptions:
    options = new_options()
    options.intra_op_num_threads = threads
    return options


def _table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
