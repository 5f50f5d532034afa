"""Shared helpers for the rewriter tests: running models, structural checks, freezing inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from onnxmlu.rewrite import rewrite_model
from onnxmlu.sessions import new_options

RTOL = ATOL = 1e-4


def session(model: onnx.ModelProto, threads: int = 1) -> ort.InferenceSession:
    """onnxruntime with graph optimizations off, so ORT's own fusions cannot hide a bug."""
    opts = new_options("disable")
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int = 1) -> list[np.ndarray]:
    sess = session(model, threads)
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(attr.g)
            for sub in attr.graphs:
                yield from all_nodes(sub)


def op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in all_nodes(model.graph)]


def full_check(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)


def assert_close(got, expected, rtol: float = RTOL, atol: float = ATOL, what: str = "") -> None:
    assert len(got) == len(expected), f"{what}: {len(got)} outputs, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, f"{what} output {i}: shape {g.shape} != {e.shape}"
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"{what} output {i}")


def freeze_inputs(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Turn the named graph inputs into initializers holding ``values``."""
    frozen = onnx.ModelProto()
    frozen.CopyFrom(model)
    keep = [i for i in frozen.graph.input if i.name not in values]
    for name, value in values.items():
        frozen.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    del frozen.graph.input[:]
    frozen.graph.input.extend(keep)
    return frozen


def all_graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                yield from all_graphs(sub)


def initializer_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers of the graph and all subgraphs (names are unique model-wide)."""
    return {i.name: numpy_helper.to_array(i) for g in all_graphs(model.graph) for i in g.initializer}


def rewritten_once(model: onnx.ModelProto, rewriter: str, op_type: str) -> onnx.ModelProto:
    """``model`` through the one rewriter ``rewriter``, which must apply exactly once and leave
    no ``op_type`` node; the result passes the full checker."""
    rewritten, report = rewrite_model(model, only=[rewriter])
    assert report.applied == {rewriter: 1}, report.skipped
    assert op_type not in op_types(rewritten)
    full_check(rewritten)
    return rewritten


def to_half(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The float16 form of a float32 model: its float initializers, graph inputs and outputs in
    float16, and its float32 feeds rounded to float16."""
    half = onnx.ModelProto()
    half.CopyFrom(model)
    for init in half.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for info in list(half.graph.input) + list(half.graph.output):
        if info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            info.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    return half, {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
