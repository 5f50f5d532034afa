import json

import pytest

from onnxmlu.errors import PlanError
from onnxmlu.plan.plan import Block, Plan, plan_from_ranges, segments
from onnxmlu.plan.perf.layers import Layer


def _layers(segs):
    out = []
    for seg, count in enumerate(segs):
        for _ in range(count):
            out.append(Layer(len(out), f"l{len(out)}", "Conv", "conv", 1e6, segment=seg))
    return out


def test_segments_are_maximal_runs():
    assert segments(_layers([3, 2, 1])) == [(0, 3), (3, 5), (5, 6)]


def test_valid_plan_roundtrips_through_json():
    layers = _layers([3, 2])
    plan = plan_from_ranges([(0, 2, 4), (2, 3, 1), (3, 5, 32)], strategy="hand", hardware="mlu100")
    plan.validate(layers, 32)
    text = plan.to_json(layers)
    assert json.loads(text)["blocks"][0] == {"start": 0, "stop": 2, "mp": 4, "first": "l0", "last": "l1"}
    assert Plan.from_json(text, layers) == plan


@pytest.mark.parametrize("ranges, message", [
    ([(0, 2, 1), (1, 5, 1)], "overlaps"),
    ([(0, 2, 1), (3, 5, 1)], "gap"),
    ([(0, 3, 1), (3, 4, 1)], "gap at the end"),
    ([(0, 3, 0), (3, 5, 1)], "mp=0"),
    ([(0, 3, 1), (3, 5, 33)], "mp=33"),
    ([(0, 4, 1), (4, 5, 1)], "spans host nodes"),
    ([(0, 3, 1), (3, 3, 1), (3, 5, 1)], "empty"),
])
def test_invalid_plans_get_clear_errors(ranges, message):
    with pytest.raises(PlanError, match=message):
        plan_from_ranges(ranges).validate(_layers([3, 2]), 32)


def test_plan_file_errors(tmp_path):
    layers = _layers([2])
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.from_json("{", layers)
    with pytest.raises(PlanError, match="not an onnxmlu plan"):
        Plan.from_json("[]", layers)
    bad_name = Plan((Block(0, 2, 1),)).to_dict(layers)
    bad_name["blocks"][0]["first"] = "conv_other"
    with pytest.raises(PlanError, match="first layer is 'l0'"):
        Plan.from_dict(bad_name, layers)
    with pytest.raises(PlanError, match="cannot read plan file"):
        Plan.load(tmp_path / "nope.json")


def test_a_forced_mp_keeps_the_strategy_s_notes():
    from onnxmlu.plan.perf.hardware import load_hardware
    from onnxmlu.plan.planner import make_plan
    from tests.perf.zoo_layers import conv_chain

    hw = load_hardware("mlu100")
    layers = conv_chain(64, 28, count=12)
    planned = make_plan(layers, hw, strategy="optimal")
    forced = make_plan(layers, hw, strategy="optimal", mp=4)
    assert planned.notes and forced.notes == planned.notes
    assert {b.mp for b in forced.blocks} == {4}
