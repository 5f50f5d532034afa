"""Running a plan's precisions on held-out samples: the measurements of ``--precision auto``.

:class:`PlanEvaluator` measures the accuracy (:mod:`onnxmlu.precision.accuracy`) of any plan of
an analysed model against the model itself in FP32. Two sample sets: the *calibration* samples
set the INT8 scales, the *validation* samples judge (:meth:`PlanEvaluator.accuracy`); a budget
met on the samples that calibrated is met by construction, not shown.
:meth:`PlanEvaluator.in_sample` gives the figure on the calibration samples, for the report.

* **Reference**: the analysed FP32 model in onnxruntime with graph optimizations off (the
  fused FP32 model computes the same within FP32 rounding).
* **Bodies**: each FP16/INT8 block's body is made exactly as collapse makes it
  (:class:`~onnxmlu.precision.bodies.BlockBodies`: :func:`to_fp16`, or ``quantize_static``
  calibrated on the block's own inputs over *all* calibration samples) and kept per layer range
  and precision, so a range measured once is never transformed again, and the fused model
  written at the end holds the very bodies that were measured (:meth:`PlanEvaluator.bodies_for`).
  Sensitivity trials may calibrate on their own few samples instead (``calibrated_on``): a
  cheaper estimate; such bodies never reach a fused model.
* **Running a plan**: the analysed graph with each non-FP32 block's nodes replaced by its
  transformed body's nodes (internal names prefixed), in one onnxruntime session at its usual
  optimization level -- what the custom-op library runs, without building the fused model,
  its inner sessions and its layouts for every trial. Where a body cannot be spliced (its ONNX
  opset differs from the model's, e.g. an INT8 body converted to opset 13, or it holds
  functions or subgraphs) the plan is collapsed and run with the library instead.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.compose import add_prefix_graph

from onnxmlu.collapse.blocks import block_interface, block_owner, collapse, fp32_body
from onnxmlu.sessions import exact_loadable, new_options
from onnxmlu.errors import OnnxMluError, first_line
from onnxmlu.optional import optional_import
from onnxmlu.ir import copy_model_fields, fed_inputs, is_default_domain, nested_graphs, node_inputs, opset_version
from onnxmlu.plan.plan import Block, Plan
from onnxmlu.precision import DEFAULT_PRECISION
from onnxmlu.precision.accuracy import Accuracy, measure
from onnxmlu.precision.bodies import BlockBodies, float_op_diagnostics, quantizer_diagnostics, runnable_model
from onnxmlu.precision.calibration import CalibrationSet, Sample, capture_tensors
from onnxmlu.precision.int8 import Int8Options
from onnxmlu.plan.labels import holds_int8_arithmetic
from onnxmlu.collapse.own import mark_own_int8

Range = tuple[int, int]


class PlanEvaluator:
    """Accuracy of plans of one analysed model on one calibration set (module docstring)."""

    def __init__(self, analysis, calibration: CalibrationSet, int8: Int8Options | None = None,
                 validation: CalibrationSet | None = None, metric=None) -> None:
        self.analysis = analysis
        self.metric = metric  # the user metric (accuracy.load_metric), or None
        self.calibration = calibration
        self.validation = validation if validation is not None else calibration
        self.model = runnable_model(analysis)
        self._bodies = BlockBodies(analysis, calibration, int8)
        self._transformed: dict[tuple[int, int, str, int], onnx.ModelProto] = {}  # range, precision, samples
        self._interfaces: dict[Range, object] = {}
        self._position = {node: k for k, node in enumerate(analysis.order)}
        self._fed = [i.name for i in fed_inputs(self.model.graph)]
        self._prefix_values: list[Sample] = []  # FP32 tensors crossing the cuts, per sample
        self._prefix_names: set[str] = set()
        self._suffixes: dict[int, list[str]] = {}
        self._reference_session = _reference_session(self.model)
        self.reference = self._run(self._reference_session, self._fed, self.validation.samples)
        self.runs = 0

    @property
    def held_out(self) -> bool:
        """Whether the judging samples are not the calibrating ones."""
        return self.validation is not self.calibration

    def accuracy(self, plan: Plan, samples: int | None = None, calibrated_on: int | None = None) -> Accuracy:
        """The accuracy of ``plan`` on the first ``samples`` validation samples (default all),
        its INT8 blocks calibrated on the first ``calibrated_on`` calibration samples (default
        all: as ``fuse``)."""
        count = samples or len(self.validation)
        self.prepare([plan], calibrated_on)
        start = self._cut(plan) if self._captured(plan, count) else 0
        outputs = self._outputs(plan, start, self.validation.samples[:count], self.reference, calibrated_on)
        self.runs += 1
        return measure(self.reference[:count], outputs, self.metric)

    def in_sample(self, plan: Plan) -> Accuracy:
        """The accuracy of ``plan`` on the calibration samples (the figure a budget judged on its
        own calibration data would see; the report shows it beside the held-out one)."""
        if not self.held_out:
            return self.accuracy(plan)
        self.prepare([plan])
        reference = self._run(self._reference_session, self._fed, self.calibration.samples)
        self.runs += 1
        return measure(reference, self._outputs(plan, 0, self.calibration.samples, reference, None), self.metric)

    def prepare(self, plans: Sequence[Plan], calibrated_on: int | None = None, progress=None) -> None:
        """Capture, in one run over the first ``calibrated_on`` samples (default all), the inputs
        of every INT8 block of ``plans`` not seen yet (INT8 bodies are calibrated on them);
        ``progress`` (a display) counts the samples."""
        n = calibrated_on or len(self.calibration)
        wanted = {}
        for block in {b for plan in plans for b in plan.blocks if b.precision == "int8" and not self._own(b)}:
            key = (block.start, block.stop, n)
            if key not in self._bodies.block_samples:
                wanted[key] = self._interface((block.start, block.stop)).inputs
        if wanted:
            names = [name for inputs in wanted.values() for name in inputs]
            captured = capture_tensors(self.model, names, self.calibration.samples[:n], progress)
            for key, inputs in wanted.items():
                self._bodies.block_samples[key] = [{name: sample[name] for name in inputs} for sample in captured]

    def prepare_prefixes(self, plans: Sequence[Plan], samples: int, progress=None) -> None:
        """Let ``plans`` run on the first ``samples`` samples from their first non-FP32 block on:
        the FP32 tensors entering that point are captured here, in one run for all plans."""
        names = {n for plan in plans for n in self._suffix_inputs(self._cut(plan))}
        chosen = self.validation.samples[:samples]
        self._prefix_values = capture_tensors(self.model, sorted(names), chosen, progress)
        self._prefix_names = names

    def _captured(self, plan: Plan, count: int) -> bool:
        """Whether ``plan`` can run from its cut on ``count`` samples (its prefix was captured)."""
        if count > len(self._prefix_values):
            return False
        return set(self._suffix_inputs(self._cut(plan))) <= self._prefix_names

    def body(self, block: Block, calibrated_on: int | None = None) -> onnx.ModelProto:
        """Block ``block``'s body at its precision, INT8 calibrated on the first
        ``calibrated_on`` samples (default all); made once per range, precision and count."""
        n = calibrated_on or len(self.calibration)
        key = (block.start, block.stop, block.precision, n)
        if key not in self._transformed:
            body = fp32_body(self.analysis, 0, self._interface((block.start, block.stop)))
            if self._own(block):  # the model's own INT8, as collapse writes it
                mark_own_int8(body)
            else:
                body = self._bodies.transform((block.start, block.stop, n), block.precision, body)
            self._transformed[key] = body
        return self._transformed[key]

    def _own(self, block: Block) -> bool:
        """Whether ``block`` holds quantized arithmetic (its body keeps the model's own INT8)."""
        return holds_int8_arithmetic(block.layers(self.analysis.layers))

    def bodies_for(self, plan: Plan) -> BlockBodies:
        """What collapse needs to write ``plan`` with the bodies measured here."""
        return _MeasuredBodies(self, plan)

    def _interface(self, span: Range):
        if span not in self._interfaces:
            self._interfaces[span] = block_interface(self.analysis, self._owner([(0, Block(*span, 1))]), 0)
        return self._interfaces[span]

    def _owner(self, blocks: Sequence[tuple[int, Block]]) -> dict[int, int]:
        return block_owner(self.analysis, blocks)  # the rule collapse applies

    def _cut(self, plan: Plan) -> int:
        """Position (in the analysis order) of the first node of the plan's first low block,
        carried weight dequantizations included (0 for an FP32 plan: it runs whole)."""
        low = [b for b in plan.blocks if b.precision != DEFAULT_PRECISION]
        return min(self._position[node] for node in self._owner([(0, low[0])])) if low else 0

    def _suffix_inputs(self, start: int) -> list[str]:
        """Tensors the nodes from position ``start`` on read but do not make (constants aside);
        asked several times per trial, walked once per position."""
        if start not in self._suffixes:
            graph, produced, names = self.model.graph, set(), {}
            constants = {t.name for t in graph.initializer}
            for i in self.analysis.order[start:]:
                node = graph.node[i]
                names.update((n, None) for n in node_inputs(node) if n not in produced and n not in constants)
                produced.update(node.output)
            self._suffixes[start] = list(names)
        return self._suffixes[start]

    def _outputs(self, plan: Plan, start: int, samples: Sequence[Sample], reference: Sequence[list[np.ndarray]],
                 calibrated_on: int | None) -> list[list[np.ndarray]]:
        """The plan's outputs on ``samples`` (run from position ``start`` on, fed the captured
        prefix tensors, when ``start`` > 0; outputs made before the cut from ``reference``)."""
        spliced = self._spliced(plan, start, calibrated_on)
        if spliced is None:
            fused = self._fused_session(plan, calibrated_on)
            return self._run(fused, self._fed, samples)
        feeds = [i.name for i in spliced.graph.input]
        produced = [o.name for o in spliced.graph.output]
        fed = [dict(s, **(self._prefix_values[k] if start else {})) for k, s in enumerate(samples)]
        ran = self._run(_session(spliced), feeds, fed)
        names = [o.name for o in self.model.graph.output]
        return [[got[produced.index(n)] if n in produced else ref[names.index(n)] for n in names]
                for got, ref in zip(ran, reference)]

    def _fused_session(self, plan: Plan, calibrated_on: int | None):
        fused = collapse(self.analysis, plan, bodies=_MeasuredBodies(self, plan, calibrated_on))
        return optional_import("onnxmlu.runtime").InferenceSession(fused, block_layouts=False)

    def _spliced(self, plan: Plan, start: int, calibrated_on: int | None) -> onnx.ModelProto | None:
        """The analysed model from position ``start`` on, each non-FP32 block's nodes replaced
        by its body's nodes; None when a body cannot live in the model's graph."""
        low = [(k, b) for k, b in enumerate(plan.blocks) if b.precision != DEFAULT_PRECISION]
        bodies = {k: self.body(b, calibrated_on) for k, b in low}
        if not all(_spliceable(body, self.model) for body in bodies.values()):
            return None
        owner = self._owner(low)
        spliced = _splice(self.model, self.analysis.order[start:], owner, bodies)
        _declare_inputs(spliced, self._suffix_inputs(start), self.model, self._prefix_values)
        return spliced

    def _run(self, session, feeds: Sequence[str], samples: Sequence[Sample]) -> list[list[np.ndarray]]:
        try:
            return [session.run(None, {n: s[n] for n in feeds}) for s in samples]
        except Exception as exc:  # noqa: BLE001 - onnxruntime's errors, as one line
            hint = ("; the seeded random samples are not valid inputs of this model: give --calibration DIR"
                    if self.calibration.random or self.validation.random else "")
            raise OnnxMluError(f"running the model on calibration samples failed: {first_line(exc)}{hint}") from None


class _MeasuredBodies(BlockBodies):
    """The evaluator's bodies, handed to collapse for one plan (block ``b`` -> its range)."""

    def __init__(self, evaluator: PlanEvaluator, plan: Plan, calibrated_on: int | None = None) -> None:
        super().__init__(evaluator.analysis, evaluator.calibration, evaluator._bodies.int8)
        self.evaluator, self.plan, self.calibrated_on = evaluator, plan, calibrated_on
        self._count = calibrated_on or len(evaluator.calibration)

    def prepare(self, blocks) -> None:
        self.evaluator.prepare([self.plan], self.calibrated_on)

    def transform(self, b: int, precision: str, body: onnx.ModelProto) -> onnx.ModelProto:
        measured = onnx.ModelProto()
        measured.CopyFrom(self.evaluator.body(self.plan.blocks[b], self.calibrated_on))
        measured.graph.name, measured.doc_string = body.graph.name, body.doc_string
        if precision == "int8":
            block = self.plan.blocks[b]
            warned = self.evaluator._bodies.quantizer_warnings.get((block.start, block.stop, self._count), [])
            self.diagnostics.extend(float_op_diagnostics(b, measured) + quantizer_diagnostics(b, warned))
        return measured


def _spliceable(body: onnx.ModelProto, model: onnx.ModelProto) -> bool:
    same_opset = opset_version(body) == opset_version(model)
    return same_opset and not body.functions and len(list(nested_graphs(body.graph))) == 0


def _splice(model: onnx.ModelProto, order: Sequence[int], owner: dict[int, int],
            bodies: dict[int, onnx.ModelProto]) -> onnx.ModelProto:
    """The nodes at ``order`` (those of block ``owner[i]`` replaced by its body's nodes, internal
    names prefixed), the initializers they read, the graph outputs they produce."""
    spliced = onnx.ModelProto()
    copy_model_fields(spliced, model)
    graph = spliced.graph
    graph.name = model.graph.name
    done: set[int] = set()
    for i in order:
        k = owner.get(i)
        if k is None:
            graph.node.append(model.graph.node[i])
        elif k not in done:
            done.add(k)
            inner = add_prefix_graph(bodies[k].graph, f"p{k}/", rename_inputs=False, rename_outputs=False)
            graph.node.extend(inner.node)
            graph.initializer.extend(inner.initializer)
    used = {name for node in graph.node for name in node_inputs(node)}
    graph.initializer.extend(t for t in model.graph.initializer if t.name in used)
    produced = {name for node in graph.node for name in node.output}
    graph.output.extend(o for o in model.graph.output if o.name in produced)
    _merge_opsets(spliced, bodies.values())
    return spliced


def _declare_inputs(spliced: onnx.ModelProto, names: Sequence[str], model: onnx.ModelProto,
                    captured: Sequence[Sample]) -> None:
    """Graph inputs of the spliced model: the model's own, and tensors captured before the cut
    (typed from their captured values)."""
    own = {i.name: i for i in model.graph.input}
    for name in names:
        if name in own:
            spliced.graph.input.append(own[name])
        else:
            value = captured[0][name]
            spliced.graph.input.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape))


def _merge_opsets(model: onnx.ModelProto, bodies) -> None:
    have = {o.domain for o in model.opset_import}
    for body in bodies:
        for o in body.opset_import:
            if not is_default_domain(o.domain) and o.domain not in have:
                model.opset_import.append(o)
                have.add(o.domain)


def _reference_session(model: onnx.ModelProto):
    """The project's numerical reference (:func:`onnxmlu.runtime.reference_session`), one line on failure."""
    try:
        return optional_import("onnxmlu.runtime").reference_session(model)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors, as one line
        raise OnnxMluError(f"onnxruntime cannot load the model: {first_line(exc)}") from None


def _session(model: onnx.ModelProto):
    """A trial at onnxruntime's usual optimization level, as the library runs block bodies."""
    ort = optional_import("onnxruntime")
    options = new_options("all", log_severity=3, model=model)
    try:
        return ort.InferenceSession(exact_loadable(model), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors, as one line
        raise OnnxMluError(f"onnxruntime cannot load the model at its planned precisions: {first_line(exc)}") from None
