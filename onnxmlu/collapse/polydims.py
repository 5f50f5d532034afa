"""Output dims of a block body as exact polynomials of its input dims, without sympy.

The tier between onnx's shape inference and onnxruntime's symbolic engine in
:mod:`onnxmlu.collapse.dims`: it walks the light body's nodes in order and gives each tensor a
shape and, for small int tensors (shape arithmetic), a value. A dim is

* a polynomial with integer coefficients, ``sum_m c_m * prod_v v^e``: a map from monomials (a
  sorted tuple of ``(variable, exponent)``) to non-zero ints. A variable is an input's dim name
  (``("s", "batch")``) or an *atom*: an axis of an input that names none, ``floor(P / Q)``
  where the quotient is no polynomial (a strided Conv on a symbolic H), ``Min(e, d)`` (a Slice
  end short of int_max on a symbolic axis), or a dim the engine names anew for an op it has no
  rule for and onnx's inference leaves open (ConvTranspose on a symbolic H). Atoms are compared by
  what they are made of, so ``2*floor(h/2) + h - 2*floor(h/2)`` is ``h``, as in the engine;
  a dim that keeps an atom, or a power above 1, is *not polynomial*: written ``?``;
* :data:`UNKNOWN` (``None``): an op this module does not model, a value it does not know, or a
  form the engine writes otherwise (a product left factored, ``x*(a + b)``), decided by the engine.

Every rule is the ONNX spec's, and written as onnxruntime's engine derives it, so that the text
is the engine's wherever this tier settles an output (tests/test_polydims.py checks both on built
bodies and on every block of the corpus):

* ``floor(P / c)`` for an int ``c > 0`` is ``sum (c_m / c) m + floor(c_0 / c)`` when ``c`` divides
  every non-constant coefficient (an integer part leaves a floor), else an atom;
  ``floor(P / Q)`` is ``P / Q`` when ``Q`` is one term dividing ``P``'s only term, ``1`` when
  ``P == Q``, else an atom;
* a product is kept only where sympy expands it: one side a number, or both one term;
* two dims that must be equal and differ (a broadcast of ``a`` with ``b`` or with ``3``, a
  Concat or MatMul of unequal sizes) are merged by the engine into one representative for the
  whole body, chosen by onnxmlu/frontend/symbolic.py's total order (a number, then an input's
  dim by position, then a new name, then the shortest expression), and it infers again: so does
  the tier, each merged dim replaced by its representative wherever it is made (in place, with
  no new walk, where the merged dims are plain variables found only as whole dims, which is the
  same thing). Where a member is
  UNKNOWN (the engine's dim could be anything), the tier gives up on the body
  (:class:`MergeError`) and the engine decides it all;
* a Scan's body is walked with the states' shapes and the scan inputs' less their scan axis;
  its scan outputs get the last scan input's scan-axis dim (the engine's rule);
* a Reshape's ``-1`` is the product of the input dims over the product of the known output
  dims, cancelled factor by factor (numbers, input symbols and sums each a factor, as sympy's
  ``Mul`` holds them).

:func:`sympy_text` writes a polynomial as sympy's ``str`` does (terms in descending lexicographic
order of their exponents over the names sorted, ``2*W + 1``, ``H*W - 1``, and sympy's one
exception, ``1 - B``), so that :mod:`onnxmlu.collapse.dims` turns both tiers' dims into the
same text.
"""

from __future__ import annotations

import copy
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from onnxmlu.ir.weights import is_external

Mono = tuple  # ((variable, exponent), ...), variables sorted
Poly = tuple  # ((mono, coefficient), ...), monomials sorted, coefficients non-zero
Dim = Optional[Poly]
#: A dim this tier leaves to the engine.
UNKNOWN = None
INT_MAX = 2**31 - 1  # the engine's int_max: an end at or past it means "to the end"
_INT_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32}
_MAX_MERGES = 16  # walks of one body at most (each after one more merge), as the engine reruns
_MAX_VALUES = 64  # the longest constant read as values (a shape, pads, scales)


class MergeError(Exception):
    """Dims the body requires equal that this tier cannot merge as the engine does (one is
    UNKNOWN, or none of them is a number, an input's dim or a printable expression)."""


class NewMergeError(Exception):
    """A merge was recorded: the walk starts again with it known (the engine infers again)."""


# ---- polynomials ----------------------------------------------------------------------------

def const(c: int) -> Poly:
    return (((), int(c)),) if c else ()


def var(v) -> Poly:
    return ((((v, 1),), 1),)


def fresh(op_type: str, index: int, output: int, axis: int) -> Poly:
    """A dim the engine names anew for an op whose onnx inference left it unknown:
    ``<op><index>_o<output>__d<axis>`` (onnxruntime's ``_new_symbolic_dim_from_output``)."""
    return var(("fresh", f"{op_type}_{index}_o{output}__d{axis}"))


def fresh_name(p: Poly) -> str | None:
    if len(p) == 1 and p[0][1] == 1 and len(p[0][0]) == 1 and p[0][0][0][1] == 1 and p[0][0][0][0][0] == "fresh":
        return p[0][0][0][0][1]
    return None


def _plain_var(p: Poly):
    """The variable ``p`` is (an input's dim or an atom, to the first power), or None."""
    if len(p) == 1 and p[0][1] == 1 and len(p[0][0]) == 1 and p[0][0][0][1] == 1:
        return p[0][0][0][0]
    return None


def _normal(acc: dict) -> Poly:
    return tuple(sorted((m, c) for m, c in acc.items() if c))


def add(a: Dim, b: Dim, sign: int = 1) -> Dim:
    if a is None or b is None:
        return None
    acc = dict(a)
    for m, c in b:
        acc[m] = acc.get(m, 0) + sign * c
    return _normal(acc)


def _mono_mul(m1: Mono, m2: Mono) -> Mono:
    acc = dict(m1)
    for v, e in m2:
        acc[v] = acc.get(v, 0) + e
    return tuple(sorted(acc.items()))


def mul(a: Dim, b: Dim) -> Dim:
    """``a * b``; UNKNOWN where sympy keeps the product factored (neither side a number, one a sum)."""
    if a is None or b is None:
        return None
    if not (is_const(a) or is_const(b) or (len(a) <= 1 and len(b) <= 1)):
        return None
    acc: dict = {}
    for m1, c1 in a:
        for m2, c2 in b:
            m = _mono_mul(m1, m2)
            acc[m] = acc.get(m, 0) + c1 * c2
    return _normal(acc)


def is_const(p: Dim) -> bool:
    return p is not None and all(not m for m, _ in p)


def value(p: Poly) -> int:
    return dict(p).get((), 0)


def floordiv(a: Dim, b: Dim) -> Dim:
    """``floor(a / b)`` as the engine's sympy gives it (module docstring)."""
    if a is None or b is None or not b:
        return None
    if is_const(b) and value(b) > 0:
        c = value(b)
        if all(k % c == 0 for m, k in a if m):
            return _normal({m: (k // c) for m, k in a})
    elif a == b:
        return const(1)
    elif len(a) == 1 and len(b) == 1:
        (ma, ca), (mb, cb) = a[0], b[0]
        rest = dict(ma)
        for v, e in mb:
            rest[v] = rest.get(v, 0) - e
        if ca % cb == 0 and all(e >= 0 for e in rest.values()):
            return _normal({tuple(sorted((v, e) for v, e in rest.items() if e)): ca // cb})
    return var(("floor", a, b))


def sympy_text(p: Poly) -> int | str | None:
    """``p`` as ``str()`` of the sympy expression the engine holds, an int for a number; None
    when it is no polynomial of the input names (an atom is left)."""
    if is_const(p):
        return value(p)
    names = sorted({v for m, _ in p for v, _ in m}, key=lambda v: (v[0] != "s", v[1]))
    if any(v[0] != "s" for v in names):
        return None
    order = [v[1] for v in names]

    def key(term):
        exps = dict(term[0])
        return tuple(-exps.get(("s", n), 0) for n in order)

    terms = sorted(p, key=key)
    if len(terms) == 2 and not terms[1][0] and terms[1][1] > 0 and terms[0][1] < 0 and len(terms[0][0]) == 1:
        terms.reverse()  # sympy's one exception: a positive number and minus one factor, "1 - B"
    out = ""
    for m, c in terms:
        t = _term_text(m, c)
        if not out:
            out = t
        else:
            out += f" - {t[1:]}" if t.startswith("-") else f" + {t}"
    return out


def _term_text(m: Mono, c: int) -> str:
    factors = "*".join(v[1] if e == 1 else f"{v[1]}**{e}" for v, e in m)
    if not m:
        return str(c)
    return factors if c == 1 else f"-{factors}" if c == -1 else f"{c}*{factors}"


# ---- shapes and values ----------------------------------------------------------------------

class Walk:
    """Shapes (list of dims, or None for an unknown rank) and int values of a body's tensors."""

    def __init__(self, graph: onnx.GraphProto, opset: int, merged: dict) -> None:
        self.opset, self.merged = opset, merged  # merged: a dim -> the representative it became
        self.index = 0  # the node being walked (the engine names new dims after it)
        self.nested = False  # a subgraph's walk (a Scan body): its merges and new names are not modelled
        self.positions = {p: (k, a) for k, vi in enumerate(graph.input)
                          for a, p in enumerate(_input_shape(vi, k) or ()) if len(p) == 1}
        self.shapes: dict[str, list | None] = {}
        self.values: dict[str, list] = {}  # 1-D int values as lists of dims; a scalar as a 1-list
        self.scalars: set[str] = set()
        self.floats: dict[str, list[float]] = {}  # 1-D float constants (Resize's scales)
        self.listed: set[str] = set()  # values the engine holds as lists (computed, not constants)
        for k, vi in enumerate(graph.input):
            self.shapes[vi.name] = self.substituted(_input_shape(vi, k))
        for tensor in graph.initializer:
            self.constant(tensor.name, tensor)

    def constant(self, name: str, tensor: onnx.TensorProto) -> None:
        self.shapes[name] = [const(d) for d in tensor.dims]
        if is_external(tensor) or int(np.prod(tensor.dims)) > _MAX_VALUES:  # a weight, not shape arithmetic
            return
        if len(tensor.dims) <= 1 and tensor.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
            self.floats[name] = [float(v) for v in numpy_helper.to_array(tensor).reshape(-1)]
        if tensor.data_type in _INT_TYPES and len(tensor.dims) <= 1:
            array = numpy_helper.to_array(tensor).reshape(-1)
            self.values[name] = [const(int(v)) for v in array]
            if not tensor.dims:
                self.scalars.add(name)

    def shape(self, name: str) -> list | None:
        return self.shapes.get(name) if name else None

    def subgraph(self) -> "Walk":
        """A walk of a subgraph that sees this one's tensors (the engine passes them in)."""
        sub = copy.copy(self)
        sub.shapes, sub.values, sub.floats = dict(self.shapes), dict(self.values), dict(self.floats)
        sub.scalars, sub.listed, sub.nested = set(self.scalars), set(self.listed), True
        return sub

    def substituted(self, shape: list | None) -> list | None:
        """``shape`` with each merged dim as its representative (the engine's computed dims)."""
        return None if shape is None else [self.merged.get(d, d) if d is not None else None for d in shape]

    def unify(self, dims: Iterable[Dim]) -> Dim:
        """The one dim several must be. Unequal known dims merge into the engine's representative
        (:func:`_merge_rank`) and the walk restarts; an UNKNOWN one gives way to a number or an
        input's dim (the engine's own would merge into it), else :class:`MergeError`."""
        dims = list(dims)
        known = list(dict.fromkeys(d for d in dims if d is not None))
        gives_way = UNKNOWN not in dims or (len(known) == 1 and (is_const(known[0]) or known[0] in self.positions))
        if not known or not gives_way or (UNKNOWN in dims and len(known) > 1):
            raise MergeError
        if len(known) == 1:
            return known[0]
        if self.nested:
            raise MergeError  # the subgraph engine merges on a copy: not modelled
        rep = min(known, key=self._merge_rank(known))
        for member, into in self.merged.items():  # a group merged before now goes to rep too
            if into in known:
                self.merged[member] = rep
        losers = [d for d in known if d != rep]
        self.merged.update({d: rep for d in losers})
        if not self._merged_in_place(losers, rep):
            raise NewMergeError
        return rep

    def _merged_in_place(self, losers: list, rep: Poly) -> bool:
        """Where each merged dim is a plain variable found only as a whole dim of a shape, the walk
        so far is what a walk with the merge known from the start gives, the variable replaced by
        ``rep``: replaced in place (no restart). False where a restart is needed."""
        names = {_plain_var(d) for d in losers}
        if None in names:
            return False
        def holds(d: Dim) -> bool:
            return d is not None and any(v in names for m, _ in d for v, _ in m)

        if any(holds(d) for dims in self.values.values() for d in dims):
            return False  # the engine's values keep what they were computed from
        if any(holds(d) and d not in losers for dims in self.shapes.values() for d in dims or ()):
            return False
        for name, dims in self.shapes.items():
            if dims:
                self.shapes[name] = [rep if d in losers else d for d in dims]
        return True

    def _merge_rank(self, group: list) -> Callable:
        """onnxmlu/frontend/symbolic.py's order: a number, an input's dim by position, a dim the
        engine named anew (:func:`fresh`), then an expression, shortest text first. Texts are
        needed only where no member of the first three kinds is in the group."""
        if any(is_const(d) or d in self.positions for d in group):
            return lambda d: (1, value(d), ()) if is_const(d) else (2, 0, self.positions.get(d, (2**31,)))

        def rank(d: Poly) -> tuple:
            name = fresh_name(d)
            text = name if name is not None else sympy_text(d)
            if not isinstance(text, str):
                raise MergeError  # an atom's text (floor, Min) is sympy's alone
            return (4 if name is not None else 5, len(text), text)
        return rank

    def value(self, name: str) -> list | None:
        return self.values.get(name) if name else None

    def ints(self, name: str) -> list[int] | None:
        """A value of known numbers only."""
        v = self.value(name)
        return [value(p) for p in v] if v is not None and all(is_const(p) for p in v) else None


def _input_shape(vi: onnx.ValueInfoProto, k: int) -> list | None:
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = []
    for axis, d in enumerate(vi.type.tensor_type.shape.dim):
        if d.HasField("dim_value"):
            dims.append(const(d.dim_value))
        else:  # a name, or none: the engine's own name for it, which no input ref holds
            dims.append(var(("s", d.dim_param)) if d.dim_param else var(("in", k, axis)))
    return dims


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def broadcast(walk: Walk, *shapes: list | None) -> list | None:
    """numpy broadcasting from the right: a literal 1 gives way; others must be equal. An
    unknown rank against numbers 1 only is an unknown shape; against more, the engine's to say."""
    if any(s is None for s in shapes):
        if all(d == const(1) for s in shapes if s is not None for d in s):
            return None
        raise MergeError
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        dims = [s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0]
        kept = [d for d in dims if d != const(1)]
        out.append(walk.unify(kept) if len(kept) > 1 else kept[0] if kept else const(1))
    return out


def output_dims(body: onnx.ModelProto) -> list[list | None] | None:
    """Per output of ``body`` its dims (a polynomial, or UNKNOWN), None for an unknown rank; None
    for the whole body where the engine would merge dims (:class:`MergeError`)."""
    opset = next((o.version for o in body.opset_import if o.domain in ("", "ai.onnx")), 1)
    merged: dict = {}
    for _ in range(_MAX_MERGES):
        walk = Walk(body.graph, opset, merged)
        try:
            for walk.index, node in enumerate(body.graph.node):
                _step(walk, node)
        except MergeError:
            return None
        except NewMergeError:
            continue
        return [walk.shape(vi.name) for vi in body.graph.output]
    return None


def _step(walk: Walk, node: onnx.NodeProto) -> None:
    if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
        tensor = attr(node, "value")
        if tensor is not None:
            walk.constant(node.output[0], tensor)
        return
    rule = RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    shapes = rule(walk, node) if rule is not None else None
    walk.listed.update(o for o in node.output if o in walk.values)
    for k, name in enumerate(node.output):
        if name:
            walk.shapes[name] = walk.substituted(shapes[k]) if shapes is not None and k < len(shapes) else None


# ---- rules: each returns the output shapes (and sets values where it computes them) ---------

def _same(walk: Walk, node: onnx.NodeProto) -> list:
    return [walk.shape(node.input[0])]


def _passing(walk: Walk, node: onnx.NodeProto) -> list:
    """Shape-preserving, and the value passes (the engine's Cast, Identity)."""
    if walk.value(node.input[0]) is not None:
        walk.values[node.output[0]] = walk.value(node.input[0])
        if node.input[0] in walk.scalars:
            walk.scalars.add(node.output[0])
    return _same(walk, node)


_VALUE_OPS: dict[str, Callable] = {
    "Add": lambda a, b: add(a, b), "Sub": lambda a, b: add(a, b, -1), "Mul": mul, "Div": floordiv}


def _elementwise(walk: Walk, node: onnx.NodeProto) -> list:
    out = broadcast(walk, *(walk.shape(i) for i in node.input if i))
    func = _VALUE_OPS.get(node.op_type)
    values = [walk.value(i) for i in node.input]
    if func is not None and len(values) == 2 and all(v is not None for v in values):
        a, b = values
        n = max(len(a), len(b))
        if len(a) in (1, n) and len(b) in (1, n):
            walk.values[node.output[0]] = [func(a[k % len(a)], b[k % len(b)]) for k in range(n)]
            if all(i in walk.scalars for i in node.input):
                walk.scalars.add(node.output[0])
    return [out]


def _matmul(walk: Walk, node: onnx.NodeProto) -> list:
    a, b = walk.shape(node.input[0]), walk.shape(node.input[1])
    if a is None or b is None or not a or not b:
        raise MergeError
    walk.unify([a[-1], b[-2] if len(b) > 1 else b[0]])
    batch = broadcast(walk, a[:-2], b[:-2]) if len(a) > 1 and len(b) > 1 else []
    return [batch + a[-2:-1] + b[-1:] if len(b) > 1 else a[:-1]] if len(a) > 1 else [b[:-2] + b[-1:]]


def _gemm(walk: Walk, node: onnx.NodeProto) -> list:
    a, b = walk.shape(node.input[0]), walk.shape(node.input[1])
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return [None]
    return [[a[1] if attr(node, "transA", 0) else a[0], b[0] if attr(node, "transB", 0) else b[1]]]


def _transpose(walk: Walk, node: onnx.NodeProto) -> list:
    x = walk.shape(node.input[0])
    if x is None:
        return [None]
    perm = attr(node, "perm", list(reversed(range(len(x)))))
    return [[x[p] for p in perm]]


def _axes(walk: Walk, node: onnx.NodeProto, index: int = 1) -> list[int] | None:
    """Axes by attribute (before opset 13) or by input."""
    if walk.opset < 13:
        return attr(node, "axes")
    return walk.ints(node.input[index]) if len(node.input) > index and node.input[index] else None


def _unsqueeze(walk: Walk, node: onnx.NodeProto) -> list:
    x, axes = walk.shape(node.input[0]), _axes(walk, node)
    if x is None or axes is None:
        return [None]
    rank = len(x) + len(axes)
    axes = [a % rank for a in axes]
    rest = iter(x)
    _pass_value(walk, node)
    return [[const(1) if i in axes else next(rest) for i in range(rank)]]


def _squeeze(walk: Walk, node: onnx.NodeProto) -> list:
    x, axes = walk.shape(node.input[0]), _axes(walk, node)
    if x is None:
        return [None]
    _pass_value(walk, node)
    if axes is None:  # none given (or none known): the engine drops the literal 1s, keeps symbols
        return [[d for d in x if d != const(1)]]
    axes = [a % len(x) for a in axes]
    return [[d for i, d in enumerate(x) if i not in axes]]


def _pass_value(walk: Walk, node: onnx.NodeProto) -> None:
    if walk.value(node.input[0]) is not None:
        walk.values[node.output[0]] = walk.value(node.input[0])


def _concat(walk: Walk, node: onnx.NodeProto) -> list:
    shapes = [walk.shape(i) for i in node.input]
    if any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
        raise MergeError
    axis = attr(node, "axis") % len(shapes[0])
    values = [walk.value(i) for i in node.input]
    if all(v is not None for v in values):
        walk.values[node.output[0]] = [p for v in values for p in v]
    out = [walk.unify(s[d] for s in shapes) if d != axis else None for d in range(len(shapes[0]))]
    total = const(0)
    for s in shapes:
        total = add(total, s[axis])
    out[axis] = total
    return [out]


def _shape(walk: Walk, node: onnx.NodeProto) -> list:
    x = walk.shape(node.input[0])
    if x is None:
        return [None]
    dims = x[attr(node, "start", 0):attr(node, "end")]
    walk.values[node.output[0]] = dims
    return [[const(len(dims))]]


def _gather(walk: Walk, node: onnx.NodeProto) -> list:
    data, indices = walk.shape(node.input[0]), walk.shape(node.input[1])
    if data is None or indices is None:
        return [None]
    axis = attr(node, "axis", 0) % len(data)
    v, idx = walk.value(node.input[0]), walk.ints(node.input[1])
    listed = node.input[0] in walk.listed and len(data) == 1 and axis == 0
    if listed and v is not None and idx is not None and all(-len(v) <= i < len(v) for i in idx):
        walk.values[node.output[0]] = [v[i] for i in idx]
        if node.input[1] in walk.scalars:
            walk.scalars.add(node.output[0])
    return [data[:axis] + indices + data[axis + 1:]]


def _gather_nd(walk: Walk, node: onnx.NodeProto) -> list:
    """``indices[:-1] + data[batch_dims + r:]``, ``r`` the indices' last dim, a number (the
    spec's rule, and the engine's, which asserts the number)."""
    data, indices = walk.shape(node.input[0]), walk.shape(node.input[1])
    if data is None or not indices or not is_const(indices[-1]):
        return [None]
    start = attr(node, "batch_dims", 0) + value(indices[-1])
    return [indices[:-1] + data[start:]] if start <= len(data) else [None]


def _slice(walk: Walk, node: onnx.NodeProto) -> list:
    """Numbers for starts and steps, a number or a polynomial for each end: each axis as the
    engine counts it (:func:`_engine_sliced`)."""
    x = walk.shape(node.input[0])
    starts, ends = (walk.value(node.input[k]) if len(node.input) > k else None for k in (1, 2))
    if walk.opset < 10:
        starts, ends = [const(v) for v in attr(node, "starts", [])], [const(v) for v in attr(node, "ends", [])]
    if x is None or starts is None or ends is None or not all(map(is_const, starts)) or None in ends:
        return [None]
    axes = (attr(node, "axes") if walk.opset < 10 else _optional_ints(walk, node, 3)) or list(range(len(starts)))
    steps = (None if walk.opset < 10 else _optional_ints(walk, node, 4)) or [1] * len(starts)
    out = list(x)
    for a, s, e, t in zip(axes, starts, ends, steps):
        out[a % len(x)] = _engine_sliced(x[a % len(x)], value(s), e, t)
    v, bounds = walk.value(node.input[0]), [value(s) for s in starts] + [value(e) for e in ends if is_const(e)]
    if v is not None and node.input[0] in walk.listed and list(axes) == [0] and len(bounds) == 2:
        walk.values[node.output[0]] = v[bounds[0]:bounds[1]:steps[0]]
    return [out]


def _optional_ints(walk: Walk, node: onnx.NodeProto, k: int) -> list[int] | None:
    if len(node.input) > k and node.input[k]:
        found = walk.ints(node.input[k])
        if found is None:
            raise MergeError  # axes or steps the engine may know and this tier does not
        return found
    return None


def _engine_sliced(d: Dim, s: int, e: Poly, t: int) -> Dim:
    """The engine's count of an axis ``d`` sliced from ``s`` to ``e`` by ``t``:
    ``(e' - s' + t - 1) // t`` (``t + 1`` for ``t < 0``), where a negative bound counts from the
    end (``d + b``), an end at or past int_max is ``d``, and an end past 1 on a symbolic ``d``
    is ``Min(e, d)`` (an atom: no polynomial); on a number ``d`` both bounds are clamped to
    ``[0, d]``. An end that is a polynomial, or a negative step, on a symbolic ``d`` is left."""
    if d is None or t == 0 or (not is_const(d) and (t < 0 or not is_const(e))):
        return UNKNOWN
    if not is_const(e):  # a polynomial end on a number d: Min(e, d)
        e = var(("min", e, d))
    else:
        ev = value(e)
        e = add(d, e) if -INT_MAX < ev < 0 else e
        if is_const(e):
            e = _literal_end(value(e), value(d) if is_const(d) else None, s, d)
    start = add(d, const(s)) if -INT_MAX < s < 0 else const(s)
    if is_const(d) and is_const(start):
        start = const(max(0, min(value(start), value(d))))
    top = add(add(e, start, -1), const(t - 1 if t > 0 else t + 1))
    if t > 0:
        return floordiv(top, const(t))
    return const(value(top) // t) if is_const(top) else UNKNOWN


def _literal_end(e: int, d: int | None, s: int, dim: Poly) -> Poly:
    """The engine's end after its negative-index step, where it is a number."""
    if e >= INT_MAX:
        return dim
    if e <= -INT_MAX:
        return const(0 if s > 0 else -1)
    if d is not None:
        return const(min(max(0, e + d) if e < 0 else e, d))
    return var(("min", const(e), dim)) if e > 1 else const(e)


def _reshape(walk: Walk, node: onnx.NodeProto) -> list:
    x, shape = walk.shape(node.input[0]), walk.value(node.input[1])
    if x is None or shape is None or any(d is None for d in x + shape):
        return [None]
    if attr(node, "allowzero", 0) and const(0) in shape:
        return [None]  # the engine reads 0 as "copy the input dim" whatever allowzero says
    _pass_value(walk, node)
    out, known = [], []
    for i, d in enumerate(shape):
        out.append(x[i] if d == () else d)
        if d != const(-1):
            known.append(x[i] if d == () else d)
    if const(-1) in out:
        out[out.index(const(-1))] = _quotient(x, known)
    return [out]


def _factors(dims: Sequence[Poly]) -> tuple[int, list]:
    """A product of dims as sympy's Mul holds it: a number and the other factors (a symbol per
    power, each sum whole)."""
    number, rest = 1, []
    for d in dims:
        if len(d) == 1:
            (m, c), = d
            number *= c
            rest += [var(v) for v, e in m for _ in range(e)]
        elif not d:
            number = 0
        else:
            rest.append(d)
    return number, rest


def _quotient(total: Sequence[Poly], known: Sequence[Poly]) -> Dim:
    """``floor(prod(total) / prod(known))`` with common factors cancelled, as sympy does."""
    (n, top), (m, bottom) = _factors(total), _factors(known)
    for f in list(bottom):
        if f in top:
            top.remove(f)
            bottom.remove(f)
    if bottom or m == 0 or n % m:
        return var(("floor", tuple(total), tuple(known)))
    sums = [f for f in top if len(f) > 1]
    if len(sums) > 1 or (sums and len(top) > 1):
        if any(v[0] != "s" for f in top for m, _ in f for v, _ in m):
            return var(("product", n // m, tuple(top)))  # with a floor inside: no polynomial, factored or not
        return UNKNOWN  # sympy keeps x*(a + b) factored: another text, left to the engine
    out = const(n // m)
    for f in top:
        out = mul(out, f)
    return out


def _expand(walk: Walk, node: onnx.NodeProto) -> list:
    x, shape = walk.shape(node.input[0]), walk.value(node.input[1])
    if x is None or shape is None:
        return [None]
    return [broadcast(walk, x, shape)]


def _tile(walk: Walk, node: onnx.NodeProto) -> list:
    x, repeats = walk.shape(node.input[0]), walk.value(node.input[1])
    if x is None or repeats is None or len(repeats) != len(x):
        return [None]
    return [[mul(d, r) for d, r in zip(x, repeats)]]


def _pad(walk: Walk, node: onnx.NodeProto) -> list:
    x = walk.shape(node.input[0])
    if walk.opset < 11:
        pads = [const(p) for p in attr(node, "pads", [])]
    else:
        pads = walk.value(node.input[1]) if len(node.input) > 1 else None
    if x is None or pads is None or len(pads) != 2 * len(x) or (len(node.input) > 3 and node.input[3]):
        return [None]  # pads by axes (opset 18): the engine reads them as all axes
    return [[add(add(d, pads[i]), pads[i + len(x)]) for i, d in enumerate(x)]]


def _conv_pool(walk: Walk, node: onnx.NodeProto) -> list:
    """The engine's ``(d + pads - ((k - 1) * dilation + 1)) // stride + 1`` on each spatial axis,
    where one is symbolic; with every spatial dim known, onnx's own count."""
    x = walk.shape(node.input[0])
    weight = walk.shape(node.input[1]) if node.op_type == "Conv" else None
    if node.op_type == "Conv" and (weight is None or not all(map(is_const, weight[2:]))):
        return [None]
    kernel = [value(k) for k in weight[2:]] if weight is not None else attr(node, "kernel_shape")
    if x is None or kernel is None:
        return [None]
    rank, auto_pad = len(kernel), attr(node, "auto_pad", b"NOTSET")
    if len(x) != rank + 2 or auto_pad not in (b"NOTSET", b"VALID"):
        return [None]
    pads = attr(node, "pads", [0] * 2 * rank)
    strides, dilations = attr(node, "strides", [1] * rank), attr(node, "dilations", [1] * rank)
    out = [x[0], weight[0] if weight is not None else x[1]]
    for i in range(rank):
        span = (kernel[i] - 1) * dilations[i] + 1
        total = 0 if auto_pad == b"VALID" else pads[i] + pads[i + rank]
        top = add(x[2 + i], const(total - span))
        step = _ceildiv(top, strides[i]) if attr(node, "ceil_mode", 0) else floordiv(top, const(strides[i]))
        out.append(add(step, const(1)))
    if all(map(is_const, x[2:])):
        out[2:] = [const(_spec_count(value(d), k, s, dl, p0, p1, attr(node, "ceil_mode", 0)))
                   for d, k, s, dl, p0, p1 in zip(x[2:], kernel, strides, dilations, pads[:rank], pads[rank:])]
    return [out] * len(node.output)


def _conv_renamed(walk: Walk, node: onnx.NodeProto) -> list:
    """ConvTranspose, ConvInteger: the engine has no rule. onnx counts them where every spatial
    dim is a number (left to the engine here); on a symbolic one onnx leaves a dim unknown and
    the engine names the whole output anew."""
    x, weight = walk.shape(node.input[0]), walk.shape(node.input[1])
    if x is None or weight is None or len(x) < 3 or len(weight) < 2:
        return [None]
    if walk.nested:
        raise MergeError  # a subgraph engine's new names carry its prefix: not modelled
    if all(map(is_const, x[2:])):
        group = const(attr(node, "group", 1))
        channels = mul(weight[1], group) if node.op_type == "ConvTranspose" else weight[0]
        return [[x[0], channels] + [UNKNOWN] * (len(x) - 2)]
    return [[fresh(node.op_type, walk.index, 0, a) for a in range(len(x))]]


def _ceildiv(top: Poly, stride: int) -> Dim:
    return top if stride == 1 else UNKNOWN  # sympy's ceiling of a sum with a whole part: the engine's


def _spec_count(d: int, k: int, s: int, dilation: int, p0: int, p1: int, ceil_mode: int) -> int:
    """onnx's count: with ceil_mode, a last window that would start in the end padding is dropped."""
    span = (k - 1) * dilation + 1
    if not ceil_mode:
        return (d + p0 + p1 - span) // s + 1
    count = -(-(d + p0 + p1 - span) // s) + 1
    return count - 1 if (count - 1) * s >= d + p0 else count


def _resize(walk: Walk, node: onnx.NodeProto) -> list:
    """Whole scales >= 1 on every axis: ``s * d`` (onnxmlu/frontend/symbolic.py's rule)."""
    x = walk.shape(node.input[0])
    scales = _float_values(walk, node.input[2] if walk.opset > 10 and len(node.input) > 2 else
                           node.input[1] if walk.opset <= 10 and len(node.input) > 1 else "")
    sized = walk.opset > 10 and len(node.input) > 3 and node.input[3]
    if sized and x is not None and attr(node, "axes") is None:  # floor(size): the size itself
        sizes = walk.value(node.input[3])
        return [sizes if sizes is not None and len(sizes) == len(x) else None]
    if x is None or scales is None or sized or len(scales) != len(x) or attr(node, "axes") is not None:
        return [None]
    if attr(node, "coordinate_transformation_mode", b"") == b"tf_crop_and_resize":
        return [None]
    if not all(s >= 1 and s == int(s) for s in scales):  # the engine's floor(d * s): numbers only
        return [[const(int(np.floor(value(d) * np.float32(s)))) if is_const(d) else UNKNOWN
                 for d, s in zip(x, scales)]]
    return [[mul(const(int(s)), d) for d, s in zip(x, scales)]]


def _float_values(walk: Walk, name: str) -> list[float] | None:
    tensor = walk.floats.get(name) if name else None
    return None if tensor is None else [float(v) for v in tensor]


def _split(walk: Walk, node: onnx.NodeProto) -> list:
    x = walk.shape(node.input[0])
    if x is None:
        return [None] * len(node.output)
    axis = attr(node, "axis", 0) % len(x)
    if walk.opset < 13:
        split = attr(node, "split")
    else:
        split = walk.ints(node.input[1]) if len(node.input) > 1 and node.input[1] else None
        if split is None and len(node.input) > 1 and node.input[1]:
            return [None] * len(node.output)
    n = len(node.output)
    if split is not None:
        sizes = [const(s) for s in split]
    else:  # the engine's d / n: a polynomial where n divides it, else no size known to the engine
        whole = floordiv(x[axis], const(n)) if x[axis] is not None else None
        exact = whole is not None and mul(whole, const(n)) == x[axis]
        sizes = [whole if exact else UNKNOWN if is_const(x[axis]) else var(("split", x[axis], n))] * n
    return [x[:axis] + [size] + x[axis + 1:] for size in sizes]


def _reduce(walk: Walk, node: onnx.NodeProto) -> list:
    """Axes by attribute (onnx's rule), or by input where the engine reads them (ReduceSum from
    opset 13, ReduceMean from 18); no axes: all axes, unless noop_with_empty_axes."""
    x = walk.shape(node.input[0])
    by_input = len(node.input) > 1 and node.input[1]
    if by_input and not (node.op_type == "ReduceSum" or (node.op_type == "ReduceMean" and walk.opset >= 18)):
        return [None]
    axes = walk.ints(node.input[1]) if by_input else attr(node, "axes")
    if x is None or (by_input and axes is None) or (not axes and attr(node, "noop_with_empty_axes", 0)):
        return [None]
    axes = [a % len(x) for a in axes] if axes else list(range(len(x)))
    keep = attr(node, "keepdims", 1)
    return [[const(1) if i in axes else d for i, d in enumerate(x) if keep or i not in axes]]


def _arg_reduce(walk: Walk, node: onnx.NodeProto) -> list:
    """ArgMax, ArgMin: the axis kept as 1 or dropped (onnx's rule)."""
    x = walk.shape(node.input[0])
    if x is None:
        return [None]
    axis = attr(node, "axis", 0) % len(x)
    return [x[:axis] + ([const(1)] if attr(node, "keepdims", 1) else []) + x[axis + 1:]]


def _flatten(walk: Walk, node: onnx.NodeProto) -> list:
    """onnx's rule: each side the product of its dims; a side of several dims not all numbers
    is unknown to onnx, and the engine then names the whole output anew."""
    x = walk.shape(node.input[0])
    if x is None:
        return [None]
    axis = attr(node, "axis", 1) % (len(x) + 1)
    sides = []
    for side in (x[:axis], x[axis:]):
        if len(side) == 1:
            sides.append(side[0])
        elif all(is_const(d) for d in side):
            sides.append(const(int(np.prod([value(d) for d in side]))))
        else:
            return [None]
    return [sides]


def _global_pool(walk: Walk, node: onnx.NodeProto) -> list:
    x = walk.shape(node.input[0])
    return [None if x is None else x[:2] + [const(1)] * (len(x) - 2)]


def _constant_of_shape(walk: Walk, node: onnx.NodeProto) -> list:
    return [walk.value(node.input[0])]


def _range(walk: Walk, node: onnx.NodeProto) -> list:
    """The engine's ``Max(ceiling((limit - start) / delta), 0)``, its inputs read as ints (a float
    constant truncated, as the engine does). With numbers, that count; with symbolic bounds and a
    step of 1, ``limit - start`` where sympy sees it is not negative (no negative coefficient:
    input dims are positive; a KV cache's ``Range(total - seq, total)`` is ``seq``), else left
    to the engine."""
    start, limit, delta = (_scalar(walk, i) for i in node.input)
    if None in (start, limit, delta) or delta != const(value(delta)) or not value(delta):
        return [None]
    if is_const(limit) and is_const(start):
        return [[const(max(-(-(value(limit) - value(start)) // value(delta)), 0))]]
    count = add(limit, start, -1)
    plain = count is not None and all(c >= 0 for _, c in count) and all(v[0] == "s" for m, _ in count for v, _ in m)
    return [[count if value(delta) == 1 and plain else UNKNOWN]]


def _scalar(walk: Walk, name: str) -> Dim:
    """A one-element value: an int polynomial, or a float constant truncated to an int."""
    found = walk.value(name)
    if found is not None and len(found) == 1:
        return found[0]
    floats = walk.floats.get(name) if name else None
    return const(int(floats[0])) if floats is not None and len(floats) == 1 else None


def _scan(walk: Walk, node: onnx.NodeProto) -> list:
    """The engine's Scan: the body walked with the states' shapes and each scan input's without
    its scan axis (the outer tensors visible); the final states are the body's state outputs,
    each scan output gets the last scan input's scan-axis dim at its output axis."""
    body, count = attr(node, "body"), attr(node, "num_scan_inputs")
    states, shapes = len(node.input) - count, [walk.shape(i) for i in node.input]
    if any(s is None for s in shapes) or len(body.input) < len(node.input) or not shapes[-1]:
        return [None] * len(node.output)
    in_axes = [a % len(s) for a, s in zip(attr(node, "scan_input_axes", [0] * count), shapes[states:])]
    sub = walk.subgraph()
    for i, vi in enumerate(body.input[:len(node.input)]):
        cut = in_axes[i - states] if i >= states else None
        sub.shapes[vi.name] = shapes[i] if cut is None else shapes[i][:cut] + shapes[i][cut + 1:]
    for tensor in body.initializer:
        sub.constant(tensor.name, tensor)
    for sub.index, inner in enumerate(body.node):
        _step(sub, inner)
    length, out_axes = shapes[-1][in_axes[-1]], attr(node, "scan_output_axes", [0] * (len(node.output) - states))
    outs = []
    for i, vi in enumerate(body.output[:len(node.output)]):
        shape = sub.shape(vi.name)
        if shape is not None and i >= states:
            axis = out_axes[i - states] % (len(shape) + 1)
            shape = shape[:axis] + [length] + shape[axis:]
        outs.append(shape)
    return outs


def _dynamic_quantize(walk: Walk, node: onnx.NodeProto) -> list:
    """DynamicQuantizeLinear: y as x, one scale and one zero point (onnx's rule)."""
    return [walk.shape(node.input[0]), [], []]


def _layer_norm(walk: Walk, node: onnx.NodeProto) -> list:
    x = walk.shape(node.input[0])
    if x is None:
        return [None] * len(node.output)
    axis = attr(node, "axis", -1) % len(x)
    return [x] + [x[:axis] + [const(1)] * (len(x) - axis)] * (len(node.output) - 1)


#: Ops whose output 0 has the shape of input 0 (activations, normalizations, Softmax family):
#: onnx's inference carries their dims, the engine takes it as is.
SAME_SHAPE = frozenset({
    "Abs", "Acos", "Asin", "Atan", "BatchNormalization", "Ceil", "Celu", "Clip", "Cos", "CumSum",
    "Dropout", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish", "Hardmax",
    "InstanceNormalization", "IsInf", "IsNaN", "LRN", "LeakyRelu", "Log", "LogSoftmax",
    "LpNormalization", "Mish", "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu", "Shrink",
    "Sigmoid", "Sign", "Sin", "Softmax", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh",
    "ThresholdedRelu", "Trilu", "QuantizeLinear", "DequantizeLinear", "GroupNormalization",
    "RMSNormalization",
})
#: numpy-broadcasting element-wise ops (the arithmetic ones also compute shape values).
ELEMENTWISE = frozenset({
    "Add", "And", "BitShift", "Div", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual",
    "Max", "Mean", "Min", "Mod", "Mul", "Or", "PRelu", "Pow", "Sub", "Sum", "Where", "Xor",
})
_POOLS = ("AveragePool", "MaxPool", "Conv")  # the engine's own rules (LpPool: onnx's, no symbolic count)
_GLOBAL_POOLS = ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
#: op type -> rule; an op not here leaves its outputs UNKNOWN.
RULES: dict[str, Callable] = {
    **{op: _same for op in SAME_SHAPE}, **{op: _elementwise for op in ELEMENTWISE},
    **{op: _conv_pool for op in _POOLS}, **{op: _global_pool for op in _GLOBAL_POOLS},
    "Cast": _passing, "Identity": _passing, "MatMul": _matmul, "MatMulInteger": _matmul, "Gemm": _gemm,
    "Transpose": _transpose, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Concat": _concat,
    "Shape": _shape, "Gather": _gather, "Slice": _slice, "Reshape": _reshape, "Expand": _expand,
    "Tile": _tile, "Pad": _pad, "Resize": _resize, "Split": _split, "ReduceSum": _reduce,
    "ReduceMean": _reduce, "ReduceMax": _reduce, "ReduceMin": _reduce, "ReduceProd": _reduce,
    "ReduceL2": _reduce, "Flatten": _flatten, "ConstantOfShape": _constant_of_shape,
    "Range": _range, "LayerNormalization": _layer_norm, "GatherND": _gather_nd, "ConvTranspose": _conv_renamed,
    "ConvInteger": _conv_renamed,
    "DynamicQuantizeLinear": _dynamic_quantize, "Scan": _scan, "ArgMax": _arg_reduce, "ArgMin": _arg_reduce,
}
