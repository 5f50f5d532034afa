"""Models that arrive quantized (docs/precision.md): onnxruntime's quantize_static (QDQ and
QOperator) and quantize_dynamic output runs inside INT8 blocks, with the model's own
quantization nodes and parameters kept bit for bit, priced as INT8, and the fused model runs in
plain onnxruntime and matches the original."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType

from onnxmlu.sessions import new_options
from onnxmlu import api
from onnxmlu.analyze.optable import QUANTIZED_OPS
from onnxmlu.collapse.blocks import collapse
from onnxmlu.plan.perf.hardware import load_hardware
from onnxmlu.plan.perf.layers import layers_at_precision
from onnxmlu.plan.perf.model import block_latency_us, make_cost
from onnxmlu.plan.plan import Plan, plan_from_ranges, with_precision
from onnxmlu.plan.labels import honest_labels
from onnxmlu.precision.bodies import BlockBodies
from onnxmlu.collapse.own import CALIBRATION_KEY, OWN_INT8_NOTE
from onnxmlu.runtime import InferenceSession, reference_session
from onnxmlu.schema import block_precision, body_model, is_fusion_block
from onnxmlu.tools.testing import make_model
from precision_models import plain_session
from quantized_models import float_cnn, float_mlp, quantized

HW = load_hardware("mlu100")
QUANTIZED_TYPES = (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT32)
#: The model families onnxruntime's quantization tool writes, each from a seeded float model.
CASES = {
    "qdq": lambda: quantized(float_cnn(), "qdq"),
    "qdq-per-channel-s8": lambda: quantized(float_cnn(), "qdq", per_channel=True, activation_type=QuantType.QInt8,
                                            extra_options={"ActivationSymmetric": True}),
    "qdq-mlp": lambda: quantized(float_mlp(), "qdq"),
    "qdq-float-conv": lambda: quantized(float_cnn(), "qdq", nodes_to_exclude=["conv2"]),
    "qoperator": lambda: quantized(float_cnn(), "qoperator"),
    "qoperator-per-channel": lambda: quantized(float_cnn(), "qoperator", per_channel=True),
    "qoperator-mlp": lambda: quantized(float_mlp(), "qoperator"),
    "dynamic-cnn": lambda: quantized(float_cnn(), "dynamic"),
    "dynamic-mlp": lambda: quantized(float_mlp(), "dynamic"),
}
#: Steps of the output scale by which onnxruntime's optimized original differs from the
#: unoptimized reference (measured: 0 for most, 1 for qdq-mlp's softmax, 2 for qdq-float-conv
#: where one step of an early activation goes through a float conv). See
#: test_fused_model_matches_the_original.
MAX_OUTPUT_STEPS = 2


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    model = CASES[request.param]()
    return request.param, model, api.fuse(model)


def _blocks(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if is_fusion_block(n)]


def _standard_quantized_ops(graph: onnx.GraphProto) -> list[str]:
    return [n.op_type for n in graph.node if n.domain in ("", "ai.onnx") and n.op_type in QUANTIZED_OPS]


def _feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def test_quantized_nodes_run_inside_int8_blocks(case):
    name, model, result = case
    fused = result.model
    assert _standard_quantized_ops(fused.graph) == [], "a standard quantized node stayed on the host"
    inside = collections.Counter(op for b in _blocks(fused) for op in _standard_quantized_ops(body_model(b).graph))
    assert inside == collections.Counter(_standard_quantized_ops(model.graph))
    assert all(block_precision(b) == "int8" for b in _blocks(fused))
    assert all(layer.quantized and layer.precision == "int8" for layer in result.analysis.layers
               if layer.op_type in QUANTIZED_OPS)
    # what stays on the host is outside the standard domain (com.microsoft's QLinearAdd, ...)
    assert all(n.domain == "com.microsoft" for n in fused.graph.node if not is_fusion_block(n))
    assert not [d for d in result.diagnostics if d.rule == "random-calibration"]


def test_quantization_parameters_are_kept_bit_for_bit(case):
    """Every initializer of the original that is INT8, UINT8 or INT32 (weights, biases, zero
    points) or that a quantized operator reads (scales) is in a body, or in the outer graph
    for a host node, and every initializer that is there has the original's type, dims and
    bytes (the weight scales of dynamic quantization, read by a float Mul, included)."""
    _, model, result = case
    fused = result.model
    kept = {t.name: t for b in _blocks(fused) for t in body_model(b).graph.initializer}
    kept.update({t.name: t for t in fused.graph.initializer})
    readers: dict[str, set[str]] = collections.defaultdict(set)
    for node in model.graph.node:
        for name in node.input:
            readers[name].add(node.op_type)
    checked = 0
    for tensor in model.graph.initializer:
        if tensor.name not in kept:  # folded away: only a float layer's constants may be
            assert tensor.data_type not in QUANTIZED_TYPES and not readers[tensor.name] & QUANTIZED_OPS, tensor.name
            continue
        ours = kept[tensor.name]
        assert (ours.data_type, list(ours.dims)) == (tensor.data_type, list(tensor.dims))
        assert numpy_helper.to_array(ours).tobytes() == numpy_helper.to_array(tensor).tobytes(), tensor.name
        checked += tensor.data_type in QUANTIZED_TYPES
    assert checked >= 4


def test_block_bodies_are_the_models_own_nodes_marked_int8(case):
    """No QuantizeLinear/DequantizeLinear is added or removed: the body is not re-quantized,
    a float layer of the model stays float (qdq-float-conv's conv2)."""
    name, model, result = case
    normalized = {n.name: n for n in result.analysis.model.graph.node}
    for block in _blocks(result.model):
        body = body_model(block)
        assert all(n.name in normalized and n == normalized[n.name] for n in body.graph.node)
        meta = {p.key: p.value for p in body.metadata_props}
        assert meta == {"onnxmlu.precision": "int8", CALIBRATION_KEY: OWN_INT8_NOTE}
        assert OWN_INT8_NOTE in block.doc_string and "calibrated on" not in block.doc_string
    if name == "qdq-float-conv":
        convs = [n for b in _blocks(result.model) for n in body_model(b).graph.node if n.op_type == "Conv"]
        assert len(convs) == 2  # conv1 of a QDQ unit, conv2 float as quantize_static left it


def test_fused_model_matches_the_original(case, library):
    """Plain onnxruntime with only the library registered. The inner sessions run at
    onnxruntime's default optimization level, which fuses DQ -> op -> Q units into integer
    kernels (QLinearConv, QLinearMatMul, ...) exactly as it does for the original run by
    itself: the fused model equals, bit for bit, the original at that level. Against the
    reference (every optimization off, the QDQ units computed in float and re-quantized) it
    differs where the integer kernel rounds differently: at most MAX_OUTPUT_STEPS steps of the
    output's quantization scale (the same difference the original shows at the two levels)."""
    name, model, result = case
    fused = plain_session(result.model, library)
    optimized = ort.InferenceSession(model.SerializeToString(), new_options(), providers=["CPUExecutionProvider"])
    reference = reference_session(model)
    ours = InferenceSession(result.model)  # with the block-layout pass
    step = _output_step(model)
    for seed in range(4):
        feeds = _feeds(model, seed)
        got = fused.run(None, feeds)[0]
        np.testing.assert_array_equal(got, optimized.run(None, feeds)[0])
        np.testing.assert_array_equal(ours.run(None, feeds)[0], got)
        np.testing.assert_allclose(got, reference.run(None, feeds)[0], rtol=0, atol=MAX_OUTPUT_STEPS * step + 1e-6)


def _output_step(model: onnx.ModelProto) -> float:
    """The scale of the QuantizeLinear the output is dequantized from (0 for a model whose
    output is computed in float: dynamic quantization's, which must match to 1e-6)."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    node = producer[model.graph.output[0].name]
    if node.op_type == "DequantizeLinear":
        return float(np.max(inits[node.input[1]]))
    return 0.0


def test_a_requested_fp16_or_fp32_plan_runs_quantized_blocks_at_int8():
    model = quantized(float_cnn(), "qdq")
    analysis = api.inspect(model, rewrite=True)
    plan = api.fuse(model).plan
    for asked in ("fp16", "fp32"):
        bodies = BlockBodies(analysis)
        fused = collapse(analysis, with_precision(plan, asked), bodies=bodies)
        assert [block_precision(b) for b in _blocks(fused)] == ["int8"] * len(plan.blocks)
        assert bodies.diagnostics == []  # nothing calibrated, no random-calibration record
        fp16 = api.fuse(model, plan=with_precision(plan, asked))
        assert all(b.precision == "int8" for b in fp16.plan.blocks)


def test_the_plan_stage_promotes_only_blocks_holding_quantized_layers():
    """A QOperator model split into a float block and a quantized one: the float block keeps
    the precision asked, the quantized one becomes INT8; a plan file asking FP16 likewise."""
    model = _float_then_qlinear_conv()
    analysis = api.inspect(model, rewrite=True)
    assert [layer.quantized for layer in analysis.layers] == [False, True, True, True]
    plan = plan_from_ranges([(0, 1, 1, "fp16"), (1, 4, 1, "fp16")], hardware="mlu100")
    promoted = honest_labels(plan, analysis.layers)
    assert [b.precision for b in promoted.blocks] == ["fp16", "int8"]
    assert honest_labels(promoted, analysis.layers) is promoted
    written = Plan.from_json(plan.to_json(analysis.layers), analysis.layers)
    result = api.fuse(model, plan=written)
    assert [block_precision(b) for b in _blocks(result.model)] == ["fp16", "int8"]


def test_layers_at_precision_keeps_quantized_arithmetic_int8():
    """Quantized arithmetic runs INT8 at every precision; another layer arriving quantized (a
    MaxPool on 8-bit values between two QLinearConvs) runs INT8 in an INT8 block and is priced
    as the FP32 analysis would in any other (the integer bytes are the same)."""
    analysis = api.inspect(quantized(float_cnn(), "qoperator"), rewrite=True)
    layers = analysis.layers
    assert {layer.quantized for layer in layers} == {True}
    assert layers_at_precision(layers, "int8") == layers
    for precision in ("fp32", "fp16"):
        at = layers_at_precision(layers, precision)
        assert [a for a, b in zip(at, layers) if b.int8_arithmetic] == [b for b in layers if b.int8_arithmetic]
        others = [(a, b) for a, b in zip(at, layers) if not b.int8_arithmetic]
        assert others and all(a.precision == "fp32" and a.input_bytes == b.input_bytes for a, b in others)
    mixed = api.inspect(_float_then_qlinear_conv(), rewrite=True).layers
    at16 = layers_at_precision(mixed, "fp16")
    assert [layer.precision for layer in at16] == ["fp16", "int8", "int8", "int8"]


def test_weight_dequantizations_ride_with_their_reader_and_are_not_folded():
    """quantize_static's QDQ weights: each DequantizeLinear of an INT8 weight or INT32 bias is
    neither folded (normalization) nor a host node nor a layer: it is carried into the block
    of the layer that reads it, which counts the weights as its own, at INT8."""
    model = quantized(float_cnn(), "qdq")
    analysis = api.inspect(model, rewrite=True)
    nodes = analysis.model.graph.node
    weight_dqs = [i for i, n in enumerate(nodes) if n.op_type == "DequantizeLinear"
                  and all(analysis.index.is_constant(name) for name in n.input)]
    assert len(weight_dqs) == 6  # w1, b1, w2, b2, fc, fb
    assert set(analysis.carried) == set(weight_dqs) and not set(weight_dqs) & set(analysis.host_reasons)
    conv1 = next(layer for layer in analysis.layers if layer.op_type == "Conv")
    assert conv1.quantized and conv1.weight_bytes == 8 * 3 * 3 * 3 + 8  # INT8 weights, the bias at one byte
    for i in weight_dqs:  # right before its reader in the order
        reader = analysis.carried[i]
        assert analysis.order.index(i) < analysis.order.index(reader)


def test_a_qlinear_conv_is_priced_like_the_same_conv_at_int8():
    """Same operations, shape and (up to its few bytes of scales and zero points) bytes."""
    conv = api.inspect(_single_conv("Conv"), rewrite=True).layers[-1]
    qconv = api.inspect(_single_conv("QLinearConv"), rewrite=True).layers[-1]
    assert qconv.quantized and qconv.kind == "conv" and qconv.precision == "int8"
    int8 = conv.at_precision("int8")
    assert (qconv.ops, qconv.kernel, qconv.in_channels, qconv.out_channels, qconv.out_height) == (
        int8.ops, int8.kernel, int8.in_channels, int8.out_channels, int8.out_height)
    assert (qconv.input_bytes, qconv.output_bytes) == (int8.input_bytes, int8.output_bytes)
    assert 0 <= qconv.weight_bytes - int8.weight_bytes <= 16
    cost = make_cost(HW)
    for mp in (1, 4, 16):
        assert block_latency_us([qconv], mp, HW) == pytest.approx(block_latency_us([int8], mp, HW), rel=1e-4)
        assert cost([qconv], mp) == pytest.approx(cost([int8], mp), rel=1e-4)
        assert cost([qconv], mp) < cost([conv], mp)


def _single_conv(op: str) -> onnx.ModelProto:
    """One 64 -> 64 3x3 convolution on 28x28, as Conv (FP32) or QLinearConv (INT8, no bias)."""
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    if op == "Conv":
        node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
        inits = [numpy_helper.from_array(weight, "w")]
        elem = TensorProto.FLOAT
    else:
        node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], pads=[1, 1, 1, 1])
        inits = _qparams("x", np.uint8) + _qparams("y", np.uint8) + _qparams("w", np.int8)
        inits.append(numpy_helper.from_array(np.clip(weight * 20, -127, 127).astype(np.int8), "w"))
        elem = TensorProto.UINT8
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("x", elem, [1, 64, 28, 28])],
                              [helper.make_tensor_value_info("y", elem, [1, 64, 28, 28])], inits)
    return make_model(graph, 17)


def _qparams(prefix: str, dtype) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(np.array(0.05, np.float32), f"{prefix}s"),
            numpy_helper.from_array(np.array(0, dtype), f"{prefix}z")]


def _float_then_qlinear_conv() -> onnx.ModelProto:
    """A float Relu, then QuantizeLinear -> QLinearConv -> DequantizeLinear."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("QuantizeLinear", ["r", "xs", "xz"], ["q"], name="quantize"),
             helper.make_node("QLinearConv", ["q", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["c"], name="qconv",
                              pads=[1, 1, 1, 1]),
             helper.make_node("DequantizeLinear", ["c", "ys", "yz"], ["y"], name="dequantize")]
    inits = _qparams("x", np.uint8) + _qparams("y", np.uint8) + _qparams("w", np.int8)
    inits.append(numpy_helper.from_array(rng.integers(-100, 100, (8, 8, 3, 3)).astype(np.int8), "w"))
    graph = helper.make_graph(nodes, "float_then_qlinear",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12])], inits)
    return make_model(graph, 17)


def test_int8_weights_written_as_cast_and_scale_ride_into_the_block_exactly(library):
    """An exporter's INT8 weights: Cast(int8 constant) * scale -> MatMul. The Cast and the Mul
    are carried into the MatMul's block with the INT8 weights, not folded nor left on the
    host; the MatMul arrives quantized; the fused model equals the original exactly."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("Cast", ["wq"], ["wf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["wf", "ws"], ["w"], name="scale"),
             helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
             helper.make_node("Relu", ["m"], ["y"], name="relu")]
    weights = rng.integers(-127, 128, (256, 128)).astype(np.int8)  # 128 KB as FP32: not folded either way
    inits = [numpy_helper.from_array(weights, "wq"), numpy_helper.from_array(np.float32(0.01), "ws")]
    graph = helper.make_graph(nodes, "int8_weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 128])], inits)
    model = make_model(graph, 17)
    result = api.fuse(model)
    assert [n.op_type for n in result.model.graph.node] == ["MLUFusionBlock"]
    (block,) = _blocks(result.model)
    body = body_model(block)
    assert block_precision(block) == "int8" and [n.op_type for n in body.graph.node] == ["Cast", "Mul", "MatMul", "Relu"]
    assert numpy_helper.to_array(next(t for t in body.graph.initializer if t.name == "wq")).tobytes() == weights.tobytes()
    matmul = next(layer for layer in result.analysis.layers if layer.op_type == "MatMul")
    assert matmul.quantized and matmul.weight_bytes == 256 * 128  # one byte a weight
    assert not next(layer for layer in result.analysis.layers if layer.op_type == "Relu").quantized
    fused = plain_session(result.model, library)
    feeds = {"x": rng.standard_normal((4, 256)).astype(np.float32)}
    np.testing.assert_allclose(fused.run(None, feeds)[0], reference_session(model).run(None, feeds)[0], rtol=1e-6, atol=1e-6)


def test_quantization_to_other_types_stays_on_the_host_with_a_reason():
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="to_int16"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="from_int16")]
    inits = [numpy_helper.from_array(np.float32(0.01), "s"), numpy_helper.from_array(np.int16(0), "z")]
    graph = helper.make_graph(nodes, "int16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    analysis = api.inspect(make_model(graph, 21), rewrite=True)
    reasons = {row["node"]: row["reason"] for row in analysis.host_nodes()}
    assert reasons == {"to_int16": "QuantizeLinear of INT16: the accelerator's quantized units are INT8",
                       "from_int16": "DequantizeLinear of INT16: the accelerator's quantized units are INT8"}


@pytest.mark.parametrize("host_first", [True, False])
def test_a_weight_dequantization_also_read_on_the_host(library, host_first):
    """DequantizeLinear(w) read by Det (a host op) and by a MatMul. When the Det must run
    first (the MatMul reads its result), the dequantization stays on the host with it and the
    MatMul's block reads the FP32 weights; otherwise it is carried into the MatMul's block,
    which outputs the weights for the Det. Either way the fused model matches the original."""
    rng = np.random.default_rng(9)
    matmul_input = "xd" if host_first else "x"
    nodes = [helper.make_node("DequantizeLinear", ["wq", "s"], ["w"], name="dq"),
             helper.make_node("Det", ["w"], ["d"], name="det"),
             helper.make_node("Add", ["x", "d"], ["xd"], name="shift"),
             helper.make_node("MatMul", [matmul_input, "w"], ["m"], name="matmul"),
             helper.make_node("Add", ["m", "xd"], ["y"], name="add")]
    inits = [numpy_helper.from_array(rng.integers(-20, 20, (4, 4)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.float32(0.1), "s")]
    graph = helper.make_graph(nodes, "host_reader", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    model = make_model(graph, 17)
    result = api.fuse(model)
    host = {row["node"] for row in result.analysis.host_nodes()}
    if host_first:
        assert host == {"dq", "det"} and result.analysis.carried == {}
    else:
        assert host == {"det"} and len(result.analysis.carried) == 1
    fused = plain_session(result.model, library)
    feeds = {"x": rng.standard_normal((2, 4)).astype(np.float32)}
    np.testing.assert_allclose(fused.run(None, feeds)[0], reference_session(model).run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_fp32_weights_quantized_in_the_graph_ride_into_the_block(library):
    """A QDQ export that keeps FP32 weights: Q(w) -> DQ -> Conv. The QuantizeLinear and the
    DequantizeLinear of the weight are carried into the Conv's block with the FP32 weights."""
    rng = np.random.default_rng(11)
    nodes = [helper.make_node("QuantizeLinear", ["w", "ws", "wz"], ["wq"], name="quantize_w"),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="dequantize_w"),
             helper.make_node("Conv", ["x", "wd"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    inits += [numpy_helper.from_array(np.float32(0.02), "ws"), numpy_helper.from_array(np.int8(0), "wz")]
    graph = helper.make_graph(nodes, "qat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = make_model(graph, 17)
    result = api.fuse(model)
    assert len(result.analysis.carried) == 2 and result.analysis.host_reasons == {}
    (block,) = _blocks(result.model)
    assert block_precision(block) == "int8"
    assert [n.op_type for n in body_model(block).graph.node] == ["QuantizeLinear", "DequantizeLinear", "Conv"]
    fused = plain_session(result.model, library)
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    np.testing.assert_allclose(fused.run(None, feeds)[0], reference_session(model).run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_an_8_bit_image_input_is_not_a_quantized_value():
    """A float model reading a UINT8 image (Cast to float, then a conv) arrives as FP32: only
    8-bit tensors made by quantized layers count."""
    rng = np.random.default_rng(13)
    nodes = [helper.make_node("Cast", ["image"], ["x"], name="to_float", to=TensorProto.FLOAT),
             helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    graph = helper.make_graph(nodes, "image", [helper.make_tensor_value_info("image", TensorProto.UINT8, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    result = api.fuse(make_model(graph, 17))
    assert [layer.quantized for layer in result.analysis.layers] == [False, False]
    assert [block_precision(b) for b in _blocks(result.model)] == ["fp32"]
