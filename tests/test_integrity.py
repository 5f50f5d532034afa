"""Block integrity: every MLUFusionBlock carries ``body_crc32``, the CRC-32 of its body's bytes.
The library refuses a body whose bytes changed at session creation, naming the block (a bit flip
in a weight used to run silently with the wrong weight); nodes without a digest (files written
before it existed) still load; the Python readers of bodies check it too."""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from onnxmlu import api, runtime
from onnxmlu.schema import DIGEST, BodyDigestError, body_model, is_fusion_block, verify_body
from onnxmlu.tools.testing import conv_chain_model
from onnxmlu.tools.verify import random_inputs


def blocks(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if is_fusion_block(n)]


def attribute(node: onnx.NodeProto, name: str) -> onnx.AttributeProto:
    return next(a for a in node.attribute if a.name == name)


def weight_offset(body_bytes: bytes) -> int:
    """Offset of the high byte (sign, exponent) of a float32 in the middle of the body's
    largest weight: flipping its bit 0 scales that weight by 4 or 1/4."""
    body = onnx.load_from_string(body_bytes)
    weight = max(body.graph.initializer, key=lambda t: len(t.raw_data)).raw_data
    return body_bytes.index(weight) + len(weight) // 8 * 4 + 3


def flip_weight_bit(node: onnx.NodeProto) -> None:
    """Flip one bit of a weight inside the node's body, leaving the digest as it was."""
    tensor = attribute(node, "body").t
    data = bytearray(tensor.raw_data)
    data[weight_offset(tensor.raw_data)] ^= 0x01
    tensor.raw_data = bytes(data)


def without_digest(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in blocks(copy):
        kept = [a for a in node.attribute if a.name != DIGEST]
        del node.attribute[:]
        node.attribute.extend(kept)
    return copy


@pytest.fixture(scope="module")
def chain():
    original = conv_chain_model()
    return original, api.fuse(original, strategy="all-fusion").model


def run(model, feeds, **kwargs):
    session = runtime.InferenceSession(model, **kwargs)
    return session.run(None, feeds)


def test_every_written_body_carries_its_digest(chain, tmp_path):
    """collapse (api.fuse), the streaming writer (api.fuse_to_file) and bodies moved to
    external data all carry body_crc32 = zlib.crc32(body)."""
    original, fused = chain
    source, streamed = tmp_path / "chain.onnx", tmp_path / "streamed.onnx"
    onnx.save(original, source)
    api.fuse_to_file(source, streamed, strategy="all-fusion")
    external = tmp_path / "external.onnx"
    api.save_model(fused, external, external_data=True)
    for model in (fused, onnx.load(streamed), onnx.load(external)):
        assert len(blocks(model)) == 2
        for node in blocks(model):
            body = attribute(node, "body").t.raw_data
            assert attribute(node, DIGEST).i == zlib.crc32(body) and verify_body(node)


@pytest.mark.parametrize("layouts", [True, False], ids=["block-layouts", "as-stored"])
def test_bit_flip_in_a_weight_fails_session_creation_naming_the_block(library, chain, layouts):
    _, fused = chain
    damaged = onnx.ModelProto()
    damaged.CopyFrom(fused)
    flip_weight_bit(blocks(damaged)[1])
    with pytest.raises(Exception) as info:
        runtime.InferenceSession(damaged, block_layouts=layouts)
    message = str(info.value)
    assert "MLUFusionBlock 'block_1 (mp=" in message and "body is corrupt" in message and DIGEST in message


def test_plain_onnxruntime_with_the_library_refuses_it_too(library, chain):
    _, fused = chain
    damaged = onnx.ModelProto()
    damaged.CopyFrom(fused)
    flip_weight_bit(blocks(damaged)[0])
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    with pytest.raises(Exception, match=r"MLUFusionBlock 'block_0 \(mp=\d+\)': body is corrupt"):
        ort.InferenceSession(damaged.SerializeToString(), options, providers=["CPUExecutionProvider"])


def test_without_a_digest_bodies_load_as_before(library, chain):
    """Older files have no body_crc32: they load and run; and a flipped weight then runs
    silently with the wrong numbers (what the digest is there to stop)."""
    original, fused = chain
    feeds = random_inputs(original, 0)
    want = runtime.reference_session(original).run(None, feeds)
    old = without_digest(fused)
    for got, expected in zip(run(old, feeds), want):
        np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
    flip_weight_bit(blocks(old)[0])
    got = run(old, feeds)
    assert not all(np.allclose(g, w, atol=1e-4, rtol=1e-4) for g, w in zip(got, want))


@pytest.mark.parametrize("value, expected", [
    (-1, "must be between 0 and 4294967295"),
    (2**32, "must be between 0 and 4294967295"),
    ("e4dce321", "must be an int"),
    (1.5, "must be an int"),
])
def test_a_malformed_digest_attribute_is_refused(library, chain, value, expected):
    _, fused = chain
    model = onnx.ModelProto()
    model.CopyFrom(fused)
    node = blocks(model)[0]
    kept = [a for a in node.attribute if a.name != DIGEST]
    del node.attribute[:]
    node.attribute.extend(kept + [onnx.helper.make_attribute(DIGEST, value)])
    with pytest.raises(Exception) as info:
        runtime.InferenceSession(model, block_layouts=False)
    assert "MLUFusionBlock 'block_0 (mp=" in str(info.value) and expected in str(info.value)
    with pytest.raises(BodyDigestError, match="block_0"):
        verify_body(node)


def test_a_flip_in_external_data_is_refused(library, chain, tmp_path):
    """Bodies moved to the .data file keep their digest; the library checks the bytes it loads."""
    _, fused = chain
    path = tmp_path / "fused.onnx"
    api.save_model(fused, path, external_data=True)
    stored = onnx.load(path, load_external_data=False)
    body = attribute(blocks(stored)[1], "body").t
    location = {e.key: e.value for e in body.external_data}
    offset = int(location.get("offset", 0))
    data_file = tmp_path / location["location"]
    raw = bytearray(data_file.read_bytes())
    raw[offset + weight_offset(bytes(raw[offset:offset + int(location["length"])]))] ^= 0x01
    data_file.write_bytes(bytes(raw))
    with pytest.raises(Exception, match=r"MLUFusionBlock 'block_1 \(mp=\d+\)': body is corrupt"):
        runtime.InferenceSession(str(path))


def test_python_readers_check_the_digest(chain):
    """body_model (view, tools), shape inference and the block-layouts pass see the damage;
    the pass never rewrites a damaged body (that would give it a valid digest)."""
    from onnxmlu.schema import infer_shapes
    from onnxmlu.tools.view import explode

    _, fused = chain
    damaged = onnx.ModelProto()
    damaged.CopyFrom(fused)
    flip_weight_bit(blocks(damaged)[0])
    with pytest.raises(BodyDigestError, match=r"MLUFusionBlock 'block_0 \(mp=\d+\)': body is corrupt"):
        body_model(blocks(damaged)[0])
    with pytest.raises(BodyDigestError, match="block_0"):
        explode(damaged)
    with pytest.raises(onnx.shape_inference.InferenceError, match="body is corrupt"):
        infer_shapes(damaged, strict_mode=True)
    before = attribute(blocks(damaged)[0], "body").t.raw_data
    rewritten, _ = runtime.optimize_block_layouts(damaged)
    node = blocks(rewritten)[0]
    assert attribute(node, "body").t.raw_data == before
    with pytest.raises(BodyDigestError):
        verify_body(node)
    assert all(verify_body(n) for n in blocks(runtime.optimize_block_layouts(fused)[0]))


def test_cli_run_and_check_refuse_a_damaged_file_in_one_line(library, chain, tmp_path):
    from onnxmlu.cli import app

    original, fused = chain
    damaged = onnx.ModelProto()
    damaged.CopyFrom(fused)
    flip_weight_bit(blocks(damaged)[0])
    onnx.save(original, tmp_path / "original.onnx")
    onnx.save(damaged, tmp_path / "damaged.onnx")
    runner = CliRunner()
    for args in (["run", str(tmp_path / "damaged.onnx"), "--repeat", "1"],
                 ["check", str(tmp_path / "original.onnx"), str(tmp_path / "damaged.onnx")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "body is corrupt" in result.output and "block_0" in result.output
        assert "Traceback" not in result.output
