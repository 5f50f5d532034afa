"""Honest labels and prices: a block's ``precision`` is one of fp32/fp16/int8 (the library
refuses any other value when the session is created) and says what its body computes; an
operator INT8 has no form for is priced at FP32 inside an INT8 block."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxmlu import api
from onnxmlu.plan.perf.hardware import load_hardware
from onnxmlu.plan.perf.layers import layers_at_precision
from onnxmlu.plan.perf.model import make_cost, plan_block_latencies_us
from onnxmlu.plan.plan import with_precision
from onnxmlu.precision import INT8_OPS
from onnxmlu.schema import block_precision, body_model, is_fusion_block
from onnxmlu.tools.testing import make_model
from onnxmlu.precisions import PRECISIONS
from precision_models import plain_session, residual_model

#: The labels the runtime library accepts, as its messages list them (custom_ops/label_rule.h).
_LABELS = f"{', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}"

QDQ = {"QuantizeLinear", "DequantizeLinear"}


def _sin_cos() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Sin", ["x"], ["s"]), helper.make_node("Cos", ["s"], ["y"])], "trig",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    return make_model(graph, 17)


def _blocks(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if is_fusion_block(n)]


def test_the_int8_operator_registry_is_onnxruntimes_quantizer():
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    assert INT8_OPS == (set(QDQRegistry) | set(QLinearOpsRegistry)) - {"EmbedLayerNormalization"}  # com.microsoft


def test_a_block_with_nothing_to_quantize_is_labelled_and_priced_fp32():
    result = api.fuse(_sin_cos(), precision="int8", strategy="all-fusion")
    assert [b.precision for b in result.plan.blocks] == ["fp32"]
    (node,) = _blocks(result.model)
    assert block_precision(node) == "fp32"
    assert not {n.op_type for n in body_model(node).graph.node} & QDQ
    fp32 = api.fuse(_sin_cos(), strategy="all-fusion")
    assert result.block_latency_us == pytest.approx(fp32.block_latency_us)


def test_every_int8_label_holds_quantized_arithmetic():
    """Label/body agreement: each block labelled int8 has an operator fed by a DequantizeLinear
    (it computes on INT8 values); each fp32 block has no QuantizeLinear/DequantizeLinear."""
    fused = api.fuse(residual_model(seed=2), precision="int8", strategy="dlfusion").model
    for node in _blocks(fused):
        body = body_model(node).graph
        dequantized = {o for n in body.node if n.op_type == "DequantizeLinear" for o in n.output}
        quantized = [n for n in body.node if n.op_type not in QDQ and set(n.input) & dequantized]
        if block_precision(node) == "int8":
            assert quantized, node.name
        else:
            assert not {n.op_type for n in body.node} & QDQ, node.name


def _conv_sin_conv() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = [onnx.numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1, f"w{k}")
         for k in range(2)]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w0"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Sin", ["c"], ["s"]),
         helper.make_node("Conv", ["s", "w1"], ["y"], pads=[1, 1, 1, 1])], "conv_sin_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], w)
    return make_model(graph, 17)


def test_operators_without_an_int8_form_are_priced_at_fp32_inside_an_int8_block():
    result = api.fuse(_conv_sin_conv(), precision="int8", strategy="all-fusion")
    layers = result.analysis.layers
    assert [b.precision for b in result.plan.blocks] == ["int8"]
    at_int8 = layers_at_precision(layers, "int8")
    assert [(l.op_type, l.precision) for l in at_int8] == [("Conv", "int8"), ("Sin", "fp32"), ("Conv", "int8")]
    assert at_int8[1] is layers[1]  # the Sin layer's bytes and price are its FP32 ones
    # and the body agrees: the convolutions are quantized, Sin is the float operator it was
    body = body_model(_blocks(result.model)[0]).graph
    assert {n.op_type for n in body.node} >= {"Sin", "DequantizeLinear", "QuantizeLinear"}
    cost = make_cost(load_hardware("mlu100"))
    everything = with_precision(result.plan, "fp32")
    assert sum(plan_block_latencies_us(result.plan, layers, cost)) < sum(plan_block_latencies_us(everything, layers, cost))


@pytest.mark.parametrize("label", ["bogus", "INT8", "int4"])
def test_the_library_refuses_an_unknown_precision_when_the_session_is_created(library, label):
    fused = api.fuse(residual_model(seed=3)).model
    node = _blocks(fused)[0]
    node.attribute.append(helper.make_attribute("precision", label))
    with pytest.raises(Exception, match=f"attribute 'precision' must be {_LABELS}, got '" + label):
        plain_session(fused, library)
    node.attribute[-1].s = b"fp32"
    session = plain_session(fused, library)
    x = np.zeros((1, 3, 12, 12), np.float32)
    assert session.run(None, {"x": x})


# ------------------------------------------------------------------------------ --keep-fp32
def _precision_of(result, name: str) -> str:
    k = next(i for i, layer in enumerate(result.analysis.layers) if layer.name == name)
    return next(b.precision for b in result.plan.blocks if b.start <= k < b.stop)


def test_keep_fp32_cuts_a_fixed_precision_block_around_the_kept_layers():
    model = residual_model(seed=2)
    result = api.fuse(model, precision="int8", strategy="all-fusion", keep_fp32=["conv2", "fc*"])
    assert _precision_of(result, "conv2") == "fp32" and _precision_of(result, "fc") == "fp32"
    assert _precision_of(result, "fc_bias") == "fp32"  # fc* matches it too
    assert _precision_of(result, "conv1") == "int8" and _precision_of(result, "conv3") == "int8"
    assert [b.precision for b in result.plan.blocks] == ["int8", "fp32", "int8", "fp32"]
    assert {block_precision(n) for n in _blocks(result.model)} == {"int8", "fp32"}


def test_keep_fp32_is_honoured_by_auto_and_a_pattern_matching_nothing_is_refused():
    model = residual_model(seed=2)
    result = api.fuse(model, precision="auto", accuracy="cosine>=0.99", keep_fp32=["conv*"])
    for name in ("conv1", "conv2", "conv3"):
        assert _precision_of(result, name) == "fp32"
    with pytest.raises(Exception, match="--keep-fp32 'nothing_here' matches no layer"):
        api.fuse(model, precision="int8", keep_fp32=["nothing_here"])


# ------------------------------------------------------------------------------ imported QDQ prices
def test_an_imported_qdq_model_is_priced_as_its_int8_layers_never_slower_than_fp32():
    """quantize_static's QDQ model: its QuantizeLinear/DequantizeLinear pairs are folded into the
    INT8 layers for pricing (no operations, no issue slot), so its optimal plan is no slower than
    the float model's own FP32 optimum (it was 32 % slower, 349 against 265 µs, when every pair
    was priced as a layer of its own)."""
    from quantized_models import float_cnn, quantized

    from onnxmlu.plan.perf.model import folded_qdq

    original = float_cnn()
    qdq = api.fuse(quantized(original, "qdq"), strategy="optimal")
    fp32 = api.fuse(original, strategy="optimal")
    folded = [layer for layer in qdq.analysis.layers if folded_qdq(layer)]
    assert folded and all(layer.op_type in ("QuantizeLinear", "DequantizeLinear") for layer in folded)
    assert sum(qdq.block_latency_us) <= sum(fp32.block_latency_us)


# ------------------------------------------------------------------------------ labels = bodies
def test_a_block_cut_from_the_quantized_arithmetic_around_it_is_fp32(library):
    """A QDQ model's softmax (the float operator of a QDQ unit: arrives quantized) in a block of
    its own, its DequantizeLinear and QuantizeLinear in the blocks around it: the body holds a
    float Softmax and nothing quantized, so the block is FP32 -- label, price (the softmax at its
    FP32 bytes) and body -- and the library runs it; the blocks around stay INT8."""
    from quantized_models import float_mlp, quantized

    from onnxmlu.plan.labels import honest_labels
    from onnxmlu.plan.plan import plan_from_ranges

    model = quantized(float_mlp(), "qdq")
    analysis = api.inspect(model, rewrite=True)
    layers = analysis.layers
    k = next(i for i, layer in enumerate(layers) if layer.op_type == "Softmax")
    assert layers[k].quantized and not layers[k].int8_arithmetic
    plan = plan_from_ranges([(0, k, 1, "int8"), (k, k + 1, 1, "int8"), (k + 1, len(layers), 1, "int8")],
                            hardware="mlu100")
    honest = honest_labels(plan, layers)
    assert [b.precision for b in honest.blocks] == ["int8", "fp32", "int8"]
    result = api.fuse(model, plan=plan)
    assert [block_precision(n) for n in _blocks(result.model)] == ["int8", "fp32", "int8"]
    softmax = _blocks(result.model)[1]
    assert [n.op_type for n in body_model(softmax).graph.node] == ["Softmax"]
    cost = make_cost(load_hardware("mlu100"))
    fp32_softmax = layers[k].at_precision("fp32")
    assert fp32_softmax.precision == "fp32" and fp32_softmax.input_bytes == 4 * layers[k].input_bytes
    as_fp32 = plan_block_latencies_us(with_precision(plan, "fp32"), layers, cost)[1]
    assert result.block_latency_us[1] == pytest.approx(as_fp32) and as_fp32 >= cost([layers[k]], 1)
    x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    got = plain_session(result.model, library).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, plain_session(model, library).run(None, {"x": x})[0], atol=2 / 255)


def _sin_op_cos(op: str) -> onnx.ModelProto:
    """Sin -> ``op`` -> Cos on x[2, 8, 6, 6] (the operator between two that INT8 has no form for)."""
    rng = np.random.default_rng(1)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype(np.float32), "w")
    extra = {"Conv": (["w"], [weight], {}), "Add": (["s"], [], {}), "MatMul": (["s"], [], {}),
             "MaxPool": ([], [], {"kernel_shape": [2, 2]}), "Transpose": ([], [], {"perm": [0, 2, 3, 1]}),
             "Concat": (["s"], [], {"axis": 1}), "Softmax": ([], [], {})}.get(op, ([], [], {}))
    inputs, inits, attrs = extra
    graph = helper.make_graph(
        [helper.make_node("Sin", ["x"], ["s"]), helper.make_node(op, ["s", *inputs], ["o"], **attrs),
         helper.make_node("Cos", ["o"], ["y"])], f"sin_{op}_cos",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return make_model(graph, 17)


@pytest.mark.parametrize("op", ["Conv", "Add", "MatMul", "Concat", "Softmax", "Sigmoid", "GlobalAveragePool",
                                "Relu", "MaxPool", "Transpose", "Flatten", "Clip"])
def test_int8_is_asked_of_a_block_its_label_follows_what_the_quantizer_quantizes(library, op):
    """INT8_ANCHOR_OPS are the operators onnxruntime's quantizer quantizes with nothing
    quantized before them: a block holding one is INT8 and its body holds QDQ pairs; a block
    holding only others (Relu, MaxPool, Transpose, ...) would come out unchanged and is FP32."""
    from onnxmlu.precision import INT8_ANCHOR_OPS

    result = api.fuse(_sin_op_cos(op), precision="int8", strategy="all-fusion")
    (node,) = _blocks(result.model)
    holds_qdq = bool({n.op_type for n in body_model(node).graph.node} & QDQ)
    assert holds_qdq == (op in INT8_ANCHOR_OPS) and block_precision(node) == ("int8" if holds_qdq else "fp32")
    assert result.plan.blocks[0].precision == block_precision(node)
    plain_session(result.model, library)  # the library agrees with the label


def _integer_arithmetic() -> onnx.ModelProto:
    """int64 x + 3, * 2: no float tensor anywhere."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Mul", ["a", "two"], ["y"])], "ints",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [1, 64])],
        [helper.make_tensor("three", TensorProto.INT64, [], [3]), helper.make_tensor("two", TensorProto.INT64, [], [2])])
    return make_model(graph, 17)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_a_block_with_no_float_tensor_is_fp32_whatever_is_asked(library, precision):
    result = api.fuse(_integer_arithmetic(), precision=precision, strategy="all-fusion")
    assert [b.precision for b in result.plan.blocks] == ["fp32"] * len(result.plan.blocks)
    assert {block_precision(n) for n in _blocks(result.model)} == {"fp32"}
    x = np.arange(64, dtype=np.int64).reshape(1, 64)
    np.testing.assert_array_equal(plain_session(result.model, library).run(None, {"x": x})[0], (x + 3) * 2)


def test_collapse_never_writes_a_label_its_body_does_not_bear_out():
    """The last guard: a transform that left an INT8 body without quantized arithmetic is an
    error naming the block, not a file the library would refuse."""
    from onnxmlu.collapse.blocks import collapse
    from onnxmlu.errors import OnnxMluError
    from onnxmlu.plan.plan import plan_from_ranges
    from onnxmlu.precision.bodies import BlockBodies

    class Unchanged(BlockBodies):
        def transform(self, b, precision, body):
            return body  # an INT8 "transform" that quantizes nothing

    model = _conv_sin_conv()
    analysis = api.inspect(model, rewrite=True)
    plan = plan_from_ranges([(0, len(analysis.layers), 1, "int8")], hardware="mlu100")
    with pytest.raises(OnnxMluError, match="block 0 .*labelled int8 but its body holds no quantized operator"):
        collapse(analysis, plan, bodies=Unchanged(analysis))
