"""A model above 2 GB, written straight to disk with its weights as external data.

    python huge_model.py OUT.onnx [MATRICES]

The model is never one protobuf message in memory here: each weight is drawn with numpy and
appended to ``OUT.onnx.data``, and the graph refers to it by offset. The network (all float32):

    x[1, 8192] -> Gemm(W0, b0) -> Relu
               -> (MatMul(Wi) -> Add(bi) -> Relu) for i = 1 .. MATRICES-2
               -> Reshape[1, 8192, 1, 1] -> Conv(1x1, 8192 -> 8192) -> Relu -> Flatten
               -> MatMul(W_out[8192, 16]) -> y[1, 16]

Each 8192 x 8192 weight is 256 MiB, so 9 matrices make 2.25 GiB (2.42e9 bytes, above the
2^31 - 1 bytes protobuf can hold). Weights are uniform with He variance so activations stay
of order one through the Relu layers and the comparison tolerances stay meaningful.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

WIDTH = 8192


class _DataFile:
    def __init__(self, path: Path):
        self.path, self.offset = path, 0
        self.handle = open(path, "wb")

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        """A TensorProto that points into the data file (written now, 4 KiB aligned)."""
        pad = (-self.offset) % 4096
        self.handle.write(b"\0" * pad)
        self.offset += pad
        array = np.ascontiguousarray(array)
        array.tofile(self.handle)
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(self.offset)), ("length", str(array.nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        self.offset += array.nbytes
        return t


def _weight(rng: np.random.Generator, shape) -> np.ndarray:
    bound = np.float32(np.sqrt(6.0 / shape[0]))  # He uniform: variance 2 / fan_in
    w = rng.random(shape, dtype=np.float32)
    w *= 2 * bound
    w -= bound
    return w


def build(out: Path, matrices: int = 9, seed: int = 0) -> int:
    """Write OUT and OUT.data; returns the data file's size in bytes."""
    rng = np.random.default_rng(seed)
    data = _DataFile(out.with_name(out.name + ".data"))
    inits = [data.tensor("W0", _weight(rng, (WIDTH, WIDTH))),
             numpy_helper.from_array((rng.standard_normal(WIDTH) * 0.01).astype(np.float32), "b0")]
    nodes = [helper.make_node("Gemm", ["x", "W0", "b0"], ["g0"], name="gemm0"),
             helper.make_node("Relu", ["g0"], ["h0"], name="relu0")]
    h = "h0"
    for i in range(1, matrices - 1):
        inits.append(data.tensor(f"W{i}", _weight(rng, (WIDTH, WIDTH))))
        inits.append(numpy_helper.from_array((rng.standard_normal(WIDTH) * 0.01).astype(np.float32), f"b{i}"))
        nodes += [helper.make_node("MatMul", [h, f"W{i}"], [f"m{i}"], name=f"fc{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"bias{i}"),
                  helper.make_node("Relu", [f"a{i}"], [f"h{i}"], name=f"relu{i}")]
        h = f"h{i}"
    inits.append(numpy_helper.from_array(np.array([1, WIDTH, 1, 1], np.int64), "as_map"))
    inits.append(data.tensor("Wc", _weight(rng, (WIDTH, WIDTH)).reshape(WIDTH, WIDTH, 1, 1)))
    inits.append(numpy_helper.from_array(_weight(rng, (WIDTH, 16)), "W_out"))
    nodes += [helper.make_node("Reshape", [h, "as_map"], ["map"], name="to_map"),
              helper.make_node("Conv", ["map", "Wc"], ["conv"], name="conv"),
              helper.make_node("Relu", ["conv"], ["conv_relu"], name="conv_relu"),
              helper.make_node("Flatten", ["conv_relu"], ["flat"], name="flatten"),
              helper.make_node("MatMul", ["flat", "W_out"], ["y"], name="head")]
    data.handle.close()
    graph = helper.make_graph(nodes, "huge", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    out.write_bytes(model.SerializeToString())  # small: every large weight is external
    return data.path.stat().st_size


if __name__ == "__main__":
    path = Path(sys.argv[1])
    size = build(path, int(sys.argv[2]) if len(sys.argv) > 2 else 9)
    print(f"wrote {path} + {size / 2**30:.2f} GiB of external data")
