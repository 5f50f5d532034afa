"""Opset-aware node builder with constant folding, used by every rewriter.

Each method emits ONNX nodes that are valid in the model's own opset (Split/Unsqueeze take their
sizes/axes as attributes before opset 13 and as inputs from 13; Clip takes min/max as attributes
before opset 11; Where exists from opset 9 and is emulated with a 0/1 multiply before). When all
inputs of a structural or arithmetic op are compile-time constants the result is computed with
numpy and becomes an initializer instead of a node, so constant weights end up pre-transposed,
pre-split and pre-scaled while dynamic ones get the equivalent nodes.

Names derive from the rewritten node: ``<node>/<scope>/<op>``, made unique by the allocator.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxmlu.ir.graphsurgeon import stored_constant
from onnxmlu.ir.weights import WeightStore
from onnxmlu.rewrite.graph import NameAllocator, constant_value, tensor_dtype


class Builder:
    """Append nodes to one graph under a name prefix; compute on ``dtype`` tensors."""

    def __init__(
        self,
        graph: gs.Graph,
        opset: int,
        names: NameAllocator,
        prefix: str,
        dtype: np.dtype,
        cache: dict,
        weights: WeightStore | None = None,
    ) -> None:
        self.graph = graph
        self.opset = opset
        self.names = names
        self.prefix = prefix
        self.dtype = np.dtype(dtype)
        self._cache = cache  # scalar constants shared by all builders of this graph
        self.weights = weights  # where large new constants go (None: into the graph)

    def child(self, scope: str) -> Builder:
        """A builder of the same kind for a named scope of this graph."""
        return type(self)(
            self.graph, self.opset, self.names, f"{self.prefix}/{scope}", self.dtype, self._cache, self.weights
        )

    def without_store(self) -> Builder:
        """This builder with every new constant kept in the graph (a subgraph's weights)."""
        return type(self)(self.graph, self.opset, self.names, self.prefix, self.dtype, self._cache, None)

    def in_graph(self, graph: gs.Graph, scope: str) -> Builder:
        """A builder of the same kind for ``graph`` (a subgraph): its own scalars, constants kept in it."""
        return type(self)(graph, self.opset, self.names, f"{self.prefix}/{scope}", self.dtype, {}, None)

    # ---------------------------------------------------------------- tensors

    def const(self, value: Any, name: str = "const", dtype: Any = None) -> gs.Constant:
        array = np.asarray(value, dtype=dtype if dtype is not None else self.dtype)
        full_name = self.names.tensor(f"{self.prefix}/{name}")
        if self.weights is not None and self.weights.holds(array):
            # streamed fuse: the weight stays a numpy array (a transpose stays a view) until the
            # block that uses it is written
            return stored_constant(full_name, array, self.weights)
        return gs.Constant(full_name, np.ascontiguousarray(array))

    def scalar(self, value: float, dtype: Any = None) -> gs.Constant:
        """A 0-d constant, shared by every use of the same value in this graph."""
        dtype = np.dtype(dtype if dtype is not None else self.dtype)
        key = ("scalar", float(value), dtype.str)
        if key not in self._cache:
            base = self.prefix.split("/")[0]
            self._cache[key] = gs.Constant(
                self.names.tensor(f"{base}/k_{value:g}"), np.asarray(value, dtype=dtype)
            )
        return self._cache[key]

    def int64(self, values: Any, name: str = "idx") -> gs.Constant:
        return self.const(np.asarray(values, dtype=np.int64), name, dtype=np.int64)

    def _tensor(self, x: Any) -> gs.Tensor:
        if isinstance(x, gs.Tensor):
            return x
        array = np.asarray(x)
        if array.dtype.kind == "f":
            return self.scalar(float(array)) if array.ndim == 0 else self.const(array)
        return self.const(array, dtype=array.dtype)

    @staticmethod
    def value(x: Any) -> np.ndarray | None:
        """Compile-time value of a builder operand, or ``None``."""
        if isinstance(x, gs.Tensor):
            return constant_value(x)
        return np.asarray(x)

    # ---------------------------------------------------------------- nodes

    def op(
        self,
        op_type: str,
        inputs: Sequence[Any],
        *,
        attrs: dict | None = None,
        name: str | None = None,
        outputs: int = 1,
        dtype: Any = None,
        out: gs.Variable | None = None,
    ) -> Any:
        """Emit one node; returns its output (or the list of outputs when ``outputs > 1``)."""
        tensors = [self._tensor(x) for x in inputs]
        node_name = self.names.node(f"{self.prefix}/{name or op_type.lower()}")
        if dtype is None:
            dtype = next((d for d in map(tensor_dtype, tensors) if d is not None), self.dtype)
        if out is not None:
            outs = [out]
        else:
            outs = [
                gs.Variable(
                    self.names.tensor(node_name if outputs == 1 else f"{node_name}_{i}"),
                    dtype=np.dtype(dtype),
                )
                for i in range(outputs)
            ]
        node = gs.Node(op_type, node_name, attrs or {}, tensors, outs)
        self.graph.nodes.append(node)
        self._cache.setdefault("created", set()).add(id(node))
        return outs[0] if outputs == 1 else outs

    def finish(self, tensor: gs.Tensor, out: gs.Variable) -> None:
        """Make ``out`` (an output of the replaced node) carry ``tensor``'s value.

        Renames the producer's output when ``tensor`` is a fresh intermediate of this rewrite,
        else emits an Identity (e.g. when the result is a constant or an existing tensor).
        """
        producer = tensor.inputs[0] if isinstance(tensor, gs.Variable) and tensor.inputs else None
        if (
            producer is not None
            and len(tensor.inputs) == 1
            and not tensor.outputs
            and tensor not in self.graph.outputs
            and id(producer) in self._cache.get("created", ())
        ):
            producer.outputs[producer.outputs.index(tensor)] = out
            return
        self.op("Identity", [tensor], out=out)

    # ---------------------------------------------------------------- elementwise

    def _binary(self, op_type: str, fn, a: Any, b: Any, name: str | None) -> gs.Tensor:
        va, vb = self.value(a), self.value(b)
        if va is not None and vb is not None:
            typed = [v.dtype for x, v in ((a, va), (b, vb)) if isinstance(x, gs.Tensor)]
            dtype = typed[0] if typed else self.dtype
            return self.const(fn(va, vb).astype(dtype), name or op_type.lower(), dtype=dtype)
        return self.op(op_type, [a, b], name=name)

    def add(self, a: Any, b: Any, name: str | None = None) -> gs.Tensor:
        return self._binary("Add", np.add, a, b, name)

    def sub(self, a: Any, b: Any, name: str | None = None) -> gs.Tensor:
        return self._binary("Sub", np.subtract, a, b, name)

    def mul(self, a: Any, b: Any, name: str | None = None) -> gs.Tensor:
        return self._binary("Mul", np.multiply, a, b, name)

    def matmul(self, a: Any, b: Any, name: str | None = None) -> gs.Tensor:
        return self._binary("MatMul", np.matmul, a, b, name)

    def unary(self, op_type: str, x: Any, name: str | None = None, **attrs: Any) -> gs.Tensor:
        return self.op(op_type, [x], attrs=attrs, name=name)

    def clip(self, x: Any, bound: float, name: str = "clip") -> gs.Tensor:
        """Clip to [-bound, bound]; attributes before opset 11, inputs from 11."""
        if self.opset < 11:
            return self.op("Clip", [x], attrs={"min": -float(bound), "max": float(bound)}, name=name)
        return self.op("Clip", [x, self.scalar(-bound), self.scalar(bound)], name=name)

    def greater(self, a: Any, b: Any, name: str = "greater") -> gs.Tensor:
        return self.op("Greater", [a, b], name=name, dtype=np.bool_)

    def cast(self, x: Any, dtype: Any, name: str = "cast") -> gs.Tensor:
        to = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        value = self.value(x)
        if value is not None:
            return self.const(value.astype(dtype), name, dtype=dtype)
        return self.op("Cast", [x], attrs={"to": to}, name=name, dtype=dtype)

    # ---------------------------------------------------------------- structure

    def transpose(self, x: Any, perm: Sequence[int], name: str = "transpose") -> gs.Tensor:
        if self.value(x) is not None:
            return self.derived(x, ("transpose", tuple(perm)), lambda v: np.transpose(v, perm), name)
        return self.op("Transpose", [x], attrs={"perm": list(perm)}, name=name)

    def derived(self, x: Any, how: tuple, compute, name: str) -> gs.Constant:
        """The constant ``compute(value of x)``, made once per constant ``x`` and ``how`` in
        this graph: nodes that share a weight (an unrolled RNN's Gemm at every step) keep
        sharing the one transposed or scaled copy."""
        key = ("derived", id(x), how)
        if key not in self._cache:
            value = self.value(x)
            result = np.asarray(compute(value))
            self._cache[key] = (x, self.const(result, name, dtype=result.dtype))  # x: keeps id(x) taken
        return self._cache[key][1]

    def gather(self, x: Any, index: int, axis: int = 0, name: str = "gather") -> gs.Tensor:
        """``x`` indexed by a scalar along ``axis`` (the axis disappears)."""
        value = self.value(x)
        if value is not None:
            return self.const(np.take(value, index, axis=axis), name, dtype=value.dtype)
        idx = self.scalar(index, np.int64)
        return self.op("Gather", [x, idx], attrs={"axis": axis}, name=name)

    def split(
        self, x: Any, sizes: Sequence[int], axis: int, name: str = "split"
    ) -> list[gs.Tensor]:
        value = self.value(x)
        if value is not None:
            parts = np.split(value, np.cumsum(sizes)[:-1], axis=axis)
            return [self.const(p, f"{name}{i}", dtype=value.dtype) for i, p in enumerate(parts)]
        if len(sizes) == 1:
            return [x]
        if self.opset >= 13:
            inputs = [x, self.int64(list(sizes), f"{name}_sizes")]
            return self.op("Split", inputs, attrs={"axis": axis}, name=name, outputs=len(sizes))
        attrs = {"axis": axis, "split": [int(s) for s in sizes]}
        return self.op("Split", [x], attrs=attrs, name=name, outputs=len(sizes))

    def unsqueeze(self, x: Any, axes: Sequence[int], name: str = "unsqueeze") -> gs.Tensor:
        value = self.value(x)
        if value is not None:
            return self.const(np.expand_dims(value, tuple(axes)), name, dtype=value.dtype)
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.int64(list(axes), f"{name}_axes")], name=name)
        return self.op("Unsqueeze", [x], attrs={"axes": list(axes)}, name=name)

    def reshape(self, x: Any, shape: Sequence[int], name: str = "reshape") -> gs.Tensor:
        """Reshape; a 0 in ``shape`` copies that input dimension (ONNX semantics)."""
        value = self.value(x)
        if value is not None and 0 not in shape:
            return self.const(np.reshape(value, shape), name, dtype=value.dtype)
        return self.op("Reshape", [x, self.int64(list(shape), f"{name}_shape")], name=name)

    def concat(self, xs: Sequence[Any], axis: int, name: str = "concat") -> gs.Tensor:
        if len(xs) == 1:
            return xs[0]
        values = [self.value(x) for x in xs]
        if all(v is not None for v in values):
            return self.const(np.concatenate(values, axis=axis), name, dtype=values[0].dtype)
        return self.op("Concat", list(xs), attrs={"axis": axis}, name=name)

    # ---------------------------------------------------------------- masks

    def select(self, mask: gs.Tensor, a: Any, b: Any | None, name: str = "select") -> gs.Tensor:
        """``mask ? a : b`` with ``b=None`` meaning zero.

        From opset 9 ``mask`` is bool and this is a Where; before, ``mask`` holds 0/1 in
        ``self.dtype`` and the choice is ``b + mask * (a - b)`` (exact for finite values).
        """
        if self.opset >= 9:
            zero_or_b = self.scalar(0.0) if b is None else b
            dtype = tensor_dtype(self._tensor(a)) or self.dtype
            return self.op("Where", [mask, a, zero_or_b], name=name, dtype=dtype)
        if b is None:
            return self.mul(a, mask, name=name)
        return self.add(b, self.mul(mask, self.sub(a, b, name=f"{name}_d")), name=name)
