"""Numerical verification: run an original and a fused model on the same seeded inputs.

The reference is the original model in onnxruntime with graph optimizations disabled, so
onnxruntime's own fusions cannot hide a bug in ours. Inputs are drawn per element type:
floats ~ N(0, 1), integers uniform in [0, 10), booleans fair coins. Symbolic dimensions take
``dims[name]`` when given, else 1.

Error metrics per output: ``max_abs = max|f - r|`` and ``max_rel = max(|f - r| / (|r| + tiny))``;
an output passes when ``|f - r| <= atol + rtol * |r|`` element-wise (numpy's allclose rule).
The report also gives the accuracy metrics of :mod:`onnxmlu.precision.accuracy` over all seeds
(worst cosine, top-1 agreement). With a ``budget`` (``cosine>=X`` or ``top1>=X``: the check of
a model fused at FP16/INT8, where 1e-4 cannot hold) the budget decides, not the tolerances.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from onnxmlu.errors import OnnxMluError, first_line
from onnxmlu.ir import fed_inputs
from onnxmlu.precision.accuracy import Accuracy, Budget, measure


@dataclass(frozen=True)
class OutputDiff:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    ok: bool


@dataclass
class CheckReport:
    atol: float
    rtol: float
    seeds: tuple[int, ...]
    diffs: list[OutputDiff] = field(default_factory=list)
    accuracy: Accuracy | None = None  # worst cosine and top-1 agreement over the seeds
    budget: Budget | None = None  # when given, it decides ``ok`` instead of the tolerances
    data: str = ""  # what the models ran on

    @property
    def ok(self) -> bool:
        if self.budget is not None:
            return self.accuracy is not None and self.budget.met(self.accuracy)
        return bool(self.diffs) and all(d.ok for d in self.diffs)

    def to_dict(self) -> dict:
        return {
            "ok": self.ok, "atol": self.atol, "rtol": self.rtol, "seeds": list(self.seeds),
            "outputs": [d.__dict__ | {"shape": list(d.shape)} for d in self.diffs],
            "accuracy": None if self.accuracy is None else self.accuracy.to_dict(),
            "budget": None if self.budget is None else str(self.budget), "data": self.data,
        }


def random_inputs(model: onnx.ModelProto, seed: int = 0, dims: Mapping[str, int] | None = None,
                  shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, np.ndarray]:
    """Seeded random feeds for the model's true inputs (initializers excluded).

    ``shapes`` gives whole input shapes by input name; ``dims`` sizes symbolic dims by name.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in fed_inputs(model.graph):
        tensor_type = value.type.tensor_type
        if shapes and value.name in shapes:
            shape = [int(d) for d in shapes[value.name]]
        else:
            shape = [_dim_size(d, dims or {}) for d in tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        feeds[value.name] = _random_array(rng, shape, dtype)
    return feeds


def _run(session, names: Sequence[str], feeds: dict, what: str) -> list:
    try:
        return session.run(names, feeds)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's errors, as one line
        raise OnnxMluError(f"{what}: {first_line(exc)} (give valid values with --inputs FILE.npz)") from None


def _pinned_shapes(pins: Mapping[str, Sequence[int | str]] | None) -> dict[str, list[int]] | None:
    if not pins:
        return None
    return {name: [d if isinstance(d, int) else 1 for d in dims] for name, dims in pins.items()}


def _dim_size(dim: onnx.TensorShapeProto.Dimension, dims: Mapping[str, int]) -> int:
    if dim.HasField("dim_value"):
        return dim.dim_value
    return int(dims.get(dim.dim_param, 1))


def _random_array(rng: np.random.Generator, shape: list[int], dtype: np.dtype) -> np.ndarray:
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 10, size=shape).astype(dtype)
    raise OnnxMluError(f"cannot make random inputs of type {dtype}; pass --inputs data.npz")


def compare_outputs(names: Sequence[str], fused: Sequence[np.ndarray], reference: Sequence[np.ndarray],
                    atol: float, rtol: float) -> list[OutputDiff]:
    diffs = []
    for name, f, r in zip(names, fused, reference):
        f, r = np.asarray(f), np.asarray(r)
        if f.shape != r.shape:
            diffs.append(OutputDiff(name, tuple(f.shape), float("inf"), float("inf"), False))
            continue
        diffs.append(_diff(name, f, r, atol, rtol))
    return diffs


def _diff(name: str, f: np.ndarray, r: np.ndarray, atol: float, rtol: float) -> OutputDiff:
    if f.dtype.kind in "biuO" or r.dtype.kind in "biuO":
        equal = bool(np.array_equal(f, r))
        return OutputDiff(name, tuple(f.shape), 0.0 if equal else float("inf"), 0.0 if equal else float("inf"), equal)
    f64, r64 = f.astype(np.float64), r.astype(np.float64)
    err = np.abs(f64 - r64)
    max_abs = float(err.max()) if err.size else 0.0
    max_rel = float((err / (np.abs(r64) + 1e-12)).max()) if err.size else 0.0
    ok = bool(np.allclose(f64, r64, atol=atol, rtol=rtol, equal_nan=True))
    return OutputDiff(name, tuple(f.shape), max_abs, max_rel, ok)


def _runs(original: onnx.ModelProto, seeds: Sequence[int], samples, dims, input_shapes) -> list[tuple[str, dict]]:
    """What ``check`` runs: (label, feeds) for each seed's random inputs, then each sample."""
    runs = [(f"seed {seed}", random_inputs(original, seed, dims, _pinned_shapes(input_shapes))) for seed in seeds]
    return runs + [(f"sample {k}", dict(sample)) for k, sample in enumerate(samples or ())]


def check_models(original: onnx.ModelProto, fused: onnx.ModelProto, *, seeds: Sequence[int] = (0,),
                 atol: float = 1e-4, rtol: float = 1e-4,
                 dims: Mapping[str, int] | None = None,
                 input_shapes: Mapping[str, Sequence[int | str]] | None = None,
                 inputs: Mapping[str, np.ndarray] | None = None, budget: Budget | None = None,
                 progress: Callable[[str], None] | None = None,
                 samples: Sequence[Mapping[str, np.ndarray]] | None = None, data: str = "") -> CheckReport:
    """Run both models on each seed; the report keeps the worst error per output.

    ``input_shapes`` are the pins ``fuse`` was given (``--input-shape``): those inputs get
    exactly those shapes (a dim left symbolic in a pin is 1), the rest sizes symbolic dims by
    ``dims`` (1 when absent). ``inputs`` are fixed arrays for some inputs (a sample rate, token
    ids, real data) used for every seed; the others are random. ``budget`` decides the verdict
    instead of the tolerances (module docstring). ``samples`` (real data: validation samples,
    ``--inputs DIR``) are run instead of the seeds; ``data`` says what they are, for the report.
    ``progress(stage)`` is told each stage as it starts (the CLI shows it)."""
    from onnxmlu.runtime import InferenceSession, reference_session

    say = progress or (lambda stage: None)
    say("reference session (original, optimizations off)")
    ref = reference_session(original)
    say("fused session")
    sess = InferenceSession(fused)
    names = [o.name for o in sess.get_outputs()]
    seeds = () if samples is not None else tuple(seeds)
    runs = _runs(original, seeds, samples, dims, input_shapes)
    data = data or f"seeded random inputs (seeds {', '.join(map(str, seeds))})"
    report = CheckReport(atol, rtol, seeds, budget=budget, data=data)
    worst: dict[str, OutputDiff] = {}
    references, outputs = [], []
    for label, feeds in runs:
        feeds = feeds | dict(inputs or {})
        say(f"running both models, {label}")
        references.append(_run(ref, names, feeds, f"the original model fails on the inputs of {label}"))
        outputs.append(_run(sess, names, feeds, "the fused model fails"))
        _keep_worst(worst, compare_outputs(names, outputs[-1], references[-1], atol, rtol))
    report.diffs = [worst[n] for n in names]
    report.accuracy = measure(references, outputs) if runs else None
    return report


def _keep_worst(worst: dict[str, OutputDiff], diffs: Sequence[OutputDiff]) -> None:
    """Per output, the failing diff over a passing one, then the larger absolute error."""
    for d in diffs:
        prev = worst.get(d.name)
        if prev is None or (not d.ok, d.max_abs) > (not prev.ok, prev.max_abs):
            worst[d.name] = d
