"""The Python API; the CLI is a thin layer over these functions.

    result = onnxmlu.api.fuse("resnet18.onnx", strategy="dlfusion")
    onnxmlu.api.save_model(result.model, "resnet18.fused.onnx")

Stages (DESIGN §2), each a function of the previous stage's output:
load -> normalize -> rewrite -> analyze -> plan -> collapse -> save.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, Union

import onnx

from onnxmlu.analyze import Analysis, analyze
from onnxmlu.errors import OnnxMluError
from onnxmlu.graph import infer_shapes, load_model, normalize
from onnxmlu.partition.collapse import BlockFigures, collapse
from onnxmlu.partition.plan import Plan
from onnxmlu.perf.hardware import DEFAULT_PROFILE, Hardware, load_hardware
from onnxmlu.schema import ensure_registered, is_fusion_block

ModelLike = Union[str, os.PathLike, onnx.ModelProto]
StrategyLike = Union[str, Callable]

DEFAULT_STRATEGY = "dlfusion"


@dataclass
class FuseResult:
    """The fused model and everything that explains it."""

    model: onnx.ModelProto
    analysis: Analysis
    plan: Plan
    hardware: Hardware
    rewrite_report: object | None
    block_latency_us: list[float]

    @property
    def sim_latency_us(self) -> float:
        return float(sum(self.block_latency_us))

    @property
    def sim_fps(self) -> float:
        return 1e6 / self.sim_latency_us if self.sim_latency_us > 0 else float("inf")

    def block_rows(self) -> list[dict]:
        rows = []
        for b, (block, latency) in enumerate(zip(self.plan.blocks, self.block_latency_us)):
            layers = self.analysis.layers[block.start : block.stop]
            rows.append({
                "block": b, "mp": block.mp, "layers": len(layers),
                "first": layers[0].name, "last": layers[-1].name,
                "op_types": sorted({l.op_type for l in layers}),
                "gops": sum(l.gops for l in layers), "sim_latency_us": latency,
            })
        return rows


def as_model(model: ModelLike) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else load_model(model)


def prepare(model: ModelLike, *, input_shapes: dict | None = None, rewrite: bool = True,
            bn_mode: str = "substitute", only: Sequence[str] | None = None):
    """normalize + rewrite: the model the planner sees, and the rewrite report (or None)."""
    proto = as_model(model)
    refuse_fused(proto)
    normalized = normalize(proto, input_shapes)
    if not rewrite:
        return normalized, None
    from onnxmlu.rewrite import rewrite_model

    rewritten, report = rewrite_model(normalized, bn_mode=bn_mode, only=only)
    return infer_shapes(rewritten), report


def refuse_fused(model: onnx.ModelProto) -> None:
    blocks = sum(1 for n in model.graph.node if is_fusion_block(n))
    if blocks:
        raise OnnxMluError(f"model is already fused ({blocks} MLUFusionBlock nodes); "
                           "fuse the original model instead")


def inspect(model: ModelLike, *, input_shapes: dict | None = None, rewrite: bool = False) -> Analysis:
    prepared, _ = prepare(model, input_shapes=input_shapes, rewrite=rewrite)
    return analyze(prepared)


def make_plan(analysis: Analysis, hw: Hardware, *, strategy: StrategyLike = DEFAULT_STRATEGY,
              plan: Plan | str | os.PathLike | None = None, mp: int | None = None) -> Plan:
    """Run a strategy (name or callable), or load a plan; optionally force one MP everywhere."""
    if plan is not None:
        chosen = plan if isinstance(plan, Plan) else Plan.load(plan, analysis.layers)
    else:
        chosen = _run_strategy(strategy, analysis, hw)
    if mp is not None:
        if not 1 <= mp <= hw.cores:
            raise OnnxMluError(f"--mp {mp} is outside 1..{hw.cores} (cores of {hw.name})")
        chosen = Plan(tuple(type(b)(b.start, b.stop, mp) for b in chosen.blocks), chosen.strategy, hw.name)
    chosen.validate(analysis.layers, hw.cores)
    return chosen


def _run_strategy(strategy: StrategyLike, analysis: Analysis, hw: Hardware) -> Plan:
    from onnxmlu.strategies import get_strategy

    fn = get_strategy(strategy) if isinstance(strategy, str) else strategy
    if not analysis.layers:
        return Plan((), getattr(fn, "__name__", str(strategy)), hw.name)
    result = fn(analysis.layers, hw, cost_function(hw))
    if not isinstance(result, Plan):
        raise OnnxMluError(f"strategy {strategy!r} returned {type(result).__name__}, not a Plan")
    return result


def cost_function(hw: Hardware):
    from onnxmlu.perf.model import make_cost

    return make_cost(hw)


def fuse(model: ModelLike, *, strategy: StrategyLike = DEFAULT_STRATEGY, plan=None, mp: int | None = None,
         hardware: str | Hardware = DEFAULT_PROFILE, input_shapes: dict | None = None,
         rewrite: bool = True, bn_mode: str = "substitute") -> FuseResult:
    """Rewrite, plan and collapse a model; nothing is written to disk."""
    ensure_registered()
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)
    prepared, report = prepare(model, input_shapes=input_shapes, rewrite=rewrite, bn_mode=bn_mode)
    analysis = analyze(prepared)
    chosen = make_plan(analysis, hw, strategy=strategy, plan=plan, mp=mp)
    cost = cost_function(hw)
    latencies = [float(cost(b.layers(analysis.layers), b.mp)) for b in chosen.blocks]
    figures = [BlockFigures(sum(l.gops for l in b.layers(analysis.layers)), t)
               for b, t in zip(chosen.blocks, latencies)]
    fused = collapse(analysis, chosen, figures)
    return FuseResult(fused, analysis, chosen, hw, report, latencies)


def save_model(model: onnx.ModelProto, path: str | os.PathLike, *, input_path: str | os.PathLike | None = None) -> Path:
    """Write ``model`` atomically: a temporary file in the same folder, fsync, then rename."""
    out = Path(path)
    if input_path is not None and _same_file(out, Path(input_path)):
        raise OnnxMluError(f"output {out} is the input file; choose another output path")
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        raise OnnxMluError(f"output folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise OnnxMluError(f"output folder {folder} is not writable")
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(model.SerializeToString())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))
    except OSError:
        return False


def rewrite(model: ModelLike, *, bn_mode: str = "substitute", only: Sequence[str] | None = None,
            input_shapes: dict | None = None):
    """Run the rewriters alone: the rewritten model and the report."""
    return prepare(model, input_shapes=input_shapes, rewrite=True, bn_mode=bn_mode, only=only)


@dataclass(frozen=True)
class StrategyResult:
    strategy: str
    plan: Plan
    sim_latency_us: float
    plan_seconds: float

    @property
    def fps(self) -> float:
        return 1e6 / self.sim_latency_us if self.sim_latency_us > 0 else float("inf")


def compare(analysis: Analysis, hw: Hardware, strategies: Sequence[str]) -> list[StrategyResult]:
    """Plan with every strategy and price each plan with the performance model."""
    import time

    cost = cost_function(hw)
    results = []
    for name in strategies:
        start = time.perf_counter()
        plan = make_plan(analysis, hw, strategy=name)
        elapsed = time.perf_counter() - start
        latency = sum(cost(b.layers(analysis.layers), b.mp) for b in plan.blocks)
        results.append(StrategyResult(name, plan, float(latency), elapsed))
    return results
