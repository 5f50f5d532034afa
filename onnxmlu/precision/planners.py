"""Precision planners: what the plan pass calls, one registry entry per ``--precision`` value.

A :class:`PrecisionPlanner` is a planner like any other (docs/precision.md): ``plan(analysis,
hw, options) -> Planned`` plus what the options may ask of it, so no caller tests a precision
by name:

* ``fp32``, ``fp16``, ``int8`` -- the strategy's plan (or the plan file) with every block at that
  precision, the strategy pricing the layers at it (:func:`plan_fixed_precision`);
* ``auto`` -- blocks, MPs and a precision per block under an accuracy budget, judged on held-out
  samples (:mod:`onnxmlu.precision.auto`); it chooses blocks and MPs itself and is the one that
  takes ``--accuracy`` / ``--metric`` / ``--validation`` (``judged``);
* no ``--precision`` -- the plan as made, FP32 for a strategy, a plan file's own precisions
  (:data:`AS_PLANNED`).

``needs_samples``: the planner calibrates INT8 blocks on samples of their inputs (``int8``,
``auto``). ``folds_bn``: BatchNormalization is folded into its producer by default, where INT8 may be
chosen: the part quantizes a convolution's weights per output channel, so a folded
normalization is quantized with them, where a separate scale layer would be an INT8
element-wise layer of its own. A new planner is one :meth:`Registry.register` call.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from onnxmlu.analyze import Analysis
from onnxmlu.diagnostics import Diagnostic
from onnxmlu.errors import OnnxMluError
from onnxmlu.plan.labels import honest_labels
from onnxmlu.plan.perf.hardware import Hardware
from onnxmlu.plan.perf.model import make_cost
from onnxmlu.plan.plan import Plan, split_oversized_blocks
from onnxmlu.plan import planner as plan_stage
from onnxmlu.plan.planner import block_latencies, plan_layers
from onnxmlu.precision import PRECISIONS
from onnxmlu.precision.accuracy import load_metric
from onnxmlu.optional import optional_import
from onnxmlu.progress import reporter
from onnxmlu.registry import Registry

if TYPE_CHECKING:
    from onnxmlu.precision.auto import AutoResult
    from onnxmlu.precision.bodies import BlockBodies


@dataclass
class Planned:
    """What a planner leaves: the plan and each block's simulated latency (µs, at the block's
    MP and precision; blocks over the body limit already split), and, from a planner that made
    them, the blocks' bodies, its report and its diagnostics."""

    plan: Plan
    latencies: list[float]
    bodies: "BlockBodies | None" = None
    auto: "AutoResult | None" = None
    diagnostics: list[Diagnostic] = field(default_factory=list)


@dataclass(frozen=True)
class PrecisionPlanner:
    """One ``--precision`` value: its planner and what it takes (module docstring).
    ``options`` is the pipeline's :class:`~onnxmlu.options.Options`."""

    name: str
    plan: Callable[[Analysis, Hardware, object], Planned]
    folds_bn: bool = False
    judged: bool = False  # chooses blocks and MPs under --accuracy/--metric, judged on --validation
    needs_samples: bool = False  # calibrates on samples of the blocks' inputs (INT8 may be chosen)

    def check(self, options) -> None:
        """One-line errors, before any pass, for options this planner cannot honour
        (``options``: the pipeline's :class:`~onnxmlu.options.Options`)."""
        asked = options.precision
        if not self.judged:
            searches = " or ".join(f"--precision {name}" for name in judged_names())
            if asked.accuracy is not None:
                raise OnnxMluError(f"--accuracy is the budget of {searches}; add it")
            if asked.metric is not None:
                raise OnnxMluError(f"--metric judges {searches}; add it")
            return
        if options.plan.file is not None or options.plan.mp is not None:
            raise OnnxMluError(f"--precision {self.name} chooses blocks and MPs itself; drop --plan / --mp")
        if asked.accuracy is not None and asked.accuracy.metric == "metric" and asked.metric is None:
            raise OnnxMluError("--accuracy metric>=X judges by a user metric: give --metric module:function")
        if asked.metric is not None:
            load_metric(asked.metric)  # a metric that cannot be loaded is one line now, not after planning


def plan_fixed_precision(analysis: Analysis, hw: Hardware, options) -> Planned:
    """The strategy's plan (or the plan file), every block at ``options.precision.name`` when one is
    given, the strategy planning on the layers at that precision (:func:`plan_layers`)."""
    how = options.plan
    return Planned(*plan_layers(analysis.layers, hw, strategy=how.strategy, plan=how.file, mp=how.mp,
                                precision=options.precision.name, keep_fp32=options.precision.keep_fp32,
                                progress=reporter()))


def plan_auto_precision(analysis: Analysis, hw: Hardware, options) -> Planned:
    """``--precision auto``: blocks, MPs and precisions under the accuracy budget
    (:func:`~onnxmlu.precision.auto.plan_analysis`, on the calibration samples), blocks over the
    body limit split, and the bodies it measured, for collapse."""
    auto, asked = optional_import("onnxmlu.precision.auto"), options.precision
    effort = replace(asked.auto or auto.AutoOptions(), keep_fp32=asked.keep_fp32)
    result = auto.plan_analysis(analysis, hw, asked.accuracy, calibration=asked.calibration, int8=asked.int8,
                                effort=effort, validation=asked.validation, metric=asked.metric)
    plan = split_oversized_blocks(honest_labels(result.plan, analysis.layers), analysis.layers,
                                  plan_stage.BODY_WEIGHT_LIMIT_BYTES)
    latencies = block_latencies(analysis.layers, plan, make_cost(hw))
    return Planned(plan, latencies, result.evaluator.bodies_for(plan), result, result.diagnostics)


#: ``--precision`` value -> its planner, in the order the CLI lists them.
PLANNERS: Registry[PrecisionPlanner] = Registry("precision", [
    *((p, PrecisionPlanner(p, plan_fixed_precision, folds_bn=p == "int8", needs_samples=p == "int8"))
      for p in PRECISIONS),
    ("auto", PrecisionPlanner("auto", plan_auto_precision, folds_bn=True, judged=True, needs_samples=True)),
])
#: Without ``--precision``: every block as planned.
AS_PLANNED = PrecisionPlanner("", plan_fixed_precision)


def planner_for(precision: str | None) -> PrecisionPlanner:
    """The planner of ``precision`` (None: :data:`AS_PLANNED`); one line for an unknown value."""
    if precision is None:
        return AS_PLANNED
    if precision not in PLANNERS:
        raise OnnxMluError(f"--precision must be one of {', '.join(PLANNERS)}, not {precision!r}")
    return PLANNERS[precision]


def judged_names() -> tuple[str, ...]:
    """The planners that search under a budget (take --accuracy, --metric, --validation)."""
    return tuple(name for name, p in PLANNERS.items() if p.judged)


def bn_for(precision: str | None) -> str:
    """The BatchNormalization rewrite a run at ``precision`` gets by default."""
    return "fold" if planner_for(precision).folds_bn else "substitute"
