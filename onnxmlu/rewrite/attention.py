"""Attention (opset 23/24) -> Reshape/Transpose, Concat, Mul, MatMul, Tanh, Trilu, Softmax ([ONNX-ops]).

ONNX Attention over Q [B, Hq, Sq, D], K [B, Hkv, Skv, D], V [B, Hkv, Skv, Dv] (3-D inputs
[B, S, H*D] are first reshaped to [B, S, H, D] and transposed to [B, H, S, D], with H from
``q_num_heads`` / ``kv_num_heads``), as its function body defines it::

    K' = Concat(past_key, K, axis 2), V' = Concat(past_value, V, axis 2)   (present_key/value)
    s  = sqrt(scale), scale = attribute or 1/sqrt(D)                      (cast to T)
    S0 = (Q * s) @ (K' * s)^T                                             [B, Hq, Sq, T]
    S1 = softcap > 0 ? softcap * tanh(S0 / softcap) : S0
    S2 = S1 + bias
    P  = Cast(Softmax(Cast(S2, softmax_precision), axis -1), T)
    P  = rowmax(bias) == -inf ? 0 : P                                     (fully masked rows)
    Y  = P @ V'                                    (3-D: transposed back and reshaped to [B, Sq, Hq*Dv])

with T = P + Skv the total length (P = past length, 0 without a cache) and the bias the sum of

* the mask: a bool mask gives ``Where(mask, 0, -inf)``, a float mask is added as it is; a
  mask whose last dim is shorter than T is padded to T with -inf (Pad, its width computed from
  Shape unless both lengths are fixed numbers);
* the causal mask (``is_causal=1``), bottom-right aligned: query i sees key j iff
  ``j <= i + P``: ``Trilu(Expand(-inf, [Sq, T]), k=P+1, upper=1)`` (-inf where j > i + P, 0
  below), a constant when Sq, T and P are fixed numbers, else computed from Shape at run time
  (a symbolic dim is never baked in);
* the external cache (opset 24, ``nonpad_kv_seqlen`` N of shape [B], K and V the whole cache):
  keys ``j >= N[b]`` get -inf ([B, 1, 1, T]), and the causal offset is ``N[b] - Sq`` per sample
  instead of P ([B, 1, Sq, T]; a negative offset masks the leading rows entirely).

Grouped heads (GQA, Hq = g * Hkv): query head h reads key/value head ``h // g``. Instead of
repeating K' and V' g times (the function body's Expand), the query heads of a group are laid
end to end: Q [B, Hq, Sq, D] -> Reshape [0, Hkv, -1, 0] = [B, Hkv, g*Sq, D], one MatMul per
key head, and the scores Reshape back to [B, Hq, Sq, T] ([0, Hq, -1, 0]) for the masks and the
softmax; P goes the same way before its MatMul with V'. One key head (MQA) broadcasts as it is.

``qk_matmul_output`` is S0 (mode 0), S1 (mode 1), S2 (mode 2) or the guarded P (mode 3). The
row guard is only emitted with a mask or an external cache: the causal mask alone always lets
key 0 through.

Left on the host, with the reason: types other than float16/float/double, mixed Q/K/V types,
an input of unknown rank or a rank other than 3 and 4, 3-D inputs without both head counts,
head counts or a head size that are not fixed numbers where they are needed (grouping, the
default scale), a mask that is not bool or Q's type or of unknown rank, only one of
past_key/past_value, ``nonpad_kv_seqlen`` together with ``past_key`` (which the operator
forbids), the opset-25 sliding window, and a ``softmax_precision`` other than
float16/float/double.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import FLOAT_DTYPES, RewriteContext, constant_value, detach, node_input, node_output
from onnxmlu.rewrite.base import static_dim
from onnxmlu.rewrite.base import tensor_dtype, tensor_shape

_PRECISIONS = {onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.FLOAT: np.float32,
               onnx.TensorProto.DOUBLE: np.float64}
_INF = float("inf")


@dataclass
class _Form:
    """What the rewrite needs to know of one Attention node."""

    rank: int
    q_heads: int | None
    kv_heads: int | None
    head_size: int | None


class AttentionRewriter:
    name = "attention"
    op_types = ("Attention",)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        reason = _input_reason(node)
        if reason is not None:
            return reason
        form = _form(node)
        if form.rank == 3 and not (form.q_heads and form.kv_heads):
            return "3-D inputs need both q_num_heads and kv_num_heads"
        if form.q_heads and form.kv_heads and form.q_heads % form.kv_heads:
            return f"q heads {form.q_heads} are not a multiple of kv heads {form.kv_heads}"
        if form.kv_heads != 1 and (form.q_heads is None or form.kv_heads is None):
            return "the head counts of Q and K must be fixed numbers (query heads are grouped by key head)"
        if "scale" not in node.attrs and form.head_size is None:
            return "the head size must be a fixed number for the default scale 1/sqrt(head_size)"
        precision = node.attrs.get("softmax_precision")
        if precision is not None and int(precision) not in _PRECISIONS:
            return f"softmax_precision {precision} is not float16/float/double"
        if int(node.attrs.get("qk_matmul_output_mode", 0)) not in (0, 1, 2, 3):
            return f"qk_matmul_output_mode {node.attrs['qk_matmul_output_mode']} is not 0-3"
        return None

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        form = _form(node)
        q, k, v = node.inputs[:3]
        mask, past_k, past_v, nonpad = (node_input(node, i) for i in (3, 4, 5, 6))
        outs = [node_output(node, i) for i in range(4)]
        bld = ctx.builder(node, tensor_dtype(q))
        lengths = _Lengths.of(node)
        detach(node, ctx.graph)
        sources = [_unflattened(t, h) if form.rank == 3 else None for t, h in
                   ((q, form.q_heads), (k, form.kv_heads), (v, form.kv_heads))]
        q4, k4, v4 = (bld.transpose(s, [0, 2, 1, 3], name=f"{n}_heads") if s is not None else _heads(bld, t, h, n)
                      for s, t, h, n in zip(sources, (q, k, v), (form.q_heads, form.kv_heads, form.kv_heads), "qkv"))
        q_seq = (q if sources[0] is None else sources[0], 1) if form.rank == 3 else (q, 2)  # Q, its sequence axis
        present_k = _present(bld, past_k, k4, outs[1], "present_key")
        present_v = _present(bld, past_v, v4, outs[2], "present_value")
        scores = _scores(bld, node, form, q4, present_k)
        bias = _bias(bld, node, (q_seq, mask, present_k, past_k, nonpad, scores), lengths)
        probs, debug = _softmax(bld, node, scores, bias, guard=mask is not None or nonpad is not None)
        y = _grouped_matmul(bld, form, probs, present_v, "pv")
        if form.rank == 3:
            y = bld.reshape(bld.transpose(y, [0, 2, 1, 3], name="y_seq"), [0, 0, -1], name="y_hidden")
        for value, out in zip((y, present_k, present_v, debug), outs):
            if out is not None and value is not out:  # last: finish may rename a tensor later nodes read
                bld.finish(value, out)


def _present(bld, past: gs.Tensor | None, new: gs.Tensor, out: gs.Variable | None, name: str) -> gs.Tensor:
    """The cache after this step, Concat(past, new) on the sequence axis, written straight into
    the node's present output when it has one (no Identity behind it)."""
    if past is None:
        return new
    if out is None:
        return bld.concat([past, new], axis=2, name=name)
    return bld.op("Concat", [past, new], attrs={"axis": 2}, name=name, out=out)


def _input_reason(node: gs.Node) -> str | None:
    q, k, v = node.inputs[:3]
    dtype = tensor_dtype(q)
    if dtype not in FLOAT_DTYPES:
        return f"Q {q.name} has element type {dtype or 'unknown'}, need float16/float/double"
    for t in (k, v, node_input(node, 4), node_input(node, 5)):
        if t is not None and tensor_dtype(t) != dtype:
            return f"{t.name} is {tensor_dtype(t) or 'of unknown type'} and Q is {dtype}: mixed types are not rewritten"
    ranks = {len(s) if s is not None else None for s in map(tensor_shape, (q, k, v))}
    if ranks not in ({3}, {4}):
        return f"Q, K and V have ranks {sorted(map(str, ranks))}: need all 3 or all 4, known"
    if (node_input(node, 4) is None) != (node_input(node, 5) is None):
        return "past_key and past_value must come together"
    if node_input(node, 6) is not None and node_input(node, 4) is not None:
        return "nonpad_kv_seqlen with past_key: the operator forbids the two cache forms together"
    if any(int(node.attrs.get(a, -1)) != -1 for a in ("left_window_size", "right_window_size")):
        return "the sliding window (left/right_window_size) is not rewritten"
    return _mask_reason(node_input(node, 3), dtype)


def _mask_reason(mask: gs.Tensor | None, dtype: np.dtype) -> str | None:
    if mask is None:
        return None
    if tensor_dtype(mask) not in (np.dtype(np.bool_), dtype):
        return f"attn_mask {mask.name} is {tensor_dtype(mask) or 'of unknown type'}: need bool or Q's {dtype}"
    if tensor_shape(mask) is None:
        return f"attn_mask {mask.name} has an unknown rank (its padding to the total length needs it)"
    return None


def _form(node: gs.Node) -> _Form:
    q_shape, k_shape = tensor_shape(node.inputs[0]), tensor_shape(node.inputs[1])
    rank = len(q_shape)
    if rank == 4:
        q_heads, kv_heads, head = static_dim(q_shape[1]), static_dim(k_shape[1]), static_dim(q_shape[3])
        return _Form(4, q_heads, kv_heads, head)
    q_heads, kv_heads = int(node.attrs.get("q_num_heads", 0)) or None, int(node.attrs.get("kv_num_heads", 0)) or None
    hidden = static_dim(q_shape[2])
    head = hidden // q_heads if hidden is not None and q_heads else None
    return _Form(3, q_heads, kv_heads, head)


def _unflattened(x: gs.Tensor, heads: int | None) -> gs.Tensor | None:
    """The [B, S, H, D] tensor a 3-D input [B, S, H*D] was flattened from (``Reshape(src,
    [0, 0, -1])`` with H = ``heads``: the RotaryEmbedding rewrite of a 3-D input ends so), or
    None. Splitting the heads again would be a second Reshape back to ``src``; the heads are
    read from it directly (two nodes fewer per input a decode step dispatches)."""
    producer = x.inputs[0] if isinstance(x, gs.Variable) and x.inputs else None
    if producer is None or producer.op != "Reshape" or int(producer.attrs.get("allowzero", 0)):
        return None
    target = constant_value(producer.inputs[1])
    src = producer.inputs[0]
    shape = tensor_shape(src)
    if target is None or target.tolist() != [0, 0, -1] or shape is None or len(shape) != 4 or heads is None:
        return None
    return src if static_dim(shape[2]) == heads else None


def _heads(bld, x: gs.Tensor, heads: int | None, name: str) -> gs.Tensor:
    """[B, H, S, D] from a 4-D input as it is, from a 3-D [B, S, H*D] by Reshape + Transpose."""
    if len(tensor_shape(x)) == 4:
        return x
    return bld.transpose(bld.reshape(x, [0, 0, heads, -1], name=f"{name}_split"), [0, 2, 1, 3], name=f"{name}_heads")


def _scores(bld, node: gs.Node, form: _Form, q4: gs.Tensor, k4: gs.Tensor) -> gs.Tensor:
    """S0 = (Q * sqrt(scale)) @ (K * sqrt(scale))^T, [B, Hq, Sq, T], in Q's type."""
    scale = float(node.attrs["scale"]) if "scale" in node.attrs else 1.0 / np.sqrt(form.head_size)
    root = bld.scalar(float(bld.dtype.type(np.sqrt(scale))))  # the function body's Cast(Sqrt(scale), T)
    kt = bld.transpose(k4, [0, 1, 3, 2], name="k_t")
    return _grouped_matmul(bld, form, bld.mul(q4, root, name="q_scaled"), bld.mul(kt, root, name="k_scaled"), "qk")


def _grouped_matmul(bld, form: _Form, a: gs.Tensor, b: gs.Tensor, name: str) -> gs.Tensor:
    """``a`` [B, Hq, Sq, X] @ ``b`` [B, Hkv, X, Y] with query head h reading key head h // g."""
    if form.kv_heads == 1 or form.q_heads == form.kv_heads:  # MQA broadcasts; MHA is one to one
        return bld.matmul(a, b, name=name)
    grouped = bld.reshape(a, [0, form.kv_heads, -1, 0], name=f"{name}_grouped")
    return bld.reshape(bld.matmul(grouped, b, name=name), [0, form.q_heads, -1, 0], name=f"{name}_heads")


def _softmax(bld, node: gs.Node, scores: gs.Tensor, bias: gs.Tensor | None, guard: bool):
    """(guarded P, the qk_matmul_output of the node's mode)."""
    mode = int(node.attrs.get("qk_matmul_output_mode", 0))
    softcap = float(node.attrs.get("softcap", 0.0))
    capped = scores
    if softcap > 0:
        cap = bld.scalar(softcap)
        capped = bld.mul(bld.unary("Tanh", bld.op("Div", [scores, cap], name="softcap_div"), name="softcap_tanh"),
                         cap, name="softcapped")
    biased = capped if bias is None else bld.add(capped, bias, name="biased")
    precision = node.attrs.get("softmax_precision")
    work = np.dtype(_PRECISIONS[int(precision)]) if precision is not None else bld.dtype
    probs = bld.unary("Softmax", biased if work == bld.dtype else bld.cast(biased, work, name="softmax_in"),
                      name="softmax", axis=-1)
    if work != bld.dtype:
        probs = bld.cast(probs, bld.dtype, name="softmax_out")
    if guard and bias is not None:
        row_max = bld.op("ReduceMax", [bias, bld.int64([-1], "last_axis")], attrs={"keepdims": 1}, name="bias_row_max")
        masked = bld.op("Equal", [row_max, bld.scalar(-_INF)], name="row_masked", dtype=np.bool_)
        probs = bld.select(masked, bld.scalar(0.0), probs, name="probs_safe")
    return probs, (scores, capped, biased, probs)[mode]


def _bias(bld, node: gs.Node, tensors: tuple, lengths: _Lengths) -> gs.Tensor | None:
    """The additive bias: the (padded) mask, the causal mask and the external cache's padding;
    None when none applies. ``tensors``: (Q, its sequence axis), the node's mask, present key,
    past key and nonpad_kv_seqlen (None where absent), and the scores."""
    q_seq, mask, present_k, past_k, nonpad, scores = tensors
    bias = _mask_bias(bld, mask, present_k, lengths) if mask is not None else None
    terms = []
    if int(node.attrs.get("is_causal", 0)):
        terms.append(_causal_bias(bld, scores, past_k, lengths) if nonpad is None
                     else _external_causal_bias(bld, q_seq, present_k, nonpad))
    if nonpad is not None:
        terms.append(_padding_bias(bld, present_k, nonpad))
    for term in terms:
        bias = term if bias is None else bld.add(bias, term, name="bias_sum")
    return bias


@dataclass
class _Lengths:
    """The sequence lengths that are fixed numbers (None: symbolic): queries, past, total."""

    q_len: int | None
    past: int | None
    total: int | None

    @classmethod
    def of(cls, node: gs.Node) -> _Lengths:
        axis = 2 if len(tensor_shape(node.inputs[0])) == 4 else 1
        q_len = static_dim(tensor_shape(node.inputs[0])[axis])
        kv_len = static_dim(tensor_shape(node.inputs[1])[axis])
        past_k = node_input(node, 4)
        past = 0 if past_k is None else static_dim(tensor_shape(past_k)[2]) if tensor_shape(past_k) else None
        return cls(q_len, past, None if past is None or kv_len is None else past + kv_len)


def _mask_bias(bld, mask: gs.Tensor, present_k: gs.Tensor, lengths: _Lengths) -> gs.Tensor:
    """A bool mask as 0/-inf, padded with -inf to the total length when it may be shorter."""
    shape = tensor_shape(mask)
    rank, length = len(shape), static_dim(shape[-1])
    original = mask
    if tensor_dtype(mask) == np.dtype(np.bool_):
        mask = bld.select(mask, bld.scalar(0.0), bld.scalar(-_INF), name="mask_bias")
    if length is not None and length == lengths.total:
        return mask
    width = bld.sub(_dim(bld, present_k, 2, "total"), _dim(bld, original, rank - 1, "mask_len"), name="pad_width")
    pads = bld.concat([bld.int64([0] * (2 * rank - 1), "pads_zero"), width], axis=0, name="pads")
    return bld.op("Pad", [mask, pads, bld.scalar(-_INF)], attrs={"mode": "constant"}, name="mask_padded")


def _causal_bias(bld, scores: gs.Tensor, past_k, lengths: _Lengths) -> gs.Tensor:
    """[Sq, T]: 0 where key j <= query i + P, else -inf (P = past length); [Sq, T] are the last
    two dims of the ``scores`` [B, Hq, Sq, T] (one Shape node where two and a Concat would do)."""
    if None not in (lengths.q_len, lengths.total, lengths.past):
        allowed = np.arange(lengths.total)[None, :] <= np.arange(lengths.q_len)[:, None] + lengths.past
        return bld.const(np.where(allowed, 0.0, -_INF), "causal")
    # -inf from diagonal P + 1 up (key j > query i + P), 0 below: one Trilu of a -inf matrix
    size = bld.op("Shape", [scores], attrs={"start": -2}, name="causal_shape", dtype=np.int64)
    if past_k is None or lengths.past is not None:
        diagonal = bld.scalar(1 + (lengths.past or 0), np.int64)
    else:
        past = bld.op("Squeeze", [_dim(bld, past_k, 2, "past_len"), bld.int64([0], "past_axis")], name="past",
                      dtype=np.int64)
        diagonal = bld.add(past, bld.scalar(1, np.int64), name="diagonal")
    filled = bld.op("Expand", [bld.scalar(-_INF), size], name="causal_fill")
    return bld.op("Trilu", [filled, diagonal], attrs={"upper": 1}, name="causal")


def _external_causal_bias(bld, q_seq: tuple, present_k: gs.Tensor, nonpad: gs.Tensor) -> gs.Tensor:
    """[B, 1, Sq, T] for the external cache: query i of batch b sees key j iff
    ``j <= i + nonpad[b] - Sq`` (bottom-right at each sample's own length)."""
    q_len = _dim(bld, *q_seq, "q_len")
    offset = bld.reshape(bld.sub(nonpad, q_len, name="offset"), [-1, 1, 1], name="offset_3d")
    rows = bld.add(bld.unsqueeze(_range(bld, q_len, "rows"), [1], name="rows_2d"), offset, name="rows_offset")
    cols = bld.unsqueeze(_range(bld, _dim(bld, present_k, 2, "total"), "cols"), [0], name="cols_2d")
    later = bld.op("Less", [rows, cols], name="causal_later", dtype=np.bool_)
    return bld.unsqueeze(bld.select(later, bld.scalar(-_INF), bld.scalar(0.0), name="causal"), [1], name="causal_4d")


def _padding_bias(bld, present_k: gs.Tensor, nonpad: gs.Tensor) -> gs.Tensor:
    """[B, 1, 1, T]: -inf at the keys past each sample's ``nonpad_kv_seqlen``."""
    cols = bld.unsqueeze(_range(bld, _dim(bld, present_k, 2, "total"), "key_cols"), [0], name="key_cols_2d")
    valid = bld.op("Less", [cols, bld.unsqueeze(nonpad, [1], name="nonpad_2d")], name="key_valid", dtype=np.bool_)
    bias = bld.select(valid, bld.scalar(0.0), bld.scalar(-_INF), name="padding")
    return bld.unsqueeze(bias, [1, 2], name="padding_4d")


def _dim(bld, x: gs.Tensor, axis: int, name: str) -> gs.Tensor:
    """``x``'s dim ``axis`` as a [1] int64 tensor: a constant when fixed, else Shape at run time."""
    shape = tensor_shape(x)
    fixed = static_dim(shape[axis]) if shape is not None else None
    if fixed is not None:
        return bld.int64([fixed], name)
    return bld.op("Shape", [x], attrs={"start": axis, "end": axis + 1}, name=name, dtype=np.int64)


def _range(bld, length: gs.Tensor, name: str) -> gs.Tensor:
    """0, 1, ..., length - 1 (``length`` a [1] int64 tensor): a constant when it is one."""
    fixed = bld.value(length)
    if fixed is not None:
        return bld.int64(np.arange(int(fixed.reshape(-1)[0])), name)
    scalar = bld.op("Squeeze", [length, bld.int64([0], f"{name}_axis")], name=f"{name}_n", dtype=np.int64)
    zero, one = bld.scalar(0, np.int64), bld.scalar(1, np.int64)
    return bld.op("Range", [zero, scalar, one], name=name, dtype=np.int64)
