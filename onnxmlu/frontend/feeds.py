"""Seeded random inputs for a model: what ``check``, ``run`` and the random calibration
samples feed where the user gives no data.

Floats are standard normal, integers uniform in ``[0, 10)``, booleans fair coins, strings one
lowercase ASCII letter each (what a character-level model, a grapheme-to-phoneme encoder's
LabelEncoder, looks up; a word-level one maps them to its default), all from one ``numpy``
generator seeded by the caller, so a seed names one set of feeds on every machine.
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
        feeds[value.name] = _random_array(rng, shape, dtype)
    return feeds


def _dim_size(dim: onnx.TensorShapeProto.Dimension, dims: Mapping[str, int]) -> int:
    if dim.HasField("dim_value"):
        return dim.dim_value
    return int(dims.get(dim.dim_param, 1))


def _random_array(rng: np.random.Generator, shape: list[int], dtype: np.dtype) -> np.ndarray:
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 10, size=shape).astype(dtype)
    if dtype == np.object_:  # onnx's STRING
        return np.array(list(LETTERS), dtype=object)[rng.integers(0, len(LETTERS), size=shape)]
    raise OnnxMluError(f"cannot make random inputs of type {dtype}; pass --inputs data.npz")
