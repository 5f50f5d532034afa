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


_F16 = np.dtype(np.float16)


#: A float16 constant of more bytes than this is widened by a ``Cast`` in the block, at run time,
#: not stored again as float32: folding it kept a float32 copy of every float16 attention weight,
#: twice the bytes the model stores (an optimizer-saved float16 BERT's fused file grew by the
#: attention weights' size). Smaller ones (scales, biases, norms) are cast at compile time.
WIDEN_FOLD_BYTES = 1 << 12


def _widened(bld, tensor: gs.Tensor, name: str) -> gs.Tensor:
    """``tensor`` (float16) as float32: a folded constant when small, else a ``Cast`` node."""
    if isinstance(tensor, gs.Constant) and 2 * int(np.prod(tensor.shape)) > WIDEN_FOLD_BYTES:
        return bld.op("Cast", [tensor], attrs={"to": 1}, name=name, dtype=np.float32)  # 1: FLOAT
    return bld.cast(tensor, np.float32, name=name)


def widen_half(node: gs.Node, bld) -> None:
    """Make a float16 node float32 in place, for kernels that compute float16 in float32 and round
    each output once: a ``Cast`` to float32 in front of each float16 input (a small constant is
    cast at compile time, exactly; a large one in the block: :data:`WIDEN_FOLD_BYTES`) and a
    ``Cast`` back to float16 behind each output. The node's float32 rewrite then applies as it
    is; the casts keep the shapes, which rewrites read."""
    for index, tensor in enumerate(list(node.inputs)):
        if tensor.is_empty() or float_dtype(tensor) != _F16:
            continue
        wide = _widened(bld, tensor, f"input{index}_float")
        if isinstance(wide, gs.Variable):  # a constant has its shape
            wide.shape = tensor.shape
        node.inputs[index] = wide
    for index, out in enumerate(list(node.outputs)):
        if out.is_empty():
            continue
        wide = gs.Variable(bld.names.tensor(f"{out.name}_float"), dtype=np.float32, shape=out.shape)
        node.outputs[index] = wide
        bld.op("Cast", [wide], attrs={"to": 10}, name=f"output{index}_half", out=out)  # 10: FLOAT16
