"""One story across commands: ``inspect`` numbers the layers ``plan`` and ``fuse`` plan over,
a node accelerated only after a rewrite says so in ``inspect --no-rewrite``, coverage counts
unpriced heavy host nodes as such, and the MP line cannot contradict the plan's choice."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnxmlu.analyze.coverage import Coverage
from onnxmlu.cli import app
from onnxmlu.plan.profile import BlockAcross
from onnxmlu.tools.testing import make_model

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _classifier() -> onnx.ModelProto:
    """conv -> weighted BatchNormalization -> relu -> global pool -> flatten -> Gemm: the BN and
    the Gemm are accelerated only after their rewrites."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2, "w"),
             *(numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), n) for n in ("scale", "var")),
             *(numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), n) for n in ("bias", "mean")),
             numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "fc_w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "fc_b")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    return make_model(graph, 17)


def test_inspect_numbers_the_layers_plan_and_fuse_plan_over(tmp_path):
    path = tmp_path / "classifier.onnx"
    onnx.save(_classifier(), path)
    inspected = json.loads(invoke("inspect", path, "--json", "-").stdout)
    planned = json.loads(invoke("plan", path, "-s", "all-fusion", "--json", "-").stdout)
    assert inspected["host_nodes"] == []  # the Gemm is in a block, as fuse has it
    last = max(b["stop"] for b in planned["blocks"]) - 1
    assert len(inspected["layers"]) == last + 1
    assert inspected["layers"][-1]["index"] == last


def test_inspect_without_rewrites_says_a_node_is_accelerated_after_one(tmp_path):
    path = tmp_path / "classifier.onnx"
    onnx.save(_classifier(), path)
    raw = json.loads(invoke("inspect", path, "--no-rewrite", "--json", "-").stdout)
    reasons = {h["node"]: h["reason"] for h in raw["host_nodes"]}
    assert reasons["fc"].startswith("accelerated after the gemm rewrite")
    assert reasons["bn"].startswith("accelerated after the bn rewrite")
    shown = invoke("inspect", path, "--no-rewrite")
    assert "before the rewrites" in shown.output


def test_coverage_counts_unpriced_heavy_nodes_as_such():
    """A host Conv that could not be sized: the GOPs share is of the priced node only, and the
    line says one is unpriced (it used to read '100.0% of their GOPs')."""
    found = Coverage(heavy_nodes=2, heavy_in_blocks=1, gops_in_blocks=0.4, unpriced=1)
    assert found.summary() == ("1/2 heavy nodes in blocks (50.0%), 100.0% of the GOPs of the 1 priced; "
                               "1 heavy host node unpriced")
    assert Coverage.from_dict(found.to_dict()).summary() == found.summary()  # the report's JSON says the same
    assert Coverage(heavy_nodes=1, heavy_in_blocks=1, gops_in_blocks=0.4).summary() == \
        "1/1 heavy nodes in blocks (100.0%), 100.0% of their GOPs"


def test_fuse_and_the_report_give_the_same_coverage_sentence(tmp_path):
    path = tmp_path / "classifier.onnx"
    onnx.save(_classifier(), path)
    said = next(line for line in invoke("fuse", path, tmp_path / "f.onnx").output.splitlines()
                if line.startswith("coverage: "))
    invoke("report", path, "-o", tmp_path / "r.html", "-q")
    assert said.removeprefix("coverage: ") in (tmp_path / "r.html").read_text()


def test_the_mp_line_says_the_strategy_chose_the_mp_at_opt():
    block = BlockAcross(1, 8, {"min": 1.0, "opt": 2.0, "max": 3.0}, {"min": 9, "opt": 16, "max": 22})
    said = block.sentence("dlfusion")
    assert said.startswith("block 1 runs at mp=8, chosen by dlfusion at the opt shape;")
    assert "fastest MP would be 9 at min, 16 at opt, 22 at max" in said and "the best MP is" not in said
