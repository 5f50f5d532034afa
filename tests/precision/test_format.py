"""The ``precision`` attribute of MLUFusionBlock: optional, FP32 when absent, registered in the
schema; FP32 plans write exactly what they wrote before; the streamed file equals the model."""

from __future__ import annotations

import zlib

import onnx
import pytest
from onnx import helper

from onnxmlu import api
from onnxmlu.collapse.blocks import collapse, collapse_pieces
from onnxmlu.ir import wire
from onnxmlu.plan.plan import with_precision
from onnxmlu.precision.bodies import BlockBodies
from onnxmlu.precision.calibration import random_calibration
from onnxmlu.schema import DIGEST, block_precision, body_model, ensure_registered, is_fusion_block
from onnxmlu.tools.testing import conv_chain_model
from onnxmlu.tools.view import explode
from precision_models import residual_model, two_block_plan


def _blocks(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if is_fusion_block(n)]


def test_fp32_blocks_are_written_byte_for_byte_as_without_the_knob(zoo):
    model = zoo("resnet18")
    base = api.fuse(model)
    explicit = api.fuse(model, plan=with_precision(base.plan, "fp32"))
    assert explicit.model.SerializeToString() == base.model.SerializeToString()
    assert all(a.name != "precision" for n in _blocks(base.model) for a in n.attribute)
    assert {block_precision(n) for n in _blocks(base.model)} == {"fp32"}


def test_fp16_and_int8_blocks_carry_the_attribute_and_pass_the_full_checker():
    model = residual_model()
    for precisions in (("fp16", "int8"), ("int8", "fp32")):
        fused = api.fuse(model, plan=two_block_plan(precisions)).model
        assert [block_precision(n) for n in _blocks(fused)] == list(precisions)
        attributes = [{a.name for a in n.attribute} for n in _blocks(fused)]
        assert [("precision" in a) for a in attributes] == [p != "fp32" for p in precisions]
        ensure_registered()
        onnx.checker.check_model(fused, full_check=True)


def test_a_node_without_the_attribute_reads_as_fp32():
    node = helper.make_node("MLUFusionBlock", ["x"], ["y"], domain="com.onnxmlu", mp=2)
    assert block_precision(node) == "fp32"
    node.attribute.append(helper.make_attribute("precision", "int8"))
    assert block_precision(node) == "int8"


def test_the_schema_refuses_a_wrong_attribute_type():
    fused = api.fuse(residual_model(), plan=two_block_plan(("fp16", "fp16"))).model
    node = _blocks(fused)[0]
    precision = next(a for a in node.attribute if a.name == "precision")
    precision.CopyFrom(helper.make_attribute("precision", 16))
    ensure_registered()
    with pytest.raises(onnx.checker.ValidationError, match="precision"):
        onnx.checker.check_model(fused, full_check=True)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_the_streamed_file_equals_the_collapsed_model(precision):
    model = conv_chain_model(convs=4, channels=8)
    analysis = api.inspect(model, rewrite=True)
    plan = with_precision(api.fuse(model).plan, precision)
    calibration = random_calibration(analysis.model, count=3)
    whole = collapse(analysis, plan, bodies=BlockBodies(analysis, calibration))
    pieces = wire.join(collapse_pieces(analysis, plan, bodies=BlockBodies(analysis, calibration)))
    assert onnx.load_from_string(pieces).SerializeToString() == whole.SerializeToString()


def test_without_calibration_data_int8_falls_back_to_flagged_random_samples():
    model = residual_model()
    analysis = api.inspect(model, rewrite=True)
    bodies = BlockBodies(analysis)
    collapse(analysis, two_block_plan(("fp32", "int8")), bodies=bodies)
    assert bodies.calibration.random and bodies.calibration.seed == 0 and len(bodies.calibration) == 8
    assert [d.rule for d in bodies.diagnostics] == ["random-calibration"]
    given = BlockBodies(analysis, random_calibration(analysis.model, count=2))  # a set given is not flagged again
    collapse(analysis, two_block_plan(("fp32", "int8")), bodies=given)
    assert given.diagnostics == [] and given.calibration.random


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_fuse_to_file_writes_what_fuse_builds(tmp_path, zoo, precision):
    """The streamed path holds large weights in a weight store: INT8 calibration runs the
    model with them filled in, before any is released, and the file equals the in-memory model."""
    model = zoo("resnet18")
    plan = with_precision(api.fuse(model).plan, precision)
    onnx.save(model, tmp_path / "m.onnx")
    api.fuse_to_file(tmp_path / "m.onnx", tmp_path / "f.onnx", plan=plan)
    written = onnx.load(tmp_path / "f.onnx")
    assert written.SerializeToString() == api.fuse(model, plan=plan).model.SerializeToString()


def test_the_netron_view_copy_keeps_the_attribute():
    fused = api.fuse(residual_model(), plan=two_block_plan(("fp16", "int8"))).model
    view = explode(fused)
    calls = [n for n in view.graph.node if n.domain == "com.onnxmlu.view"]
    assert [next(a.s for a in n.attribute if a.name == "precision") for n in calls] == [b"fp16", b"int8"]
    assert {f.name for f in view.functions} == {n.op_type for n in calls}


def test_fp16_and_int8_bodies_carry_the_digest_of_their_final_bytes():
    """body_crc32 is taken after the body is turned into its precision: FP16 weights and the
    QDQ form are what the digest covers, so the library and body_model accept them."""
    fused = api.fuse(residual_model(), plan=two_block_plan(("fp16", "int8"))).model
    for node in _blocks(fused):
        attrs = {a.name: a for a in node.attribute}
        assert attrs[DIGEST].i == zlib.crc32(attrs["body"].t.raw_data)
    bodies = [body_model(n) for n in _blocks(fused)]  # verifies each digest
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in bodies[0].graph.initializer)
    assert any(n.op_type == "QuantizeLinear" for n in bodies[1].graph.node)


def test_a_forced_mp_keeps_each_blocks_precision():
    from onnxmlu.plan.perf.hardware import load_hardware
    from onnxmlu.plan.planner import make_plan

    analysis = api.inspect(residual_model(), rewrite=True)
    forced = make_plan(analysis.layers, load_hardware(), plan=two_block_plan(("fp16", "int8")), mp=2)
    assert [(b.mp, b.precision) for b in forced.blocks] == [(2, "fp16"), (2, "int8")]
