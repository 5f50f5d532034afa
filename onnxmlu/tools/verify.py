"""Numerical verification: run an original and a fused model on the same seeded inputs.

The reference is the original model in onnxruntime with graph optimizations disabled, so
onnxruntime's own fusions cannot hide a bug in ours. Inputs are drawn per element type:
floats ~ N(0, 1), integers uniform in [0, 10), booleans fair coins.

Shapes (:func:`check_shapes`): a fused model must match the original at every shape the
original accepts, so the check runs at several: the pricing shape of the pins (``opt``, or the
defaults of :mod:`onnxmlu.frontend.pins` for unpinned dims); the ``min`` and ``max`` of every
range; and, for the other symbolic dims (a pin without a range only prices them: the fused
model keeps them symbolic), one other batch (the first dim + 1) and, for each other symbolic dim, one other
size (twice its pricing size), dims sharing a name varied together, each run named as ``fuse``'s
pricing line names the dim (``other seq (ids[1])``, ``other x[3]`` for a dim without a name). A
shape the original itself refuses is reported as skipped, never as a failure; at least one shape must run.
Where the original refuses one of those other sizes and there are several such dims, it runs
once more with all of them doubled together (:data:`TOGETHER`): dims that are sums of others,
each named on its own (a decoder step's mask over ``total = past + sequence``), refuse every
one-dim change and stay sums when all double.

Error metrics per output: ``max_abs = max|f - r|`` and ``max_rel = max(|f - r| / (|r| + tiny))``
over the elements finite in both. The rule an output is judged by (:func:`output_steps`):

* a float output: ``|f - r| <= atol + rtol * |r|`` element-wise (numpy's allclose rule);
* a float32 output of a model that computes in float16 -- most of its float weights' elements
  are float16 -- and gives float32 results (what onnxruntime's
  ``convert_float_to_float16(keep_io_types=True)`` saves) also gets :data:`HALF_ULPS` float16
  ulps at the output's largest magnitude: a hidden state one ulp off
  (two float32 computations of one float16 kernel rounding apart) reaches the output through
  MatMuls and LayerNorms as an error of the output's scale (an optimizer-saved GPT-2 in float16,
  every contrib op rewritten within one ulp of its kernel: logits up to 10.3 off by 0.0066);
* a quantized output -- an integer tensor a QuantizeLinear / QLinear* node makes, or a float one
  a DequantizeLinear of scale ``s`` makes (through layout ops: Reshape, Flatten, ...) -- in
  steps of its scale: ``|f - r| <= atol + qtol * s`` (``s = 1`` for the integers). A faithful
  integer kernel rounds where the reference (dequantize, float op, quantize) rounds otherwise:
  one step, two when a step of an early activation crosses a float layer (measured on
  onnxruntime's ``quantize_static`` models), so ``qtol`` is 2 by default; a wrong scale, a
  wrong zero point or a wrong weight moves many steps.

Outputs downstream of run-time activation rounding (:class:`FloatTwin`). At ``accuracy_level``
4 onnxruntime's ``com.microsoft::MatMulNBits`` kernel rounds each block of its activation A to
int8 at run time (:func:`onnxmlu.rewrite.matmulnbits.kernel_int8` says which nodes; the rewrite
computes the same rounding). The fused model's float ops upstream round in another order than
onnxruntime's fused kernels (a norm's or attention's sums: ~5e-7), and where such a difference
crosses an int8 rounding boundary one value of A moves by a whole step, which later layers
grow -- an error the rule above has no room for, in a fused model as good as the original.
Such an output, when it fails the rule above, is judged again against the *float twin*: the
original with those nodes at ``accuracy_level`` 0 (float A; a copy, the input untouched), run
on the same inputs with the same reference options. With ``t`` the twin's output, over the
elements finite in all three, ``slack = max|r - t|`` (the original's own int8 rounding), the
output passes when both hold::

    |f - r| <= atol + rtol * |r| + slack   element-wise   (quantized: atol + qtol * s + slack)
    mean|f - t| <= 1.25 * mean|r - t| + atol               (TWIN_MEAN_FACTOR)

The first: the fused model moves no further from the original than the original's int8
rounding moves it from float arithmetic (so ``max|f - t| <= 2 slack + atol + rtol|r|``, by the
triangle inequality). The second: on average the fused model is as close to float arithmetic as
the original is. A flip is one rounding error among the many the original makes, and leaves
the mean where it was; a wrong weight or scale adds its error to every element it reaches. The
max rule alone is loose where the int8 rounding is large: on the 8-bit decoder of
tests/test_check_int8_rounding.py (``slack`` 17 on its check's inputs) a 5 % error in the LM
head's scales stays within it and only the mean rule fails it (a wrong scale in a level-4 block
of the 4-bit decoder fails both). Measured with ``scripts/heldout_sweep.py`` (commit 9b97ee2;
2 cores, AMD EPYC with AVX-512 VNNI, other jobs running) on the five held-out level-4
decoders the rule above misses, at 8 shapes in all: the miss is 1.7-78x smaller than ``slack``
and ``mean|f - t|`` equals ``mean|r - t|`` to two digits, while the 5 % scale error above
puts it beyond 1.25x (the test asserts it). What the rule cannot see is a defect smaller than
the original's own rounding noise (a wrong weight in an early layer can move the logits less
than the int8 rounding does); every model without such kernels keeps the rule above alone.
The report names the rule and gives the figures (``float_twin_orig`` = ``slack``,
``float_twin_fused`` = ``max|f - t|``, and the two means).

Cost: a model without a MatMulNBits at accuracy_level 4 pays one scan of its node
attributes. Otherwise the nodes whose kernel rounds A are found (the rewrite's predicate reads
the graph imported by graphsurgeon) and the twin's session made only when an output fails the
rule above, and the twin runs only on those runs. It runs on the same inputs, inside the same
memory bound as the original's run (:func:`_run_within`: the same tensors, one run after the
other); the copy holds the original's weights once more while the check lasts.

NaN and Inf: a NaN or Inf in the fused output where the reference has a finite value (or the
other way round, or an Inf of the other sign) fails whatever the rule; NaN/Inf in both at the
same places is reported (``nonfinite``) and fails unless ``allow_nan``: random inputs that
make the original itself produce NaN prove nothing about the fused model.

Integer inputs are drawn within the vocabulary the model states (:func:`onnxmlu.frontend.feeds.integer_bounds`);
where it states none the report says the draws may be out of range for the model.

Memory (``max_memory``, ``--max-memory``; default: the budget of :mod:`onnxmlu.frontend.memory`):
before the models run at a shape, the bound of a run of the original there (``probe_need``:
every tensor of the unoptimized reference, as for a shape probe) is compared with the budget.
The fused model computes the same tensors (its blocks in optimized inner sessions, which only
reuse buffers), and the two run one after the other, so the bound stands for either run. Over
the budget at the first shape (the one the plan was priced at, or the first sample) the check
stops with one line naming the inputs to pin; at a later shape, that shape is skipped and says
why. A run whose bound is unknown (a size read from data) runs under the budget as a cap
(:func:`~onnxmlu.frontend.memory.capped`).

The report also gives the accuracy metrics of :mod:`onnxmlu.precision.accuracy` over all seeds
(worst cosine, top-1 agreement). With a ``budget`` (``cosine>=X`` or ``top1>=X``: the check of
a model fused at FP16/INT8, where 1e-4 cannot hold) the budget decides, not the tolerances.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import numpy_helper

from onnxmlu.errors import OnnxMluError, runtime_message
from onnxmlu.ir import attribute_value, copy_model, iter_graphs
from onnxmlu.ir.graphsurgeon import gs_graphs
from onnxmlu.rewrite import matmulnbits
from onnxmlu.frontend.feeds import random_inputs, unbounded_integer_inputs
from onnxmlu.frontend.memory import capped, default_budget, size_text
from onnxmlu.frontend.pins import (DimRange, Pins, concrete_shapes, dim_label, has_ranges, shapes_text, symbolic_axes,
                                  symbolic_dims)
from onnxmlu.frontend.shapes import probe_need
from onnxmlu.precision.accuracy import Accuracy, Budget, measure
from onnxmlu.optional import optional_import
from onnxmlu.progress import as_display
from onnxmlu.wording import noun, plural


#: Steps of the output scale a quantized output may move by (module docstring).
DEFAULT_QTOL = 2.0
#: The rule of a float output, as the table prints it beside the columns.
FLOAT_RULE = "|a-b| <= atol + rtol*|ref|"
#: A float16-valued output's extra room, in float16 ulps at its largest magnitude (module docstring).
HALF_ULPS = 2
#: How much further from float arithmetic, on average, a fused output may be than the original's
#: own int8 rounding puts the original (module docstring: 1.0 to two digits when fused right;
#: a 5 % scale error the max rule lets through goes beyond it).
TWIN_MEAN_FACTOR = 1.25
#: The op whose kernel may round its activations to int8 at run time (module docstring).
_NBITS = ("com.microsoft", "MatMulNBits")
#: Ops that move a quantized tensor's values without changing them: the output they make is
#: judged in the steps of the tensor they move.
_LAYOUT_OPS = frozenset({"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity", "MaxPool",
                         "Slice", "Gather", "Split", "Concat", "DepthToSpace", "SpaceToDepth", "Expand", "Tile"})
#: Ops whose output is an integer in steps of its scale.
_QUANTIZING_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear"})


def nan_fails(nonfinite: str, allow_nan: bool) -> bool:
    """Whether an output whose NaN/Inf reads ``nonfinite`` (``OutputDiff.nonfinite``, or the
    JSON's ``outputs[].nonfinite``) fails the check: any, unless ``allow_nan`` and the reference
    has the same at the same places. The one rule every verdict reads (table, JSON, HTML)."""
    return bool(nonfinite) and not (allow_nan and nonfinite == NAN_IN_BOTH)


@dataclass(frozen=True)
class OutputDiff:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    ok: bool
    step: float | None = None  # the output's quantization step (None: a float output)
    max_steps: float | None = None  # max_abs in steps
    nonfinite: str = ""  # what NaN/Inf the two sides hold ("" when none)
    # Judged against the float twin (module docstring): max |orig - twin| (the slack),
    # max |fused - twin| and the means of both; None when the rule above judged the output.
    float_twin_orig: float | None = None
    float_twin_fused: float | None = None
    float_twin_orig_mean: float | None = None
    float_twin_fused_mean: float | None = None
    half_slack: float | None = None  # a float16-valued output's extra room (module docstring)

    def rule(self, report: "CheckReport") -> str:
        """The rule this output is judged by, as printed beside the columns."""
        if self.float_twin_orig is not None:
            return f"within int8 rounding (max |orig-float| {self.float_twin_orig:.2g})"
        if self.half_slack is not None:
            return f"{FLOAT_RULE} + {HALF_ULPS} float16 ulps of max|ref| ({self.half_slack:.3g})"
        if self.step is None:
            return FLOAT_RULE
        return f"|a-b| <= atol + {plural(report.qtol, 'step', spec='g')} of {self.step:.3g}"

    def twin_lines(self) -> list[str]:
        """The float twin's figures, where it judged this output (:func:`twin_lines`)."""
        return twin_lines(self.to_dict())

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "max_abs": self.max_abs, "max_rel": self.max_rel,
                "ok": self.ok, "step": self.step, "max_steps": self.max_steps, "nonfinite": self.nonfinite,
                "float_twin_orig": self.float_twin_orig, "float_twin_fused": self.float_twin_fused,
                "float_twin_orig_mean": self.float_twin_orig_mean, "float_twin_fused_mean": self.float_twin_fused_mean}


@dataclass(frozen=True)
class ShapeRun:
    """One input shape the check ran at (``label`` says why) and what it found there."""

    label: str
    shapes: dict[str, list[int]]
    status: str  # "ok" | "failed" | "skipped" (the original refuses this shape)
    note: str = ""
    detail: str = ""  # onnxruntime's whole message, when the note cuts it (--debug shows it)

    def to_dict(self) -> dict:
        return {"label": self.label, "inputs": {k: list(v) for k, v in self.shapes.items()},
                "status": self.status, "note": self.note}


@dataclass
class CheckReport:
    atol: float
    rtol: float
    seeds: tuple[int, ...]
    qtol: float = DEFAULT_QTOL  # steps of the output scale a quantized output may move by
    allow_nan: bool = False  # NaN/Inf in both at the same places does not fail
    diffs: list[OutputDiff] = field(default_factory=list)
    shapes: list[ShapeRun] = field(default_factory=list)
    accuracy: Accuracy | None = None  # worst cosine and top-1 agreement over the seeds
    budget: Budget | None = None  # when given, it decides ``ok`` instead of the tolerances
    data: str = ""  # what the models ran on
    notes: list[str] = field(default_factory=list)  # what the reader must know about the data

    @property
    def ok(self) -> bool:
        if any(run.status == "failed" for run in self.shapes):
            return False
        if any(self.fails_on_nan(d) for d in self.diffs):
            return False  # NaN decides before a budget: a cosine of NaN outputs means nothing
        if self.budget is not None:
            return self.accuracy is not None and self.budget.met(self.accuracy)
        return bool(self.diffs) and all(d.ok for d in self.diffs)

    def fails_on_nan(self, diff: OutputDiff) -> bool:
        """Whether ``diff``'s NaN/Inf fails the check (:func:`nan_fails`)."""
        return nan_fails(diff.nonfinite, self.allow_nan)

    def to_dict(self) -> dict:
        return {
            "ok": self.ok, "atol": self.atol, "rtol": self.rtol, "qtol": self.qtol, "allow_nan": self.allow_nan,
            "seeds": list(self.seeds), "outputs": [d.to_dict() | {"rule": d.rule(self)} for d in self.diffs],
            "accuracy": None if self.accuracy is None else self.accuracy.to_dict(),
            "budget": None if self.budget is None else str(self.budget), "data": self.data,
            "shapes": [run.to_dict() for run in self.shapes], "notes": list(self.notes),
        }


#: The run with every symbolic dim but the batch doubled (module docstring).
TOGETHER = "other sizes together"


def check_shapes(model: onnx.ModelProto, pins: Pins | None) -> list[tuple[str, dict[str, list[int]]]]:
    """(label, input shapes) the check runs at, in order, without repeats (module docstring)."""
    runs = [("pinned" if pins else "default", concrete_shapes(model, pins))]
    if has_ranges(pins):
        runs += [(point, concrete_shapes(model, pins, point)) for point in ("min", "max")]
    free = _free_dims(model, pins)
    base = runs[0][1]
    if any(axis == 0 for _, axis in free.values()):
        runs.append(("other batch", _varied(base, free, lambda key, size, axis: size + 1 if axis == 0 else size)))
    first_of = {}
    for (name, axis), (key, _) in free.items():
        first_of.setdefault(key, (name, axis))
    for key, (name, axis) in first_of.items():
        if axis != 0:
            runs.append((f"other {_dim_named(key, name, axis)}", _varied(base, free, _doubling(key))))
    batch = {key for key, axis in free.values() if axis == 0}
    if len(set(first_of) - batch) > 1:  # run only where a one-dim change was refused (_run_all)
        runs.append((TOGETHER, _varied(base, free, lambda key, size, axis: size if key in batch else 2 * size)))
    unique: list[tuple[str, dict[str, list[int]]]] = []
    for label, shapes in runs:
        if all(shapes != seen for _, seen in unique):
            unique.append((label, shapes))
    return unique


def _doubling(key: str):
    """A ``_varied`` change: the dims of ``key`` twice their size, the others as they are."""
    return lambda k, size, axis: size * 2 if k == key else size


def _dim_named(key: str, name: str, axis: int) -> str:
    """A varied dim as the pricing line names it (:func:`~onnxmlu.frontend.pins.dim_label`:
    ``height``), with where it sits when it has a name (``height (x[2])``); ``x[3]`` unnamed."""
    where = f"{name}[{axis}]"
    return where if dim_label(key) == where else f"{dim_label(key)} ({where})"


def _free_dims(model: onnx.ModelProto, pins: Pins | None) -> dict[tuple[str, int], tuple[str, int]]:
    """(input, axis) of each symbolic dim without a range -> (its variation key, axis):
    dims sharing a name share a key, so they vary together."""
    return {(name, axis): (key, axis) for name, axis, key in symbolic_dims(model)
            if not isinstance(_pin_at((pins or {}).get(name), axis), DimRange)}  # a range: checked at its ends


def _pin_at(pinned: list | None, axis: int):
    return pinned[axis] if pinned is not None and axis < len(pinned) else None


def _varied(base: dict[str, list[int]], free: dict, change) -> dict[str, list[int]]:
    """``base`` with each free dim resized by ``change(key, size, axis)``, once per key (the
    first dim of a key sets its size for all)."""
    sizes: dict[str, int] = {}
    shapes = {name: list(dims) for name, dims in base.items()}
    for (name, axis), (key, first_axis) in free.items():
        if name in shapes and axis < len(shapes[name]):
            sizes.setdefault(key, change(key, shapes[name][axis], first_axis))
            shapes[name][axis] = sizes[key]
    return shapes


NAN_IN_BOTH = "NaN/Inf in both, at the same places"
_NAN_ONLY_FUSED = "NaN/Inf in the fused output where the reference is finite"
_NAN_ONLY_REFERENCE = "NaN/Inf in the reference where the fused output is finite"
_NAN_DIFFERS = "NaN/Inf in both, at different places or of other signs"


def compare_outputs(names: Sequence[str], fused: Sequence[np.ndarray], reference: Sequence[np.ndarray],
                    atol: float, rtol: float, steps: Mapping[str, float] | None = None,
                    qtol: float = DEFAULT_QTOL, half: bool = False) -> list[OutputDiff]:
    """One :class:`OutputDiff` per output; ``steps``: the quantization step of the quantized
    outputs by name (:func:`output_steps`), judged in ``qtol`` of them; ``half``: the model
    computes in float16 (:func:`computes_in_half`; module docstring)."""
    diffs = []
    for name, f, r in zip(names, fused, reference):
        f, r = np.asarray(f), np.asarray(r)
        if f.shape != r.shape:
            diffs.append(OutputDiff(name, tuple(f.shape), float("inf"), float("inf"), False))
            continue
        step = (steps or {}).get(name)
        diffs.append(_diff(name, f, r, (atol, rtol, qtol), step, half=half))
    return diffs


def _diff(name: str, f: np.ndarray, r: np.ndarray, tolerances: tuple[float, float, float],
          step: float | None, slack: float = 0.0, half: bool = False) -> OutputDiff:
    """The errors over the elements finite in both, judged by the output's rule (``slack``
    added to its bound: the float twin's, module docstring); NaN/Inf anywhere named by
    ``nonfinite`` (the report's ``ok`` decides what it means)."""
    atol, rtol, qtol = tolerances
    atol += slack
    if (f.dtype.kind in "bO" or r.dtype.kind in "bO") or (f.dtype.kind in "iu" and step is None):
        equal = bool(np.array_equal(f, r))
        return OutputDiff(name, tuple(f.shape), 0.0 if equal else float("inf"), 0.0 if equal else float("inf"), equal)
    f64, r64 = f.astype(np.float64), r.astype(np.float64)
    finite = np.isfinite(f64) & np.isfinite(r64)
    err = np.abs(f64 - r64)[finite]
    max_abs = float(err.max()) if err.size else 0.0
    max_rel = float((err / (np.abs(r64[finite]) + 1e-12)).max()) if err.size else 0.0
    if step is None:
        half = half_slack(r) if half else None
        ok = bool(np.all(err <= atol + (half or 0.0) + rtol * np.abs(r64[finite])))
        return OutputDiff(name, tuple(f.shape), max_abs, max_rel, ok, nonfinite=_nonfinite(f64, r64), half_slack=half)
    ok = bool(np.all(err <= atol + qtol * step))
    return OutputDiff(name, tuple(f.shape), max_abs, max_rel, ok, step, max_abs / step, _nonfinite(f64, r64))


def twin_lines(output: Mapping) -> list[str]:
    """The float twin's figures of one output of the JSON report (``outputs[]``), in two lines
    of under 80 columns for the text and HTML reports; none when the twin did not judge it."""
    if output.get("float_twin_orig") is None:
        return []
    return [f"{output['name']}: judged against the original with float activations (accuracy_level 0):",
            f"  |orig-float| max {output['float_twin_orig']:.3g} mean {output['float_twin_orig_mean']:.3g}"
            f" · |fused-float| max {output['float_twin_fused']:.3g} mean {output['float_twin_fused_mean']:.3g}"]


def judge_by_twin(diff: OutputDiff, fused: np.ndarray, reference: np.ndarray, twin: np.ndarray,
                  tolerances: tuple[float, float, float]) -> OutputDiff:
    """``diff`` (an output off its rule) judged again against the float twin's output ``twin``
    (module docstring): within ``atol + rtol|r|`` (or ``qtol`` steps) plus ``max|r - t|``; with
    both figures. An output off by its shape, NaN/Inf or an exact (integer) one keeps its verdict."""
    f, r, t = (np.asarray(x) for x in (fused, reference, twin))
    if diff.nonfinite or f.shape != r.shape or r.shape != t.shape or r.dtype.kind != "f":
        return diff
    f64, r64, t64 = f.astype(np.float64), r.astype(np.float64), t.astype(np.float64)
    finite = np.isfinite(f64) & np.isfinite(r64) & np.isfinite(t64)
    orig_off, fused_off = np.abs(r64 - t64)[finite], np.abs(f64 - t64)[finite]
    judged = _diff(diff.name, f, r, tolerances, diff.step, float(orig_off.max(initial=0.0)))
    orig_mean, fused_mean = (float(x.mean()) if x.size else 0.0 for x in (orig_off, fused_off))
    ok = judged.ok and fused_mean <= TWIN_MEAN_FACTOR * orig_mean + tolerances[0]
    return replace(judged, ok=ok, float_twin_orig=float(orig_off.max(initial=0.0)),
                   float_twin_fused=float(fused_off.max(initial=0.0)), float_twin_orig_mean=orig_mean,
                   float_twin_fused_mean=fused_mean)


@dataclass
class FloatTwin:
    """The original with float activations where its kernels round them to int8 at run time
    (module docstring): the ``com.microsoft::MatMulNBits`` nodes whose kernel quantizes A
    (:func:`~onnxmlu.rewrite.matmulnbits.kernel_int8`), in every graph, set to
    ``accuracy_level`` 0 in a copy. Nothing is computed until it is needed: which nodes at
    the first use of :attr:`where`, the session at the first run."""

    original: onnx.ModelProto
    session: object = None
    _where: list[tuple[int, int]] | None = None

    @classmethod
    def of(cls, original: onnx.ModelProto) -> "FloatTwin | None":
        """The twin of ``original``; None when no MatMulNBits of it is at accuracy_level 4 (a
        scan of the node attributes: a model without one pays nothing more)."""
        return cls(original) if _level4_nbits(original) else None

    @property
    def where(self) -> list[tuple[int, int]]:
        """(graph in iter_graphs order, node index) of each node set to float activations."""
        if self._where is None:
            self._where = int8_activation_nodes(self.original)
        return self._where

    def model(self) -> onnx.ModelProto:
        """The twin model: a copy of the original, those nodes at accuracy_level 0."""
        twin = copy_model(self.original)
        graphs = list(iter_graphs(twin.graph))
        for g, k in self.where:
            level = next(a for a in graphs[g].node[k].attribute if a.name == "accuracy_level")
            level.i = 0
        return twin

    def run(self, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray] | None:
        """The twin's outputs ``names`` on ``feeds`` (reference options); None when no kernel
        of the original rounds A after all (float zero points, 2-bit weights)."""
        if not self.where:
            return None
        if self.session is None:
            self.session = optional_import("onnxmlu.runtime").reference_session(self.model())
        return self.session.run(list(names), dict(feeds))


def int8_activation_nodes(model: onnx.ModelProto) -> list[tuple[int, int]]:
    """(graph in :func:`~onnxmlu.ir.iter_graphs` order, node index) of every MatMulNBits whose
    kernel rounds A to int8 at run time. Nodes at another accuracy_level are passed over
    without importing the model: only a model holding a candidate pays for the import the
    rewrite's predicate reads (attributes, the zero points' type)."""
    graphs = list(iter_graphs(model.graph))
    if not _level4_nbits(model):
        return []
    imported = list(gs_graphs(gs.import_onnx(model)))  # the same graphs and nodes, in the same order
    return [(g, k) for g, (graph, twin) in enumerate(zip(graphs, imported))
            for k, (node, seen) in enumerate(zip(graph.node, twin.nodes))
            if _is_nbits(node) and seen.op == node.op_type and matmulnbits.kernel_int8(seen)]


def _is_nbits(node: onnx.NodeProto) -> bool:
    return (node.domain, node.op_type) == _NBITS


def _level4_nbits(model: onnx.ModelProto) -> bool:
    """Whether a MatMulNBits of any graph is at the accuracy_level whose kernel may round A."""
    level = matmulnbits.INT8_LEVEL
    return any(_is_nbits(n) and attribute_value(n, "accuracy_level", 0) == level
               for g in iter_graphs(model.graph) for n in g.node)


def _nonfinite(f: np.ndarray, r: np.ndarray) -> str:
    """Which NaN/Inf the two sides hold: "" (none), or one of the ``_NAN_*`` sentences."""
    bad_f, bad_r = ~np.isfinite(f), ~np.isfinite(r)
    if not bad_f.any() and not bad_r.any():
        return ""
    if (bad_f & ~bad_r).any():
        return _NAN_ONLY_FUSED
    if (bad_r & ~bad_f).any():
        return _NAN_ONLY_REFERENCE
    same = np.array_equal(f[bad_f], r[bad_r], equal_nan=True)  # same places: NaN with NaN, +Inf with +Inf
    return NAN_IN_BOTH if same else _NAN_DIFFERS


def half_slack(r: np.ndarray) -> float | None:
    """:data:`HALF_ULPS` float16 ulps at ``r``'s largest magnitude, for a float32/64 reference
    (module docstring); None for another type or no finite element."""
    finite = r[np.isfinite(r)] if r.dtype in (np.float32, np.float64) else r[:0]
    if not finite.size:
        return None
    return HALF_ULPS * float(np.spacing(np.float16(min(np.abs(finite).max(), np.finfo(np.float16).max))))


def computes_in_half(model: onnx.ModelProto) -> bool:
    """Most of the elements of ``model``'s float weights (main graph) are float16."""
    counts = {onnx.TensorProto.FLOAT16: 0, onnx.TensorProto.FLOAT: 0}
    for tensor in model.graph.initializer:
        if tensor.data_type in counts:
            counts[tensor.data_type] += int(np.prod(tensor.dims))
    return counts[onnx.TensorProto.FLOAT16] > counts[onnx.TensorProto.FLOAT]


def output_steps(model: onnx.ModelProto) -> dict[str, float]:
    """The quantization step of each graph output that is quantized (module docstring): the
    scale of the DequantizeLinear that makes it (its largest, per channel), 1 for an integer
    a quantizing op makes; outputs found through layout ops. A float output is absent."""
    producer = {o: n for n in model.graph.node for o in n.output}
    scalars = _constants(model)
    steps = {}
    for value in model.graph.output:
        step = _step_of(value.name, producer, scalars)
        if step is not None:
            steps[value.name] = step
    return steps


def _step_of(name: str, producer: dict, constants: dict) -> float | None:
    node, seen = producer.get(name), 0
    while node is not None and node.op_type in _LAYOUT_OPS and node.input and seen < 64:
        node, seen = producer.get(node.input[0]), seen + 1
    if node is None:
        return None
    if node.op_type == "DequantizeLinear":
        scale = constants.get(node.input[1]) if len(node.input) > 1 else None
        return None if scale is None or not scale.size else float(np.max(np.abs(scale)))
    if node.op_type in _QUANTIZING_OPS or node.op_type.startswith("QLinear"):
        return 1.0
    return None


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Small initializers and Constant values by name (scales are scalars or one per channel)."""
    found = {t.name: t for t in model.graph.initializer if np.prod(t.dims) <= 1 << 16 and not t.external_data}
    found.update({n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant"
                  for a in n.attribute if a.name == "value"})
    arrays = {}
    for name, tensor in found.items():
        try:
            arrays[name] = numpy_helper.to_array(tensor)
        except (ValueError, TypeError):  # a type numpy cannot hold: not a scale
            continue
    return arrays


def seeded_inputs(seeds: Sequence[int]) -> str:
    """What a check on random inputs ran on, its seeds named: ``seeded random inputs (seed 0)``."""
    return f"seeded random inputs ({noun(len(seeds), 'seed')} {', '.join(map(str, seeds))})"


def check_models(original: onnx.ModelProto, fused: onnx.ModelProto, *, seeds: Sequence[int] = (0,),
                 atol: float = 1e-4, rtol: float = 1e-4,
                 input_shapes: Pins | None = None,
                 inputs: Mapping[str, np.ndarray] | None = None, budget: Budget | None = None,
                 progress=None,
                 samples: Sequence[Mapping[str, np.ndarray]] | None = None, data: str = "",
                 qtol: float = DEFAULT_QTOL, allow_nan: bool = False, max_memory: int | None = None) -> CheckReport:
    """Run both models on each seed at each shape of :func:`check_shapes` (or on each of
    ``samples``); the report keeps the worst error per output over all of them and says what
    ran at each shape.

    ``input_shapes`` are the pins ``fuse`` was given (``--input-shape``, ranges included).
    ``inputs`` are fixed arrays for some inputs (a sample rate, token ids, real data) used for
    every run; the others are random, and only the shape those arrays have is checked.
    ``budget`` decides the verdict instead of the tolerances (module docstring). ``samples``
    (real data: validation samples, ``--inputs DIR``) are run instead of the seeds, at their own
    shapes; ``data`` says what they are, for the report. ``qtol``: steps a quantized output may
    move by; ``allow_nan``: NaN/Inf in both at the same places passes; ``max_memory``: the
    memory budget in bytes (None: the default budget; module docstring).

    ``progress`` (a display, :mod:`onnxmlu.progress`, or a plain ``callable(stage)``) is told
    each stage as it starts and counts the model runs, reference and fused, of all the shapes
    (large models spend seconds in each)."""
    shown = as_display(progress)
    check = _Checker.of(original, fused, inputs, (atol, rtol, qtol), budget is None, shown)
    seeds = () if samples is not None else tuple(seeds)
    data = data or seeded_inputs(seeds)
    report = CheckReport(atol, rtol, seeds, qtol, allow_nan, budget=budget, data=data)
    planned = _feeds_by_shape(original, seeds, input_shapes, inputs, samples)
    runs = _run_all(check, original, planned, default_budget() if max_memory is None else max_memory)
    report.shapes = [_judged_nan(run, report) for run in runs]
    references = [r for run in runs for r in run.references]
    if not references:
        raise _refused_everywhere(report.shapes)
    report.diffs = _worst_per_output(check.names, [d for run in runs for d in run.diffs])
    report.accuracy = measure(references, [o for run in runs for o in run.outputs])
    report.notes = _data_notes(original, samples, inputs)
    return report


def _runs_text(planned: Sequence[tuple[str, list]]) -> str:
    """``2 inputs at 3 shapes`` (what the count of model runs counts)."""
    feeds = sum(len(runs) for _, runs in planned)
    return (f"{plural(feeds, 'input')} at {plural(len(planned), 'shape')}"
            if planned and planned[0][0] != "samples" else plural(feeds, "sample"))


def _run_all(check: "_Checker", original: onnx.ModelProto, planned: Sequence[tuple[str, list]],
             memory: int) -> list["_AtShape"]:
    """Both models' runs at every planned shape, counted on ``check``'s display, each shape
    within the ``memory`` budget (:func:`_run_within`)."""
    check.shown.say(f"running the reference and the fused model on {_runs_text(planned)}")
    check.shown.total(2 * sum(len(feeds) for _, feeds in planned))
    runs: list[_AtShape] = []
    for label, feeds in planned:
        if label == TOGETHER and not any(_refused(r.shape) and r.shape.label.startswith("other ") for r in runs):
            check.shown.advance(2 * len(feeds))  # the original refused no one-dim change: nothing to learn
            continue
        runs.append(_run_within(check, original, memory, label, feeds, first=not runs))
    return runs


#: The note of a shape the original refuses (a shape over the memory budget is skipped too,
#: with its own note: the original was never asked).
_REFUSES = "the original refuses it: "


def _refused(shape: ShapeRun) -> bool:
    return shape.status == "skipped" and shape.note.startswith(_REFUSES)


def _run_within(check: "_Checker", original: onnx.ModelProto, budget: int, label: str,
                runs: list[tuple[str, dict]], first: bool) -> "_AtShape":
    """``check.run(label, runs)`` within the memory budget (module docstring): refused with one
    line at the ``first`` shape, skipped at another, capped where a run has no bound."""
    needs: dict[str, int | None] = {}
    for _, feeds in runs:
        shapes = {name: list(np.shape(v)) for name, v in (feeds | dict(check.inputs or {})).items()}
        key = shapes_text(shapes)
        if key not in needs:
            needs[key] = probe_need(original, shapes, None)
        need = needs[key]
        if need is not None and need > budget:
            if first:
                raise _over_budget(original, label, shapes, need, budget)
            check.shown.advance(2 * len(runs))  # none of this shape's runs will run: count them done
            return _AtShape(ShapeRun(label, shapes, "skipped", f"running the models here needs up to "
                                     f"{size_text(need)}, more than the memory budget ({size_text(budget)}, "
                                     "--max-memory)"))
    with capped(budget) if None in needs.values() else contextlib.nullcontext():
        return check.run(label, runs)


def _over_budget(original: onnx.ModelProto, label: str, shapes: dict[str, list[int]], need: int,
                 budget: int) -> OnnxMluError:
    """The one line that stops a check whose first shape does not fit the memory budget."""
    symbolic = list(symbolic_axes(original))
    hint = (f"pin {', '.join(symbolic)} smaller with --input-shape, or raise --max-memory" if symbolic
            else "its inputs have no symbolic dims to pin smaller: raise --max-memory")
    return OnnxMluError(f"running the models at the {label} shape ({shapes_text(shapes)}) needs up to "
                        f"{size_text(need)}, more than the memory budget ({size_text(budget)}): {hint}")


def _judged_nan(run: "_AtShape", report: CheckReport) -> ShapeRun:
    """The shape ``run`` ran at, failed where an output holds NaN/Inf the report does not let
    pass (so that the shape lines and the verdict tell one story)."""
    bad = next((d for d in run.diffs if report.fails_on_nan(d)), None)
    if bad is None or run.shape.status != "ok":
        return run.shape
    return replace(run.shape, status="failed", note=f"{bad.name}: {bad.nonfinite}")


def _refused_everywhere(shapes: Sequence[ShapeRun]) -> OnnxMluError:
    """The error for an original that runs at none of the shapes tried: the shapes, then
    onnxruntime's refusal once (the first; the others differ in the sizes they quote), cut by
    :func:`~onnxmlu.errors.runtime_message`; every full message rides on the error's cause
    (``--debug`` prints it)."""
    tried = ", ".join(f"{run.label} {run.shapes}" for run in shapes)
    error = OnnxMluError(f"the original model fails at every shape tried ({tried}): {shapes[0].note}; "
                         "give valid values with --inputs FILE.npz or sizes with --input-shape")
    error.__cause__ = RuntimeError("\n".join(run.detail or run.note for run in shapes))
    return error


def _data_notes(original: onnx.ModelProto, samples, inputs) -> list[str]:
    """What the reader must know about random data: integer inputs drawn without a bound the
    model states may hold values out of its range (an id past a vocabulary)."""
    if samples is not None:
        return []
    loose = [name for name in unbounded_integer_inputs(original) if name not in (inputs or {})]
    if not loose:
        return []
    return [f"integer input(s) {', '.join(loose)} drawn in [0, 10) without a range the model states: the values "
            "may be out of range for it; give real values with --inputs FILE.npz"]


def _feeds_by_shape(original: onnx.ModelProto, seeds: Sequence[int], pins: Pins | None, inputs,
                    samples) -> list[tuple[str, list[tuple[str, dict]]]]:
    """(shape label, [(run label, feeds)]) for what ``check`` runs: the ``samples`` at their own
    shapes, or each seed at each of :func:`check_shapes` (given arrays: only their shape)."""
    if samples is not None:
        return [("samples", [(f"sample {k}", dict(sample)) for k, sample in enumerate(samples)])]
    shapes = check_shapes(original, pins)
    return [(label, [(f"seed {seed}", random_inputs(original, seed, shapes=at, given=inputs)) for seed in seeds])
            for label, at in (shapes[:1] if inputs else shapes)]


def _worst_per_output(names: Sequence[str], diffs: Sequence[OutputDiff]) -> list[OutputDiff]:
    """Per output name, in ``names`` order, the worst of ``diffs``: a failure first, then the
    largest absolute error."""
    worst: dict[str, OutputDiff] = {}
    for d in diffs:
        prev = worst.get(d.name)
        if prev is None or (not d.ok, d.max_abs) > (not prev.ok, prev.max_abs):
            worst[d.name] = d
    return [worst[n] for n in names if n in worst]


@dataclass
class _AtShape:
    shape: ShapeRun
    references: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    diffs: list[OutputDiff] = field(default_factory=list)


@dataclass
class _Checker:
    """Runs the reference and the fused session on a list of feeds of one shape (``run``)."""

    ref: object
    sess: object
    names: list[str]
    inputs: Mapping[str, np.ndarray] | None
    tolerances: tuple[float, float, float]  # atol, rtol, qtol
    steps: dict[str, float]  # quantized outputs' steps (:func:`output_steps`)
    by_tolerance: bool  # no budget decides: an output off the tolerances fails the shape
    shown: object  # the display (:mod:`onnxmlu.progress`): one unit per model run
    twin: FloatTwin | None = None  # judges outputs off their rule where A is rounded to int8
    half: bool = False  # the original computes in float16 (:func:`computes_in_half`)

    @classmethod
    def of(cls, original: onnx.ModelProto, fused: onnx.ModelProto, inputs, tolerances: tuple[float, float, float],
           by_tolerance: bool, shown) -> "_Checker":
        """The reference session (the original, optimizations off) and the fused model's."""
        runtime = optional_import("onnxmlu.runtime")
        shown.say("reference session (original, optimizations off)")
        ref = runtime.reference_session(original)
        shown.say("fused session")
        sess = runtime.InferenceSession(fused)
        return cls(ref, sess, [o.name for o in sess.get_outputs()], inputs, tolerances, output_steps(original),
                   by_tolerance, shown, FloatTwin.of(original) if by_tolerance else None,
                   computes_in_half(original))

    def run(self, label: str, runs: list[tuple[str, dict]]) -> _AtShape:
        """Both models on every (run label, feeds); the shape is skipped where the original
        refuses it, and fails where the fused model cannot run or (``by_tolerance``) an output
        is off."""
        result = _AtShape(ShapeRun(label, {}, "ok"))
        for k, (_, feeds) in enumerate(runs):
            feeds = feeds | dict(self.inputs or {})
            shown = {name: list(np.shape(v)) for name, v in feeds.items()}
            left = 2 * (len(runs) - k)  # model runs of this shape not yet counted
            try:
                reference = self.ref.run(self.names, feeds)
            except Exception as exc:  # noqa: BLE001 - onnxruntime's errors: a shape the original does not take
                self.shown.advance(left)  # the runs of a skipped shape are done: none will run
                result.shape = ShapeRun(label, shown, "skipped", f"{_REFUSES}{runtime_message(exc)}",
                                        str(exc))
                return result
            self.shown.advance()
            try:
                got = self.sess.run(self.names, feeds)
            except Exception as exc:  # noqa: BLE001 - onnxruntime's errors: the fused model fails where the original runs
                self.shown.advance(left - 1)
                result.shape = ShapeRun(label, shown, "failed", f"the fused model fails: {runtime_message(exc)}",
                                        str(exc))
                return result
            self.shown.advance()
            result.references.append(reference)
            result.outputs.append(got)
            result.diffs += self.judged(feeds, got, reference)
            result.shape = ShapeRun(label, shown, "ok")
        if self.by_tolerance and any(not d.ok for d in result.diffs):
            result.shape = replace(result.shape, status="failed")
        return result

    def judged(self, feeds: dict, got: list, reference: list) -> list[OutputDiff]:
        """Each output judged by its rule; one off it, where the original rounds activations to
        int8 at run time, judged again against the float twin (module docstring), which runs
        only then."""
        atol, rtol, qtol = self.tolerances
        diffs = compare_outputs(self.names, got, reference, atol, rtol, self.steps, qtol, self.half)
        if self.twin is None or all(d.ok for d in diffs):
            return diffs
        if self.twin.session is None and self.twin.where:
            self.shown.say("float twin session (the original, MatMulNBits at accuracy_level 0)")
        twin = self.twin.run(self.names, feeds)
        if twin is None:
            return diffs
        return [d if d.ok else judge_by_twin(d, f, r, t, self.tolerances)
                for d, f, r, t in zip(diffs, got, reference, twin)]


#: Element types whose block boundaries onnxruntime may retype: its CPU provider runs a 16-bit
#: float node that has no 16-bit kernel in float between Casts, and drops a Cast next to a block
#: (a node of any type). The library converts; a fused model holding them is loaded to be sure.
_RETYPED = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})


def needs_load_check(fused: onnx.ModelProto) -> bool:
    """Whether a written fused model must be loaded before ``fuse`` trusts it: when a tensor of
    its main graph has a type whose boundaries onnxruntime may retype (:data:`_RETYPED`). Other
    models are sound by construction (collapse's invariants) and are not loaded, which would
    cost every fuse an inner session per block."""
    graph = fused.graph
    return any(vi.type.tensor_type.elem_type in _RETYPED for vi in (*graph.input, *graph.output, *graph.value_info))


def load_error(path) -> str | None:
    """onnxruntime's refusal to load the fused model at ``path`` with the library registered
    (:func:`~onnxmlu.errors.runtime_message`), or None when it loads."""
    try:
        optional_import("onnxmlu.runtime").InferenceSession(str(path), block_layouts=False)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors, as one line
        return runtime_message(exc)
    return None

