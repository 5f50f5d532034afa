"""The hand-written protobuf framing of streamed bodies (onnxmlu.ir.wire): every byte it
writes must be the byte protobuf would have written. Checked three ways: the primitives against
protobuf on generated messages, whole fused files against the in-memory model serialized by
protobuf, in the streamed layout (zoo models: transposed weights written in chunks, FP16/INT8 bodies, subgraphs), and
every real-world corpus model through ``onnx.load`` and the full checker."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from onnxmlu import api
from onnxmlu.collapse import blocks
from onnxmlu.ir import wire
from onnxmlu.schema import body_digest, body_model, ensure_registered, is_fusion_block
from onnxmlu.tools.testing import zoo_model

RAW_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
INITIALIZER = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number


def joined(pieces) -> bytes:
    return wire.join(pieces)


def protobuf_stream(model: onnx.ModelProto) -> bytes:
    """The layout of a streamed file (the model without nodes, then one model per node:
    protobuf merges them), every byte written by protobuf from the in-memory fused model."""
    head = onnx.ModelProto()
    head.CopyFrom(model)
    head.graph.ClearField("node")
    pieces = [head.SerializeToString()]
    for node in model.graph.node:
        piece = onnx.ModelProto()
        piece.graph.node.add().CopyFrom(node)
        pieces.append(piece.SerializeToString())
    return b"".join(pieces)


@given(st.integers(0, 2**64 - 1))
def test_varint_is_protobufs(value):
    message = onnx.TensorProto()
    message.dims.append(value - 2**64 if value >= 2**63 else value)  # int64: the same 10-byte varint
    assert wire.key(1, wire.VARINT) + wire.varint(value) == message.SerializeToString()


@settings(max_examples=60, deadline=None)
@given(name=st.text(max_size=8), dims=st.lists(st.integers(0, 2**40), max_size=4),
       data_type=st.integers(0, 16), doc=st.text(max_size=20), raw=st.binary(max_size=300),
       external=st.booleans(), split=st.integers(0, 300))
def test_splice_is_what_protobuf_writes(name, dims, data_type, doc, raw, external, split):
    """Fields on both sides of raw_data (8 before, 12-14 after), the payload in two pieces."""
    whole = onnx.TensorProto(name=name, data_type=data_type, doc_string=doc, raw_data=raw)
    whole.dims.extend(dims)
    if external:
        whole.data_location = onnx.TensorProto.EXTERNAL
        whole.external_data.add(key="k", value="v")
    header = onnx.TensorProto()
    header.CopyFrom(whole)
    header.ClearField("raw_data")
    array = np.frombuffer(raw[split:], np.uint8) if raw[split:] else np.zeros(0, np.uint8)
    pieces = wire.splice(header, RAW_DATA, [[raw[:split], wire.ArrayBytes(array)]])
    assert joined(pieces) == whole.SerializeToString()
    assert wire.size(pieces) == len(whole.SerializeToString())
    assert wire.crc32(pieces) == body_digest(whole.SerializeToString())


@pytest.mark.parametrize("dtype", [np.float32, np.dtype(">f4"), np.float16, np.int64, np.bool_])
@pytest.mark.parametrize("view", ["whole", "transposed", "wide-transposed", "strided", "scalar", "empty"])
def test_array_bytes_are_onnx_raw_data(dtype, view, monkeypatch):
    """Any layout of a stored weight is written as its C-order little-endian bytes, a non-
    contiguous one a few rows at a time (the chunk size forced small here)."""
    monkeypatch.setattr(wire, "CHUNK_BYTES", 64)
    base = np.arange(7 * 13 * 3).reshape(7, 13, 3).astype(dtype)
    array = {"whole": base, "transposed": base.transpose(2, 0, 1), "strided": base[::2, 1:, ::-1],
             "wide-transposed": np.arange(130 * 5).astype(dtype).reshape(130, 5).T,  # 3 tiles of columns
             "scalar": base[1, 2, 0], "empty": base[:0]}[view]
    array = np.asarray(array)
    expected = onnx.numpy_helper.from_array(array.astype(array.dtype.newbyteorder("<"))).raw_data
    chunks = list(wire.ArrayBytes(array).chunks())
    assert b"".join(chunks) == expected
    assert wire.ArrayBytes(array).nbytes == len(expected)
    if "transposed" in view:
        assert len(chunks) > 1


@pytest.mark.parametrize("name, options", [
    ("alexnet", dict(strategy="dlfusion")),  # fc weights written transposed from views, in chunks
    ("resnet18", dict(strategy="all-fusion")),
    ("mobilenetv2", dict(strategy="dlfusion", precision="fp16")),  # bodies serialized by protobuf
    ("lstm", dict(strategy="all-fusion")),
])
def test_streamed_file_is_protobufs_bytes(tmp_path, name, options, monkeypatch):
    """The file written piece by piece is byte for byte the in-memory fused model serialized
    by protobuf, loads, and passes the full check."""
    monkeypatch.setattr(wire, "CHUNK_BYTES", 2**20)
    ensure_registered()
    source, out = tmp_path / "m.onnx", tmp_path / "fused.onnx"
    onnx.save(zoo_model(name), source)
    api.fuse_to_file(source, out, **options)
    expected = api.fuse(source, **options).model
    assert out.read_bytes() == protobuf_stream(expected)
    loaded = onnx.load(out)
    assert loaded == expected
    onnx.checker.check_model(loaded, full_check=True)
    assert all(body_model(n).graph.node for n in loaded.graph.node if is_fusion_block(n))  # digests verified


def test_int8_blocks_stream_as_protobuf_writes(tmp_path):
    ensure_registered()
    source, out = tmp_path / "m.onnx", tmp_path / "fused.onnx"
    onnx.save(zoo_model("resnet18"), source)
    api.fuse_to_file(source, out, strategy="dlfusion", precision="int8")
    expected = api.fuse(source, strategy="dlfusion", precision="int8").model
    assert out.read_bytes() == protobuf_stream(expected)


def test_a_digest_needing_five_varint_bytes_and_one_needing_one(tmp_path):
    """The node's length prefix counts the digest's varint, whose size depends on the CRC."""
    for crc in (0, 5, 2**28 + 3, 2**32 - 1):
        node = helper.make_node("MLUFusionBlock", ["x"], ["y"], domain="com.onnxmlu", doc_string="d")
        digest = helper.make_attribute("body_crc32", crc).SerializeToString()
        pieces = wire.splice(node, 5, [[digest]])
        node.attribute.append(helper.make_attribute("body_crc32", crc))
        assert joined(pieces) == node.SerializeToString()


def _node_with_body(body: wire.Digested, crc: int, doc: str) -> list:
    """A block-like node: one attribute holding the body's bytes, the digest after it."""
    node = helper.make_node("MLUFusionBlock", ["x"], ["y"], domain="com.onnxmlu", doc_string=doc)
    header = onnx.AttributeProto(name="body", type=onnx.AttributeProto.STRING)
    attribute = wire.splice(header, 4, [[body]])  # AttributeProto.s
    digest = helper.make_attribute("body_crc32", crc).SerializeToString()
    return wire.framed(7, wire.framed(1, wire.splice(node, 5, [attribute, [digest]])))  # ModelProto.graph.node


@settings(max_examples=80, deadline=None)
@given(length=st.one_of(st.integers(0, 300), st.integers(16250, 16400), st.integers(2**21 - 120, 2**21 + 20)),
       doc=st.text(max_size=40))
def test_a_digest_after_its_body_is_protobufs_bytes_whether_reserved_or_taken_first(length, doc):
    """Lengths around the varint sizes of the frames (2^7, 2^14, 2^21): where the bytes before
    the body have one length for every CRC they are reserved and filled at the end, else the
    CRC is taken first; the bytes are protobuf's either way."""
    data = bytes(range(256)) * (length // 256) + bytes(length % 256)
    body = wire.Digested([data[:length // 2], wire.ArrayBytes(np.frombuffer(data[length // 2:], np.uint8))])
    pieces = wire.with_digest(lambda crc: _node_with_body(body, crc, doc), body)
    expected = onnx.ModelProto()
    node = expected.graph.node.add()
    node.CopyFrom(helper.make_node("MLUFusionBlock", ["x"], ["y"], domain="com.onnxmlu", doc_string=doc))
    node.attribute.add(name="body", type=onnx.AttributeProto.STRING, s=data)
    node.attribute.append(helper.make_attribute("body_crc32", body_digest(data)))
    assert joined(pieces) == expected.SerializeToString()
    assert body.crc == body_digest(data)
    assert isinstance(pieces[0], wire.Reserved) == (body.crc is not None and _head_length_is_stable(length, doc))


def _head_length_is_stable(length: int, doc: str) -> bool:
    sizes = set()
    for crc in (0, 2**7, 2**14, 2**21, 2**28):
        body = wire.Digested([bytes(length)])
        pieces = _node_with_body(body, crc, doc)
        sizes.add(wire.size(pieces[: next(i for i, p in enumerate(pieces) if p is body)]))
    return len(sizes) == 1


def test_both_digest_paths_are_exercised():
    """The property above meets both cases: a node frame that crosses 2^14 with the digest's
    size, and one that does not."""
    assert _head_length_is_stable(1000, "")
    assert not all(_head_length_is_stable(n, "") for n in range(16300, 16400))


def test_a_body_is_read_once_when_its_head_is_reserved(monkeypatch):
    """No pass before the write: the transposed weight is copied once, by the writer's pass."""
    copies = []
    real = wire._contiguous
    monkeypatch.setattr(wire, "_contiguous", lambda part, dtype: copies.append(1) or real(part, dtype))
    monkeypatch.setattr(wire, "CHUNK_BYTES", 256)
    weight = np.arange(40 * 30, dtype=np.float32).reshape(40, 30).T
    body = wire.Digested([b"head", wire.ArrayBytes(weight)])
    pieces = wire.with_digest(lambda crc: _node_with_body(body, crc, ""), body)
    assert isinstance(pieces[0], wire.Reserved) and not copies
    data = joined(pieces)
    assert len(copies) == len(weight)  # one copy per chunk of rows (one 160-byte row per 256-byte chunk)
    assert weight.tobytes() in data and body.crc == body_digest(b"head" + weight.tobytes())


# ---- the real-world corpus -------------------------------------------------------------
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "realworld"))
import corpus  # noqa: E402


def protobuf_node_piece(node, analysis, b, iface, uses, bodies):
    """The piece of a block's node as protobuf writes it: the body embedded by
    :func:`~onnxmlu.collapse.blocks._add_body`, then the node serialized whole."""
    piece = onnx.ModelProto()
    target = piece.graph.node.add()
    target.CopyFrom(node)
    blocks._add_body(target, analysis, b, iface, uses=uses, bodies=bodies)
    return [piece.SerializeToString()]


@pytest.mark.realworld
@pytest.mark.parametrize("case", corpus.MODELS, ids=[c.id for c in corpus.MODELS])
def test_corpus_streamed_file_loads_checks_and_is_protobufs_bytes(case, tmp_path, monkeypatch):
    """Against the same streamed pipeline with every node serialized by protobuf (the in-memory
    fuse can hold a weight as typed fields where the file path holds raw data: same values,
    other bytes)."""
    try:
        source = corpus.model_path(case)
    except corpus.FetchError as error:
        pytest.skip(str(error))
    ensure_registered()
    out, reference = tmp_path / "fused.onnx", tmp_path / "reference.onnx"
    api.fuse_to_file(source, out, input_shapes=case.pins or None)
    if _checker_accepts(onnx.load(source)):  # a model only onnxruntime runs stays such (built_layernorm14)
        onnx.checker.check_model(onnx.load(out), full_check=True)
    monkeypatch.setattr(blocks, "_block_node_pieces", protobuf_node_piece)
    api.fuse_to_file(source, reference, input_shapes=case.pins or None)
    assert out.read_bytes() == reference.read_bytes()


def _checker_accepts(model: onnx.ModelProto) -> bool:
    """False for a model holding an op onnx has no schema for at its opset (one onnxruntime
    registers): the fused model keeps it on the host, and the checker refuses both alike."""
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        return "No Op registered" not in str(error)
    return True


def test_a_transposed_weight_is_copied_once_for_the_digest_and_the_write(monkeypatch):
    """crc32 keeps the copies it makes for the write that follows; the source's pages are
    released once, after their last read (the copies for a view, the write for a buffer)."""
    copies, released = [], []
    real = wire._contiguous
    monkeypatch.setattr(wire, "_contiguous", lambda part, dtype: copies.append(1) or real(part, dtype))
    monkeypatch.setattr(wire, "CHUNK_BYTES", 256)
    base = np.arange(40 * 30, dtype=np.float32).reshape(40, 30)
    view = wire.ArrayBytes(base.T, release=lambda: released.append("view"))
    whole = wire.ArrayBytes(base, release=lambda: released.append("whole"))
    pieces = [b"head", view, whole]
    digest = wire.crc32(pieces)
    assert released == ["view"] and len(copies) > 1
    made = len(copies)
    data = joined(pieces)
    assert data == b"head" + base.T.tobytes() + base.tobytes()
    assert digest == body_digest(data)
    assert len(copies) == made  # the write used the kept copies
    assert released == ["view", "whole"]
