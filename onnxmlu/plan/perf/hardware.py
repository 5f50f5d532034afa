"""Hardware profiles of the simulated accelerator, loaded from data files.

A profile is a JSON file in ``onnxmlu/plan/perf/profiles/`` (or any path a user passes). The
fields under ``"model"`` parametrize :mod:`onnxmlu.plan.perf.model`; the top-level fields are the
datasheet (MLU100: 32 cores, 1 TFLOPS FP32 / 2 TFLOPS FP16 / 4 TOPS INT8 per core -- [DLFusion]
Table I's 64 TFLOPS FP16 and 128 TOPS INT8 over 32 cores --, 102.4 GB/s DRAM, 1 GHz).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from onnxmlu.errors import OnnxMluError
from onnxmlu.precisions import RECORDS, record

DEFAULT_PROFILE = "mlu100"
#: The most cores a profile may have: the runtime library refuses a block with a larger ``mp``.
MAX_CORES = 1024


def _positive(v) -> bool:
    return _is_number(v) and v > 0


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _whole(v) -> bool:
    """An integer; 32.0 counts (JSON Schema's "integer" accepts it too)."""
    return _is_number(v) and float(v).is_integer()


#: What a parameter may be: (check, what it wants in the error line, its JSON Schema).
_KINDS = {
    "number": (_is_number, "a number", {"type": "number"}),
    "positive": (_positive, "a number > 0", {"type": "number", "exclusiveMinimum": 0}),
    "non-negative": (lambda v: _is_number(v) and v >= 0, "a number >= 0", {"type": "number", "minimum": 0}),
    "share": (lambda v: _is_number(v) and 0 <= v <= 1, "a number from 0 to 1",
              {"type": "number", "minimum": 0, "maximum": 1}),
    "flag": (lambda v: _is_number(v) and v in (0, 1), "0 or 1", {"enum": [0, 1]}),
    "bound": (lambda v: _whole(v) and v >= 0, "an integer >= 0 (0: no bound)", {"type": "integer", "minimum": 0}),
}


def _param(default, kind: str, doc: str):
    """A :class:`PerfParams` field: its default, its kind (check, error wording and JSON Schema)
    and its description; ``hardware.json`` is derived from these."""
    check, wants, schema = _KINDS[kind]
    return field(default=default, metadata={"check": check, "wants": wants,
                                            "schema": {**schema, "description": doc}})


@dataclass(frozen=True)
class PerfParams:
    """The parameters of the performance model (:mod:`onnxmlu.plan.perf.model`) and of the
    strategies ([DLFusion] Eq. 5, Algorithm 1, the searches' bound): a profile's ``"model"``.

    The defaults are the mlu100 calibration (docs/architecture.md, "The performance model"); a
    profile writes only the values it changes. This record is the one place that holds each
    default, each rule and each description: the loader's checks and ``hardware.json`` derive
    from it (tests/test_schemas.py compares)."""

    critical_mops_per_core: float = _param(
        210.0, "positive", "efficiency knee: operations per core a block needs to fill the pipeline (MOPs)")
    knee_sharpness: float = _param(6.0, "positive", "sharpness k of the smooth maximum at the knee")
    channel_granule: float = _param(40.0, "positive", "smallest channel slice a core computes")
    launch_us: float = _param(0.5, "non-negative", "cost of launching a block")
    layer_us: float = _param(6.0, "non-negative", "per-layer issue/barrier cost")
    core_sync_us: float = _param(1.0, "non-negative", "dispatch/join cost per extra core")
    core_dram_gbps: float = _param(27.0, "positive", "DRAM bandwidth one core can draw")
    overlap_theta: float = _param(0.36, "share",
                                  "share of the shorter of compute and traffic not hidden under the longer")
    grouped_conv_as_dense: int = _param(1, "flag", "1: grouped convolutions run as dense ones")
    eq5_alpha: float = _param(0.316, "number", "[DLFusion] Eq. 5: weight of log2(channels)")
    eq5_beta: float = _param(0.659, "number", "[DLFusion] Eq. 5: weight of log2(ops)")
    eq5_offset: float = _param(3.585, "number", "[DLFusion] Eq. 5: offset")
    eq5_ops_unit: float = _param(1e6, "positive", "[DLFusion] Eq. 5: unit of the op count")
    algorithm1_critical_mops_per_core: float = _param(
        180.0, "positive", "[DLFusion] Algorithm 1's OpCount_critical per core (MOPs)")
    search_max_block_layers: int = _param(256, "bound", "oracle/optimal: longest block searched (0: no bound)")

    @classmethod
    def of(cls, values: "PerfParams | Mapping[str, Any] | None") -> "PerfParams":
        """The record from a profile's ``"model"`` object (missing keys take their default);
        OnnxMluError with one line naming the first bad key."""
        if isinstance(values, PerfParams):
            return values
        values = dict(values or {})
        problem = model_problem(values)
        if problem:
            raise OnnxMluError(f"hardware profile: {problem}")
        if "search_max_block_layers" in values:
            values["search_max_block_layers"] = int(values["search_max_block_layers"])
        return cls(**values)


def model_problem(values: Mapping[str, Any]) -> str | None:
    """Why ``values`` (a profile's ``"model"`` object) is not valid, in one line; None if it is."""
    rules = {f.name: f.metadata for f in fields(PerfParams)}
    for key, value in values.items():
        if key not in rules:
            return f"unknown model parameter 'model.{key}' (known: {', '.join(rules)})"
        if not rules[key]["check"](value):
            return f"'model.{key}' must be {rules[key]['wants']}, got {_shown(value)}"
    return None


def model_schema() -> dict[str, Any]:
    """The JSON Schema of a profile's ``"model"`` object, as ``hardware.json`` holds it."""
    return {"type": "object", "description": "performance-model and strategy parameters; a missing "
            "one takes its default (the mlu100 calibration)",
            "properties": {f.name: f.metadata["schema"] for f in fields(PerfParams)},
            "required": [], "additionalProperties": False}


@dataclass(frozen=True)
class Hardware:
    """A hardware profile. ``peaks``: one core's datasheet peak at each precision (TFLOPS, TOPS
    for integer precisions), keyed by precision name; the JSON profile writes each as its
    record's ``peak`` field (``peak_tflops_fp16_per_core``...), so the fields a profile needs
    are derived from :data:`onnxmlu.precisions.RECORDS` (as ``hardware.json``'s are:
    :func:`onnxmlu.schemas.with_precisions`)."""

    name: str
    cores: int
    peaks: Mapping[str, float] | tuple[tuple[str, float], ...]  # stored as (name, peak) pairs, hashable
    dram_gbps: float
    frequency_ghz: float
    description: str = ""
    model: PerfParams = field(default_factory=PerfParams, hash=False, compare=False)

    def __post_init__(self) -> None:
        given = dict(self.peaks)
        if set(given) != set(RECORDS):
            raise ValueError(f"Hardware.peaks must give each of {', '.join(RECORDS)}, not {', '.join(given)}")
        object.__setattr__(self, "peaks", tuple((p, float(given[p])) for p in RECORDS))
        object.__setattr__(self, "model", PerfParams.of(self.model))

    def peak_per_core(self, precision: str = "fp32") -> float:
        """Datasheet peak of one core at ``precision``: TFLOPS for floats, TOPS for integers."""
        return dict(self.peaks)[record(precision).name]

    def mp_choices(self) -> list[int]:
        """Every legal core count, 1..cores."""
        return list(range(1, self.cores + 1))

    def with_params(self, **changes: Any) -> "Hardware":
        """The same hardware with some performance-model parameters changed (validated)."""
        return replace(self, model=PerfParams.of({**asdict(self.model), **changes}))

    def to_dict(self) -> dict[str, Any]:
        """The profile in the JSON format :func:`load_hardware` reads back (each peak as its
        record's field, in the records' order)."""
        data = asdict(self)
        peaks = data.pop("peaks")
        head = {k: data.pop(k) for k in ("name", "cores")}
        return {**head, **{RECORDS[p].peak: v for p, v in peaks}, **data}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Hardware":
        """The profile of a parsed JSON object that :func:`profile_problem` accepts."""
        rest = {k: v for k, v in data.items() if k not in _PEAK_FIELDS}
        return cls(**{**rest, "cores": int(data["cores"]), "model": PerfParams.of(data.get("model")),
                      "peaks": tuple((p.name, data[p.peak]) for p in RECORDS.values())})


def profile_names() -> list[str]:
    """Names of the built-in profiles."""
    folder = resources.files("onnxmlu.plan.perf") / "profiles"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_hardware(name_or_path: str | Path = DEFAULT_PROFILE) -> Hardware:
    """Load a built-in profile by name, or a user's JSON file by path. A profile that is not
    valid raises OnnxMluError with one line naming the field and its value."""
    text = _profile_text(str(name_or_path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OnnxMluError(f"hardware profile {name_or_path!s} is not valid JSON: {exc}") from None
    problem = profile_problem(data)
    if problem:
        raise OnnxMluError(f"hardware profile {name_or_path!s}: {problem}")
    return Hardware.from_dict(data)


def _cores(v) -> bool:
    return _whole(v) and 1 <= v <= MAX_CORES


#: The profile field of each precision's peak, from the records (``peak_tflops_fp16_per_core``...).
_PEAK_FIELDS = {p.peak: p for p in RECORDS.values()}

#: Top-level fields: (check, what it wants). The same rules as JSON Schema: onnxmlu/schemas/hardware.json.
_FIELDS = {
    "name": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "cores": (_cores, f"an integer from 1 to {MAX_CORES}"),
    **{key: (_positive, "a number > 0") for key in _PEAK_FIELDS},
    "dram_gbps": (_positive, "a number > 0"),
    "frequency_ghz": (_positive, "a number > 0"),
    "description": (lambda v: isinstance(v, str), "a string"),
    "model": (lambda v: isinstance(v, dict), "an object of performance-model parameters"),
}
_REQUIRED = tuple(key for key in _FIELDS if key not in ("description", "model"))


def profile_problem(data) -> str | None:
    """Why ``data`` (a parsed profile) is not a valid hardware profile, in one line naming the
    field and its value; None when it is valid."""
    if not isinstance(data, dict):
        return f"must be a JSON object, got {_shown(data)}"
    for key in data:
        if key not in _FIELDS:
            return f"unknown field {key!r} (known: {', '.join(_FIELDS)})"
    for key in _REQUIRED:
        if key not in data:
            return f"missing field {key!r}"
    for key, value in data.items():
        ok, wanted = _FIELDS[key]
        if not ok(value):
            return f"{key!r} must be {wanted}, got {_shown(value)}"
    return model_problem(data.get("model", {}))


def _shown(value) -> str:
    """A value as the user wrote it in JSON, with its JSON type when that is the surprise."""
    text = json.dumps(value)  # NaN and Infinity as JSON writes them
    if len(text) > 60:
        text = text[:57] + "..."
    kinds = {str: "a string", bool: "a boolean", list: "an array", dict: "an object", type(None): "null"}
    kind = kinds.get(type(value))
    return f"{text} ({kind})" if kind else text


def _profile_text(name_or_path: str) -> str:
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise OnnxMluError(f"hardware profile file {path} does not exist")
        return path.read_text()
    if name_or_path not in profile_names():
        known = ", ".join(profile_names())
        raise OnnxMluError(f"unknown hardware profile {name_or_path!r} (known: {known})")
    folder = resources.files("onnxmlu.plan.perf") / "profiles"
    return (folder / f"{name_or_path}.json").read_text()
