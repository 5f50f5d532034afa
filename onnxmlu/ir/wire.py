"""Protobuf wire format written around buffers protobuf never copies: one pass to the file.

Saving a fused model used to pass over every weight three times before the disk saw it:
``ndarray.tobytes`` (the weight as bytes), ``SerializeToString`` of the block body (the bytes
copied into the body) and of the node carrying the body (copied again). The wire format lets
us skip all three. A length-delimited field is

    key = varint(field_number << 3 | 2),  varint(len(payload)),  payload

and protobuf serializes a message's known fields in increasing field number (repeated fields
in order, each occurrence framed as above). So a message with one length-delimited field whose
payload we hold elsewhere is exactly: protobuf's bytes of the message *without* that field, cut
where the field's number falls (:func:`insertion_offset`), with the field's framing and its
payload in the cut (:func:`splice`). Nesting ``splice`` builds a block body around its weights,
the body attribute around the body and the node around the attribute, as a list of *pieces*:
small ``bytes`` that protobuf serialized, and :class:`ArrayBytes` that stand for a weight's
buffer and are only read when written. Only the framing is ours; every other byte is still
protobuf's, so the file is byte-identical to serializing the whole tree.

The sizes of the payloads are known before any byte is read (a weight's size is its shape
times its item size). Only ``body_crc32`` depends on the body's bytes, and it sits *after* the
body in its node. The node's and its graph's length prefixes count the digest's varint (1 to 5
bytes), so they depend on the CRC's value, but usually not their *length*: :func:`with_digest`
builds the node for one CRC of each varint size, and when the bytes before the body have one
length for all five, they are :class:`Reserved` (left as zeros, written at the end), the body
is :class:`Digested` (its CRC taken from the very chunks written, as they are handed to the
writer: :func:`digested`) and the bytes after it are made :class:`Later`, once the CRC is
known. Each weight is then read once, and a transposed one copied once, a chunk at a time.
When the lengths differ (a frame that crosses a varint boundary) the CRC is taken before
(:func:`crc32`, one more read of the body).

A :class:`Writer` consumes the pieces' :func:`items` (buffers, and the events above) in order,
once :func:`digested` has taken the bodies' CRCs from them; :func:`join` is the in-memory
writer, ``collapse.atomic`` the file's. The file is byte for byte what protobuf would write
for the whole tree either way.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence, Union

import numpy as np
import onnx

from onnxmlu.ir.weights import viewed_bytes
from onnxmlu.wording import plural

#: Wire types (protobuf encoding): varint, 64-bit, length-delimited, start/end group, 32-bit.
VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5


def field_number(message_type, name: str) -> int:
    """The field number of ``name`` in a protobuf message type (``onnx.TensorProto`` ...)."""
    return message_type.DESCRIPTOR.fields_by_name[name].number


#: The fields the wire-level writers and readers cut weights out of and splice them into.
GRAPH = field_number(onnx.ModelProto, "graph")
INITIALIZER = field_number(onnx.GraphProto, "initializer")
RAW_DATA = field_number(onnx.TensorProto, "raw_data")
#: A weight that is not one contiguous buffer (a transposed view) is copied this many bytes at
#: a time (for its block only: the copies leave memory as they are written). A copy about the
#: size of the L2 cache is still there when the digest reads it. Copying a transposed
#: 4096x9216 float32 view (AlexNet's fc6, 151 MB) takes 44 ms in 4 MiB copies, 57 ms in 16 MiB.
CHUNK_BYTES = 2**22
#: Columns copied at once from a transposed view: the rows of that many source columns stay in
#: cache while they are read (measured on a 4096x25088 float32 view: 64 -> 0.43 s, one numpy
#: copy of the whole view 2.2 s).
TILE_COLUMNS = 64


@dataclass(eq=False)
class ArrayBytes:
    """The raw (C-order, little-endian) bytes of ``array``, read only when written.

    An array that is one buffer is written from that buffer. Any other (a transposed view) is
    copied a few rows at a time; :func:`crc32` keeps the copies it makes for the write that
    follows it (each dropped once written), so such a weight is transposed once, not twice.
    ``release`` (when the array views a mapped file) drops the file's pages under the array
    from memory once they are read for the last time: after the copies are made, or after
    the buffer is written."""

    array: np.ndarray
    release: Callable[[], None] | None = None
    _copies: list[memoryview] | None = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    @property
    def is_one_buffer(self) -> bool:
        array = self.array
        return array.ndim == 0 or (array.flags.c_contiguous and array.dtype == array.dtype.newbyteorder("<"))

    def chunks(self) -> Iterator[memoryview]:
        """The bytes, a buffer at a time (the caller calls :attr:`release` once it wrote them)."""
        if self._copies is not None:
            copies, self._copies = self._copies, None
            copies.reverse()
            while copies:  # each copy leaves memory once written
                yield copies.pop()
            return
        yield from self._read()

    def keep_copies(self) -> None:
        """Copy a non-contiguous array now and keep the copies for :meth:`chunks`."""
        if not self.is_one_buffer and self._copies is None:
            self._copies = list(self._read())
            if self.release is not None:
                self.release()
                self.release = None  # the source's pages are read for the last time

    def peek(self) -> Iterator[memoryview]:
        """The bytes as :meth:`chunks` gives them, leaving the copies and the pages in place."""
        return iter(self._copies) if self._copies is not None else self._read()

    def _read(self) -> Iterator[memoryview]:
        array = self.array
        whole = viewed_bytes(array)
        if whole is not None:
            yield memoryview(whole)
            return
        little = array.dtype.newbyteorder("<")
        if self.is_one_buffer:
            yield _raw(np.ascontiguousarray(array, dtype=little))
            return
        row_bytes = array.itemsize * math.prod(array.shape[1:])
        rows = max(1, CHUNK_BYTES // max(1, row_bytes))
        for start in range(0, max(1, len(array)), rows):  # a row at a time: C order
            yield _raw(_contiguous(array[start : start + rows], little))


@dataclass(eq=False)
class Digested:
    """``pieces`` whose CRC-32 :func:`digested` takes from their buffers on their way to the
    writer (:attr:`crc` once they passed; set before when :func:`with_digest` had to take it
    first, and :func:`digested` then keeps it)."""

    pieces: list["Piece"]
    crc: int | None = None

    @property
    def nbytes(self) -> int:
        return size(self.pieces)


@dataclass(eq=False)
class Reserved:
    """``nbytes`` bytes whose value is known only later: the writer leaves zeros where they fall
    and writes ``fill()`` over them once every piece is written."""

    nbytes: int
    fill: Callable[[], bytes]


@dataclass(eq=False)
class Later:
    """Bytes made when the writer reaches them (after the body whose CRC they hold)."""

    make: Callable[[], bytes]


Piece = Union[bytes, ArrayBytes, Digested, Reserved, Later]


@dataclass(eq=False)
class Opened:
    """Item: the bytes that follow, up to the matching :class:`Closed`, are ``body``'s."""

    body: Digested


@dataclass(eq=False)
class Closed:
    """Item: ``body``'s bytes are all written (its CRC is known from here on)."""

    body: Digested


Item = Union[bytes, memoryview, Opened, Closed, Reserved, Later, Callable[[], None]]


def size(pieces: Iterable[Piece]) -> int:
    """Bytes the pieces stand for (a :class:`Later` piece has no size before it is made)."""
    total = 0
    for p in pieces:
        if isinstance(p, Later):
            raise TypeError("a Later piece has no size before it is written")
        total += len(p) if isinstance(p, bytes) else p.nbytes
    return total


def items(pieces: Iterable[Piece]) -> Iterator[Item]:
    """What a :class:`Writer` takes for the pieces, in order: buffers ``write`` takes as they
    are, the bounds of each digested body, reserved and later bytes, and after each weight the
    function that drops its source pages (to call once its buffers are written)."""
    for p in pieces:
        if isinstance(p, ArrayBytes):
            yield from p.chunks()
            if p.release is not None:
                yield p.release
        elif isinstance(p, Digested):
            yield Opened(p)
            yield from items(p.pieces)
            yield Closed(p)
        else:
            yield p


def crc32(pieces: Iterable[Piece]) -> int:
    """zlib's CRC-32 of the concatenated pieces (what :func:`onnxmlu.schema.body_digest` gives
    for the joined bytes), computed chunk by chunk."""
    value = 0
    for piece in pieces:
        if isinstance(piece, ArrayBytes):
            piece.keep_copies()  # a transposed weight: copied once, for this CRC and the write
            for buf in piece.peek():
                value = zlib.crc32(buf, value)
        elif isinstance(piece, bytes):
            value = zlib.crc32(piece, value)
        else:
            raise TypeError(f"no CRC before writing for {type(piece).__name__}")
    return value


#: One CRC for each size of its varint (1 to 5 bytes).
_CRC_OF_EACH_VARINT_SIZE = (0, 1 << 7, 1 << 14, 1 << 21, 1 << 28)


def with_digest(build: Callable[[int], list[Piece]], body: Digested) -> list[Piece]:
    """``build(crc32(body))``, the pieces of a message that holds ``body`` and, after it, its
    CRC. When the bytes before ``body`` have one length whatever the CRC, they are reserved and
    the CRC is taken as the body is written; else it is taken now."""
    heads = {size(_around(build(crc), body)[0]) for crc in _CRC_OF_EACH_VARINT_SIZE}
    if len(heads) > 1:
        body.crc = crc32(body.pieces)
        return build(body.crc)

    built: dict[int, tuple[list[Piece], list[Piece]]] = {}  # the CRC -> the pieces around the body

    def part(index: int) -> bytes:
        assert body.crc is not None, "the body is written before what depends on its CRC"
        if body.crc not in built:  # once for both parts (the bytes after the body, then the reserved ones)
            built[body.crc] = _around(build(body.crc), body)
        return join(built[body.crc][index])

    return [Reserved(heads.pop(), lambda: part(0)), body, Later(lambda: part(1))]


def _around(pieces: list[Piece], body: Digested) -> tuple[list[Piece], list[Piece]]:
    """The pieces before and after ``body`` (which ``pieces`` holds once, as itself)."""
    at = next(i for i, p in enumerate(pieces) if p is body)
    return pieces[:at], pieces[at + 1 :]


def digested(stream: Iterable[Item]) -> Iterator[Item]:
    """``stream``'s items, unchanged, taking the CRC-32 of each digested body from the buffers
    that pass (set on the body before its :class:`Closed` passes, so before any :class:`Later`
    that needs it). Run where the buffers are made (the file writer's producer thread): the
    digest then overlaps the write instead of preceding it, on data still in cache."""
    running: dict[Digested, int] = {}  # bodies open now -> their CRC so far
    for item in stream:
        if isinstance(item, (bytes, memoryview)):
            for body, value in running.items():
                running[body] = zlib.crc32(item, value)
        elif isinstance(item, Opened) and item.body.crc is None:  # else taken before (see with_digest)
            running[item.body] = 0
        elif isinstance(item, Closed) and item.body in running:
            item.body.crc = running.pop(item.body)
        yield item


class Writer:
    """Writes :func:`digested` :func:`items` through ``write(buffer)``, in order: leaves zeros
    for reserved bytes and, at :meth:`finish`, writes them through ``patch(offset, data)``."""

    def __init__(self, write: Callable[[bytes | memoryview], None], patch: Callable[[int, bytes], None]) -> None:
        self._write, self._patch = write, patch
        self.offset = 0
        self._reserved: list[tuple[int, Reserved]] = []

    def take(self, item: Item) -> None:
        if isinstance(item, (bytes, memoryview)):
            self._buffer(item)
        elif isinstance(item, Reserved):
            self._reserved.append((self.offset, item))
            self._buffer(bytes(item.nbytes))
        elif isinstance(item, Later):
            self._buffer(item.make())
        elif not isinstance(item, (Opened, Closed)):  # a body's bounds: digested() has used them
            item()  # a weight's source pages, read for the last time

    def finish(self) -> None:
        """Write the reserved bytes (every body's CRC is known now)."""
        for offset, reserved in self._reserved:
            data = reserved.fill()
            if len(data) != reserved.nbytes:
                raise AssertionError(f"reserved {plural(reserved.nbytes, 'byte')}, filled {len(data)}")
            self._patch(offset, data)
        self._reserved.clear()

    def _buffer(self, buf: bytes | memoryview) -> None:
        self._write(buf)
        self.offset += len(buf) if isinstance(buf, bytes) else buf.nbytes


def join(pieces: Iterable[Piece]) -> bytes:
    """The bytes the pieces stand for (the in-memory :class:`Writer`)."""
    out = bytearray()

    def patch(offset: int, data: bytes) -> None:
        out[offset : offset + len(data)] = data

    writer = Writer(out.extend, patch)
    for item in digested(items(pieces)):
        writer.take(item)
    writer.finish()
    return bytes(out)


def varint(value: int) -> bytes:
    """Base-128 little-endian varint of a non-negative int (negative int64s: two's complement)."""
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(field: int, wire_type: int = LEN) -> bytes:
    return varint(field << 3 | wire_type)


def framed(field: int, pieces: Sequence[Piece]) -> list[Piece]:
    """One occurrence of length-delimited ``field`` holding ``pieces``."""
    return [key(field) + varint(size(pieces)), *pieces]


def splice(message, field: int, entries: Sequence[Sequence[Piece]]) -> list[Piece]:
    """``message`` serialized with each of ``entries`` appended as one more occurrence of its
    length-delimited ``field`` (a sub-message or bytes field): what protobuf would write for
    ``message`` holding them, as pieces. Occurrences ``message`` already has come first."""
    data = message.SerializeToString()
    at = insertion_offset(data, field)
    out: list[Piece] = [data[:at]]
    for entry in entries:
        out.extend(framed(field, entry))
    out.append(data[at:])
    return out


def with_initializers(model: onnx.ModelProto, entries: Sequence[Sequence[Piece]]) -> list[Piece]:
    """``model`` serialized with each of ``entries`` (a tensor's serialized pieces) appended to its
    main graph's initializers, as pieces; ``model``'s graph is cleared (it is in the pieces)."""
    graph = splice(model.graph, INITIALIZER, entries)
    model.ClearField("graph")
    return splice(model, GRAPH, [graph])


def insertion_offset(data: bytes, field: int) -> int:
    """Where occurrences of ``field`` go in the serialized message ``data``: before its first
    field with a larger number (protobuf writes fields in increasing number), else at the end."""
    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = read_varint(data, pos)
        if tag >> 3 > field:
            return start
        pos = skip(data, pos, tag & 7)
    return len(data)


def fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, start of its key, end of its value) of each field of the
    serialized message ``data``, in order; ValueError when ``data`` is not a whole message."""
    pos = 0
    try:
        while pos < len(data):
            start = pos
            tag, pos = read_varint(data, pos)
            pos = skip(data, pos, tag & 7)
            if pos > len(data):
                raise ValueError("protobuf field runs past the end of its message")
            yield tag >> 3, tag & 7, start, pos
    except IndexError as error:  # a varint cut off by the end of the data
        raise ValueError("protobuf message ends inside a field") from error


def payload(data: bytes | memoryview, start: int, end: int) -> memoryview:
    """The payload of the length-delimited field whose key starts at ``data[start]`` and whose
    value ends at ``end`` (a view: nothing is copied)."""
    pos = read_varint(data, start)[1]
    pos = read_varint(data, pos)[1]
    return memoryview(data)[pos:end]


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``data[pos]`` and the position after it."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def skip(data: bytes | memoryview, pos: int, wire_type: int) -> int:
    """The position after the value of a field of ``wire_type`` starting at ``data[pos]``."""
    if wire_type == VARINT:
        return read_varint(data, pos)[1]
    if wire_type == I64:
        return pos + 8
    if wire_type == I32:
        return pos + 4
    if wire_type == LEN:
        length, pos = read_varint(data, pos)
        return pos + length
    raise ValueError(f"unsupported protobuf wire type {wire_type} (groups are not used by ONNX)")


def _contiguous(part: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A C-contiguous copy of ``part``. When its last axis is not the one adjacent in memory
    (a transposed weight) the copy goes a few columns at a time: numpy's one-call copy walks the
    source a column at a time, a cache line (and often a page) per element, 4x slower on
    VGG-19's 411 MB fc6 weight."""
    if part.ndim < 2 or abs(part.strides[-1]) == part.itemsize:
        return np.ascontiguousarray(part, dtype=dtype)
    out = np.empty(part.shape, dtype)
    for col in range(0, part.shape[-1], TILE_COLUMNS):
        out[..., col : col + TILE_COLUMNS] = part[..., col : col + TILE_COLUMNS]
    return out


def _raw(array: np.ndarray) -> memoryview:
    """A C-contiguous array's buffer as bytes (no copy)."""
    return memoryview(array.reshape(-1).view(np.uint8))
