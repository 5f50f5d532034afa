"""Seeded random inputs for a model: what ``check``, ``run`` and the random calibration
samples feed where the user gives no data.

Floats are standard normal, integers uniform in ``[0, min(10, V))``, booleans fair coins,
strings one lowercase ASCII letter each (what a character-level model, a grapheme-to-phoneme
encoder's LabelEncoder, looks up; a word-level one maps them to its default), all from one
``numpy`` generator seeded by the caller, so a seed names one set of feeds on every machine.
``V`` is the vocabulary the model states for an integer input (:func:`integer_bounds`):
the first dim of the table a Gather (or a contrib lookup: :data:`_LOOKUPS`) looks the input
up in (an embedding: an initializer, or one dequantized from INT8), through the ops that pass
ids on unchanged (Cast, Reshape, Unsqueeze, ...); the smallest when several. An integer input
without one is drawn in ``[0, 10)`` and named by :func:`unbounded_integer_inputs`
(the check says its values may be out of range).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx

from onnxmlu.errors import OnnxMluError
from onnxmlu.frontend.pins import concrete_shapes
from onnxmlu.ir import fed_inputs

#: What a random string input is drawn from (one letter each).
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def random_inputs(model: onnx.ModelProto, seed: int = 0, dims: Mapping[str, int] | None = None,
                  shapes: Mapping[str, Sequence[int]] | None = None,
                  given: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Seeded random feeds for the model's true inputs (initializers excluded), with the arrays
    in ``given`` in place of their inputs: an input the caller gives (a string input, which has
    no random draw) is never drawn.

    ``shapes`` gives whole input shapes by input name; ``dims`` sizes symbolic dims by name;
    other symbolic dims take the pricing defaults of :func:`onnxmlu.frontend.pins.concrete_shapes`.
    """
    rng = np.random.default_rng(seed)
    feeds = dict(given or {})
    defaults = concrete_shapes(model)
    bounds = integer_bounds(model)
    for value in fed_inputs(model.graph):
        if value.name in feeds:
            continue
        tensor_type = value.type.tensor_type
        if shapes and value.name in shapes:
            shape = [int(d) for d in shapes[value.name]]
        elif dims:
            shape = [_dim_size(d, dims) for d in tensor_type.shape.dim]
        else:
            shape = defaults.get(value.name, [])
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        feeds[value.name] = _random_array(rng, shape, dtype, bounds.get(value.name))
    return feeds


#: Ops that hand integer ids on unchanged (values, not positions, matter to a lookup).
_PASS_IDS = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Transpose", "Expand"})

#: Lookups other than Gather: (domain, op) -> {ids input: table input}, each table indexed
#: along its first dim. onnxruntime's transformer optimizer writes BERT's embeddings as one
#: EmbedLayerNormalization (word, position and segment tables; its kernel refuses an id out of
#: range); GatherBlockQuantized is the lookup of a block-quantized (int4) embedding.
_LOOKUPS: dict[tuple[str, str], dict[int, int]] = {
    ("com.microsoft", "EmbedLayerNormalization"): {0: 2, 1: 4, 8: 3},
    ("com.microsoft", "GatherBlockQuantized"): {1: 0},
}


def integer_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Integer input -> the vocabulary it indexes (module docstring), for those that have one."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    tables = _tables(model)
    bounds = {}
    for value in fed_inputs(model.graph):
        if value.type.tensor_type.elem_type in _INTEGER_TYPES:
            found = _lookup_sizes(value.name, readers, tables)
            if found:
                bounds[value.name] = min(found)
    return bounds


def unbounded_integer_inputs(model: onnx.ModelProto) -> list[str]:
    """The integer inputs drawn without a vocabulary the model states."""
    bounds = integer_bounds(model)
    return [v.name for v in fed_inputs(model.graph)
            if v.type.tensor_type.elem_type in _INTEGER_TYPES and v.name not in bounds]


_INTEGER_TYPES = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
                            onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
                            onnx.TensorProto.UINT32, onnx.TensorProto.UINT64})


#: Ops that make a table of the same dims from a stored one: INT8 embeddings dequantized, or
#: written as Cast(int8) * scale.
_KEEP_DIMS = frozenset({"Cast", "DequantizeLinear", "Mul", "Identity"})


def _tables(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Tensor -> dims, for the initializers and what :data:`_KEEP_DIMS` ops make of them
    (the dims of their first input)."""
    tables = {t.name: list(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:  # topological order: a producer's table is known first
        if node.op_type in _KEEP_DIMS and node.input and node.input[0] in tables and node.output:
            tables[node.output[0]] = tables[node.input[0]]
    return tables


def _lookup_sizes(name: str, readers: dict, tables: dict[str, list[int]], depth: int = 0) -> list[int]:
    """The sizes of the tables ``name``'s values index (a Gather's indices on an initializer,
    along its axis), following the ops that pass ids on."""
    sizes = []
    for node in readers.get(name, []) if depth < 16 else []:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name and node.input[0] in tables:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            dims = tables[node.input[0]]
            if -len(dims) <= axis < len(dims) and dims[axis] > 0:
                sizes.append(dims[axis])
        elif (node.domain, node.op_type) in _LOOKUPS:
            sizes += _contrib_lookup_sizes(node, name, tables)
        elif node.op_type in _PASS_IDS and node.input[0] == name:
            sizes += [s for out in node.output for s in _lookup_sizes(out, readers, tables, depth + 1)]
    return sizes


def _contrib_lookup_sizes(node: onnx.NodeProto, name: str, tables: dict[str, list[int]]) -> list[int]:
    """The first dims of the tables ``node`` (a :data:`_LOOKUPS` op) looks ``name`` up in."""
    sizes = []
    for ids, table in _LOOKUPS[(node.domain, node.op_type)].items():
        if ids < len(node.input) and node.input[ids] == name and table < len(node.input):
            dims = tables.get(node.input[table])
            if dims and dims[0] > 0:
                sizes.append(dims[0])
    return sizes


def _dim_size(dim: onnx.TensorShapeProto.Dimension, dims: Mapping[str, int]) -> int:
    if dim.HasField("dim_value"):
        return dim.dim_value
    return int(dims.get(dim.dim_param, 1))


def _random_array(rng: np.random.Generator, shape: list[int], dtype: np.dtype, bound: int | None = None) -> np.ndarray:
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, min(10, bound or 10), size=shape).astype(dtype)
    if dtype == np.object_:  # onnx's STRING
        return np.array(list(LETTERS), dtype=object)[rng.integers(0, len(LETTERS), size=shape)]
    raise OnnxMluError(f"cannot make random inputs of type {dtype}; pass --inputs data.npz")
