"""A decoder step with a KV cache, original against fused: CPU latency per token, and the
simulated latency of prefill against decode per block.

The model is the corpus's opset-23 LLaMA-style decoder layer (tests/realworld/built.py:
RMSNormalization, grouped-query Attention with a KV cache and ``is_causal``, RotaryEmbedding,
a SwiGLU MLP), here at ``--hidden`` with 8 query and 2 key/value heads. It is fused once, pinned
at a one-token step after a 64-token past; the fused file keeps batch, sequence and past
symbolic, so the same file runs every step below.

* **per token**: one decode step (sequence 1) after a past of 1, 16, 64 and 128 tokens,
  original (plain onnxruntime, every optimization) and fused (``onnxmlu.InferenceSession``)
  timed in turns (:func:`onnxmlu.tools.timing.time_in_turns`), at each ``--threads``; with
  ``--before FILE`` (the same layer fused by another checkout: ``--save-fused`` there, or
  ``onnxmlu fuse``), that file too, in the same turns, so a change is measured under one load
  (``--before-without-dims``: this file without its output dims metadata, as older fuses wrote it);
* **growing loop** (``--grow N``): the steps of one decode, past 1 to N, one token each, so
  every step runs at new shapes (as a KV cache grows): each session runs the whole loop in
  turn (original, fused, and ``--before``), ``--rounds`` times, the median of its mean per step
  reported; a block whose present caches cannot be allocated before its run copies them out at
  every step (custom_ops/dim_expr.h: the dims the fused file records avoid it), and
  :func:`onnxmlu.runtime.copy_report` says how many outputs the fused session copied;
* **simulated**: the dlfusion and the optimal plan priced at a 128-token prefill (no past) and
  at a one-token decode after 128, block by block (``onnxmlu plan --input-shape``).

    .venv/bin/python scripts/bench_decoder.py [--hidden 512] [--threads 1 2] [--rounds 40] [--chunk 5]
        [--save-fused FILE] [--before FILE | --before-without-dims] [--grow 128] [--only-grow] [--kv-heads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "realworld")]

from built import opset23_decoder_layer  # noqa: E402

from onnxmlu import api  # noqa: E402
from onnxmlu.collapse.dims import DIMS_KEY  # noqa: E402
from onnxmlu.runtime import InferenceSession, copy_report  # noqa: E402
from onnxmlu.schema import body_model, fill_body_attribute, is_fusion_block, set_body_digest  # noqa: E402
from onnxmlu.sessions import new_options  # noqa: E402
from onnxmlu.tools.timing import time_in_turns  # noqa: E402

HEADS, KV_HEADS = 8, 2
PASTS = (1, 16, 64, 128)
#: Positions the layer's rotary tables hold by default (tests/realworld/built.py); a longer
#: growing loop builds longer tables.
POSITIONS = 256


def shapes(hidden: int, seq: int, past: int, kv: int = KV_HEADS) -> dict[str, list[int]]:
    head = hidden // HEADS
    return {"x": [1, seq, hidden], "position_ids": [1, seq], "past_key": [1, kv, past, head],
            "past_value": [1, kv, past, head]}


def feeds(hidden: int, seq: int, past: int, kv: int = KV_HEADS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(past)
    out = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes(hidden, seq, past, kv).items()}
    out["position_ids"] = np.arange(past, past + seq, dtype=np.int64)[None, :]
    return out


def per_token(model, fused, hidden: int, threads: int, rounds: int, before=None, chunk: int = 5,
              kv: int = KV_HEADS) -> list[str]:
    sessions = _sessions(model, fused, threads, before)
    rows = []
    for past in PASTS:
        got = time_in_turns(sessions, feeds(hidden, 1, past, kv), rounds=rounds, chunk=chunk)
        o, f = got["original"].median_ms * 1e3, got["fused"].median_ms * 1e3
        row = f"| {threads} | {past} | {o:.1f} | {f:.1f} | {f / o:.3f} |"
        if before is not None:
            b = got["before"].median_ms * 1e3
            row += f" {b:.1f} | {b / o:.3f} |"
        rows.append(row)
    return rows


def _sessions(model, fused, threads: int, before=None) -> dict:
    options = new_options()
    options.intra_op_num_threads = threads
    sessions = {"original": ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]),
                "fused": InferenceSession(fused, options)}
    if before is not None:
        sessions["before"] = InferenceSession(before, options)
    return sessions


def growing(model, fused, hidden: int, threads: int, rounds: int, steps: int, before=None,
            kv: int = KV_HEADS) -> str:
    """One table row: the mean per step of a decode whose past grows 1..``steps`` (module docstring)."""
    sessions = _sessions(model, fused, threads, before)
    loop = [feeds(hidden, 1, past, kv) for past in range(1, steps + 1)]
    per_step: dict[str, list[float]] = {name: [] for name in sessions}
    copied = {}
    for r in range(rounds + 1):  # round 0 warms up
        names = list(sessions)[r % len(sessions):] + list(sessions)[:r % len(sessions)]
        for name in names:
            start_copies, start = copy_report().copied_outputs, time.perf_counter()
            for step in loop:
                sessions[name].run(None, step)
            if r > 0:
                per_step[name].append((time.perf_counter() - start) / steps * 1e6)
                copied[name] = copy_report().copied_outputs - start_copies
    med = {name: statistics.median(v) for name, v in per_step.items()}
    row = (f"| {threads} | 1→{steps} | {med['original']:.1f} | {med['fused']:.1f} | "
           f"{med['fused'] / med['original']:.3f} | {copied['fused']} |")
    if before is not None:
        row += f" {med['before']:.1f} | {med['before'] / med['original']:.3f} | {copied['before']} |"
    return row


def without_dims(fused):
    """``fused`` as a fuse before the output dims metadata wrote it (the same blocks without it)."""
    out = type(fused)()
    out.CopyFrom(fused)
    for node in filter(is_fusion_block, out.graph.node):
        body = body_model(node)
        kept = [p for p in body.metadata_props if p.key != DIMS_KEY]
        del body.metadata_props[:]
        body.metadata_props.extend(kept)
        data = body.SerializeToString()
        fill_body_attribute(next(a for a in node.attribute if a.name == "body"), data)
        set_body_digest(node, data)
    return out


def simulated(model, hidden: int, kv: int = KV_HEADS) -> list[str]:
    rows = []
    for strategy in ("dlfusion", "optimal"):
        for label, seq, past in (("prefill 128", 128, 0), ("decode after 128", 1, 128)):
            report = api.plan(model, input_shapes=shapes(hidden, seq, past, kv), strategy=strategy)
            blocks = " · ".join(f"block {i}: mp={b.mp} {t:.1f} µs" for i, (b, t)
                                in enumerate(zip(report.plan.blocks, report.block_latency_us)))
            rows.append(f"| {strategy} | {label} | {blocks} | {report.sim_latency_us:.1f} |")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=40, help="rounds of --chunk timed runs each")
    p.add_argument("--chunk", type=int, default=5,
                   help="timed runs per session per round (more: fewer runs just after the idle wait, whose "
                        "caches other processes may have emptied)")
    p.add_argument("--save-fused", type=Path, help="also write the fused layer there")
    p.add_argument("--before", type=Path, help="a fused file of the same layer to time beside this checkout's")
    p.add_argument("--kv-heads", type=int, default=KV_HEADS, choices=(1, 2, 4, 8),
                   help="key/value heads (8: a cache four times the default's, as multi-head attention keeps)")
    p.add_argument("--before-without-dims", action="store_true",
                   help="as --before, the same fused layer without its output dims metadata (the copy path)")
    p.add_argument("--grow", type=int, default=128, help="steps of the growing loop (past 1..N; 0: none)")
    p.add_argument("--only-grow", action="store_true", help="only the growing loop (no fixed pasts, no plans)")
    args = p.parse_args()
    if args.grow < 0:
        p.error("--grow must be 0 or more")
    model = opset23_decoder_layer(hidden=args.hidden, heads=HEADS, kv_heads=args.kv_heads, ffn=2 * args.hidden,
                                  positions=max(POSITIONS, args.grow + 1))
    fused = api.fuse(model, input_shapes=shapes(args.hidden, 1, 64, args.kv_heads)).model
    if args.save_fused:
        api.save_model(fused, args.save_fused)
    blocks = sum(n.op_type == "MLUFusionBlock" for n in fused.graph.node)
    print(f"decoder layer, hidden {args.hidden}, {HEADS} heads / {args.kv_heads} kv heads: {blocks} block(s); "
          f"{os.cpu_count()} cores")
    before = str(args.before) if args.before else (without_dims(fused) if args.before_without_dims else None)
    if args.grow > 0:
        _print_growing(model, fused, args, before)
    if args.only_grow:
        return 0
    extra = (" before µs / token | before / original |", "---|---|") if args.before else ("", "")
    print(f"\n| threads | past | original µs / token | fused µs / token | fused / original |{extra[0]}\n"
          f"|---|---|---|---|---|{extra[1]}")
    for threads in args.threads:
        print("\n".join(per_token(model, fused, args.hidden, threads, args.rounds, before, args.chunk,
                                   args.kv_heads)))
    print("\n| strategy | step | blocks (simulated) | total µs |\n|---|---|---|---|")
    print("\n".join(simulated(model, args.hidden, args.kv_heads)))
    return 0


def _print_growing(model, fused, args, before) -> None:
    extra = (" before µs / step | before / original | before copies / loop |", "---|---|---|") if before else ("", "")
    print(f"\n| threads | past | original µs / step | fused µs / step | fused / original | fused copies / loop |"
          f"{extra[0]}\n|---|---|---|---|---|---|{extra[1]}")
    for threads in args.threads:
        print(growing(model, fused, args.hidden, threads, args.rounds, args.grow, before, args.kv_heads), flush=True)


if __name__ == "__main__":
    sys.exit(main())
