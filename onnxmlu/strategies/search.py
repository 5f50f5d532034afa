"""Search strategies: the paper's reduced brute force (``oracle``) and the exact optimum.

Latency under the model is a sum over blocks, and a block's latency depends only on its own
layers and MP.  So the best plan is a shortest path over cut positions: with ``lat[i, j]`` the
least latency of block ``[i, j)`` over the allowed MPs,
``best[j] = min_i best[i] + lat[i, j]`` -- O(n^2) block evaluations instead of the paper's
Eq. 4 count of partitions x MPs (8e75 for 50 layers).

* ``optimal``: every contiguous partition within each segment x every MP in 1..cores.  Exact
  under the model; no block-length bound.  With the model's own cost function
  (:class:`~onnxmlu.perf.model.ModelCost`) all ``lat[i, j]`` come from one vectorised sweep
  (ResNet-50, 282 layers x 32 MPs: ~0.25 s); with any other cost function it calls
  ``cost(block, mp)`` for every block and MP (O(n^2 · cores) calls).
* ``oracle`` (Table III, 7): the paper's reduced brute force, solved exactly by the same DP:
  MP in {1, 2, 4, 8, 12, 16, 24, 32} (clipped to the core count) and block sizes that are
  multiples of 4 -- cuts only at every fourth layer of a segment, whose last block may be
  shorter.  Its search space is a subset of ``optimal``'s, so ``optimal <= oracle``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from onnxmlu.partition.plan import Block, Plan, segments
from onnxmlu.perf.hardware import Hardware
from onnxmlu.perf.layers import Layer

ORACLE_MPS = (1, 2, 4, 8, 12, 16, 24, 32)
ORACLE_GRANULE = 4


def optimal(layers: Sequence[Layer], hw: Hardware, cost) -> Plan:
    mps = hw.mp_choices()
    lat, arg = block_table(layers, mps, cost)
    return _plan(_shortest_path(lat, None), arg, "optimal", hw)


def oracle(layers: Sequence[Layer], hw: Hardware, cost) -> Plan:
    mps = sorted({min(m, hw.cores) for m in ORACLE_MPS})
    lat, arg = block_table(layers, mps, cost)
    return _plan(_shortest_path(lat, _oracle_cuts(layers)), arg, "oracle", hw)


def block_table(layers: Sequence[Layer], mps: Sequence[int], cost) -> tuple[np.ndarray, np.ndarray]:
    """``(lat, mp)`` arrays ``[n, n+1]`` for every block inside a segment (else ``inf``)."""
    fast = getattr(cost, "block_table", None)
    if fast is not None:
        return fast(layers, mps)
    n = len(layers)
    lat, arg = np.full((n, n + 1), np.inf), np.zeros((n, n + 1), dtype=int)
    for s, e in segments(layers):
        for i in range(s, e):
            for j in range(i + 1, e + 1):
                block = layers[i:j]
                times = [cost(block, m) for m in mps]
                k = int(np.argmin(times))
                lat[i, j], arg[i, j] = times[k], mps[k]
    return lat, arg


def _oracle_cuts(layers: Sequence[Layer]) -> np.ndarray:
    """Positions where the oracle may cut: every 4th layer of a segment and segment ends."""
    allowed = np.zeros(len(layers) + 1, dtype=bool)
    for s, e in segments(layers):
        allowed[s:e:ORACLE_GRANULE] = True
        allowed[e] = True
    return allowed


def _shortest_path(lat: np.ndarray, allowed: np.ndarray | None) -> list[int]:
    """Cut positions 0 = c0 < c1 < ... = n minimising the summed block latency."""
    n = lat.shape[0]
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    prev = np.zeros(n + 1, dtype=int)
    for j in range(1, n + 1):
        if allowed is not None and not allowed[j]:
            continue
        cand = best[:j] + lat[:j, j]
        i = int(np.argmin(cand))
        best[j], prev[j] = cand[i], i
    cuts = [n]
    while cuts[-1] > 0:
        cuts.append(int(prev[cuts[-1]]))
    return cuts[::-1]


def _plan(cuts: list[int], arg: np.ndarray, name: str, hw: Hardware) -> Plan:
    blocks = tuple(Block(i, j, int(arg[i, j])) for i, j in zip(cuts, cuts[1:]))
    return Plan(blocks, name, hw.name)


BUILTINS = {"oracle": oracle, "optimal": optimal}
