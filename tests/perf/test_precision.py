"""The performance model prices precision (docs/precision.md): peak compute per core by
precision, bytes by element size; FP32 prices are the calibrated ones."""

from __future__ import annotations

import dataclasses

import numpy as np
from pathlib import Path

import pytest

from onnxmlu.plan.plan import plan_from_ranges, with_precision
from onnxmlu.plan.perf.hardware import load_hardware
from onnxmlu.plan.perf.layers import Layer, layers_at_precision
from onnxmlu.plan.perf.model import (
    ModelParams,
    block_estimate,
    block_latency_us,
    make_cost,
    plan_block_latencies_us,
    plan_estimates,
)

from .test_model import conv, eltwise, fc
from .zoo_layers import zoo_layers

HW = load_hardware("mlu100")
SPEEDUP = {"fp32": 1.0, "fp16": 2.0, "int8": 4.0}
SIZE = {"fp32": 4, "fp16": 2, "int8": 1}


def _at(layers, precision):
    return layers_at_precision(layers, precision)


def test_the_profile_has_table_one_peaks():
    assert [HW.peak_per_core(p) for p in ("fp32", "fp16", "int8")] == [1.0, 2.0, 4.0]
    assert HW.cores * HW.peak_per_core("fp16") == 64.0 and HW.cores * HW.peak_per_core("int8") == 128.0
    params = ModelParams.from_hardware(HW)
    assert [params.speed(p) for p in ("fp32", "fp16", "int8")] == [1.0, 2.0, 4.0]
    edge = ModelParams.from_hardware(load_hardware("edge4"))
    assert [edge.speed(p) for p in ("fp16", "int8")] == [2.0, 4.0]


def test_each_precision_is_one_record_every_stage_reads():
    """Adding a precision is adding its record: each names a peak the profiles have, a body
    method BlockBodies has, and the schemas and the label rule know it by that name."""
    import json

    from onnxmlu import schema
    from onnxmlu.plan.perf.hardware import profile_names
    from onnxmlu.precision.bodies import BlockBodies
    from onnxmlu.precisions import DEFAULT_PRECISION, ELEMENT_BYTES, PRECISIONS, RECORDS

    assert PRECISIONS[0] == DEFAULT_PRECISION and set(ELEMENT_BYTES) == set(RECORDS)
    profiles = [load_hardware(name) for name in profile_names()]
    for record in RECORDS.values():
        assert all(hw.peak_per_core(record.name) > 0 and record.peak in hw.to_dict() for hw in profiles)
        assert record.body is None or callable(getattr(BlockBodies, record.body))
        assert (record.body_holds != "") == (record.name in schema._BODY_HOLDS)
    fuse_schema = json.dumps(json.loads((Path(schema.__file__).parent / "schemas" / "fuse.json").read_text()))
    assert all(f'"{name}"' in fuse_schema for name in PRECISIONS)


def test_layer_bytes_follow_the_element_size():
    layer = conv(64, 128, 28)
    for precision, size in SIZE.items():
        low = layer.at_precision(precision)
        assert low.precision == precision and low.ops == layer.ops
        assert (low.input_bytes, low.output_bytes, low.weight_bytes) == tuple(
            b * size // 4 for b in (layer.input_bytes, layer.output_bytes, layer.weight_bytes))
    assert layer.at_precision("fp32") is layer


def test_bytes_that_are_not_fp32_keep_their_size():
    # a layer reading 4000 bytes of int64 indices and 4096 of FP32 data
    layer = Layer(0, "gather", "Gather", "data", 0.0, input_bytes=8096, output_bytes=4096, weight_bytes=4000,
                  fixed_bytes=(4000, 0, 0))
    half = layer.at_precision("int8")
    assert (half.input_bytes, half.output_bytes, half.weight_bytes) == (4000 + 1024, 1024, 1000)


def test_only_fp32_layers_convert():
    with pytest.raises(ValueError, match="convert the FP32 layer"):
        conv(8, 8, 8).at_precision("fp16").at_precision("int8")
    with pytest.raises(Exception, match="precision"):
        conv(8, 8, 8).at_precision("fp8x")  # a name no record has


@pytest.mark.parametrize("mp", [1, 2])
def test_a_compute_bound_conv_runs_2x_faster_in_fp16_and_4x_in_int8(mp):
    # {512, 512, 28x28}, 3x3: 3.7 GOPs, far above the efficiency knee at these MPs even in INT8
    # (at MP 4 an INT8 core's 0.92 G ops take what 0.23 G FP32 ops take: near the knee)
    layer = [conv(512, 512, 28)]
    base = block_estimate(layer, mp, HW)
    assert base.compute_us > 3 * base.memory_us  # compute-bound
    for precision, speedup in SPEEDUP.items():
        est = block_estimate(_at(layer, precision), mp, HW)
        assert est.precision == precision
        assert base.latency_us / est.latency_us == pytest.approx(speedup, rel=0.02)
        assert base.compute_us / est.compute_us == pytest.approx(speedup, rel=0.02)


@pytest.mark.parametrize("mp", [1, 8, 32])
def test_a_dram_bound_layer_is_priced_by_its_bytes(mp):
    # a 4096x4096 FC layer: 64 MiB of FP32 weights streamed for 34 M operations
    layer = [fc(4096, 4096)]
    base = block_estimate(layer, mp, HW)
    assert base.memory_us > 3 * (base.compute_us - block_estimate(_at(layer, "int8"), mp, HW).compute_us)
    for precision, size in SIZE.items():
        est = block_estimate(_at(layer, precision), mp, HW)
        assert est.dram_bytes == pytest.approx(base.dram_bytes * size / 4)
        assert est.memory_us == pytest.approx(base.memory_us * size / 4)
        assert est.onchip_bytes == pytest.approx(base.onchip_bytes * size / 4)
        # what the latency loses is what the traffic loses (the compute part is small)
        saved = base.latency_us - est.latency_us
        assert saved == pytest.approx(base.memory_us - est.memory_us, rel=0.05)


def test_a_small_layer_gains_little_its_time_is_pipeline_fill():
    # below the knee (210 M ops per core) a block waits for its pipeline to fill, whatever the precision
    small = [conv(64, 64, 14)]
    ratio = block_latency_us(small, 1, HW) / block_latency_us(_at(small, "int8"), 1, HW)
    assert 1.0 < ratio < 1.1


def test_lower_precision_is_never_slower():
    layers = [conv(64, 64, 56), eltwise(64, 56, index=1), conv(64, 128, 56, stride=2, index=2), fc(512, 1000, 3)]
    for mp in (1, 4, 16, 32):
        lat = [block_latency_us(_at(layers, p), mp, HW) for p in ("fp32", "fp16", "int8")]
        assert lat[0] >= lat[1] >= lat[2]


@pytest.mark.parametrize("name", ["resnet18", "vgg19"])
def test_plan_prices_each_block_at_its_precision(name):
    layers = zoo_layers(name)
    cost = make_cost(HW)
    third = len(layers) // 3
    plan = plan_from_ranges([(0, third, 4), (third, 2 * third, 8), (2 * third, len(layers), 16)])
    mixed = with_precision(plan, ["fp32", "fp16", "int8"])
    got = plan_block_latencies_us(mixed, layers, cost)
    want = [cost(_at(b.layers(layers), p), b.mp) for b, p in zip(plan.blocks, ["fp32", "fp16", "int8"])]
    assert got == pytest.approx(want, rel=1e-12)
    assert got[0] == pytest.approx(plan_block_latencies_us(plan, layers, cost)[0], rel=1e-12)
    assert [e.precision for e in plan_estimates(mixed, layers, HW)] == ["fp32", "fp16", "int8"]
    # the unbatched path (a plain cost function) agrees
    plain = plan_block_latencies_us(mixed, layers, lambda block, mp: block_latency_us(block, mp, HW))
    assert plain == pytest.approx(got, rel=1e-9)


def test_fp32_layers_keep_their_calibrated_prices():
    """An explicit FP32 precision changes no price: speed 1, bytes unchanged."""
    layers = zoo_layers("resnet18")
    cost = make_cost(HW)
    lat, _ = cost.block_table(layers[:24], HW.mp_choices(), max_len=8)
    again, _ = make_cost(HW).block_table(_at(layers[:24], "fp32"), HW.mp_choices(), max_len=8)
    np.testing.assert_array_equal(lat, again)
    assert all(dataclasses.replace(l, precision="fp32") == l for l in layers)
