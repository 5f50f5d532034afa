"""Plan blocks carry a precision: optional in JSON, FP32 when absent, written only when not FP32."""

import json

import pytest

from onnxmlu.errors import PlanError
from onnxmlu.plan.perf.layers import Layer
from onnxmlu.plan.plan import Block, Plan, plan_from_ranges, split_oversized_blocks, with_precision
from onnxmlu.precisions import PRECISIONS


def _layers(count):
    return [Layer(i, f"l{i}", "Conv", "conv", 1e6, weight_bytes=100) for i in range(count)]


def test_blocks_default_to_fp32_and_fp32_plans_are_written_as_before():
    plan = plan_from_ranges([(0, 2, 4), (2, 5, 8)], strategy="hand", hardware="mlu100")
    assert [b.precision for b in plan.blocks] == ["fp32", "fp32"]
    assert "precision" not in plan.to_json()
    assert with_precision(plan, "fp32").to_json() == plan.to_json()


def test_precision_roundtrips_through_json():
    layers = _layers(5)
    plan = plan_from_ranges([(0, 2, 4, "fp16"), (2, 3, 1), (3, 5, 32, "int8")], hardware="mlu100")
    plan.validate(layers, 32)
    data = json.loads(plan.to_json(layers))
    assert [b.get("precision") for b in data["blocks"]] == ["fp16", None, "int8"]
    assert Plan.from_json(plan.to_json(layers), layers) == plan


def test_a_plan_file_without_precision_reads_as_fp32():
    text = json.dumps({"format": "onnxmlu-plan", "version": 1, "strategy": "dlfusion", "hardware": "mlu100",
                       "blocks": [{"start": 0, "stop": 3, "mp": 4}]})
    assert Plan.from_json(text).blocks == (Block(0, 3, 4, "fp32"),)


@pytest.mark.parametrize("bad", ["fp8x", "FP16", 16, None])
def test_unknown_precisions_are_refused(bad):
    text = json.dumps({"format": "onnxmlu-plan", "version": 1,
                       "blocks": [{"start": 0, "stop": 3, "mp": 4, "precision": bad}]})
    with pytest.raises(PlanError, match=f"block 0's precision must be one of {', '.join(PRECISIONS)}"):
        Plan.from_json(text)
    with pytest.raises(PlanError, match="precision"):
        plan_from_ranges([(0, 3, 4, bad)]).validate(_layers(3), 32)


def test_with_precision_sets_every_block_or_each_block():
    plan = plan_from_ranges([(0, 2, 4), (2, 5, 8)])
    assert [b.precision for b in with_precision(plan, "int8").blocks] == ["int8", "int8"]
    assert [b.precision for b in with_precision(plan, ["fp16", "int8"]).blocks] == ["fp16", "int8"]
    with pytest.raises(PlanError, match="2 blocks"):
        with_precision(plan, ["fp16"])


def test_split_blocks_keep_their_precision():
    plan = plan_from_ranges([(0, 5, 4, "int8")])
    split = split_oversized_blocks(plan, _layers(5), limit_bytes=250)
    assert len(split.blocks) == 3 and {b.precision for b in split.blocks} == {"int8"}
