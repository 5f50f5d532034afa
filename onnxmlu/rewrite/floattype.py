"""The element type of a tensor that onnx's type inference left unknown behind a contrib op.

onnx infers no type for the output of an operator it has no schema for (onnxruntime's
com.microsoft operators, its ``SimplifiedLayerNormalization``), nor for anything computed
from one, so in a model that onnxruntime's transformer optimizer wrote most tensors have no
type when the rewriters run. Every operator that the walk below passes through gives its
output the element type of its first input (their schemas bind both to one type parameter
``T``: ``MatMul``, ``Add``, ``Softmax``, ``Reshape``, ``Gather``'s data, ``LayerNormalization``,
and the contrib operators the rewriters handle), so the type is that of the first input with a
known type up the chain. Anything else on the way (a ``Cast``, a ``Shape``) stops the walk:
unknown.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.graph import tensor_dtype

#: Operators whose output has their first input's element type (one type parameter T).
SAME_TYPE_OPS = frozenset({
    "MatMul", "Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Erf", "Gelu", "Softmax", "Neg",
    "Sqrt", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Slice", "Split", "Gather",
    "Identity", "LayerNormalization", "Expand", "Where",
    # onnxruntime's (com.microsoft and its standard-domain SimplifiedLayerNormalization)
    "FusedMatMul", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
    "BiasGelu", "FastGelu", "QuickGelu", "BiasAdd", "MultiHeadAttention", "MatMulNBits", "RotaryEmbedding",
    "GroupQueryAttention", "Attention",
})
_DEPTH = 256  # long enough for any layer; a bound, never a cycle


def float_dtype(tensor: gs.Tensor | None) -> np.dtype | None:
    """``tensor``'s element type, found up the chain of :data:`SAME_TYPE_OPS` when not recorded."""
    for _ in range(_DEPTH):
        if tensor is None:
            return None
        if tensor.dtype is not None or isinstance(tensor, gs.Constant):
            return tensor_dtype(tensor)
        producer = tensor.inputs[0] if len(tensor.inputs) == 1 else None
        if producer is None or producer.op not in SAME_TYPE_OPS or not producer.inputs:
            return None
        # Where's first input is the condition: its type comes from the second
        tensor = producer.inputs[1] if producer.op == "Where" and len(producer.inputs) > 1 else producer.inputs[0]
    return None


def is_float(dtype: np.dtype | None, floats) -> bool:
    """``dtype`` is one of ``floats`` (None is not: numpy compares None equal to float64)."""
    return dtype is not None and any(dtype == f for f in floats)
