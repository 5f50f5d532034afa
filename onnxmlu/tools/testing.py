"""Helpers for building small models in tests and examples.

``make_model`` pins the IR version to the lowest one the opset needs: onnx 1.23's default
(IR 14) is newer than onnxruntime 1.31 reads (IR 13).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxmlu.tools.zoo import build_model


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
    return build_model(name, batch=batch, seed=0).SerializeToString()


def zoo_model(name: str, batch: int | str = 1) -> onnx.ModelProto:
    """A fresh copy of a zoo model; the serialized bytes are built once per process."""
    return onnx.load_from_string(_zoo_bytes(name, batch))


def synthetic_model(nodes: int, topology: str = "chain", *, channels: int = 8, size: int = 8,
                    seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """A graph of about ``nodes`` nodes for scaling benchmarks and tests.

    ``chain``: Conv -> BatchNormalization -> Relu repeated (3 nodes a unit).
    ``residual``: ResNet basic blocks, Conv-BN-Relu-Conv-BN-Add-Relu with an identity
    shortcut (7 nodes a unit): a DAG whose every unit has two paths.
    Every unit keeps ``channels`` x ``size`` x ``size``, so the work per layer is constant and
    the model grows linearly with ``nodes`` (about ``channels**2 * 36`` weight bytes a conv).
    """
    unit = {"chain": 3, "residual": 7}
    if topology not in unit:
        raise ValueError(f"topology must be one of {sorted(unit)}, not {topology!r}")
    rng = np.random.default_rng(seed)
    builder = _SyntheticBuilder(rng, channels)
    x = "x"
    for u in range(max(1, nodes // unit[topology])):
        if topology == "chain":
            x = builder.conv_bn_relu(x, f"u{u}")
        else:
            y = builder.conv_bn_relu(x, f"u{u}a")
            y = builder.conv_bn(y, f"u{u}b")
            builder.nodes.append(helper.make_node("Add", [y, x], [f"u{u}.add"], name=f"u{u}.add"))
            builder.nodes.append(helper.make_node("Relu", [f"u{u}.add"], [f"u{u}.out"], name=f"u{u}.out"))
            x = f"u{u}.out"
    graph = helper.make_graph(
        builder.nodes, f"synthetic_{topology}_{nodes}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, channels, size, size])],
        builder.initializers,
    )
    return make_model(graph, opset)


class _SyntheticBuilder:
    def __init__(self, rng: np.random.Generator, channels: int):
        self.rng, self.channels = rng, channels
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def _init(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv_bn(self, x: str, prefix: str) -> str:
        c = self.channels
        w = self.rng.standard_normal((c, c, 3, 3)) * np.sqrt(2 / (9 * c))
        self.nodes.append(helper.make_node("Conv", [x, self._init(f"{prefix}.w", w)], [f"{prefix}.conv"],
                                           name=f"{prefix}.conv", pads=[1, 1, 1, 1]))
        params = [self._init(f"{prefix}.{p}", v) for p, v in (
            ("scale", 1 + 0.1 * self.rng.standard_normal(c)), ("bias", 0.1 * self.rng.standard_normal(c)),
            ("mean", 0.1 * self.rng.standard_normal(c)), ("var", 1 + 0.1 * self.rng.random(c)))]
        self.nodes.append(helper.make_node("BatchNormalization", [f"{prefix}.conv", *params], [f"{prefix}.bn"],
                                           name=f"{prefix}.bn"))
        return f"{prefix}.bn"

    def conv_bn_relu(self, x: str, prefix: str) -> str:
        y = self.conv_bn(x, prefix)
        self.nodes.append(helper.make_node("Relu", [y], [f"{prefix}.relu"], name=f"{prefix}.relu"))
        return f"{prefix}.relu"
