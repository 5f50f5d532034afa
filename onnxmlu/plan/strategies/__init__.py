"""Fusion / MP strategies: functions ``(layers, hardware, cost) -> Plan``.

``cost(block_layers, mp)`` is the performance model's latency (µs) of one block run at ``mp``
cores; strategies never import the model directly, so users can pass any cost function.
The registry is explicit (:data:`STRATEGIES`, an :class:`~onnxmlu.registry.Registry`):
:func:`register` rejects duplicate names, and :func:`run_strategy` is the one way a strategy
runs (the pipeline's plan stage uses it too).

Built-in strategies ([DLFusion] Table III, plus the exact optimum):

=================  ============================================================
``none``           1: no fusion, MP = 1                          (basic.py)
``fixed-mp``       2: no fusion, the best single MP              (basic.py)
``dynamic-mp``     3: no fusion, each layer at its best MP       (basic.py)
``all-fusion``     4: one block per segment, MP = cores          (basic.py)
``fusion-fixed-mp``5: Algorithm 1 blocks, the best single MP     (dlfusion.py)
``dlfusion``       6: Algorithm 1 blocks and Eq. 5 MPs           (dlfusion.py)
``oracle``         7: reduced brute force (MP subset, blocks of 4) (search.py)
``optimal``        exact minimum under the model, by DP          (search.py)
=================  ============================================================

``oracle`` and ``optimal`` search blocks of at most 256 layers plus whole segments (linear in
the graph; on every zoo model the result equals the unbounded search).  The bound is their
``max_block_layers`` keyword (0: none) or the profile's ``"search_max_block_layers"``; see
:mod:`onnxmlu.plan.strategies.search`.

Writing your own ([Paleozoic]: "set MP and fusion yourself")::

    from onnxmlu.plan.strategies import register, run_strategy
    from onnxmlu.plan.plan import plan_from_ranges

    def pairs(layers, hw, cost):          # fuse layers two by two at 8 cores
        n = len(layers)
        return plan_from_ranges([(i, min(i + 2, n), 8) for i in range(0, n, 2)])

    register("pairs", pairs)              # then --strategy pairs, or:
    plan = run_strategy(layers, hw, pairs)   # a callable works directly

(``pairs`` ignores segments; :func:`run_strategy` validates and says which block is wrong.)
"""

from __future__ import annotations

from typing import Callable, Sequence

from onnxmlu.errors import OnnxMluError
from onnxmlu.plan.perf.hardware import Hardware
from onnxmlu.plan.perf.layers import Layer
from onnxmlu.plan.plan import Plan
from onnxmlu.plan.strategies import basic, dlfusion, search
from onnxmlu.plan.strategies.search import takes_keyword
from onnxmlu.registry import Registry
from onnxmlu.plan.perf.model import make_cost

CostFn = Callable[[Sequence[Layer], int], float]
Strategy = Callable[[Sequence[Layer], Hardware, CostFn], Plan]

#: name -> strategy: [DLFusion] Table III order, then ours, then what users register.
STRATEGIES: Registry[Strategy] = Registry("strategy", [
    ("none", basic.no_fusion), ("fixed-mp", basic.fixed_mp), ("dynamic-mp", basic.dynamic_mp),
    ("all-fusion", basic.all_fusion), ("fusion-fixed-mp", dlfusion.fusion_fixed_mp),
    ("dlfusion", dlfusion.dlfusion), ("oracle", search.oracle), ("optimal", search.optimal)])
BUILTIN_ORDER = STRATEGIES.names()


def register(name: str, strategy: Strategy) -> None:
    if not callable(strategy):
        raise TypeError(f"strategy {name!r} must be callable (layers, hw, cost) -> Plan")
    STRATEGIES.register(name, strategy)


def get_strategy(name: str) -> Strategy:
    return STRATEGIES.get(name)


def strategy_names() -> list[str]:
    return list(STRATEGIES)


def resolve_strategy(strategy: str | Strategy) -> tuple[str, Strategy]:
    """``(name, fn)`` for a registered name or a callable (named after its ``__name__``)."""
    if callable(strategy):
        return getattr(strategy, "__name__", "custom"), strategy
    return strategy, get_strategy(strategy)


def run_strategy(layers: Sequence[Layer], hw: Hardware, strategy: str | Strategy = "dlfusion",
                 cost: CostFn | None = None, progress: Callable[[int, int], None] | None = None) -> Plan:
    """Run a strategy (name or callable) with the model of ``hw`` and validate its plan.

    The plan's ``strategy``/``hardware`` fields are filled in when the strategy left them
    empty or default; an invalid plan raises :class:`~onnxmlu.errors.PlanError`. No layers,
    no blocks: the strategy is not called. ``progress(done, total)`` is handed to a strategy
    that takes a ``progress`` keyword (the searches count the blocks they price).
    """
    name, fn = resolve_strategy(strategy)
    if not layers:
        return Plan((), name, hw.name)
    counts = {"progress": progress} if progress is not None and takes_keyword(fn, "progress") else {}
    plan = fn(layers, hw, cost if cost is not None else make_cost(hw), **counts)
    if not isinstance(plan, Plan):
        raise OnnxMluError(f"strategy {name!r} returned {type(plan).__name__}, not a Plan")
    plan.validate(layers, hw.cores)
    if plan.strategy in ("", "custom") or not plan.hardware:
        plan = Plan(plan.blocks, plan.strategy if plan.strategy not in ("", "custom") else name,
                    plan.hardware or hw.name, plan.notes)
    return plan
