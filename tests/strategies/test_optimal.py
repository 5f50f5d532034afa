"""``optimal`` is exact (against enumeration), never worse than any other strategy, and every
strategy's plan is valid -- on random layer chains and on the zoo networks."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnxmlu.errors import OnnxMluError, PlanError
from onnxmlu.plan.plan import Block, Plan, plan_from_ranges, segments
from onnxmlu.plan.perf.hardware import load_hardware
from onnxmlu.plan.perf.layers import Layer
from onnxmlu.plan.perf.model import block_latency_us, make_cost, plan_latency_us
from onnxmlu.plan.strategies import (
    BUILTIN_ORDER,
    STRATEGIES,
    get_strategy,
    register,
    run_strategy,
    strategy_names,
)
from onnxmlu.plan.strategies.search import ORACLE_MPS, oracle, optimal

try:  # tests/ as rootdir-relative packages or as a package itself
    from perf.zoo_layers import CNN_NAMES, zoo_layers
except ImportError:  # pragma: no cover
    from tests.perf.zoo_layers import CNN_NAMES, zoo_layers

HW = load_hardware("mlu100")
EDGE = load_hardware("edge4")


# --- random layer chains -------------------------------------------------------------------


@st.composite
def layer_chains(draw, max_layers=10):
    n = draw(st.integers(1, max_layers))
    size = draw(st.sampled_from([7, 14, 28, 56]))
    channels = draw(st.sampled_from([16, 64, 256]))
    segment, layers = 0, []
    for i in range(n):
        kind = draw(st.sampled_from(["conv", "conv", "eltwise", "pool", "fc"]))
        if i and draw(st.integers(0, 9)) == 0:
            segment += 1  # a host node in between
        layers.append(_layer(i, kind, channels, size, segment, draw))
        if kind == "fc":
            size = 1
        if kind == "pool" and size > 1:
            size //= 2
    return layers


def _layer(i, kind, c, size, segment, draw) -> Layer:
    n = c * size * size
    if kind == "conv":
        k = draw(st.sampled_from([1, 3]))
        c_out = draw(st.sampled_from([16, 64, 256]))
        return Layer(i, f"conv{i}", "Conv", "conv", 2.0 * size * size * k * k * c * c_out, c, c_out,
                     size, size, (k, k), (1, 1), 1, 4 * n, 4 * c_out * size * size,
                     4 * k * k * c * c_out, segment)
    if kind == "fc":
        return Layer(i, f"fc{i}", "MatMul", "fc", 2.0 * n * 100, n, 100, 1, 1, (1, 1), (1, 1), 1,
                     4 * n, 400, 4 * n * 100, segment)
    if kind == "pool":
        out = max(size // 2, 1)
        return Layer(i, f"pool{i}", "MaxPool", "pool", 4.0 * c * out * out, c, c, out, out, (2, 2),
                     (2, 2), 1, 4 * n, 4 * c * out * out, 0, segment)
    return Layer(i, f"relu{i}", "Relu", "eltwise", float(n), c, c, size, size, (1, 1), (1, 1), 1,
                 4 * n, 4 * n, 0, segment)


def _fix_channels(layers):
    """Make each layer's channels/sizes consistent with its predecessor (for realism only)."""
    out = []
    for layer in layers:
        if out and layer.kind in ("eltwise", "pool"):
            prev = out[-1]
            c, h = prev.out_channels, prev.out_height
            layer = dataclasses.replace(layer, in_channels=c, out_channels=c,
                                        out_height=max(h // (2 if layer.kind == "pool" else 1), 1),
                                        out_width=max(h // (2 if layer.kind == "pool" else 1), 1))
        out.append(layer)
    return out


def exhaustive_latency(layers, hw, mps) -> float:
    """min over every contiguous partition (within segments) x every MP of every block.

    The enumeration is literal over partitions; over MPs it takes each block's minimum,
    which is the same as enumerating all MP tuples because latency is a sum over blocks.
    """
    n = len(layers)
    best = float("inf")
    block_min: dict[tuple[int, int], float] = {}  # memo: each block priced once
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        blocks = list(zip(bounds, bounds[1:]))
        if any(layers[s].segment != layers[e - 1].segment for s, e in blocks):
            continue
        for s, e in blocks:
            if (s, e) not in block_min:
                block_min[s, e] = min(block_latency_us(layers[s:e], m, hw) for m in mps)
        best = min(best, sum(block_min[b] for b in blocks))
    return best


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layer_chains(max_layers=10))
def test_optimal_equals_exhaustive_enumeration(layers):
    layers = _fix_channels(layers)
    plan = optimal(layers, HW, make_cost(HW))
    plan.validate(layers, HW.cores)
    got = plan_latency_us(plan, layers, HW)
    assert got == pytest.approx(exhaustive_latency(layers, HW, HW.mp_choices()), rel=1e-9)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layer_chains(max_layers=5))
def test_optimal_equals_literal_enumeration_of_mp_tuples(layers):
    """On the 4-core profile, enumerate every partition x every tuple of block MPs."""
    layers = _fix_channels(layers)
    n, best = len(layers), float("inf")
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        blocks = list(zip(bounds, bounds[1:]))
        if any(layers[s].segment != layers[e - 1].segment for s, e in blocks):
            continue
        for mps in itertools.product(EDGE.mp_choices(), repeat=len(blocks)):
            total = sum(block_latency_us(layers[s:e], m, EDGE) for (s, e), m in zip(blocks, mps))
            best = min(best, total)
    plan = optimal(layers, EDGE, make_cost(EDGE))
    assert plan_latency_us(plan, layers, EDGE) == pytest.approx(best, rel=1e-9)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layer_chains(max_layers=10))
def test_optimal_with_a_plain_cost_function_matches_the_fast_path(layers):
    layers = _fix_channels(layers)
    model = make_cost(HW)
    plain = lambda block, mp: model(block, mp)  # noqa: E731 - no block_table: generic DP
    fast, slow = optimal(layers, HW, model), optimal(layers, HW, plain)
    assert plan_latency_us(slow, layers, HW) == pytest.approx(plan_latency_us(fast, layers, HW), rel=1e-9)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layer_chains(max_layers=10))
def test_every_strategy_returns_a_valid_plan_on_random_chains(layers):
    layers = _fix_channels(layers)
    cost = make_cost(HW)
    latencies = {}
    for name in BUILTIN_ORDER:
        plan = get_strategy(name)(layers, HW, cost)
        plan.validate(layers, HW.cores)
        latencies[name] = plan_latency_us(plan, layers, HW, cost)
    assert all(latencies["optimal"] <= v * (1 + 1e-9) for v in latencies.values())


def test_oracle_respects_its_reduced_space():
    layers = zoo_layers("resnet18")
    plan = oracle(layers, HW, make_cost(HW))
    plan.validate(layers, HW.cores)
    seg_starts = {s for s, _ in segments(layers)}
    seg_ends = {e for _, e in segments(layers)}
    for block in plan.blocks:
        assert block.mp in ORACLE_MPS
        start = max(s for s in seg_starts if s <= block.start)
        assert (block.start - start) % 4 == 0
        assert block.size % 4 == 0 or block.stop in seg_ends


# --- the zoo ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zoo_results():
    results = {}
    for name in CNN_NAMES:
        layers = zoo_layers(name)
        cost = make_cost(HW)
        plans = {s: get_strategy(s)(layers, HW, cost) for s in BUILTIN_ORDER}
        results[name] = (layers, plans, {s: plan_latency_us(p, layers, HW, cost) for s, p in plans.items()})
    return results


@pytest.mark.parametrize("name", CNN_NAMES)
def test_optimal_is_never_worse_than_any_strategy_on_the_zoo(zoo_results, name):
    layers, plans, latency = zoo_results[name]
    for strategy, plan in plans.items():
        plan.validate(layers, HW.cores)
        assert latency["optimal"] <= latency[strategy] * (1 + 1e-9), strategy
    assert latency["optimal"] <= latency["oracle"]


# --- the programming interface ---------------------------------------------------------------


def test_builtins_are_registered_in_table_iii_order():
    assert strategy_names()[: len(BUILTIN_ORDER)] == list(BUILTIN_ORDER)
    with pytest.raises(OnnxMluError):
        get_strategy("no-such-strategy")


def test_register_and_run_a_hand_written_strategy():
    def pairs(layers, hw, cost):
        n = len(layers)
        return plan_from_ranges([(i, min(i + 2, n), 2) for i in range(0, n, 2)])

    try:
        register("test-pairs", pairs)
        with pytest.raises(ValueError):
            register("test-pairs", pairs)
        layers = [dataclasses.replace(l, segment=0) for l in zoo_layers("alexnet")]
        for strategy in ("test-pairs", pairs):
            plan = run_strategy(layers, HW, strategy)
            assert plan.strategy in ("test-pairs", "pairs") and plan.hardware == HW.name
            assert all(b.mp == 2 for b in plan.blocks)
    finally:  # the registry is the process's: a test's strategy must not outlive it (the CLI help lists them all)
        STRATEGIES.pop("test-pairs", None)


def test_run_strategy_rejects_an_invalid_plan():
    layers = zoo_layers("alexnet")

    def gap(layers, hw, cost):
        return Plan((Block(0, 1, 1), Block(2, len(layers), 1)))

    def not_a_plan(layers, hw, cost):
        return [(0, len(layers), 1)]

    with pytest.raises(PlanError, match="gap"):
        run_strategy(layers, HW, gap)
    with pytest.raises(OnnxMluError, match="not a Plan"):
        run_strategy(layers, HW, not_a_plan)


def test_strategies_accept_any_cost_function():
    layers = zoo_layers("alexnet")
    calls = []

    def flat(block, mp):
        calls.append(mp)
        return 10.0 + len(block) * 100.0 / mp

    for name in BUILTIN_ORDER:
        run_strategy(layers, HW, name, cost=flat)
    assert calls
