"""Input-shape pins and ranges: the shapes the planner prices, never baked into the graph.

A model's symbolic dims stay symbolic in the fused model (docs/architecture.md, "Dynamic
shapes"). ``--input-shape`` only says at which concrete sizes the planner prices the layers
and the shape probe runs, and over which range the user means to run the model, as a
TensorRT optimization profile does [TensorRT-profiles] (min / opt / max per dim):

    NAME:1,3,48,320            every dim pinned: opt = min = max
    NAME:1,3,48,160..1280      a range: min 160, max 1280, opt = min
    NAME:1,3,48,160/320/1280   min / opt / max
    NAME:N,3,48,W              a name keeps a dim symbolic (it takes the default below)
    NAME:1x3x48x320            trtexec's spelling (its --shapes) of a pinned shape
    NAME:[1,3,48,320]          Polygraphy's spelling (its --input-shapes)
    A:1x3x8x8,B:1x16           several inputs in one value: trtexec's list (a comma that
    A:1,3,8,8 B:1,16           starts a NAME:), or space-separated as the pricing line prints them

Every pin is checked against the model: the input exists, the rank matches, each size is
at least 1, min <= opt <= max, and a dim the model fixes is not given another size.

Dims nothing pins take a stated default (:func:`default_size`): the first dim (the batch) is
1; another symbolic dim of a rank-4+ input copies the largest fixed dim beyond the first two
when there is one larger than 4 (a [N, 3, 48, W] text line is priced 48 wide; a [N, H, W, 3]
image 224 square otherwise); any other dim is :data:`DEFAULT_SPATIAL` (rank 4 and up) or
:data:`DEFAULT_LENGTH`. So an unpinned model is planned exactly as one pinned at those sizes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence, Union

import onnx

from onnxmlu.errors import OnnxMluError
from onnxmlu.ir import fed_inputs
from onnxmlu.wording import plural

#: Default size of an unpinned symbolic spatial dim (rank-4+ inputs) and of any other one.
DEFAULT_SPATIAL = 224
DEFAULT_LENGTH = 128
#: The ends of a range a profile is read at.
POINTS = ("min", "opt", "max")


@dataclass(frozen=True)
class DimRange:
    """One dim's profile: the sizes it takes run from ``min`` to ``max``; ``opt`` is priced."""

    min: int
    opt: int
    max: int

    def at(self, point: str) -> int:
        return getattr(self, point)

    def __str__(self) -> str:
        return f"{self.min}/{self.opt}/{self.max}" if self.opt != self.min else f"{self.min}..{self.max}"


Dim = Union[int, str, DimRange]
#: Input name -> its dims: a size, a symbolic name (the default applies) or a range.
Pins = dict[str, list[Dim]]


def parse_input_shapes(specs: Iterable[str]) -> Pins:
    """``NAME:D1,D2,...`` items, each dim a size, ``MIN..MAX``, ``MIN/OPT/MAX`` or a name;
    also ``NAME:D1xD2x...`` (sizes only) and ``NAME:[D1,D2,...]``."""
    shapes: Pins = {}
    for spec in (item for value in specs for item in _items(value)):
        name, sep, dims = spec.rpartition(":")
        dims = _common_spelling(dims.strip())
        if not sep or not name or not dims:
            raise OnnxMluError(f"--input-shape {spec!r} is not NAME:D1,D2,... (e.g. input:1,3,224,224, "
                               "input:1x3x224x224 or input:[1,3,224,224])")
        if name in shapes:
            raise OnnxMluError(f"--input-shape gives input {name!r} twice")
        shapes[name] = [_parse_dim(d.strip(), spec) for d in dims.split(",")]
    return shapes


#: A comma that starts another ``NAME:`` item (not one between dims, nor inside ``[...]``).
_ITEM_COMMA = re.compile(r",(?=[^,\[\]]*:)")


def _items(value: str) -> list[str]:
    """The ``NAME:DIMS`` items of one ``--input-shape`` value: separated by spaces, or by
    trtexec's commas (``a:1x3x8x8,b:1x16``); ``NAME:1,3,8,8`` stays one item."""
    return [item for word in value.split() for item in _ITEM_COMMA.split(word)] or [value]


def _common_spelling(dims: str) -> str:
    """The dims of trtexec's ``1x3x224x224`` or Polygraphy's ``[1,3,224,224]`` as ``1,3,224,224``.
    Only sizes separate by ``x``: ``x1`` stays a dim name."""
    if dims.startswith("[") and dims.endswith("]"):
        return dims[1:-1]
    parts = dims.split("x")
    if "," not in dims and len(parts) > 1 and all(p.strip().isdigit() for p in parts):
        return ",".join(parts)
    return dims


def _parse_dim(text: str, spec: str) -> Dim:
    if ".." in text or "/" in text:
        parts = text.split("..") if ".." in text else text.split("/")
        if len(parts) not in (2, 3) or (".." in text and len(parts) != 2):
            raise OnnxMluError(f"--input-shape {spec!r}: {text!r} is not MIN..MAX or MIN/OPT/MAX")
        lo, *mid, hi = (_size(p, spec) for p in parts)
        opt = mid[0] if mid else lo
        if not lo <= opt <= hi:
            raise OnnxMluError(f"--input-shape {spec!r}: {text!r} needs MIN <= OPT <= MAX")
        return DimRange(lo, opt, hi)
    if text.lstrip("+-").isdigit():
        return _size(text, spec)
    if not text.isidentifier():
        raise OnnxMluError(f"--input-shape {spec!r}: dim {text!r} is neither a size nor a name")
    return text


def _size(text: str, spec: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise OnnxMluError(f"--input-shape {spec!r}: {text!r} is not a whole number") from None
    if value < 1:
        raise OnnxMluError(f"--input-shape {spec!r}: size {value} must be at least 1")
    return value


def pins_text(pins: Mapping[str, list[Dim]] | None) -> list[str]:
    """The pins as ``--input-shape`` would take them again."""
    return [f"{name}:{','.join(str(d) for d in dims)}" for name, dims in (pins or {}).items()]


def shapes_text(shapes: Mapping[str, Sequence[int]]) -> str:
    """Concrete input shapes as ``--input-shape`` takes them back (trtexec's spelling,
    ``images:1x3x224x224``), space-separated. A scalar input (rank 0) has no dims to pin and
    no spelling: it is left out."""
    return " ".join(f"{name}:{'x'.join(map(str, dims))}" for name, dims in shapes.items() if len(dims))


# ------------------------------------------------------------------------------ checked
def declared_dims(vi: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """An input's declared dims (a size, a name, or None), None when its rank is unknown."""
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]


def check_pins(model: onnx.ModelProto, pins: Mapping[str, list[Dim]] | None) -> None:
    """One-line errors for pins the model contradicts: an unknown input, another rank, a size
    for a dim the model fixes at another size."""
    inputs = {vi.name: vi for vi in fed_inputs(model.graph)}
    for name, dims in (pins or {}).items():
        if name not in inputs:
            raise OnnxMluError(f"--input-shape names {name!r}, which is not a model input "
                               f"(inputs: {', '.join(inputs) or 'none'})")
        declared = declared_dims(inputs[name])
        if declared is None:
            continue
        if len(dims) != len(declared):
            raise OnnxMluError(f"--input-shape gives input {name!r} {plural(len(dims), 'dim')}; the model declares "
                               f"rank {len(declared)} ({_dims_text(declared)})")
        for axis, (pin, fixed) in enumerate(zip(dims, declared)):
            if isinstance(fixed, int) and fixed > 0 and _varies_from(pin, fixed):
                raise OnnxMluError(f"--input-shape gives input {name!r} dim {axis} as {pin}; the model fixes "
                                   f"it at {fixed} ({_dims_text(declared)})")


def _varies_from(pin: Dim, fixed: int) -> bool:
    if isinstance(pin, DimRange):
        return (pin.min, pin.max) != (fixed, fixed)
    return isinstance(pin, int) and pin != fixed


def _dims_text(dims: list) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


# ------------------------------------------------------------------------------ concrete shapes
def concrete_shapes(model: onnx.ModelProto, pins: Mapping[str, list[Dim]] | None = None,
                    point: str = "opt") -> dict[str, list[int]]:
    """Every fed input's shape at ``point`` of the pins' profile (min, opt or max), unpinned
    symbolic dims at their default (:func:`default_size`). Dims sharing a name share a size:
    the one a pin gives any of them, else the default of the first."""
    named = _pinned_symbols(model, pins, point)
    shapes: dict[str, list[int]] = {}
    for name, declared, dims in _input_dims(model, pins):
        shape = []
        for axis, dim in enumerate(dims):
            size = _size_at(dim, point)
            symbol = _symbol(declared, axis)
            if size is None:
                size = named.get(symbol) or default_size(axis, declared or dims)
            if symbol is not None:
                named.setdefault(symbol, size)
            shape.append(size)
        shapes[name] = shape
    return shapes


def _pinned_symbols(model: onnx.ModelProto, pins: Mapping[str, list[Dim]] | None, point: str) -> dict[str, int]:
    """Symbol -> the size a pin gives one of its dims at ``point`` (the first such pin)."""
    named: dict[str, int] = {}
    for _, declared, dims in _input_dims(model, pins):
        for axis, dim in enumerate(dims):
            size, symbol = _size_at(dim, point), _symbol(declared, axis)
            if size is not None and symbol is not None:
                named.setdefault(symbol, size)
    return named


def _input_dims(model: onnx.ModelProto,
                pins: Mapping[str, list[Dim]] | None) -> Iterator[tuple[str, list | None, list]]:
    """(input name, its declared dims, its dims as pinned: the pin where given, else declared)
    for every fed input of known rank or with a pin."""
    for vi in fed_inputs(model.graph):
        declared, pinned = declared_dims(vi), (pins or {}).get(vi.name)
        if declared is not None or pinned is not None:
            yield vi.name, declared, list(pinned) if pinned is not None else list(declared)


def _symbol(declared: list | None, axis: int) -> str | None:
    """The name the model gives dim ``axis``, if any."""
    return declared[axis] if declared is not None and axis < len(declared) and isinstance(declared[axis], str) else None


def dim_key(name: str, declared: list | None, axis: int) -> str:
    """What identifies a symbolic dim: its name (dims sharing one are one dim), else ``input:axis``."""
    return _symbol(declared, axis) or f"{name}:{axis}"


def dim_label(key: str) -> str:
    """A :func:`dim_key` for people: ``images[2]`` for an unnamed dim (``images:2`` would read as
    an ``--input-shape`` spelling, a rank-1 pin), a name as it is."""
    name, sep, axis = key.rpartition(":")
    return f"{name}[{axis}]" if sep and axis.isdigit() else key


def _size_at(dim: Dim | None, point: str) -> int | None:
    if isinstance(dim, DimRange):
        return dim.at(point)
    return dim if isinstance(dim, int) and dim > 0 else None


def default_size(axis: int, dims: list) -> int:
    """The size an unpinned symbolic dim is priced at (module docstring)."""
    if axis == 0:
        return 1
    fixed = [d for d in dims[2:] if isinstance(d, int) and d > 4]
    if len(dims) >= 4 and fixed:
        return max(fixed)
    return DEFAULT_SPATIAL if len(dims) >= 4 else DEFAULT_LENGTH


def defaulted_keys(model: onnx.ModelProto, pins: Mapping[str, list[Dim]] | None = None) -> list[str]:
    """The symbolic dims that no pin sizes (:func:`dim_key`): they take :func:`default_size`."""
    keys = [dim_key(name, declared, axis) for name, declared, dims in _input_dims(model, pins)
            for axis, dim in enumerate(dims) if _size_at(dim, "opt") is None]
    return list(dict.fromkeys(keys))


def with_defaults(model: onnx.ModelProto, pins: Mapping[str, list[Dim]] | None, size: int,
                  sizes: Mapping[str, int] | None = None) -> Pins:
    """``pins`` with every dim that takes a default given ``size`` (or its own, ``sizes`` by
    :func:`dim_key`), except the batch: a first dim, and every dim sharing its name (a state
    ``[2, batch, 128]`` beside an input ``[batch, T]``), so that a shared dim keeps one size."""
    listed = list(_input_dims(model, pins))
    batch = {dim_key(name, declared, 0) for name, declared, dims in listed if dims}
    sizes = sizes or {}

    def sized(name: str, declared, axis: int, d):
        key = dim_key(name, declared, axis)
        return sizes.get(key, size) if _size_at(d, "opt") is None and key not in batch else d
    return {name: [sized(name, declared, axis, d) for axis, d in enumerate(dims)] for name, declared, dims in listed}


def has_ranges(pins: Mapping[str, list[Dim]] | None) -> bool:
    return any(isinstance(d, DimRange) for dims in (pins or {}).values() for d in dims)


def symbolic_dims(model: onnx.ModelProto) -> list[tuple[str, int, str]]:
    """(input, axis, :func:`dim_key`) of every dim a fed input leaves symbolic (named or unknown)."""
    return [(vi.name, axis, dim_key(vi.name, declared, axis))
            for vi in fed_inputs(model.graph) if (declared := declared_dims(vi)) is not None
            for axis, d in enumerate(declared) if not isinstance(d, int) or d <= 0]


def symbolic_axes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Fed input -> the axes the model leaves symbolic (named or unknown)."""
    found: dict[str, list[int]] = {}
    for name, axis, _ in symbolic_dims(model):
        found.setdefault(name, []).append(axis)
    return found


# ------------------------------------------------------------------------------ the record
@dataclass(frozen=True)
class PricingShape:
    """The shapes a plan was priced at, recorded in the fused model (``onnxmlu.pricing_shape``):
    every fed input's shape at ``opt``; the symbolic dims no pin sized (:func:`dim_key`: they
    took :func:`default_size` or a fallback size the model runs at); with ``--input-shape``
    ranges, every input's shape at ``min``, ``opt`` and ``max`` (point -> input -> shape) and
    the plan's simulated latency there (``latency_us``, point -> µs, as ``fuse`` prints it; None
    without a range, and in a file fused before the record held it)."""

    inputs: dict[str, list[int]]
    defaulted: list[str]
    profile: dict[str, dict[str, list[int]]] | None = None
    latency_us: dict[str, float] | None = None

    def to_dict(self) -> dict:
        return {"inputs": {k: list(v) for k, v in self.inputs.items()}, "defaulted": list(self.defaulted),
                "profile": self.profile, "sim_latency_us": None if self.latency_us is None else dict(self.latency_us)}

    @classmethod
    def from_dict(cls, data: Mapping) -> "PricingShape":
        """The record as written; one without ``sim_latency_us`` (older files) reads as None."""
        latency = data.get("sim_latency_us")
        latency = {str(p): float(t) for p, t in latency.items()} if isinstance(latency, Mapping) else None
        return cls({k: [int(d) for d in v] for k, v in data.get("inputs", {}).items()},
                   [str(k) for k in data.get("defaulted", [])], data.get("profile"), latency)

    def text(self) -> str:
        """``images:1x3x224x224`` (:func:`shapes_text`), or ``scalars only`` for a model of scalars."""
        return shapes_text(self.inputs) or "scalars only"

    def describe(self) -> str:
        """One line: where the plan was priced, and whether a default chose it."""
        why = (f" (default for symbolic dims {', '.join(map(dim_label, self.defaulted))}; pin with --input-shape)"
               if self.defaulted else "")
        return f"priced at {self.text()}{why}"

    def profile_text(self) -> str | None:
        """``min … · opt … · max …`` of the ranges, None without one."""
        if not self.profile:
            return None
        return " · ".join(f"{point} {shapes_text(self.profile[point])}" for point in POINTS if point in self.profile)

    def ranges_text(self) -> str | None:
        """The simulated latency over the ranges as ``fuse`` prints it (``min 1.0 µs · opt …``),
        that the file does not record it, or None without a range."""
        if not self.profile:
            return None
        if self.latency_us is None:
            return "simulated µs at min/opt/max not recorded in this file (fused before it was)"
        return latency_text(self.latency_us)

    def differs(self, shapes: Mapping[str, Sequence[int]]) -> bool:
        """Whether ``shapes`` (a run's inputs) are not the priced ones."""
        return any(name in self.inputs and list(self.inputs[name]) != list(dims) for name, dims in shapes.items())

    def as_pins(self) -> Pins:
        """The record as ``--input-shape`` pins: every input at its priced size, a dim that the
        profile's min and max tell apart as their range (``check`` runs there, as ``fuse`` did)."""
        profile = self.profile or {}
        low, high = profile.get("min", {}), profile.get("max", {})
        pins: Pins = {}
        for name, sizes in self.inputs.items():
            lo, hi = low.get(name, sizes), high.get(name, sizes)
            pins[name] = [DimRange(int(a), int(o), int(b)) if len(lo) == len(hi) == len(sizes) and a != b else int(o)
                          for o, a, b in zip(sizes, lo + [None] * len(sizes), hi + [None] * len(sizes))]
        return pins


def latency_text(latency_us: Mapping[str, float]) -> str:
    """``min 1.0 µs · opt 2.0 µs · max 4.0 µs``: a plan's simulated latency per point of a profile."""
    return " · ".join(f"{point} {t:,.1f} µs" for point, t in latency_us.items())


def pricing_shape(model: onnx.ModelProto, pins: Mapping[str, list[Dim]] | None, priced: Mapping[str, list[int]],
                  profile: dict[str, dict[str, list[int]]] | None = None,
                  latency_us: dict[str, float] | None = None) -> PricingShape:
    """The :class:`PricingShape` of a plan priced at ``priced`` (the analysis' input shapes; empty:
    the model fixes every dim, and :func:`concrete_shapes` says them); ``latency_us``: the plan's
    simulated latency at each point of ``profile``."""
    inputs = dict(priced) if priced else concrete_shapes(model, pins)
    return PricingShape({k: list(v) for k, v in inputs.items()}, defaulted_keys(model, pins), profile, latency_us)
