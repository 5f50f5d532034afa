"""Search strategies: the reduced brute force of [DLFusion] (``oracle``) and the exact optimum.

Latency under the model is a sum over blocks, and a block's latency depends only on its own
layers and MP.  So the best plan is a shortest path over cut positions: with ``lat[i, j]`` the
least latency of block ``[i, j)`` over the allowed MPs,
``best[j] = min_i best[i] + lat[i, j]`` -- instead of [DLFusion] Eq. 4's count of
partitions x MPs (8e75 for 50 layers).

Block-length bound.  Pricing every block is O(n^2) blocks (a 5k-node graph took minutes), so
both searches consider blocks of at most ``L = max_block_layers`` layers, **plus every
segment fused whole** (all-fusion's blocks, so the search is never worse than ``all-fusion``):
``best[j] = min(min_{j-L <= i < j} best[i] + lat[i, j], best[s] + lat[s, e] if j = e)`` for
the segment ``[s, e)`` ending at ``j``.  That is O(n * L) blocks, linear in the graph.
``L`` is, in order: the strategy's ``max_block_layers`` keyword, the hardware profile's
``"search_max_block_layers"``, whose default (:data:`DEFAULT_MAX_BLOCK_LAYERS`) is 256; ``0`` removes the
bound (the exact optimum over all partitions).  Why 256: the model strongly favours long
blocks (every block pays the pipeline fill, ~210 µs on mlu100), and the longest blocks of the
unbounded optimum on the zoo are 155-170 layers (ResNet-50, MobileNetV2; on both profiles,
for ``optimal`` and ``oracle``) or a whole segment (the LSTM, 624 layers) -- with L = 256
both searches return exactly the unbounded result on every zoo model
(``tests/strategies/test_search_bound.py``), while L = 32 would cost ResNet-50 15 %.
Blocks longer than L that are not whole segments are the only ones never considered.

* ``optimal``: every contiguous partition within each segment (blocks as above) x every MP
  in 1..cores.  Exact under the model within the bound.  With the model's own cost function
  (:class:`~onnxmlu.plan.perf.model.ModelCost`) the blocks come from vectorised sweeps in which
  repeated windows of layers are priced once; with any other cost function it calls
  ``cost(block, mp)`` for every block and MP (O(n · L · cores) calls).
* ``oracle`` ([DLFusion] Table III, 7): the paper's reduced brute force, solved exactly by the same DP:
  MP in {1, 2, 4, 8, 12, 16, 24, 32} (clipped to the core count) and block sizes that are
  multiples of 4 -- cuts only at every fourth layer of a segment, whose last block may be
  shorter.  Its search space is a subset of ``optimal``'s (same bound), so
  ``optimal <= oracle``.

Progress.  Both take a ``progress(done, total)`` callback (:func:`run_strategy` hands it to a
strategy that has the keyword): the blocks priced so far of all the band's blocks,
``sum_j (j - lo_j)`` over the stops -- pricing is where the time goes.
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import numpy as np

from onnxmlu.plan.plan import Block, Plan, segments
from onnxmlu.plan.perf.hardware import Hardware, PerfParams
from onnxmlu.plan.perf.layers import Layer

ORACLE_MPS = (1, 2, 4, 8, 12, 16, 24, 32)
ORACLE_GRANULE = 4
#: Longest block (in layers) the searches consider, besides whole segments (see above).
DEFAULT_MAX_BLOCK_LAYERS = PerfParams().search_max_block_layers


#: ``progress(done, total)``: blocks priced so far, of how many (module docstring).
Progress = Callable[[int, int], None]


def optimal(layers: Sequence[Layer], hw: Hardware, cost, *,
            max_block_layers: int | None = None, progress: Progress | None = None) -> Plan:
    """The least-latency plan: blocks of at most ``max_block_layers`` layers or whole
    segments, each at its best MP in 1..cores (module docstring)."""
    bound = max_block_length(hw, max_block_layers)
    return _search(layers, hw, cost, hw.mp_choices(), bound, None, "optimal", progress)


def oracle(layers: Sequence[Layer], hw: Hardware, cost, *,
           max_block_layers: int | None = None, progress: Progress | None = None) -> Plan:
    """The paper's reduced brute force: MPs in :data:`ORACLE_MPS`, blocks of 4k layers."""
    bound = max_block_length(hw, max_block_layers)
    mps = sorted({min(m, hw.cores) for m in ORACLE_MPS})
    return _search(layers, hw, cost, mps, bound, _oracle_cuts(layers), "oracle", progress)


def takes_keyword(fn: Callable, name: str) -> bool:
    """Whether ``fn`` accepts the keyword ``name`` (a strategy that counts: ``progress``)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature takes no keywords of ours
        return False
    return name in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def max_block_length(hw: Hardware, max_block_layers: int | None = None) -> int | None:
    """The bound L: the argument, else the profile's ``search_max_block_layers``, else the
    default; None when it is 0 (no bound)."""
    if max_block_layers is None:
        max_block_layers = hw.model.search_max_block_layers
    bound = int(max_block_layers)
    if bound < 0:
        raise ValueError(f"max_block_layers must be >= 0 (0: no bound), not {bound}")
    return bound or None


def _search(layers, hw, cost, mps, bound, allowed, name, progress: Progress | None = None) -> Plan:
    n = len(layers)
    stops = [j for j in range(1, n + 1) if allowed is None or allowed[j]]
    band = block_band(layers, mps, cost, bound, stops, progress)
    whole = whole_segments(layers, mps, cost, bound)
    blocks = _shortest_path(band, whole, stops, n)
    return Plan(blocks, name, hw.name, {"max_block_layers": bound or 0})


def block_band(layers: Sequence[Layer], mps: Sequence[int], cost, bound: int | None,
               stops: Sequence[int], progress: Progress | None = None):
    """Per stop ``j``: ``column(j) -> (lo, lat, mp)`` for the blocks ``[i, j)``, ``lo <= i``."""
    fast = getattr(cost, "band_table", None)
    if fast is not None:
        counts = progress is not None and takes_keyword(fast, "progress")
        return fast(layers, mps, bound, stops, **({"progress": progress} if counts else {}))
    return _CallBand(layers, mps, cost, bound, stops, progress)


class _CallBand:
    """The band of any cost function, by calling it for every block and MP (each column as
    the shortest path asks for it; ``progress`` counts its blocks)."""

    def __init__(self, layers, mps, cost, bound, stops=(), progress: Progress | None = None):
        self.layers, self.mps, self.cost, self.bound = layers, list(mps), cost, bound
        self.seg_start = {}
        for s, e in segments(layers):
            self.seg_start.update({j: s for j in range(s + 1, e + 1)})
        self.progress, self.done = progress, 0
        self.blocks = sum(stop - self._lo(stop) for stop in stops)

    def _lo(self, stop: int) -> int:
        return self.seg_start[stop] if self.bound is None else max(self.seg_start[stop], stop - self.bound)

    def column(self, stop: int):
        lo = self._lo(stop)
        times = np.array([[self.cost(self.layers[i:stop], m) for m in self.mps] for i in range(lo, stop)])
        k = np.argmin(times, axis=1)
        self.done += stop - lo
        if self.progress is not None:
            self.progress(self.done, self.blocks)
        return lo, times[np.arange(len(k)), k], np.asarray(self.mps)[k]


def whole_segments(layers, mps, cost, bound) -> dict[int, tuple[int, float, int]]:
    """``{stop: (start, latency, mp)}`` for each segment longer than the bound, fused whole."""
    long = [(s, e) for s, e in segments(layers) if bound is not None and e - s > bound]
    if not long:
        return {}
    batch = getattr(cost, "block_latencies", None)
    if batch is not None:
        table = batch(layers, long, mps)
    else:
        table = np.array([[cost(layers[s:e], m) for m in mps] for s, e in long])
    return {e: (s, float(row.min()), int(mps[int(np.argmin(row))])) for (s, e), row in zip(long, table)}


def _oracle_cuts(layers: Sequence[Layer]) -> np.ndarray:
    """Positions where the oracle may cut: every 4th layer of a segment and segment ends."""
    allowed = np.zeros(len(layers) + 1, dtype=bool)
    for s, e in segments(layers):
        allowed[s:e:ORACLE_GRANULE] = True
        allowed[e] = True
    return allowed


def _shortest_path(band, whole: dict, stops: Sequence[int], n: int) -> tuple[Block, ...]:
    """Blocks ``[c_k, c_k+1)`` with 0 = c_0 < ... = n minimising the summed latency.

    Cut positions that are not stops keep ``best = inf``, so no block starts there.  Ties go
    to the earliest start (the longest block)."""
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    prev, mp = np.zeros(n + 1, dtype=np.int64), np.zeros(n + 1, dtype=np.int64)
    for j in stops:
        lo, lat, mps = band.column(j)
        cand = best[lo:j] + lat
        k = int(np.argmin(cand))
        best[j], prev[j], mp[j] = cand[k], lo + k, mps[k]
        if j in whole:
            s, latency, m = whole[j]
            if best[s] + latency <= best[j]:
                best[j], prev[j], mp[j] = best[s] + latency, s, m
    blocks, j = [], n
    while j > 0:
        blocks.append(Block(int(prev[j]), j, int(mp[j])))
        j = int(prev[j])
    return tuple(blocks[::-1])
