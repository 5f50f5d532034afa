"""The pass pipeline (onnxmlu/pipeline.py): passes run in their order over one context, the
pass manager says each one's progress line and times it, and everything a stage did not do
lands in one diagnostics list."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper, numpy_helper

import numpy as np

from onnxmlu import api
from onnxmlu.pipeline import FUSE, FUSE_TO_FILE, PLAN, Context, Instrument, Options, PassManager, Say
from onnxmlu.plan.perf.hardware import load_hardware
from onnxmlu.tools.testing import conv_chain_model, make_model


def _bn_then_mod() -> onnx.ModelProto:
    """A training-mode BN (the bn rewriter refuses it), a Relu, then Acos (not in the op table)."""
    stats = [numpy_helper.from_array(np.full(4, 1.0, np.float32), n) for n in ("s", "b", "m", "v")]
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn", training_mode=1),
             helper.make_node("Relu", ["y"], ["r"], name="relu"),
             helper.make_node("Acos", ["r"], ["z"], name="acos")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 3, 3])], stats)
    return make_model(graph, opset=15)


class Record(Instrument):
    def __init__(self) -> None:
        self.events: list[str] = []

    def enter(self, ctx):
        self.events.append("enter")

    def before(self, p, ctx):
        self.events.append(f"before {p.name}")

    def after(self, p, ctx):
        self.events.append(f"after {p.name}")

    def exit(self, ctx):
        self.events.append("exit")


def test_passes_run_in_order_under_their_instruments():
    record = Record()
    ctx = Context(conv_chain_model(), load_hardware("mlu100"), Options(strategy="all-fusion"))
    PassManager(FUSE, [record]).run(ctx)
    names = [p.name for p in FUSE]
    assert record.events == ["enter", *[e for n in names for e in (f"before {n}", f"after {n}")], "exit"]
    assert ctx.fused is not None and ctx.plan is not None and ctx.pass_seconds == {}  # no timing instrument


def test_the_pass_manager_says_and_times_every_pass(tmp_path):
    said: list[str] = []
    source = tmp_path / "m.onnx"
    onnx.save(conv_chain_model(), source)
    result = api.fuse_to_file(source, tmp_path / "f.onnx", strategy="all-fusion", progress=said.append)
    assert list(result.pass_seconds) == [p.name for p in FUSE_TO_FILE]
    assert all(seconds >= 0 for seconds in result.pass_seconds.values())
    assert said[0] == "loading m.onnx" and said[-1] == "saving f.onnx" and len(said) == len(FUSE_TO_FILE)


def test_one_diagnostics_list_in_pass_order():
    result = api.fuse(_bn_then_mod(), strategy="all-fusion")
    stages = [d.stage for d in result.diagnostics]
    assert stages == sorted(stages, key=["normalize", "rewrite", "analyze"].index)
    rewrite = [d for d in result.diagnostics if d.stage == "rewrite"]
    assert [(d.rule, d.node) for d in rewrite] == [("bn", "bn")] and "training" in rewrite[0].message
    host = {d.node for d in result.diagnostics if d.stage == "analyze"}
    assert {"bn", "acos"} <= host
    assert result.to_dict()["diagnostics"] == [d.to_dict() for d in result.diagnostics]


def test_the_pipeline_never_changes_the_callers_model():
    model = conv_chain_model()
    before = model.SerializeToString()
    ctx = PassManager(PLAN).run(Context(model, load_hardware("mlu100"), progress=Say()))
    assert ctx.model is not model and model.SerializeToString() == before
