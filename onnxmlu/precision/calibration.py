"""Calibration data for INT8 blocks: samples of the model's inputs, and of a block's inputs.

A *sample* is one feed of the model: input name -> array. Samples come from a folder
(:func:`load_calibration`) or, when there is none, from a seeded random generator
(:func:`random_calibration`) -- a fallback that :attr:`CalibrationSet.random` flags, because
scales fitted to noise are not scales fitted to the data the model will see.

Folder layout (one or both kinds, read in sorted name order):

* ``NAME.npz`` -- one sample per file, its arrays keyed by input name
  (``numpy.savez(path, input=x)``);
* ``NAME/`` -- one sample per sub-folder, holding one serialized ONNX ``TensorProto`` per input
  (``*.pb``), keyed by the tensor's ``name`` field, or by the file's stem when the field is
  empty. This is the layout of the ONNX model zoo's ``test_data_set_N/input_K.pb`` folders,
  so such a folder can be used as it is (its expected outputs, ``output_K.pb``, are skipped).

A block's calibration inputs are not the model's: they are the tensors that enter the block.
:func:`capture_tensors` runs the (normalized) model once per sample with those tensors
exposed as outputs. :class:`SampleReader` hands samples to onnxruntime's calibrators.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx

from onnxmlu.sessions import exact_loadable, new_options
from onnxmlu.errors import OnnxMluError, first_line, runtime_message
from onnxmlu.frontend.feeds import random_inputs
from onnxmlu.ir import fed_inputs
from onnxmlu.optional import optional_import
from onnxmlu.progress import as_display
from onnxmlu.wording import noun, plural

Sample = dict[str, np.ndarray]

#: How many random samples the fallback draws, and from which seed, unless told otherwise.
DEFAULT_RANDOM_SAMPLES = 8
DEFAULT_SEED = 0


@dataclass(frozen=True)
class CalibrationSet:
    """Samples of the model's inputs and where they came from."""

    samples: tuple[Sample, ...]
    source: str                 # the folder, or "random"
    random: bool = False        # True: seeded random data, not real inputs (reports flag it)
    seed: int | None = None     # the random fallback's first seed

    def __len__(self) -> int:
        return len(self.samples)

    def describe(self) -> str:
        if self.random:
            return f"{plural(len(self), 'seeded random sample')} (seed {self.seed}; no calibration data given)"
        return f"{plural(len(self), 'sample')} from {self.source}"


def load_calibration(folder: str | os.PathLike, model: onnx.ModelProto | None = None,
                     what: str = "calibration") -> CalibrationSet:
    """The samples in ``folder`` (layout in the module docstring), checked against ``model``'s
    inputs when given: every input present, no unknown name, ranks and fixed dims equal,
    element types equal (a float64 array for a float32 input is narrowed, likewise integers).
    ``what`` names the folder in errors (``calibration``, ``validation``, ``inputs``)."""
    root = Path(folder)
    if not root.is_dir():
        raise OnnxMluError(f"{what} folder {root} does not exist or is not a folder")
    samples = []
    for entry in sorted(root.iterdir()):
        if entry.is_file() and entry.suffix == ".npz":
            samples.append(_npz_sample(entry))
        elif entry.is_dir() and _input_files(entry):
            samples.append(_pb_sample(entry))
    if not samples:
        raise OnnxMluError(f"{what} folder {root} holds no sample: expected NAME.npz files or "
                           "sub-folders of TensorProto *.pb files")
    if model is not None:
        samples = [conform_sample(s, model, f"{what} sample {k} of {root}") for k, s in enumerate(samples)]
    return CalibrationSet(tuple(samples), str(root))


def random_calibration(model: onnx.ModelProto, count: int = DEFAULT_RANDOM_SAMPLES, seed: int = DEFAULT_SEED,
                       dims: Mapping[str, int] | None = None,
                       shapes: Mapping[str, list[int]] | None = None) -> CalibrationSet:
    """``count`` seeded random samples of ``model``'s inputs, seeds ``seed, seed+1, ...``
    (floats ~ N(0, 1), integers in [0, 10), booleans fair coins; symbolic dims from ``dims``,
    ``shapes`` by input name (the pricing shape), else the pins' defaults -- the inputs
    ``onnxmlu check`` draws)."""
    if count < 1:
        raise OnnxMluError(f"random calibration needs at least one sample, not {count}")
    samples = tuple(random_inputs(model, seed + k, dims, shapes) for k in range(count))
    return CalibrationSet(samples, "random", random=True, seed=seed)


def calibration_set(model: onnx.ModelProto, folder: str | os.PathLike | None = None, *,
                    count: int = DEFAULT_RANDOM_SAMPLES, seed: int = DEFAULT_SEED) -> CalibrationSet:
    """The samples in ``folder`` when given, else the seeded random fallback."""
    if folder is not None:
        return load_calibration(folder, model)
    return random_calibration(model, count, seed)


#: Seed of the first held-out random sample: far from the calibration seeds 0, 1, ...
HELD_OUT_SEED = 1000


@dataclass(frozen=True)
class SampleSplit:
    """Samples that calibrate (set INT8 scales) and samples that judge (measure accuracy)."""

    calibration: CalibrationSet
    validation: CalibrationSet
    rule: str  # how the judging samples were chosen, for the report

    @property
    def held_out(self) -> bool:
        return self.validation is not self.calibration

    def to_dict(self) -> dict:
        v = self.validation
        return {"source": v.source, "samples": len(v), "random": v.random, "held_out": self.held_out,
                "rule": self.rule}


def split_samples(model: onnx.ModelProto, calibration: str | os.PathLike | None = None,
                  validation: str | os.PathLike | None = None, count: int = DEFAULT_RANDOM_SAMPLES,
                  shapes: Mapping[str, list[int]] | None = None) -> SampleSplit:
    """Calibration and validation samples for a run that judges accuracy (``--precision auto``,
    ``--check``). The rule, stated in the report:

    * ``validation`` given: its samples judge, the calibration folder's (else ``count`` seeded
      random ones) calibrate;
    * a calibration folder alone, of ``N >= 2`` samples: split by position in sorted name order,
      even positions (0, 2, ...) calibrate and odd ones judge -- interleaved rather than halves so
      that names sorted by class or by source land on both sides;
    * one sample: it does both, and the report says the figure is in-sample;
    * neither: ``count`` seeded random samples calibrate (seeds 0..) and ``count`` others judge
      (seeds :data:`HELD_OUT_SEED`..), all flagged as random.
    """
    if validation is not None:
        judge = load_calibration(validation, model, "validation")
        calib = calibration_set(model, calibration, count=count)
        same = calibration is not None and Path(calibration).resolve() == Path(validation).resolve()
        if same:
            return SampleSplit(calib, calib, "--validation is the calibration folder: judged in-sample")
        return SampleSplit(calib, judge, f"--validation {judge.source}")
    if calibration is None:
        calib = random_calibration(model, count, shapes=shapes)  # random samples at the pricing shape
        judge = random_calibration(model, count, seed=HELD_OUT_SEED, shapes=shapes)
        return SampleSplit(calib, judge, f"{plural(count, 'seeded random sample')} "
                                         f"{noun(count, 'calibrates', 'calibrate')} (seeds 0..), "
                                         f"{count} {noun(count, 'other judges', 'others judge')} "
                                         f"(seeds {HELD_OUT_SEED}..)")
    every = load_calibration(calibration, model)
    if len(every) < 2:
        return SampleSplit(every, every, "one calibration sample: judged in-sample (give --validation DIR)")
    calib = CalibrationSet(every.samples[0::2], f"{every.source} (even positions)")
    judge = CalibrationSet(every.samples[1::2], f"{every.source} (odd positions, held out)")
    return SampleSplit(calib, judge, f"{every.source} split in sorted name order: even positions calibrate, "
                                     "odd positions judge")


def _npz_sample(path: Path) -> Sample:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: np.asarray(data[name]) for name in data.files}
    except (OSError, ValueError) as exc:
        raise OnnxMluError(f"cannot read calibration sample {path}: {first_line(exc)}") from None


def _input_files(folder: Path) -> list[Path]:
    """The ``*.pb`` files of a sample folder, less the zoo layout's expected outputs."""
    return sorted(p for p in folder.glob("*.pb") if not p.name.startswith("output_"))


def _pb_sample(folder: Path) -> Sample:
    sample: Sample = {}
    for path in _input_files(folder):
        tensor = onnx.TensorProto()
        try:
            tensor.ParseFromString(path.read_bytes())
            array = onnx.numpy_helper.to_array(tensor)
        except Exception as exc:  # noqa: BLE001 - protobuf and onnx raise several kinds
            raise OnnxMluError(f"{path} is not a serialized ONNX TensorProto: {first_line(exc)}") from None
        name = tensor.name or path.stem
        if name in sample:
            raise OnnxMluError(f"calibration sample {folder} has two tensors named {name!r}")
        sample[name] = array
    return sample


def conform_sample(sample: Mapping[str, np.ndarray], model: onnx.ModelProto, what: str) -> Sample:
    """``sample`` checked against ``model``'s fed inputs (see :func:`load_calibration`)."""
    expected = {v.name: v for v in fed_inputs(model.graph)}
    missing = sorted(set(expected) - set(sample))
    unknown = sorted(set(sample) - set(expected))
    if missing or unknown:
        parts = ([f"missing input(s) {', '.join(missing)}"] if missing else []) + \
                ([f"unknown name(s) {', '.join(unknown)}"] if unknown else [])
        raise OnnxMluError(f"{what}: {'; '.join(parts)} (the model's inputs: {', '.join(expected)})")
    return {name: _conform_array(np.asarray(sample[name]), expected[name], f"{what}, input {name!r}")
            for name in expected}


def _conform_array(array: np.ndarray, value: onnx.ValueInfoProto, what: str) -> np.ndarray:
    tensor_type = value.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
    if array.dtype != dtype:
        same_kind = (array.dtype.kind == "f" and dtype.kind == "f") or (array.dtype.kind in "iu" and dtype.kind in "iu")
        if not same_kind:
            raise OnnxMluError(f"{what} is {array.dtype}, the model wants {dtype}")
        array = array.astype(dtype)
    if tensor_type.HasField("shape"):
        # a dim the model leaves free: a name, no value ('?'), or a value below 1 (-1 and 0 as exporters write them)
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor_type.shape.dim]
        if array.ndim != len(dims) or any(d is not None and d != n for d, n in zip(dims, array.shape)):
            shown = ["?" if d is None else d for d in dims]
            raise OnnxMluError(f"{what} has shape {list(array.shape)}, the model wants {shown}")
    return array


class SampleReader:
    """onnxruntime's calibration reader over a list of samples (``set_range`` and ``rewind``
    included, so strided calibration and a second pass both work). Its protocol, not its class:
    ``CalibrationDataReader`` accepts any class with ``get_next`` as a subclass, and importing it
    here would load the quantizer with every module that reads samples."""

    def __init__(self, samples: Iterable[Mapping[str, np.ndarray]]) -> None:
        self._samples = [dict(s) for s in samples]
        self._stop = len(self._samples)
        self._next = 0

    def get_next(self) -> dict | None:
        if self._next >= self._stop:
            return None
        self._next += 1
        return self._samples[self._next - 1]

    def __iter__(self) -> "SampleReader":
        return self

    def __next__(self) -> dict:
        sample = self.get_next()
        if sample is None:
            raise StopIteration
        return sample

    def rewind(self) -> None:
        self._next, self._stop = 0, len(self._samples)

    def __len__(self) -> int:
        return len(self._samples)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._next, self._stop = start_index, min(end_index, len(self._samples))


def capture_tensors(model: onnx.ModelProto, names: Sequence[str], samples: Sequence[Mapping[str, np.ndarray]],
                    progress=None) -> list[Sample]:
    """For each sample, the values of the tensors ``names`` of ``model`` (graph inputs come
    from the sample itself; anything else is exposed as an output for one run). ``model`` is
    left as it was. ``progress`` (a display, :mod:`onnxmlu.progress`) counts the samples run."""
    fed = {v.name for v in fed_inputs(model.graph)}
    wanted = [n for n in dict.fromkeys(names) if n not in fed]
    session = _session_exposing(model, wanted) if wanted else None
    shown = as_display(progress)
    shown.total(len(samples))
    captured = []
    for k, sample in enumerate(samples):
        values = dict(zip(wanted, _run(session, wanted, sample, k))) if session is not None else {}
        captured.append({n: np.asarray(sample[n]) if n in fed else values[n] for n in names})
        shown.advance()
    return captured


def _session_exposing(model: onnx.ModelProto, names: Sequence[str]):
    """An onnxruntime session of ``model`` whose outputs are ``names`` (appended to the graph's
    outputs only while it is serialized: a large model is not copied)."""
    ort = optional_import("onnxruntime")
    graph = model.graph
    infos = {v.name: v for v in graph.value_info}
    known = {o.name for o in graph.output}
    added = [n for n in names if n not in known]
    for name in added:
        output = graph.output.add()
        output.CopyFrom(infos.get(name, onnx.ValueInfoProto(name=name)))
    try:
        data = exact_loadable(model)
    finally:
        del graph.output[len(graph.output) - len(added):]
    # its notes on unused initializers are not the user's concern
    options = new_options("basic", log_severity=3, model=model)
    try:
        return ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors, as one line
        raise OnnxMluError(f"cannot run the model to capture calibration tensors: {runtime_message(exc)}") from exc


def _run(session, names: Sequence[str], sample: Mapping[str, np.ndarray], k: int) -> list:
    try:
        return session.run(list(names), dict(sample))
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors, as one line
        raise OnnxMluError(f"the model fails on calibration sample {k}: {runtime_message(exc)}") from exc
