"""Fusion / MP strategies: functions ``(layers, hardware, cost) -> Plan``.

``cost(block_layers, mp)`` is the performance model's latency (µs) of one block run at ``mp``
cores; strategies never import the model directly, so users can pass any cost function.
The registry is explicit: :func:`register` rejects duplicate names, nothing runs at import.
"""

from __future__ import annotations

from typing import Callable, Sequence

from onnxmlu.errors import OnnxMluError
from onnxmlu.partition.plan import Plan
from onnxmlu.perf.hardware import Hardware
from onnxmlu.perf.layers import Layer

CostFn = Callable[[Sequence[Layer], int], float]
Strategy = Callable[[Sequence[Layer], Hardware, CostFn], Plan]

_REGISTRY: dict[str, Strategy] = {}


def register(name: str, strategy: Strategy) -> None:
    if name in _REGISTRY:
        raise ValueError(f"strategy {name!r} is already registered")
    _REGISTRY[name] = strategy


def get_strategy(name: str) -> Strategy:
    _ensure_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(strategy_names())
        raise OnnxMluError(f"unknown strategy {name!r} (known: {known})") from None


def strategy_names() -> list[str]:
    _ensure_builtins()
    return list(_REGISTRY)


def _ensure_builtins() -> None:
    if _REGISTRY:
        return
    from onnxmlu.strategies import basic

    for name, fn in basic.BUILTINS.items():
        register(name, fn)
