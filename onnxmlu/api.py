"""The Python API: the verbs of the CLI, one function per command, each returning a report
with ``to_dict()`` (the command's JSON, see :mod:`onnxmlu.reports` and docs/json.md).

    result = onnxmlu.api.fuse("resnet18.onnx", strategy="dlfusion")
    onnxmlu.api.save_model(result.model, "resnet18.fused.onnx")

:func:`fuse` and :func:`fuse_to_file` run the pass pipeline of :mod:`onnxmlu.pipeline`
(load → normalize → rewrite → analyze → plan → collapse → embed | write); :func:`prepare`,
:func:`inspect` and :func:`plan` run its first passes. docs/architecture.md describes the stages.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import onnx

from onnxmlu.analyze import Analysis
from onnxmlu.analyze.layers import node_label
from onnxmlu.rewrite import rewrite_model, rewritten_ops
from onnxmlu.collapse.atomic import (check_destination, external_data_name, publish_staged, write_bytes_atomic,
                                    write_model_atomic)
from onnxmlu.errors import OnnxMluError
from onnxmlu.frontend.load import load_model, refuse_fused  # noqa: F401 - part of the API
from onnxmlu.frontend.pins import (  # noqa: F401 - the CLI parses --input-shape with it
    Pins, PricingShape, concrete_shapes, has_ranges, parse_input_shapes, pricing_shape)
from onnxmlu.ir.weights import WeightStore
from onnxmlu.optional import optional_import
from onnxmlu.options import (  # noqa: F401 - the option objects are part of the API
    DEFAULT_CALIBRATOR,
    CheckOptions,
    CompareOptions,
    HardwareLike,
    Options,
    OutputOptions,
    PlanFiles,
    PlanOptions,
    PrecisionOptions,
    RewriteOptions,
    ShapeOptions,
    call_options,
    load_samples,
    refuse_validation,
)
from onnxmlu.pipeline import (FUSE, FUSE_TO_FILE, PLAN, PORTABLE, Context, ModelLike, PassManager, Progress,
                              as_progress, pricing_of, range_end)
from onnxmlu.plan.perf.hardware import Hardware, load_hardware, profile_names
from onnxmlu.plan.planner import DEFAULT_STRATEGY, StrategyLike, block_latencies, make_plan, plan_layers  # noqa: F401
from onnxmlu.plan.strategies import strategy_names
from onnxmlu.plots import plan_chart, require_plotting, speedup_chart
from onnxmlu.progress import Prefixed
from onnxmlu.precision.accuracy import Budget
from onnxmlu.precision.planners import planner_for
from onnxmlu.precisions import LOWER_PRECISIONS
from onnxmlu.schema import model_metadata, recorded_pricing_shape
from onnxmlu.reports import (
    CompareReport,
    FuseResult,
    InspectReport,
    PlanReport,
    RunReport,
    StrategyResult,
    ZooReport,
    calibration_report,
    tagged,
)
from onnxmlu.tools import view as netron
from onnxmlu.tools import verify
from onnxmlu.wording import plural

#: A plain progress callback: called with each step's line (pipeline.Progress is the richer form).
SayFn = Callable[[str], None]


def as_model(model: ModelLike) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else load_model(model)


def _hardware(hardware: HardwareLike | None) -> Hardware | None:
    return hardware if hardware is None or isinstance(hardware, Hardware) else load_hardware(hardware)


def _run(passes, model: ModelLike, options: Options, *, progress=None, **settings) -> Context:
    """A fresh context for ``model`` through ``passes``, on the hardware ``options`` name."""
    ctx = Context(model, _hardware(options.plan.hardware), options, progress=as_progress(progress), **settings)
    return PassManager(passes).run(ctx)


def _result(ctx: Context) -> FuseResult:
    return FuseResult(ctx.fused, ctx.analysis, ctx.plan, ctx.hardware, ctx.rewrite_report, ctx.block_latency_us,
                      ctx.diagnostics, ctx.pass_seconds, ctx.output, calibration=calibration_report(ctx.bodies),
                      auto=ctx.auto, profile=ctx.profile, branches=ctx.branches, pricing=pricing_of(ctx),
                      memory_budget=ctx.options.shapes.max_memory)


# ---------------------------------------------------------------------------------- fuse
def fuse(model: ModelLike, options: Options | None = None, *, progress: SayFn | Progress | None = None,
         **keywords) -> FuseResult:
    """Rewrite, plan and collapse a model (the ``FUSE`` passes); nothing is written to disk.

    ``options``: what to do, one typed object per concern (:class:`~onnxmlu.options.Options`,
    as the CLI builds it); without it, the keywords make one (:meth:`Options.of`: a keyword per
    field, the CLI's option names). ``precision`` (``fp32``, ``fp16``, ``int8``; None: as planned) puts
    every block at that precision; INT8 blocks are calibrated on the samples in the
    ``calibration`` folder (None: seeded random samples, flagged by a diagnostic) with the
    ``calibrator`` (``minmax``, ``entropy``, ``percentile``). ``precision="auto"`` chooses
    blocks, MPs and a precision per block that keep the ``accuracy`` budget (``"cosine>=0.999"``
    by default, or ``"top1>=X"``), judged on the ``validation`` folder's samples (None: held out
    from the calibration samples, :func:`~onnxmlu.precision.calibration.split_samples`;
    :mod:`onnxmlu.precision.auto`). ``inputs``: arrays by input name (``--inputs``) that the
    shape probe runs instead of zeros, where values set shapes. ``max_memory``: the shape probes'
    memory budget (bytes or ``"4G"``; None: half the host's available memory,
    :mod:`onnxmlu.frontend.memory`). ``hardware``: a profile name, JSON file or ``Hardware``."""
    (options,) = call_options("fuse", keywords, (Options, options))
    refuse_validation(options, check=False)
    return _result(_run(FUSE, model, options, progress=progress))


def fuse_to_file(model: ModelLike, output: str | os.PathLike, options: Options | None = None,
                 output_options: OutputOptions | None = None, *, progress: SayFn | Progress | None = None,
                 **keywords) -> FuseResult:
    """:func:`fuse` ``model`` and save it at ``output`` (atomically): the ``FUSE_TO_FILE`` passes.

    With ``check``, or a ``--precision auto`` budget, the model is written beside ``output``,
    judged, and renamed into place only when :func:`fuse_passed` (the check passed, the budget
    was met or ``best_effort``): a model that fails is never published, and the result says why.

    A model file is fused holding the weights about once plus one block in memory: right after
    normalizing, the large weights move out of the protobuf tree into a
    :class:`~onnxmlu.ir.weights.WeightStore` (the parsed model is dropped), and the file is
    written as pieces, one body at a time, each weight released once the last block that reads
    it is written. The result's ``model`` is then the fused graph without bodies (what reports
    need). A ``ModelProto`` (or ``check``, which needs both models in memory) is fused in memory
    and saved whole; a model over protobuf's 2 GB limit is saved with external data.
    ``portable`` writes each block as a model-local ONNX function (the ``PORTABLE`` passes: no
    custom-op library needed to run it; ``check`` then compares that model); ``portable``,
    ``check`` and ``best_effort`` are ``output_options`` (:class:`~onnxmlu.options.OutputOptions`,
    or its keywords). ``options`` and the other keywords as for :func:`fuse`. A model whose
    soundness is not certain is loaded (:func:`_verify_loads`). ``progress`` is told each pass as
    it starts (``say``; a plain callable works too).
    """
    out = _checked_output(model, output)  # before any other work: a bad path must not cost a planning run
    options, written = call_options("fuse_to_file", keywords, (Options, options), (OutputOptions, output_options))
    refuse_validation(options, written.check is not None)
    return _fused_to(out, model, options, written, progress)


def _fused_to(out: Path, model: ModelLike, options: Options, written: OutputOptions, progress) -> FuseResult:
    """:func:`fuse_to_file` once its options are made and checked."""
    streamed = not (isinstance(model, onnx.ModelProto) or written.check is not None or written.portable)
    inputs, check = _shared_inputs(options.shapes.inputs, written.check)
    options = replace(options, shapes=replace(options.shapes, inputs=inputs))
    passes, weights = PORTABLE if written.portable else FUSE_TO_FILE, WeightStore() if streamed else None
    if check is None and (written.best_effort or not options.precision.planner.judged):
        return _verify_loads(_result(_run(passes, model, options, progress=progress, weights=weights, output=out)),
                             out)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:  # written beside the target, judged, then renamed: a model that fails is never published
        ctx = _run(passes, model, options, progress=progress, weights=weights, output=staging / out.name)
        result = _result(ctx)
        if check is not None:
            result.check = _check_fused(model, result.model, check, ctx)
        if fuse_passed(result, written.best_effort):
            if check is None:  # a check has loaded and run it already
                _verify_loads(result, staging / out.name)
            publish_staged(staging, out)
        result.output = out
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return result


def fuse_passed(result: FuseResult, best_effort: bool = False) -> bool:
    """Whether ``fuse`` publishes ``result`` and exits 0: its check (when run) passed, and the
    ``--precision auto`` budget was met (unless ``best_effort``: the closest plan is kept)."""
    if result.check is not None and not result.check.ok:
        return False
    return best_effort or result.auto is None or result.auto.budget.met(result.auto.chosen.measured)


def _checked_output(model: ModelLike, output) -> Path:
    """``output`` as a path, refused in one line before any work (a bad path must not cost a
    planning run): unwritable, or the input itself."""
    out = Path(output)
    writable(out, "output")
    if not isinstance(model, onnx.ModelProto):
        _refuse_output(out, Path(model))
    return out


def _shared_inputs(inputs: dict | None, check: CheckOptions | None) -> tuple[dict | None, CheckOptions | None]:
    """The user's arrays serve both the shape probe and the check: either one given is both."""
    if check is None:
        return inputs, None
    if inputs is None:
        return check.inputs, check
    return inputs, check if check.inputs is not None else replace(check, inputs=inputs)


def _verify_loads(result: FuseResult, out: Path) -> FuseResult:
    """``result``, once the written model loads in onnxruntime where its soundness is not
    certain (:func:`~onnxmlu.tools.verify.needs_load_check`); a model it refuses is removed and
    the refusal is the error (``--check`` loads and runs it anyway)."""
    if not verify.needs_load_check(result.model):
        return result
    error = verify.load_error(out)
    if error is None:
        return result
    out.unlink(missing_ok=True)
    out.with_name(external_data_name(out)).unlink(missing_ok=True)
    raise OnnxMluError(f"the fused model does not load in onnxruntime, so it was not kept: {error}")


def _check_fused(model: ModelLike, fused: onnx.ModelProto, check: CheckOptions, ctx: Context):
    """``fuse --check``: the fused model against the original, on the data :func:`_check_data` picks;
    auto's output judged by its budget, a model fused at FP16 or INT8 by :data:`CHECK_BUDGET`."""
    original = model if isinstance(model, onnx.ModelProto) else load_model(model)
    asked = ctx.options.precision
    if ctx.auto is not None and check.accuracy is None:
        check = replace(check, accuracy=ctx.auto.budget)
    elif asked.name in LOWER_PRECISIONS and check.accuracy is None:  # 1e-4 cannot hold at FP16/INT8
        check = replace(check, accuracy=asked.accuracy or CHECK_BUDGET)
    data = _check_data(original, check, asked.validation, asked.calibration, ctx.auto)
    pins = ctx.options.shapes.input_shapes or recorded_pins(fused, original)  # a fallback size included
    return _check_models(original, fused, check, pins, ctx.progress, data, ctx.options.shapes.max_memory)


def recorded_pins(fused: onnx.ModelProto, original: onnx.ModelProto | None = None) -> Pins | None:
    """The shapes a fused model records its plan was priced at (``onnxmlu.pricing_shape``) as
    ``--input-shape`` pins, ranges included (:meth:`PricingShape.as_pins`); None for a file
    without the record, or (given the ``original``) when they are its defaults anyway (the
    check then says ``default``). ``check`` runs there when not told otherwise: where ``fuse``
    priced, a fallback size included."""
    record = recorded_pricing_shape(model_metadata(fused))
    if record is None:
        return None
    pins = PricingShape.from_dict(record).as_pins()
    if original is not None and not has_ranges(pins) and concrete_shapes(original, pins) == concrete_shapes(original):
        return None
    return pins


#: How ``fuse --check`` judges a model ``--precision`` put wholly at one of
#: :data:`~onnxmlu.precisions.LOWER_PRECISIONS` (the budget ``--precision auto`` keeps by default).
CHECK_BUDGET = Budget("cosine", 0.999)


def _check_data(original: onnx.ModelProto, check: CheckOptions, validation, calibration, auto) -> tuple | None:
    """``fuse --check``'s samples and what they are, the first that applies: ``--inputs DIR``,
    ``--validation DIR``, the samples that judged ``--precision auto`` (held out), the
    calibration samples (real data, but in-sample: they set the INT8 scales); None: the seeds."""
    if check.samples is not None:
        found = load_samples(check.samples, original, "inputs")
        return found.samples, f"{plural(len(found), 'sample')} from {found.source} (--inputs)"
    if validation is not None:
        found = load_samples(validation, original, "validation")
        return found.samples, f"{plural(len(found), 'validation sample')} from {found.source}"
    if auto is not None:
        judged = auto.evaluator.validation
        return judged.samples, f"the {plural(len(judged), 'sample')} that judged auto: {auto.rule or judged.describe()}"
    if calibration is not None:
        found = load_samples(calibration, original)
        return found.samples, (f"{plural(len(found), 'calibration sample')} from {found.source} (in-sample: "
                               "they set the INT8 scales; give --validation DIR for held-out data)")
    return None


def _check_models(original: onnx.ModelProto, fused: onnx.ModelProto, check: CheckOptions, input_shapes, progress,
                  data: tuple | None = None, max_memory: int | None = None):
    samples, described = data if data is not None else (None, "")
    return verify.check_models(original, fused, seeds=check.seeds, atol=check.atol, rtol=check.rtol,
                               input_shapes=input_shapes, inputs=check.inputs, budget=check.accuracy,
                               samples=samples, data=described, progress=Prefixed(progress, "check: "),
                               qtol=check.qtol, allow_nan=check.allow_nan, max_memory=max_memory)


def save_model(model: onnx.ModelProto, path: str | os.PathLike, *, input_path: str | os.PathLike | None = None,
               external_data: bool | None = None) -> Path:
    """Write ``model`` atomically (see :mod:`onnxmlu.collapse.atomic`): the destination ends up
    holding the previous complete file or the new one, never a truncated file.

    ``external_data``: None (default) keeps everything in one file unless the model's tensors
    exceed protobuf's 2 GB limit, then writes them (block bodies included) to ``NAME.data``
    next to ``NAME``; True always does that; False never does (a model over 2 GB then fails).
    Every failure is a one-line :class:`OnnxMluError`.
    """
    out = Path(path)
    if input_path is not None:
        _refuse_output(out, Path(input_path))
    return write_model_atomic(model, out, external_data=external_data)


def writable(path: Path, what: str) -> None:
    """A one-line :class:`OnnxMluError` unless a file can be written at ``path``: its folder
    exists and ``path`` is not a folder (checked before any work, so a typo costs nothing)."""
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise OnnxMluError(f"{what} {path} is a directory; give a file path")
    if not folder.is_dir():
        raise OnnxMluError(f"{what} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise OnnxMluError(f"{what} {path}: folder {folder} is not writable")


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


# ---------------------------------------------------------------------------------- the first passes
def prepare(model: ModelLike, *, input_shapes: dict | None = None, rewrite: bool = True,
            bn_mode: str = "substitute", only: Sequence[str] | None = None):
    """load + normalize + rewrite: the model the planner sees, and the rewrite report (None
    without ``rewrite``)."""
    ctx = _run(PLAN[:3], model, Options.of(input_shapes=input_shapes, rewrite=rewrite, bn_mode=bn_mode, only=only))
    return ctx.model, ctx.rewrite_report


def rewrite(model: ModelLike, *, bn_mode: str = "substitute", only: Sequence[str] | None = None,
            input_shapes: dict | None = None):
    """Run the rewriters alone: the rewritten model and the report."""
    return prepare(model, input_shapes=input_shapes, rewrite=True, bn_mode=bn_mode, only=only)


def rewrite_to_file(model: str | os.PathLike, output: str | os.PathLike, *, bn_mode: str = "substitute",
                    only: Sequence[str] | None = None, input_shapes: dict | None = None, progress=None):
    """:func:`rewrite` ``model`` and save the result at ``output``; the rewrite report."""
    ctx = _run(PLAN[:3], model, Options.of(input_shapes=input_shapes, bn_mode=bn_mode, only=only), progress=progress)
    ctx.progress.say(f"saving {Path(output).name}")
    save_model(ctx.model, output, input_path=model)
    return ctx.rewrite_report


def inspect(model: ModelLike, *, input_shapes: dict | None = None, rewrite: bool = False, progress=None,
            bn_mode: str | None = None, max_memory: int | str | None = None) -> Analysis:
    """The layer table (load → normalize → rewrite if asked, BN by ``bn_mode`` → analyze); its
    ``to_dict()`` is the ``inspect`` report. ``max_memory``: the shape probes' budget (as for :func:`fuse`)."""
    asked = Options.of(input_shapes=input_shapes, rewrite=rewrite, bn_mode=bn_mode, max_memory=max_memory)
    ctx = _run(PLAN[:4], model, asked, progress=progress)
    analysis = ctx.analysis
    if has_ranges(input_shapes):  # the ends fuse prices at, for its "input profile" line
        analysis.profile_inputs = {"opt": analysis.input_shapes, **{p: range_end(ctx, p) for p in ("min", "max")}}
    if not rewrite:
        _name_rewrites(analysis, asked.rewrite.bn_mode)
    return analysis


def inspected_pricing(analysis: Analysis, input_shapes: dict | None = None) -> PricingShape:
    """The shapes :func:`inspect`'s layer table is sized at, as ``fuse`` would price them (its
    ``priced at ...`` line, the defaults of symbolic dims named): ``input_shapes`` the pins
    :func:`inspect` was given."""
    return pricing_shape(analysis.model, input_shapes, analysis.input_shapes, analysis.profile_inputs)


def inspect_report(analysis: Analysis, input_shapes: dict | None = None) -> InspectReport:
    """``inspect``'s report: ``analysis`` and the shapes a plan of it is priced at
    (:func:`inspected_pricing`; ``--json`` carries them as the text does)."""
    return InspectReport(analysis, inspected_pricing(analysis, input_shapes))


def _name_rewrites(analysis: Analysis, bn_mode: str) -> None:
    """The host reasons of a model analysed without its rewrites, told what ``fuse`` does: a
    node a rewriter turns into the accelerator's ops is accelerated after that rewrite (its
    reason says so, so that ``inspect`` never calls a node host-only that ``fuse`` puts in a
    block); one the rewriter refuses keeps its reason, and the rewriter's is added."""
    by_op = {op: name for name, ops in rewritten_ops().items() for op in ops}
    nodes = analysis.model.graph.node
    hits = {i: by_op[_qualified(nodes[i])] for i in analysis.host_reasons if _qualified(nodes[i]) in by_op}
    if not hits:
        return
    _, report = rewrite_model(analysis.model, bn_mode=bn_mode, only=sorted(set(hits.values())))
    refused = {d.node: d.message for d in report.skipped}
    for i, rewriter in hits.items():
        label = node_label(nodes[i])
        if label in refused:
            analysis.host_reasons[i] += f"; the {rewriter} rewrite refused it: {refused[label]}"
        else:
            analysis.host_reasons[i] = (f"accelerated after the {rewriter} rewrite (fuse and plan run it; inspect "
                                        f"--rewrite shows the layers); as it stands: {analysis.host_reasons[i]}")


def _qualified(node: onnx.NodeProto) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type


def inspect_fused(model: ModelLike):
    """What a fused model holds (blocks, host nodes, the metadata it was written with): a
    :class:`~onnxmlu.tools.fused_info.FusedSummary`, or None when ``model`` holds no block."""
    return optional_import("onnxmlu.tools.fused_info").summarize_fused(as_model(model))


def plan(model: ModelLike, options: Options | None = None, files: PlanFiles | None = None, *,
         progress: SayFn | Progress | None = None, **keywords) -> PlanReport:
    """Plan ``model`` (the passes up to ``plan``) without collapsing it, every block at
    ``precision`` when given (the strategy planning at it; ``auto``: under the ``accuracy``
    budget, measured on the calibration samples, as for :func:`fuse`); write what ``files``
    (:class:`~onnxmlu.options.PlanFiles`, or its keywords) asks: the editable plan file to
    ``output``, a timeline of the blocks to ``plot`` and, with ``auto``, the latency-accuracy
    chart of the plans it considered to ``pareto``. ``options`` and its keywords as for :func:`fuse`."""
    files, options = call_options("plan", keywords, (PlanFiles, files), (Options, options))
    _refuse_plan_outputs(files.output, files.plot, files.pareto)
    if files.pareto is not None:
        options = _measuring_frontier(options)
    refuse_validation(options, check=False)
    ctx = _run(PLAN, model, options, progress=progress)
    report = PlanReport(ctx.plan, ctx.analysis.layers, ctx.hardware, ctx.block_latency_us, ctx.auto, ctx.profile,
                        pricing_of(ctx))
    if files.pareto is not None:
        title = f"{Path(str(model)).stem}: --precision auto --accuracy {ctx.auto.budget}"
        optional_import("onnxmlu.precision.auto").write_pareto(ctx.auto, files.pareto, title=title)
    if files.output is not None:
        write_bytes_atomic(report.plan_json().encode(), Path(files.output))
    if files.plot is not None:
        title = (f"{Path(str(model)).stem}: {report.plan.strategy}, {plural(len(report.plan.blocks), 'block')}, "
                 f"{report.sim_latency_us:.0f} µs simulated on {report.hardware.name}")
        plan_chart(report.rows(), files.plot, title=title, max_mp=report.hardware.cores)
    return report


def _measuring_frontier(options: Options) -> Options:
    """``options`` with auto measuring every frontier plan (what ``--pareto`` plots); only a
    judged precision considers plans (``--precision auto``)."""
    if not options.precision.planner.judged:
        raise OnnxMluError("--pareto plots the plans --precision auto considered; add --precision auto")
    effort = options.precision.auto or optional_import("onnxmlu.precision.auto").AutoOptions()
    return replace(options, precision=replace(options.precision, auto=replace(effort, measure_frontier=True)))


def _refuse_plan_outputs(output, plot, pareto) -> None:
    """``plan``'s files a run could not write, each one line before any work: an unwritable
    path, plotting without matplotlib."""
    for path, what in ((output, "--output"), (plot, "--plot"), (pareto, "--pareto")):
        if path is not None:
            writable(Path(path), what)
    if plot is not None or pareto is not None:
        require_plotting()


# ---------------------------------------------------------------------------------- compare
def compare_strategies(analysis: Analysis, hw: Hardware, strategies: Sequence[str],
                       precision: str | None = None) -> list[StrategyResult]:
    """Plan with every strategy through the planner ``fuse`` uses (:func:`plan_layers`: labels,
    blocks over the body limit split) and price each plan with the performance model; with
    ``precision``, each strategy plans the layers at that precision and is priced at it.
    ``plan_seconds`` includes the pricing."""
    results = []
    for name in strategies:
        start = time.perf_counter()
        chosen, latencies = plan_layers(analysis.layers, hw, strategy=name, precision=precision)
        results.append(StrategyResult(name, chosen, sum(latencies), time.perf_counter() - start, precision or "fp32"))
    return results


#: A column of ``compare --precision``: one strategy's result on an analysed model.
CompareColumn = Callable[[Analysis, Hardware, str], StrategyResult]


def compare_column(name: str, accuracy: Budget | None = None) -> CompareColumn:
    """The column ``name`` of ``compare --precision`` (a one-line error for an unknown name): a
    fixed precision is :func:`compare_strategies` at it; ``auto`` plans under the ``accuracy``
    budget (default ``cosine>=0.999``)."""
    if planner_for(name).judged:
        return _auto_column(accuracy)
    return lambda analysis, hw, strategy: compare_strategies(analysis, hw, [strategy], precision=name)[0]


def _auto_column(accuracy: Budget | None) -> CompareColumn:
    """The ``auto`` column: one joint plan per network under the budget (it does not depend on
    the row's strategy, so it is planned once and shown against each row's FP32 latency),
    measured on seeded random samples."""
    planned = {}

    def column(analysis: Analysis, hw: Hardware, strategy: str) -> StrategyResult:
        if id(analysis) not in planned:  # the analysis is kept with its result: ids stay unique
            result = optional_import("onnxmlu.precision.auto").plan_analysis(analysis, hw, accuracy)
            planned[id(analysis)] = (analysis, StrategyResult("auto", result.plan, result.chosen.latency_us,
                                                              result.seconds, "auto"))
        return planned[id(analysis)][1]
    return column


def compare(model: ModelLike | None = None, options: CompareOptions | None = None, *, progress=None,
            **keywords) -> CompareReport:
    """Simulated latency of every strategy (``none`` first, the baseline) on ``model`` or, with
    ``zoo``, on every zoo CNN ([DLFusion] Fig. 10); a grouped bar chart at ``plot``. Each of
    ``precisions`` (``fp16``, ``int8``) adds a column: every strategy run on the layers at that
    precision and priced at it, beside the FP32 one; ``auto`` adds the joint plan under the
    ``accuracy`` budget (one per network, measured on seeded random samples). ``options``: a
    :class:`~onnxmlu.options.CompareOptions` (as the CLI builds it), or its keywords."""
    (options,) = call_options("compare", keywords, (CompareOptions, options))  # a bad budget: now
    if (model is None) == (not options.zoo):
        raise OnnxMluError("give either a MODEL or --zoo")
    if options.plot is not None:
        require_plotting()
    names = list(options.strategies) if options.strategies else strategy_names()
    columns = {p: compare_column(p, options.accuracy) for p in dict.fromkeys(options.precisions) if p != "fp32"}
    report = CompareReport(_hardware(options.hardware), names if "none" in names else ["none", *names], list(columns))
    networks = _compare_inputs(model)
    steps = as_progress(progress)
    steps.total(len(networks) * (len(report.strategies) + 1))
    for label, source in networks:
        report.networks[label] = _compare_one(label, source, report, options.input_shapes, steps, columns)
    if options.plot is not None:
        speedup_chart(report.to_dict()["networks"], options.plot)
    return report


def _compare_inputs(model: ModelLike | None) -> list[tuple[str, object]]:
    """``(label, model path or zoo name)`` per network; zoo models are built when their turn
    comes, under the progress bar (building all five takes most of `compare --zoo`'s time)."""
    if model is not None:
        return [(Path(str(model)).stem, model)]
    return [(name, name) for name in optional_import("onnxmlu.tools.zoo").CNN_NAMES]


def _compare_one(label: str, source, report: CompareReport, input_shapes, steps,
                 columns: dict[str, CompareColumn]) -> list[StrategyResult]:
    steps.say(f"{label}: building and analysing")
    if isinstance(source, str):
        source = optional_import("onnxmlu.tools.zoo").build_model(source)
    analysis = inspect(source, input_shapes=input_shapes, rewrite=True)
    steps.advance()
    results = []
    for name in report.strategies:
        steps.say(f"{label}: {name}")
        fp32 = compare_strategies(analysis, report.hardware, [name])[0]
        at = {column: compute(analysis, report.hardware, name) for column, compute in columns.items()}
        results.append(replace(fp32, columns=at))
        steps.advance()
    return results


# ---------------------------------------------------------------------------------- tools
def check(original: str | os.PathLike, fused: str | os.PathLike, options: CheckOptions | None = None, *,
          input_shapes: dict | None = None, progress: SayFn | Progress | None = None,
          max_memory: int | str | None = None, **keywords):
    """Run the original (reference: onnxruntime, optimizations off) and the fused model on
    seeded inputs, or on the samples of the ``samples`` folder (``--inputs DIR``, the
    calibration layout); the ``check`` report (:class:`~onnxmlu.tools.verify.CheckReport`).
    ``options``: a :class:`~onnxmlu.options.CheckOptions`, or its keywords: ``seeds``, ``atol``,
    ``rtol``, ``inputs``; an ``accuracy`` budget (``cosine>=X``, ``top1>=X``) decides instead of
    ``atol``/``rtol``; quantized outputs are judged in ``qtol`` steps of their scale;
    ``allow_nan`` passes NaN/Inf the reference has at the same places. Without ``input_shapes``,
    the shapes the fused model records it was priced at (:func:`recorded_pins`). ``max_memory``: the
    runs' memory budget (bytes or ``"4G"``; None: half the host's available memory,
    :mod:`onnxmlu.tools.verify`)."""
    (options,) = call_options("check", keywords, (CheckOptions, options))  # a bad budget: now
    budget = ShapeOptions(max_memory=max_memory).max_memory  # parsed as fuse parses it; a bad size: now
    if options.samples is not None:
        load_samples(options.samples, what="inputs")  # a bad folder is refused before any model loads
    steps = as_progress(progress)
    steps.say(f"loading {Path(original).name} and {Path(fused).name}")
    models = load_model(original), load_model(fused)
    data = None if options.samples is None else _check_data(models[0], options, None, None, None)
    return _check_models(*models, options, input_shapes or recorded_pins(models[1], models[0]), steps, data, budget)


def run(model: str | os.PathLike, *, inputs: dict | None = None, seed: int = 0, input_shapes: dict | None = None,
        repeat: int = 10, profile: bool = False, save: str | os.PathLike | None = None, progress=None) -> RunReport:
    """Run any model (fused or not) in onnxruntime with the custom-op library: its outputs
    (saved as .npz at ``save``), the median latency of ``repeat`` runs and, with ``profile``,
    each node's measured CPU time next to its simulated time."""
    return optional_import("onnxmlu.tools.run").run_model(
        model, inputs=inputs, seed=seed, input_shapes=input_shapes, repeat=max(1, repeat), profile=profile, save=save,
        progress=as_progress(progress), analyse=lambda body, pins: inspect(body, input_shapes=pins, rewrite=False))


def build_zoo(names: Sequence[str], output: str | os.PathLike, *, batch: int | str = 1, seed: int = 0,
              progress=None) -> ZooReport:
    """Write zoo models: ``output`` itself for one model, ``output/NAME.onnx`` for several."""
    zoo = optional_import("onnxmlu.tools.zoo")
    steps, report, targets = as_progress(progress), ZooReport(), zoo.zoo_targets(list(names), Path(output))
    steps.total(len(targets))
    for net, path in targets:
        steps.say(f"building {net}")
        save_model(zoo.build_model(net, batch=batch, seed=seed), path)
        report.models.append({"name": net, "path": str(path), "batch": batch, "seed": seed,
                              "bytes": path.stat().st_size})
        steps.advance()
    return report


def view(model: str | os.PathLike, *, explode: bool = False, port: int = 8080, browse: bool = True,
         announce: Callable[[], None] | None = None) -> None:
    """Serve ``model`` in Netron on 127.0.0.1 until interrupted; with ``explode`` its exploded
    view (each block as an ONNX function), from memory: nothing is written beside the model
    (``announce`` is called before serving it)."""
    netron.require_netron()  # before the model is read and exploded
    path = Path(model)
    if not path.is_file():  # Netron would serve an error page instead of failing here
        raise OnnxMluError(f"model file {path} does not exist" if not path.exists() else f"{path} is not a file")
    if not explode:
        return netron.serve(path, port=port, browse=browse)
    data = netron.explode(load_model(path)).SerializeToString()
    if announce is not None:
        announce()
    netron.serve(path.with_name(path.stem + ".exploded.onnx"), port=port, browse=browse, data=data)


def hardware_profiles() -> list[Hardware]:
    """The built-in hardware profiles."""
    return [load_hardware(name) for name in profile_names()]


def report(model: ModelLike, output: str | os.PathLike, options: Options | None = None,
           written: OutputOptions | None = None, *, progress=None, **keywords) -> Path:
    """Write ``onnxmlu report``'s self-contained HTML page about ``model`` to ``output``: for a
    model, the plan :func:`fuse_to_file` makes of it with ``options`` and ``written`` (with the
    check's results when ``written.check``, and the plans ``--precision auto`` considered); for a
    fused file, what it holds (:func:`inspect_fused`). ``options`` and ``written`` as for
    :func:`fuse_to_file`, or their keywords (``strategy``, ``hardware``, ``input_shapes``,
    ``precision``, ``calibration``, ``accuracy``, ``check=True``, ...). The destination and the
    options are checked before any work."""
    options, written = call_options("report", keywords, (Options, options), (OutputOptions, written))
    output = Path(output)
    check_destination(output)
    proto = as_model(model)
    name = Path(str(model)).name if not isinstance(model, onnx.ModelProto) else (proto.graph.name or "model")
    summary = optional_import("onnxmlu.tools.fused_info").summarize_fused(proto)
    html = optional_import("onnxmlu.tools.html_report")
    if summary is not None:
        return html.write_report(tagged("inspect-fused", summary.to_dict()), output, f"{name}: fused model",
                                 summary.layer_rows())
    with tempfile.TemporaryDirectory(prefix="onnxmlu-report-") as folder:
        result = fuse_to_file(proto, Path(folder) / "fused.onnx", options, written, progress=progress)
        payload = tagged("fuse", result.to_dict())
    return html.write_report(payload, output, f"{name}: {payload['strategy']} plan on {payload['hardware']}",
                             result.layer_rows())
