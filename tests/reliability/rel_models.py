"""Broken and unusual models for the reliability battery, built in code (no binaries)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxmlu.tools.testing import conv_chain_model, make_model


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def good_bytes() -> bytes:
    return conv_chain_model().SerializeToString()


def checker_failure() -> onnx.ModelProto:
    """A Relu with two inputs: onnx's checker rejects it (and onnxruntime would, at run time)."""
    model = conv_chain_model()
    model.graph.node[1].input.append("x")
    return model


def cycle() -> onnx.ModelProto:
    model = conv_chain_model()
    model.graph.node[0].input[0] = "r1"  # conv0 reads relu1's output, which depends on conv0
    return model


def dangling_input() -> onnx.ModelProto:
    model = conv_chain_model()
    model.graph.node[2].input[0] = "nothing_makes_this"
    return model


def opset(version: int) -> onnx.ModelProto:
    model = conv_chain_model()
    model.opset_import[0].version = version
    return model


def unknown_domain(typed: bool) -> onnx.ModelProto:
    """relu0 -> com.example::Foo -> relu1: Foo stays on the host between two blocks. Without a
    value_info nothing can type Foo's output, which then enters a block."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu0"),
        helper.make_node("Foo", ["a"], ["b"], name="foo", domain="com.example"),
        helper.make_node("Relu", ["b"], ["y"], name="relu1"),
    ]
    value_info = [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4, 8, 8])] if typed else []
    graph = helper.make_graph(nodes, "unknown_domain", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              value_info=value_info)
    return make_model(graph, extra_opsets={"com.example": 1})


def data_dependent_reshape() -> onnx.ModelProto:
    """x[N,8,H,W] -> Conv -> Relu -> Reshape(Concat(Shape(r)[:1], [-1])) -> MatMul(128x10).

    With H and W symbolic, neither the conv's output map nor the MatMul's inner dimension can be
    sized (the reshape target is computed at run time), so planning needs --input-shape; with
    x:1,8,4,4 everything is static (MatMul K = 8*4*4 = 128)."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, "H", "W"])
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2, "w"),
        numpy_helper.from_array(rng.standard_normal((128, 10)).astype(np.float32) * 0.1, "fc"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"], name="shape", end=1),
        helper.make_node("Concat", ["s", "minus1"], ["target"], axis=0, name="target"),
        helper.make_node("Reshape", ["r", "target"], ["flat"], name="reshape"),
        helper.make_node("MatMul", ["flat", "fc"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(nodes, "data_dependent", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return make_model(graph)


def training_batchnorm() -> onnx.ModelProto:
    """BatchNormalization with training_mode=1 (opset 15): must stay on the host, with a reason."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    inits = [numpy_helper.from_array(np.full(4, v, np.float32), n)
             for n, v in (("scale", 2.0), ("bias", 0.5), ("mean", 0.1), ("var", 1.0))]
    nodes = [
        helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y", "running_mean", "running_var"],
                         training_mode=1, name="bn"),
        helper.make_node("Relu", ["y"], ["z"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "training_bn", [x], [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
                              inits)
    return make_model(graph, opset=15)


def mlp(widths=(64, 128, 128, 32), batch=1, seed=0) -> onnx.ModelProto:
    """MatMul + Add + Relu layers: weights that the block splitter can count."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        inits.append(numpy_helper.from_array((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), f"w{i}"))
        inits.append(numpy_helper.from_array(rng.standard_normal(b).astype(np.float32) * 0.1, f"b{i}"))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"fc{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"bias{i}"),
                  helper.make_node("Relu", [f"a{i}"], [f"h{i}"], name=f"relu{i}")]
        x = f"h{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, widths[0]])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, widths[-1]])], inits)
    return make_model(graph)


def merged_dims(pairs: int = 3) -> onnx.ModelProto:
    """Dims that only onnxruntime's symbolic shape inference can relate, so it must merge them.

    Per pair ``i``: ``x_i`` ``[N, p_i]`` and ``y_i`` ``[N, ?]`` (a dim without a name) are added
    after a contrib ``Gelu`` (no onnx schema: onnx's inference stops there, the symbolic one
    goes on), at the top level and inside both branches of an ``If``. Each Add makes
    ``p_i`` and the name the engine gives ``y_i``'s dim one dim, whose name it must pick."""
    nodes, inputs, outputs = [], [helper.make_tensor_value_info("c", TensorProto.BOOL, [])], []
    for i in range(pairs):
        inputs += [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, ["N", f"p{i}"]),
                   helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["N", None])]
        nodes += [helper.make_node("Gelu", [f"x{i}"], [f"g{i}"], domain="com.microsoft"),
                  helper.make_node("Add", [f"g{i}", f"y{i}"], [f"a{i}"]),
                  helper.make_node("If", ["c"], [f"s{i}"], then_branch=_gelu_branch(i, "Add", "t"),
                                   else_branch=_gelu_branch(i, "Mul", "e")),
                  helper.make_node("Add", [f"a{i}", f"s{i}"], [f"b{i}"]),
                  helper.make_node("Relu", [f"b{i}"], [f"z{i}"])]
        outputs.append(helper.make_tensor_value_info(f"z{i}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "merged_dims", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _gelu_branch(i: int, op: str, tag: str) -> onnx.GraphProto:
    """A branch reading the outer ``x_i`` and ``y_i``: Gelu(x_i) ``op`` y_i."""
    return helper.make_graph([helper.make_node("Gelu", [f"x{i}"], [f"g{i}{tag}"], domain="com.microsoft"),
                              helper.make_node(op, [f"g{i}{tag}", f"y{i}"], [f"o{i}{tag}"])],
                             f"branch{i}{tag}", [], [helper.make_tensor_value_info(f"o{i}{tag}", TensorProto.FLOAT, None)])


def attention_over_pixels(channels: int = 8, pool: int = 2) -> onnx.ModelProto:
    """A diffusion-UNet-like block: latent ``[N, 4, H, W]`` (symbolic H and W) -> Conv -> pool ->
    self-attention over the ``(H/pool) * (W/pool)`` pixels as tokens -> the mean attended
    feature added back -> Conv. Its scores are ``[N, T, T]``: at the 224 x 224 default,
    12544 tokens and 630 MB per score tensor (scores and softmax: over 1.2 GB); at 64 x 64, 4 MB."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((channels, 4, 3, 3)).astype(np.float32) * 0.1, "w_in"),
               numpy_helper.from_array(rng.standard_normal((4, channels, 1, 1)).astype(np.float32) * 0.1, "w_out"),
               numpy_helper.from_array(np.array([0, channels, -1], np.int64), "tokens_shape")]
    nodes = [helper.make_node("Conv", ["latent", "w_in"], ["f"], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["f"], ["p"], kernel_shape=[pool, pool], strides=[pool, pool]),
             helper.make_node("Reshape", ["p", "tokens_shape"], ["t"]),  # [N, C, T]
             helper.make_node("Transpose", ["t"], ["q"], perm=[0, 2, 1]),  # [N, T, C]
             helper.make_node("MatMul", ["q", "t"], ["scores"]),  # [N, T, T]
             helper.make_node("Softmax", ["scores"], ["attn"], axis=-1),
             helper.make_node("MatMul", ["attn", "q"], ["o"]),  # [N, T, C]
             helper.make_node("ReduceMean", ["o"], ["m"], axes=[1], keepdims=1),  # [N, 1, C]
             helper.make_node("Transpose", ["m"], ["mt"], perm=[0, 2, 1]),
             helper.make_node("Unsqueeze", ["mt"], ["m4"], axes=[3]),  # [N, C, 1, 1]
             helper.make_node("Add", ["f", "m4"], ["g"]),
             helper.make_node("Conv", ["g", "w_out"], ["out"])]
    graph = helper.make_graph(nodes, "attention_over_pixels",
                              [helper.make_tensor_value_info("latent", TensorProto.FLOAT, ["N", 4, "H", "W"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4, "H", "W"])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
