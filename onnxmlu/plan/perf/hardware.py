"""Hardware profiles of the simulated accelerator, loaded from data files.

A profile is a JSON file in ``onnxmlu/plan/perf/profiles/`` (or any path a user passes). The
fields under ``"model"`` parametrize :mod:`onnxmlu.plan.perf.model`; the top-level fields are the
datasheet (MLU100: 32 cores, 1 TFLOPS FP32 / 2 TFLOPS FP16 / 4 TOPS INT8 per core -- [DLFusion]
Table I's 64 TFLOPS FP16 and 128 TOPS INT8 over 32 cores --, 102.4 GB/s DRAM, 1 GHz).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from onnxmlu.errors import OnnxMluError

DEFAULT_PROFILE = "mlu100"
#: The most cores a profile may have: the runtime library refuses a block with a larger ``mp``.
MAX_CORES = 1024


@dataclass(frozen=True)
class Hardware:
    name: str
    cores: int
    peak_tflops_fp32_per_core: float
    peak_tflops_fp16_per_core: float
    peak_tops_int8_per_core: float
    dram_gbps: float
    frequency_ghz: float
    description: str = ""
    model: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def peak_per_core(self, precision: str = "fp32") -> float:
        """Datasheet peak of one core at ``precision``: TFLOPS for fp32/fp16, TOPS for int8."""
        peaks = {"fp32": self.peak_tflops_fp32_per_core, "fp16": self.peak_tflops_fp16_per_core,
                 "int8": self.peak_tops_int8_per_core}
        if precision not in peaks:
            raise OnnxMluError(f"precision must be one of {', '.join(peaks)}, not {precision!r}")
        return float(peaks[precision])

    def mp_choices(self) -> list[int]:
        """Every legal core count, 1..cores."""
        return list(range(1, self.cores + 1))

    def to_dict(self) -> dict[str, Any]:
        """The profile in the JSON format :func:`load_hardware` reads back."""
        return asdict(self)


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
    model = dict(data.get("model", {}))
    if "search_max_block_layers" in model:
        model["search_max_block_layers"] = int(model["search_max_block_layers"])
    return Hardware(**{**data, "cores": int(data["cores"]), "model": model})


def _positive(v) -> bool:
    return _is_number(v) and v > 0


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _whole(v) -> bool:
    """An integer; 32.0 counts (JSON Schema's "integer" accepts it too)."""
    return _is_number(v) and float(v).is_integer()


def _cores(v) -> bool:
    return _whole(v) and 1 <= v <= MAX_CORES


#: Top-level fields: (check, what it wants). The same rules as JSON Schema: onnxmlu/schemas/hardware.json.
_FIELDS = {
    "name": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string"),
    "cores": (_cores, f"an integer from 1 to {MAX_CORES}"),
    "peak_tflops_fp32_per_core": (_positive, "a number > 0"),
    "peak_tflops_fp16_per_core": (_positive, "a number > 0"),
    "peak_tops_int8_per_core": (_positive, "a number > 0"),
    "dram_gbps": (_positive, "a number > 0"),
    "frequency_ghz": (_positive, "a number > 0"),
    "description": (lambda v: isinstance(v, str), "a string"),
    "model": (lambda v: isinstance(v, dict), "an object of performance-model parameters"),
}
_REQUIRED = tuple(f.name for f in fields(Hardware) if f.name not in ("description", "model"))

#: Parameters of ``"model"`` (onnxmlu.plan.perf.model, onnxmlu.plan.strategies) with what each must be;
#: any other finite number is accepted for the ones not listed here.
_MODEL_FIELDS = {
    "critical_mops_per_core": (_positive, "a number > 0"),
    "knee_sharpness": (_positive, "a number > 0"),
    "channel_granule": (_positive, "a number > 0"),
    "launch_us": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "layer_us": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "core_sync_us": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "core_dram_gbps": (_positive, "a number > 0"),
    "overlap_theta": (lambda v: _is_number(v) and 0 <= v <= 1, "a number from 0 to 1"),
    "grouped_conv_as_dense": (lambda v: _is_number(v) and v in (0, 1), "0 or 1"),
    "eq5_alpha": (_is_number, "a number"),
    "eq5_beta": (_is_number, "a number"),
    "eq5_offset": (_is_number, "a number"),
    "eq5_ops_unit": (_positive, "a number > 0"),
    "algorithm1_critical_mops_per_core": (_positive, "a number > 0"),
    "search_max_block_layers": (lambda v: _whole(v) and v >= 0, "an integer >= 0 (0: no bound)"),
}


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
    for key, value in data.get("model", {}).items():
        if key not in _MODEL_FIELDS:
            return f"unknown model parameter 'model.{key}' (known: {', '.join(_MODEL_FIELDS)})"
        ok, wanted = _MODEL_FIELDS[key]
        if not ok(value):
            return f"'model.{key}' must be {wanted}, got {_shown(value)}"
    return None


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
