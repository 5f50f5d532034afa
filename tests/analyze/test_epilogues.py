"""Epilogues stay with their producer: the node order puts a Conv's BN/Mul/Add/activation
chain right after the Conv, and a fusing plan never starts a block inside such a chain (a
CPU runtime fuses the chain into the Conv's kernel only within one block)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.plan.perf.layers import Layer
from onnxmlu.plan.plan import Block, Plan, keep_epilogues
from onnxmlu.tools.zoo import build_model

F = TensorProto.FLOAT
C = 4


def _branchy(scale_name: str = "s", extra_output: bool = False) -> onnx.ModelProto:
    """x -> convA and x -> convB; convA's Mul by ``scale_name`` and Relu come after convB in
    the file, then Add(reluA, convB)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((C, C, 3, 3)) * 0.2).astype(np.float32), n)
             for n in ("wa", "wb")] + [numpy_helper.from_array(np.full((C, 1, 1), 0.5, np.float32), "s")]
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1], name="convA"),
             helper.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1], name="convB"),
             helper.make_node("Mul", ["a", scale_name], ["am"], name="mulA"),
             helper.make_node("Relu", ["am"], ["ar"], name="reluA"),
             helper.make_node("Add", ["ar", "b"], ["y"], name="add")]
    outputs = [helper.make_tensor_value_info("y", F, None)]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("a", F, None))
    inputs = [helper.make_tensor_value_info("x", F, [1, C, 8, 8])]
    if scale_name != "s":
        inputs.append(helper.make_tensor_value_info(scale_name, F, [C, 1, 1]))
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _names(analysis) -> list[str]:
    return [layer.name for layer in analysis.layers]


def test_a_chain_follows_its_conv_even_when_the_file_interleaves_another_branch():
    analysis = api.inspect(_branchy())
    assert _names(analysis) == ["convA", "mulA", "reluA", "convB", "add"]
    assert [layer.epilogue for layer in analysis.layers] == [False, True, True, False, False]


@pytest.mark.parametrize("model", [_branchy(scale_name="runtime_scale"), _branchy(extra_output=True)],
                         ids=["scale-is-an-input", "conv-output-is-a-graph-output"])
def test_no_epilogue_where_the_runtime_could_not_fuse(model):
    """A Mul by a tensor computed at run time, or a Conv whose output is also read elsewhere:
    nothing to keep together (the file's order stays)."""
    analysis = api.inspect(model)
    assert not any(layer.epilogue for layer in analysis.layers)
    assert _names(analysis) == ["convA", "convB", "mulA", "reluA", "add"]


def _layers(epilogues: list[bool]) -> list[Layer]:
    return [Layer(index=i, name=f"l{i}", op_type="Mul" if e else "Conv", kind="eltwise" if e else "conv",
                  ops=1.0, epilogue=e) for i, e in enumerate(epilogues)]


@pytest.mark.parametrize("blocks, precisions, expected", [
    ([(0, 2), (2, 5)], ("fp32", "fp32"), [(0, 4), (4, 5)]),  # the boundary moves past the chain
    ([(0, 2), (2, 4), (4, 5)], ("fp32",) * 3, [(0, 4), (4, 5)]),  # the block after was only the chain
    ([(0, 2), (2, 5)], ("fp32", "int8"), [(0, 2), (2, 5)]),  # two precisions: left as planned
    ([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)], ("fp32",) * 5, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]),
])
def test_keep_epilogues(blocks, precisions, expected):
    layers = _layers([False, False, True, True, False])  # layers 2-3 are the chain of layer 1
    plan = Plan(tuple(Block(s, e, 4, p) for (s, e), p in zip(blocks, precisions)), "test", "mlu100")
    kept = keep_epilogues(plan, layers)
    assert [(b.start, b.stop) for b in kept.blocks] == expected
    kept.validate(layers, 32)


@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2"])
@pytest.mark.parametrize("strategy", ["dlfusion", "optimal", "fusion-fixed-mp"])
def test_zoo_plans_start_no_block_inside_a_chain(name, strategy):
    """The BN rewrite makes every Conv of these networks a Conv -> BN -> Mul -> Add chain."""
    report = api.plan(build_model(name), strategy=strategy)
    assert sum(layer.epilogue for layer in report.layers) > 50
    assert not any(report.layers[b.start].epilogue for b in report.plan.blocks)
