"""The pass pipeline (onnxmlu/pipeline.py): passes run in their order over one context, the
pass manager says each one's progress line and times it, and everything a stage did not do
lands in one diagnostics list."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper, numpy_helper

import numpy as np
import pytest

from onnxmlu import api
from onnxmlu.pipeline import FUSE, FUSE_TO_FILE, PLAN, Context, Instrument, Options, PassManager, Say
from onnxmlu.reports import calibration_report
from onnxmlu.plan.perf.hardware import load_hardware
from onnxmlu.tools.testing import conv_chain_model, make_model
from onnxmlu.precisions import PRECISIONS


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
    ctx = Context(conv_chain_model(), load_hardware("mlu100"), Options.of(strategy="all-fusion"))
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


def _conv_bn_mod_relu() -> onnx.ModelProto:
    """conv -> BatchNormalization (inference: rewritten to norm + Mul + Add, and the norm has no
    QDQ form) -> sigmoid, then Acos (a host node), then relu: two blocks around a host node."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             *(numpy_helper.from_array(np.full(4, v, np.float32), n) for n, v in (("s", 1.5), ("b", 0.1),
                                                                                   ("m", 0.2), ("v", 2.0))),
             ]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"),
             helper.make_node("Sigmoid", ["n"], ["r"], name="sigmoid"),
             helper.make_node("Acos", ["r"], ["o"], name="acos"),
             helper.make_node("Relu", ["o"], ["z"], name="relu_out")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 6, 6])], inits)
    return make_model(graph, opset=15)


def test_precision_diagnostics_reach_the_context_in_pass_order(tmp_path):
    """INT8 blocks: collapse records the random calibration, embed / write the operators left in
    FP32; both join ctx.diagnostics after analyze's, once each, streamed to a file or not."""
    # substitute: the normalization-only BN is an operator the quantizer leaves in FP32
    ctx = Context(_conv_bn_mod_relu(), load_hardware("mlu100"),
                  Options.of(strategy="all-fusion", precision="int8", bn_mode="substitute"))
    seen: list[tuple[str, list[str]]] = []

    class Rules(Instrument):
        def after(self, p, ctx):
            seen.append((p.name, [d.rule for d in ctx.diagnostics if d.stage == "precision"]))

    PassManager(FUSE, [Rules()]).run(ctx)
    by_pass = dict(seen)
    assert by_pass["plan"] == [] and by_pass["collapse"] == ["random-calibration"]
    assert by_pass["embed"][0] == "random-calibration" and set(by_pass["embed"][1:]) == {"int8-float-op"}
    assert ctx.bodies is not None and ctx.bodies.diagnostics == []  # moved, not copied
    stages = [d.stage for d in ctx.diagnostics]
    assert stages == sorted(stages, key=["normalize", "rewrite", "analyze", "precision"].index)
    assert "bn/norm" in [d.node for d in ctx.diagnostics if d.rule == "int8-float-op"]
    assert ("analyze", "acos") in [(d.stage, d.node) for d in ctx.diagnostics]
    source = tmp_path / "m.onnx"
    onnx.save(_conv_bn_mod_relu(), source)
    streamed = api.fuse_to_file(source, tmp_path / "f.onnx", strategy="all-fusion", precision="int8",
                                bn_mode="substitute")
    assert streamed.diagnostics == ctx.diagnostics


def test_fp32_and_fp16_runs_make_no_calibration():
    for precision, made in ((None, False), ("fp32", False), ("fp16", True)):
        ctx = Context(_conv_bn_mod_relu(), load_hardware("mlu100"), Options.of(strategy="all-fusion", precision=precision))
        PassManager(FUSE, []).run(ctx)
        assert (ctx.bodies is not None) == made
        assert not [d for d in ctx.diagnostics if d.stage == "precision"]
        assert calibration_report(ctx.bodies) is None


def test_the_plan_pass_plans_at_the_precision_asked():
    """The strategy runs on the layers at that precision (its own blocks and MPs for it), every
    block gets the precision, and each block is priced at it."""
    from onnxmlu.plan.perf.layers import layers_at_precision
    from onnxmlu.plan.perf.model import make_cost, plan_block_latencies_us
    from onnxmlu.plan.plan import with_precision
    from onnxmlu.plan.strategies import run_strategy
    from onnxmlu.tools.testing import zoo_model

    hw = load_hardware("mlu100")
    for precision in ("fp16", "int8"):
        ctx = PassManager(PLAN, []).run(Context(zoo_model("resnet18"), hw, Options.of(strategy="optimal",
                                                                                   precision=precision)))
        layers = ctx.analysis.layers
        expected = with_precision(run_strategy(layers_at_precision(layers, precision), hw, "optimal"), precision)
        assert ctx.plan.blocks == expected.blocks
        assert ctx.block_latency_us == pytest.approx(plan_block_latencies_us(expected, layers, make_cost(hw)))
    fp32 = PassManager(PLAN, []).run(Context(zoo_model("resnet18"), hw, Options.of(strategy="optimal")))
    assert sum(ctx.block_latency_us) < sum(fp32.block_latency_us)


def test_an_unknown_precision_is_refused_and_a_planner_can_be_slotted_in(monkeypatch):
    """``Options`` refuses what no planner takes; a planner registered for a name (as
    ``--precision auto`` is) is what the plan pass calls for it, and what it leaves reaches the
    context."""
    from onnxmlu.diagnostics import Diagnostic
    from onnxmlu.errors import OnnxMluError
    from onnxmlu.plan.plan import plan_from_ranges
    from onnxmlu.precision import planners
    from onnxmlu.registry import Registry

    with pytest.raises(OnnxMluError, match=f"--precision must be one of {', '.join(PRECISIONS)}, auto, not 'mixed'"):
        Options.of(precision="mixed")
    calls = []

    def planner(analysis, hw, options):
        calls.append(options.precision.name)
        plan = plan_from_ranges([(0, len(analysis.layers), 1, "fp16")])
        return planners.Planned(plan, [1.0], diagnostics=[Diagnostic("precision", "note", "", "planned")])

    registry = Registry("precision", planners.PLANNERS.items())
    registry.register("mixed", planners.PrecisionPlanner("mixed", planner))
    monkeypatch.setattr(planners, "PLANNERS", registry)
    ctx = PassManager(PLAN, []).run(Context(conv_chain_model(), load_hardware("mlu100"), Options.of(precision="mixed")))
    assert [d.rule for d in ctx.diagnostics if d.stage == "precision"] == ["note"]
    assert calls == ["mixed"] and ctx.block_latency_us == [1.0] and ctx.plan.blocks[0].precision == "fp16"


# ------------------------------------------------------------------------------ contracts
class _Analyze:
    """The real analyze pass's declaration with a body that breaks it in a chosen way."""

    name, requires, where, what = "analyze", ("model",), "x", "x"

    def __init__(self, provides=("analysis",), may_leave=(), writes=()) -> None:
        self.provides, self.may_leave, self.writes = provides, may_leave, writes

    def label(self, ctx):
        return self.name

    def run(self, ctx):
        for name in self.writes:
            setattr(ctx, name, None)


def _contracted(*passes) -> None:
    from onnxmlu.pipeline import Load

    PassManager([Load(), *passes], instruments=()).run(Context(conv_chain_model(), load_hardware("mlu100")))


def test_a_pass_that_skips_its_declared_output_fails_naming_the_pass():
    from onnxmlu.pipeline import PassContractError

    # block_latency_us once defaulted to [], so a pass that forgot it went unnoticed
    with pytest.raises(PassContractError, match=r"pass 'analyze' provides ctx.block_latency_us but did not write it"):
        _contracted(_Analyze(provides=("analysis", "block_latency_us"), writes=("analysis",)))


def test_a_pass_that_writes_a_result_it_does_not_declare_fails_naming_the_pass():
    from onnxmlu.pipeline import PassContractError

    with pytest.raises(PassContractError, match=r"pass 'analyze' wrote ctx.plan, which it does not declare"):
        _contracted(_Analyze(writes=("analysis", "plan")))
    _contracted(_Analyze(may_leave=("plan",), writes=("analysis", "plan")))  # declared: fine


def test_results_are_absent_until_produced_and_settings_are_frozen():
    from onnxmlu.pipeline import MissingResultError

    ctx = Context(conv_chain_model(), load_hardware("mlu100"))
    with pytest.raises(MissingResultError, match="ctx.plan was read before any pass produced it"):
        _ = ctx.plan
    assert ctx.profile is None and not ctx.has("profile")  # optional: absent reads as None
    with pytest.raises(AttributeError, match="setting"):
        ctx.options = Options()


def test_a_pass_list_is_a_pass_whose_contract_is_its_passes():
    from onnxmlu.pipeline import BRANCH, Sequential

    plan = Sequential("plan-only", PLAN)
    assert plan.requires == ("source", "hardware")
    assert {"model", "analysis", "plan", "block_latency_us", "bodies"} <= set(plan.provides)
    assert {"rewrite_report", "auto", "profile"} <= set(plan.may_leave)
    assert "branches" in BRANCH.provides and [p.name for p in BRANCH][-2:] == ["branches", "embed"]
    ctx = PassManager([plan], instruments=()).run(Context(conv_chain_model(), load_hardware("mlu100")))
    assert ctx.plan.blocks
