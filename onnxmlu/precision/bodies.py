"""The precision step of collapse: each FP16 or INT8 block's body becomes its emulation.

Collapse builds every block body in FP32, as before, and hands a non-FP32 one to
:meth:`BlockBodies.transform`. INT8 blocks need samples of *their own* inputs, so
:meth:`BlockBodies.prepare` first runs the normalized model on the calibration samples with
every INT8 block's input tensors exposed as outputs (one run per sample for all blocks),
before collapse releases any weight. Without calibration data the samples are seeded random
ones: :attr:`BlockBodies.diagnostics` then holds a ``random-calibration`` record, the bodies'
metadata and the fused nodes' descriptions say so.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import onnx

from onnxmlu import progress
from onnxmlu.diagnostics import Diagnostic
from onnxmlu.errors import OnnxMluError
from onnxmlu.ir.weights import fill_tensor, is_marker
from onnxmlu.precision import record
from onnxmlu.precision.calibration import (
    DEFAULT_RANDOM_SAMPLES,
    DEFAULT_SEED,
    CalibrationSet,
    Sample,
    capture_tensors,
    load_calibration,
    random_calibration,
)
from onnxmlu.precision.fp16 import to_fp16
from onnxmlu.precision.int8 import Int8Options, float_nodes, to_int8
from onnxmlu.wording import plural

CalibrationLike = CalibrationSet | str | os.PathLike | None


class BlockBodies:
    """Turns FP32 block bodies into FP16 or INT8 ones for one analysed model.

    ``calibration``: a :class:`CalibrationSet`, a folder of samples
    (:func:`~onnxmlu.precision.calibration.load_calibration`), or None for the seeded random
    fallback (``random_samples`` samples from ``seed``).
    """

    def __init__(self, analysis, calibration: CalibrationLike = None, int8: Int8Options | None = None, *,
                 random_samples: int = DEFAULT_RANDOM_SAMPLES, seed: int = DEFAULT_SEED) -> None:
        self.analysis = analysis
        self.int8 = int8 or Int8Options()
        self._given = calibration
        self._random = (random_samples, seed)
        self.calibration: CalibrationSet | None = calibration if isinstance(calibration, CalibrationSet) else None
        self.block_samples: dict[int, list[Sample]] = {}
        self.quantizer_warnings: dict[int, list[str]] = {}  # block -> what onnxruntime's quantizer warned
        self.diagnostics: list[Diagnostic] = []
        self._counted = progress.as_display(None)  # int8_body counts here once prepare() sets it
        self._to_quantize, self._quantized = 0, 0

    def prepare(self, blocks: Mapping[int, tuple[str, Sequence[str]]]) -> None:
        """Capture the inputs of the INT8 blocks among ``blocks`` (block -> (precision, input
        names)) on the calibration samples; blocks already captured are skipped."""
        wanted = {b: list(names) for b, (precision, names) in blocks.items()
                  if record(precision).calibrated and b not in self.block_samples}
        if not wanted:
            return
        model = runnable_model(self.analysis)
        calibration = self._calibration_for(model)
        shown = progress.current()
        shown.say(f"INT8 calibration: the model run on {plural(len(calibration), 'sample')} (block inputs captured)")
        captured = capture_tensors(model, [n for names in wanted.values() for n in names], calibration.samples,
                                   shown)
        for b, names in wanted.items():
            self.block_samples[b] = [{n: sample[n] for n in names} for sample in captured]
        self._counted, self._to_quantize = shown, len(wanted)

    def transform(self, b: int, precision: str, body: onnx.ModelProto) -> onnx.ModelProto:
        """Block ``b``'s FP32 ``body`` at ``precision`` (FP16 in place; INT8 a new model)."""
        how = record(precision).body
        return body if how is None else getattr(self, how)(b, body)

    def fp16_body(self, b: int, body: onnx.ModelProto) -> onnx.ModelProto:
        return to_fp16(body)

    def int8_body(self, b: int, body: onnx.ModelProto) -> onnx.ModelProto:
        if b not in self.block_samples:
            raise OnnxMluError(f"INT8 block {b} has no calibration samples: prepare() was not told of it")
        warnings: list[str] = []
        quantized = to_int8(body, self.block_samples[b], self.int8, self.calibration.describe(), warnings)
        self._count_quantized()
        self.quantizer_warnings[b] = list(dict.fromkeys(warnings))
        self.diagnostics.extend(float_op_diagnostics(b, quantized) + quantizer_diagnostics(b, warnings))
        return quantized

    def _count_quantized(self) -> None:
        """One more of the blocks :meth:`prepare` captured for is quantized: the count starts on
        the first (they are quantized as the fused model is written, under that pass's line)."""
        if self._quantized == 0 and self._to_quantize:
            self._counted.say(f"INT8 calibration: quantizing {plural(self._to_quantize, 'block')} "
                              "on their captured inputs")
            self._counted.total(self._to_quantize)
        self._quantized += 1
        self._counted.advance()

    def note(self, precision: str) -> str:
        """What a fused node's description adds for a block at ``precision``."""
        if not record(precision).calibrated or self.calibration is None:
            return ""
        return f"calibrated on {self.calibration.describe()}"

    def _calibration_for(self, model: onnx.ModelProto) -> CalibrationSet:
        if self.calibration is None:
            if self._given is not None:
                self.calibration = load_calibration(self._given, model)
            else:
                self.calibration = random_calibration(model, *self._random, shapes=self.analysis.input_shapes)
                self.diagnostics.append(Diagnostic(
                    "precision", "random-calibration", "",
                    f"INT8 blocks calibrated on {self.calibration.describe()}: their activation scales fit "
                    "noise, not the model's data; give a calibration folder"))
        return self.calibration


def float_op_diagnostics(b, quantized: onnx.ModelProto) -> list[Diagnostic]:
    """One ``int8-float-op`` record per operator of INT8 block ``b`` left computing in FP32."""
    return [Diagnostic("precision", "int8-float-op", node.name or node.op_type,
                       f"{node.op_type} computes in FP32 inside INT8 block {b}: onnxruntime's quantizer "
                       "has no QDQ form for it")
            for node in float_nodes(quantized)]


def quantizer_diagnostics(b, warnings: Sequence[str]) -> list[Diagnostic]:
    """One ``int8-quantizer`` record per distinct warning onnxruntime's quantizer gave on block ``b``."""
    return [Diagnostic("precision", "int8-quantizer", "", f"INT8 block {b}: onnxruntime's quantizer: {message}")
            for message in dict.fromkeys(warnings)]


def runnable_model(analysis) -> onnx.ModelProto:
    """The analysed model with every weight in it: itself, or -- when a weight store holds the
    large weights (``fuse_to_file``) -- a copy with their data filled in."""
    model = analysis.model
    if not any(is_marker(t) for t in model.graph.initializer):
        return model
    filled = onnx.ModelProto()
    filled.CopyFrom(model)  # markers are small: this copies the graph, not the stored weights
    for k, tensor in enumerate(model.graph.initializer):
        if is_marker(tensor):
            fill_tensor(filled.graph.initializer[k], tensor, analysis.index.weights)
    return filled
