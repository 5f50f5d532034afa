"""Strategies without fusion search: [DLFusion] Table III, strategies 1-4.

* ``none`` (1): every layer is its own block at MP = 1.
* ``fixed-mp`` (2): no fusion; one MP for every layer -- the one that minimises the model's
  total latency ([DLFusion] Fig. 5a sweep).
* ``dynamic-mp`` (3): no fusion; each layer at its own best MP under the model.
* ``all-fusion`` (4): every segment (maximal run of accelerator layers) is one block at the
  maximal MP.

Each records what it chose in ``Plan.notes``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from onnxmlu.plan.plan import Block, Plan, segments
from onnxmlu.plan.perf.hardware import Hardware
from onnxmlu.plan.perf.layers import Layer


def no_fusion(layers: Sequence[Layer], hw: Hardware, cost=None) -> Plan:
    return Plan(tuple(Block(i, i + 1, 1) for i in range(len(layers))), "none", hw.name)


def all_fusion(layers: Sequence[Layer], hw: Hardware, cost=None) -> Plan:
    blocks = tuple(Block(s, e, hw.cores) for s, e in segments(layers))
    return Plan(blocks, "all-fusion", hw.name)


def fixed_mp(layers: Sequence[Layer], hw: Hardware, cost) -> Plan:
    mps = hw.mp_choices()
    table = _single_layer_table(layers, mps, cost)
    totals = {m: float(table[:, k].sum()) for k, m in enumerate(mps)}
    mp = min(totals, key=lambda m: (totals[m], m))
    blocks = tuple(Block(i, i + 1, mp) for i in range(len(layers)))
    return Plan(blocks, "fixed-mp", hw.name, {"mp": mp, "latency_by_mp": totals})


def dynamic_mp(layers: Sequence[Layer], hw: Hardware, cost) -> Plan:
    mps = hw.mp_choices()
    table = _single_layer_table(layers, mps, cost)
    blocks = tuple(Block(i, i + 1, mps[int(np.argmin(table[i]))]) for i in range(len(layers)))
    return Plan(blocks, "dynamic-mp", hw.name)


def _single_layer_table(layers: Sequence[Layer], mps: Sequence[int], cost) -> np.ndarray:
    """``[layer, mp]`` latencies of one-layer blocks: the model's fast path when it has one."""
    fast = getattr(cost, "layer_table", None)
    if fast is not None:
        return fast(layers, mps)
    return np.array([[cost([layer], m) for m in mps] for layer in layers]).reshape(len(layers), len(mps))


def best_single_mp(blocks: Sequence[Block], layers: Sequence[Layer], hw: Hardware,
                   cost) -> tuple[int, dict[int, float]]:
    """The one MP that minimises the summed latency of ``blocks`` (ties: fewer cores)."""
    mps = hw.mp_choices()
    batch = getattr(cost, "block_latencies", None)  # the model prices every block x MP at once
    if batch is not None:
        table = batch(layers, [(b.start, b.stop) for b in blocks], mps)
        totals = {m: float(table[:, k].sum()) for k, m in enumerate(mps)}
    else:
        totals = {m: sum(cost(b.layers(layers), m) for b in blocks) for m in mps}
    return min(totals, key=lambda m: (totals[m], m)), totals
