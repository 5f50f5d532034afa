"""What the user asked for: one typed object per concern, built once where the options enter.

The CLI parses its options into these objects and hands them to :mod:`onnxmlu.api` (an API
call's keywords become the same objects, :meth:`Options.of`); the pipeline's passes and the
planners read the one each needs, and nothing below parses an option again:

* :class:`ShapeOptions` -- ``--input-shape`` pins, the ``--inputs`` arrays the shape probe runs and
  its memory budget (``--max-memory``);
* :class:`RewriteOptions` -- whether to rewrite, ``--bn`` (None: the precision's default) and ``--only``;
* :class:`PlanOptions` -- ``--strategy``, ``--plan`` and ``--mp``;
* :class:`PrecisionOptions` -- ``--precision`` and what its planner takes (samples, ``--calibrator``,
  the ``--accuracy`` budget parsed into a :class:`~onnxmlu.precision.accuracy.Budget`, ``--keep-fp32``,
  ``--metric``, auto's effort);
* :class:`OutputOptions` -- ``--portable`` and ``--check`` (:class:`CheckOptions`).

:class:`Options`, what the pipeline reads, holds the first four. Each object checks what it can
when it is made (a one-line :class:`~onnxmlu.errors.OnnxMluError`: an unknown precision, a
budget that does not parse, a calibration folder with no sample), before any pass runs. The
choice lists live in their registries: rewriters and BN modes (:mod:`onnxmlu.rewrite`),
strategies (:mod:`onnxmlu.plan.strategies`), precisions (:data:`~onnxmlu.precision.planners.PLANNERS`),
calibrators (:data:`~onnxmlu.precision.int8.CALIBRATION_METHODS`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Sequence

from onnxmlu.errors import OnnxMluError
from onnxmlu.frontend.memory import default_budget, parse_size
from onnxmlu.optional import optional_import
from onnxmlu.plan.planner import DEFAULT_STRATEGY, PlanLike, StrategyLike
from onnxmlu.precision.accuracy import Budget
from onnxmlu.precision.planners import PrecisionPlanner, bn_for, planner_for

if TYPE_CHECKING:
    from onnxmlu.precision.auto import AutoOptions
    from onnxmlu.precision.int8 import Int8Options

PathLike = str | os.PathLike
#: ``--calibrator``'s default, :class:`~onnxmlu.precision.int8.Int8Options`' own.
DEFAULT_CALIBRATOR = "minmax"


@dataclass(frozen=True)
class ShapeOptions:
    """``input_shapes``: the parsed ``--input-shape`` pins (they choose the plan, never the graph);
    ``inputs``: the user's arrays by input name (``--inputs``), run by the shape probe;
    ``max_memory``: the shape probes' memory budget (``--max-memory``: bytes, or text such as
    ``4G``, parsed here; None: :func:`~onnxmlu.frontend.memory.default_budget` when made)."""

    input_shapes: dict | None = None
    inputs: dict | None = None
    max_memory: int | str | None = None

    def __post_init__(self) -> None:
        budget = self.max_memory
        budget = default_budget() if budget is None else parse_size(budget) if isinstance(budget, str) else int(budget)
        object.__setattr__(self, "max_memory", budget)


@dataclass(frozen=True)
class RewriteOptions:
    """``enabled``: run the rewriters; ``bn_mode``: ``--bn`` (None: the precision's default,
    :func:`~onnxmlu.precision.planners.bn_for`); ``only``: the rewriters to run (None: all)."""

    enabled: bool = True
    bn_mode: str | None = None
    only: Sequence[str] | None = None


@dataclass(frozen=True)
class PlanOptions:
    """A strategy (name or callable) or a plan file, and an MP forced on every block."""

    strategy: StrategyLike = DEFAULT_STRATEGY
    plan: PlanLike | None = None
    mp: int | None = None


@dataclass(frozen=True)
class PrecisionOptions:
    """``name``: ``--precision`` (None: every block as planned); what its planner takes:
    ``calibration``/``validation`` sample folders, ``int8`` (how INT8 blocks are quantized; None:
    MinMax), ``accuracy`` (``--precision auto``'s budget; its text is parsed here, once),
    ``auto`` (how hard auto looks; None: the defaults), ``keep_fp32`` (layers kept at FP32) and
    ``metric`` (a user metric ``module:function``)."""

    name: str | None = None
    calibration: PathLike | None = None
    validation: PathLike | None = None
    int8: "Int8Options | None" = None
    accuracy: Budget | None = None
    auto: "AutoOptions | None" = None
    keep_fp32: tuple[str, ...] = ()
    metric: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "accuracy", Budget.of(self.accuracy))  # the one parse on the fuse/plan path
        object.__setattr__(self, "keep_fp32", tuple(self.keep_fp32))
        planner_for(self.name)  # one line for an unknown precision

    @property
    def planner(self) -> PrecisionPlanner:
        """The planner of ``--precision`` (:data:`~onnxmlu.precision.planners.PLANNERS`)."""
        return planner_for(self.name)

    @classmethod
    def parse(cls, name: str | None = None, *, calibration: PathLike | None = None,
              validation: PathLike | None = None, calibrator: str = DEFAULT_CALIBRATOR,
              accuracy: Budget | str | None = None, keep_fp32: Sequence[str] = (), metric: str | None = None,
              pareto: bool = False) -> "PrecisionOptions":
        """From the options as the user gives them: a calibrator name, sample folders checked
        now (a missing folder, or one with no readable sample, is one line before any work),
        ``pareto`` (auto measures every frontier plan, for the Pareto plot)."""
        planner_for(name)  # one line for an unknown precision, before anything else
        int8 = None if calibrator == DEFAULT_CALIBRATOR else _int8().Int8Options(method=calibrator)
        for folder, what in ((calibration, "calibration"), (validation, "validation")):
            if folder is not None:  # the samples are checked against the model's inputs when used
                load_samples(folder, what=what)
        auto = optional_import("onnxmlu.precision.auto").AutoOptions(measure_frontier=True) if pareto else None
        return cls(name, calibration, validation, int8, accuracy, auto, tuple(keep_fp32), metric)


def _int8():
    return optional_import("onnxmlu.precision.int8")


def load_samples(folder: PathLike, model=None, what: str = "calibration"):
    """The samples of a folder (:func:`~onnxmlu.precision.calibration.load_calibration`, loaded
    only when a folder is given); a one-line error for a folder that cannot be read."""
    return optional_import("onnxmlu.precision.calibration").load_calibration(folder, model, what)


@dataclass(frozen=True)
class CheckOptions:
    """``fuse --check``: compare the fused model with the original on these seeds."""

    seeds: Sequence[int] = (0,)
    atol: float = 1e-4
    rtol: float = 1e-4
    inputs: dict | None = None  # fixed arrays by input name (--inputs)
    accuracy: Budget | None = None  # a budget that decides instead of atol/rtol (its text is parsed here)
    samples: PathLike | None = None  # a folder of samples (--inputs DIR), run instead of the seeds
    qtol: float = 2.0  # steps of its scale a quantized output may move by (tools/verify.py)
    allow_nan: bool = False  # NaN/Inf the reference has at the same places passes

    def __post_init__(self) -> None:
        object.__setattr__(self, "accuracy", Budget.of(self.accuracy))  # the one parse on the check path


@dataclass(frozen=True)
class OutputOptions:
    """How ``fuse`` writes and checks: ``portable`` (blocks as ONNX functions) and ``check``."""

    portable: bool = False
    check: CheckOptions | None = None
    best_effort: bool = False  # publish a --precision auto plan whose --accuracy budget is not met


@dataclass
class Options:
    """What the pipeline reads: one object per concern. Made, the precision's planner checks
    what it cannot honour (:meth:`~onnxmlu.precision.planners.PrecisionPlanner.check`) and a BN
    mode left open becomes the precision's default: folded into its producer where INT8 may be
    chosen (the quantizer then quantizes it with the convolution's per-channel weights; a
    separate scale layer would be an INT8 element-wise layer of its own), else ``substitute``."""

    shapes: ShapeOptions = field(default_factory=ShapeOptions)
    rewrite: RewriteOptions = field(default_factory=RewriteOptions)
    plan: PlanOptions = field(default_factory=PlanOptions)
    precision: PrecisionOptions = field(default_factory=PrecisionOptions)

    def __post_init__(self) -> None:
        self.precision.planner.check(self)
        if self.rewrite.bn_mode is None:
            self.rewrite = replace(self.rewrite, bn_mode=bn_for(self.precision.name))

    @classmethod
    def of(cls, *, strategy: StrategyLike = DEFAULT_STRATEGY, plan: PlanLike | None = None, mp: int | None = None,
           input_shapes: dict | None = None, inputs: dict | None = None, rewrite: bool = True,
           bn_mode: str | None = None, only: Sequence[str] | None = None, precision: str | None = None,
           calibration: PathLike | None = None, validation: PathLike | None = None,
           calibrator: str = DEFAULT_CALIBRATOR, accuracy: Budget | str | None = None,
           keep_fp32: Sequence[str] = (), metric: str | None = None, pareto: bool = False,
           max_memory: int | str | None = None) -> "Options":
        """The objects of the API's keyword arguments (the same names as the CLI's options)."""
        return cls(ShapeOptions(input_shapes, inputs, max_memory), RewriteOptions(rewrite, bn_mode, only),
                   PlanOptions(strategy, plan, mp),
                   PrecisionOptions.parse(precision, calibration=calibration, validation=validation,
                                          calibrator=calibrator, accuracy=accuracy, keep_fp32=keep_fp32,
                                          metric=metric, pareto=pareto))


def refuse_validation(options: Options, check: bool) -> None:
    """``--validation`` without a use: it judges auto's budget (a judged planner) and ``--check``."""
    if options.precision.validation is not None and not options.precision.planner.judged and not check:
        raise OnnxMluError("--validation holds the samples that judge --precision auto's budget and --check; "
                           "add one of them")
