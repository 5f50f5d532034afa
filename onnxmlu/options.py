"""What the user asked for: one typed object per concern, built once where the options enter.

The CLI parses its flags into these objects, one flag group per object, and hands them to
:mod:`onnxmlu.api`; the pipeline's passes and the planners read the one each needs, and nothing
below parses an option again. An API call may give keywords instead: they are generated from
the records' fields (:class:`Keywords`: a field's keyword is its name or its metadata's
``keyword``, its value made by the metadata's ``parse``), so a new option is one field:

* :class:`ShapeOptions` -- ``--input-shape`` pins, the ``--inputs`` arrays the shape probe runs and
  its memory budget (``--max-memory``);
* :class:`RewriteOptions` -- whether to rewrite, ``--bn`` (None: the precision's default) and ``--only``;
* :class:`PlanOptions` -- ``--strategy``, ``--plan``, ``--mp`` and ``--hw``;
* :class:`PrecisionOptions` -- ``--precision`` and what its planner takes (samples, ``--calibrator``,
  the ``--accuracy`` budget parsed into a :class:`~onnxmlu.precision.accuracy.Budget`, ``--keep-fp32``,
  ``--metric``, auto's effort);
* :class:`OutputOptions` -- ``--portable``, ``--best-effort`` and ``--check`` (:class:`CheckOptions`:
  also the ``check`` command's);
* :class:`PlanFiles` -- what ``plan`` writes (``-o``, ``--plot``, ``--pareto``);
* :class:`CompareOptions` -- what ``compare`` plans and prices (``--zoo``, ``--strategies``,
  ``--precision`` columns and auto's ``--accuracy``, ``--hw``, ``--input-shape``, ``--plot``).

:class:`Options`, what the pipeline reads, holds the first four. Each object checks what it can
when it is made (a one-line :class:`~onnxmlu.errors.OnnxMluError`: an unknown precision, a
budget that does not parse, a calibration folder with no sample), before any pass runs. The
choice lists live in their registries: rewriters and BN modes (:mod:`onnxmlu.rewrite`),
strategies (:mod:`onnxmlu.plan.strategies`), precisions (:data:`~onnxmlu.precision.planners.PLANNERS`),
calibrators (:data:`~onnxmlu.precision.int8.CALIBRATION_METHODS`).
"""

from __future__ import annotations

import os
from dataclasses import Field, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from onnxmlu.errors import OnnxMluError
from onnxmlu.frontend.memory import default_budget, parse_size
from onnxmlu.optional import optional_import
from onnxmlu.plan.perf.hardware import DEFAULT_PROFILE, Hardware
from onnxmlu.plan.planner import DEFAULT_STRATEGY, PlanLike, StrategyLike
from onnxmlu.precision.accuracy import Budget
from onnxmlu.precision.planners import PrecisionPlanner, bn_for, planner_for

if TYPE_CHECKING:
    from onnxmlu.precision.auto import AutoOptions
    from onnxmlu.precision.int8 import Int8Options

PathLike = str | os.PathLike
HardwareLike = str | Hardware
#: ``--calibrator``'s default, :class:`~onnxmlu.precision.int8.Int8Options`' own.
DEFAULT_CALIBRATOR = "minmax"


# ------------------------------------------------------------------ keywords from the fields
def keyword(default: Any = None, *, name: str | None = None, parse: Callable[[Any], Any] | None = None) -> Any:
    """A field that the API's keyword ``name`` sets (None: the field's own name), through
    ``parse`` (the keyword's value as the user gives it -> the field's; None: as given)."""
    return field(default=default, metadata={"keyword": name, "parse": parse})


class Keywords:
    """An option record that an API call's keywords can make: each field is one keyword (its
    name, or the ``name`` of :func:`keyword`), so a new option is a new field and nothing else."""

    @classmethod
    def keywords(cls) -> dict[str, Field]:
        """Keyword -> the field it sets."""
        return {f.metadata.get("keyword") or f.name: f for f in fields(cls)}

    @classmethod
    def take(cls, given: dict):
        """One made from the keywords of ``given`` that name its fields, each taken out of
        ``given`` and parsed (in field order: the first bad one is the error); the fields no
        keyword names keep their defaults."""
        values = {}
        for name, f in cls.keywords().items():
            if name in given:
                parse, value = f.metadata.get("parse"), given.pop(name)
                values[f.name] = value if parse is None else parse(value)
        return cls(**values)

    @classmethod
    def of(cls, **keywords):
        """One made from ``keywords`` (an unknown keyword is a TypeError, as in any call)."""
        made = cls.take(keywords)
        refuse_unknown(f"{cls.__name__}.of", keywords)
        return made


def call_options(verb: str, keywords: dict, *records: tuple[type, Any]) -> tuple:
    """The option objects of an API call ``verb``: per ``(record type, object or None)``, the
    object given, else the one the call's ``keywords`` make (:meth:`Keywords.take`, in the order
    of ``records``). A keyword no record takes, or an object given with its keywords too, is a
    TypeError before anything is parsed."""
    refuse_unknown(verb, {k: v for k, v in keywords.items() if not any(k in r.keywords() for r, _ in records)})
    for record, given in records:
        both = sorted(set(keywords) & set(record.keywords())) if given is not None else []
        if both:
            raise TypeError(f"{verb}() takes {record.__name__} or its keywords ({', '.join(both)}), not both")
    return tuple(record.take(keywords) if given is None else given for record, given in records)


def refuse_unknown(verb: str, keywords: dict) -> None:
    """The TypeError of a keyword no record took."""
    if keywords:
        raise TypeError(f"{verb}() got an unexpected keyword argument {next(iter(keywords))!r}")


# ------------------------------------------------------------------ the records
@dataclass(frozen=True)
class ShapeOptions(Keywords):
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
class RewriteOptions(Keywords):
    """``enabled``: run the rewriters (keyword ``rewrite``); ``bn_mode``: ``--bn`` (None: the
    precision's default, :func:`~onnxmlu.precision.planners.bn_for`); ``only``: the rewriters to
    run (None: all)."""

    enabled: bool = keyword(True, name="rewrite")
    bn_mode: str | None = None
    only: Sequence[str] | None = None


@dataclass(frozen=True)
class PlanOptions(Keywords):
    """A strategy (name or callable) or a plan ``file`` (keyword ``plan``), an MP forced on every
    block, and the ``hardware`` planned for (``--hw``: a profile name, a JSON file or a
    :class:`~onnxmlu.plan.perf.hardware.Hardware`; loaded when the run starts)."""

    strategy: StrategyLike = DEFAULT_STRATEGY
    file: PlanLike | None = keyword(name="plan")
    mp: int | None = None
    hardware: HardwareLike = DEFAULT_PROFILE


def _known_precision(name: str | None) -> str | None:
    planner_for(name)  # one line for an unknown precision, before anything else
    return name


def _samples_folder(what: str) -> Callable[[PathLike | None], PathLike | None]:
    """A sample folder's parse: checked now (a missing folder, or one with no readable sample,
    is one line before any work; the samples are checked against the model's inputs when used)."""
    def parse(folder: PathLike | None) -> PathLike | None:
        if folder is not None:
            load_samples(folder, what=what)
        return folder
    return parse


def _calibrator(name: str | None) -> "Int8Options | None":
    """``--calibrator``: None for the default (MinMax), else how INT8 blocks are quantized."""
    return None if name in (None, DEFAULT_CALIBRATOR) else _int8().Int8Options(method=name)


@dataclass(frozen=True)
class PrecisionOptions(Keywords):
    """``name``: ``--precision`` (None: every block as planned); what its planner takes:
    ``calibration``/``validation`` sample folders, ``int8`` (how INT8 blocks are quantized,
    keyword ``calibrator``; None: MinMax), ``accuracy`` (``--precision auto``'s budget; its text
    is parsed here, once), ``auto`` (how hard auto looks; None: the defaults), ``keep_fp32``
    (layers kept at FP32) and ``metric`` (a user metric ``module:function``)."""

    name: str | None = keyword(name="precision", parse=_known_precision)
    calibration: PathLike | None = keyword(parse=_samples_folder("calibration"))
    validation: PathLike | None = keyword(parse=_samples_folder("validation"))
    int8: "Int8Options | None" = keyword(name="calibrator", parse=_calibrator)
    accuracy: Budget | None = None
    auto: "AutoOptions | None" = None
    keep_fp32: tuple[str, ...] = keyword((), parse=lambda names: tuple(names or ()))
    metric: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "accuracy", Budget.of(self.accuracy))  # the one parse on the fuse/plan path
        object.__setattr__(self, "keep_fp32", tuple(self.keep_fp32))
        planner_for(self.name)  # one line for an unknown precision

    @property
    def planner(self) -> PrecisionPlanner:
        """The planner of ``--precision`` (:data:`~onnxmlu.precision.planners.PLANNERS`)."""
        return planner_for(self.name)


def _int8():
    return optional_import("onnxmlu.precision.int8")


def load_samples(folder: PathLike, model=None, what: str = "calibration"):
    """The samples of a folder (:func:`~onnxmlu.precision.calibration.load_calibration`, loaded
    only when a folder is given); a one-line error for a folder that cannot be read."""
    return optional_import("onnxmlu.precision.calibration").load_calibration(folder, model, what)


@dataclass(frozen=True)
class CheckOptions(Keywords):
    """``fuse --check`` and ``check``: compare the fused model with the original on these seeds."""

    seeds: Sequence[int] = keyword((0,), parse=tuple)
    atol: float = 1e-4
    rtol: float = 1e-4
    inputs: dict | None = None  # fixed arrays by input name (--inputs)
    accuracy: Budget | None = None  # a budget that decides instead of atol/rtol (its text is parsed here)
    samples: PathLike | None = None  # a folder of samples (--inputs DIR), run instead of the seeds
    qtol: float = 2.0  # steps of its scale a quantized output may move by (tools/verify.py)
    allow_nan: bool = False  # NaN/Inf the reference has at the same places passes

    def __post_init__(self) -> None:
        object.__setattr__(self, "accuracy", Budget.of(self.accuracy))  # the one parse on the check path


def _checked(check: "CheckOptions | bool | None") -> "CheckOptions | None":
    """The ``check`` keyword: True checks with :class:`CheckOptions`' defaults, False skips."""
    if isinstance(check, bool):
        return CheckOptions() if check else None
    return check


@dataclass(frozen=True)
class OutputOptions(Keywords):
    """How ``fuse`` writes and checks: ``portable`` (blocks as ONNX functions) and ``check``
    (keyword ``check``: a :class:`CheckOptions`, or True for its defaults)."""

    portable: bool = False
    check: CheckOptions | None = keyword(parse=_checked)
    best_effort: bool = False  # publish a --precision auto plan whose --accuracy budget is not met


@dataclass(frozen=True)
class PlanFiles(Keywords):
    """What ``plan`` writes besides its report: the editable plan file (``output``), a timeline
    of the blocks (``plot``) and, under ``--precision auto``, the latency-accuracy chart of the
    plans it considered (``pareto``: auto then measures every frontier plan)."""

    output: PathLike | None = None
    plot: PathLike | None = None
    pareto: PathLike | None = None


@dataclass(frozen=True)
class CompareOptions(Keywords):
    """What ``compare`` plans and prices: every zoo CNN (``zoo``) or the given model, with
    ``strategies`` (None: all), a column per ``precisions`` entry (``auto``: the joint plan under
    the ``accuracy`` budget, parsed here), on ``hardware``, at ``input_shapes``; a chart at ``plot``."""

    zoo: bool = False
    strategies: Sequence[str] | None = None
    hardware: HardwareLike = DEFAULT_PROFILE
    input_shapes: dict | None = None
    precisions: Sequence[str] = ()
    accuracy: Budget | None = None
    plot: PathLike | None = None

    def __post_init__(self) -> None:
        if self.strategies is not None:
            object.__setattr__(self, "strategies", tuple(self.strategies))
        object.__setattr__(self, "precisions", tuple(self.precisions))
        object.__setattr__(self, "accuracy", Budget.of(self.accuracy))  # a bad budget: before any planning
        if self.accuracy is not None and not any(planner_for(p).judged for p in self.precisions):
            raise OnnxMluError("--accuracy is the budget of the auto column; add auto to --precision")


#: The parts of :class:`Options`, in the order their keywords are parsed.
_PARTS = {"shapes": ShapeOptions, "rewrite": RewriteOptions, "plan": PlanOptions, "precision": PrecisionOptions}


@dataclass
class Options(Keywords):
    """What the pipeline reads: one object per concern. Made, the precision's planner checks
    what it cannot honour (:meth:`~onnxmlu.precision.planners.PrecisionPlanner.check`) and a BN
    mode left open becomes the precision's default: folded into its producer where INT8 may be
    chosen (the quantizer then quantizes it with the convolution's per-channel weights; a
    separate scale layer would be an INT8 element-wise layer of its own), else ``substitute``.

    Its keywords (:meth:`of`, an API call's) are its parts' (:class:`Keywords`)."""

    shapes: ShapeOptions = field(default_factory=ShapeOptions)
    rewrite: RewriteOptions = field(default_factory=RewriteOptions)
    plan: PlanOptions = field(default_factory=PlanOptions)
    precision: PrecisionOptions = field(default_factory=PrecisionOptions)

    def __post_init__(self) -> None:
        self.precision.planner.check(self)
        if self.rewrite.bn_mode is None:
            self.rewrite = replace(self.rewrite, bn_mode=bn_for(self.precision.name))

    @classmethod
    def keywords(cls) -> dict[str, Field]:
        return {name: f for part in _PARTS.values() for name, f in part.keywords().items()}

    @classmethod
    def take(cls, given: dict) -> "Options":
        return cls(**{name: part.take(given) for name, part in _PARTS.items()})


def refuse_validation(options: Options, check: bool) -> None:
    """``--validation`` without a use: it judges auto's budget (a judged planner) and ``--check``."""
    if options.precision.validation is not None and not options.precision.planner.judged and not check:
        raise OnnxMluError("--validation holds the samples that judge --precision auto's budget and --check; "
                           "add one of them")
