"""fuse_to_file reads its model through a memory map, a piece at a time (onnxmlu.ir.mapped), and
holds the large weights as views of the file, markers in the tree: the tree must be the one
onnx.load builds once the markers are filled, the views read-only, whatever reads a value
(the folder, the shape probe) must see the weight, and every file load_model refuses must be
refused with load_model's one-line error."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.frontend import load as frontend_load
from onnxmlu.errors import OnnxMluError
from onnxmlu.frontend.load import load_model
from onnxmlu.ir import mapped
from onnxmlu.ir.mapped import MappedModel
from onnxmlu.ir.weights import WeightStore, is_marker
from onnxmlu.tools.testing import zoo_model


@pytest.mark.parametrize("name", ["resnet18", "lstm", "mobilenetv2"])
@pytest.mark.parametrize("piece", [64, 2**22])
def test_parse_is_onnx_load(tmp_path, monkeypatch, name, piece):
    monkeypatch.setattr(mapped, "PIECE_BYTES", piece)  # 64: a merge for almost every field
    path = tmp_path / "m.onnx"
    model = zoo_model(name)
    model.metadata_props.add(key="k", value="v")  # a top-level field after the graph
    onnx.save(model, path)
    parsed = MappedModel(path).parse()
    assert parsed.SerializeToString() == onnx.load(path).SerializeToString()


@pytest.mark.parametrize("duplicate", [False, True])
def test_large_weights_are_markers_viewing_the_file(tmp_path, duplicate):
    """Each large initializer is a marker in its own position, its array a read-only view of
    the mapped file; filled, the tree is byte for byte onnx.load's (two initializers of one
    name included: each keeps its own value)."""
    path = tmp_path / "m.onnx"
    model = zoo_model("resnet18")
    if duplicate:
        model.graph.initializer.append(max(model.graph.initializer, key=lambda t: len(t.raw_data)))
    onnx.save(model, path)
    store = WeightStore()
    parsed = MappedModel(path).parse(store)
    markers = [t for t in parsed.graph.initializer if is_marker(t)]
    assert len(markers) == sum(1 for t in model.graph.initializer if len(t.raw_data) >= store.min_bytes) > 0
    for marker in markers:
        array = store.array(marker)
        assert isinstance(_root(array), mmap.mmap) and not array.flags.writeable  # the file's bytes, no copy
        with pytest.raises(ValueError):
            array.flat[0] = 0  # a pass changes a weight by making a new one
    assert store.fill_markers(parsed.graph) == len(markers)
    assert parsed.SerializeToString() == onnx.load(path).SerializeToString()


def _root(array: np.ndarray):
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_small_or_unstorable_initializers_stay_in_the_tree(tmp_path):
    path = tmp_path / "m.onnx"
    big = np.arange(2**15, dtype=np.float32)  # 128 KiB
    kept = [numpy_helper.from_array(np.arange(8, dtype=np.float32), "small"),
            numpy_helper.from_array(big.astype(np.str_)[:4], "strings"),
            helper.make_tensor("typed", TensorProto.FLOAT, big.shape, big)]  # float_data, not raw
    model = _graph_model([helper.make_node("Identity", [t.name], [f"{t.name}_out"]) for t in kept],
                         kept, [t.name for t in kept])
    onnx.save(model, path)
    parsed = MappedModel(path).parse(WeightStore())
    assert not any(is_marker(t) for t in parsed.graph.initializer)
    assert parsed.SerializeToString() == onnx.load(path).SerializeToString()


def _graph_model(nodes, initializers, names) -> onnx.ModelProto:
    outputs = [helper.make_tensor_value_info(f"{n}_out", TensorProto.UNDEFINED, None) for n in names]
    return helper.make_model(helper.make_graph(nodes, "g", [], outputs, initializers),
                             opset_imports=[helper.make_opsetid("", 17)])


def _fused_both_ways(tmp_path, monkeypatch, path, **options) -> tuple[bytes, bytes]:
    """The fused file through the map, and through load_model; their diagnostics must match
    (a folder that failed on a marker would say so, even where a later pass hides it)."""
    mapped = api.fuse_to_file(path, tmp_path / "mapped.onnx", strategy="dlfusion", **options)
    with monkeypatch.context() as patch:
        patch.setattr(frontend_load, "_mapped", lambda path, weights: None)
        loaded = api.fuse_to_file(path, tmp_path / "loaded.onnx", strategy="dlfusion", **options)
    assert mapped.diagnostics == loaded.diagnostics
    return (tmp_path / "mapped.onnx").read_bytes(), (tmp_path / "loaded.onnx").read_bytes()


def test_a_folded_weight_is_read_through_its_marker(tmp_path, monkeypatch):
    """Transpose(W) of a 256 KiB weight folds (onnxruntime evaluates it) as it does from a
    loaded tree; the MatMul's other weight stays a marker."""
    path = tmp_path / "m.onnx"
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), n) for n in ("w", "v")]
    nodes = [helper.make_node("Transpose", ["w"], ["wt"]), helper.make_node("MatMul", ["x", "wt"], ["h"]),
             helper.make_node("MatMul", ["h", "v"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    mapped_bytes, loaded_bytes = _fused_both_ways(tmp_path, monkeypatch, path)
    assert mapped_bytes == loaded_bytes
    assert not any(n.op_type == "Transpose" for n in onnx.load(tmp_path / "mapped.onnx").graph.node)
    assert api.check(path, tmp_path / "mapped.onnx").ok


def test_a_weight_folded_inside_a_branch_is_read_through_its_marker(tmp_path, monkeypatch):
    """One branch slices an outer 256 KiB weight (as the exported LSTMs in silero's If do), the
    other reads another one whole: the slice folds, and the weight graphsurgeon copies into the
    second branch carries its data, as it does from a loaded tree."""
    path = tmp_path / "m.onnx"
    rng = np.random.default_rng(0)
    const = lambda name, value: numpy_helper.from_array(np.array(value, np.int64), name)  # noqa: E731
    sliced = helper.make_graph(
        [helper.make_node("Slice", ["w", "start", "end", "axis"], ["half"]),
         helper.make_node("MatMul", ["x", "half"], ["sliced_y"])], "sliced", [],
        [helper.make_tensor_value_info("sliced_y", TensorProto.FLOAT, None)],
        [const("start", [0]), const("end", [128]), const("axis", [1])])
    whole = helper.make_graph([helper.make_node("MatMul", ["x", "u"], ["whole_y"])], "whole", [],
                              [helper.make_tensor_value_info("whole_y", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=sliced, else_branch=whole)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256]),
              helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(rng.standard_normal((256, n)).astype(np.float32), w) for w, n in (("w", 256),
                                                                                                  ("u", 128))])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    mapped_bytes, loaded_bytes = _fused_both_ways(tmp_path, monkeypatch, path)
    assert mapped_bytes == loaded_bytes


def test_the_shape_probe_reads_the_weights_through_their_markers(tmp_path, monkeypatch):
    """A Conv sized by a length the user gives is typed by the probe, a session over the model
    whose 192 KiB weight is a marker: it is filled in the probe's copy."""
    path = tmp_path / "m.onnx"
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((128, 128, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Slice", ["x", "zero", "n", "axis"], ["s"]),
             helper.make_node("Conv", ["s", "w"], ["c"], pads=[1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 32]),
                     helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight, numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array([2], np.int64), "axis")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    values = {"n": np.array([16], np.int64)}
    mapped_bytes, loaded_bytes = _fused_both_ways(tmp_path, monkeypatch, path, inputs=values)
    assert mapped_bytes == loaded_bytes
    assert any(n.domain == "com.onnxmlu" for n in onnx.load(tmp_path / "mapped.onnx").graph.node)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "text"])
def test_a_file_load_model_refuses_is_refused_alike(tmp_path, damage):
    good = tmp_path / "good.onnx"
    onnx.save(zoo_model("resnet18"), good)
    data = good.read_bytes()
    bad = tmp_path / ("bad.textproto" if damage == "text" else "bad.onnx")
    bad.write_bytes({"truncated": data[: len(data) // 3], "garbage": b"\xff" * 64, "empty": b"",
                     "text": b"ir_version: 8\n"}[damage])
    with pytest.raises(OnnxMluError) as expected:
        load_model(bad)
    with pytest.raises(OnnxMluError) as got:
        api.fuse_to_file(bad, tmp_path / "out.onnx")
    assert str(got.value) == str(expected.value)
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("external", [False, True])
def test_fused_file_is_the_one_load_model_gives(tmp_path, monkeypatch, external):
    """With the map or without it (load_model, the path of a model with external data), the
    fused file is the same, byte for byte."""
    path = tmp_path / "m.onnx"
    onnx.save(zoo_model("resnet18"), path, save_as_external_data=external, location="m.data", size_threshold=1024)
    api.fuse_to_file(path, tmp_path / "mapped.onnx", strategy="dlfusion")
    monkeypatch.setattr(frontend_load, "_mapped", lambda path, weights: None)
    api.fuse_to_file(path, tmp_path / "loaded.onnx", strategy="dlfusion")
    assert (tmp_path / "mapped.onnx").read_bytes() == (tmp_path / "loaded.onnx").read_bytes()


# ---- the real-world corpus -------------------------------------------------------------
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "realworld"))
import corpus  # noqa: E402


@pytest.mark.realworld
@pytest.mark.parametrize("case", corpus.MODELS, ids=[c.id for c in corpus.MODELS])
def test_corpus_parse_is_onnx_load(case):
    try:
        source = corpus.model_path(case)
    except corpus.FetchError as error:
        pytest.skip(str(error))
    expected = onnx.load(source, load_external_data=False).SerializeToString()
    assert MappedModel(source).parse().SerializeToString() == expected
    store = WeightStore()
    parsed = MappedModel(source).parse(store)
    store.fill_markers(parsed.graph)
    assert parsed.SerializeToString() == expected
