"""``check`` on a model that computes in float16 with float32 inputs and outputs (what
onnxruntime's ``convert_float_to_float16(keep_io_types=True)`` saves): its float32 outputs get two
float16 ulps at their scale (onnxmlu/tools/verify.py), where 1e-4 failed a correct fuse of an
optimizer-saved BERT and GPT-2 in float16; a float32 model keeps 1e-4, and an error of many
float16 ulps still fails."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnxmlu.tools.verify import compare_outputs, computes_in_half


def _model(dtype) -> object:
    weight = numpy_helper.from_array(np.ones((64, 64), dtype), "w")
    bias = numpy_helper.from_array(np.ones(4, np.float32), "b")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weight, bias])
    return helper.make_model(graph)


def test_a_model_computes_in_half_where_most_weight_elements_are_float16():
    assert computes_in_half(_model(np.float16))
    assert not computes_in_half(_model(np.float32))


def test_float32_outputs_of_a_half_model_get_two_float16_ulps_of_their_scale():
    want = np.linspace(-10, 10, 64, dtype=np.float32)  # float16 ulp at 10: 2^-7 = 0.0078
    near, far = want + np.float32(0.012), want + np.float32(0.05)
    assert [d.ok for d in compare_outputs(["y"], [near], [want], 1e-4, 1e-4, half=True)] == [True]
    assert [d.ok for d in compare_outputs(["y"], [near], [want], 1e-4, 1e-4)] == [False]
    assert [d.ok for d in compare_outputs(["y"], [far], [want], 1e-4, 1e-4, half=True)] == [False]
    assert compare_outputs(["y"], [near], [want], 1e-4, 1e-4, half=True)[0].half_slack == 2 * 2.0**-7
