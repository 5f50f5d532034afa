"""What the API verbs return: one report dataclass per command, each with ``to_dict()``.

``to_dict()`` is the command's JSON report without its ``schema`` tag (docs/json.md; the CLI
adds the tag with :func:`tagged`). The other reports live beside what makes them:
:class:`~onnxmlu.analyze.Analysis` (``inspect``), :class:`~onnxmlu.rewrite.RewriteReport`
(``rewrite``), :class:`~onnxmlu.tools.verify.CheckReport` (``check``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import onnx

from onnxmlu.analyze import Analysis
from onnxmlu.diagnostics import Diagnostic
from onnxmlu.frontend.memory import peak_rss_bytes
from onnxmlu.frontend.pins import shapes_text
from onnxmlu.plan.perf.hardware import Hardware
from onnxmlu.plan.perf.layers import Layer, layers_at_precision
from onnxmlu.plan.perf.model import layer_estimates
from onnxmlu.plan.plan import Plan
from onnxmlu.plan.profile import ShapeProfile
from onnxmlu.analyze.coverage import branch_coverage, coverage

if TYPE_CHECKING:
    from onnxmlu.collapse.branches import BranchPlan
    from onnxmlu.frontend.pins import PricingShape
    from onnxmlu.precision.auto import AutoResult
    from onnxmlu.rewrite import RewriteReport
    from onnxmlu.tools.profiling import NodeProfile
    from onnxmlu.tools.timing import Timing
    from onnxmlu.tools.verify import CheckReport

#: Version of every JSON report's layout; bump it when a key changes meaning or goes away.
SCHEMA_VERSION = 1


def tagged(command: str, payload: dict) -> dict:
    """``payload`` with its ``schema`` tag first, e.g. ``"onnxmlu.fuse/1"`` (docs/json.md)."""
    return {"schema": f"onnxmlu.{command}/{SCHEMA_VERSION}", **payload}


def _fps(latency_us: float) -> float:
    return 1e6 / latency_us if latency_us > 0 else float("inf")


@dataclass
class FuseResult:
    """The fused model and everything that explains it (the ``fuse`` report)."""

    model: onnx.ModelProto
    analysis: Analysis
    plan: Plan
    hardware: Hardware
    rewrite_report: "RewriteReport | None"
    block_latency_us: list[float]
    #: Everything the pipeline did not do, in pass order (normalize, rewrite, analyze, precision).
    diagnostics: list[Diagnostic] = field(default_factory=list)
    #: Seconds each pass took, by pass name, in pass order.
    pass_seconds: dict[str, float] = field(default_factory=dict)
    output: Path | None = None
    #: The comparison with the original (``fuse --check``), when asked for.
    check: "CheckReport | None" = None
    #: Where INT8 blocks were calibrated (:func:`calibration_report`); None without INT8 blocks.
    calibration: dict | None = None
    #: What ``--precision auto`` chose and measured (:class:`~onnxmlu.precision.auto.AutoResult`).
    auto: "AutoResult | None" = None
    #: The plan priced over the ``--input-shape`` ranges (None without a range).
    profile: ShapeProfile | None = None
    #: Blocks planned inside host control flow (:class:`~onnxmlu.collapse.branches.BranchPlan`, one per branch).
    branches: list["BranchPlan"] = field(default_factory=list)
    #: The shape probes' memory budget in bytes (``--max-memory``, :mod:`onnxmlu.frontend.memory`).
    memory_budget: int | None = None
    #: The input shapes the plan was priced at (also in the fused model's ``onnxmlu.pricing_shape``).
    pricing: "PricingShape | None" = None

    @property
    def sim_latency_us(self) -> float:
        return float(sum(self.block_latency_us))

    @property
    def sim_fps(self) -> float:
        return _fps(self.sim_latency_us)

    @property
    def coverage(self):
        """How much of the heavy work runs in blocks (:mod:`onnxmlu.analyze.coverage`)."""
        return coverage(self.analysis, branch_coverage(self.branches))

    def block_rows(self) -> list[dict]:
        return _block_rows(self.plan, self.block_latency_us, self.analysis.layers)

    def layer_rows(self) -> list[list[dict]]:
        """Per block, its layers at its MP and precision as the performance model prices them
        (:func:`~onnxmlu.plan.perf.model.layer_estimates`): the report's drill-down."""
        return [[{"name": e.name, "op_type": e.op_type, "precision": e.precision, "mp": block.mp,
                  "sim_us": e.latency_us, "compute_us": e.compute_us, "memory_us": e.memory_us,
                  "bytes": e.dram_bytes, "bound": e.bound}
                 for e in layer_estimates(layers_at_precision(block.layers(self.analysis.layers), block.precision),
                                          block.mp, self.hardware)]
                for block in self.plan.blocks]

    def to_dict(self) -> dict:
        payload = {} if self.output is None else {"output": str(self.output)}
        payload.update({
            "strategy": self.plan.strategy, "hardware": self.hardware.name, "sim_latency_us": self.sim_latency_us,
            "sim_fps": self.sim_fps, "pricing_shape": None if self.pricing is None else self.pricing.to_dict(),
            "blocks": self.block_rows(), "branches": branch_rows(self.branches),
            "host_nodes": self.analysis.host_nodes(),
            "coverage": self.coverage.to_dict(),
            "calibration": self.calibration, "auto": _auto(self.auto), "profile": _profile(self.profile),
            "diagnostics": [d.to_dict() for d in self.diagnostics], "pass_seconds": dict(self.pass_seconds),
            "memory": {"budget_bytes": self.memory_budget, "peak_rss_bytes": peak_rss_bytes()}})
        if self.check is not None:
            payload["check"] = tagged("check", self.check.to_dict())
        return payload


def _block_rows(plan: Plan, latencies: Sequence[float], layers: Sequence[Layer]) -> list[dict]:
    rows = []
    for b, (block, latency) in enumerate(zip(plan.blocks, latencies)):
        members = layers[block.start : block.stop]
        rows.append({
            "block": b, "mp": block.mp, "precision": block.precision, "layers": len(members),
            "first": members[0].name, "last": members[-1].name,
            "op_types": dict(Counter(l.op_type for l in members).most_common()),
            "gops": sum(l.gops for l in members), "sim_latency_us": latency,
        })
    return rows


def branch_rows(branches, parent: str = "") -> list[dict]:
    """The ``branches`` of the ``fuse`` report, one row per planned subgraph
    (:class:`~onnxmlu.collapse.branches.BranchPlan`), each followed by the rows of its own: its key, the
    key of the subgraph holding it (``""``: the main graph), its op, runs per run of that graph,
    and its blocks and latency per run."""
    rows = []
    for b in branches:
        rows.append({"graph": b.key, "parent": parent, "op_type": b.op_type, "runs": b.runs,
                     "sim_latency_us": b.sim_latency_us, "blocks": _block_rows(b.plan, b.latencies, b.analysis.layers)})
        rows.extend(branch_rows(b.branches, b.key))
    return rows


def _auto(result) -> dict | None:
    return None if result is None else result.to_dict()


def _profile(profile: ShapeProfile | None) -> dict | None:
    return None if profile is None else profile.to_dict()


def calibration_report(bodies) -> dict | None:
    """Where the INT8 blocks' calibration samples came from (``fuse``'s ``calibration``), from
    the run's :class:`~onnxmlu.precision.bodies.BlockBodies`; None when no block is INT8."""
    calibration = getattr(bodies, "calibration", None)
    if calibration is None:
        return None
    return {"source": calibration.source, "samples": len(calibration), "random": calibration.random,
            "calibrator": bodies.int8.method, "description": calibration.describe()}


@dataclass
class PlanReport:
    """A plan for a model's layers, each block priced (the ``plan`` report)."""

    plan: Plan
    layers: Sequence[Layer]
    hardware: Hardware
    block_latency_us: list[float]
    auto: "AutoResult | None" = None  # what --precision auto chose and measured
    profile: ShapeProfile | None = None  # the plan priced over the --input-shape ranges
    #: The input shapes the plan was priced at (what ``fuse`` prints and records).
    pricing: "PricingShape | None" = None

    @property
    def sim_latency_us(self) -> float:
        return float(sum(self.block_latency_us))

    def rows(self) -> list[dict]:
        return [{"block": b, "mp": block.mp, "precision": block.precision, "sim_latency_us": latency,
                 "first": self.layers[block.start].name, "last": self.layers[block.stop - 1].name,
                 "start": block.start, "stop": block.stop}
                for b, (block, latency) in enumerate(zip(self.plan.blocks, self.block_latency_us))]

    def plan_json(self) -> str:
        """The editable plan file (``fuse --plan`` reads it back)."""
        return self.plan.to_json(self.layers)

    def to_dict(self) -> dict:
        total = self.sim_latency_us
        return {"strategy": self.plan.strategy, "hardware": self.hardware.name, "layers": len(self.layers),
                "sim_latency_us": total, "sim_fps": 1e6 / total if total > 0 else None, "blocks": self.rows(),
                "auto": _auto(self.auto), "profile": _profile(self.profile),
                "pricing_shape": None if self.pricing is None else self.pricing.to_dict()}


@dataclass(frozen=True)
class StrategyResult:
    """One strategy's plan on one network, priced; ``columns``: the same strategy in each
    further column of ``compare --precision`` (column name -> result)."""

    strategy: str
    plan: Plan
    sim_latency_us: float
    plan_seconds: float
    precision: str = "fp32"
    columns: dict[str, "StrategyResult"] = field(default_factory=dict, compare=False)

    @property
    def fps(self) -> float:
        return _fps(self.sim_latency_us)


@dataclass
class CompareReport:
    """Every strategy's plan priced on every network (the ``compare`` report)."""

    hardware: Hardware
    strategies: list[str]
    #: the columns after FP32 (``compare --precision``), in order: ``fp16``, ``int8``
    precisions: list[str] = field(default_factory=list)
    #: network name -> one result per strategy, in ``strategies`` order (``none`` first)
    networks: dict[str, list[StrategyResult]] = field(default_factory=dict)

    def rows(self, network: str) -> list[dict]:
        results = self.networks[network]
        base = results[0].sim_latency_us
        return [{"strategy": r.strategy, "sim_latency_us": r.sim_latency_us, "fps": r.fps,
                 "speedup": base / r.sim_latency_us, "blocks": len(r.plan.blocks),
                 "plan_seconds": r.plan_seconds, "precisions": _columns(r)} for r in results]

    def to_dict(self) -> dict:
        return {"hardware": self.hardware.name, "strategies": list(self.strategies),
                "precisions": list(self.precisions), "networks": {name: self.rows(name) for name in self.networks}}


def _columns(result: StrategyResult) -> dict[str, dict]:
    """A compare row's further columns: each one's latency and its speed-up over the row's FP32."""
    return {name: {"sim_latency_us": c.sim_latency_us, "fps": c.fps,
                   "speedup_vs_fp32": result.sim_latency_us / c.sim_latency_us, "blocks": len(c.plan.blocks),
                   "plan_seconds": c.plan_seconds} for name, c in result.columns.items()}


@dataclass
class RunReport:
    """A model run in onnxruntime with the custom-op library (the ``run`` report)."""

    outputs: list[dict]
    latency_ms: "Timing"
    profile: "list[NodeProfile] | None" = None  # per node, with --profile
    #: This run's input shapes, by input name.
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    #: The shapes the fused model's plan was priced at (its simulated figures'), when recorded.
    pricing: "PricingShape | None" = None

    @property
    def priced_elsewhere(self) -> bool:
        """Whether the simulated figures are for other shapes than this run's."""
        return self.pricing is not None and self.pricing.differs(self.input_shapes)

    def run_shape_text(self) -> str:
        return shapes_text(self.input_shapes)
    #: With --profile: what the session's inner thread pools cost when a set-up would spare it
    #: (onnxmlu.runtime.threads.pool_note), else None.
    thread_note: str | None = None

    def to_dict(self) -> dict:
        payload = {"outputs": self.outputs, "latency_ms": asdict(self.latency_ms), "input_shapes": self.input_shapes}
        if self.profile is not None:
            payload["pricing_shape"] = None if self.pricing is None else self.pricing.to_dict()
            payload["profile"] = [asdict(p) for p in self.profile]
        if self.thread_note is not None:
            payload["thread_note"] = self.thread_note
        return payload


@dataclass
class InspectReport:
    """``inspect``'s report of a model: its layers and host nodes (:class:`Analysis`) and the
    input shapes a plan of it would be priced at (what the text output prints after the table)."""

    analysis: Analysis
    pricing: "PricingShape"

    def to_dict(self) -> dict:
        return {**self.analysis.to_dict(), "pricing_shape": self.pricing.to_dict()}


@dataclass
class ZooReport:
    """Zoo models written (the ``zoo`` report)."""

    models: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"models": list(self.models)}
