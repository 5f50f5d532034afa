"""``--precision auto``: blocks, MP and a precision per block, chosen together under an
accuracy budget (``cosine>=X`` or ``top1>=X``, :mod:`onnxmlu.precision.accuracy`).

The performance model makes latency a sum over blocks, ``T = sum_b T_p(b)(i_b, j_b, m_b)``;
the search strategy ``optimal`` minimises it by a shortest path over cut positions. Precision
adds a second sum, the accuracy lost, which is *measured* (never guessed) and then planned
with by a Lagrangian relaxation:

1. **Sensitivity, measured.** The layers are grouped into at most ``max_units`` (default 6)
   units: contiguous runs within a segment holding about equal shares of the latency that
   lower precision can save, ``g_l = min_m T_fp32(l, m) - min_m T_int8(l, m)`` (each layer
   alone at its best MP). Each unit runs alone at FP16 and alone at INT8 (calibrated on the
   same samples), the rest at FP32, on the first ``sensitivity_samples`` calibration samples
   (:class:`PlanEvaluator`): its
   deficits ``d_u(p) = 1 - metric`` for both metrics. A layer gets its unit's deficit in
   proportion to its gain: ``s_l(p) = d_u(p) g_l / g_u``. Segments holding under 0.5 % of
   the gain are not worth a measurement; they stay FP32 (a diagnostic says how many).
2. **Lagrangian sweep.** For ``lambda >= 0`` the shortest path over blocks ``[i, j)``, MPs and
   precisions minimises ``sum_b T_p(i, j) + lambda * S_p(i, j)`` with ``S_p(i, j) = sum_l
   s_l(p)`` (cosine deficits: continuous, where top-1 counts are mostly 0 on few samples).
   ``lambda = 0`` gives the fastest plan, ``lambda -> inf`` the FP32 optimum. The distinct plans
   of a geometric grid of ``lambda`` form the estimated frontier.
3. **Choice, verified.** A plan's estimated accuracy is ``1 - sum`` of its blocks' deficits
   in the budget's metric (independent small errors add). The fastest frontier plan whose
   estimate meets the budget is **run on every calibration sample**. If it meets the budget,
   faster frontier plans are tried in turn (at most ``advance``), since sums of deficits
   overestimate loss; if it misses, the low-precision block with the largest estimated deficit
   moves one step up (INT8 -> FP16 -> FP32, at its best MP there) and the plan runs again,
   until the budget is met. The FP32 plan ends every back-off; if even it misses (the budget
   asks for more than FP32 rounding gives), it is returned with a ``budget-unmet``
   diagnostic.

Every plan considered is labelled honestly (:mod:`onnxmlu.plan.labels`): the search offers a
block only at the precision its body would compute -- INT8 where it holds quantized arithmetic
(the model's own, never a choice), FP32 where it holds only other layers arriving quantized,
INT8 only with an operator the quantizer quantizes, FP16 only with an FP32 tensor -- so the
latency and deficits it weighs are the written block's. Segments holding layers that arrive
quantized are not measured.

**Held out.** Calibration samples set the INT8 scales; *validation* samples judge every
measurement above (:func:`~onnxmlu.precision.calibration.split_samples`: ``--validation DIR``,
else every other calibration sample, else other seeded random samples). The report gives the
chosen plan's figure on both, side by side. A ``top1`` budget is met only when the 95 %
Clopper–Pearson lower bound on the held-out agreement clears it; with too few held-out rows to
certify it even at full agreement, the search is not run: the FP32 optimum is returned with a
``budget-uncertified`` diagnostic saying how many samples would do.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from onnxmlu import progress
from onnxmlu.diagnostics import Diagnostic
from onnxmlu.errors import OnnxMluError
from onnxmlu.plan.labels import anchors_int8, has_fp32, honest_labels
from onnxmlu.plan.perf.hardware import Hardware
from onnxmlu.plan.perf.layers import Layer, layers_at_precision
from onnxmlu.plan.perf.model import make_cost, plan_block_latencies_us
from onnxmlu.plan.plan import Block, Plan, segments
from onnxmlu.plan.strategies.search import max_block_length, whole_segments
from onnxmlu.precision import DEFAULT_PRECISION, PRECISIONS, record
from onnxmlu.precisions import FP32, INT8, RECORDS
from onnxmlu.precision.accuracy import Accuracy, Budget, load_metric, measure, rows_to_certify
from onnxmlu.precision.bodies import runnable_model
from onnxmlu.precision.calibration import DEFAULT_RANDOM_SAMPLES, split_samples
from onnxmlu.precision.evaluate import PlanEvaluator
from onnxmlu.plan.planner import kept_layers
from onnxmlu.plan.strategies import run_strategy
from onnxmlu.plots import pareto_chart
from onnxmlu.wording import plural

#: The precisions auto may lower a block to.
LOWER = PRECISIONS[1:]
#: Share of the savable latency below which a segment is not measured (kept FP32).
MINOR_SHARE = 0.005
LAMBDA_GRID = np.logspace(-3, 3, 25)
STRATEGY = "auto"
#: The budget of ``--precision auto`` without ``--accuracy``.
DEFAULT_BUDGET = Budget("cosine", 0.999)


@dataclass(frozen=True)
class UnitSensitivity:
    """One measured unit: layers ``[start, stop)``, its savable latency and its deficits."""

    start: int
    stop: int
    gain_us: float
    deficits: dict[str, Accuracy]  # precision -> (1 - cosine, 1 - top1) with only this unit lowered

    def to_dict(self) -> dict:
        return {"start": self.start, "stop": self.stop, "gain_us": self.gain_us,
                "deficits": {p: a.to_dict() for p, a in self.deficits.items()}}


@dataclass
class Candidate:
    """A plan ``auto`` considered: its simulated latency, estimated and (when run) measured accuracy."""

    plan: Plan
    latency_us: float
    estimated: Accuracy
    measured: Accuracy | None = None
    origin: str = "frontier"  # or "back-off"

    def to_dict(self) -> dict:
        counts = {p: sum(b.precision == p for b in self.plan.blocks) for p in PRECISIONS}
        return {"latency_us": self.latency_us, "blocks": len(self.plan.blocks), "precisions": counts,
                "estimated": self.estimated.to_dict(),
                "measured": None if self.measured is None else self.measured.to_dict(), "origin": self.origin}


@dataclass
class AutoResult:
    """What ``auto`` chose, from what, and what it measured."""

    chosen: Candidate
    budget: Budget
    fp32_latency_us: float
    candidates: list[Candidate]
    units: list[UnitSensitivity]
    evaluator: PlanEvaluator
    seconds: float = 0.0
    diagnostics: list[Diagnostic] = field(default_factory=list)
    in_sample: Accuracy | None = None  # the chosen plan on the calibration samples
    rule: str = ""  # how the judging samples were chosen

    @property
    def plan(self) -> Plan:
        return self.chosen.plan

    @property
    def speedup(self) -> float:
        return self.fp32_latency_us / self.chosen.latency_us if self.chosen.latency_us else 1.0

    def to_dict(self) -> dict:
        calibration = self.evaluator.calibration
        return {"budget": str(self.budget), "met": self.budget.met(self.chosen.measured),
                "estimated": self.chosen.estimated.to_dict(), "measured": self.chosen.measured.to_dict(),
                "latency_us": self.chosen.latency_us, "fp32_latency_us": self.fp32_latency_us,
                "speedup": self.speedup, "seconds": self.seconds, "runs": self.evaluator.runs,
                "calibration": {"source": calibration.source, "random": calibration.random,
                                "samples": len(calibration)},
                "validation": {"source": self.evaluator.validation.source, "random": self.evaluator.validation.random,
                               "samples": len(self.evaluator.validation), "held_out": self.evaluator.held_out,
                               "rule": self.rule},
                "in_sample": None if self.in_sample is None else self.in_sample.to_dict(),
                "top1_lower_bound": _number(self.chosen.measured.top1_bound()),
                "metric": _number(self.chosen.measured.metric),
                "units": [u.to_dict() for u in self.units], "candidates": [c.to_dict() for c in self.candidates]}


@dataclass(frozen=True)
class AutoOptions:
    """How hard ``auto`` looks: units measured, samples per unit run, faster plans tried."""

    max_units: int = 6
    sensitivity_samples: int = 8
    advance: int = 2
    measure_frontier: bool = False  # run every frontier plan (for the Pareto plot)
    random_samples: int = DEFAULT_RANDOM_SAMPLES  # seeded random samples when no calibration folder is given
    keep_fp32: tuple[str, ...] = ()  # layers (node names or shell patterns) no plan may lower (--keep-fp32)


def plan_auto(evaluator: PlanEvaluator, hw: Hardware, budget: Budget, effort: AutoOptions | None = None) -> AutoResult:
    """The joint plan of ``evaluator``'s model under ``budget`` (module docstring)."""
    start = time.perf_counter()
    effort = effort or AutoOptions()
    layers = evaluator.analysis.layers
    if budget.metric == "top1" and math.isnan(measure(evaluator.reference[:1], evaluator.reference[:1]).top1):
        raise OnnxMluError("top1 needs an output with class scores on its last axis; this model has none: "
                           "use --accuracy cosine>=X")
    if budget.metric == "metric" and evaluator.metric is None:
        raise OnnxMluError("--accuracy metric>=X judges by a user metric: give --metric module:function")
    if not layers:  # nothing runs on the accelerator: nothing to choose
        empty = Candidate(Plan((), STRATEGY, hw.name), 0.0, Accuracy(1.0, 1.0), Accuracy(1.0, 1.0))
        return AutoResult(empty, budget, 0.0, [empty], [], evaluator, time.perf_counter() - start)
    search = JointSearch(layers, hw)
    rows = measure(evaluator.reference, evaluator.reference).rows
    if not budget.certifiable(rows):
        return _uncertified(evaluator, search, budget, rows, start)
    units, pinned, diagnostics = sensitivity_units(layers, search, effort.max_units)
    if effort.keep_fp32:  # before any measurement: a pattern that matches nothing is an error now
        pinned = pinned | np.array(kept_layers(layers, effort.keep_fp32), dtype=bool)
    measured = measure_units(evaluator, layers, units, effort.sensitivity_samples, search.gain)
    search.set_sensitivity(layer_deficits(measured, search.gain, len(layers)), pinned)
    frontier = search.frontier()
    chosen, considered = verify(frontier, evaluator, budget, search, effort)
    if not budget.met(chosen.measured):
        diagnostics.append(Diagnostic("precision", "budget-unmet", "", (
            f"no plan meets {budget}: even all-FP32 measures {chosen.measured.value(budget.metric):.6f}")))
    diagnostics.extend(_sample_diagnostics(evaluator))
    return AutoResult(chosen, budget, frontier[-1].latency_us, considered, measured, evaluator,
                      time.perf_counter() - start, diagnostics, evaluator.in_sample(chosen.plan))


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def _sample_diagnostics(evaluator: PlanEvaluator) -> list[Diagnostic]:
    out = []
    if evaluator.calibration.random or evaluator.validation.random:
        out.append(Diagnostic("precision", "random-calibration", "", (
            f"--precision auto measured accuracy on {evaluator.validation.describe()}: a budget met on noise "
            "is not a budget met on the model's data; give a calibration folder")))
    if not evaluator.held_out:
        out.append(Diagnostic("precision", "in-sample", "", (
            "the budget was judged on the samples that calibrated INT8 (one sample): met by construction, "
            "not shown; give --validation DIR")))
    return out


def _uncertified(evaluator: PlanEvaluator, search: "JointSearch", budget: Budget, rows: int,
                 start: float) -> AutoResult:
    """The FP32 optimum, measured, when ``rows`` held-out rows cannot certify ``budget``."""
    fp32 = search.candidate(search.fp32_optimum())
    fp32.measured = evaluator.accuracy(fp32.plan)
    need = rows_to_certify(budget.threshold)
    per_sample = max(1, rows // max(1, len(evaluator.validation)))
    advice = (f"at least {plural(need, 'row')} ({plural(math.ceil(need / per_sample), 'sample')}) would" if need
              else "no finite number of samples can")
    diagnostics = [Diagnostic("precision", "budget-uncertified", "", (
        f"{budget} cannot be certified on {plural(rows, 'held-out row')} (even full agreement bounds top-1 at "
        f"{fp32.measured.top1_bound() if fp32.measured.rows else float('nan'):.4f}, 95 % Clopper-Pearson): "
        f"kept the FP32 optimum; {advice}"))]
    diagnostics.extend(_sample_diagnostics(evaluator))
    return AutoResult(fp32, budget, fp32.latency_us, [fp32], [], evaluator, time.perf_counter() - start,
                      diagnostics, evaluator.in_sample(fp32.plan))


def plan_analysis(analysis, hw: Hardware, accuracy: Budget | str | None = None, *, calibration=None, int8=None,
                  effort: AutoOptions | None = None, validation=None, metric: str | None = None) -> AutoResult:
    """:func:`plan_auto` of an analysed model under the ``accuracy`` budget (default
    :data:`DEFAULT_BUDGET`; the text of ``--accuracy`` is parsed here, the entry point of scripts
    that call it directly): INT8 calibrated and accuracy judged on the samples
    :func:`~onnxmlu.precision.calibration.split_samples` draws from the ``calibration`` and
    ``validation`` folders (else ``effort.random_samples`` seeded random ones of each);
    ``int8``: how INT8 blocks are quantized; ``metric``: a user metric ``module:function``
    (:func:`~onnxmlu.precision.accuracy.load_metric`) measured beside cosine and top-1."""
    effort = effort or AutoOptions()
    user = None if metric is None else load_metric(metric)
    split = split_samples(runnable_model(analysis), calibration, validation, effort.random_samples,
                          analysis.input_shapes)
    evaluator = PlanEvaluator(analysis, split.calibration, int8, split.validation, user)
    result = plan_auto(evaluator, hw, Budget.of(accuracy) or DEFAULT_BUDGET, effort)
    result.rule = split.rule
    return result


# ------------------------------------------------------------------------------ sensitivity
def sensitivity_units(layers: Sequence[Layer], search: "JointSearch", max_units: int
                      ) -> tuple[list[tuple[int, int]], np.ndarray, list[Diagnostic]]:
    """Units to measure (ranges of about equal gain), the layers kept FP32 unmeasured, and a
    diagnostic when some are."""
    gain = search.gain
    total = float(gain.sum())
    units: list[tuple[int, int]] = []
    pinned = np.zeros(len(layers), dtype=bool)
    for s, e in segments(layers):
        share = float(gain[s:e].sum()) / total if total > 0 else 0.0
        if share < MINOR_SHARE or search.fixed_precision(s, e):
            pinned[s:e] = share < MINOR_SHARE and not search.fixed_precision(s, e)
            continue
        units.extend(_equal_gain_pieces(gain, s, e, max(1, int(max_units * share))))
    diagnostics = []
    if pinned.any():
        diagnostics.append(Diagnostic("precision", "kept-fp32", "", (
            f"{plural(int(pinned.sum()), 'layer')} in segments holding under {MINOR_SHARE:.1%} of the latency lower "
            "precision could save stay FP32 (not worth measuring)")))
    return units, pinned, diagnostics


def _equal_gain_pieces(gain: np.ndarray, s: int, e: int, k: int) -> list[tuple[int, int]]:
    cum = np.cumsum(gain[s:e])
    targets = cum[-1] * np.arange(1, k) / k
    cuts = sorted({s + int(c) + 1 for c in np.searchsorted(cum, targets)} - {s, e})
    bounds = [s, *[c for c in cuts if s < c < e], e]
    return list(zip(bounds[:-1], bounds[1:]))


def measure_units(evaluator: PlanEvaluator, layers: Sequence[Layer], units: Sequence[tuple[int, int]],
                  samples: int, gain: np.ndarray) -> list[UnitSensitivity]:
    """Each unit alone at FP16 and at INT8 (the rest FP32) on the first ``samples`` samples."""
    trials = {(u, p): lowered_plan(layers, u, p) for u in units for p in LOWER}
    calibrated = min(samples, len(evaluator.calibration))
    shown = progress.current()
    shown.say(f"auto: calibrating {plural(len(units), 'unit')} for their trials")
    evaluator.prepare(list(trials.values()), calibrated, shown)  # one capture run for every INT8 unit
    shown.say(f"auto: the model run to the start of each unit ({plural(samples, 'sample')})")
    evaluator.prepare_prefixes(list(trials.values()), samples, shown)  # each trial runs from its unit on
    shown.say(f"auto: sensitivity trials (a unit at fp16 or int8) on {plural(samples, 'sample')}")
    shown.total(len(trials))
    measured = []
    for u in units:
        deficits = {}
        for p in LOWER:
            deficits[p] = _deficit(evaluator.accuracy(trials[(u, p)], samples, calibrated))
            shown.advance()
        measured.append(UnitSensitivity(u[0], u[1], float(gain[u[0]:u[1]].sum()), deficits))
    return measured


def lowered_plan(layers: Sequence[Layer], unit: tuple[int, int], precision: str) -> Plan:
    """A valid plan in which only ``unit`` runs at ``precision`` (every other range FP32, MP 1)."""
    blocks = []
    for s, e in segments(layers):
        cuts = sorted({s, e, *(c for c in unit if s < c < e)})
        for a, b in zip(cuts[:-1], cuts[1:]):
            inside = unit[0] <= a and b <= unit[1]
            blocks.append(Block(a, b, 1, precision if inside else DEFAULT_PRECISION))
    return Plan(tuple(blocks), "sensitivity")


def _deficit(accuracy: Accuracy) -> Accuracy:
    return Accuracy(max(0.0, 1.0 - accuracy.cosine), max(0.0, 1.0 - accuracy.top1))


def layer_deficits(units: Sequence[UnitSensitivity], gain: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """``{precision: [n, 2]}``: each layer's share of its unit's deficits (cosine, top-1), in
    proportion to its gain (evenly when the unit saves nothing)."""
    out = {p: np.zeros((n, 2)) for p in PRECISIONS}
    for u in units:
        g = gain[u.start:u.stop]
        share = g / g.sum() if g.sum() > 0 else np.full(len(g), 1.0 / len(g))
        for p, d in u.deficits.items():
            top1 = 0.0 if np.isnan(d.top1) else d.top1
            out[p][u.start:u.stop] = np.outer(share, [d.cosine, top1])
    return out


# ------------------------------------------------------------------------------ the search
class JointSearch:
    """Shortest paths over blocks, MPs and precisions (module docstring, step 2): the bands of
    the ``optimal`` strategy, one per precision, priced once."""

    def __init__(self, layers: Sequence[Layer], hw: Hardware) -> None:
        self.layers, self.hw, self.cost = layers, hw, make_cost(hw)
        self.mps = hw.mp_choices()
        bound = max_block_length(hw)
        self.at = {p: layers_at_precision(layers, p) for p in PRECISIONS}
        self.bands = {p: self._band(p, k, bound) for k, p in enumerate(PRECISIONS)}
        self.whole = {p: whole_segments(self.at[p], self.mps, self.cost, bound) for p in PRECISIONS}
        singles = {p: self.cost.layer_table(self.at[p], self.mps).min(axis=1) for p in (FP32.name, INT8.name)}
        self.gain = np.maximum(singles[FP32.name] - singles[INT8.name], 0.0)
        flags = {"own": [layer.int8_arithmetic for layer in layers], "quantized": [layer.quantized for layer in layers],
                 "anchor": [anchors_int8(layer) for layer in layers], "float": [has_fp32(layer) for layer in layers]}
        self._count = {k: _prefix(np.array(v, dtype=bool)) for k, v in flags.items()}
        own, quantized = np.array(flags["own"], dtype=bool), np.array(flags["quantized"], dtype=bool)
        # per layer: what no block at p may hold (the rest of the labelling rule is in _labelled)
        # (a quantizing precision holds anything; one that rounds floats no layer arriving
        # quantized; FP32 no quantized arithmetic)
        self._allowed = {p.name: np.ones(len(layers), dtype=bool) if p.quantizes else ~quantized if p.rounds_floats
                         else ~own for p in RECORDS.values()}
        self._cum = {p: np.zeros((len(layers) + 1, 2)) for p in PRECISIONS}
        self._bad = {p: _prefix(~self._allowed[p]) for p in PRECISIONS}

    def _band(self, p: str, k: int, bound: int | None):
        """The ``optimal`` band at precision ``p``, its blocks counted on the display."""
        shown = progress.current()
        shown.say(f"auto: pricing blocks at {p} ({k + 1} of {len(PRECISIONS)})")
        return self.cost.band_table(self.at[p], self.mps, bound, progress=progress.reporter(shown))

    def fixed_precision(self, start: int, stop: int) -> bool:
        """Whether a layer of ``[start, stop)`` arrives quantized (the block's precision is the
        model's: INT8 with quantized arithmetic, else FP32)."""
        return bool(self._count["quantized"][stop] - self._count["quantized"][start])

    def _labelled(self, p: str, lo, j: int):
        """Whether blocks ``[lo, j)`` (``lo`` an int or an array) asked at ``p`` keep that label
        beyond what :attr:`_allowed` checks (:func:`~onnxmlu.plan.labels.honest_precision`): INT8
        needs quantized arithmetic, or an operator the quantizer quantizes and no other layer
        arriving quantized; FP16 an FP32 tensor."""
        held = {k: self._count[k][j] - self._count[k][lo] for k in self._count}
        if record(p).quantizes:
            return (held["own"] > 0) | ((held["quantized"] == 0) & (held["anchor"] > 0))
        if record(p).rounds_floats:
            return held["float"] > 0
        return np.ones_like(held["own"], dtype=bool)

    def set_sensitivity(self, deficits: dict[str, np.ndarray], pinned: np.ndarray) -> None:
        """Per-layer deficits (:func:`layer_deficits`) and the layers kept FP32."""
        for p in PRECISIONS:
            self._cum[p] = np.vstack([np.zeros((1, 2)), np.cumsum(deficits[p], axis=0)])
            allowed = self._allowed[p] & (~pinned if p != DEFAULT_PRECISION else True)
            self._bad[p] = _prefix(~allowed)

    def estimate(self, plan: Plan) -> Accuracy:
        """1 - the summed deficits of the plan's blocks (cosine, top-1)."""
        lost = sum((self._cum[b.precision][b.stop] - self._cum[b.precision][b.start] for b in plan.blocks),
                   np.zeros(2))
        return Accuracy(1.0 - float(lost[0]), 1.0 - float(lost[1]))

    def latency(self, plan: Plan) -> float:
        return float(sum(plan_block_latencies_us(plan, self.layers, self.cost)))

    def candidate(self, plan: Plan, origin: str = "frontier") -> Candidate:
        plan = honest_labels(plan, self.layers)  # a raised block with nothing to round is FP32
        return Candidate(plan, self.latency(plan), self.estimate(plan), origin=origin)

    def plan(self, lam: float, precisions: Sequence[str] = PRECISIONS) -> Plan:
        """The least ``latency + lam * cosine deficit`` plan using ``precisions``."""
        n = len(self.layers)
        best = np.full(n + 1, np.inf)
        best[0] = 0.0
        choice: list[tuple[int, int, str]] = [(0, 0, DEFAULT_PRECISION)] * (n + 1)
        for j in range(1, n + 1):
            for p in precisions:
                for i, value, m in self._options(j, p, lam, best):
                    if value < best[j]:
                        best[j], choice[j] = value, (i, m, p)
        return Plan(_backtrack(choice, n), STRATEGY, self.hw.name)

    def _options(self, j: int, p: str, lam: float, best: np.ndarray):
        """The best block ``[i, j)`` at ``p`` from the band, and the whole segment ending at ``j``."""
        lo, lat, mps = self.bands[p].column(j)
        cum, bad = self._cum[p][:, 0], self._bad[p]
        value = best[lo:j] + lat + lam * (cum[j] - cum[lo:j])
        value[(bad[j] - bad[lo:j] > 0) | ~self._labelled(p, np.arange(lo, j), j)] = np.inf
        k = int(np.argmin(value))
        yield lo + k, float(value[k]), int(mps[k])
        if j in self.whole[p]:
            s, latency, m = self.whole[p][j]
            if bad[j] == bad[s] and self._labelled(p, s, j):
                yield s, best[s] + latency + lam * (cum[j] - cum[s]), m

    def fp32_optimum(self) -> Plan:
        """The ``optimal`` strategy's plan, as ``fuse -s optimal`` writes it: FP32, but blocks
        holding quantized arithmetic at INT8 (the baseline ``auto`` is measured against)."""
        return honest_labels(run_strategy(self.layers, self.hw, "optimal", self.cost), self.layers)

    def frontier(self) -> list[Candidate]:
        """The distinct plans of the lambda sweep that no other beats on both latency and
        estimated deficit, fastest first; the last is the FP32 optimum (:meth:`fp32_optimum`)."""
        shown = progress.current()
        shown.say("auto: the latency/accuracy frontier (plans searched)")
        shown.total(2 + len(LAMBDA_GRID))
        fastest, fp32 = self.plan(0.0), self.fp32_optimum()
        shown.advance(2)
        span = self.latency(fp32) - self.latency(fastest)
        worst = 1.0 - self.estimate(fastest).cosine
        plans = {fastest.blocks: fastest, fp32.blocks: fp32}
        if not (span > 0 and worst > 0):  # the fastest plan loses nothing: no trade-off to sweep
            shown.advance(len(LAMBDA_GRID))
        for lam in LAMBDA_GRID * span / worst if span > 0 and worst > 0 else ():
            plan = self.plan(float(lam))
            plans.setdefault(plan.blocks, plan)
            shown.advance()
        return _undominated([self.candidate(p) for p in plans.values()])


def _prefix(mask: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(mask)])


def _backtrack(choice, n: int) -> tuple[Block, ...]:
    blocks, j = [], n
    while j > 0:
        i, m, p = choice[j]
        blocks.append(Block(i, j, m, p))
        j = i
    return tuple(blocks[::-1])


def _undominated(candidates: list[Candidate]) -> list[Candidate]:
    ordered = sorted(candidates, key=lambda c: (c.latency_us, -c.estimated.cosine))
    kept: list[Candidate] = []
    for c in ordered:  # fastest first: a slower plan is worth keeping only if it is more accurate
        if not kept or c.estimated.cosine > kept[-1].estimated.cosine:
            kept.append(c)
    return kept


# ------------------------------------------------------------------------------ verification
def verify(frontier: list[Candidate], evaluator: PlanEvaluator, budget: Budget, search: JointSearch,
           effort: AutoOptions) -> tuple[Candidate, list[Candidate]]:
    """The chosen candidate after running it (step 3), and every candidate considered."""
    shown = progress.current()
    shown.say(f"auto: calibrating the frontier's plans ({len(frontier)})")
    evaluator.prepare([c.plan for c in frontier], progress=shown)  # one capture run for the INT8 blocks of them all
    shown.say(f"auto: plans run on the {plural(len(evaluator.validation), 'validation sample')}")
    shown.total(0)  # how many is known only when the budget is met
    run = _runner(evaluator, shown)
    if budget.metric == "metric":  # no estimate of a user metric: run the frontier, fastest first
        chosen = next((c for c in frontier if budget.met(run(c).measured)), frontier[-1])
        return chosen, list(frontier)
    start = next((k for k, c in enumerate(frontier) if budget.met(c.estimated)), len(frontier) - 1)
    if effort.measure_frontier:
        for c in frontier:
            run(c)
    chosen = run(frontier[start])
    if budget.met(chosen.measured):
        for c in reversed(frontier[max(0, start - effort.advance):start]):
            if not budget.met(run(c).measured):
                break
            chosen = c
        return chosen, list(frontier)
    backed = back_off(chosen, budget, search, run)
    return backed[-1], list(frontier) + [c for c in backed if c not in frontier]


def _runner(evaluator: PlanEvaluator, shown=None):
    def run(candidate: Candidate) -> Candidate:
        if candidate.measured is None:
            candidate.measured = evaluator.accuracy(candidate.plan)
            if shown is not None:
                shown.advance()
        return candidate
    return run


def back_off(start: Candidate, budget: Budget, search: JointSearch, run) -> list[Candidate]:
    """Raise the most sensitive low-precision block one step at a time until the plan, run,
    meets ``budget`` (or nothing is left to raise)."""
    steps, current = [], start
    while not budget.met(current.measured):
        k = _most_sensitive(current.plan, search)
        if k is None:
            break
        current = run(search.candidate(_raised(current.plan, k, search), "back-off"))
        steps.append(current)
    return steps or [start]


def _most_sensitive(plan: Plan, search: JointSearch) -> int | None:
    movable = [k for k, b in enumerate(plan.blocks)
               if b.precision != DEFAULT_PRECISION and not search.fixed_precision(b.start, b.stop)]
    if not movable:
        return None
    one = lambda k: Plan((plan.blocks[k],))  # noqa: E731 - the block alone, to estimate
    return max(movable, key=lambda k: 1.0 - search.estimate(one(k)).cosine)


def _raised(plan: Plan, k: int, search: JointSearch) -> Plan:
    block = plan.blocks[k]
    higher = PRECISIONS[PRECISIONS.index(block.precision) - 1]
    row = search.cost.block_latencies(search.at[higher], [(block.start, block.stop)], search.mps)[0]
    raised = Block(block.start, block.stop, int(search.mps[int(np.argmin(row))]), higher)
    return Plan(plan.blocks[:k] + (raised,) + plan.blocks[k + 1:], plan.strategy, plan.hardware)


# ------------------------------------------------------------------------------ the picture
def pareto_points(result: AutoResult) -> list[dict]:
    """The measured plans ``auto`` considered, as points for :func:`write_pareto`."""
    points = []
    for c in result.candidates:
        if c.measured is None:
            continue
        mix = " ".join(f"{p}×{n}" for p in PRECISIONS if (n := sum(b.precision == p for b in c.plan.blocks)))
        points.append({"latency_us": c.latency_us, "accuracy": c.measured.value(result.budget.metric),
                       "label": mix, "chosen": c is result.chosen})
    return points


def write_pareto(result: AutoResult, path, title: str = ""):
    """Simulated latency against measured accuracy of the plans considered, the chosen one
    marked (``plan --pareto``; run ``auto`` with ``measure_frontier`` to have every frontier
    plan measured)."""
    return pareto_chart(pareto_points(result), path, metric=result.budget.metric,
                        threshold=result.budget.threshold, title=title)
