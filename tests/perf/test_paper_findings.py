"""DLFusion's findings (issue 4, "Verification") under the default profile, as bands.

Near the optimum the margins are a percent or less, so these are bands, not argmins.  The
zoo layer tables come from the real pipeline when it runs (see ``zoo_layers``).
"""

from __future__ import annotations

import functools

import pytest

from onnxmlu.plan.plan import Block
from onnxmlu.plan.perf.hardware import load_hardware
from onnxmlu.plan.perf.model import make_cost, plan_latency_us
from onnxmlu.plan.strategies import get_strategy
from onnxmlu.plan.strategies.basic import best_single_mp

from .zoo_layers import CNN_NAMES, conv_chain, zoo_layers

HW = load_hardware("mlu100")
STRATEGIES = ("none", "fixed-mp", "dynamic-mp", "all-fusion", "fusion-fixed-mp", "dlfusion", "optimal")


@functools.lru_cache(maxsize=None)
def results(name: str) -> dict[str, tuple[float, object]]:
    layers = zoo_layers(name)
    cost = make_cost(HW)
    out = {}
    for strategy in STRATEGIES:
        plan = get_strategy(strategy)(layers, HW, cost)
        plan.validate(layers, HW.cores)
        out[strategy] = (plan_latency_us(plan, layers, HW, cost), plan)
    return out


def latency(name: str, strategy: str) -> float:
    return results(name)[strategy][0]


def chain_latency(channels: int, size: int, block: int) -> float:
    """16 identical convs in equal blocks of ``block``, all blocks at their best MP."""
    layers = conv_chain(channels, size, count=16)
    blocks = [Block(i, i + block, 1) for i in range(0, 16, block)]
    mp, totals = best_single_mp(blocks, layers, HW, make_cost(HW))
    return totals[mp]


def best_block_size(channels: int, size: int) -> int:
    return min((1, 2, 4, 8, 16), key=lambda b: chain_latency(channels, size, b))


# 1. the best fixed MP: small for ResNet-18, larger for VGG-19, never all 32 cores
def test_best_fixed_mp_resnet18_small_vgg19_larger():
    r18 = results("resnet18")["fixed-mp"][1].notes["mp"]
    vgg = results("vgg19")["fixed-mp"][1].notes["mp"]
    assert r18 in (2, 4, 8)
    assert vgg in (8, 16, 24)
    assert vgg > r18
    assert 32 not in (r18, vgg)


# 2. the best fusion block size among 16 identical convs does not grow with the layer
def test_best_block_size_shrinks_as_the_layer_grows():
    sizes = [best_block_size(c, s) for c, s in ((64, 56), (256, 56), (512, 28))]
    assert sizes[0] >= sizes[1] >= sizes[2], sizes
    assert sizes[2] < sizes[0], sizes


# 3. {512,512,14x14}: fusing 16 beats 4; {512,512,28x28}: fusing 4 beats 16
def test_fusion_depth_flips_between_14x14_and_28x28():
    assert chain_latency(512, 14, 16) < chain_latency(512, 14, 4)
    assert chain_latency(512, 28, 4) < chain_latency(512, 28, 16)


# 4. dlfusion beats strategies 1-3 and ties (within 2 %) or beats 4 and 5
@pytest.mark.parametrize("name", CNN_NAMES)
def test_dlfusion_beats_no_fusion_and_ties_or_beats_fusion_baselines(name):
    d = latency(name, "dlfusion")
    for strategy in ("none", "fixed-mp", "dynamic-mp"):
        assert d < latency(name, strategy), strategy
    for strategy in ("all-fusion", "fusion-fixed-mp"):
        assert d <= 1.02 * latency(name, strategy), strategy


# 5. dlfusion is 3.6x to 7.9x faster than no optimisation
@pytest.mark.parametrize("name", CNN_NAMES)
def test_dlfusion_speedup_over_none_in_the_paper_range(name):
    speedup = latency(name, "none") / latency(name, "dlfusion")
    assert 3.6 <= speedup <= 7.9, speedup


# 6. dlfusion is within 10 % of the optimum
@pytest.mark.parametrize("name", CNN_NAMES)
def test_dlfusion_within_ten_percent_of_optimal(name):
    assert latency(name, "dlfusion") <= 1.10 * latency(name, "optimal")
