"""A model file parsed through a read-only memory map, one piece of its graph at a time, its
large weights left in the file as views that a :class:`~onnxmlu.ir.weights.WeightStore` holds.

``onnx.load`` reads the whole file into one ``bytes`` object and then parses it, so for a
moment the model is in memory twice (VGG-19: the 548 MB file and the 548 MB parsed tree), and
a store that takes the weights out of the tree later copies each of them once more. Here:

* the file is mapped read-only and parsed field by field of its graph (pieces of a few MB),
  each piece's pages dropped from this process once parsed. protobuf parses concatenated
  fields exactly as it merges them one by one, so without a store the tree is the one
  ``onnx.load`` builds;
* with a store, every main-graph initializer the store would hold (its size and element type:
  :meth:`WeightStore.takes`) never enters the tree: its header (name, type, dims) is parsed
  from the fields around its raw data, the store holds a read-only numpy view of the raw data
  where it lies in the mapped file, and the graph gets the store's *marker* in its place, in
  the same position. Nothing is copied and the weight's pages are not even read until a pass
  or the writer needs them (VGG-19: 0.3 s of parsing and 0.4 s of copying and comparing the
  548 MB went). A pass that changes a weight makes a new array (the view is read-only).

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

from onnxmlu.ir.weights import WeightStore, raw_dtype, tensor_bytes
from onnxmlu.ir.wire import GRAPH as _GRAPH, INITIALIZER as _INITIALIZER, LEN, RAW_DATA as _RAW_DATA, read_varint, skip

#: Graph fields are merged into the tree in pieces of about this size (one larger field alone):
#: what the parse adds to the peak besides the tree.
PIECE_BYTES = 2**22
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
        self._address: int | None = None  # of the map's first byte, for :meth:`releaser`

    def parse(self, store: WeightStore | None = None) -> onnx.ModelProto:
        """The model the file holds (as ``onnx.load`` without external data would give it, but
        with ``store``'s markers for the weights it takes); raises one of :attr:`PARSE_ERRORS`
        on a damaged file."""
        model = onnx.ModelProto()
        if store is not None:
            store.attach(self)
        view = memoryview(self.map)
        try:
            for key, start, body, end in _fields(view, 0, len(view)):
                if key == (_GRAPH << 3 | LEN):
                    self._parse_graph(model.graph, view, body, end, store)
                else:
                    model.MergeFromString(view[start:end])
        finally:
            view.release()
        return model

    def _parse_graph(self, graph: onnx.GraphProto, view: memoryview, begin: int, end: int,
                     store: WeightStore | None) -> None:
        piece = begin
        for key, start, body, stop in _fields(view, begin, end):
            marker = self._marker(view, body, stop, store) if key == (_INITIALIZER << 3 | LEN) and store else None
            if marker is not None:  # what precedes it first: the initializers keep their order
                self._merge(graph, view, piece, start)
                graph.initializer.append(marker)
                piece = stop
            elif stop - piece >= PIECE_BYTES:
                self._merge(graph, view, piece, stop)
                piece = stop
        self._merge(graph, view, piece, end)

    def _merge(self, graph: onnx.GraphProto, view: memoryview, start: int, stop: int) -> None:
        if stop > start:
            graph.MergeFromString(view[start:stop])
            self._release(start, stop)

    def _marker(self, view: memoryview, begin: int, end: int, store: WeightStore) -> onnx.TensorProto | None:
        """The store's marker for the initializer in ``view[begin:end]``, its raw data held as
        a view of the file; None when the store does not take it (small, no raw data, an
        element type it leaves in the graph, data in another file)."""
        header, raw = bytearray(), None
        for key, start, body, stop in _fields(view, begin, end):
            if key == (_RAW_DATA << 3 | LEN):
                raw = (body, stop - body)
            else:
                header += view[start:stop]
        if raw is None or raw[1] < store.min_bytes:  # most initializers: no header parsed
            return None
        tensor = onnx.TensorProto.FromString(bytes(header))
        if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.HasField("segment"):
            return None
        tensor.raw_data = b""  # empty: tensor_bytes counts the dims and the type, as for raw data
        if tensor_bytes(tensor) != raw[1] or _typed_data(tensor) or not store.takes(tensor):
            return None
        dtype = raw_dtype(tensor)
        array = np.frombuffer(self.map, dtype=dtype, count=raw[1] // dtype.itemsize, offset=raw[0])
        return store.put(tensor.name, array.reshape(tuple(tensor.dims)), tensor.data_type)

    def releaser(self, array: np.ndarray) -> Callable[[], None] | None:
        """A function dropping from memory the file's pages under ``array`` (a view of this
        map, as :meth:`array` gives), for a writer done with them; None for another array."""
        if self._address is None:
            self._address = np.frombuffer(self.map, np.uint8).__array_interface__["data"][0]
        low, high = byte_bounds(array)
        if not self._address <= low <= high <= self._address + len(self.map):
            return None
        return functools.partial(self._release, low - self._address, high - self._address)

    def _release(self, start: int, end: int) -> None:
        """Drop the pages of ``[start, end)`` from this process (the page cache keeps them: a
        later read faults them back in)."""
        first = start - start % _PAGE
        if end > first:
            try:
                self.map.madvise(mmap.MADV_DONTNEED, first, end - first)
            except (AttributeError, OSError, ValueError):  # no madvise here: the pages stay
                pass


def _typed_data(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor`` also holds values in a typed field (a malformed tensor: left to the tree)."""
    return any(len(getattr(tensor, f)) for f in ("float_data", "int32_data", "string_data", "int64_data",
                                                 "double_data", "uint64_data"))


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
