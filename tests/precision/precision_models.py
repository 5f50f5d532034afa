"""Small models for the precision tests, built in code, and an FP16 reference evaluator."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.plan.plan import Plan, plan_from_ranges
from onnxmlu.runtime import reference_session
from onnxmlu.tools.testing import make_model

CHANNELS, SIZE, CLASSES = 8, 12, 10
#: The weights of the ``residual_file`` fixture (tests/precision/conftest.py).
RESIDUAL_FILE_SEED = 4


def residual_model(seed: int = 0, batch: int = 1) -> onnx.ModelProto:
    """conv-relu (``h``, also a graph output) -> conv, residual add, relu, maxpool, conv,
    sigmoid, global pool, flatten, matmul + bias (``y``): convolutions with biases, a skip
    connection, a vector op that is not value-preserving, and an FC layer."""
    rng = np.random.default_rng(seed)
    c = CHANNELS

    def weight(name, *shape, scale=None):
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        w = rng.standard_normal(shape) * (scale if scale is not None else np.sqrt(2.0 / fan_in))
        return numpy_helper.from_array(w.astype(np.float32), name)

    inits = [weight("w1", c, 3, 3, 3), weight("b1", c, scale=0.1), weight("w2", c, c, 3, 3), weight("b2", c, scale=0.1),
             weight("w3", c, c, 1, 1), weight("fc", c, CLASSES), weight("fc_b", CLASSES, scale=0.1)]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["h"], name="relu1"),
        helper.make_node("Conv", ["h", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "h"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w3"], ["c3"], name="conv3"),
        helper.make_node("Sigmoid", ["c3"], ["g"], name="sigmoid"),
        helper.make_node("GlobalAveragePool", ["g"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "fc"], ["m"], name="fc"),
        helper.make_node("Add", ["m", "fc_b"], ["y"], name="fc_bias"),
    ]
    graph = helper.make_graph(
        nodes, "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, CLASSES]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [batch, c, SIZE, SIZE])],
        inits,
    )
    return make_model(graph, 17)


def two_block_plan(precisions: tuple[str, str]) -> Plan:
    """Block 0 = conv1 + relu1 (writes ``h``), block 1 = the other ten layers."""
    return plan_from_ranges([(0, 2, 1, precisions[0]), (2, 12, 4, precisions[1])], hardware="mlu100")


def fuse(model: onnx.ModelProto, plan: Plan, **kwargs):
    return api.fuse(model, plan=plan, **kwargs)


def plain_session(fused: onnx.ModelProto, library: str):
    """``fused`` in plain onnxruntime with only the custom-op library registered (no onnxmlu
    code on the path: not onnxmlu.InferenceSession, whose layout pass rewrites the model)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    return ort.InferenceSession(fused.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_plain_and_reference(model: onnx.ModelProto, fused: onnx.ModelProto, library: str, seed: int):
    """(y, h) of ``fused`` in plain onnxruntime with only the library registered, and of the
    original model (the reference session), on the same seeded inputs."""
    from onnxmlu.tools.verify import random_inputs

    plain = plain_session(fused, library)
    feeds = random_inputs(model, seed)
    return plain.run(["y", "h"], feeds), reference_session(model).run(["y", "h"], feeds)


def round16(array: np.ndarray) -> np.ndarray:
    """numpy's float16 rounding (to nearest, ties to even), back in float32."""
    return array.astype(np.float16).astype(np.float32) if array.dtype == np.float32 else array


def fp16_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of ``model`` under the FP16 numeric model, computed layer by layer: each
    node runs alone in FP32 (onnxruntime, optimizations off) on FP16-rounded inputs and
    weights, and numpy rounds its output to FP16."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input)}
    values = {name: round16(x) for name, x in feeds.items()}
    values.update({t.name: round16(numpy_helper.to_array(t)) for t in model.graph.initializer})
    for node in model.graph.node:
        inputs = [n for n in node.input if n]
        graph = helper.make_graph(
            [node], node.name,
            [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(values[n].dtype), values[n].shape)
             for n in inputs],
            [onnx.ValueInfoProto(name=o, type=types[o]) for o in node.output])
        outputs = reference_session(make_model(graph, 17)).run(None, {n: values[n] for n in inputs})
        values.update({o: round16(v) for o, v in zip(node.output, outputs)})
    return values


def invoke(*args):
    """The CLI in-process (arguments as strings), exceptions raised rather than caught."""
    from typer.testing import CliRunner

    from onnxmlu.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
