"""A type and a shape for every tensor the planner needs, from three sources in turn.

1. onnx's shape inference with data propagation (cheap, exact, but it stops at ops it has no
   schema for and at ``Reshape`` targets computed from ``Shape``/``Gather``/``Concat``);
2. onnxruntime's symbolic shape inference (``sympy``), run only when a tensor still lacks an
   element type, a rank or a dim; its partial result is kept when it cannot finish;
3. a probe: when every model input has a concrete shape (static, or pinned with
   ``--input-shape``) and a tensor of the main graph is still not fully known, the model runs
   once in onnxruntime on zeros (empty strings for a string input: a LabelEncoder's output has
   no type onnx can infer) with those tensors exposed as outputs, and their concrete
   types and shapes are read back (onnxsim does the same). Models over
   :data:`PROBE_MAX_BYTES` of weights are not probed (it would hold a second copy), nor is a
   run whose bound (:func:`~onnxmlu.frontend.memory.probe_bound`) exceeds the memory budget;
   a run that cannot be bounded runs under the budget as a cap (:mod:`onnxmlu.frontend.memory`).

1 and 2 run on the weight-free skeleton (:func:`onnxmlu.ir.weights.infer_on_skeleton`), so
no weight is serialized. Nothing is written to the working directory: onnxruntime's symbolic
inference saves a file there when it cannot finish, so its steps are driven here instead.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from typing import Callable

import numpy as np
import onnx

from onnxmlu.diagnostics import Diagnostic
from onnxmlu.sessions import new_options
from onnxmlu.errors import first_line
from onnxmlu.frontend.memory import capped, default_budget, probe_bound, size_text
from onnxmlu.frontend.pins import (Pins, concrete_shapes, declared_dims, defaulted_keys, dim_key, dim_label,
                                  shapes_text, symbolic_axes, with_defaults)
from onnxmlu.frontend.symbolic import symbolic_infer
from onnxmlu.ir import copy_model, fed_inputs, iter_graphs
from onnxmlu.ir.index import tensor_nbytes
from onnxmlu.ir.graphs import merge_value_infos
from onnxmlu.ir.weights import WeightStore, infer_on_skeleton, is_marker, skeleton, tensor_payload_bytes
from onnxmlu.errors import OnnxMluError
from onnxmlu.optional import optional_import
from onnxmlu.wording import plural

PROBE_MAX_BYTES = 1 << 29
Note = Callable[[Diagnostic], None]


def infer_shapes(model: onnx.ModelProto, note: Note) -> onnx.ModelProto:
    """Sources 1 and 2 on ``model``, in place; returns ``model``."""
    return infer_on_skeleton(model, lambda skel: _infer(skel, note))


def _infer(model: onnx.ModelProto, note: Note) -> onnx.ModelProto:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - reported as the model's fault below
        raise OnnxMluError(f"shape inference failed: {first_line(exc)}") from None
    if not incomplete_tensors(inferred):
        return inferred
    symbolic = _symbolic(inferred, note)
    if symbolic is not None:
        merge_value_infos(iter_graphs(inferred.graph), iter_graphs(symbolic.graph))
    return inferred


def incomplete_tensors(model: onnx.ModelProto) -> list[str]:
    """Node outputs (every graph) without an element type, a rank, or a value or name per dim."""
    missing = []
    for graph in iter_graphs(model.graph):
        known = _value_infos(graph)
        for node in graph.node:
            missing.extend(o for o in node.output if o and not _complete(known.get(o), symbolic_ok=True))
    return missing


def _value_infos(graph: onnx.GraphProto) -> dict[str, onnx.ValueInfoProto]:
    found = {v.name: v for v in (*graph.input, *graph.value_info, *graph.output)}
    return found


def _complete(vi: onnx.ValueInfoProto | None, symbolic_ok: bool) -> bool:
    if vi is None or not vi.type.HasField("tensor_type"):
        return vi is not None and vi.type.WhichOneof("value") is not None  # a sequence, an optional
    tt = vi.type.tensor_type
    if not tt.elem_type or not tt.HasField("shape"):
        return False
    return all(d.HasField("dim_value") or (symbolic_ok and d.dim_param) for d in tt.shape.dim)


def _symbolic(model: onnx.ModelProto, note: Note) -> onnx.ModelProto | None:
    """onnxruntime's symbolic inference (:func:`~onnxmlu.frontend.symbolic.symbolic_infer`:
    an unfinished run keeps what it found and writes no file; merged dims are named by a fixed
    rule, so the result does not follow the process's string hashes)."""
    try:
        return symbolic_infer(model)
    except Exception as exc:  # noqa: BLE001 - an aid: onnx's result stands
        note(Diagnostic("normalize", "symbolic-inference", "",
                        f"onnxruntime's symbolic shape inference stopped: {first_line(exc)}"))
        return None


# ----------------------------------------------------------------------------------- probe
def probe_shapes(model: onnx.ModelProto, note: Note, values: dict[str, np.ndarray] | None = None,
                 weights: WeightStore | None = None, budget: int | None = None) -> int:
    """Source 3 on the main graph of ``model``, in place: the number of tensors it completed.
    ``values``: the user's arrays (``--inputs``), run instead of zeros where an input's shape
    allows them (a length read from an input must be the user's, not 0). ``weights``: the
    store whose markers ``model`` holds (filled into the probe's copy). ``budget``: the memory
    budget in bytes (None: :func:`~onnxmlu.frontend.memory.default_budget`)."""
    known = _value_infos(model.graph)
    # a dim inference named (NonZero, TopK by a computed k) depends on data: it must stay
    # symbolic, never become a probed number, so only what lacks a type, a rank or a dim's
    # value and name is probed -- unless the user gave values: the plan is then for those
    wanted = [o for node in model.graph.node for o in node.output
              if o and not _complete(known.get(o), symbolic_ok=not values)]
    if not wanted:
        return 0
    feeds = _zero_feeds(model, values or {})
    if feeds is None:
        return 0
    if tensor_payload_bytes(model) > PROBE_MAX_BYTES:
        note(Diagnostic("normalize", "probe-skipped", "", f"the shapes of {plural(len(wanted), 'tensor')} are unknown; "
                        "the model is too large to probe them"))
        return 0
    shapes = {n: list(v.shape) for n, v in feeds.items()}
    results = _run_probe(model, wanted, feeds, note, weights, budget, probe_need(model, shapes, weights))
    for name, value in results.items():
        _set_value_info(model.graph, name, value)
    return len(results)


def _zero_feeds(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """Zeros (or the value given, when its shape is the input's) for every graph input, or None
    when one has no concrete shape."""
    feeds = {}
    for vi in fed_inputs(model.graph):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape") or not tt.elem_type:
            return None
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        if any(d < 0 for d in dims):
            return None
        feeds[vi.name] = _value_or_zeros(values.get(vi.name), dims, tt.elem_type)
    return feeds


def _run_probe(model: onnx.ModelProto, names: list[str], feeds: dict, note: Note,
               weights: WeightStore | None, budget: int | None, need: int | None) -> dict[str, np.ndarray]:
    """``names``' values in a run of a copy of ``model`` (the markers of ``weights`` filled in
    that one copy) on ``feeds``; {} when the run fails or ``need`` (its bound,
    :func:`probe_need`) exceeds ``budget`` (``note`` is told why). An unbounded run is capped."""
    budget = default_budget() if budget is None else budget
    if need is not None and need > budget:
        note(Diagnostic("normalize", "probe-skipped", "", f"learning {plural(len(names), 'shape')} would run the "
                        f"model at {shapes_text({n: list(v.shape) for n, v in feeds.items()})}, which needs up to "
                        f"{size_text(need)}: more than the memory budget ({size_text(budget)}, --max-memory)"))
        return {}
    try:
        with contextlib.nullcontext() if need is not None else capped(budget):
            values = _probe_session(model, names, weights).run(names, feeds, _quiet_run())
    except Exception as exc:  # noqa: BLE001 - the probe is an aid; analysis reports what stays unknown
        at = shapes_text({n: list(np.shape(v)) for n, v in feeds.items()})
        note(Diagnostic("normalize", "probe-failed", "", f"running the model on zeros at {at} to learn "
                        f"{plural(len(names), 'shape')} failed: {first_line(exc)}"))
        return {}
    return {n: v for n, v in zip(names, values) if isinstance(v, np.ndarray)}


def _probe_session(model: onnx.ModelProto, names: list[str], weights: WeightStore | None):
    """An unoptimized session of a copy of ``model`` with ``names`` among its outputs."""
    ort = optional_import("onnxruntime")
    probe = copy_model(model)
    if weights is not None:
        weights.fill_markers(probe.graph)
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names
                              if n not in {o.name for o in probe.graph.output})
    options = new_options("disable", log_severity=3)
    return ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _quiet_run():
    quiet = optional_import("onnxruntime").RunOptions()
    quiet.log_severity_level = 4  # a failed or refused probe is a diagnostic, not a log line
    return quiet


def probe_need(model: onnx.ModelProto, shapes: dict[str, list[int]], weights: WeightStore | None,
               cache: "InferenceCache | None" = None) -> int | None:
    """The bound (:func:`~onnxmlu.frontend.memory.probe_bound`) of a run of ``model`` on inputs of
    ``shapes``, from its skeleton inferred at those shapes (:func:`inferred_at`; what that
    inference could not do is said where the sizes are used, not here)."""
    inferred = inferred_at(model, shapes, _silent, cache)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in fed_inputs(model.graph)}
    feed_bytes = sum(tensor_nbytes(types.get(n, 0), dims) for n, dims in shapes.items())
    weight_bytes = tensor_payload_bytes(model) + (weights.nbytes if weights is not None else 0)
    return probe_bound(inferred, weight_bytes, feed_bytes)


#: Skeletons inferred at input shapes, by shapes, for one model that does not change meanwhile
#: (one analysis: its pricing shapes, their bounds and their sizes), each with the diagnostics
#: its inference made.
InferenceCache = dict


def inferred_at(model: onnx.ModelProto, shapes: dict[str, list[int]], note: Note,
                cache: InferenceCache | None = None) -> onnx.ModelProto:
    """Sources 1 and 2 on a copy of ``model``'s skeleton whose fed inputs have ``shapes``; from
    ``cache`` where it holds them (its diagnostics told to ``note`` again)."""
    key = tuple(sorted((name, tuple(dims)) for name, dims in shapes.items()))
    if cache is None or key not in cache:
        said: list[Diagnostic] = []
        inferred = _infer(_shaped_skeleton(model, shapes), said.append)
        if cache is None:
            return _told(inferred, said, note)
        cache[key] = (inferred, said)
    return _told(*cache[key], note)


def _told(inferred: onnx.ModelProto, said: list[Diagnostic], note: Note) -> onnx.ModelProto:
    for diagnostic in said:
        note(diagnostic)
    return inferred


def _silent(diagnostic: Diagnostic) -> None:
    """A ``note`` that keeps nothing: an inference made only to bound a run."""


def _shaped_skeleton(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    skel = skeleton(model)
    _give_shapes(skel.graph, shapes)
    return skel


def _set_value_info(graph: onnx.GraphProto, name: str, value: np.ndarray) -> None:
    elem = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
    vi = onnx.helper.make_tensor_value_info(name, elem, list(value.shape))
    for existing in (*graph.value_info, *graph.output):
        if existing.name == name:
            existing.type.CopyFrom(vi.type)
            return
    graph.value_info.append(vi)



# ----------------------------------------------------------------------------------- pricing
#: A tensor's element type and concrete dims at the pricing shape.
Sized = tuple[int, list[int]]


def sizes_at(model: onnx.ModelProto, shapes: dict[str, list[int]], note: Note,
             weights: WeightStore | None = None, values: dict[str, np.ndarray] | None = None,
             budget: int | None = None, cache: InferenceCache | None = None) -> dict[str, Sized]:
    """:func:`priced_shapes` at the fed inputs' ``shapes``; empty for a model whose inputs
    are all fixed and whose value infos say every size. Fixed inputs do not size a dim that
    comes from a tensor's value (a KV cache's length ``Max(P, total_sequence_length)`` in the
    GroupQueryAttention rewrite, read from an input's value): such a model is priced at the
    probe's sizes too, its graph keeping the dim symbolic."""
    if not symbolic_axes(model) and not _value_dependent_dims(model.graph):
        return {}
    return priced_shapes(model, shapes, note, weights, values, budget, cache)


def _value_dependent_dims(graph: onnx.GraphProto) -> bool:
    """Whether a node output of ``graph`` has a dim with no value (inference named it, or
    left it unknown): with every input fixed, only a tensor's value can set it."""
    known = _value_infos(graph)
    return any(o and not _complete(known.get(o), symbolic_ok=False) for node in graph.node for o in node.output)


#: Sizes tried, in order, for the symbolic dims no pin sizes when the model does not run at
#: their defaults (a text recognizer's height, an audio model's window): common image sides,
#: then common lengths.
FALLBACK_SIZES = (32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512, 640, 1024, 2048, 4096, 16000)
#: A fallback whose inputs would hold more elements than this is not tried (a run on zeros of
#: 16000 x 16000 images costs more than the whole fuse).
FALLBACK_MAX_ELEMENTS = 1 << 22


def pricing_shapes(model: onnx.ModelProto, pins: Pins | None, note: Note, weights: WeightStore | None = None,
                   point: str = "opt", values: dict[str, np.ndarray] | None = None,
                   budget: int | None = None, cache: InferenceCache | None = None) -> dict[str, list[int]]:
    """The fed inputs' shapes the planner prices at ``point`` of the pins' profile
    (:func:`~onnxmlu.frontend.pins.concrete_shapes`). When dims no pin sizes took their
    defaults and the model does not run on zeros at those shapes, each of
    :data:`FALLBACK_SIZES` is tried for all of them (the batch stays 1) and the first the
    model runs at is taken; a diagnostic says which (or that none ran: pass --input-shape).
    Where a run at the defaults would need more than ``budget`` bytes (its bound, never run),
    the largest smaller size that fits and runs is taken instead, with a diagnostic; with none,
    one line names the inputs to pin (:func:`_over_budget`).
    An unpinned input the user gave ``values`` for (``--inputs``) is priced at their shape, and
    the runs use them. ``cache``: inferences at shapes, kept for :func:`sizes_at` (:func:`inferred_at`)."""
    values = values or {}
    budget = default_budget() if budget is None else budget
    pins = {**{n: list(np.shape(v)) for n, v in values.items()}, **(pins or {})}
    shapes = concrete_shapes(model, pins, point)
    keys = defaulted_keys(model, pins)
    if not [k for k in keys if not k.endswith(":0")] or tensor_payload_bytes(model) > PROBE_MAX_BYTES:
        return shapes
    session = _zeros_runner(model, weights, values, note, budget, {} if cache is None else cache)
    if session is None:
        return shapes
    need = session.need(shapes)
    if need is not None and need > budget:
        return _within_budget(model, pins, point, session, keys, shapes, need, note)
    if session(shapes) is None:
        return shapes
    return _first_fallback_that_runs(model, pins, point, session, keys, shapes, note)


def _first_fallback_that_runs(model, pins: Pins, point: str, session, keys, shapes: dict[str, list[int]],
                              note: Note) -> dict[str, list[int]]:
    """The first of :data:`FALLBACK_SIZES` the model runs at, for every dim no pin sizes (the
    defaults did not run), with a diagnostic; ``shapes`` when none runs."""
    unpinned = ", ".join(map(dim_label, keys))
    for size in FALLBACK_SIZES:
        candidate = concrete_shapes(model, with_defaults(model, pins, size), point)
        if sum(math.prod(dims) for dims in candidate.values()) > FALLBACK_MAX_ELEMENTS:
            break  # the sizes only grow from here
        if session(candidate) is None:
            note(Diagnostic("normalize", "default-shape", "", f"the model does not run at the default sizes of its "
                            f"symbolic dims ({unpinned}); it is planned at {shapes_text(candidate)}: pass "
                            "--input-shape to plan at the sizes you run"))
            return candidate
    candidate = _summed_sizes_that_run(model, pins, point, session, keys)
    if candidate is not None:
        note(Diagnostic("normalize", "default-shape", "", f"the model runs at no common size of its symbolic dims "
                        f"({unpinned}), some being sums of others; it is planned at {shapes_text(candidate)}: pass "
                        "--input-shape to plan at the sizes you run"))
        return candidate
    note(Diagnostic("normalize", "default-shape", "", f"the model runs at none of the sizes tried for its symbolic "
                    f"dims ({unpinned}); it is planned at {shapes_text(shapes)}: pass --input-shape"))
    return shapes


#: At most this many unpinned dims are tried in :func:`_summed_sizes_that_run` (2^n - 1 runs).
SUMMED_MAX_DIMS = 4


def _summed_sizes_that_run(model, pins: Pins, point: str, session, keys: list[str]) -> dict[str, list[int]] | None:
    """Where dims are sums of others -- an attention mask over ``total = past + sequence`` beside
    a KV cache of ``past`` and ids of ``sequence``, each named on its own as exporters write them --
    no common size runs. Tried: the first fallback size for every unpinned dim but the batch, the
    dims of each subset doubled (fewest first); the first the model runs at, or None."""
    batch = {dim_key(vi.name, declared, 0) for vi in fed_inputs(model.graph) if (declared := declared_dims(vi))}
    free = [k for k in keys if k not in batch]
    if not free or len(free) > SUMMED_MAX_DIMS:
        return None
    size = FALLBACK_SIZES[0]
    for doubled in (c for r in range(1, len(free)) for c in itertools.combinations(free, r)):
        candidate = concrete_shapes(model, with_defaults(model, pins, size, {k: 2 * size for k in doubled}), point)
        if session(candidate) is None:
            return candidate
    return None


def _within_budget(model: onnx.ModelProto, pins: Pins, point: str, session, keys: list[str],
                   shapes: dict[str, list[int]], need: int, note: Note) -> dict[str, list[int]]:
    """The largest of :data:`FALLBACK_SIZES`, for every defaulted dim but the batch, whose inputs
    are smaller than at the defaults and whose run fits the budget and succeeds, with a
    diagnostic; one line naming the inputs to pin when none does (:func:`_over_budget`)."""
    elements = sum(math.prod(dims) for dims in shapes.values())
    fitting = None
    for size in sorted(FALLBACK_SIZES, reverse=True):
        candidate = concrete_shapes(model, with_defaults(model, pins, size), point)
        if sum(math.prod(dims) for dims in candidate.values()) >= elements:
            continue  # not smaller than the defaults
        candidate_need = session.need(candidate)
        if candidate_need is not None and candidate_need > session.budget:
            continue
        fitting = fitting or candidate
        if session(candidate) is None:
            note(Diagnostic("normalize", "default-shape", "", f"at the default sizes of its symbolic dims "
                            f"({', '.join(keys)}: {shapes_text(shapes)}) probing the model needs up to "
                            f"{size_text(need)}, more than the memory budget ({size_text(session.budget)}, "
                            f"--max-memory); it is planned at {shapes_text(candidate)}: pass --input-shape "
                            "to plan at the sizes you run"))
            return candidate
    raise _over_budget(keys, shapes, need, session.budget, fitting, list(symbolic_axes(model)))


def _over_budget(keys: list[str], shapes: dict[str, list[int]], need: int, budget: int,
                 fitting: dict[str, list[int]] | None, symbolic: list[str]) -> OnnxMluError:
    """The one line that stops a fuse whose symbolic dims fit the budget at no size it runs at:
    it names the inputs to pin (``symbolic``) and, where one fits, a shape that fits."""
    pin = " ".join(f"--input-shape {name}:{','.join(map(str, dims))}" for name, dims in (fitting or {}).items()
                   if name in symbolic)
    hint = f"pin them, e.g. {pin} (fits)" if fitting else f"pin {', '.join(symbolic)} smaller with --input-shape"
    return OnnxMluError(f"probing the model at the default sizes of its symbolic dims ({', '.join(keys)}: "
                        f"{shapes_text(shapes)}) needs up to {size_text(need)}, more than the memory budget "
                        f"({size_text(budget)}), and no smaller size both fits and runs: {hint}, "
                        "or raise --max-memory")


def sizing_hint(model: onnx.ModelProto, pins: Pins | None) -> str:
    """What a host reason for a tensor no source could size advises: ``--input-shape`` for
    the symbolic dims that took a default size and the inputs of unknown rank no pin gives
    (the probe ran, or failed, at sizes the user did not choose), or, when the pins leave
    nothing to choose, the probe's own diagnostic (a pin cannot help there)."""
    unpinned = defaulted_keys(model, pins) + [vi.name for vi in fed_inputs(model.graph)
                                              if declared_dims(vi) is None and vi.name not in (pins or {})]
    if unpinned:
        return f"try --input-shape for {', '.join(unpinned)}"
    return "every input size is known, so --input-shape cannot help: see the normalize diagnostics"


def _value_or_zeros(value: np.ndarray | None, shape: list[int], elem: int) -> np.ndarray:
    """The user's ``value`` when it has ``shape``, else zeros of ``shape`` and type ``elem``
    (a string input's zero is the empty string: what its ops, a LabelEncoder or a tokenizer,
    take, as a number's zero is)."""
    if value is not None and list(np.shape(value)) == list(shape):
        return value
    if elem == onnx.TensorProto.STRING:
        return np.full(shape, "", dtype=object)
    return np.zeros(shape, dtype=onnx.helper.tensor_dtype_to_np_dtype(elem))


def _zeros_runner(model: onnx.ModelProto, weights: WeightStore | None, values: dict[str, np.ndarray], note: Note,
                  budget: int, cache: InferenceCache) -> "_ZerosRunner | None":
    """A :class:`_ZerosRunner` of ``model``; None when no session can be made (a diagnostic says why)."""
    ort = optional_import("onnxruntime")

    types = _feed_types(model)
    if types is None:
        return None
    options = new_options("disable", log_severity=4)
    try:
        session = ort.InferenceSession(_with_weights(model, weights).SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors, recorded: the defaults stand untried
        note(Diagnostic("normalize", "default-shape", "", "the default sizes of the symbolic dims could not be "
                        f"tried (no onnxruntime session: {first_line(exc)}); pass --input-shape"))
        return None
    return _ZerosRunner(model, session, types, values, weights, note, budget, cache)


class _ZerosRunner:
    """Runs ``model`` on zeros of the given input shapes (the user's ``values`` where their shape
    is the one asked): a call answers None when it runs, else a one-line reason: onnxruntime's
    refusal, or that the run's bound (:meth:`need`) exceeds ``budget`` (then it is not run).
    A run that cannot be bounded runs capped at ``budget``."""

    def __init__(self, model, session, types: dict[str, int], values, weights, note: Note, budget: int,
                 cache: InferenceCache) -> None:
        self.model, self.session, self.types, self.values = model, session, types, values
        self.weights, self.note, self.budget, self.cache = weights, note, budget, cache

    def need(self, shapes: dict[str, list[int]]) -> int | None:
        """The run's bound at ``shapes`` (:func:`probe_need`); None where it cannot be bounded."""
        return probe_need(self.model, shapes, self.weights, self.cache)

    def __call__(self, shapes: dict[str, list[int]]) -> str | None:
        if set(shapes) != set(self.types):
            return "an input has no shape"
        need = self.need(shapes)
        if need is not None and need > self.budget:
            return f"needs up to {size_text(need)}, more than the memory budget ({size_text(self.budget)})"
        try:
            with contextlib.nullcontext() if need is not None else capped(self.budget):
                self.session.run(None, _feeds(self.types, shapes, self.values), _quiet_run())
        except Exception as exc:  # noqa: BLE001 - onnxruntime's refusal of this shape
            return first_line(exc)
        return None


def priced_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]], note: Note,
                  weights: WeightStore | None = None, values: dict[str, np.ndarray] | None = None,
                  budget: int | None = None, cache: InferenceCache | None = None) -> dict[str, Sized]:
    """Every main-graph tensor's type and concrete dims when the fed inputs have ``shapes``
    (docs/architecture.md, "Dynamic shapes"): the graph itself keeps its symbolic dims.

    Sources 1 and 2 run on a copy of the skeleton whose inputs are given ``shapes``; what they
    leave unknown is probed at those shapes (on zeros), the weights read from ``weights`` for
    a model whose large tensors are markers, within the memory ``budget`` (bytes)."""
    cache = {} if cache is None else cache  # the probe's bound reads the same inference
    inferred = inferred_at(model, shapes, note, cache)
    sized = _sized(inferred.graph)
    wanted = [o for node in model.graph.node for o in node.output if o and o not in sized]
    if wanted and set(shapes) >= {vi.name for vi in fed_inputs(model.graph)}:
        need = probe_need(model, shapes, weights, cache)
        sized.update(_probe_sizes(model, wanted, shapes, note, weights, values or {}, budget, need))
    return sized


def _give_shapes(graph: onnx.GraphProto, shapes: dict[str, list[int]]) -> None:
    for vi in graph.input:
        if vi.name in shapes and vi.type.HasField("tensor_type"):
            dims = vi.type.tensor_type.shape
            dims.Clear()
            for d in shapes[vi.name]:
                dims.dim.add().dim_value = int(d)
    del graph.value_info[:]  # inferred again at these shapes
    for vi in graph.output:
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")


def _sized(graph: onnx.GraphProto) -> dict[str, Sized]:
    found = {}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.elem_type and tt.HasField("shape") and all(
                d.HasField("dim_value") for d in tt.shape.dim):
            found[vi.name] = (tt.elem_type, [d.dim_value for d in tt.shape.dim])
    return found


def _probe_sizes(model: onnx.ModelProto, names: list[str], shapes: dict[str, list[int]], note: Note,
                 weights: WeightStore | None, values: dict[str, np.ndarray], budget: int | None,
                 need: int | None) -> dict[str, Sized]:
    if tensor_payload_bytes(model) + (weights.nbytes if weights is not None else 0) > PROBE_MAX_BYTES:
        note(Diagnostic("normalize", "probe-skipped", "", f"the shapes of {plural(len(names), 'tensor')} are "
                        "unknown at the pricing shape; the model is too large to probe them"))
        return {}
    types = _feed_types(model)
    if types is None:
        note(Diagnostic("normalize", "probe-failed", "", f"the shapes of {plural(len(names), 'tensor')} are "
                        f"unknown and the model cannot be run to learn them at {shapes_text(shapes)}: an input has "
                        "no tensor type, so no --input-shape can size them"))
        return {}
    probed = _run_probe(model, names, _feeds(types, shapes, values), note, weights, budget, need)
    return {n: (onnx.helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)) for n, v in probed.items()}


def _feed_types(model: onnx.ModelProto) -> dict[str, int] | None:
    """Each fed input's element type (strings included: :func:`_value_or_zeros`); None when
    one is not a tensor of a known type (nothing can be fed to it)."""
    types = {}
    for vi in fed_inputs(model.graph):
        elem = vi.type.tensor_type.elem_type
        if not vi.type.HasField("tensor_type") or not elem:
            return None
        types[vi.name] = elem
    return types


def _feeds(types: dict[str, int], shapes: dict[str, list[int]], values: dict[str, np.ndarray]) -> dict:
    """Zeros of ``shapes`` for every input of ``types``, the user's ``values`` where they fit."""
    return {n: _value_or_zeros(values.get(n), shapes[n], elem) for n, elem in types.items()}


def _with_weights(model: onnx.ModelProto, weights: WeightStore | None) -> onnx.ModelProto:
    """``model`` itself, or a copy with the data of its weight-store markers filled in."""
    if weights is None or not any(is_marker(t) for t in model.graph.initializer):
        return model
    full = copy_model(model)
    weights.fill_markers(full.graph)
    return full
