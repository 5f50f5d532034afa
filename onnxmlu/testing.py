"""Helpers for building small models in tests and examples.

``make_model`` pins the IR version to the lowest one the opset needs: onnx 1.23's default
(IR 14) is newer than onnxruntime 1.31 reads (IR 13).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_model(graph: onnx.GraphProto, opset: int = 17, extra_opsets: dict[str, int] | None = None) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = helper.find_min_ir_version_for(opsets[:1])
    return model


def conv_chain_model(convs: int = 3, channels: int = 8, size: int = 16, seed: int = 0,
                     batch: int | str = 1, opset: int = 17) -> onnx.ModelProto:
    """Conv -> Relu chain with a host op (TopK) after the middle conv, and two outputs
    (float pooled features, int64 TopK indices) so blocks see mixed types and two segments."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "x"
    for i in range(convs):
        w = (rng.standard_normal((channels, channels, 3, 3)) * np.sqrt(2 / (9 * channels))).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        x = f"r{i}"
        if i == convs // 2:
            inits.append(numpy_helper.from_array(np.array([channels], np.int64), "k"))
            nodes.append(helper.make_node("Abs", [x], [f"abs{i}"], name=f"abs{i}"))
            nodes.append(helper.make_node("TopK", [f"abs{i}", "k"], [f"top{i}", f"idx{i}"], name=f"topk{i}", axis=1))
            x = f"top{i}"
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"], name="gap"))
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, size, size])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, None),
         helper.make_tensor_value_info(f"idx{convs // 2}", TensorProto.INT64, None)],
        inits,
    )
    return make_model(graph, opset)


@functools.lru_cache(maxsize=None)
def _zoo_bytes(name: str, batch) -> bytes:
    from onnxmlu.zoo import build_model

    return build_model(name, batch=batch, seed=0).SerializeToString()


def zoo_model(name: str, batch: int | str = 1) -> onnx.ModelProto:
    """A fresh copy of a zoo model; the serialized bytes are built once per process."""
    return onnx.load_from_string(_zoo_bytes(name, batch))
