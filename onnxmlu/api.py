"""The Python API; the CLI is a thin layer over these functions.

    result = onnxmlu.api.fuse("resnet18.onnx", strategy="dlfusion")
    onnxmlu.api.save_model(result.model, "resnet18.fused.onnx")

Stages (DESIGN §2), each a function of the previous stage's output:
load -> normalize -> rewrite -> analyze -> plan -> collapse -> save.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, Union

import onnx

from onnxmlu.analyze import Analysis, analyze
from onnxmlu.diagnostics import Diagnostic
from onnxmlu.errors import OnnxMluError
from onnxmlu.frontend.load import load_model
from onnxmlu.frontend.normalize import normalize
from onnxmlu.ir.weights import active_store
from onnxmlu.collapse.blocks import BlockFigures, collapse
from onnxmlu.plan.plan import Plan, split_oversized_blocks
from onnxmlu.plan.perf.hardware import DEFAULT_PROFILE, Hardware, load_hardware
from onnxmlu.schema import ensure_registered, is_fusion_block

ModelLike = Union[str, os.PathLike, onnx.ModelProto]
StrategyLike = Union[str, Callable]

DEFAULT_STRATEGY = "dlfusion"
#: A block's body is one protobuf message (at most 2 GB serialized, weights inside): ``fuse``
#: splits planned blocks whose layers' weights exceed this into consecutive sub-blocks.
BODY_WEIGHT_LIMIT_BYTES = 1_900_000_000


@dataclass
class FuseResult:
    """The fused model and everything that explains it."""

    model: onnx.ModelProto
    analysis: Analysis
    plan: Plan
    hardware: Hardware
    rewrite_report: object | None
    block_latency_us: list[float]
    #: What normalize could not do (folding, inference, probing), in the order it happened.
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def all_diagnostics(self) -> list[Diagnostic]:
        """normalize's, every rewrite left undone, every node left on the host."""
        skipped = getattr(self.rewrite_report, "skipped", None) or []
        return [*self.diagnostics, *(Diagnostic("rewrite", r, node, why) for r, node, why in skipped),
                *self.analysis.host_diagnostics()]

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
                "op_types": dict(Counter(l.op_type for l in layers).most_common()),
                "gops": sum(l.gops for l in layers), "sim_latency_us": latency,
            })
        return rows


def as_model(model: ModelLike) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else load_model(model)


def prepare(model: ModelLike, *, input_shapes: dict | None = None, rewrite: bool = True,
            bn_mode: str = "substitute", only: Sequence[str] | None = None, owned: bool = False,
            normalized: bool = False, diagnostics: list[Diagnostic] | None = None):
    """normalize + rewrite: the model the planner sees, and the rewrite report (or None).
    ``owned``: the caller gives ``model`` away, so it is changed in place instead of copied;
    ``normalized``: it already went through :func:`normalize` (with its input shapes);
    ``diagnostics`` receives what normalizing could not do."""
    proto = as_model(model)
    if normalized:
        return _rewritten(proto, rewrite, bn_mode, only)
    refuse_fused(proto)
    # A model loaded here belongs to the pipeline: normalize it in place instead of copying
    normal = normalize(proto, input_shapes, owned=owned or proto is not model, diagnostics=diagnostics)
    return _rewritten(normal, rewrite, bn_mode, only)


def _rewritten(normalized: onnx.ModelProto, rewrite: bool, bn_mode: str, only: Sequence[str] | None):
    if not rewrite:
        return normalized, None
    from onnxmlu.rewrite import rewrite_model

    # rewrite_model exports value_info for every tensor it creates: no second inference pass;
    # the normalized model is ours, so an unchanged one is passed on without a copy
    return rewrite_model(normalized, bn_mode=bn_mode, only=only, copy=False)


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
    from onnxmlu.plan.strategies import get_strategy

    fn = get_strategy(strategy) if isinstance(strategy, str) else strategy
    if not analysis.layers:
        return Plan((), getattr(fn, "__name__", str(strategy)), hw.name)
    result = fn(analysis.layers, hw, cost_function(hw))
    if not isinstance(result, Plan):
        raise OnnxMluError(f"strategy {strategy!r} returned {type(result).__name__}, not a Plan")
    return result


def block_latencies(layers, plan: Plan, cost) -> list[float]:
    """Simulated latency (µs) of each block of ``plan`` under ``cost`` (batched by MP when the
    cost function can price many blocks at once: linear in the graph)."""
    from onnxmlu.plan.perf.model import plan_block_latencies_us

    return [float(t) for t in plan_block_latencies_us(plan, layers, cost)]


def cost_function(hw: Hardware):
    from onnxmlu.plan.perf.model import make_cost

    return make_cost(hw)


def fuse(model: ModelLike, *, strategy: StrategyLike = DEFAULT_STRATEGY, plan=None, mp: int | None = None,
         hardware: str | Hardware = DEFAULT_PROFILE, input_shapes: dict | None = None,
         rewrite: bool = True, bn_mode: str = "substitute") -> FuseResult:
    """Rewrite, plan and collapse a model; nothing is written to disk."""
    notes: list[Diagnostic] = []
    with _collector_paused():
        analysis, chosen, latencies, report, hw = _plan_model(
            model, strategy=strategy, plan=plan, mp=mp, hardware=hardware, input_shapes=input_shapes,
            rewrite=rewrite, bn_mode=bn_mode, diagnostics=notes)
        figures = _block_figures(analysis, chosen, latencies)
        fused = collapse(analysis, chosen, figures)
    return FuseResult(fused, analysis, chosen, hw, report, latencies, notes)


def fuse_to_file(model: str | os.PathLike, output: str | os.PathLike, *, strategy: StrategyLike = DEFAULT_STRATEGY,
                 plan=None, mp: int | None = None, hardware: str | Hardware = DEFAULT_PROFILE,
                 input_shapes: dict | None = None, rewrite: bool = True, bn_mode: str = "substitute",
                 progress: Callable[[str], None] | None = None) -> FuseResult:
    """:func:`fuse` the model file ``model`` and save it at ``output`` (atomically), holding
    the weights about once plus one block in memory: right after normalizing, the large
    weights move out of the protobuf tree into a :class:`~onnxmlu.ir.weights.WeightStore`
    (the parsed model is dropped), and the file is written as pieces, one body at a time, each
    weight released once the last block that reads it is written (:func:`stream_pieces`).
    The result's ``model`` is the fused graph without bodies (what reports need); the
    analysis' model no longer holds the large weights.

    A model whose tensors exceed protobuf's 2 GB limit goes through :func:`collapse` and
    :func:`save_model` instead, which write external data. ``progress`` is told each stage
    ("loading NAME", "fusing ...", "saving NAME") as it starts.
    """
    from onnxmlu.collapse.atomic import needs_external_data, write_pieces_atomic
    from onnxmlu.ir.weights import WeightStore
    from onnxmlu.collapse.blocks import fused_without_bodies, stream_pieces

    say = progress or (lambda stage: None)
    _refuse_output(Path(output), Path(model))
    notes: list[Diagnostic] = []
    with _collector_paused(), WeightStore().active() as store:
        say(f"loading {Path(model).name}")
        light = _load_detached(model, input_shapes, store, notes)
        say(f"fusing: rewrite, plan ({'--plan' if plan is not None else _strategy_name(strategy)}), collapse")
        analysis, chosen, latencies, report, hw = _plan_model(
            light, strategy=strategy, plan=plan, mp=mp, hardware=hardware, input_shapes=None,
            rewrite=rewrite, bn_mode=bn_mode, owned=True, normalized=True)
        del light
        figures = _block_figures(analysis, chosen, latencies)
        say(f"saving {Path(output).name}")
        if needs_external_data(analysis.model):  # over 2 GB: one message cannot hold it
            fused = collapse(analysis, chosen, figures)
            save_model(fused, output, input_path=model)
            return FuseResult(fused, analysis, chosen, hw, report, latencies, notes)
        fused, blocks = fused_without_bodies(analysis, chosen, figures)
        write_pieces_atomic(stream_pieces(analysis, fused, blocks), Path(output))
    return FuseResult(fused, analysis, chosen, hw, report, latencies, notes)


def _block_figures(analysis: Analysis, plan: Plan, latencies: Sequence[float]) -> list[BlockFigures]:
    """Each block's GOPs and simulated latency, as its node records them."""
    return [BlockFigures(sum(l.gops for l in b.layers(analysis.layers)), t) for b, t in zip(plan.blocks, latencies)]


def _load_detached(path: str | os.PathLike, input_shapes: dict | None, store,
                   diagnostics: list[Diagnostic]) -> onnx.ModelProto:
    """Load, check and normalize the model, then move its large weights into ``store``. The
    parsed model dies with this frame: protobuf frees a tree's memory only as a whole."""
    model = load_model(path)
    refuse_fused(model)
    return store.detach(normalize(model, input_shapes, owned=True, diagnostics=diagnostics))


def _strategy_name(strategy: StrategyLike) -> str:
    return strategy if isinstance(strategy, str) else getattr(strategy, "__name__", str(strategy))


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while the pipeline allocates: its full passes over
    graphsurgeon's object graph were a quarter of the CPU time of a 20k-node fuse."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _plan_model(model: ModelLike, *, strategy, plan, mp, hardware, input_shapes, rewrite, bn_mode, owned=False,
                normalized=False, diagnostics=None):
    """prepare -> analyze -> plan: the analysis, the plan, its block latencies, the rewrite report."""
    ensure_registered()
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)
    prepared, report = prepare(model, input_shapes=input_shapes, rewrite=rewrite, bn_mode=bn_mode, owned=owned,
                               normalized=normalized, diagnostics=diagnostics)
    store = active_store()
    if store is not None:
        store.keep_only(prepared)  # the weights a rewrite replaced (e.g. Gemm's untransposed B)
    gc.collect()  # the rewrite's graphsurgeon graph is cyclic garbage holding the pre-rewrite weights
    analysis = analyze(prepared)
    chosen = make_plan(analysis, hw, strategy=strategy, plan=plan, mp=mp)
    chosen = split_oversized_blocks(chosen, analysis.layers, BODY_WEIGHT_LIMIT_BYTES)
    latencies = block_latencies(analysis.layers, chosen, cost_function(hw))
    return analysis, chosen, latencies, report, hw


def save_model(model: onnx.ModelProto, path: str | os.PathLike, *, input_path: str | os.PathLike | None = None,
               external_data: bool | None = None) -> Path:
    """Write ``model`` atomically (see :mod:`onnxmlu.collapse.atomic`): the destination ends up holding
    the previous complete file or the new one, never a truncated file.

    ``external_data``: None (default) keeps everything in one file unless the model's tensors
    exceed protobuf's 2 GB limit, then writes them (block bodies included) to ``NAME.data``
    next to ``NAME``; True always does that; False never does (a model over 2 GB then fails).
    Every failure is a one-line :class:`OnnxMluError`.
    """
    from onnxmlu.collapse.atomic import write_model_atomic

    out = Path(path)
    if input_path is not None:
        _refuse_output(out, Path(input_path))
    return write_model_atomic(model, out, external_data=external_data)


def _refuse_output(out: Path, input_path: Path) -> None:
    if _same_file(out, input_path):
        raise OnnxMluError(f"output {out} is the input file; choose another output path")
    if _same_file(out.with_name(out.name + ".data"), input_path):
        raise OnnxMluError(f"output {out} would overwrite the input file with its external data; "
                           "choose another output path")


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
        latency = sum(block_latencies(analysis.layers, plan, cost))
        results.append(StrategyResult(name, plan, latency, elapsed))
    return results
