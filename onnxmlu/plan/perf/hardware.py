"""Hardware profiles of the simulated accelerator, loaded from data files.

A profile is a JSON file in ``onnxmlu/plan/perf/profiles/`` (or any path a user passes). The
fields under ``"model"`` parametrize :mod:`onnxmlu.plan.perf.model`; the top-level fields are the
datasheet (MLU100: 32 cores, 1 TFLOPS FP32 per core, 102.4 GB/s DRAM, 1 GHz).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from onnxmlu.errors import OnnxMluError

DEFAULT_PROFILE = "mlu100"


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
    """Load a built-in profile by name, or a user's JSON file by path."""
    text = _profile_text(str(name_or_path))
    try:
        data = json.loads(text)
        return Hardware(**data)
    except (json.JSONDecodeError, TypeError) as exc:
        raise OnnxMluError(f"hardware profile {name_or_path!s} is not valid: {exc}") from None


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
