"""The performance model's mechanisms, one at a time (docs/architecture.md §4), on the default profile."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnxmlu.plan.plan import plan_from_ranges
from onnxmlu.plan.perf.hardware import load_hardware, profile_names
from onnxmlu.plan.perf.layers import Layer
from onnxmlu.plan.perf.model import (
    BlockEstimate,
    spatial_redundancy,
    ModelParams,
    block_estimate,
    block_latency_us,
    make_cost,
    plan_estimates,
    plan_latency_us,
)

from .zoo_layers import conv_chain

HW = load_hardware("mlu100")
P = ModelParams.from_hardware(HW)


def conv(c_in, c_out, size, k=3, stride=1, groups=1, index=0, segment=0) -> Layer:
    out = (size + 2 * (k // 2) - k) // stride + 1
    return Layer(index=index, name=f"conv{index}", op_type="Conv", kind="conv",
                 ops=2.0 * out * out * k * k * (c_in // groups) * c_out, in_channels=c_in,
                 out_channels=c_out, out_height=out, out_width=out, kernel=(k, k),
                 stride=(stride, stride), groups=groups, input_bytes=4 * c_in * size * size,
                 output_bytes=4 * c_out * out * out,
                 weight_bytes=4 * k * k * (c_in // groups) * c_out, segment=segment)


def eltwise(c, size, op="Relu", index=0, operands=1, segment=0) -> Layer:
    n = c * size * size
    return Layer(index=index, name=f"{op.lower()}{index}", op_type=op, kind="eltwise",
                 ops=float(n), in_channels=c, out_channels=c, out_height=size, out_width=size,
                 input_bytes=4 * n * operands, output_bytes=4 * n, segment=segment)


def best_mp(layers) -> int:
    return min(range(1, HW.cores + 1), key=lambda m: block_latency_us(layers, m, HW))


# --- per-core efficiency and the number of cores -----------------------------------------


def test_efficiency_rises_with_ops_per_core_and_saturates():
    # {C, C, 56x56, 3x3} at MP 1 for growing C: achieved compute rate (ops / compute time)
    rates = []
    for c in (8, 16, 32, 64, 128, 256, 512):
        est = block_estimate([conv(c, c, 56)], 1, HW)
        rates.append(est.ops / est.compute_us / P.peak_ops_per_us)
    assert all(b >= a for a, b in zip(rates, rates[1:]))
    assert rates[0] < 0.2                     # a tiny layer wastes most of the core
    assert rates[-1] > 0.9                    # a big one runs near peak ...
    assert rates[-1] / rates[-2] < 1.05       # ... and no longer improves


def test_too_many_cores_hurt_a_small_layer():
    small = [conv(64, 64, 14)]
    assert best_mp(small) <= 8
    assert block_latency_us(small, HW.cores, HW) > 1.2 * block_latency_us(small, best_mp(small), HW)


def test_bigger_layers_prefer_more_cores():
    mps = [best_mp([conv(c, c, 56)]) for c in (32, 128, 512)]
    assert mps[0] < mps[1] <= mps[2]


def fc(n_in, n_out, index=0) -> Layer:
    return Layer(index=index, name=f"fc{index}", op_type="MatMul", kind="fc", ops=2.0 * n_in * n_out,
                 in_channels=n_in, out_channels=n_out, input_bytes=4 * n_in,
                 output_bytes=4 * n_out, weight_bytes=4 * n_in * n_out)


def test_channel_granule_floor_caps_channel_parallelism():
    # same op count, no spatial extent: only channel groups help, and a layer with few
    # output channels has few granules to hand out (DLFusion Fig. 6a)
    narrow, wide = fc(20_000_000, 80), fc(400_000, 4000)
    assert narrow.ops == wide.ops
    est_n, est_w = block_estimate([narrow], HW.cores, HW), block_estimate([wide], HW.cores, HW)
    assert est_n.compute_us > 4 * est_w.compute_us
    assert est_n.redundant_ops > est_w.redundant_ops


# --- fusion: halo recomputation, DRAM traffic, launches ---------------------------------


def extra_work(layers, tiles) -> float:
    """Operations recomputed because of the halo when ``layers`` are fused and tiled."""
    return sum(l.ops * (r - 1.0) for l, r in zip(layers, spatial_redundancy(layers, tiles)))


@pytest.mark.parametrize("tiles", [(2, 1), (2, 2), (4, 4)])
def test_halo_grows_with_the_number_of_fused_convolutions(tiles):
    chain = conv_chain(64, 56, count=8)
    per_layer = [extra_work(chain[:n], tiles) / n for n in (1, 2, 4, 8)]
    assert per_layer[0] == 0.0  # a lone layer's output tiles need no halo
    assert per_layer[0] < per_layer[1] < per_layer[2] < per_layer[3]


def test_halo_grows_with_the_number_of_tiles():
    chain = conv_chain(64, 56, count=4)
    extra = [extra_work(chain, t) for t in ((1, 1), (2, 1), (2, 2), (4, 2), (4, 4), (8, 4))]
    assert extra[0] == 0.0
    assert all(b > a for a, b in zip(extra, extra[1:]))


def test_halo_is_capped_at_the_whole_map():
    chain = conv_chain(64, 14, count=16)  # the receptive field outgrows the 14x14 map
    rho = spatial_redundancy(chain, (2, 2))
    assert max(rho) == pytest.approx(4.0)  # every tile computes the whole map
    assert rho[-1] == pytest.approx(1.0)


def test_high_mp_on_a_deep_block_pays_redundant_work():
    chain = conv_chain(64, 56, count=8)
    assert block_estimate(chain, HW.cores, HW).redundant_ops > 0.5 * sum(l.ops for l in chain)


def test_single_core_has_no_redundant_work():
    chain = conv_chain(64, 56, count=8)
    assert block_estimate(chain, 1, HW).redundant_ops == pytest.approx(0.0, abs=1.0)


def test_fusion_keeps_intermediate_maps_on_chip():
    layers = [conv(64, 64, 56), eltwise(64, 56, index=1), conv(64, 64, 56, index=2)]
    fused = block_estimate(layers, 1, HW)
    apart = [block_estimate([layer], 1, HW) for layer in layers]
    assert fused.dram_bytes < sum(e.dram_bytes for e in apart)
    assert fused.overhead_us < sum(e.overhead_us for e in apart)
    assert fused.latency_us < sum(e.latency_us for e in apart)


def test_whole_map_consumer_defeats_spatial_tiles():
    # an FC after a conv needs the conv's whole map: a spatial split recomputes all of it
    fc = Layer(index=1, name="fc", op_type="MatMul", kind="fc", ops=2.0 * 64 * 7 * 7 * 10,
               in_channels=64 * 49, out_channels=10, input_bytes=4 * 64 * 49, output_bytes=40,
               weight_bytes=4 * 64 * 49 * 10)
    with_fc = block_estimate([conv(64, 64, 7), fc], 4, HW)
    alone = block_estimate([conv(64, 64, 7)], 4, HW)
    assert with_fc.tiles == (1, 1) or with_fc.redundant_ops >= alone.ops * (with_fc.tiles[0] * with_fc.tiles[1] - 1) * 0.99


# --- one MP per block, roofline, consistency --------------------------------------------


def test_mixing_layers_with_different_optimal_mps_hurts():
    small, big = conv(32, 32, 14, index=0), conv(512, 512, 28, index=1)
    separate = block_latency_us([small], best_mp([small]), HW) + block_latency_us([big], best_mp([big]), HW)
    assert best_mp([small]) < best_mp([big])
    fused_small = block_latency_us([small, big], best_mp([small]), HW)
    assert fused_small > separate


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 4), st.integers(1, 32), st.integers(1, 6))
def test_roofline_bounds(which, mp, length):
    layers = conv_chain([16, 64, 128, 256, 512][which], 28, count=length)
    est = block_estimate(layers, mp, HW)
    ops = sum(l.ops for l in layers)
    weights = sum(l.weight_bytes for l in layers)
    assert est.latency_us >= ops / (mp * P.peak_ops_per_us)
    assert est.latency_us >= (weights + layers[0].input_bytes + layers[-1].output_bytes) / P.dram_bytes_per_us
    assert est.latency_us >= P.launch_us
    assert est.compute_us >= ops / (mp * P.peak_ops_per_us) * 0.999


def test_cost_function_table_and_scalar_agree():
    layers = [conv(3, 16, 32, index=0), eltwise(16, 32, index=1), conv(16, 32, 32, stride=2, index=2),
              eltwise(32, 16, index=3), conv(32, 32, 16, index=4, segment=1)]
    layers = [dataclasses.replace(l, index=i) for i, l in enumerate(layers)]
    cost = make_cost(HW)
    lat, arg = cost.block_table(layers, list(range(1, HW.cores + 1)))
    for i in range(len(layers)):
        for j in range(i + 1, len(layers) + 1):
            if layers[i].segment != layers[j - 1].segment:
                assert math.isinf(lat[i, j])
                continue
            direct = min(block_latency_us(layers[i:j], m, HW) for m in range(1, HW.cores + 1))
            assert lat[i, j] == pytest.approx(direct, rel=1e-9)
            assert cost(layers[i:j], int(arg[i, j])) == pytest.approx(direct, rel=1e-9)
    singles = cost.layer_table(layers, [1, 3, 32])
    for i, layer in enumerate(layers):
        for k, m in enumerate([1, 3, 32]):
            assert singles[i, k] == pytest.approx(block_latency_us([layer], m, HW), rel=1e-9)


def test_plan_latency_is_the_sum_of_blocks():
    layers = conv_chain(64, 28, count=6)
    plan = plan_from_ranges([(0, 2, 4), (2, 6, 8)])
    estimates = plan_estimates(plan, layers, HW)
    assert all(isinstance(e, BlockEstimate) for e in estimates)
    assert plan_latency_us(plan, layers, HW) == pytest.approx(sum(e.latency_us for e in estimates))
    e = estimates[1]
    assert e.latency_us >= max(e.compute_us, e.memory_us)
    assert e.gops == pytest.approx(sum(l.ops for l in layers[2:6]) / 1e9)


def test_block_estimate_rejects_bad_input():
    with pytest.raises(ValueError):
        block_estimate([], 1, HW)
    with pytest.raises(ValueError):
        block_estimate(conv_chain(8, 8, 1), HW.cores + 1, HW)


@pytest.mark.parametrize("name", profile_names())
def test_every_profile_prices_a_network(name):
    hw = load_hardware(name)
    ModelParams.from_hardware(hw)
    layers = conv_chain(64, 28, count=4)
    times = [block_latency_us(layers, m, hw) for m in hw.mp_choices()]
    assert all(np.isfinite(times)) and min(times) > 0
