"""Analytical performance model of the simulated accelerator: latency of one block at one MP.

Pure arithmetic over frozen dataclasses (:class:`~onnxmlu.plan.perf.layers.Layer`,
:class:`~onnxmlu.plan.perf.hardware.Hardware`); no onnx import.  One parameter set -- the
``"model"`` dict of the hardware profile -- serves every network; nothing here knows which
network a layer comes from.

Units
-----
``Layer.ops`` counts operations as [DLFusion] Eq. 1-2 do: 2 x MAC.  Rates are per
microsecond: a core of P TFLOPS runs ``P * 1e6`` ops/µs, a link of B GB/s moves ``B * 1e3``
bytes/µs.  "MOPs" means 10^6 such operations.  (The paper's Table II totals are
2 x MAC / 2^30 -- ResNet-18 3.38, ResNet-50 7.62 -- while its section IV.B figures
"1.72 / 0.43 GOPs" for {512,512,28x28} / {512,512,14x14} are MAC / 2^30.)

The block model
---------------
A block (a contiguous run of layers) runs on ``m`` cores, all its layers at the same ``m``
(so a block whose layers want very different MPs pays for it, [DLFusion] Fig. 8b).  The
cores form ``g_c`` channel groups x ``g_s = a x b`` spatial tiles; the model prices every
factorisation of ``m`` and keeps the fastest, as a compiler would.

1. **Work per core.**  Channel groups split each layer's output channels ``C`` (a conv's
   output channels, an FC's output features, an element-wise layer's channels).  A core's
   slice is never below the partition granule ``G`` (``channel_granule``, [DLFusion] Fig. 6a):
   its share of the layer is ``max(C/g_c, min(C, G)) / C`` -- 8 groups on a 64-channel layer
   with G = 40 do 40/64 of the layer each, not 1/8.  The floor holds inside fused blocks too
   (without it the optimiser exploits narrow layers).  Spatial tiles split each output map
   into an ``a x b`` grid; inside a fused block a tile is computed end to end, so every
   layer's tile grows by the receptive field of the fused layers after it (halo
   recomputation, Fig. 7a).  For layer ``l`` of a block that ends at layer ``j`` the extra rows
   are ``need_l = H_l * sum_{l<q<=j} max(0, k_q - s_q) / H_{q-1}`` (each later conv/pool of
   kernel k, stride s widens its input tile by k - s rows at its input resolution); a tile
   has ``ceil(H/a) + need * (a-1)/a`` rows on average (a-1 cuts), at most H, so the
   redundancy is ``rho = a * rows / H`` per dimension.  A layer followed in its block by one
   that needs the whole map (FC, global pool, softmax) is computed whole by every tile
   (rho = a).  Layers are taken as a chain in topological order.  Grouped convolutions run
   as dense ones with block-diagonal weights (``grouped_conv_as_dense``: MLU100's CNML had no
   depthwise kernel, which is also how [DLFusion] Table II counts MobileNet at 10.33 GOPs --
   0.56 with groups).

2. **Compute.**  ``w`` = a core's operations over the block (redundancy included) and
   ``t_c = smax(w_mat, W_crit) / P + w_vec / P`` where ``w_mat`` is the conv/FC (matrix
   engine) part, ``w_vec`` the rest and ``smax(x, y) = (x^k + y^k)^(1/k)`` a smooth maximum
   (``knee_sharpness`` k).  So the efficiency ``e(w) = w / smax(w, W_crit)`` rises with the
   operations per core and saturates at the critical count ``W_crit``
   (``critical_mops_per_core``, Fig. 3-4): a block's pipeline needs about ``W_crit`` of work
   per core to fill, whatever the number of layers in it (fusion's first benefit).  The
   fill is paid once per block; each layer is charged its share ``w_l / P``.

3. **Memory** (roofline).  A layer reads its weights -- every spatial tile reads its channel
   group's weights, so weights are read ``g_s`` times (times the granule's padding) -- and a
   block reads its external inputs (the first layer's input, each tile its rows plus halo;
   later layers' inputs that do not come from their predecessor, e.g. a residual skip) and
   writes its last output.  Intermediate maps stay on chip (fusion's second benefit) except
   that channel groups exchange every map a channel-mixing layer reads through DRAM (written
   and read once).  Bandwidth is shared and one core alone cannot saturate it:
   ``BW(m) = min(dram_gbps, m * core_dram_gbps)`` (what makes AlexNet's 240 MB of FC weights
   slow at MP = 1).

4. **Overlap, overheads.**  Each layer overlaps its compute with its traffic only partly:
   ``t_l = max(c_l, d_l) + theta * min(c_l, d_l)`` (``overlap_theta``); with perfect overlap
   the optimiser fuses convolutions into FC layers just to hide them under the weight stream.
   A block costs ``launch_us + layer_us * layers + core_sync_us * (m - 1) + fill + sum t_l``:
   a launch, a per-layer issue/barrier cost, and dispatch/join over ``m`` cores -- with the
   efficiency knee this is why too many cores hurt a small layer (Fig. 4c, 5a). The
   QuantizeLinear/DequantizeLinear nodes of a model that arrives in QDQ form are folded into
   the INT8 layers beside them (:func:`folded_qdq`): no operations and no issue slot, so a QDQ
   model is priced as the INT8 layers it describes.
   The roofline holds: ``t >= ops / (m * P)`` and ``t >= weight bytes / dram_gbps``.

5. **Precision** (docs/precision.md).  Each layer is priced at its own precision
   (:meth:`~onnxmlu.plan.perf.layers.Layer.at_precision`; a block's layers share one).  Its
   feature maps and weights are already at that element size -- 4, 2 or 1 bytes -- so every
   byte term above follows: weights re-read by tiles, external inputs, exchanged maps, the
   block's output, the on-chip working set.  Its operations run at the profile's peak for that
   precision ``P_p`` (``peak_tflops_fp16_per_core``, ``peak_tops_int8_per_core``; 2 and 4
   TOPS for mlu100, [DLFusion] Table I), matrix and vector layers alike: the speed-up is
   ``s = P_p / P``.  The knee is a pipeline depth, that is a time, so it does not move: work
   enters the smooth maximum in FP32-equivalent operations ``w / s``.  A layer far above the
   knee runs ``s`` times faster; a small one gains less, its time being mostly fill.  Blocks
   read and write their maps at their own element size (a neighbour at another precision
   converts on its store, at no cost).  No new parameter: ``s`` comes from the datasheet.
   FP32 layers have ``s = 1`` and unchanged bytes, so FP32 prices are exactly the calibrated
   ones.  A layer that arrives quantized (``Layer.quantized``: a ``QLinearConv``, a QDQ
   unit) is INT8 as analysed and at every precision asked, so it is priced at INT8 wherever
   it is.  ``BlockEstimate.onchip_bytes`` is the largest per-core working set of a layer (its
   channel group's weights, its input and output tiles with their halo); no profile states
   an on-chip capacity, so it is reported, not charged.

Calibration (``mlu100``) and ``OpCount_critical``
-------------------------------------------------
One parameter set, fitted with ``scripts/calibrate_model.py`` against the findings of
``tests/perf/test_paper_findings.py`` ([DLFusion] Section III and Fig. 10): the best fixed MP
is ~4 for ResNet-18 and ~16 for VGG-19; the best fusion depth among 16 identical convs shrinks
as the layer grows; DLFusion beats strategies 1-3, ties 4-5, is 3.6-7.9x over no optimisation
and within 10 % of the optimum.  The knee and the per-core dispatch cost
place the best MP of a single layer (ResNet-18's 0.23 G-op convs vs VGG-19's 3.7 G-op ones);
granule, halo and weight re-reads bound how deep and how wide a fused block pays; the per-core
DRAM cap and the per-layer cost set how slow the unoptimised baseline is.  Margins near the
optimum are a few percent, as the paper's own are.  The values are the defaults of
:class:`~onnxmlu.plan.perf.hardware.PerfParams` (``onnxmlu hw show mlu100`` prints them): a
knee of some 10^2.3 MOPs per core, a granule of a few tens of channels, a launch cost plus a
per-layer and a per-extra-core cost, a per-core share of the DRAM, partial overlap, grouped
convs dense, and Eq. 5's offset and Algorithm 1's threshold.

The paper's ``OpCount_critical = 10^1.25 GOPs`` cannot be a per-core count in the units of
its Table II: ResNet-18 has 3.38 GOPs in total, so Algorithm 1 would never cut and every
network would be one block.  As a per-core knee it is of the order of 10^2 MOPs here (10^2.3,
i.e. ~10^2 M MAC), and Algorithm 1 uses it as its threshold (``strategies/dlfusion.py``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from onnxmlu.plan.perf.hardware import Hardware
from onnxmlu.plan.perf.layers import WHOLE_MAP_KINDS, Layer, layers_at_precision
from onnxmlu.precisions import DEFAULT_PRECISION, PRECISIONS

CostFn = Callable[[Sequence[Layer], int], float]

#: Kinds that slide a window over their input: they widen the tiles of earlier layers.
_WINDOW_KINDS = frozenset({"conv", "pool"})
#: Kinds that run on the matrix engine (through the efficiency knee) and mix channels.
_TENSOR_KINDS = frozenset({"conv", "fc"})

@dataclass(frozen=True)
class ModelParams:
    """The performance model's parameters, resolved from a hardware profile."""

    cores: int
    peak_ops_per_us: float        # per core
    dram_bytes_per_us: float      # whole chip
    core_dram_bytes_per_us: float
    critical_ops: float           # per core: the efficiency knee
    knee_sharpness: float
    channel_granule: float
    launch_us: float
    layer_us: float
    core_sync_us: float
    overlap_theta: float
    grouped_conv_as_dense: bool
    speedups: tuple[tuple[str, float], ...] = ()  # (precision, its peak / the FP32 peak)

    def speed(self, precision: str) -> float:
        """Peak at ``precision`` over the FP32 peak (1 for fp32)."""
        return dict(self.speedups)[precision]

    @classmethod
    def from_hardware(cls, hw: Hardware) -> "ModelParams":
        p = hw.model
        return cls(
            cores=hw.cores,
            peak_ops_per_us=hw.peak_per_core(DEFAULT_PRECISION) * 1e6,
            dram_bytes_per_us=hw.dram_gbps * 1e3,
            core_dram_bytes_per_us=float(p.core_dram_gbps) * 1e3,
            critical_ops=float(p.critical_mops_per_core) * 1e6,
            knee_sharpness=float(p.knee_sharpness),
            channel_granule=float(p.channel_granule),
            launch_us=float(p.launch_us),
            layer_us=float(p.layer_us),
            core_sync_us=float(p.core_sync_us),
            overlap_theta=float(p.overlap_theta),
            grouped_conv_as_dense=bool(p.grouped_conv_as_dense),
            speedups=tuple((p, hw.peak_per_core(p) / hw.peak_per_core(DEFAULT_PRECISION)) for p in PRECISIONS),
        )


@dataclass(frozen=True)
class BlockEstimate:
    """Breakdown of one block's simulated latency (µs) at one MP, for reports."""

    mp: int
    latency_us: float
    compute_us: float        # pipeline fill + every layer's compute
    memory_us: float         # every layer's DRAM traffic at the effective bandwidth
    overhead_us: float       # launch + per-layer issue + dispatch/join over the cores
    halo_us: float           # part of compute_us spent on redundant (halo, granule) work
    ops: float               # useful operations (as the hardware runs them)
    redundant_ops: float     # extra operations from halo recomputation and the granule floor
    dram_bytes: float        # including re-read weights and exchanged maps
    channel_groups: int
    tiles: tuple[int, int]
    precision: str = "fp32"  # of the block's layers
    onchip_bytes: float = 0.0  # the largest per-core working set of a layer (reported, not charged)

    @property
    def gops(self) -> float:
        return self.ops / 1e9


# ---------------------------------------------------------------------------------------
# Per-layer arrays and the factorisations of m


@dataclass(frozen=True)
class _Arrays:
    ops: np.ndarray
    tensor: np.ndarray       # 1.0 for conv/FC layers (matrix engine)
    mixes: np.ndarray        # 1.0 where every output channel reads every input channel
    chan: np.ndarray
    height: np.ndarray
    width: np.ndarray
    halo_h: np.ndarray       # max(0, k - s) / H_in of a window layer: how far it widens earlier tiles
    halo_w: np.ndarray
    whole: np.ndarray        # 1.0 for a whole-map consumer
    ext_in: np.ndarray       # bytes a layer reads from outside when not first in its block
    first_in: np.ndarray     # bytes a layer reads when it opens a block
    out: np.ndarray
    weights: np.ndarray
    segment: np.ndarray
    speed: np.ndarray        # peak at the layer's precision over the FP32 peak
    issue: np.ndarray        # 1: a layer the part issues; 0: a QDQ pair folded into its neighbours

    def row_ids(self) -> np.ndarray:
        """One integer per layer, equal for layers whose pricing inputs are all equal: a
        block's prices depend only on its layers' ids, so repeated windows are priced once."""
        rows = np.stack([self.ops, self.tensor, self.mixes, self.chan, self.height, self.width,
                         self.halo_h, self.halo_w, self.whole, self.ext_in, self.first_in,
                         self.out, self.weights, self.speed, self.issue], axis=1)
        return np.unique(rows, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _arrays(layers: Sequence[Layer], p: ModelParams) -> _Arrays:
    n = len(layers)
    f = lambda attr: np.array([float(getattr(l, attr)) for l in layers], dtype=float)  # noqa: E731
    height, width = np.maximum(f("out_height"), 1.0), np.maximum(f("out_width"), 1.0)
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
    mixes = np.array([1.0 if l.kind == "fc" or (l.kind == "conv" and l.groups == 1) else 0.0
                      for l in layers])
    dense = np.array([float(max(l.groups, 1)) if l.kind == "conv" and p.grouped_conv_as_dense
                      else 1.0 for l in layers])
    issue = np.array([0.0 if folded_qdq(l) else 1.0 for l in layers]).reshape(n)
    return _Arrays(
        issue=issue,
        ops=f("ops") * dense * issue, tensor=tensor, mixes=mixes, chan=np.maximum(f("out_channels"), 1.0),
        height=height, width=width, halo_h=hh, halo_w=hw_, whole=whole, ext_in=ext,
        first_in=inp, out=out, weights=f("weight_bytes") * dense,
        segment=np.array([l.segment for l in layers], dtype=np.int64).reshape(n),
        speed=np.array([p.speed(l.precision) for l in layers], dtype=float).reshape(n),
    )


#: Activation quantize / dequantize nodes of a model that arrives quantized (QDQ format).
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


def folded_qdq(layer: Layer) -> bool:
    """Whether ``layer`` is a QuantizeLinear/DequantizeLinear of a QDQ model: the part folds it
    into the INT8 layer next to it (requantization in the accumulator's epilogue, dequantization
    in the next layer's input scale), so it is priced at nothing -- no operations, no issue slot.
    Its bytes stay: a pair at a block boundary is where the INT8 map is written and read."""
    return layer.quantized and layer.op_type in QDQ_OPS


def _grid(tiles: int) -> tuple[int, int]:
    """The squarest a x b = tiles grid, a >= b."""
    b = int(math.isqrt(tiles))
    while tiles % b:
        b -= 1
    return tiles // b, b


@functools.lru_cache(maxsize=64)
def _factorisations(mps: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """Columns (mp index, m, g_c, a, b) of every g_c * a * b = m for m in mps, grouped by mp."""
    rows = []
    for k, m in enumerate(mps):
        for gc in range(1, m + 1):
            if m % gc == 0:
                a, b = _grid(m // gc)
                rows.append((k, m, gc, a, b))
    arr = np.array(rows, dtype=float)
    return tuple(arr[:, c] for c in range(5))


# ---------------------------------------------------------------------------------------
# The vectorised core: windows of layers [lo, stop), every start i in [lo, stop), every
# factorisation.  ``idx`` is a [B, W] array of layer indices, each row one window.


@dataclass(frozen=True)
class _Terms:
    """Axes: window, block start within the window, factorisation of every requested mp."""

    total: np.ndarray
    compute: np.ndarray
    memory: np.ndarray
    overhead: np.ndarray
    plain_compute: np.ndarray    # compute without redundancy
    work: np.ndarray             # operations per core, redundancy included
    dram: np.ndarray
    fac: tuple[np.ndarray, ...]
    #: Per layer, for the block that starts its window: compute, traffic time, time, bytes.
    layers: tuple[np.ndarray, ...] = ()


def _suffix(x: np.ndarray) -> np.ndarray:
    """Along axis 1, entry i: the sum of entries i.. (a block starting at i ending at the window's end)."""
    return np.cumsum(x[:, ::-1], axis=1)[:, ::-1]


def _after(x: np.ndarray) -> np.ndarray:
    """Along axis 1, entry i: the sum of entries after i (exclusive suffix sum)."""
    s = np.zeros_like(x)
    s[:, :-1] = _suffix(x[:, 1:])
    return s


def _total(x: np.ndarray) -> np.ndarray:
    """Along axis 1, the whole sum (kept as one entry): the block that starts the window."""
    return x.sum(axis=1, keepdims=True)


def _terms(a: _Arrays, idx: np.ndarray, mps: tuple[int, ...], p: ModelParams,
           every_start: bool = True) -> _Terms:
    """Latency terms of the blocks ``[lo + w, stop)`` of each window -- every start ``w``, or
    only ``w = 0`` (one block per window: linear instead of a suffix sweep)."""
    S = _suffix if every_start else _total  # noqa: N806 - sum over the block's layers
    H = (lambda x: x) if every_start else (lambda x: x[:, :1])  # noqa: E731,N806 - its first layer
    fac = _factorisations(mps)
    _, m, gc, ta, tb = fac
    col = lambda x: x[idx][..., None]  # noqa: E731 - per-layer value, broadcast over factorisations
    rho = _redundancy(a, idx, ta, tb)
    chan = col(a.chan)
    share = np.maximum(chan / gc, np.minimum(chan, p.channel_granule)) / chan
    ops, tensor, speed = col(a.ops), col(a.tensor), col(a.speed)
    per_core = ops * share / (ta * tb) * rho
    eff = per_core / speed  # FP32-equivalent work: the knee is a time (x / 1.0 is x for FP32)
    mat = S(eff * tensor)
    fill, c_l = (_knee(mat, p) - mat) / p.peak_ops_per_us, eff / p.peak_ops_per_us
    # traffic of each layer: weights (re-read by every tile), what it reads from outside,
    # the maps channel groups exchange; the first layer reads its input, the last writes
    bw = np.minimum(p.dram_bytes_per_us, m * p.core_dram_bytes_per_us)
    w_l = col(a.weights) * share * gc * (ta * tb)
    xchg = col(2.0 * a.mixes * np.maximum(a.first_in - a.ext_in, 0.0)) * (gc > 1)
    out_l = np.zeros(idx.shape + (1,))
    out_l[:, -1, 0] = a.out[idx[:, -1]]
    mid_b = w_l + col(a.ext_in) + xchg + out_l
    first_b = w_l + col(a.first_in) * rho + out_l
    d_mid, d_first = mid_b / bw, first_b / bw
    th = p.overlap_theta
    t_mid = np.maximum(c_l, d_mid) + th * np.minimum(c_l, d_mid)
    t_first = np.maximum(c_l, d_first) + th * np.minimum(c_l, d_first)
    n_layers = S(col(a.issue))  # layers issued: a folded QDQ pair costs no issue slot
    overhead = p.launch_us + p.layer_us * n_layers + p.core_sync_us * (m - 1.0)
    total = overhead + fill + S(t_mid) - H(t_mid) + H(t_first)
    compute = fill + S(c_l)
    plain = ops / m / speed
    plain_compute = (_knee(S(plain * tensor), p) + S(plain * (1.0 - tensor))) / p.peak_ops_per_us
    dram = S(mid_b) - H(mid_b) + H(first_b)
    layers = () if every_start else _per_layer(c_l, (d_first, d_mid), (t_first, t_mid), (first_b, mid_b))
    return _Terms(total, compute, dram / bw, np.broadcast_to(overhead, total.shape),
                  np.broadcast_to(plain_compute, total.shape), S(per_core), dram, fac, layers)


def _per_layer(compute: np.ndarray, *first_or_later: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, ...]:
    """Per layer of a block that starts its window: compute, then each (first layer's, later
    layers') pair as one array -- the first layer reads the block's input, the others do not."""
    first = np.arange(compute.shape[1])[None, :, None] == 0
    return (compute, *(np.where(first, a, b) for a, b in first_or_later))


def _redundancy(a: _Arrays, idx: np.ndarray, ta: np.ndarray, tb: np.ndarray) -> np.ndarray:
    """rho_h * rho_w of every layer of each window for blocks ending at the window's end.

    The halo a layer pays is the sum of ``halo_h`` over the layers after it in the window,
    summed inside the window so that equal windows give bit-equal prices."""
    rel_h, rel_w = _after(a.halo_h[idx])[..., None], _after(a.halo_w[idx])[..., None]
    blocked = _after(a.whole[idx])[..., None] > 0
    return (_rho(rel_h, blocked, a.height[idx][..., None], ta)
            * _rho(rel_w, blocked, a.width[idx][..., None], tb))


def _rho(rel: np.ndarray, blocked: np.ndarray, size: np.ndarray, tiles: np.ndarray) -> np.ndarray:
    """Spatial redundancy: tiles x (rows per tile) / rows, rows per tile capped at the map."""
    rows = np.ceil(size / tiles) + np.where(blocked, size, rel * size) * (tiles - 1) / tiles
    return tiles * np.minimum(rows, size) / size


def _knee(work: np.ndarray, p: ModelParams) -> np.ndarray:
    """Matrix-engine time in op units: smax(work, critical); zero without matrix work."""
    k, y = p.knee_sharpness, p.critical_ops
    if y <= 0:
        return work
    with np.errstate(over="ignore"):
        return np.where(work > 0, y * np.power(1.0 + np.power(work / y, k), 1.0 / k), 0.0)


def _best_per_mp(values: np.ndarray, fac) -> np.ndarray:
    """Min over the factorisations of each mp (last axis of ``values``; grouped by mp)."""
    starts = np.flatnonzero(np.diff(fac[0], prepend=-1.0))
    return np.minimum.reduceat(values, starts, axis=-1)


#: Upper bound on the elements of one [windows, W, factorisations] sweep (memory, ~8 bytes
#: each times the ~20 temporaries of :func:`_terms`).
_SWEEP_ELEMENTS = 1 << 19


def _window_prices(a: _Arrays, idx: np.ndarray, mps: tuple[int, ...], p: ModelParams,
                   every_start: bool = True) -> np.ndarray:
    """``[B, W, len(mps)]``: latency of block [lo + w, stop) of every window row at each mp
    (``W = 1``, the block of the whole window, unless ``every_start``), in chunks of windows
    (and of mps for one long window) that bound memory."""
    n_fac = len(_factorisations(mps)[0])
    if idx.shape[1] * n_fac > _SWEEP_ELEMENTS and len(mps) > 1:  # one long window: mp by mp
        return np.concatenate([_window_prices(a, idx, (m,), p, every_start) for m in mps], axis=-1)
    step = max(1, _SWEEP_ELEMENTS // (idx.shape[1] * n_fac))
    parts = [_best_per_mp(_terms(a, idx[r:r + step], mps, p, every_start).total, _factorisations(mps))
             for r in range(0, idx.shape[0], step)]
    return np.concatenate(parts, axis=0)


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
    t = _terms(a, np.arange(len(layers))[None, :], (int(mp),), p, every_start=False)
    f = int(np.argmin(t.total[0, 0]))
    first = lambda x: float(x[0, 0, f])  # noqa: E731 - the block starting at the first layer
    ops = float(a.ops.sum())
    gc, ta, tb = (int(t.fac[k][f]) for k in (2, 3, 4))
    precisions = {layer.precision for layer in layers}
    return BlockEstimate(
        mp=int(mp), latency_us=first(t.total), compute_us=first(t.compute),
        memory_us=first(t.memory), overhead_us=first(t.overhead),
        halo_us=max(0.0, first(t.compute) - first(t.plain_compute)), ops=ops,
        redundant_ops=max(0.0, first(t.work) * mp - ops), dram_bytes=first(t.dram),
        channel_groups=gc, tiles=(ta, tb),
        precision=precisions.pop() if len(precisions) == 1 else "mixed",
        onchip_bytes=_onchip_bytes(a, p, gc, ta, tb),
    )


@dataclass(frozen=True)
class LayerEstimate:
    """One layer's share of its block's simulated latency (:func:`layer_estimates`)."""

    name: str
    op_type: str
    precision: str
    latency_us: float   # max(compute, memory) + theta * min(compute, memory): its share of the block
    compute_us: float   # its operations on its core (redundancy and granule included)
    memory_us: float    # its DRAM traffic at the block's bandwidth
    dram_bytes: float   # weights (re-read by every tile), what it reads from outside, exchanged maps, output

    @property
    def bound(self) -> str:
        """Which side of the roofline limits the layer: ``compute`` or ``memory``."""
        return "compute" if self.compute_us >= self.memory_us else "memory"


def layer_estimates(layers: Sequence[Layer], mp: int, hw: Hardware) -> list[LayerEstimate]:
    """Each layer of one block at ``mp`` (the factorisation :func:`block_estimate` picks):
    its time ``t_l``, compute ``c_l``, traffic ``d_l`` and bytes (module docstring, 2-4). The
    block's launch, issue, dispatch and pipeline fill are the block's, not a layer's: the
    layers' times sum to less than the block's latency by them."""
    if not layers:
        return []
    p = ModelParams.from_hardware(hw)
    t = _terms(_arrays(layers, p), np.arange(len(layers))[None, :], (int(mp),), p, every_start=False)
    f = int(np.argmin(t.total[0, 0]))
    compute, memory, time, moved = (x[0, :, f] if x.shape[-1] > 1 else x[0, :, 0] for x in t.layers)
    return [LayerEstimate(layer.name, layer.op_type, layer.precision, float(time[k]), float(compute[k]),
                          float(memory[k]), float(moved[k])) for k, layer in enumerate(layers)]


def _onchip_bytes(a: _Arrays, p: ModelParams, gc: int, ta: int, tb: int) -> float:
    """The largest working set one core holds for a layer of the block split into ``gc``
    channel groups x ``ta x tb`` tiles: its channel group's weights, its input tile (every
    channel) and its output tile (its group's channels), tiles grown by their halo."""
    n = len(a.ops)
    rho = _redundancy(a, np.arange(n)[None, :], np.array([float(ta)]), np.array([float(tb)]))[0, :, 0]
    share = np.maximum(a.chan / gc, np.minimum(a.chan, p.channel_granule)) / a.chan
    tiles = float(ta * tb)
    working = a.weights * share + a.first_in * rho / tiles + a.out * share * rho / tiles
    return float(working.max())


@dataclass(frozen=True)
class BlockBand:
    """The least latency over the MPs of every block ``[i, j)`` with ``lo[j] <= i < j``.

    ``column(j)`` gives ``(lo, lat, mp)``: ``lat[i - lo]`` is block ``[i, j)``'s latency at its
    best MP ``mp[i - lo]``.  Columns whose windows hold equal layers share one array.
    """

    lo: np.ndarray
    col: np.ndarray              # per stop: index into lats / mps, -1 where not computed
    lats: tuple[np.ndarray, ...]
    mps: tuple[np.ndarray, ...]

    def column(self, stop: int) -> tuple[int, np.ndarray, np.ndarray]:
        u = int(self.col[stop])
        if u < 0:
            raise KeyError(f"column {stop} was not computed")
        return int(self.lo[stop]), self.lats[u], self.mps[u]


class ModelCost:
    """The model as a strategy cost function: ``cost(block_layers, mp) -> µs``.

    Besides the plain call it offers batch methods that price many blocks at every MP in
    vectorised sweeps: :meth:`band_table` (every block of at most ``max_len`` layers, what the
    search strategies use), :meth:`block_table` (its dense form), :meth:`block_latencies`
    (given blocks) and :meth:`layer_table` (one-layer blocks).  A block's price depends only
    on its own layers, so windows of equal layers (the repeated units of a deep network) are
    priced once.
    """

    def __init__(self, hw: Hardware) -> None:
        self.hw = hw
        self.params = ModelParams.from_hardware(hw)
        self._single = functools.lru_cache(maxsize=1 << 16)(self._latency)
        self._tables: dict[Any, Any] = {}

    def __call__(self, block_layers: Sequence[Layer], mp: int) -> float:
        return self._single(tuple(block_layers), int(mp))

    def _latency(self, block_layers: tuple[Layer, ...], mp: int) -> float:
        return block_latency_us(block_layers, mp, self.hw)

    def band_table(self, layers: Sequence[Layer], mps: Sequence[int], max_len: int | None = None,
                   stops: Sequence[int] | None = None, progress=None) -> BlockBand:
        """Every block ``[i, j)`` inside a segment with ``j - i <= max_len`` (None: no bound),
        for each stop ``j`` in ``stops`` (default ``1..n``).  Cost: O(n * max_len * F) for
        F ~ the factorisations of the MPs (119 for 1..32), less where windows repeat.
        ``progress(done, total)``: the distinct blocks priced so far, of how many."""
        a = _arrays(layers, self.params)
        n = len(layers)
        stops = range(1, n + 1) if stops is None else stops
        seg_start = _segment_starts(a.segment)
        lo, col = np.zeros(n + 1, dtype=np.int64), np.full(n + 1, -1, dtype=np.int64)
        for j in stops:
            lo[j] = seg_start[j - 1] if max_len is None else max(seg_start[j - 1], j - max_len)
        windows = [(int(lo[j]), int(j)) for j in stops]
        uid, prices = self._unique_prices(a, windows, tuple(mps), progress=progress)
        col[np.asarray(list(stops), dtype=np.int64)] = uid
        mp_arr = np.asarray(mps, dtype=np.int64)
        best = [np.argmin(p, axis=1) for p in prices]
        lats = tuple(p[np.arange(len(k)), k] for p, k in zip(prices, best))
        return BlockBand(lo, col, lats, tuple(mp_arr[k] for k in best))

    def block_table(self, layers: Sequence[Layer], mps: Sequence[int],
                    max_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(lat, mp)``, both ``[n, n+1]``: for block ``[i, j)`` its least latency over
        ``mps`` and the MP achieving it.  Blocks spanning two segments (or longer than
        ``max_len``) get ``inf``.  Quadratic memory: for small graphs and tests."""
        n = len(layers)
        band = self.band_table(layers, mps, max_len)
        lat, arg = np.full((n, n + 1), np.inf), np.zeros((n, n + 1), dtype=int)
        for j in range(1, n + 1):
            lo, l_col, m_col = band.column(j)
            lat[lo:j, j], arg[lo:j, j] = l_col, m_col
        return lat, arg

    def block_latencies(self, layers: Sequence[Layer], blocks: Sequence[tuple[int, int]],
                        mps: Sequence[int]) -> np.ndarray:
        """``[len(blocks), len(mps)]``: the latency of each block ``(start, stop)`` of
        ``layers`` at each MP, equal to ``cost(layers[start:stop], m)``."""
        a = _arrays(layers, self.params)
        uid, prices = self._unique_prices(a, [(int(s), int(e)) for s, e in blocks], tuple(mps),
                                          every_start=False)
        rows = np.array([p[0] for p in prices]).reshape(len(prices), len(mps))
        return rows[uid] if len(uid) else np.zeros((0, len(mps)))

    def layer_table(self, layers: Sequence[Layer], mps: Sequence[int]) -> np.ndarray:
        """``[n, len(mps)]``: the latency of every layer as a block of its own at each MP
        (what the no-fusion strategies need)."""
        return self.block_latencies(layers, [(j, j + 1) for j in range(len(layers))], mps)

    def _unique_prices(self, a: _Arrays, windows: list[tuple[int, int]], mps: tuple[int, ...],
                       every_start: bool = True, progress=None):
        """Price each distinct window once: ``(uid per window, [W, len(mps)] per unique)``;
        ``progress(done, total)`` counts blocks (a window of width w holds w of them)."""
        ids = a.row_ids()
        keys: dict[bytes, int] = {}
        uid = np.empty(len(windows), dtype=np.int64)
        first: list[tuple[int, int]] = []
        for w, (s, e) in enumerate(windows):
            u = keys.setdefault(ids[s:e].tobytes(), len(first))
            if u == len(first):
                first.append((s, e))
            uid[w] = u
        prices: list[np.ndarray | None] = [None] * len(first)
        by_len: dict[int, list[int]] = {}
        for u, (s, e) in enumerate(first):
            by_len.setdefault(e - s, []).append(u)
        total, done = sum(width * len(us) for width, us in by_len.items()), 0
        for width, us in by_len.items():
            idx = np.array([first[u][0] for u in us], dtype=np.int64)[:, None] + np.arange(width)
            for u, p in zip(us, _window_prices(a, idx, mps, self.params, every_start)):
                prices[u] = p
            done += width * len(us)
            if progress is not None:
                progress(done, total)
        return uid, prices


def _segment_starts(segment: np.ndarray) -> np.ndarray:
    """For each layer, the index of the first layer of its segment."""
    n = len(segment)
    new = np.ones(n, dtype=bool)
    new[1:] = segment[1:] != segment[:-1]
    return np.maximum.accumulate(np.where(new, np.arange(n), 0))


def make_cost(hw: Hardware) -> ModelCost:
    """The performance model of ``hw`` as a cost function for strategies."""
    return ModelCost(hw)


def spatial_redundancy(layers: Sequence[Layer], tiles: tuple[int, int]) -> list[float]:
    """Each layer's halo factor rho (work done / work needed) when ``layers`` form one block
    split into ``tiles = (a, b)`` spatial tiles -- the halo mechanism on its own."""
    a = _arrays(layers, ModelParams.from_hardware(_NO_HW))
    ta, tb = np.array([float(tiles[0])]), np.array([float(tiles[1])])
    return [float(r) for r in _redundancy(a, np.arange(len(layers))[None, :], ta, tb)[0, :, 0]]


_NO_HW = Hardware(name="any", cores=1, peaks={p: 1.0 for p in PRECISIONS}, dram_gbps=1.0, frequency_ghz=1.0,
                  model={"grouped_conv_as_dense": 0})


def plan_latency_us(plan, layers: Sequence[Layer], hw: Hardware, cost: CostFn | None = None) -> float:
    """Simulated latency (µs) of a whole plan: blocks run one after another."""
    cost = cost or make_cost(hw)
    return float(sum(plan_block_latencies_us(plan, layers, cost)))


def _block_precision(block) -> str:
    return getattr(block, "precision", DEFAULT_PRECISION)


def _at_precisions(plan, layers: Sequence[Layer]) -> dict[str, Sequence[Layer]]:
    """``layers`` at each precision the plan's blocks use (the FP32 list itself for fp32)."""
    return {p: layers if p == DEFAULT_PRECISION else layers_at_precision(layers, p)
            for p in {_block_precision(b) for b in plan.blocks}}


def plan_block_latencies_us(plan, layers: Sequence[Layer], cost: CostFn) -> list[float]:
    """Each block's latency (µs) at its own MP and precision, in plan order: equal to
    ``[cost(layers_at_precision(b.layers(layers), b.precision), b.mp) for b in plan.blocks]``,
    batched by MP and precision when the cost function can (linear in the graph instead of one
    model evaluation per block). ``layers`` are the analysed (FP32) layers."""
    blocks = plan.blocks
    at = _at_precisions(plan, layers)
    batch = getattr(cost, "block_latencies", None)
    if batch is None:
        return [cost(b.layers(at[_block_precision(b)]), b.mp) for b in blocks]
    prices = [0.0] * len(blocks)
    for precision, mp in sorted({(_block_precision(b), b.mp) for b in blocks}):
        chosen = [k for k, b in enumerate(blocks) if b.mp == mp and _block_precision(b) == precision]
        column = batch(at[precision], [(blocks[k].start, blocks[k].stop) for k in chosen], [mp])[:, 0]
        for k, value in zip(chosen, column):
            prices[k] = float(value)
    return prices


def plan_estimates(plan, layers: Sequence[Layer], hw: Hardware) -> list[BlockEstimate]:
    """One :class:`BlockEstimate` per block of ``plan``, each at its MP and precision (for
    block tables and fused nodes); ``layers`` are the analysed (FP32) layers."""
    at = _at_precisions(plan, layers)
    return [block_estimate(b.layers(at[_block_precision(b)]), b.mp, hw) for b in plan.blocks]
