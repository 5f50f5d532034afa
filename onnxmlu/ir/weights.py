"""Models too large for one protobuf message: size accounting and shape inference.

protobuf cannot serialize a message of 2 GB or more, and onnx's shape inference and checker
serialize the model they are given. A model whose weights come from external data can still
be *held* in memory above that size (``onnx.load`` fills the tensors in), so the pipeline
asks :func:`tensor_payload_bytes` (cheap: nothing is serialized) before doing anything that
serializes, and runs shape inference on a *skeleton* of large models: the same graph with
every large initializer turned into a typed graph input. Inference needs the weights' types
and shapes, never their values, so the skeleton gives the same value infos at a fraction
of the size.

:class:`WeightStore` keeps the large weights of the model being streamed to a file *outside*
the protobuf tree. python-protobuf (upb) frees a message tree's memory only when the whole tree
is freed, so a weight copied into a block body would otherwise stay in memory twice until the
end. ``fuse_to_file`` moves every large main-graph initializer into the store once, right after
normalizing (the full tree is then dropped), and the graph keeps a *marker* in its place: the
same name, type and dims, data "external" at :data:`STORE_LOCATION`. The store is passed
explicitly to whatever reads a marker (:class:`~onnxmlu.ir.GraphIndex`, the rewriters'
graphsurgeon import, collapse): rewriters read and create large constants through it (a
transposed weight is a numpy view until it is written), and collapse writes each weight into
the body of its block, releasing it after its last block.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np
import onnx
from onnx import numpy_helper

from onnxmlu.ir.graphs import iter_graphs, nested_graphs

if TYPE_CHECKING:
    from onnxmlu.ir.mapped import MappedModel

#: Initializers at least this large become graph inputs in the skeleton; smaller ones stay
#: (shape tensors such as a Reshape's target must keep their values for inference). Every
#: model is inferred on its skeleton, so the bound is low: a 3x3x64x64 conv weight is 147 KB.
SKELETON_MIN_TENSOR_BYTES = 2**14


def tensor_payload_bytes(model: onnx.ModelProto) -> int:
    """Bytes held by the model's tensors (initializers, tensor attributes, subgraphs included)."""
    return sum(tensor_bytes(t) for t in all_tensors(model.graph))


def all_tensors(graph: onnx.GraphProto) -> Iterable[onnx.TensorProto]:
    for g in iter_graphs(graph):
        yield from g.initializer
        for node in g.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t
                yield from attr.tensors


def tensor_bytes(t: onnx.TensorProto) -> int:
    """The payload of one tensor: dims x item size for raw data and :class:`WeightStore`
    markers, 8 bytes per typed-field element, the strings' lengths. Never ``len(t.raw_data)``:
    upb returns a new copy of the bytes on every read (VGG-19's 548 MB were copied 10 times,
    5.7 s, by size checks alone)."""
    if t.HasField("raw_data") or is_marker(t):
        return math.prod(t.dims) * itemsize(t.data_type)
    fields = (t.float_data, t.int32_data, t.int64_data, t.double_data, t.uint64_data)
    return sum(8 * len(f) for f in fields) + sum(len(s) for s in t.string_data)


@functools.lru_cache(maxsize=None)
def itemsize(data_type: int) -> int:
    """Bytes per element of an ONNX element type (cached: numpy's dtype lookup costs more than
    the product of a few dims)."""
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).itemsize
    except (KeyError, TypeError, ValueError):  # an undefined or unusual type: count one byte
        return 1


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without its large initializers, each replaced by a typed graph input."""
    out = onnx.ModelProto()
    for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(out, name, getattr(model, name))
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    graph, light = model.graph, out.graph
    light.name = graph.name
    light.node.extend(graph.node)
    light.input.extend(graph.input)
    light.output.extend(graph.output)
    light.value_info.extend(graph.value_info)
    declared = {i.name for i in graph.input}
    for t in graph.initializer:
        if tensor_bytes(t) < SKELETON_MIN_TENSOR_BYTES and not is_marker(t):
            light.initializer.append(t)
        elif t.name not in declared:
            light.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return out


def infer_on_skeleton(model: onnx.ModelProto,
                      infer: Callable[[onnx.ModelProto], onnx.ModelProto]) -> onnx.ModelProto:
    """Run ``infer`` on the skeleton and copy the inferred types into ``model`` (in place:
    copying the model would double the memory of the weights); returns ``model``.

    The skeleton keeps every node in order, so subgraphs (If/Loop bodies) pair up by position
    and get their inferred value infos too."""
    inferred = infer(skeleton(model)).graph
    _copy_types(model.graph, inferred)
    for sub, done in zip(nested_graphs(model.graph), nested_graphs(inferred)):
        _copy_types(sub, done)
    return model


def _copy_types(graph: onnx.GraphProto, inferred: onnx.GraphProto) -> None:
    del graph.value_info[:]
    graph.value_info.extend(inferred.value_info)
    typed = {o.name: o for o in inferred.output}
    for o in graph.output:
        if o.name in typed:
            o.type.CopyFrom(typed[o.name].type)


# --------------------------------------------------------------------------------------
# Weights held outside the protobuf tree
# --------------------------------------------------------------------------------------
#: The "external data location" of a marker: the data is in a :class:`WeightStore`.
STORE_LOCATION = "onnxmlu:weight-store"
#: Main-graph initializers at least this large move to the store (shape tensors keep their
#: values in the graph). Skeletons always declare a marker as an input, so shape inference
#: never sees one. 64 KiB rather than 1 MiB: ResNet-50's peak 260 -> 253 MB, since weights in
#: the graph stay in memory to the end and store weights leave after their block.
STORE_MIN_TENSOR_BYTES = 2**16
#: Element types whose raw little-endian bytes are exactly numpy's ``tobytes`` of the array
#: ``numpy_helper.to_array`` gives (float8/int4/bfloat16/strings are left in the graph).
_STORABLE = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
                       onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
                       onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
                       onnx.TensorProto.UINT32, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL})
_KEY = "onnxmlu_key"


def is_external(t: onnx.TensorProto) -> bool:
    """Whether ``t``'s bytes are in an external file (onnx's ``data_location``)."""
    return t.data_location == onnx.TensorProto.EXTERNAL


def is_marker(t: onnx.TensorProto) -> bool:
    return is_external(t) and any(
        e.key == "location" and e.value == STORE_LOCATION for e in t.external_data)


def tensor_array(t: onnx.TensorProto, store: "WeightStore | None" = None) -> np.ndarray:
    """The value of ``t``, read from ``store`` when ``t`` is a marker."""
    if is_marker(t):
        return _require_store(t, store).array(t)
    return numpy_helper.to_array(t)


def fill_tensor(target: onnx.TensorProto, t: onnx.TensorProto, store: "WeightStore | None" = None,
                release: bool = False) -> None:
    """``target`` becomes a copy of ``t``, with the data of a marker (see :meth:`WeightStore.fill`)."""
    if is_marker(t):
        _require_store(t, store).fill(target, t, release=release)
    else:
        target.CopyFrom(t)


def _require_store(t: onnx.TensorProto, store: "WeightStore | None") -> "WeightStore":
    if store is None:
        raise RuntimeError(f"tensor {t.name!r} is held by a weight store, but none was given to read it")
    return store


class WeightStore:
    """Large tensors by key as numpy arrays (possibly views: a transpose costs nothing until it
    is written); the graph holds markers that name their key."""

    def __init__(self, min_bytes: int | None = None) -> None:
        self._arrays: dict[str, np.ndarray] = {}
        self._keys = itertools.count()
        self.min_bytes = STORE_MIN_TENSOR_BYTES if min_bytes is None else min_bytes
        self._source: "MappedModel | None" = None  # the mapped file some arrays view (attach)

    def takes(self, tensor: onnx.TensorProto) -> bool:
        """Whether initializer ``tensor`` moves into the store (large enough, an element type
        whose raw bytes are numpy's; a marker already is in it)."""
        return tensor.data_type in _STORABLE and tensor_bytes(tensor) >= self.min_bytes and not is_marker(tensor)

    def attach(self, source: "MappedModel") -> None:
        """Arrays put from now on may view ``source``, the mapped file (see :meth:`releaser`)."""
        self._source = source

    def clear(self) -> None:
        """Forget every array (a parse whose markers are thrown away)."""
        self._arrays.clear()

    def holds(self, array: np.ndarray) -> bool:
        """Whether a constant with this value belongs in the store rather than in the graph."""
        return array.nbytes >= self.min_bytes and array.dtype.kind in "biuf"

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())

    def put(self, name: str, array: np.ndarray, data_type: int | None = None) -> onnx.TensorProto:
        """Hold ``array`` and return the marker that stands for it in a graph."""
        key = str(next(self._keys))
        self._arrays[key] = array
        marker = onnx.TensorProto(name=name, dims=array.shape)
        marker.data_type = data_type or onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
        marker.data_location = onnx.TensorProto.EXTERNAL
        marker.external_data.add(key="location", value=STORE_LOCATION)
        marker.external_data.add(key=_KEY, value=key)
        return marker

    def array(self, marker: onnx.TensorProto) -> np.ndarray:
        return self._arrays[_key(marker)]

    def releaser(self, array: np.ndarray) -> "Callable[[], None] | None":
        """For an array that views the mapped source file: a function dropping the file's pages
        under it from memory (:meth:`MappedModel.releaser`); None for an array in memory."""
        return self._source.releaser(array) if self._source is not None else None

    def detach(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A new model whose large main-graph initializers are markers into this store (those
        still in the tree: a model parsed through a map has its file's as markers already).
        The caller drops ``model`` afterwards: only then does protobuf free its weights."""
        light = onnx.ModelProto()
        _copy_fields(light, model, skip="graph")
        _copy_fields(light.graph, model.graph, skip="initializer")
        for t in model.graph.initializer:
            light.graph.initializer.append(self.put(t.name, _stored_array(t), t.data_type) if self.takes(t) else t)
        return light

    def keep_only(self, model: onnx.ModelProto) -> None:
        """Drop the arrays no marker of ``model`` names any more (weights a rewrite replaced);
        markers inside subgraphs are filled in place (a block copies subgraphs whole)."""
        for sub in nested_graphs(model.graph):
            for t in sub.initializer:
                if is_marker(t):
                    self.fill(t, t)
        used = {_key(t) for t in model.graph.initializer if is_marker(t)}
        self._arrays = {k: a for k, a in self._arrays.items() if k in used}

    def fill(self, target: onnx.TensorProto, marker: onnx.TensorProto, release: bool = False) -> None:
        """Make ``target`` the tensor ``marker`` stands for, data included (``target`` may be
        ``marker``). ``release`` drops the array first: the weight is then in memory only as
        bytes and as ``target``'s copy of them, never three times."""
        key = _key(marker)
        data = _as_bytes(self._arrays[key])
        if release:
            del self._arrays[key]
        header = self.header(marker)
        target.CopyFrom(header)
        target.raw_data = data

    def fill_markers(self, graph: onnx.GraphProto, names: "set[str] | None" = None) -> int:
        """Turn the markers among ``graph``'s initializers (those in ``names``; all without)
        back into the tensors they stand for, in place, for code that hands the tree to
        onnxruntime or onnx (the folder, the shape probe, the version converter); the number
        filled."""
        markers = [t for t in graph.initializer if is_marker(t) and (names is None or t.name in names)]
        for t in markers:
            self.fill(t, t)
        return len(markers)

    def header(self, marker: onnx.TensorProto) -> onnx.TensorProto:
        """The tensor ``marker`` stands for, all but its data: name, element type, dims. With
        ``raw_data`` the bytes of :meth:`array` it is what :meth:`fill` makes (a writer that
        frames the bytes itself, :mod:`onnxmlu.ir.wire`, never joins them)."""
        header = onnx.TensorProto(name=marker.name, data_type=marker.data_type)
        header.dims.extend(marker.dims)
        return header

    def release(self, marker: onnx.TensorProto) -> None:
        self._arrays.pop(_key(marker), None)


def _stored_array(t: onnx.TensorProto) -> np.ndarray:
    """The value of ``t`` for the store: a read-only view of one copy of its raw bytes (which
    :func:`_as_bytes` hands back as is), or numpy_helper's array for typed-field data."""
    if not t.HasField("raw_data"):
        return numpy_helper.to_array(t)
    return np.frombuffer(t.raw_data, dtype=raw_dtype(t)).reshape(tuple(t.dims))


def raw_dtype(t: onnx.TensorProto) -> np.dtype:
    """The numpy type of ``t``'s raw data (little-endian, as ONNX stores it)."""
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")


def _as_bytes(array: np.ndarray) -> bytes:
    """The array's data in C order as ONNX raw data: the bytes object it views when it views
    one whole (a weight as read), else a new copy (a transposed view, a computed weight).
    Each copy of a 500 MB weight costs ~0.5 s here, mostly in page faults."""
    whole = viewed_bytes(array)
    return whole if whole is not None else array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def viewed_bytes(array: np.ndarray) -> bytes | None:
    """The ``bytes`` object ``array`` views whole, in C order and little-endian (a weight as
    read from its raw data), else None: those bytes are the weight's ONNX raw data as they are."""
    base = array.base
    while isinstance(base, np.ndarray):
        base = base.base
    little = array.dtype.newbyteorder("<")
    if isinstance(base, bytes) and len(base) == array.nbytes and array.flags.c_contiguous and array.dtype == little:
        return base
    return None


def _key(marker: onnx.TensorProto) -> str:
    return next(e.value for e in marker.external_data if e.key == _KEY)


def _copy_fields(target, source, skip: str) -> None:
    """Every set field of ``source`` but ``skip`` into ``target`` (messages are copied)."""
    for field, value in source.ListFields():
        if field.name != skip:
            copy_field(target, field, value)


def copy_field(target, field, value) -> None:
    """Set protobuf ``field`` of ``target`` to ``value`` (replacing it; messages are copied)."""
    target.ClearField(field.name)
    repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
    if repeated:
        getattr(target, field.name).extend(value)
    elif field.message_type is not None:
        getattr(target, field.name).CopyFrom(value)
    else:
        setattr(target, field.name, value)
