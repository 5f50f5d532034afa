"""The file writer of streamed pieces: a thread makes the buffers and takes the digests ahead of
the writer, which fills reserved bytes at the end and leaves nothing behind on a failure."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from onnxmlu.collapse import atomic
from onnxmlu.ir import wire


def _pieces_with_a_reserved_head(payload: bytes) -> tuple[list, wire.Digested]:
    body = wire.Digested([payload[:5], wire.ArrayBytes(np.frombuffer(payload[5:], np.uint8).reshape(-1, 4).T)])
    head = wire.Reserved(4, lambda: body.crc.to_bytes(4, "little"))
    tail = wire.Later(lambda: b"<" + body.crc.to_bytes(4, "big") + b">")
    return [b"start", head, body, tail, b"end"], body


def test_the_file_is_the_joined_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "SLICE_BYTES", 64)  # many slices, each handed to the disk
    monkeypatch.setattr(wire, "CHUNK_BYTES", 40)
    payload = bytes(range(256)) * 4 + bytes(1)
    pieces, _ = _pieces_with_a_reserved_head(payload)
    expected = wire.join(pieces)
    pieces, body = _pieces_with_a_reserved_head(payload)
    out = tmp_path / "m.bin"
    atomic.write_pieces_atomic(pieces, out)
    assert out.read_bytes() == expected
    assert expected[5:9] == body.crc.to_bytes(4, "little") and b"<" + body.crc.to_bytes(4, "big") + b">" in expected


def test_the_digest_is_taken_by_the_thread_that_makes_the_buffers(tmp_path, monkeypatch):
    """The CRC overlaps the write: it runs beside it, not on the writing thread."""
    threads = []
    crc32 = wire.zlib.crc32

    class RecordingZlib:
        @staticmethod
        def crc32(data, value=0):
            threads.append(threading.current_thread())
            return crc32(data, value)

    monkeypatch.setattr(wire, "zlib", RecordingZlib)
    pieces, body = _pieces_with_a_reserved_head(bytes(range(256)) * 4 + bytes(1))
    atomic.write_pieces_atomic(pieces, tmp_path / "m.bin")
    assert threads and threading.main_thread() not in threads
    assert body.crc == crc32(b"".join(b if isinstance(b, bytes) else b.array.tobytes() for b in body.pieces))


def test_a_failure_while_making_the_pieces_leaves_the_destination_as_it_was(tmp_path):
    out = tmp_path / "m.bin"
    out.write_bytes(b"previous")

    def pieces():
        yield b"x" * 100
        raise ValueError("made up")

    with pytest.raises(ValueError, match="made up"):
        atomic.write_pieces_atomic(pieces(), out)
    assert out.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["m.bin"]


def test_produced_ahead_keeps_the_order_and_stops_its_thread_when_the_caller_stops():
    made = []

    def source():
        for i in range(1000):
            made.append(i)
            yield i

    ahead = atomic.produced_ahead(source(), 4)
    assert [next(ahead) for _ in range(10)] == list(range(10))
    ahead.close()
    assert len(made) <= 10 + 4 + 2  # at most the queue and the item in hand past what was taken
    assert not [t for t in threading.enumerate() if t.name == "onnxmlu-pieces"]
