"""Strategies without search: the paper's baseline (1) and all-fusion (4).

* ``none`` (Table III, 1): every layer is its own block at MP = 1.
* ``all-fusion`` (Table III, 4): every segment (maximal run of accelerator layers) is one
  block at the maximal MP.
"""

from __future__ import annotations

from typing import Sequence

from onnxmlu.partition.plan import Block, Plan, segments
from onnxmlu.perf.hardware import Hardware
from onnxmlu.perf.layers import Layer


def no_fusion(layers: Sequence[Layer], hw: Hardware, cost=None) -> Plan:
    return Plan(tuple(Block(i, i + 1, 1) for i in range(len(layers))), "none", hw.name)


def all_fusion(layers: Sequence[Layer], hw: Hardware, cost=None) -> Plan:
    blocks = tuple(Block(s, e, hw.cores) for s, e in segments(layers))
    return Plan(blocks, "all-fusion", hw.name)


BUILTINS = {"none": no_fusion, "all-fusion": all_fusion}
