"""[DLFusion] Algorithm 1 (Table III, strategies 5 and 6).

Per-layer MP ([DLFusion] Eq. 5).  The paper only states ``MP ∝ α·log2(C) + β·log2(OpCount)``
with α and β given (``eq5_alpha``, ``eq5_beta``).  To land in ``[1, cores]`` it needs a unit and an offset::

    log2 MP = clip(round(α·log2(C) + β·log2(ops / unit) − b), 0, ⌊log2 cores⌋)

with ``C`` the layer's output channels (the partitioned dimension), ``ops`` its 2·MAC count
(grouped convs counted dense where the profile says the hardware runs them so, as Table II
counts MobileNet), ``unit`` = 10^6 ops (``eq5_ops_unit``) and ``b`` the profile's
``eq5_offset`` (the mlu100 value, in :class:`~onnxmlu.plan.perf.hardware.PerfParams`, gives
ResNet's 0.23 G-op 3x3 convs 8 cores, VGG-19's 3.7 G-op ones 32, MobileNet's 1x1 convs 4-8).
``round`` is half-up.  Eq. 5 is applied to Conv and FC layers only, as Algorithm 1 does.

Algorithm 1.  Walk the layers in order; every Conv/FC layer adds its op count to
``sum_Op`` and its Eq. 5 MP to the block's MPs.  Once the ops per core,
``sum_Op / avg_mp``, reach ``OpCount_critical`` the block is full.  The printed pseudo-code
divides ``avg_mp`` by ``block_size`` on *every* iteration (line 11) -- after a few layers
that is no longer an average.  We implement the intent stated in the text: ``avg_mp`` is
the mean Eq. 5 MP of the block's Conv/FC layers, and the block's MP is that mean rounded
down to a power of two (line 14).

Two further choices, both about where a cut falls:

* a full block is closed just before the next Conv/FC layer, so the BN, activation,
  residual Add and pooling that follow a convolution stay with it (the paper fuses on a
  graph in which those are separate CNML operators too);
* blocks never span two segments (host nodes in between); a segment's last block is closed
  even if it is not full.  A block without any Conv/FC layer runs at MP 1.

``OpCount_critical``: the paper's ``10^1.25 GOPs`` cannot be a per-core count in the units of
its own Table II (ResNet-18 totals 3.38 GOPs, so nothing would ever be cut and every network
would be one block).  Read as a per-core count it is of the order of the performance model's
efficiency knee (``critical_mops_per_core``), the count a core needs to
reach its peak -- which is what the paper says the parameter means.  The threshold is the
profile's ``algorithm1_critical_mops_per_core`` (for mlu100 10^2.26 MOPs, a little under the
knee because the block then runs at its mean MP rounded *down*).
"""

from __future__ import annotations

import math
from typing import Sequence

from onnxmlu.plan.plan import Block, Plan, segments
from onnxmlu.plan.perf.hardware import Hardware
from onnxmlu.plan.perf.layers import Layer
from onnxmlu.plan.strategies.basic import best_single_mp

WEIGHTED_KINDS = frozenset({"conv", "fc"})

def opcount_critical(hw: Hardware) -> float:
    """Algorithm 1's threshold, in ops (2·MAC) per core."""
    return float(hw.model.algorithm1_critical_mops_per_core) * 1e6


def op_count(layer: Layer, hw: Hardware) -> float:
    """The op count Algorithm 1 sees: Eq. 1-2, grouped convs as dense where the profile
    says the hardware runs them so (``dense_grouped_conv``, as [DLFusion] Table II counts)."""
    if layer.kind == "conv" and hw.model.grouped_conv_as_dense:
        return layer.ops * max(layer.groups, 1)
    return layer.ops


def layer_mp(layer: Layer, hw: Hardware) -> int:
    """Eq. 5: a Conv/FC layer's preferred MP from its channels and op count (power of two)."""
    p = hw.model
    ops = max(op_count(layer, hw) / p.eq5_ops_unit, 1e-9)
    x = p.eq5_alpha * math.log2(max(layer.out_channels, 1)) + p.eq5_beta * math.log2(ops) - p.eq5_offset
    top = int(math.floor(math.log2(hw.cores)))
    return 2 ** min(max(int(math.floor(x + 0.5)), 0), top)


def _mean_mp(mp_sum: int, count: int) -> int:
    if not count:
        return 1
    return 2 ** int(math.floor(math.log2(mp_sum / count)))


def algorithm1(layers: Sequence[Layer], hw: Hardware) -> list[Block]:
    """Algorithm 1's fusion blocks, each with its power-of-two MP.

    The block's MPs are kept as a running sum and count (``avg_mp = mp_sum / count``), so
    the walk is linear even when a segment never fills a block (tiny layers)."""
    critical = opcount_critical(hw)
    blocks: list[Block] = []
    for seg_start, seg_stop in segments(layers):
        start, ops, mp_sum, count = seg_start, 0.0, 0, 0
        for i in range(seg_start, seg_stop):
            layer = layers[i]
            if layer.kind not in WEIGHTED_KINDS:
                continue
            if count and ops / (mp_sum / count) >= critical:
                blocks.append(Block(start, i, _mean_mp(mp_sum, count)))
                start, ops, mp_sum, count = i, 0.0, 0, 0
            ops += op_count(layer, hw)
            mp_sum, count = mp_sum + layer_mp(layer, hw), count + 1
        blocks.append(Block(start, seg_stop, _mean_mp(mp_sum, count)))
    return blocks


def dlfusion(layers: Sequence[Layer], hw: Hardware, cost=None) -> Plan:
    """Strategy 6: Algorithm 1's blocks, each at its own Eq. 5 MP (no cost model needed)."""
    blocks = tuple(Block(b.start, b.stop, min(b.mp, hw.cores)) for b in algorithm1(layers, hw))
    notes = {"opcount_critical_mops_per_core": opcount_critical(hw) / 1e6}
    return Plan(blocks, "dlfusion", hw.name, notes)


def fusion_fixed_mp(layers: Sequence[Layer], hw: Hardware, cost) -> Plan:
    """Strategy 5: Algorithm 1's blocks, all at the single MP that the model finds best."""
    blocks = algorithm1(layers, hw)
    mp, totals = best_single_mp(blocks, layers, hw, cost)
    plan_blocks = tuple(Block(b.start, b.stop, mp) for b in blocks)
    return Plan(plan_blocks, "fusion-fixed-mp", hw.name, {"mp": mp, "latency_by_mp": totals})
