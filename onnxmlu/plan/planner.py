"""The plan stage: the layers' plan (a strategy's, or one written by hand), ready to collapse.

:func:`make_plan` runs a strategy (:func:`~onnxmlu.plan.strategies.run_strategy`) or reads a
plan file, optionally at one precision (the strategy then plans on the layers at that
precision, so its blocks and MPs are chosen for it), optionally forces one MP on every block,
and labels every block with what its body computes (:func:`~onnxmlu.plan.labels.honest_labels`:
a block holding quantized arithmetic is INT8, one with nothing to quantize FP32);
:func:`plan_layers` is what the pipeline's fixed-precision planner calls: that plan with every
block whose weights would not fit in one body split (:data:`BODY_WEIGHT_LIMIT_BYTES`), and each
block's simulated latency at its MP and precision.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable, Sequence, Union
from fnmatch import fnmatchcase

from onnxmlu.errors import OnnxMluError
from onnxmlu.plan.perf.hardware import Hardware
from onnxmlu.plan.labels import honest_labels
from onnxmlu.plan.perf.layers import Layer, layers_at_precision
from onnxmlu.plan.plan import Plan, keep_epilogues, split_oversized_blocks, with_precision
from onnxmlu.precisions import DEFAULT_PRECISION, check_precision
from onnxmlu.plan.perf.model import make_cost
from onnxmlu.plan.perf.model import plan_block_latencies_us
from onnxmlu.plan.strategies import run_strategy

StrategyLike = Union[str, Callable]
PlanLike = Union[Plan, str, os.PathLike]

DEFAULT_STRATEGY = "dlfusion"
#: A block's body is one protobuf message (at most 2 GB serialized, weights inside): the plan
#: stage splits planned blocks whose layers' weights exceed this into consecutive sub-blocks.
BODY_WEIGHT_LIMIT_BYTES = 1_900_000_000


def make_plan(layers: Sequence[Layer], hw: Hardware, *, strategy: StrategyLike = DEFAULT_STRATEGY,
              plan: PlanLike | None = None, mp: int | None = None, precision: str | None = None,
              keep_fp32: Sequence[str] = (), progress: Callable[[int, int], None] | None = None) -> Plan:
    """Run a strategy (name or callable), or load a plan; optionally force one MP everywhere;
    every block labelled with what its body computes (:func:`~onnxmlu.plan.labels.honest_labels`).

    ``precision`` (None: each block as the plan says, FP32 for a strategy) puts every block
    at that precision; a strategy then runs on :func:`layers_at_precision` ``(layers,
    precision)``, so it weighs fusion and MP against the prices at that precision. ``layers``
    are the analysed (FP32) layers either way. ``progress(done, total)`` goes to a strategy
    that counts (:func:`~onnxmlu.plan.strategies.run_strategy`)."""
    if plan is not None:
        chosen = plan if isinstance(plan, Plan) else Plan.load(plan, layers)
    else:
        chosen = keep_epilogues(run_strategy(_at(layers, precision), hw, strategy, progress=progress), layers)
    if precision is not None:
        chosen = with_precision(chosen, precision)
    if mp is not None:
        chosen = _forced_mp(chosen, mp, hw)
    chosen.validate(layers, hw.cores)
    chosen = fp32_where_kept(chosen, kept_layers(layers, keep_fp32)) if keep_fp32 else chosen
    return honest_labels(chosen, layers)


def _at(layers: Sequence[Layer], precision: str | None) -> Sequence[Layer]:
    """The layers a strategy plans on: as analysed for FP32 (or no precision asked)."""
    if precision is None or precision == DEFAULT_PRECISION:
        return layers
    return layers_at_precision(layers, check_precision(precision, "precision"))


def _forced_mp(plan: Plan, mp: int, hw: Hardware) -> Plan:
    if not 1 <= mp <= hw.cores:
        raise OnnxMluError(f"--mp {mp} is outside 1..{hw.cores} (cores of {hw.name})")
    return replace(plan, blocks=tuple(replace(b, mp=mp) for b in plan.blocks), hardware=hw.name,
                   notes=dict(plan.notes))  # precision and the strategy's notes kept


def plan_layers(layers: Sequence[Layer], hw: Hardware, **how) -> tuple[Plan, list[float]]:
    """:func:`make_plan` (``how``: its keywords), blocks over the body limit split, and the
    simulated latency (µs) of each block."""
    chosen = split_oversized_blocks(make_plan(layers, hw, **how), layers, BODY_WEIGHT_LIMIT_BYTES)
    return chosen, block_latencies(layers, chosen, make_cost(hw))


def kept_layers(layers: Sequence[Layer], patterns: Sequence[str]) -> list[bool]:
    """Which layers ``--keep-fp32`` keeps at FP32: a layer whose node name equals a pattern or
    matches it as a shell pattern (``fnmatch``: ``layer4.*``, ``*downsample*``). A pattern that
    matches no layer, or matches a layer that arrives quantized (INT8 only), is a one-line error."""
    kept = [False] * len(layers)
    for pattern in patterns:
        hits = [k for k, layer in enumerate(layers) if layer.name == pattern or fnmatchcase(layer.name, pattern)]
        if not hits:
            raise OnnxMluError(f"--keep-fp32 {pattern!r} matches no layer (node names, e.g. "
                               f"{', '.join(repr(layer.name) for layer in layers[:3])})")
        quantized = [layers[k].name for k in hits if layers[k].quantized]
        if quantized:
            raise OnnxMluError(f"--keep-fp32 {pattern!r} matches {quantized[0]!r}, which arrives quantized "
                               "(the model computes it in INT8)")
        for k in hits:
            kept[k] = True
    return kept


def fp32_where_kept(plan: Plan, kept: Sequence[bool]) -> Plan:
    """``plan`` with each kept layer (:func:`kept_layers`) at FP32: a lower-precision block
    holding kept layers is cut around each run of them (same MP), the runs FP32, the rest at the
    block's precision -- the least change that honours the request (a block runs at one
    precision). ``plan`` itself when nothing changes."""
    blocks = []
    for b in plan.blocks:
        if b.precision == DEFAULT_PRECISION or not any(kept[b.start:b.stop]):
            blocks.append(b)
            continue
        start = b.start
        for k in range(b.start + 1, b.stop + 1):
            if k == b.stop or kept[k] != kept[start]:
                blocks.append(replace(b, start=start, stop=k, precision=DEFAULT_PRECISION if kept[start]
                                      else b.precision))
                start = k
    if tuple(blocks) == plan.blocks:
        return plan
    return Plan(tuple(blocks), plan.strategy, plan.hardware, dict(plan.notes))


def block_latencies(layers: Sequence[Layer], plan: Plan, cost) -> list[float]:
    """Simulated latency (µs) of each block of ``plan`` under ``cost`` (batched by MP when the
    cost function can price many blocks at once: linear in the graph)."""
    return [float(t) for t in plan_block_latencies_us(plan, layers, cost)]
