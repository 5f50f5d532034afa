"""Child process for the interrupted-write tests: saves two models over one path, forever.

    python save_loop.py DEST MEBIBYTES single|external

Builds models "A" and "B" (each about MEBIBYTES of weights, different contents), prints one
JSON line with their digests, then ``ready``, then alternates ``api.save_model(A, DEST)``,
``api.save_model(B, DEST)``, ... until the parent kills it with SIGKILL at a random moment.
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.ir.weights import all_tensors


def build(tag: str, mebibytes: int) -> onnx.ModelProto:
    side = int(np.sqrt(mebibytes * 2**20 / 4 / 4))  # four square float32 weights
    rng = np.random.default_rng(ord(tag))
    nodes, inits, x = [], [], "x"
    for i in range(4):
        inits.append(numpy_helper.from_array(rng.random((side, side), dtype=np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"], name=f"fc{i}"))
        x = f"y{i}"
    graph = helper.make_graph(nodes, f"model_{tag}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, side])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, side])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model.doc_string = tag
    return model


def digest(model: onnx.ModelProto) -> str:
    """Content digest that does not depend on how the tensors were stored (inline or external)."""
    h = hashlib.sha256(model.doc_string.encode())
    for t in all_tensors(model.graph):
        h.update(t.name.encode())
        h.update(t.raw_data)
    return h.hexdigest()


def main() -> None:
    dest, mebibytes, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    models = [build("A", mebibytes), build("B", mebibytes)]
    print(json.dumps({m.doc_string: digest(m) for m in models}), flush=True)
    print("ready", flush=True)
    external = mode == "external"
    i = 0
    while True:
        api.save_model(models[i % 2], dest, external_data=external)
        i += 1


if __name__ == "__main__":
    main()
