"""Analytical performance model of the simulated accelerator: latency of one block at one MP.

Pure arithmetic over frozen dataclasses (:class:`~onnxmlu.perf.layers.Layer`,
:class:`~onnxmlu.perf.hardware.Hardware`); no onnx import.  One parameter set -- the
``"model"`` dict of the hardware profile -- serves every network; nothing here knows which
network a layer comes from.

Units
-----
``Layer.ops`` counts operations as DLFusion Eq. 1-2 do: 2 x MAC.  Rates are per
microsecond: a core of P TFLOPS runs ``P * 1e6`` ops/us; a link of B GB/s moves
``B * 1e3`` bytes/us.  "MOPs" below means 10^6 such operations.  (The paper's Table II
totals are 2 x MAC / 2^30 -- ResNet-18 3.38, ResNet-50 7.62 -- while its section IV.B figures
"1.72 / 0.43 GOPs" for {512,512,28x28} / {512,512,14x14} are MAC / 2^30.)

The block model
---------------
A block ``B`` (a contiguous run of layers) runs on ``m`` cores, all its layers at the same
``m`` (DLFusion Fig. 8b: a block whose layers want very different MPs pays for it).  The
``m`` cores are arranged as ``g_c`` channel groups x ``g_s = a x b`` spatial tiles; the model
evaluates every factorisation of ``m`` and keeps the fastest (a compiler would).

* **Channel groups** split each layer's output channels ``C`` (``out_channels``: output
  channels of a conv, output features of an FC, the channels of an element-wise layer).  A
  core's slice is never smaller than the hardware's partition granule ``G``
  (``channel_granule``; DLFusion Fig. 6a): its share is ``max(C/g_c, min(C, G)) / C``, so a
  64-channel layer on 8 channel groups of a 64-channel granule does the work of the whole
  layer on every core.  The floor holds inside fused blocks too -- without it an optimiser
  would split narrow layers across cores for free.
* **Spatial tiles** split each output map into an ``a x b`` grid.  Inside a fused block a
  tile is computed end to end without exchanging data, so every layer's tile must grow by the
  receptive field of the fused layers after it (halo recomputation, DLFusion Fig. 7a;
  Alwani et al.).  For layer ``l`` of a block ending at ``j`` the extra rows needed (in l's
  own resolution) are ``need_l = H_l * sum_{l<q<j} max(0, k_q - s_q) / H_in(q)`` -- each
  later conv/pool with kernel k and stride s widens its input tile by ``k - s`` rows at its
  input resolution ``H_in(q) = H_{q-1}``.  With ``a`` tiles, a tile has
  ``max(1, H/a) + need * (a-1)/a`` rows on average (the a-1 cuts each add ``need`` rows),
  capped at H; the redundancy factor is ``rho_h = a * rows / H`` (and likewise ``rho_w``).
  A layer followed, in the block, by a layer that needs the whole map (FC, global pool,
  softmax) gets ``need = inf``: each tile computes the whole map (rho = a).  Small maps also
  waste tiles (``max(1, H/a)``: a 7x7 map has at most 7 tile rows).  Layers are taken as a
  chain in topological order (a residual branch is assumed to need the halo of the longer
  path -- a slight overestimate).
* **Per-core efficiency** (DLFusion Fig. 3-4).  A core's work is
  ``w = sum_l ops_l * rho_h * rho_w * share_l / m`` and it takes
  ``t_c = smax(w, W_crit) / P`` with ``smax(x, y) = (x^k + y^k)^(1/k)`` a smooth maximum
  (``knee_sharpness`` k).  Equivalently the efficiency ``e(w) = w / smax(w, W_crit)`` rises
  with the op count per core and saturates at the critical count ``W_crit``
  (``critical_mops_per_core``): a core needs about ``W_crit`` operations of work to fill its
  pipelines; below that, time barely shrinks with less work.  Fusion raises ``w`` (the
  paper's first benefit of fusion), more cores lower it.
* **Multi-core overhead.**  Dispatching a block to ``m`` cores and joining them costs
  ``core_sync_us * (m - 1)``; together with the efficiency knee this is why too many cores
  hurt a small layer (DLFusion Fig. 4c, 5a).  Every block also pays ``launch_us``.
* **Memory** (roofline).  A block reads its external inputs and its weights from DRAM and
  writes its output; intermediate maps stay on chip (fusion's second benefit).  External
  inputs are the first layer's inputs plus, for each later layer, whatever it reads beyond its
  predecessor's output (``max(0, input_bytes_l - output_bytes_{l-1})``: a residual Add's
  skip input, a downsample conv's block input).  DRAM bandwidth is shared, and one core
  alone cannot saturate it: ``BW_eff = min(dram_gbps, m * core_dram_gbps)``, so
  ``t_m = bytes / BW_eff`` (this per-core cap is what makes AlexNet's 240 MB of FC weights
  slow at MP = 1).
* **Overlap.**  Compute and memory overlap only partly:
  ``t = launch + sync * (m-1) + max(t_c, t_m) + theta * min(t_c, t_m)`` (``overlap_theta``).
  With perfect overlap (theta = 0) the optimiser would fuse convolutions into FC layers just
  to hide their compute under the FC weight stream, which is not how the hardware behaves.
  ``t_c >= ops / (m * P)`` and ``t_m >= bytes / dram_gbps``: the roofline bounds hold.

Calibration (the ``mlu100`` profile)
------------------------------------
One parameter set, fitted by hand against DLFusion's findings (``tests/perf/
test_paper_findings.py``): best fixed MP ~4 for ResNet-18 and ~16 for VGG-19; the best
fusion block among 16 identical convs shrinks as the layer grows; DLFusion 3.6-7.9x over no
optimisation and within 10% of the optimum.  ``core_sync_us`` and ``critical_mops_per_core``
set where extra cores stop paying (ResNet-18's 0.23 G-op convs vs VGG-19's 3.7 G-op ones);
``channel_granule`` and the halo set how large a fused block may grow before redundant work
wins; ``core_dram_gbps`` sets the memory-bound baseline.  See the profile JSON for values.

The paper's ``OpCount_critical = 10^1.25 GOPs`` cannot be a per-core count in the units of
its own Table II: ResNet-18 has 3.38 GOPs in total, so at any MP Algorithm 1 would never cut
and every network would be one block.  The knee of Fig. 3/7c is a per-core quantity of tens
of MOPs (10^1.25..10^1.63 MOPs per core cuts the zoo networks into 2-16 blocks); the model
uses ``critical_mops_per_core`` both as its efficiency knee and as Algorithm 1's threshold.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from onnxmlu.perf.hardware import Hardware
from onnxmlu.perf.layers import WHOLE_MAP_KINDS, Layer

CostFn = Callable[[Sequence[Layer], int], float]

#: Kinds that slide a window over their input map: they widen the tiles of earlier layers.
_WINDOW_KINDS = frozenset({"conv", "pool"})
#: Kinds that run on the matrix engine and go through the efficiency knee.
_TENSOR_KINDS = frozenset({"conv", "fc"})

#: Defaults of the ``"model"`` parameters (the mlu100 profile states all of them).
DEFAULT_PARAMS: dict[str, float] = {
    "critical_mops_per_core": 40.0,
    "knee_sharpness": 2.0,
    "channel_granule": 64,
    "launch_us": 20.0,
    "layer_us": 0.0,
    "core_sync_us": 10.0,
    "reduction_granule": 1,
    "core_dram_gbps": 25.6,
    "overlap_theta": 0.3,
}


@dataclass(frozen=True)
class ModelParams:
    """The performance model's parameters, resolved from a hardware profile."""

    cores: int
    peak_ops_per_us: float       # per core
    dram_bytes_per_us: float     # whole chip
    core_dram_bytes_per_us: float
    critical_ops: float          # per core, the efficiency knee
    knee_sharpness: float
    channel_granule: int
    launch_us: float
    layer_us: float
    core_sync_us: float
    reduction_granule: int
    overlap_theta: float

    @classmethod
    def from_hardware(cls, hw: Hardware) -> "ModelParams":
        p = {**DEFAULT_PARAMS, **(hw.model or {})}
        return cls(
            cores=hw.cores,
            peak_ops_per_us=hw.peak_tflops_fp32_per_core * 1e6,
            dram_bytes_per_us=hw.dram_gbps * 1e3,
            core_dram_bytes_per_us=float(p["core_dram_gbps"]) * 1e3,
            critical_ops=float(p["critical_mops_per_core"]) * 1e6,
            knee_sharpness=float(p["knee_sharpness"]),
            channel_granule=int(p["channel_granule"]),
            launch_us=float(p["launch_us"]),
            layer_us=float(p["layer_us"]),
            core_sync_us=float(p["core_sync_us"]),
            reduction_granule=int(p["reduction_granule"]),
            overlap_theta=float(p["overlap_theta"]),
        )


@dataclass(frozen=True)
class BlockEstimate:
    """Breakdown of one block's simulated latency (µs) at one MP, for reports."""

    mp: int
    latency_us: float
    compute_us: float        # t_c: per-core work through the efficiency knee
    memory_us: float         # t_m: DRAM traffic at the effective bandwidth
    overhead_us: float       # launch + multi-core dispatch/join
    halo_us: float           # part of compute_us spent on redundant (halo/granule) work
    ops: float               # useful operations of the block
    redundant_ops: float     # extra operations from halo recomputation and the granule floor
    dram_bytes: float
    channel_groups: int
    tiles: tuple[int, int]

    @property
    def gops(self) -> float:
        return self.ops / 1e9


# ---------------------------------------------------------------------------------------
# Per-layer arrays and factorisations


@dataclass(frozen=True)
class _Arrays:
    ops: np.ndarray
    tensor: np.ndarray       # 1.0 for conv/FC layers (matrix engine), 0.0 otherwise
    chan: np.ndarray
    height: np.ndarray
    width: np.ndarray
    halo_h: np.ndarray       # prefix sums of max(0, k-s)/H_in over window layers
    halo_w: np.ndarray
    whole: np.ndarray        # prefix counts of whole-map consumers
    ext_in: np.ndarray       # bytes a layer reads from outside when not first in its block
    first_in: np.ndarray     # bytes a layer reads when it opens a block
    out: np.ndarray
    weights_cum: np.ndarray  # prefix sums of weight bytes (length n+1)
    ext_cum: np.ndarray      # prefix sums of ext_in (length n+1)
    segment: np.ndarray


def _arrays(layers: Sequence[Layer], p: "ModelParams") -> _Arrays:
    n = len(layers)
    f = lambda attr: np.array([float(getattr(l, attr)) for l in layers], dtype=float)  # noqa: E731
    height = np.maximum(f("out_height"), 1.0)
    width = np.maximum(f("out_width"), 1.0)
    hh, hw_, whole = np.zeros(n), np.zeros(n), np.zeros(n)
    for q in range(1, n):
        layer = layers[q]
        if layer.kind in _WINDOW_KINDS:
            hh[q] = max(0, layer.kernel[0] - layer.stride[0]) / height[q - 1]
            hw_[q] = max(0, layer.kernel[1] - layer.stride[1]) / width[q - 1]
        whole[q] = 1.0 if layer.kind in WHOLE_MAP_KINDS else 0.0
    inp, out = f("input_bytes"), f("output_bytes")
    ext = np.concatenate([[0.0], np.maximum(inp[1:] - out[:-1], 0.0)]) if n else inp
    tensor = np.array([1.0 if l.kind in _TENSOR_KINDS else 0.0 for l in layers])
    lanes = np.array([max(1, l.in_channels // max(l.groups, 1)) for l in layers], dtype=float)
    ops = f("ops") * np.where(tensor > 0, np.maximum(1.0, p.reduction_granule / lanes), 1.0)
    return _Arrays(
        ops=ops, tensor=tensor, chan=np.maximum(f("out_channels"), 1.0), height=height, width=width,
        halo_h=np.cumsum(hh), halo_w=np.cumsum(hw_), whole=np.cumsum(whole),
        ext_in=ext, first_in=inp, out=out,
        weights_cum=np.concatenate([[0.0], np.cumsum(f("weight_bytes"))]),
        ext_cum=np.concatenate([[0.0], np.cumsum(ext)]),
        segment=np.array([l.segment for l in layers]),
    )


def _grid(tiles: int) -> tuple[int, int]:
    """The squarest a x b = tiles grid, a >= b."""
    b = int(math.isqrt(tiles))
    while tiles % b:
        b -= 1
    return tiles // b, b


@functools.lru_cache(maxsize=64)
def _factorisations(mps: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """Every (m, g_c, a, b) with g_c * a * b = m for m in mps, plus each row's mp index."""
    rows = []
    for k, m in enumerate(mps):
        for gc in range(1, m + 1):
            if m % gc == 0:
                a, b = _grid(m // gc)
                rows.append((k, m, gc, a, b))
    arr = np.array(rows, dtype=float)
    return tuple(arr[:, c] for c in range(5))


# ---------------------------------------------------------------------------------------
# The vectorised core: every block ending at `stop` and starting in [lo, stop), every mp


@dataclass(frozen=True)
class _Terms:
    work: np.ndarray         # [starts, F] per-core matrix-engine work incl. redundancy
    vector: np.ndarray       # [starts, F] per-core vector work incl. redundancy
    useful: np.ndarray       # [starts, F] per-core work without spatial redundancy
    fac: tuple[np.ndarray, ...]


def _per_core_work(a: _Arrays, lo: int, stop: int, fac, p: ModelParams) -> _Terms:
    idx, m, gc, ta, tb = fac
    sl = slice(lo, stop)
    last = stop - 1
    # relative halo of each layer l: rows needed beyond its tile / H_l, up to the block end
    rel_h = (a.halo_h[last] - a.halo_h[sl])[:, None]
    rel_w = (a.halo_w[last] - a.halo_w[sl])[:, None]
    blocked = (a.whole[last] - a.whole[sl])[:, None] > 0
    rho_h = _rho(rel_h, blocked, a.height[sl][:, None], ta[None, :])
    rho_w = _rho(rel_w, blocked, a.width[sl][:, None], tb[None, :])
    chan = a.chan[sl][:, None]
    share = np.maximum(chan / gc[None, :], np.minimum(chan, p.channel_granule)) / chan
    base = a.ops[sl][:, None] * share / (ta * tb)[None, :]
    per_layer = base * rho_h * rho_w
    tensor = a.tensor[sl][:, None]
    # suffix sums over layers give, for each start i, the block [i, stop)
    work = _suffix(per_layer * tensor)
    vector = _suffix(per_layer * (1.0 - tensor))
    useful = _suffix(a.ops[sl][:, None] / m[None, :])
    return _Terms(work, vector, useful, fac)


def _suffix(x: np.ndarray) -> np.ndarray:
    return np.cumsum(x[::-1], axis=0)[::-1]


def _rho(rel: np.ndarray, blocked: np.ndarray, size: np.ndarray, tiles: np.ndarray) -> np.ndarray:
    """Spatial redundancy: tiles x (rows per tile) / rows, rows per tile capped at the map."""
    rows = np.maximum(1.0, size / tiles) + np.where(blocked, size, rel * size) * (tiles - 1) / tiles
    return tiles * np.minimum(rows, size) / size


def _smax(x: np.ndarray, y: float, k: float) -> np.ndarray:
    return y * np.power(1.0 + np.power(x / y, k), 1.0 / k) if y > 0 else x


def _latency_terms(a: _Arrays, lo: int, stop: int, mps: tuple[int, ...], p: ModelParams):
    """Latency [starts, len(mps)] of blocks [i, stop) for i in [lo, stop), plus the pieces."""
    fac = _factorisations(mps)
    terms = _per_core_work(a, lo, stop, fac, p)
    idx = fac[0].astype(int)
    # best factorisation per mp: the least per-core work (compute time is monotone in it)
    knee = np.where(terms.work > 0, _smax(terms.work, p.critical_ops, p.knee_sharpness), 0.0)
    t_all = (knee + terms.vector) / p.peak_ops_per_us
    t_c = np.full((stop - lo, len(mps)), np.inf)
    np.minimum.at(t_c.T, idx, t_all.T)
    best_work = t_all
    starts = np.arange(lo, stop)
    dram = (a.first_in[starts] + a.ext_cum[stop] - a.ext_cum[starts + 1]
            + a.weights_cum[stop] - a.weights_cum[starts] + a.out[stop - 1])
    mp = np.asarray(mps, dtype=float)
    bw = np.minimum(p.dram_bytes_per_us, mp * p.core_dram_bytes_per_us)
    t_m = dram[:, None] / bw[None, :]
    overhead = p.launch_us + p.core_sync_us * (mp - 1.0)
    layers_us = p.layer_us * (stop - starts)
    total = overhead[None, :] + layers_us[:, None] + np.maximum(t_c, t_m) + p.overlap_theta * np.minimum(t_c, t_m)
    return total, t_c, t_m, overhead, best_work, terms, dram


# ---------------------------------------------------------------------------------------
# Public API


def block_latency_us(layers: Sequence[Layer], mp: int, hw: Hardware) -> float:
    """Simulated latency (µs) of one block of ``layers`` run at ``mp`` cores."""
    return block_estimate(layers, mp, hw).latency_us


def block_estimate(layers: Sequence[Layer], mp: int, hw: Hardware) -> BlockEstimate:
    """The latency of one block at one MP with its breakdown (compute, memory, halo...)."""
    if not layers:
        raise ValueError("a block needs at least one layer")
    if not 1 <= mp <= hw.cores:
        raise ValueError(f"mp={mp} is outside 1..{hw.cores}")
    p = ModelParams.from_hardware(hw)
    a = _arrays(layers, p)
    n = len(layers)
    total, t_c, t_m, overhead, best_work, terms, dram = _latency_terms(a, 0, n, (mp,), p)
    fac = terms.fac
    f = int(np.argmin(best_work[0]))
    useful = terms.useful[0, 0]
    plain_tc = float(_smax(np.array(useful), p.critical_ops, p.knee_sharpness)) / p.peak_ops_per_us
    ops = float(a.ops.sum())
    return BlockEstimate(
        mp=mp, latency_us=float(total[0, 0]), compute_us=float(t_c[0, 0]),
        memory_us=float(t_m[0, 0]), overhead_us=float(overhead[0]),
        halo_us=max(0.0, float(t_c[0, 0]) - plain_tc), ops=ops,
        redundant_ops=max(0.0, float(terms.work[0, f] + terms.vector[0, f]) * mp - ops), dram_bytes=float(dram[0]),
        channel_groups=int(fac[2][f]), tiles=(int(fac[3][f]), int(fac[4][f])),
    )


class ModelCost:
    """The model as a strategy cost function: ``cost(block_layers, mp) -> µs``.

    Besides the plain call it offers :meth:`block_table`, the latency of every contiguous
    block of a layer list at its best MP, computed in one vectorised sweep -- what the
    exhaustive strategies (``oracle``, ``optimal``) use.  Results are cached (layers are
    frozen, hence hashable).
    """

    def __init__(self, hw: Hardware) -> None:
        self.hw = hw
        self.params = ModelParams.from_hardware(hw)
        self._single = functools.lru_cache(maxsize=1 << 16)(self._latency)
        self._tables: dict[Any, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, block_layers: Sequence[Layer], mp: int) -> float:
        return self._single(tuple(block_layers), int(mp))

    def _latency(self, block_layers: tuple[Layer, ...], mp: int) -> float:
        return block_latency_us(block_layers, mp, self.hw)

    def block_table(self, layers: Sequence[Layer], mps: Sequence[int],
                    max_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(lat, mp)``, each ``[n, n+1]``: for block ``[i, j)`` its least latency over
        ``mps`` and the MP that achieves it.  Blocks that would span two segments (or longer
        than ``max_len``) get ``inf``."""
        key = (tuple(layers), tuple(mps), max_len)
        if key not in self._tables:
            if len(self._tables) > 16:
                self._tables.clear()
            self._tables[key] = _block_table(layers, tuple(mps), max_len, self.params)
        return self._tables[key]


def _block_table(layers, mps, max_len, p: ModelParams):
    n = len(layers)
    a = _arrays(layers, p)
    lat = np.full((n, n + 1), np.inf)
    arg = np.zeros((n, n + 1), dtype=int)
    seg_start = _segment_starts(a.segment)
    mp_arr = np.asarray(mps, dtype=int)
    for stop in range(1, n + 1):
        lo = seg_start[stop - 1]
        if max_len is not None:
            lo = max(lo, stop - max_len)
        total = _latency_terms(a, lo, stop, mps, p)[0]
        k = np.argmin(total, axis=1)
        lat[lo:stop, stop] = total[np.arange(stop - lo), k]
        arg[lo:stop, stop] = mp_arr[k]
    return lat, arg


def _segment_starts(segment: np.ndarray) -> np.ndarray:
    starts = np.zeros(len(segment), dtype=int)
    for i in range(1, len(segment)):
        starts[i] = starts[i - 1] if segment[i] == segment[i - 1] else i
    return starts


def make_cost(hw: Hardware) -> ModelCost:
    """The performance model of ``hw`` as a cost function for strategies."""
    return ModelCost(hw)


def plan_latency_us(plan, layers: Sequence[Layer], hw: Hardware, cost: CostFn | None = None) -> float:
    """Simulated latency (µs) of a whole plan: blocks run one after another."""
    cost = cost or make_cost(hw)
    return float(sum(cost(b.layers(layers), b.mp) for b in plan.blocks))


def plan_estimates(plan, layers: Sequence[Layer], hw: Hardware) -> list[BlockEstimate]:
    """One :class:`BlockEstimate` per block of ``plan`` (for block tables and fused nodes)."""
    return [block_estimate(b.layers(layers), b.mp, hw) for b in plan.blocks]
