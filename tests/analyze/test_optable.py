import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnxmlu.ir import GraphIndex
from onnxmlu.analyze.optable import OP_KINDS, support_reason


def _bn_graph(scale, bias, training=False):
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), n)
             for n, v in (("s", scale), ("b", bias), ("m", [0.0, 0.0]), ("v", [1.0, 1.0]))]
    attrs = {"training_mode": 1} if training else {}
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])], inits)
    return node, GraphIndex.build(graph)


def test_only_normalization_only_batchnorm_runs_on_the_accelerator():
    assert support_reason(*_bn_graph([1, 1], [0, 0])) is None
    assert "weighted" in support_reason(*_bn_graph([2, 1], [0, 0]))
    assert "training_mode" in support_reason(*_bn_graph([1, 1], [0, 0], training=True))


def test_ops_the_rewriters_must_handle_are_not_in_the_table():
    for op in ("Gemm", "LSTM", "GRU", "RNN", "If", "Loop"):
        assert op not in OP_KINDS


def test_shape_arithmetic_runs_in_blocks():
    """On a symbolic dim it must stay computed at run time (pins never fold it)."""
    for op in ("Shape", "Size", "ConstantOfShape", "Range"):
        assert OP_KINDS[op] == "data"


def test_unknown_domain_and_string_tensors_stay_on_host():
    node = helper.make_node("Relu", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    assert "outside the standard domain" in support_reason(node, GraphIndex.build(graph))
    node = helper.make_node("Identity", ["s"], ["t"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("s", TensorProto.STRING, [1])],
                              [helper.make_tensor_value_info("t", TensorProto.STRING, [1])])
    assert "string tensor" in support_reason(node, GraphIndex.build(graph))
