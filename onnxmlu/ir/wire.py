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
times its item size); only ``body_crc32`` needs a pass over the body's bytes, and it reads the
same chunks that are then written (:func:`crc32`; a transposed weight's copies are kept from
that pass for the write, so it is transposed once).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence, Union

import numpy as np

from onnxmlu.ir.weights import viewed_bytes

#: Wire types (protobuf encoding): varint, 64-bit, length-delimited, start/end group, 32-bit.
VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
#: A weight that is not one contiguous buffer (a transposed view) is copied this many bytes at
#: a time (for its block only: the copies leave memory as they are written).
CHUNK_BYTES = 2**24
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
        if self._copies is not None:
            copies, self._copies = self._copies, None
            copies.reverse()
            while copies:  # each copy leaves memory once written
                yield copies.pop()
            return
        yield from self._read()
        if self.release is not None:
            self.release()

    def keep_copies(self) -> None:
        """Copy a non-contiguous array now and keep the copies for :meth:`chunks`."""
        if not self.is_one_buffer and self._copies is None:
            self._copies = list(self._read())
            if self.release is not None:
                self.release()

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


Piece = Union[bytes, ArrayBytes]


def size(pieces: Iterable[Piece]) -> int:
    return sum(p.nbytes if isinstance(p, ArrayBytes) else len(p) for p in pieces)


def buffers(pieces: Iterable[Piece]) -> Iterator[bytes | memoryview]:
    """The bytes the pieces stand for, in order, as buffers ``write`` takes as they are."""
    for p in pieces:
        if isinstance(p, ArrayBytes):
            yield from p.chunks()
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
        else:
            value = zlib.crc32(piece, value)
    return value


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
