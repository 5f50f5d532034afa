"""The searches' block-length bound (``max_block_layers``): the default changes no zoo result,
the bounded DP is exact over its own space, and the bound is configurable."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import HealthCheck, given, settings

from onnxmlu.plan.plan import segments
from onnxmlu.plan.perf.hardware import Hardware, load_hardware
from onnxmlu.plan.perf.model import block_latency_us, make_cost, plan_latency_us
from onnxmlu.plan.strategies.search import (
    DEFAULT_MAX_BLOCK_LAYERS,
    max_block_length,
    optimal,
    oracle,
)

from .test_optimal import _fix_channels, layer_chains

try:
    from perf.zoo_layers import CNN_NAMES, conv_chain, using_real_pipeline, zoo_layers
except ImportError:  # pragma: no cover
    from tests.perf.zoo_layers import CNN_NAMES, conv_chain, using_real_pipeline, zoo_layers

HW = load_hardware("mlu100")
ZOO = CNN_NAMES + (("lstm",) if using_real_pipeline() else ())


@pytest.mark.parametrize("profile", ["mlu100", "edge4"])
@pytest.mark.parametrize("name", ZOO)
@pytest.mark.parametrize("search", [optimal, oracle], ids=["optimal", "oracle"])
def test_default_bound_gives_the_unbounded_result_on_the_zoo(search, name, profile):
    hw, layers = load_hardware(profile), zoo_layers(name)
    cost = make_cost(hw)
    bounded, unbounded = search(layers, hw, cost), search(layers, hw, cost, max_block_layers=0)
    assert bounded.notes["max_block_layers"] == DEFAULT_MAX_BLOCK_LAYERS
    assert plan_latency_us(bounded, layers, hw, cost) == pytest.approx(
        plan_latency_us(unbounded, layers, hw, cost), rel=1e-12)
    assert bounded.blocks == unbounded.blocks


def bounded_enumeration(layers, hw, bound: int) -> float:
    """min over partitions whose blocks have <= bound layers or are whole segments."""
    n, best = len(layers), float("inf")
    whole = set(segments(layers))
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        blocks = list(zip(bounds, bounds[1:]))
        if any(layers[s].segment != layers[e - 1].segment for s, e in blocks):
            continue
        if any(e - s > bound and (s, e) not in whole for s, e in blocks):
            continue
        best = min(best, sum(min(block_latency_us(layers[s:e], m, hw) for m in hw.mp_choices())
                             for s, e in blocks))
    return best


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layer_chains(max_layers=8))
def test_bounded_optimal_is_exact_over_its_space(layers):
    layers, edge = _fix_channels(layers), load_hardware("edge4")
    for bound in (1, 3):
        plan = optimal(layers, edge, make_cost(edge), max_block_layers=bound)
        plan.validate(layers, edge.cores)
        whole = set(segments(layers))
        assert all(b.size <= bound or (b.start, b.stop) in whole for b in plan.blocks)
        assert plan_latency_us(plan, layers, edge) == pytest.approx(
            bounded_enumeration(layers, edge, bound), rel=1e-9)


def test_bound_applies_with_any_cost_function():
    layers = conv_chain(64, 28, count=12)
    model = make_cost(HW)
    plain = lambda block, mp: model(block, mp)  # noqa: E731 - no band_table: generic DP
    for search in (optimal, oracle):
        fast = search(layers, HW, model, max_block_layers=4)
        slow = search(layers, HW, plain, max_block_layers=4)
        assert plan_latency_us(slow, layers, HW) == pytest.approx(plan_latency_us(fast, layers, HW), rel=1e-9)
        assert all(b.size <= 4 or b.size == len(layers) for b in fast.blocks)


def test_bound_comes_from_keyword_then_profile_then_default():
    profiled = HW.with_params(search_max_block_layers=8)
    assert max_block_length(HW) == DEFAULT_MAX_BLOCK_LAYERS
    assert max_block_length(profiled) == 8
    assert max_block_length(profiled, 5) == 5
    assert max_block_length(HW, 0) is None
    with pytest.raises(ValueError):
        max_block_length(HW, -1)
    layers = conv_chain(64, 28, count=12)
    plan = optimal(layers, profiled, make_cost(profiled))
    assert plan.notes["max_block_layers"] == 8


def test_profile_with_the_bound_is_a_valid_profile():
    hw = Hardware(name="b", cores=4, peaks=HW.peaks, dram_gbps=25.6, frequency_ghz=1.0,
                  model={"search_max_block_layers": 16})
    assert make_cost(hw)(conv_chain(64, 28, count=2), 2) > 0


def test_repeated_windows_are_priced_like_distinct_ones():
    """Windows of equal layers share one price array; each still equals direct pricing."""
    unit = conv_chain(64, 14, count=2, kernel=3) + conv_chain(128, 14, count=1, kernel=1)
    layers = [dataclasses.replace(l, index=i, name=f"l{i}")
              for i, l in enumerate(unit[i % 3] for i in range(15))]
    band = make_cost(HW).band_table(layers, HW.mp_choices(), max_len=4)
    assert len(band.lats) < len(layers)  # windows repeat with period 3
    for j in range(1, len(layers) + 1):
        lo, lat, mps = band.column(j)
        for i in range(lo, j):
            direct = min(block_latency_us(layers[i:j], m, HW) for m in HW.mp_choices())
            assert lat[i - lo] == pytest.approx(direct, rel=1e-9)
            assert block_latency_us(layers[i:j], int(mps[i - lo]), HW) == pytest.approx(direct, rel=1e-9)
