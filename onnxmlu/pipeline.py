"""The pass pipeline: fusing a model is a fixed, visible list of passes over one context.

    FUSE         = load → normalize → rewrite → analyze → plan → profile → collapse → branches → embed
    FUSE_TO_FILE = load → normalize → rewrite → analyze → plan → profile → collapse → branches → write
    PORTABLE     = load → normalize → rewrite → analyze → plan → profile → collapse → branches → embed
                   → portable → write
    BRANCH       = load → normalize → analyze → plan → collapse → branches → embed   (each subgraph of a
                   host If/Loop/Scan, lifted into a model: :class:`Branches`)

Every pass has a ``name``, a ``label(ctx)`` (the progress line shown while it runs) and
``run(ctx) -> None``, and declares its contract: what it ``requires`` (a setting, a result),
the results it ``provides`` and those it ``may_leave``. The :class:`Context` keeps the caller's
frozen :class:`Settings` apart from the :data:`RESULTS`, which are absent until a pass writes
them; :class:`Sequential` (a list of passes that is itself a pass) checks every pass's contract
on both sides and names the pass that broke it. :class:`PassManager` runs a list under *instruments*
(hooks around the whole run and around each pass, as TVM's ``PassContext`` instruments [TVM-passes] and
onnxscript's ``PassManager`` [ONNXScript] do): the progress line of each pass, the time each pass took
(``Context.pass_seconds``), and Python's cyclic garbage collector paused for the run. The two
lists differ only in their last pass: ``embed`` puts each block's body into its node in memory
(:func:`onnxmlu.api.fuse`), ``write`` streams the fused model to a file one body at a time
(:func:`onnxmlu.api.fuse_to_file`); ``fuse --portable`` turns the embedded blocks into ONNX
functions before writing. docs/architecture.md describes each stage.

Everything a stage decided not to do is one :class:`~onnxmlu.diagnostics.Diagnostic` in
``Context.diagnostics``, in pass order. A model loaded from a file belongs to the pipeline;
a ``ModelProto`` the caller passes is copied first, so the caller's model is never changed.
When the context has a :class:`~onnxmlu.ir.weights.WeightStore` (``fuse_to_file`` of a file),
the large weights leave the protobuf tree right after normalizing and every pass that reads
them is given the store.

Precision (docs/precision.md): the plan pass calls the planner of ``Options.precision.name``, an
entry of :data:`onnxmlu.precision.planners.PLANNERS` (a fixed precision, or ``auto``'s search
under an accuracy budget); this module names no precision. When a block is not FP32, collapse
uses the run's one :class:`~onnxmlu.precision.bodies.BlockBodies` (``Context.bodies``: auto's
measured bodies, or made there, INT8 blocks calibrated before any weight is released) and
embed / write hand it the bodies; what it records (stage ``precision``) joins
``Context.diagnostics``.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence, Union

import numpy as np
import onnx

from onnxmlu.analyze import analyze
from onnxmlu.collapse.atomic import needs_external_data, write_model_atomic, write_pieces_atomic
from onnxmlu.analyze.layers import node_label
from onnxmlu.collapse.branches import (BranchPlan, Lifted, LiftError, computes, graft, lift, may_hold_arithmetic,
                                      subgraph_of)
from onnxmlu.collapse.branches import sites as branch_sites
from onnxmlu.collapse.blocks import BlockFigures, add_bodies, fused_without_bodies, prepare_bodies, stream_pieces
from onnxmlu.diagnostics import Diagnostic
from onnxmlu.errors import OnnxMluError
from onnxmlu.frontend.load import load_model, refuse_fused
from onnxmlu.frontend.normalize import normalize_owned
from onnxmlu.frontend.pins import PricingShape, has_ranges, pricing_shape
from onnxmlu.frontend.shapes import pricing_shapes, sizes_at, sizing_hint
from onnxmlu.ir.dedupe import hoist_identical_constants
from onnxmlu.ir import copy_model, drop_unread_initializers
from onnxmlu.ir.weights import WeightStore
from onnxmlu.optional import optional_import
from onnxmlu import progress
from onnxmlu.options import Options, PlanOptions, PrecisionOptions, RewriteOptions, ShapeOptions
from onnxmlu.plan.perf.hardware import Hardware
from onnxmlu.plan.profile import profile_plan
from onnxmlu.precision import DEFAULT_PRECISION
from onnxmlu.rewrite import rewrite_owned, selected_rewriters
from onnxmlu.schema import ensure_registered, record_pricing_shape
from onnxmlu.tools.view import explode
from onnxmlu.wording import plural

if TYPE_CHECKING:
    from onnxmlu.precision.bodies import BlockBodies

ModelLike = Union[str, os.PathLike, onnx.ModelProto]


# ------------------------------------------------------------------------------ the context
class Progress(Protocol):
    """Where progress lines go: ``say`` names the step now running; for a progress bar,
    ``total`` sets the units of work and ``advance`` counts one done."""

    def say(self, text: str) -> None: ...

    def total(self, units: int) -> None: ...

    def advance(self, units: int = 1) -> None: ...


#: A :class:`Progress` from a plain ``callable(text)`` or from nothing (silent): progress.py's.
Say = progress.Say


def as_progress(progress_like: Progress | Callable[[str], None] | None) -> Progress:
    return progress.as_display(progress_like)


@dataclass(frozen=True)
class Settings:
    """What the caller asked for one run: frozen, read by every pass, written by none."""

    source: ModelLike
    hardware: Hardware | None
    options: Options = field(default_factory=Options)
    output: Path | None = None
    #: A lifted subgraph's: the enclosing graph's constants it reads, shared by its blocks.
    outer_constants: frozenset[str] = frozenset()
    #: Constants an enclosing graph lets its caller override (IR < 4 initializers listed as
    #: graph inputs): not constant where the blocks run, so never shared (collapse/shared.py).
    overridable: frozenset[str] = frozenset()


#: What the passes produce, each absent until a pass sets it (docs/architecture.md, "Passes").
RESULTS: dict[str, str] = {
    "model": "the model being compiled (load, normalize, rewrite)",
    "rewrite_report": "what each rewriter did (rewrite)",
    "analysis": "the layer table and host reasons (analyze)",
    "plan": "blocks, MPs and precisions (plan)",
    "block_latency_us": "each block's simulated latency (plan)",
    "bodies": "FP16/INT8 block bodies; None: every block FP32 (plan, collapse)",
    "auto": "what --precision auto chose, considered and measured (plan)",
    "profile": "the plan priced over the --input-shape ranges (profile)",
    "fused": "the fused graph, bodiless until embed or write (collapse)",
    "blocks": "fused node position -> (block, interface) of the bodies still to write (collapse)",
    "branches": "the blocks planned inside host control flow (branches)",
}
#: Results a pass leaves only when it has something to say: absent, they read as None.
OPTIONAL_RESULTS = frozenset({"rewrite_report", "auto", "profile"})


class MissingResultError(AttributeError):
    """A result read before any pass produced it: a pass list that does not meet its contracts."""


class Context:
    """One run of the pipeline: the caller's frozen :class:`Settings`; the :data:`RESULTS`,
    absent until a pass produces them (reading a missing one raises :class:`MissingResultError`,
    except :data:`OPTIONAL_RESULTS`, which read as None); and the run's record (diagnostics,
    seconds per pass, the weight store, where progress goes).

    Every write of a result is logged, so :class:`Sequential` can check that a pass wrote only
    what it declares (``provides`` and ``may_leave``)."""

    def __init__(self, source: ModelLike, hardware: Hardware | None, options: Options | None = None,
                 weights: WeightStore | None = None, *, progress: Progress | None = None,
                 output: Path | None = None) -> None:
        object.__setattr__(self, "settings", Settings(source, hardware, options or Options(), output))
        object.__setattr__(self, "_results", {})
        object.__setattr__(self, "written", [])
        self.weights = weights
        self.diagnostics: list[Diagnostic] = []
        self.progress = progress if progress is not None else Say()
        self.pass_seconds: dict[str, float] = {}

    def __getattr__(self, name: str):
        if name in RESULTS:
            if name in self._results:
                return self._results[name]
            if name in OPTIONAL_RESULTS:
                return None
            raise MissingResultError(f"ctx.{name} was read before any pass produced it")
        if name in _SETTINGS:
            return getattr(self.settings, name)
        raise AttributeError(name)

    def __setattr__(self, name: str, value) -> None:
        if name in _SETTINGS:
            raise AttributeError(f"ctx.{name} is a setting: a pass reads it and never writes it")
        if name in RESULTS:
            self._results[name] = value
            self.written.append(name)
        else:
            object.__setattr__(self, name, value)

    def has(self, name: str) -> bool:
        """Whether ``name`` (a result or a setting) is there: a result a pass produced, or a
        setting the caller gave (not None)."""
        if name in _SETTINGS:
            return getattr(self.settings, name) is not None
        return name in self._results

    def child(self, source: ModelLike, options: Options, **settings) -> "Context":
        """A context for a sub-pipeline (a branch): the same hardware, its own source and options
        (and the other :class:`Settings` given as keywords)."""
        child = Context(source, self.hardware, options)
        object.__setattr__(child, "settings", replace(child.settings, **settings))
        return child

    def note(self, diagnostic: Diagnostic) -> None:
        """Record ``diagnostic`` once."""
        if diagnostic not in self.diagnostics:
            self.diagnostics.append(diagnostic)

    @property
    def source_name(self) -> str:
        return "the model" if isinstance(self.source, onnx.ModelProto) else Path(self.source).name


_SETTINGS = frozenset(f.name for f in fields(Settings))


class Pass(Protocol):
    """A pass and its contract: what it ``requires`` (settings the caller gave, results an
    earlier pass produced), the results it ``provides`` (writes on every run) and those it
    ``may_leave`` (writes only when there is something to say: a report, a profile). It writes
    no other result: :class:`Sequential` checks both sides and names the pass that breaks the
    contract. ``where`` names its modules and ``what`` says what it does (docs/architecture.md's
    table of passes is :func:`pass_table` of these declarations)."""

    name: str
    requires: tuple[str, ...]
    provides: tuple[str, ...]
    may_leave: tuple[str, ...]
    where: str
    what: str

    def label(self, ctx: Context) -> str: ...

    def run(self, ctx: Context) -> None: ...


# ------------------------------------------------------------------------------ the passes
class Load:
    name = "load"
    requires = ("source",)
    provides = ("model",)
    may_leave = ()
    where = "`frontend/load.py`, `ir/mapped.py`"
    what = "reads the file (or copies the caller's `ModelProto`)"

    def label(self, ctx: Context) -> str:
        return f"loading {ctx.source_name}"

    def run(self, ctx: Context) -> None:
        ensure_registered()
        source = ctx.source
        if isinstance(source, onnx.ModelProto):
            model = copy_model(source)
        else:
            model = load_model(source, ctx.weights)
        refuse_fused(model)
        ctx.model = model


class Normalize:
    name = "normalize"
    requires = ("model",)
    provides = ("model",)
    may_leave = ()
    where = "`frontend/normalize.py` (+ `fold.py`, `pins.py`, `shapes.py`)"
    what = "inlines functions, checks the pins, folds constants, infers every type"

    def label(self, ctx: Context) -> str:
        return "normalizing: functions, pins, folding, shapes"

    def run(self, ctx: Context) -> None:
        shapes = ctx.options.shapes
        ctx.model = normalize_owned(ctx.model, shapes.input_shapes, diagnostics=ctx.diagnostics,
                                    probe_values=shapes.inputs, weights=ctx.weights, max_memory=shapes.max_memory)
        if ctx.weights is not None:  # the parsed tree dies here: protobuf frees a tree only whole
            ctx.model = ctx.weights.detach(ctx.model)


class Rewrite:
    name = "rewrite"
    requires = ("model",)
    provides = ()
    may_leave = ("model", "rewrite_report")  # nothing when rewriting is off
    where = "`rewrite/`"
    what = "rewrites what the accelerator cannot run into its primitives"

    def label(self, ctx: Context) -> str:
        if not ctx.options.rewrite.enabled:
            return "rewriting: off"
        return f"rewriting {', '.join(selected_rewriters(ctx.options.rewrite.only))}"  # the registry's names

    def run(self, ctx: Context) -> None:
        asked = ctx.options.rewrite
        if asked.enabled:
            ctx.model, ctx.rewrite_report = rewrite_owned(ctx.model, bn_mode=asked.bn_mode, only=asked.only,
                                                          weights=ctx.weights)
            ctx.diagnostics.extend(ctx.rewrite_report.skipped)
        hoist_identical_constants(ctx.model.graph)  # per-branch copies of one weight: one tensor, shared by blocks
        if ctx.weights is not None:
            ctx.weights.keep_only(ctx.model)  # the weights a rewrite replaced (Gemm's untransposed B)
        gc.collect()  # the rewrite's graphsurgeon graph is cyclic garbage holding the pre-rewrite weights


class Analyze:
    name = "analyze"
    requires = ("model",)
    provides = ("analysis",)
    may_leave = ()
    where = "`analyze/`, `frontend/shapes.py`"
    what = "orders the nodes, sizes and prices the layers, gives each host node its reason"

    def label(self, ctx: Context) -> str:
        return "analysing: layer table"

    def run(self, ctx: Context) -> None:
        values, budget, inferred = ctx.options.shapes.inputs, ctx.options.shapes.max_memory, {}
        shapes = pricing_shapes(ctx.model, ctx.options.shapes.input_shapes, ctx.note, ctx.weights, values=values,
                                budget=budget, cache=inferred)
        sizes = sizes_at(ctx.model, shapes, ctx.note, ctx.weights, values, budget, inferred)
        ctx.analysis = analyze(ctx.model, ctx.weights, sizes, shapes if sizes else None,
                               sizing_hint(ctx.model, ctx.options.shapes.input_shapes))
        ctx.diagnostics.extend(ctx.analysis.host_diagnostics())


class PlanPass:
    name = "plan"
    requires = ("analysis", "hardware")
    provides = ("plan", "block_latency_us", "bodies")
    may_leave = ("auto",)
    where = "`plan/planner.py` (+ `strategies/`, `perf/`), `precision/`"
    what = "chooses blocks, MPs and precisions; prices each block"

    def label(self, ctx: Context) -> str:
        at = f" at {ctx.options.precision.name}" if ctx.options.precision.name else ""
        if ctx.options.precision.planner.judged:  # it searches blocks itself: no strategy runs
            return f"planning: --precision {ctx.options.precision.name} (blocks, MPs and precisions)"
        if ctx.options.plan.file is not None:
            return f"planning: --plan{at}"
        strategy = ctx.options.plan.strategy
        return f"planning: {strategy if isinstance(strategy, str) else getattr(strategy, '__name__', strategy)}{at}"

    def run(self, ctx: Context) -> None:
        planned = ctx.options.precision.planner.plan(ctx.analysis, ctx.hardware, ctx.options)
        ctx.plan, ctx.block_latency_us = planned.plan, planned.latencies
        ctx.bodies, ctx.auto = planned.bodies, planned.auto
        ctx.diagnostics.extend(planned.diagnostics)


class Profile:
    """With ``--input-shape`` ranges: the plan priced at the ranges' min and max too
    (:mod:`onnxmlu.plan.profile`); the layers are analysed again at each point's shapes."""

    name = "profile"
    requires = ("analysis", "plan")
    provides = ()
    may_leave = ("profile",)
    where = "`plan/profile.py`"
    what = "prices the plan at the `--input-shape` ranges' ends"

    def label(self, ctx: Context) -> str:
        return "pricing the plan over the input ranges"

    def run(self, ctx: Context) -> None:
        values, budget = ctx.options.shapes.inputs, ctx.options.shapes.max_memory
        if not has_ranges(ctx.options.shapes.input_shapes):
            return
        layers_at = {"opt": ctx.analysis.layers}
        inputs = {"opt": ctx.analysis.input_shapes}
        for point in ("min", "max"):
            inferred = {}  # the model does not change between the two
            inputs[point] = range_end(ctx, point, inferred)
            sizes = sizes_at(ctx.model, inputs[point], ctx.note, ctx.weights, values, budget, inferred)
            at = analyze(ctx.model, ctx.weights, sizes).layers
            if [layer.name for layer in at] == [layer.name for layer in ctx.analysis.layers]:
                layers_at[point] = at
            else:  # a sizing failed there: the layer table itself differs
                ctx.note(Diagnostic("plan", "profile-unpriced", "", f"the plan is not priced at the ranges' {point} "
                                    f"({inputs[point]}): the layers cannot all be sized there"))
        ctx.profile = profile_plan(ctx.plan, layers_at, ctx.hardware, inputs)


def range_end(ctx: Context, point: str, inferred: dict | None = None) -> dict[str, list[int]]:
    """The fed inputs' shapes at ``point`` (``min``, ``max``) of the ``--input-shape`` ranges, as
    the plan is priced there (``fuse``'s profile, ``inspect``'s ``input profile`` line)."""
    shapes = ctx.options.shapes
    return pricing_shapes(ctx.model, shapes.input_shapes, ctx.note, ctx.weights, point, shapes.inputs,
                          shapes.max_memory, inferred)


class Collapse:
    name = "collapse"
    requires = ("analysis", "plan", "block_latency_us", "bodies")
    provides = ("fused", "blocks", "bodies")
    may_leave = ()
    where = "`collapse/blocks.py`"
    what = "builds the fused graph, one bodiless `MLUFusionBlock` node per block"

    def label(self, ctx: Context) -> str:
        calibrating = any(b.precision == "int8" for b in ctx.plan.blocks)
        blocks = plural(len(ctx.plan.blocks), "block")
        return f"collapsing {blocks}" + ("; calibrating INT8 blocks" if calibrating else "")

    def run(self, ctx: Context) -> None:
        layers = ctx.analysis.layers
        figures = [BlockFigures(sum(l.gops for l in b.layers(layers)), t)
                   for b, t in zip(ctx.plan.blocks, ctx.block_latency_us)]
        ctx.fused, ctx.blocks = fused_without_bodies(ctx.analysis, ctx.plan, figures, ctx.outer_constants,
                                                     ctx.overridable)
        record_pricing_shape(ctx.fused, pricing_of(ctx).to_dict())
        ctx.bodies = _block_bodies(ctx)


def pricing_of(ctx: Context) -> PricingShape:
    """The shapes the run's plan was priced at, its profile's with --input-shape ranges."""
    shapes = ctx.options.shapes
    pins = {**{n: list(np.shape(v)) for n, v in (shapes.inputs or {}).items()}, **(shapes.input_shapes or {})}
    profile = ctx.profile
    return pricing_shape(ctx.model, pins, ctx.analysis.input_shapes, profile.inputs if profile else None,
                         dict(profile.latency_us) if profile else None)


def _block_bodies(ctx: Context) -> "BlockBodies | None":
    """One :class:`BlockBodies` for the run when a block is not FP32, INT8 blocks calibrated
    now -- while the weight store still holds every weight, before any body is written.
    Its diagnostics (random calibration) join ``ctx.diagnostics`` here, in pass order."""
    if all(b.precision == DEFAULT_PRECISION for b in ctx.plan.blocks):
        return None
    bodies = ctx.bodies  # a planner that measured the bodies (auto) hands them on
    if bodies is None:
        make = optional_import("onnxmlu.precision.bodies").BlockBodies
        bodies = make(ctx.analysis, ctx.options.precision.calibration, ctx.options.precision.int8)
    bodies = prepare_bodies(ctx.analysis, ctx.blocks, bodies)
    _take_diagnostics(ctx, bodies)
    return bodies


def _take_diagnostics(ctx: Context, bodies: "BlockBodies | None") -> None:
    """Move what ``bodies`` recorded since the last call (stage ``precision``) into
    ``ctx.diagnostics``: each record once, in the order it was made."""
    if bodies is not None:
        ctx.diagnostics.extend(bodies.diagnostics)
        bodies.diagnostics.clear()


class Embed:
    """Last pass of ``fuse``: every block's body into its node, in memory."""

    name = "embed"
    requires = ("fused", "analysis", "blocks", "bodies")
    provides = ("blocks",)  # the bodies go into ctx.fused's nodes in place
    may_leave = ()
    where = "`collapse/blocks.py`"
    what = "puts each block's body into its node"

    def label(self, ctx: Context) -> str:
        return "embedding block bodies"

    def run(self, ctx: Context) -> None:
        add_bodies(ctx.fused, ctx.analysis, ctx.blocks, ctx.bodies)
        ctx.blocks = {}  # every body is in its node now
        _take_diagnostics(ctx, ctx.bodies)  # operators left in FP32 inside INT8 blocks


class Portable:
    """``fuse --portable``: each block (body embedded) becomes a call of a model-local ONNX
    function holding its body, so the file runs without the custom-op library."""

    name = "portable"
    requires = ("fused",)
    provides = ("fused",)
    may_leave = ()
    where = "`tools/view.py` (`explode`)"
    what = "turns each block into a model-local ONNX function"

    def label(self, ctx: Context) -> str:
        return "blocks as ONNX functions"

    def run(self, ctx: Context) -> None:
        ctx.fused = explode(ctx.fused)


class Write:
    """Last pass of ``fuse_to_file``: the fused model into ``ctx.output``, atomically. With a
    weight store it is streamed one body at a time (:func:`stream_pieces`); a model held in
    memory, or one over protobuf's 2 GB limit (external data), is embedded and saved whole."""

    name = "write"
    requires = ("fused", "analysis", "blocks", "bodies", "output")
    provides = ()
    may_leave = ()
    where = "`collapse/blocks.py`, `ir/wire.py`, `collapse/atomic.py`"
    what = "streams the fused model into the file, one body at a time"

    def label(self, ctx: Context) -> str:
        return f"saving {ctx.output.name}"

    def run(self, ctx: Context) -> None:
        if ctx.weights is None or needs_external_data(ctx.analysis.model):
            add_bodies(ctx.fused, ctx.analysis, ctx.blocks, ctx.bodies)  # those not embedded yet
            write_model_atomic(ctx.fused, ctx.output)
        else:
            write_pieces_atomic(stream_pieces(ctx.analysis, ctx.fused, ctx.blocks, ctx.bodies), ctx.output)
        _take_diagnostics(ctx, ctx.bodies)


class Branches:
    """Blocks inside the subgraphs of the host ``If``/``Loop``/``Scan`` nodes: each subgraph is
    lifted into a model, fused by :data:`BRANCH` (this pass included, for nested control flow)
    and grafted back (:mod:`onnxmlu.collapse.branches`)."""

    name = "branches"
    requires = ("fused", "analysis")
    provides = ("branches",)
    may_leave = ()
    where = "`collapse/branches.py`"
    what = "fuses each subgraph of a host `If`/`Loop`/`Scan` and grafts it back"

    def label(self, ctx: Context) -> str:
        return "planning blocks inside control flow"

    def run(self, ctx: Context) -> None:
        graph, ctx.branches = ctx.fused.graph, []
        for site in branch_sites(graph, node_label):
            subgraph, node = subgraph_of(graph, site), graph.node[site.position]
            if not may_hold_arithmetic(subgraph):
                continue  # only data movement (a Squeeze, an Identity): a block would be a launch for nothing
            fused = _fuse_branch(ctx, site, node, subgraph)
            if fused is None or not _does_arithmetic(fused[1]):
                continue
            lifted, sub = fused
            graft(subgraph, sub.fused, lifted.copied, site.key)
            ctx.diagnostics.extend(d for d in sub.diagnostics if d.node)
            ctx.branches.append(BranchPlan(site.key, node.op_type, lifted.runs, sub.plan, sub.block_latency_us,
                                           sub.analysis, sub.branches))
        if not ctx.branches:
            return
        if ctx.options.precision.planner.needs_samples:
            ctx.note(Diagnostic("branches", "branch-fp32", "", f"blocks inside control flow are planned at FP32: "
                                f"--precision {ctx.options.precision.name} needs samples of each branch's inputs"))
        drop_unread_initializers(graph)  # weights only the branches read now travel in their blocks


def _fuse_branch(ctx: Context, site, node: onnx.NodeProto, subgraph: onnx.GraphProto
                 ) -> "tuple[Lifted, Context] | None":
    """The subgraph at ``site`` lifted and fused, or None (with a ``branch-host`` diagnostic)
    when it cannot be: the subgraph then stays exactly as it was, on the host with its node --
    which is what every model got before this pass, so no failure here may refuse a model."""
    try:
        lifted = lift(ctx.analysis.model, ctx.analysis.index, node, subgraph)
        sub = _branch_context(ctx, lifted)
        BRANCH.run(sub)
        return lifted, sub
    except (LiftError, OnnxMluError) as reason:
        why = str(reason)
    except Exception as error:  # noqa: BLE001 - recorded: the branch keeps its exported form
        why = f"fusing it failed ({type(error).__name__}: {error})"
    ctx.note(Diagnostic("branches", "branch-host", site.key, f"its subgraph stays on the host: {why}"))
    return None


def _does_arithmetic(sub: Context) -> bool:
    """Whether a fused subgraph's blocks compute (a layer that is neither data movement nor a
    copy: its arithmetic may have stayed on the host) or it holds fused subgraphs of its own."""
    return bool(sub.branches) or any(computes(layer.op_type, layer.kind) for layer in sub.analysis.layers)


def _branch_context(ctx: Context, lifted: "Lifted") -> Context:
    """The context fusing one lifted subgraph: the run's strategy, MP, hardware and precision
    -- FP32 where that precision calibrates on samples (INT8, auto: a branch's own inputs have
    none) --, the pins the enclosing graph sizes."""
    opts, fed = ctx.options, {i.name for i in lifted.model.graph.input}
    values = {n: v for n, v in (opts.shapes.inputs or {}).items() if n in fed}
    precision = None if opts.precision.planner.needs_samples else opts.precision.name
    options = Options(ShapeOptions(lifted.pins or None, values or None), RewriteOptions(enabled=False),
                      PlanOptions(opts.plan.strategy, mp=opts.plan.mp), PrecisionOptions(precision))
    overridable = ctx.overridable | {i.name for i in ctx.analysis.model.graph.input}
    return ctx.child(lifted.model, options, outer_constants=lifted.copied - overridable, overridable=overridable)


# ------------------------------------------------------------------------------ instruments
class Instrument:
    """Hooks around a pipeline run and around each pass; each does nothing by default."""

    def enter(self, ctx: Context) -> None: ...

    def before(self, p: Pass, ctx: Context) -> None: ...

    def after(self, p: Pass, ctx: Context) -> None: ...

    def exit(self, ctx: Context) -> None: ...


class ShowProgress(Instrument):
    """Each pass's line; the run's display is :func:`onnxmlu.progress.current` while it runs, for
    counts from deep inside a pass (auto's trials)."""

    def enter(self, ctx: Context) -> None:
        self._token = progress.enter(ctx.progress)

    def before(self, p: Pass, ctx: Context) -> None:
        ctx.progress.say(p.label(ctx))

    def exit(self, ctx: Context) -> None:
        progress.leave(self._token)


class TimePasses(Instrument):
    """Seconds per pass, in ``ctx.pass_seconds`` (pass name -> seconds)."""

    def before(self, p: Pass, ctx: Context) -> None:
        self._start = time.perf_counter()

    def after(self, p: Pass, ctx: Context) -> None:
        ctx.pass_seconds[p.name] = time.perf_counter() - self._start


class CollectorPaused(Instrument):
    """Python's cyclic garbage collector off while the pipeline allocates: its full passes over
    graphsurgeon's object graph were a quarter of the CPU time of a 20k-node fuse."""

    def enter(self, ctx: Context) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()

    def exit(self, ctx: Context) -> None:
        if self._was_enabled:
            gc.enable()


class Sequential:
    """A list of passes that is itself a pass (TVM's ``Sequential`` [TVM-passes], onnxscript's
    ``PassManager`` [ONNXScript]): its contract is its passes' (what the first ones require from
    the caller; what any of them provides or may leave), and it runs them in order, checking
    each one's contract on both sides (:func:`check_before`, :func:`check_after`), under
    ``instruments``' per-pass hooks."""

    where = "`pipeline.py`"

    def __init__(self, name: str, passes: Sequence[Pass], instruments: Sequence[Instrument] = ()) -> None:
        self.name, self.passes, self.instruments = name, tuple(passes), tuple(instruments)
        self.what = " → ".join(p.name for p in self.passes)
        provided: set[str] = set()
        requires: list[str] = []
        for p in self.passes:
            requires += [f for f in p.requires if f not in provided and f not in requires]
            provided |= set(p.provides)
        self.requires = tuple(requires)
        self.provides = tuple(dict.fromkeys(f for p in self.passes for f in p.provides))
        self.may_leave = tuple(dict.fromkeys(f for p in self.passes for f in p.may_leave if f not in self.provides))

    def __iter__(self):
        return iter(self.passes)

    def label(self, ctx: Context) -> str:
        return f"{self.name}: {self.what}"

    def run(self, ctx: Context) -> None:
        for p in self.passes:
            check_before(p, ctx)
            for instrument in self.instruments:
                instrument.before(p, ctx)
            start = len(ctx.written)
            p.run(ctx)
            for instrument in reversed(self.instruments):
                instrument.after(p, ctx)
            check_after(p, ctx, set(ctx.written[start:]))


class PassManager(Sequential):
    """Runs ``passes`` over one context under ``instruments`` (also their hooks around the
    whole run) and returns the context."""

    def __init__(self, passes: Sequence[Pass], instruments: Sequence[Instrument] | None = None) -> None:
        super().__init__("pipeline", passes, default_instruments() if instruments is None else instruments)

    def run(self, ctx: Context) -> Context:  # type: ignore[override]
        for instrument in self.instruments:
            instrument.enter(ctx)
        try:
            super().run(ctx)
        finally:
            for instrument in reversed(self.instruments):
                instrument.exit(ctx)
        return ctx


class PassContractError(AssertionError):
    """A pass ran without something it requires, returned without writing a result it
    provides, or wrote one it does not declare: a bug in the pipeline's pass list, named at
    the pass that broke the contract (onnxscript's ``requires``/``ensures`` checks)."""


def check_before(p: Pass, ctx: Context) -> None:
    missing = [f for f in p.requires if not ctx.has(f)]
    if missing:
        raise PassContractError(f"pass {p.name!r} requires ctx.{', ctx.'.join(missing)}, which no earlier "
                                f"pass left")


def check_after(p: Pass, ctx: Context, written: set[str]) -> None:
    forgot = [f for f in p.provides if f not in written]
    if forgot:
        raise PassContractError(f"pass {p.name!r} provides ctx.{', ctx.'.join(forgot)} but did not write it")
    undeclared = sorted(written - set(p.provides) - set(p.may_leave))
    if undeclared:
        raise PassContractError(f"pass {p.name!r} wrote ctx.{', ctx.'.join(undeclared)}, which it does not "
                                f"declare")


# ------------------------------------------------------------------------------ the pass lists
#: The stages up to a plan (``prepare`` is the first three).
PLAN = (Load(), Normalize(), Rewrite(), Analyze(), PlanPass(), Profile())
#: Each subgraph of a host If/Loop/Scan, lifted into a model (:class:`Branches`).
BRANCH = Sequential("branch", (Load(), Normalize(), Analyze(), PlanPass(), Collapse(), Branches(), Embed()))
FUSE = (*PLAN, Collapse(), Branches(), Embed())
FUSE_TO_FILE = (*PLAN, Collapse(), Branches(), Write())
PORTABLE = (*PLAN, Collapse(), Branches(), Embed(), Portable(), Write())


def pass_table(passes: Sequence[Pass]) -> str:
    """The markdown table of ``passes`` and their contracts, one row per pass (docs/architecture.md)."""
    fields = lambda names: ", ".join(f"`{n}`" for n in names) or "–"  # noqa: E731
    rows = ["| pass | modules | what it does | requires | provides | may leave |", "|---|---|---|---|---|---|"]
    rows.extend(f"| {p.name} | {p.where} | {p.what} | {fields(p.requires)} | {fields(p.provides)} | "
                f"{fields(p.may_leave)} |" for p in passes)
    return "\n".join(rows)


#: Every pass once, in pipeline order (the table of docs/architecture.md).
ALL_PASSES = (*PLAN, Collapse(), Branches(), Embed(), Portable(), Write())


def default_instruments() -> tuple[Instrument, ...]:
    return (CollectorPaused(), TimePasses(), ShowProgress())
