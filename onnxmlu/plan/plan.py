"""Fusion plans: a partition of the accelerator layers into blocks, each with one MP.

A plan is the contract between a strategy and ``collapse``. Block ``i`` covers layers
``start .. stop-1`` (indices into the layer table, in topological order) and runs them all
at ``mp`` cores. A valid plan covers every layer exactly once, in order, never spans two
segments (runs of supported nodes separated by host nodes) and uses 1 <= mp <= cores.

Plans serialize to JSON so users can write or edit them by hand ([Paleozoic]: "set MP and
fusion yourself" interface)::

    {"format": "onnxmlu-plan", "version": 1, "strategy": "dlfusion", "hardware": "mlu100",
     "blocks": [{"start": 0, "stop": 4, "mp": 8, "first": "conv1", "last": "relu2"}, ...]}

``first``/``last`` (layer names) are optional; when present they must match the model.
``precision`` (a name of :data:`~onnxmlu.precisions.PRECISIONS`, see :mod:`onnxmlu.precision`) is optional
too: a block without it runs at FP32, and FP32 blocks are written without it, so plans from
before the precision knob read and write as they did.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from onnxmlu.errors import OnnxMluError, PlanError
from onnxmlu.plan.perf.layers import Layer
from onnxmlu.precisions import DEFAULT_PRECISION, check_precision
from onnxmlu.wording import plural

PLAN_FORMAT = "onnxmlu-plan"
PLAN_VERSION = 1


@dataclass(frozen=True)
class Block:
    start: int
    stop: int
    mp: int
    precision: str = DEFAULT_PRECISION

    @property
    def size(self) -> int:
        return self.stop - self.start

    def layers(self, layers: Sequence[Layer]) -> Sequence[Layer]:
        return layers[self.start : self.stop]


@dataclass(frozen=True)
class Plan:
    blocks: tuple[Block, ...]
    strategy: str = "custom"
    hardware: str = ""
    notes: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    # --- validation -------------------------------------------------------------------
    def validate(self, layers: Sequence[Layer], cores: int) -> None:
        """Raise :class:`PlanError` with the first problem found, or return None."""
        expected = 0
        for i, block in enumerate(self.blocks):
            _check_block(i, block, expected, layers, cores)
            expected = block.stop
        if expected != len(layers):
            raise PlanError(
                f"plan covers layers 0..{expected - 1} but the model has {plural(len(layers), 'layer')} "
                f"(gap at the end: layers {expected}..{len(layers) - 1} are in no block)"
            )

    # --- JSON -------------------------------------------------------------------------
    def to_dict(self, layers: Sequence[Layer] | None = None) -> dict[str, Any]:
        blocks = []
        for b in self.blocks:
            entry: dict[str, Any] = {"start": b.start, "stop": b.stop, "mp": b.mp}
            if b.precision != DEFAULT_PRECISION:
                entry["precision"] = b.precision
            if layers is not None:
                entry["first"] = layers[b.start].name
                entry["last"] = layers[b.stop - 1].name
            blocks.append(entry)
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "strategy": self.strategy,
            "hardware": self.hardware,
            "blocks": blocks,
        }

    def to_json(self, layers: Sequence[Layer] | None = None) -> str:
        return json.dumps(self.to_dict(layers), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any, layers: Sequence[Layer] | None = None) -> "Plan":
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise PlanError(f"not an onnxmlu plan (expected \"format\": \"{PLAN_FORMAT}\")")
        if data.get("version") != PLAN_VERSION:
            raise PlanError(f"unsupported plan version {data.get('version')!r}")
        raw_blocks = data.get("blocks")
        if not isinstance(raw_blocks, list) or not raw_blocks:
            raise PlanError("plan has no \"blocks\" list")
        blocks = tuple(_block_from_dict(i, b, layers) for i, b in enumerate(raw_blocks))
        return cls(blocks, str(data.get("strategy", "custom")), str(data.get("hardware", "")))

    @classmethod
    def from_json(cls, text: str, layers: Sequence[Layer] | None = None) -> "Plan":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"plan is not valid JSON: {exc}") from None
        return cls.from_dict(data, layers)

    @classmethod
    def load(cls, path: str | Path, layers: Sequence[Layer] | None = None) -> "Plan":
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise PlanError(f"cannot read plan file {path}: {exc.strerror}") from None
        return cls.from_json(text, layers)


def plan_from_ranges(ranges: Sequence[tuple[int, int, int] | tuple[int, int, int, str]], strategy: str = "custom",
                     hardware: str = "") -> Plan:
    """Build a plan from ``(start, stop, mp)`` triples, the hand-written form, or
    ``(start, stop, mp, precision)`` quadruples."""
    return Plan(tuple(Block(*r) for r in ranges), strategy, hardware)


def with_precision(plan: Plan, precision: str | Sequence[str]) -> Plan:
    """``plan`` with every block at ``precision``, or block ``i`` at ``precision[i]``."""
    chosen = [precision] * len(plan.blocks) if isinstance(precision, str) else list(precision)
    if len(chosen) != len(plan.blocks):
        raise PlanError(f"{plural(len(chosen), 'precision')} for a plan of {plural(len(plan.blocks), 'block')}")
    blocks = tuple(Block(b.start, b.stop, b.mp, _check_block_precision(i, p))
                   for i, (b, p) in enumerate(zip(plan.blocks, chosen)))
    return Plan(blocks, plan.strategy, plan.hardware, dict(plan.notes))


def segments(layers: Sequence[Layer]) -> list[tuple[int, int]]:
    """``(start, stop)`` of each maximal run of layers sharing a segment number."""
    runs: list[tuple[int, int]] = []
    for i, layer in enumerate(layers):
        if i == 0 or layer.segment != layers[i - 1].segment:
            runs.append((i, i + 1))
        else:
            runs[-1] = (runs[-1][0], i + 1)
    return runs


def keep_epilogues(plan: Plan, layers: Sequence[Layer]) -> Plan:
    """``plan`` with every boundary that falls before an epilogue
    (:mod:`onnxmlu.analyze.epilogues`) moved past its chain into the block before, when both
    blocks run at one precision (a block the move empties is dropped); ``notes`` counts the
    moves. An epilogue sits in its producer's segment, so the blocks stay inside theirs. A plan
    of single-layer blocks (the no-fusion baselines, [DLFusion] Table III 1-3) is the
    layer-by-layer reference and stays as it is."""
    if all(b.size == 1 for b in plan.blocks):
        return plan
    blocks, moved, k = list(plan.blocks), 0, 1
    while k < len(blocks):
        before, after = blocks[k - 1], blocks[k]
        stop = after.start
        while stop < after.stop and layers[stop].epilogue:
            stop += 1
        if stop == after.start or before.precision != after.precision:
            k += 1
            continue
        moved += 1
        blocks[k - 1] = replace(before, stop=stop)
        if stop == after.stop:
            del blocks[k]
        else:
            blocks[k] = replace(after, start=stop)
    if not moved:
        return plan
    return Plan(tuple(blocks), plan.strategy, plan.hardware, dict(plan.notes, epilogue_boundaries_moved=moved))


def split_oversized_blocks(plan: Plan, layers: Sequence[Layer], limit_bytes: int) -> Plan:
    """Split every block whose layers' weights sum above ``limit_bytes`` into consecutive
    sub-blocks with the same MP, each as long as the limit allows.

    A block's body is one protobuf message with its weights inside, so it must stay under
    2 GB serialized; a single layer above the limit stays alone in its block (collapse then
    reports it). Plans that need no split are returned unchanged.
    """
    blocks: list[Block] = []
    for block in plan.blocks:
        start, weight = block.start, 0
        for i in range(block.start, block.stop):
            w = layers[i].weight_bytes
            if i > start and w > 0 and weight + w > limit_bytes:  # weightless layers stay with their producer
                blocks.append(Block(start, i, block.mp, block.precision))
                start, weight = i, 0
            weight += w
        blocks.append(Block(start, block.stop, block.mp, block.precision))
    if len(blocks) == len(plan.blocks):
        return plan
    return Plan(tuple(blocks), plan.strategy, plan.hardware, dict(plan.notes))


def _check_block(i: int, block: Block, expected: int, layers: Sequence[Layer], cores: int) -> None:
    if block.start != expected:
        kind = "overlaps the previous block" if block.start < expected else "leaves a gap"
        raise PlanError(f"block {i} starts at layer {block.start}: it {kind} (expected {expected})")
    if block.stop <= block.start:
        raise PlanError(f"block {i} is empty or reversed ({block.start}..{block.stop})")
    if block.stop > len(layers):
        raise PlanError(f"block {i} ends at layer {block.stop} but the model has {plural(len(layers), 'layer')}")
    if not 1 <= block.mp <= cores:
        raise PlanError(f"block {i} has mp={block.mp}; it must be within 1..{cores}")
    _check_block_precision(i, block.precision)
    seg = layers[block.start].segment
    for layer in layers[block.start : block.stop]:
        if layer.segment != seg:
            raise PlanError(
                f"block {i} spans host nodes between layers {layers[block.start].name!r} and "
                f"{layer.name!r}; a block must be a contiguous run of accelerator layers"
            )


def _block_from_dict(i: int, entry: Any, layers: Sequence[Layer] | None) -> Block:
    if not isinstance(entry, dict):
        raise PlanError(f"block {i} is not an object")
    try:
        block = Block(int(entry["start"]), int(entry["stop"]), int(entry["mp"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"block {i} needs integer \"start\", \"stop\" and \"mp\" ({exc})") from None
    if "precision" in entry:
        block = Block(block.start, block.stop, block.mp, _check_block_precision(i, entry["precision"]))
    if layers is not None:
        _check_names(i, block, entry, layers)
    return block


def _check_names(i: int, block: Block, entry: dict, layers: Sequence[Layer]) -> None:
    for key, index in (("first", block.start), ("last", block.stop - 1)):
        name = entry.get(key)
        if name is None:
            continue
        actual = layers[index].name if 0 <= index < len(layers) else None
        if name != actual:
            raise PlanError(f"block {i}: {key} layer is {actual!r} in this model, plan says {name!r}")


def _check_block_precision(i: int, precision: object) -> str:
    try:
        return check_precision(precision, f"block {i}'s precision")
    except OnnxMluError as exc:
        raise PlanError(str(exc)) from None
