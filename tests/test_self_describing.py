"""Fused models describe themselves: producer and onnxmlu.* metadata (which library runs the
blocks and how to get it, hardware, strategy, precision), `inspect FUSED` lists blocks and host
nodes, and onnx's reference evaluator runs a fused model with onnxmlu.reference.MLUFusionBlock."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from onnxmlu import __version__, api
from onnxmlu.cli import app
from onnxmlu.errors import OnnxMluError
from onnxmlu.reference import reference_evaluator
from onnxmlu.runtime import reference_session
from onnxmlu.schema import METADATA_KEYS, BodyDigestError, is_fusion_block, model_metadata
from onnxmlu.tools.testing import conv_chain_model
from onnxmlu.tools.view import explode


def host_node_model() -> onnx.ModelProto:
    """The conv chain (a TopK host node between two blocks), with a metadata property of its own."""
    chain = conv_chain_model()
    chain.metadata_props.add(key="origin", value="test")
    return chain


def feeds(model: onnx.ModelProto) -> dict:
    rng = np.random.default_rng(0)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


def test_fused_models_name_their_producer_library_and_plan():
    fused = api.fuse(host_node_model(), strategy="all-fusion").model
    meta = model_metadata(fused)
    assert (fused.producer_name, fused.producer_version) == ("onnxmlu", __version__)
    assert set(METADATA_KEYS) <= set(meta) and meta["origin"] == "test"  # the source's own are kept
    assert "pip install onnxmlu" in meta["onnxmlu.runtime"]
    assert "onnxmlu.custom_ops_library()" in meta["onnxmlu.runtime"]
    assert (meta["onnxmlu.hardware"], meta["onnxmlu.strategy"], meta["onnxmlu.precision"]) == ("mlu100", "all-fusion", "fp32")
    assert meta["onnxmlu.blocks"] == str(sum(is_fusion_block(n) for n in fused.graph.node))


def test_metadata_states_the_precision_once():
    model = conv_chain_model()
    model.metadata_props.add(key="onnxmlu.strategy", value="from an earlier tool")  # replaced, not repeated
    fused = api.fuse(model, precision="int8").model
    assert model_metadata(fused)["onnxmlu.precision"] == "int8"
    again = api.fuse(model, precision="fp16").model
    keys = [p.key for p in again.metadata_props]
    assert len(keys) == len(set(keys)) and model_metadata(again)["onnxmlu.precision"] == "fp16"


def test_the_portable_copy_drops_the_library_note():
    props = model_metadata(explode(api.fuse(conv_chain_model()).model))
    assert "onnxmlu.runtime" not in props and "onnxmlu.exploded" in props


def test_inspect_lists_the_blocks_and_host_nodes_of_a_fused_model(tmp_path):
    path = tmp_path / "fused.onnx"
    onnx.save(api.fuse(host_node_model(), strategy="all-fusion").model, path)
    result = CliRunner().invoke(app, ["inspect", str(path), "--json", "-"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["schema"] == "onnxmlu.inspect-fused/1" and report["producer"] == f"onnxmlu {__version__}"
    assert [h["node"] for h in report["host_nodes"]] == ["topk1"]
    assert len(report["blocks"]) == 2 and all(b["body_bytes"] > 0 and b["mp"] >= 1 for b in report["blocks"])
    assert report["sim_latency_us"] == pytest.approx(sum(b["sim_latency_us"] for b in report["blocks"]))
    table = CliRunner().invoke(app, ["inspect", str(path)], catch_exceptions=False)
    assert table.exit_code == 0 and "host: topk1 (TopK)" in table.stdout and "onnxmlu.strategy: all-fusion" in table.stdout


def test_the_reference_evaluator_runs_a_fused_model_like_the_original():
    model = host_node_model()
    fused = api.fuse(model, strategy="all-fusion").model
    assert sum(is_fusion_block(n) for n in fused.graph.node) == 2
    x = feeds(model)
    want = reference_session(model).run(None, x)
    got = reference_evaluator(fused).run(None, x)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)


def test_the_reference_op_refuses_a_damaged_or_nested_body():
    fused = api.fuse(conv_chain_model(), strategy="all-fusion").model
    block = next(n for n in fused.graph.node if is_fusion_block(n))
    body = next(a for a in block.attribute if a.name == "body")
    nested = helper.make_model(helper.make_graph([helper.make_node("MLUFusionBlock", ["x"], ["y"], domain="com.onnxmlu")],
                                                 "b", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]))
    damaged = bytearray(body.t.raw_data)
    damaged[len(damaged) // 2] ^= 1
    body.t.raw_data = bytes(damaged)
    with pytest.raises(BodyDigestError, match="body is corrupt"):
        reference_evaluator(fused)
    from onnxmlu.schema import add_body

    del block.attribute[:]
    block.attribute.append(helper.make_attribute("mp", 1))
    add_body(block, nested.SerializeToString())
    with pytest.raises(OnnxMluError, match="cannot be nested"):
        reference_evaluator(fused)
