"""Models that arrive quantized, made in the test by onnxruntime's own quantization tool from
small seeded float models: ``quantize_static`` in QDQ and QOperator format, ``quantize_dynamic``."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime import quantization as q

from onnxmlu.tools.testing import make_model

SIZE, CLASSES = 16, 10


def _weight(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 10
    return numpy_helper.from_array((rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32), name)


def float_cnn(seed: int = 0) -> onnx.ModelProto:
    """conv-relu-maxpool, conv-relu, global pool, flatten, matmul + bias (``x`` -> ``y``)."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "fc"], ["m"], name="fc"),
        helper.make_node("Add", ["m", "fb"], ["y"], name="fc_bias"),
    ]
    inits = [_weight(rng, "w1", 8, 3, 3, 3), _weight(rng, "b1", 8), _weight(rng, "w2", 16, 8, 3, 3),
             _weight(rng, "b2", 16), _weight(rng, "fc", 16, CLASSES), _weight(rng, "fb", CLASSES)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, CLASSES])], inits)
    return make_model(graph, 17)


def float_mlp(seed: int = 0) -> onnx.ModelProto:
    """matmul + bias, relu, matmul + bias, softmax (``x`` [4, 32] -> ``y``)."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="fc1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], name="fc1_bias"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
        helper.make_node("MatMul", ["r1", "w2"], ["m2"], name="fc2"),
        helper.make_node("Add", ["m2", "b2"], ["a2"], name="fc2_bias"),
        helper.make_node("Softmax", ["a2"], ["y"], name="softmax", axis=-1),
    ]
    inits = [_weight(rng, "w1", 32, 64), _weight(rng, "b1", 64), _weight(rng, "w2", 64, CLASSES),
             _weight(rng, "b2", CLASSES)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, CLASSES])], inits)
    return make_model(graph, 17)


class _Reader(q.CalibrationDataReader):
    def __init__(self, model: onnx.ModelProto, seed: int = 1, count: int = 4) -> None:
        rng = np.random.default_rng(seed)
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        self._feeds = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(count)])

    def get_next(self):
        return next(self._feeds, None)


def quantized(model: onnx.ModelProto, how: str, **options) -> onnx.ModelProto:
    """``model`` quantized by onnxruntime: ``how`` = "qdq" or "qoperator" (``quantize_static``,
    calibrated on 4 seeded samples) or "dynamic" (``quantize_dynamic``); ``options`` go to it."""
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's pre-processing advice
    with tempfile.TemporaryDirectory(prefix="onnxmlu-test-quant-") as folder:
        src, dst = Path(folder) / "float.onnx", Path(folder) / "quantized.onnx"
        onnx.save(model, src)
        if how == "dynamic":
            q.quantize_dynamic(src, dst, **{"weight_type": q.QuantType.QInt8, **options})
        else:
            fmt = q.QuantFormat.QDQ if how == "qdq" else q.QuantFormat.QOperator
            q.quantize_static(src, dst, _Reader(model), quant_format=fmt,
                              **{"activation_type": q.QuantType.QUInt8, "weight_type": q.QuantType.QInt8, **options})
        return onnx.load(dst.as_posix())
