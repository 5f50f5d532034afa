"""A model file parsed through a read-only memory map, one piece of its graph at a time, its
weights left in the file for :class:`~onnxmlu.ir.weights.WeightStore` to view.

``onnx.load`` reads the whole file into one ``bytes`` object and then parses it, so for a
moment the model is in memory twice (VGG-19: the 548 MB file and the 548 MB parsed tree); and
``WeightStore.detach`` later copies every large weight out of the tree while the tree is still
alive (twice again). Here:

* the file is mapped read-only and parsed field by field of its graph (pieces of a few MB, a
  large initializer alone), each piece's pages dropped from this process once parsed.
  protobuf parses concatenated fields exactly as it merges them one by one, so the tree is the
  one ``onnx.load`` builds; the parse peaks at the tree plus its largest tensor;
* on the way, the raw data of every main-graph initializer is located in the file, so that
  :meth:`MappedModel.array` can give the store a weight as a view of the mapped file instead
  of a copy, after checking (a chunk at a time, pages dropped as they are compared) that the
  bytes the tree holds now are still the file's: whatever the passes in between changed is
  copied as before. The tree's copy then leaves with the tree.

The weights are read from the file again when the fused model is written, so the input file
must not change while ``fuse`` runs (``fuse m.onnx m.onnx`` is fine: the output replaces the
file by a rename, the mapped one lives on until the process ends).
"""

from __future__ import annotations

import functools
import mmap
import os
from typing import Callable

import numpy as np
import onnx
from google.protobuf.message import DecodeError

try:  # numpy >= 2.0
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy 1.x
    from numpy import byte_bounds

from onnxmlu.ir.wire import LEN, read_varint, skip

#: Graph fields are merged into the tree in pieces of about this size (one larger field alone), and
#: a weight is compared with the file this much at a time: what the parse and the check add to
#: the peak besides the tree and its largest tensor.
PIECE_BYTES = 2**22
_GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_INITIALIZER = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_NAME = onnx.TensorProto.DESCRIPTOR.fields_by_name["name"].number
_RAW_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
_PAGE = mmap.PAGESIZE


class MappedModel:
    """One model file, mapped read-only; :meth:`parse` builds its tree."""

    #: What opening and parsing a file that holds no readable model raises: the file system's
    #: errors (an empty file cannot be mapped: ValueError), a field that runs past the end
    #: (ValueError, or IndexError inside a varint), protobuf's DecodeError.
    PARSE_ERRORS = (OSError, ValueError, IndexError, DecodeError)

    def __init__(self, path: str | os.PathLike) -> None:
        with open(path, "rb") as handle:
            self.map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        #: main-graph initializer name -> (offset, length) of its raw data in the file
        self.raw: dict[str, tuple[int, int]] = {}
        self._address: int | None = None  # of the map's first byte, for :meth:`releaser`

    def parse(self) -> onnx.ModelProto:
        """The model the file holds (as ``onnx.load`` without external data would give it);
        raises one of :attr:`PARSE_ERRORS` on a damaged file."""
        model = onnx.ModelProto()
        view = memoryview(self.map)
        try:
            for key, start, body, end in _fields(view, 0, len(view)):
                if key == (_GRAPH << 3 | LEN):
                    self._parse_graph(model.graph, view, body, end)
                else:
                    model.MergeFromString(view[start:end])
        finally:
            view.release()
        return model

    def _parse_graph(self, graph: onnx.GraphProto, view: memoryview, begin: int, end: int) -> None:
        piece = begin
        seen: set[str] = set()
        for key, _, body, stop in _fields(view, begin, end):
            if key == (_INITIALIZER << 3 | LEN):
                self._locate_raw_data(view, body, stop, seen)
            if stop - piece >= PIECE_BYTES:
                graph.MergeFromString(view[piece:stop])
                self._release(piece, stop)
                piece = stop
        graph.MergeFromString(view[piece:end])
        self._release(piece, end)

    def _locate_raw_data(self, view: memoryview, begin: int, end: int, seen: set[str]) -> None:
        name, raw = None, None
        for key, _, body, stop in _fields(view, begin, end):
            if key == (_NAME << 3 | LEN):
                name = bytes(view[body:stop]).decode("utf-8", errors="replace")
            elif key == (_RAW_DATA << 3 | LEN):
                raw = (body, stop - body)
        if name is None:
            return
        if name in seen:  # two initializers of one name: neither is located (the last one wins in onnx)
            self.raw.pop(name, None)
        elif raw is not None:
            self.raw[name] = raw
        seen.add(name)

    def array(self, tensor: onnx.TensorProto, dtype: np.dtype) -> np.ndarray | None:
        """``tensor``'s value as a read-only view of the mapped file, when its raw data is
        still the bytes the file holds under its name; else None."""
        found = self.raw.get(tensor.name)
        if found is None or not tensor.HasField("raw_data"):
            return None
        offset, length = found
        count = int(np.prod(tensor.dims, dtype=np.int64))
        if count * dtype.itemsize != length or not self._holds(tensor.raw_data, offset):
            return None
        return np.frombuffer(self.map, dtype=dtype, count=count, offset=offset).reshape(tuple(tensor.dims))

    def releaser(self, array: np.ndarray) -> Callable[[], None] | None:
        """A function dropping from memory the file's pages under ``array`` (a view of this
        map, as :meth:`array` gives), for a writer done with them; None for another array."""
        if self._address is None:
            self._address = np.frombuffer(self.map, np.uint8).__array_interface__["data"][0]
        low, high = byte_bounds(array)
        if not self._address <= low <= high <= self._address + len(self.map):
            return None
        return functools.partial(self._release, low - self._address, high - self._address)

    def _holds(self, data: bytes, offset: int) -> bool:
        """Whether the file holds ``data`` at ``offset`` (compared a piece at a time, each
        piece's pages dropped after it)."""
        ours = np.frombuffer(data, np.uint8)
        for start in range(0, len(data), PIECE_BYTES):
            stop = min(len(data), start + PIECE_BYTES)
            theirs = np.frombuffer(self.map, np.uint8, count=stop - start, offset=offset + start)
            same = np.array_equal(ours[start:stop], theirs)
            del theirs
            self._release(offset + start, offset + stop)
            if not same:
                return False
        return True

    def _release(self, start: int, end: int) -> None:
        """Drop the pages of ``[start, end)`` from this process (the page cache keeps them: a
        later read faults them back in)."""
        first = start - start % _PAGE
        if end > first:
            try:
                self.map.madvise(mmap.MADV_DONTNEED, first, end - first)
            except (AttributeError, OSError, ValueError):  # no madvise here: the pages stay
                pass


def _fields(view: memoryview, begin: int, end: int):
    """(key, start, payload start, end) of each field of the message in ``view[begin:end]``;
    the payload start is the byte after a length-delimited field's length."""
    pos = begin
    while pos < end:
        start = pos
        key, pos = read_varint(view, pos)
        body = pos
        if key & 7 == LEN:
            length, body = read_varint(view, pos)
            pos = body + length
        else:
            pos = skip(view, pos, key & 7)
        if pos > end:
            raise ValueError(f"truncated protobuf field at byte {start}")
        yield key, start, body, pos
