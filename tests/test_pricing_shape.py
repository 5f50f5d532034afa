"""The shape a plan was priced at is part of the artefact: ``fuse`` prints it (saying when a
default chose it), the fused model records it under ``onnxmlu.pricing_shape``, ``inspect`` and
``run --profile`` show it, and a run at another shape says its simulated figures are not its own.
The fallback sizes give a dim shared by two inputs one size, and suggest only spellings the
CLI takes back."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from onnxmlu import api
from onnxmlu.cli import app
from onnxmlu.frontend.pins import concrete_shapes, parse_input_shapes, shapes_text, with_defaults
from onnxmlu.schema import PRICING_SHAPE_KEY, model_metadata, record_pricing_shape

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def symbolic_conv() -> onnx.ModelProto:
    """images [N, 3, H, W] -> Conv -> Relu: every dim but the channels left symbolic."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3],
                                np.random.default_rng(0).standard_normal(216).astype(np.float32).tolist())
    graph = helper.make_graph(
        [helper.make_node("Conv", ["images", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Relu", ["c"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_fuse_prints_and_records_a_default_pricing_shape(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(symbolic_conv(), src)
    result = invoke("fuse", src, out, "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert "priced at images:1x3x224x224 (default for symbolic dims N, H, W; pin with --input-shape)" \
        in result.output
    record = json.loads(model_metadata(onnx.load(out))[PRICING_SHAPE_KEY])
    assert record == {"inputs": {"images": [1, 3, 224, 224]}, "defaulted": ["N", "H", "W"], "profile": None,
                      "sim_latency_us": None}
    assert json.loads((tmp_path / "r.json").read_text())["pricing_shape"] == record
    assert parse_input_shapes(["images:1x3x224x224"]) == {"images": [1, 3, 224, 224]}  # the line's spelling
    shown = invoke("inspect", out)
    assert "priced at images:1x3x224x224 (default" in shown.output, shown.output


def test_inspect_json_carries_the_pricing_shape_its_text_prints(tmp_path):
    """Of a model (the shape a plan would be priced at) and of a fused file (the recorded one)."""
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(symbolic_conv(), src)
    assert invoke("fuse", src, out, "--input-shape", "images:1,3,32/64/128,64", "-q").exit_code == 0
    record = json.loads(model_metadata(onnx.load(out))[PRICING_SHAPE_KEY])
    assert json.loads(invoke("inspect", out, "--json", "-", "-q").output)["pricing_shape"] == record
    plain = json.loads(invoke("inspect", src, "--json", "-", "-q").output)["pricing_shape"]
    assert plain == {"inputs": {"images": [1, 3, 224, 224]}, "defaulted": ["N", "H", "W"], "profile": None,
                     "sim_latency_us": None}
    assert "priced at images:1x3x224x224 (default" in invoke("inspect", src).output


def test_a_range_is_recorded_with_its_min_opt_max(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(symbolic_conv(), src)
    result = invoke("fuse", src, out, "--input-shape", "images:1,3,32/64/128,64")
    assert result.exit_code == 0, result.output
    assert "priced at images:1x3x64x64\n" in result.output
    assert "input profile: min images:1x3x32x64 · opt images:1x3x64x64 · max images:1x3x128x64" in result.output
    record = json.loads(model_metadata(onnx.load(out))[PRICING_SHAPE_KEY])
    assert record["defaulted"] == [] and record["profile"]["max"] == {"images": [1, 3, 128, 64]}


def _pricing_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("priced at", "input profile:", "pricing shape:"))]


def test_plain_inspect_shows_the_range_profile_fuse_printed(tmp_path):
    """``inspect`` of the model with the same ranges, and of the fused model, print fuse's
    ``priced at`` and ``input profile`` lines word for word (the model's lacked the profile);
    ``--json`` carries the profile fuse recorded (not its simulated latencies: inspect prices no plan)."""
    src, out, ranges = tmp_path / "m.onnx", tmp_path / "f.onnx", ("--input-shape", "images:1,3,32/64/128,64")
    onnx.save(symbolic_conv(), src)
    printed = _pricing_lines(invoke("fuse", src, out, *ranges).output)
    assert [line.split(":")[0] for line in printed] == ["priced at images", "input profile"], printed
    assert _pricing_lines(invoke("inspect", src, *ranges).output) == printed
    assert _pricing_lines(invoke("inspect", src, *ranges, "--no-rewrite").output) == printed
    assert _pricing_lines(invoke("inspect", out).output) == printed
    record = json.loads(model_metadata(onnx.load(out))[PRICING_SHAPE_KEY])
    assert json.loads(invoke("inspect", src, *ranges, "--json", "-", "-q").output)["pricing_shape"] == \
        {**record, "sim_latency_us": None}


def _ranges_line(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("over the input ranges:")]


def test_a_fused_file_records_the_simulated_latency_at_each_end_of_its_ranges(tmp_path):
    """``fuse`` prints the plan's simulated µs at min, opt and max; the file kept only the shapes,
    so ``inspect`` of it had no such line and ``--json`` no figures. Now both read the record."""
    src, out, ranges = tmp_path / "m.onnx", tmp_path / "f.onnx", ("--input-shape", "images:1,3,32/64/128,64")
    onnx.save(symbolic_conv(), src)
    fused = invoke("fuse", src, out, *ranges, "--json", tmp_path / "r.json")
    printed = _ranges_line(fused.output)
    assert fused.exit_code == 0 and len(printed) == 1, fused.output
    assert _ranges_line(invoke("inspect", out).output) == printed
    latency = json.loads((tmp_path / "r.json").read_text())["profile"]["sim_latency_us"]
    assert list(latency) == ["min", "opt", "max"] and latency["min"] < latency["max"]
    assert json.loads(invoke("inspect", out, "--json", "-", "-q").output)["pricing_shape"]["sim_latency_us"] \
        == pytest.approx(latency, rel=1e-12)


def test_a_record_without_the_latencies_still_reads_and_says_so(tmp_path):
    """A file fused before the record held ``sim_latency_us``: its shapes still read, and
    ``inspect`` says the figures are not recorded instead of printing none."""
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(symbolic_conv(), src)
    assert invoke("fuse", src, out, "--input-shape", "images:1,3,32/64/128,64", "-q").exit_code == 0
    older = onnx.load(out)
    record = json.loads(model_metadata(older)[PRICING_SHAPE_KEY])
    del record["sim_latency_us"]
    record_pricing_shape(older, record)
    onnx.save(older, out)
    shown = invoke("inspect", out)
    assert shown.exit_code == 0 and "input profile: min images:1x3x32x64" in shown.output, shown.output
    assert _ranges_line(shown.output) == ["over the input ranges: simulated µs at min/opt/max not recorded in this "
                                          "file (fused before it was)"], shown.output
    read = json.loads(invoke("inspect", out, "--json", "-", "-q").output)["pricing_shape"]
    assert read == {**record, "sim_latency_us": None}


def test_inspect_of_a_fused_file_without_the_record_says_it_has_none(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(symbolic_conv(), src)
    assert invoke("fuse", src, out, "--input-shape", "images:1,3,32/64/128,64", "-q").exit_code == 0
    older = onnx.load(out)  # as written before the record existed
    kept = [p for p in older.metadata_props if p.key != PRICING_SHAPE_KEY]
    del older.metadata_props[:]
    older.metadata_props.extend(kept)
    onnx.save(older, out)
    shown = invoke("inspect", out)
    assert shown.exit_code == 0 and _pricing_lines(shown.output) == ["pricing shape: not recorded in this file"]
    assert json.loads(invoke("inspect", out, "--json", "-", "-q").output)["pricing_shape"] is None


def test_run_profile_reprices_at_another_shape(tmp_path):
    """At another shape the simulated time is re-priced there: what fuse prices at that shape."""
    fused = tmp_path / "f.onnx"
    onnx.save(api.fuse(symbolic_conv(), input_shapes={"images": [1, 3, 32, 32]}).model, fused)
    there = api.fuse(symbolic_conv(), input_shapes={"images": [2, 3, 16, 24]}, strategy="dlfusion")
    other = invoke("run", fused, "--profile", "--repeat", "1", "--input-shape", "images:2x3x16x24",
                   "--json", tmp_path / "r.json")
    assert other.exit_code == 0, other.output
    words = " ".join(other.output.split())
    assert "sim µs at the pricing shape images:1x3x32x32; sim µs here: re-priced at this run's images:2x3x16x24" \
        in words, words
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["input_shapes"] == {"images": [2, 3, 16, 24]}
    assert report["pricing_shape"]["inputs"] == {"images": [1, 3, 32, 32]}
    (block,) = report["profile"]
    assert block["sim_here_us"] == pytest.approx(there.sim_latency_us, rel=1e-6) != block["sim_latency_us"]
    same = invoke("run", fused, "--profile", "--repeat", "1", "--input-shape", "images:[1,3,32,32]")
    assert "sim µs at this run's shape" in " ".join(same.output.split()), same.output


def test_run_without_pins_runs_where_fuse_priced(tmp_path):
    """``run`` of a fused model ran its free dims at their defaults (224) while the file says its
    plan was priced at 32x32 and ``check`` runs there: it runs at the recorded shape, a range at opt."""
    src, fused = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(symbolic_conv(), src)
    assert invoke("fuse", src, fused, "--input-shape", "images:1,3,16/32/48,32", "-q").exit_code == 0
    ran = invoke("run", fused, "--profile", "--repeat", "1", "--json", tmp_path / "r.json")
    assert ran.exit_code == 0, ran.output
    assert json.loads((tmp_path / "r.json").read_text())["input_shapes"] == {"images": [1, 3, 32, 32]}
    assert "sim µs at this run's shape, the pricing shape images:1x3x32x32" in " ".join(ran.output.split())


def test_blocks_that_cannot_be_repriced_say_so(tmp_path):
    fused = tmp_path / "f.onnx"
    onnx.save(api.fuse(symbolic_conv(), input_shapes={"images": [1, 3, 32, 32]}, precision="int8",
                       strategy="none").model, fused)
    shown = invoke("run", fused, "--profile", "--repeat", "1", "--input-shape", "images:1x3x16x16",
                   "--json", tmp_path / "r.json")
    assert "FP16/INT8 blocks are not re-priced: '–'" in " ".join(shown.output.split()), shown.output
    here = {p["precision"]: p["sim_here_us"] for p in json.loads((tmp_path / "r.json").read_text())["profile"]}
    assert here["int8"] is None and here["fp32"] > 0


def batch_shared_by_a_state() -> onnx.ModelProto:
    """A recurrent step: input [batch, T] and state [2, batch, 4] share ``batch``; ``sr`` is a scalar."""
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "T"]),
              helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 4]),
              helper.make_tensor_value_info("sr", TensorProto.INT64, [])]
    graph = helper.make_graph([helper.make_node("Identity", ["input"], ["y"])], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_fallback_size_keeps_a_shared_dim_one_size():
    model = batch_shared_by_a_state()
    shapes = concrete_shapes(model, with_defaults(model, None, 32))
    assert shapes["input"][0] == shapes["state"][1] == 1 and shapes["input"][1] == 32
    assert concrete_shapes(model, {"state": [2, 3, 4]})["input"][0] == 3  # a pin on either sizes both


def test_the_shape_text_is_a_spelling_the_cli_takes_back():
    text = shapes_text(concrete_shapes(batch_shared_by_a_state()))
    assert text == "input:1x128 state:2x1x4"  # the scalar has no dims to pin
    assert parse_input_shapes(text.split()) == {"input": [1, 128], "state": [2, 1, 4]}
    assert parse_input_shapes([text]) == {"input": [1, 128], "state": [2, 1, 4]}  # pasted as one value


@pytest.mark.parametrize("value, pins", [
    ("input:1x128,state:2x1x4", {"input": [1, 128], "state": [2, 1, 4]}),  # trtexec's --shapes list
    ("a:[1,3],b:[2,4]", {"a": [1, 3], "b": [2, 4]}),
    ("x:0:1x2,y:0:3x4", {"x:0": [1, 2], "y:0": [3, 4]}),  # TensorFlow's tensor names
    ("images:1,3,N,W", {"images": [1, 3, "N", "W"]}),  # commas between dims stay one item
])
def test_several_inputs_in_one_value_are_split_where_a_name_starts(value, pins):
    """A user pastes trtexec's ``--shapes`` value, or the pricing line's, into one --input-shape;
    before, the whole text was read as one input's name."""
    assert parse_input_shapes([value]) == pins


def test_an_unnamed_dim_is_not_written_as_a_pin_spelling(tmp_path):
    """An unnamed symbolic dim reads ``images[2]``: ``images:2`` would read as a rank-1 pin."""
    model = symbolic_conv()
    for d in model.graph.input[0].type.tensor_type.shape.dim[2:]:
        d.Clear()
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    result = invoke("fuse", src, tmp_path / "f.onnx")
    assert "(default for symbolic dims N, images[2], images[3]; pin with --input-shape)" in result.output, \
        result.output


def cache_step() -> onnx.ModelProto:
    """A decoder step as exporters name its dims: new tokens [batch, sequence], a cache
    [batch, past], a mask [batch, total] -- ``total`` is past + sequence, which no name says."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [1, 1], [2.0])
    nodes = [helper.make_node("Concat", ["past", "x"], ["keys"], axis=1, name="append"),
             helper.make_node("Add", ["keys", "mask"], ["scores"], name="mask"),
             helper.make_node("Unsqueeze", ["scores", "axes"], ["col"], name="col"),
             helper.make_node("MatMul", ["col", "w"], ["y"], name="project")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence"]),
              helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", "past"]),
              helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "total"])]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [2])
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [weight, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_dims_that_are_sums_of_others_are_probed_at_sizes_that_add_up(tmp_path):
    """No common size runs a model whose mask spans past + sequence; before, the probe gave up
    and the nodes it could not size stayed on the host (an optimizer-saved GPT-2 unpinned)."""
    src, out, report = tmp_path / "m.onnx", tmp_path / "f.onnx", tmp_path / "r.json"
    onnx.save(cache_step(), src)
    result = invoke("fuse", src, out, "--json", report)
    assert result.exit_code == 0, result.output
    shapes = json.loads(model_metadata(onnx.load(out))[PRICING_SHAPE_KEY])["inputs"]
    assert shapes["mask"][1] == shapes["past"][1] + shapes["x"][1]
    assert "some being sums of others" in result.output
    assert [n.op_type for n in onnx.load(out).graph.node] == ["MLUFusionBlock"]
