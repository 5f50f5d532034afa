"""One plan over a range of shapes: its simulated latency at the ends of an input profile.

``--input-shape`` ranges (``MIN..MAX``, ``MIN/OPT/MAX``, :mod:`onnxmlu.frontend.pins`) are
TensorRT-style optimization profiles [TensorRT-profiles]: the plan is chosen at ``opt`` and the fused model is
valid over the whole range (its graph keeps the symbolic dims). The planner makes one plan,
not one per shape bucket: every block is one node whose body runs at every size, so a second
plan would mean a second model. What the range changes is reported instead: the plan's
simulated latency at min, opt and max, and for each block the MP the performance model would
pick at each point (``best_mp``), so a block whose best MP moves across the range shows it.

Nothing here imports onnx: the caller prices the same layers at each point
(:class:`onnxmlu.pipeline.Profile`) and hands them in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from onnxmlu.plan.perf.hardware import Hardware
from onnxmlu.plan.perf.layers import Layer, layers_at_precision
from onnxmlu.plan.perf.model import make_cost, plan_block_latencies_us
from onnxmlu.plan.plan import Plan

#: The points of a profile, in order (as :data:`onnxmlu.frontend.pins.POINTS`).
POINTS = ("min", "opt", "max")


@dataclass(frozen=True)
class BlockAcross:
    """One block over the profile: its latency at its own MP, and the best MP, per point."""

    block: int
    mp: int
    latency_us: dict[str, float]
    best_mp: dict[str, int]

    @property
    def mp_moves(self) -> bool:
        """Whether the best MP differs between points of the range."""
        return len(set(self.best_mp.values())) > 1

    def sentence(self, strategy: str) -> str:
        """The block's MP over the range in words that cannot contradict the plan: the MP it
        runs at is the strategy's choice at the opt shape (a strategy may weigh more than the
        block's own latency); the per-point figures are the fastest MP for the block priced
        alone (what ``fuse``, ``plan`` and the report print)."""
        fastest = ", ".join(f"{m} at {p}" for p, m in self.best_mp.items())
        return (f"block {self.block} runs at mp={self.mp}, chosen by {strategy} at the opt shape; "
                f"priced alone, its fastest MP would be {fastest}")


@dataclass
class ShapeProfile:
    """The plan priced at each point of the input profile (``min``, ``opt``, ``max``)."""

    inputs: dict[str, dict[str, list[int]]]  # point -> input -> shape
    latency_us: dict[str, float]  # point -> the plan's simulated latency there
    blocks: list[BlockAcross] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"inputs": self.inputs, "sim_latency_us": self.latency_us,
                "blocks": [{"block": b.block, "mp": b.mp, "sim_latency_us": b.latency_us, "best_mp": b.best_mp}
                           for b in self.blocks]}


def profile_plan(plan: Plan, layers_at: dict[str, Sequence[Layer]], hw: Hardware,
                 inputs: dict[str, dict[str, list[int]]]) -> ShapeProfile:
    """``plan`` priced on the layers analysed at each point of ``layers_at`` (point -> the
    layers at that point's shapes, the same layers in the same order)."""
    cost = make_cost(hw)
    mps = hw.mp_choices()
    totals, per_block, best = {}, {}, {}
    points = [p for p in POINTS if p in layers_at]
    for point in points:
        layers = layers_at[point]
        per_block[point] = plan_block_latencies_us(plan, layers, cost)
        totals[point] = float(sum(per_block[point]))
        best[point] = [_best_mp(cost, layers, b, mps) for b in plan.blocks]
    blocks = [BlockAcross(k, b.mp, {p: per_block[p][k] for p in points}, {p: best[p][k] for p in points})
              for k, b in enumerate(plan.blocks)]
    return ShapeProfile({p: inputs[p] for p in points}, totals, blocks)


def _best_mp(cost, layers: Sequence[Layer], block, mps: list[int]) -> int:
    at = layers_at_precision(block.layers(layers), block.precision)
    prices = [cost(at, m) for m in mps]
    return mps[min(range(len(mps)), key=prices.__getitem__)]
