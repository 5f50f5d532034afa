"""fuse_to_file reads its model through a memory map, a piece at a time (onnxmlu.ir.mapped), and
holds unchanged weights as views of the file: the tree must be the one onnx.load builds, a
weight changed after parsing must be taken from the tree, and every file load_model refuses
must be refused with load_model's one-line error."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxmlu import api, pipeline
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


def test_weights_are_views_of_the_file_and_equal_the_tree(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(zoo_model("resnet18"), path)
    source = MappedModel(path)
    model = source.parse()
    store = WeightStore()
    light = store.detach(model, source)
    held = [t for t in light.graph.initializer if is_marker(t)]
    assert held
    tree = {t.name: t for t in model.graph.initializer}
    for marker in held:
        array = store.array(marker)
        assert isinstance(_root(array), mmap.mmap)  # no copy: the file's bytes
        np.testing.assert_array_equal(array, numpy_helper.to_array(tree[marker.name]))


def _root(array: np.ndarray):
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_a_weight_changed_after_parsing_is_taken_from_the_tree(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(zoo_model("resnet18"), path)
    source = MappedModel(path)
    model = source.parse()
    changed = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    value = numpy_helper.to_array(changed).copy()
    value.flat[len(value.flat) // 2] += 1  # one element, same size: only the bytes differ
    changed.raw_data = value.tobytes()
    assert source.array(changed, value.dtype) is None
    store = WeightStore()
    light = store.detach(model, source)
    marker = next(t for t in light.graph.initializer if t.name == changed.name)
    np.testing.assert_array_equal(store.array(marker), value)


def test_duplicate_initializer_names_are_not_located(tmp_path):
    path = tmp_path / "m.onnx"
    model = zoo_model("resnet18")
    first = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    model.graph.initializer.append(first)
    onnx.save(model, path)
    assert first.name not in MappedModel(path).raw


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
    monkeypatch.setattr(pipeline, "_load_mapped", lambda ctx: None)
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
    assert MappedModel(source).parse().SerializeToString() == onnx.load(source, load_external_data=False).SerializeToString()
