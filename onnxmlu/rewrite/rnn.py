"""LSTM / GRU / RNN -> per-time-step cells: unrolled for a static sequence length, the body
of a ``Scan`` over time when the length is symbolic.

Notation as in the ONNX operator docs: ``X_t`` [batch, input], ``H`` hidden state [batch,
hidden], ``W`` / ``R`` input / recurrence weights ([num_dir, gates*hidden, input|hidden]),
``Wb`` / ``Rb`` their biases (``B`` = [Wb, Rb] per direction), ``(.)`` elementwise product,
``f, g, h`` the activation attributes (defaults LSTM Sigmoid/Tanh/Tanh, GRU Sigmoid/Tanh,
RNN Tanh; one list per direction), ``clip`` bounds every gate pre-activation to
[-clip, clip] before its activation.

LSTM (gate order i, o, f, c; peepholes ``P`` = [Pi, Po, Pf])::

    i_t = f(X_t Wi^T + H_{t-1} Ri^T + Pi (.) C_{t-1} + Wbi + Rbi)
    f_t = f(X_t Wf^T + H_{t-1} Rf^T + Pf (.) C_{t-1} + Wbf + Rbf)   (input_forget: 1 - i_t)
    c_t = g(X_t Wc^T + H_{t-1} Rc^T + Wbc + Rbc)
    C_t = f_t (.) C_{t-1} + i_t (.) c_t
    o_t = f(X_t Wo^T + H_{t-1} Ro^T + Po (.) C_t + Wbo + Rbo)
    H_t = o_t (.) h(C_t)

GRU (gate order z, r, h)::

    z_t = f(X_t Wz^T + H_{t-1} Rz^T + Wbz + Rbz)
    r_t = f(X_t Wr^T + H_{t-1} Rr^T + Wbr + Rbr)
    h_t = g(X_t Wh^T + (r_t (.) H_{t-1}) Rh^T + Rbh + Wbh)        linear_before_reset = 0
    h_t = g(X_t Wh^T + r_t (.) (H_{t-1} Rh^T + Rbh) + Wbh)        linear_before_reset != 0
    H_t = (1 - z_t) (.) h_t + z_t (.) H_{t-1}

RNN::

    H_t = f(X_t Wi^T + H_{t-1} Ri^T + Wbi + Rbi)

Lowering. The input projection of all steps is hoisted into one ``MatMul(X, W_d^T) + bias``
per direction (X stays in its own layout: [seq, batch, in] for ``layout=0``, [batch, seq, in]
for ``layout=1``); the bias holds Wb + Rb, except GRU's Rbh under linear_before_reset, which
must stay inside ``r_t (.) (...)``. Each step gathers its slice of the projection, adds
``H_{t-1} R^T`` and splits the gates. A missing ``initial_h``/``initial_c`` is a symbolic zero:
the first step simply omits the recurrence and peephole terms (no zeros tensor is built, so a
dynamic batch size works). The reverse direction visits t = T-1 .. 0 and writes Y at t.

``sequence_lens``: with per-batch lengths L_b a step t is valid for batch b iff t < L_b. A
[batch, 1] mask per step (constant when the lengths are, ``Greater(L, t)`` otherwise) selects
``new if valid else previous`` for the state and ``new if valid else 0`` for Y. Forward, the
state is frozen after the last valid step; reverse, it stays at the initial state until
t = L_b - 1, so each sequence starts at its own last valid step, as the spec requires. Masks
use ``Where`` from opset 9 and a 0/1 multiply before. Steps valid for every batch are unmasked.

Outputs: Y [seq, num_dir, batch, hidden] (layout 1: [batch, seq, num_dir, hidden]) is one
Concat of all step outputs + Reshape (+ Transpose for layout 0); Y_h / Y_c stack the final
states of the directions. Empty output names are simply not produced.

A symbolic sequence length (the fused model runs at every length the original accepts, so the
time steps cannot be unrolled) lowers each direction to one ``Scan`` (opset 9 on) around the
same cell: the hoisted projection is its scan input along the sequence axis (``layout``), read
backwards for the reverse direction (``scan_input_directions``) and Y written backwards too
(``scan_output_directions``), so Y stays in time order; the states are its loop-carried
values. A missing initial state is zeros of [batch, hidden], batch read from X's shape at run
time. With ``sequence_lens`` a step counter t rides along as one more carried value (0 up, or
T-1 down) and the mask is ``lens > t`` per batch row, with the same ``Where`` selections as the
unrolled form. The accelerator runs the Scan as the cell block repeated per step; it is priced
at the pinned length (:mod:`onnxmlu.analyze.layers`).

``activation_alpha`` / ``activation_beta`` are consumed in list order by the activations that
take them (LeakyRelu, ThresholdedRelu, Elu: alpha; Affine, ScaledTanh, HardSigmoid: both);
missing values take the ONNX operator defaults (LeakyRelu 0.01, ThresholdedRelu 1.0,
Elu 1.0, HardSigmoid 0.2/0.5, Affine 1.0/0.0). ScaledTanh has no ONNX default and is refused
without explicit values, as is a bidirectional node given only one direction's list (the spec
asks for one list per direction; onnxruntime rejects such a node too).

Where the spec is read one way among several, this follows onnxruntime (the only runtime with
all attributes): ``clip`` bounds the gate pre-activations, not the cell state before ``h``;
``input_forget`` couples the gates as ``f_t = 1 - i_t``. onnxruntime itself deviates from the
spec's "defaults of the corresponding ONNX operators" (it uses 0 for ThresholdedRelu's and
Affine's alpha/beta) and rejects ``layout=1``. ONNX's ``onnx.reference`` LSTM/GRU/RNN ignore
``sequence_lens``, ``clip``, ``input_forget`` and the ``activations`` attributes (its RNN knows
only Tanh/Affine and applies the first direction's activation to both), so it is an oracle only
for the plain forms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxmlu.rewrite.base import (
    FLOAT_DTYPES,
    RewriteContext,
    constant_value,
    detach,
    node_input,
    node_output,
    static_dim,
    tensor_dtype,
    tensor_shape,
)
from onnxmlu.rewrite.builder import Builder
from onnxmlu.wording import plural


class Refusal(Exception):  # noqa: N818 - a reason to leave the node, not an error
    """Raised while planning: the node stays, the message is the reason."""


# ------------------------------------------------------------------------------------------
# Activations


@dataclass(frozen=True)
class ActivationSpec:
    name: str
    uses_alpha: bool = False
    uses_beta: bool = False
    default_alpha: float | None = None
    default_beta: float | None = None


ACTIVATIONS = {
    spec.name.lower(): spec
    for spec in (
        ActivationSpec("Relu"),
        ActivationSpec("Tanh"),
        ActivationSpec("Sigmoid"),
        ActivationSpec("Softsign"),
        ActivationSpec("Softplus"),
        ActivationSpec("Affine", True, True, 1.0, 0.0),
        ActivationSpec("LeakyRelu", True, False, 0.01),
        ActivationSpec("ThresholdedRelu", True, False, 1.0),
        ActivationSpec("ScaledTanh", True, True),
        ActivationSpec("HardSigmoid", True, True, 0.2, 0.5),
        ActivationSpec("Elu", True, False, 1.0),
    )
}


@dataclass(frozen=True)
class Activation:
    name: str
    alpha: float | None = None
    beta: float | None = None

    def __call__(self, b: Builder, x: gs.Tensor, name: str) -> gs.Tensor:
        kind, alpha, beta = self.name, self.alpha, self.beta
        if kind in ("Relu", "Tanh", "Sigmoid", "Softsign", "Softplus"):
            return b.unary(kind, x, name=name)
        if kind in ("LeakyRelu", "Elu"):
            return b.unary(kind, x, name=name, alpha=alpha)
        if kind == "HardSigmoid":
            return b.unary(kind, x, name=name, alpha=alpha, beta=beta)
        if kind == "ThresholdedRelu":
            if b.opset >= 10:
                return b.unary(kind, x, name=name, alpha=alpha)
            keep = b.cast(b.greater(x, alpha, name=f"{name}_gt"), b.dtype, name=f"{name}_keep")
            return b.mul(x, keep, name=name)
        if kind == "Affine":
            y = x if alpha == 1.0 else b.mul(x, alpha, name=f"{name}_scale")
            return y if beta == 0.0 else b.add(y, beta, name=name)
        if kind == "ScaledTanh":
            inner = b.unary("Tanh", b.mul(x, beta, name=f"{name}_in"), name=f"{name}_tanh")
            return b.mul(inner, alpha, name=name)
        raise AssertionError(kind)


def parse_activations(node: gs.Node, defaults: tuple[str, ...], ndir: int) -> list[list[Activation]]:
    per_dir = len(defaults)
    names = list(node.attrs.get("activations") or defaults * ndir)
    if len(names) < per_dir * ndir:  # the spec asks for one list per direction
        raise Refusal(f"activations has {plural(len(names), 'entry', 'entries')}, need {per_dir * ndir} "
                      f"({per_dir} per direction)")
    alphas = iter(node.attrs.get("activation_alpha") or [])
    betas = iter(node.attrs.get("activation_beta") or [])
    acts = []
    for raw in names:
        spec = ACTIVATIONS.get(str(raw).lower())
        if spec is None:
            raise Refusal(f"unknown activation {raw!r}")
        alpha = next(alphas, spec.default_alpha) if spec.uses_alpha else None
        beta = next(betas, spec.default_beta) if spec.uses_beta else None
        if (spec.uses_alpha and alpha is None) or (spec.uses_beta and beta is None):
            raise Refusal(f"{spec.name} needs activation_alpha/beta (ONNX defines no default)")
        acts.append(Activation(spec.name, alpha, beta))
    return [acts[d * per_dir : (d + 1) * per_dir] for d in range(ndir)]


# ------------------------------------------------------------------------------------------
# Plan (what check validated, what apply uses)


@dataclass(frozen=True)
class Family:
    gates: int
    default_acts: tuple[str, ...]
    states: int  # 2 for LSTM (H, C), 1 otherwise


FAMILIES = {
    "LSTM": Family(4, ("Sigmoid", "Tanh", "Tanh"), 2),
    "GRU": Family(3, ("Sigmoid", "Tanh"), 1),
    "RNN": Family(1, ("Tanh",), 1),
}
DIRECTIONS = {"forward": ("forward",), "reverse": ("reverse",), "bidirectional": ("forward", "reverse")}


@dataclass
class Plan:
    op: str
    family: Family
    hidden: int
    directions: tuple[str, ...]
    layout: int
    seq_len: int | None  # None: symbolic, lowered to a Scan over time
    dtype: np.dtype
    acts: list[list[Activation]]
    clip: float | None
    input_forget: bool
    linear_before_reset: bool
    lens: np.ndarray | None  # constant sequence_lens

    @property
    def ndir(self) -> int:
        return len(self.directions)


def make_plan(node: gs.Node, ctx: RewriteContext) -> Plan:
    family = FAMILIES[node.op]
    if ctx.opset < 7:
        raise Refusal(f"opset {ctx.opset} < 7 is not supported")
    direction = node.attrs.get("direction", "forward")
    if direction not in DIRECTIONS:
        raise Refusal(f"unknown direction {direction!r}")
    directions = DIRECTIONS[direction]
    layout = int(node.attrs.get("layout", 0))
    if layout not in (0, 1):
        raise Refusal(f"layout={layout} is not 0 or 1")
    x = node.inputs[0]
    dtype = tensor_dtype(x)
    if dtype not in FLOAT_DTYPES:
        raise Refusal(f"input X has element type {x.dtype}, need float16/float/double")
    seq_len = _seq_len(x, layout)
    if seq_len is None and ctx.opset < 9:
        raise Refusal(f"the sequence length is symbolic and opset {ctx.opset} has no Scan (9) to loop over time")
    hidden = _hidden_size(node)
    lens = _constant_lens(node, seq_len)
    w_shape = tensor_shape(node.inputs[1])
    if w_shape is not None and static_dim(w_shape[0]) not in (None, len(directions)):
        raise Refusal(f"W has {plural(w_shape[0], 'direction')}, direction={direction} needs {len(directions)}")
    clip = node.attrs.get("clip")
    return Plan(
        op=node.op,
        family=family,
        hidden=hidden,
        directions=directions,
        layout=layout,
        seq_len=seq_len,
        dtype=dtype,
        acts=parse_activations(node, family.default_acts, len(directions)),
        clip=None if clip is None else float(clip),
        input_forget=bool(node.attrs.get("input_forget", 0)),
        linear_before_reset=bool(node.attrs.get("linear_before_reset", 0)),
        lens=lens,
    )


def _seq_len(x: gs.Tensor, layout: int) -> int | None:
    """The static sequence length of X, None when it is symbolic (a Scan loops over it)."""
    shape = tensor_shape(x)
    if shape is not None and len(shape) != 3:
        raise Refusal(f"X has rank {len(shape)}, expected 3")
    seq = static_dim(shape[layout]) if shape is not None else None
    if seq == 0:
        raise Refusal("sequence length is 0")
    return seq


def _hidden_size(node: gs.Node) -> int:
    r_shape = tensor_shape(node.inputs[2])
    from_r = static_dim(r_shape[-1]) if r_shape else None
    hidden = node.attrs.get("hidden_size", from_r)
    if hidden is None:
        raise Refusal("hidden_size is neither given nor inferable from R")
    if from_r is not None and from_r != int(hidden):
        raise Refusal(f"hidden_size={hidden} does not match R's last dimension {from_r}")
    return int(hidden)


def _constant_lens(node: gs.Node, seq_len: int | None) -> np.ndarray | None:
    lens_t = node_input(node, 4)
    if lens_t is None:
        return None
    lens = constant_value(lens_t)
    bound = seq_len if seq_len is not None else np.iinfo(np.int64).max
    if lens is not None and (np.any(lens < 0) or np.any(lens > bound)):
        raise Refusal(f"sequence_lens {lens.tolist()} outside [0, {seq_len if seq_len is not None else 'T'}]")
    return lens


# ------------------------------------------------------------------------------------------
# Per-direction weights


@dataclass
class Weights:
    w_t: gs.Tensor  # [in, gates*hidden]
    r_t: gs.Tensor  # [hidden, gates*hidden]
    bias: gs.Tensor | None  # hoisted into the input projection, [gates*hidden]
    rec_bias: gs.Tensor | None = None  # GRU Rbh under linear_before_reset
    peep: list[gs.Tensor] | None = None  # LSTM [Pi, Po, Pf]
    r_parts: list[gs.Tensor] | None = None  # GRU (linear_before_reset=0): [Rzr^T, Rh^T]


def prepare_weights(b: Builder, plan: Plan, node: gs.Node, d: int) -> Weights:
    hid, gates = plan.hidden, plan.family.gates
    w_t = b.transpose(b.gather(node.inputs[1], d, name="W"), [1, 0], name="W_T")
    r_t = b.transpose(b.gather(node.inputs[2], d, name="R"), [1, 0], name="R_T")
    weights = Weights(w_t, r_t, None)
    bias_in = node_input(node, 3)
    if bias_in is not None:
        wb, rb = b.split(b.gather(bias_in, d, name="B"), [gates * hid] * 2, 0, name="B_split")
        if plan.op == "GRU" and plan.linear_before_reset:
            wb_zr, wb_h = b.split(wb, [2 * hid, hid], 0, name="Wb_split")
            rb_zr, weights.rec_bias = b.split(rb, [2 * hid, hid], 0, name="Rb_split")
            weights.bias = b.concat([b.add(wb_zr, rb_zr, name="bias_zr"), wb_h], 0, name="bias")
        else:
            weights.bias = b.add(wb, rb, name="bias")
    peep_in = node_input(node, 7) if plan.op == "LSTM" else None
    if peep_in is not None:
        weights.peep = b.split(b.gather(peep_in, d, name="P"), [hid] * 3, 0, name="P_split")
    if plan.op == "GRU" and not plan.linear_before_reset:
        weights.r_parts = b.split(r_t, [2 * hid, hid], 1, name="R_split")
    return weights


# ------------------------------------------------------------------------------------------
# Cells: (builder, x projection of the step incl. bias, previous state) -> new state


def _gate(b: Builder, pre: gs.Tensor, act: Activation, clip: float | None, name: str) -> gs.Tensor:
    if clip is not None:
        pre = b.clip(pre, clip, name=f"{name}_clip")
    return act(b, pre, name)


def lstm_cell(b: Builder, xw: gs.Tensor, state: tuple, w: Weights, acts, plan: Plan) -> tuple:
    h, c = state
    f_act, g_act, h_act = acts
    hid = plan.hidden
    pre = xw if h is None else b.add(xw, b.matmul(h, w.r_t, name="HR"), name="gates")
    i, o, f, cand = b.split(pre, [hid] * 4, 1, name="gate_split")
    peep = w.peep if c is not None else None  # C_{t-1} = 0 cancels the peepholes
    if peep is not None:
        i = b.add(i, b.mul(peep[0], c, name="Pi_C"), name="i_pre")
    i = _gate(b, i, f_act, plan.clip, "i")
    if plan.input_forget:
        f = b.sub(1.0, i, name="f")
    else:
        if peep is not None:
            f = b.add(f, b.mul(peep[2], c, name="Pf_C"), name="f_pre")
        f = _gate(b, f, f_act, plan.clip, "f")
    cand = _gate(b, cand, g_act, plan.clip, "c")
    c_new = b.mul(i, cand, name="i_c")
    if c is not None:
        c_new = b.add(b.mul(f, c, name="f_C"), c_new, name="C")
    if w.peep is not None:
        o = b.add(o, b.mul(w.peep[1], c_new, name="Po_C"), name="o_pre")
    o = _gate(b, o, f_act, plan.clip, "o")
    h_new = b.mul(o, h_act(b, c_new, "h_C"), name="H")
    return h_new, c_new


def gru_cell(b: Builder, xw: gs.Tensor, state: tuple, w: Weights, acts, plan: Plan) -> tuple:
    (h,) = state
    f_act, g_act = acts
    hid = plan.hidden
    x_zr, x_h = b.split(xw, [2 * hid, hid], 1, name="x_split")
    h_lin = None  # H_{t-1} Rh^T under linear_before_reset
    if h is None:
        zr = x_zr
    elif plan.linear_before_reset:
        h_zr, h_lin = b.split(b.matmul(h, w.r_t, name="HR"), [2 * hid, hid], 1, name="HR_split")
        zr = b.add(x_zr, h_zr, name="zr_pre")
    else:
        zr = b.add(x_zr, b.matmul(h, w.r_parts[0], name="HR_zr"), name="zr_pre")
    z_pre, r_pre = b.split(zr, [hid, hid], 1, name="zr_split")
    z = _gate(b, z_pre, f_act, plan.clip, "z")
    if plan.linear_before_reset:
        inner = _sum(b, h_lin, w.rec_bias, "h_lin")
        h_pre = x_h
        if inner is not None:
            r = _gate(b, r_pre, f_act, plan.clip, "r")
            h_pre = b.add(x_h, b.mul(r, inner, name="r_lin"), name="h_pre")
    elif h is None:
        h_pre = x_h
    else:
        r = _gate(b, r_pre, f_act, plan.clip, "r")
        rh = b.matmul(b.mul(r, h, name="r_H"), w.r_parts[1], name="rH_R")
        h_pre = b.add(x_h, rh, name="h_pre")
    cand = _gate(b, h_pre, g_act, plan.clip, "h")
    h_new = b.mul(b.sub(1.0, z, name="one_minus_z"), cand, name="zh")
    if h is not None:
        h_new = b.add(h_new, b.mul(z, h, name="z_H"), name="H")
    return (h_new,)


def rnn_cell(b: Builder, xw: gs.Tensor, state: tuple, w: Weights, acts, plan: Plan) -> tuple:
    (h,) = state
    pre = xw if h is None else b.add(xw, b.matmul(h, w.r_t, name="HR"), name="pre")
    return (_gate(b, pre, acts[0], plan.clip, "H"),)


CELLS: dict[str, Callable[..., tuple]] = {"LSTM": lstm_cell, "GRU": gru_cell, "RNN": rnn_cell}


def _sum(b: Builder, a: gs.Tensor | None, c: gs.Tensor | None, name: str) -> gs.Tensor | None:
    if a is None or c is None:
        return a if c is None else c
    return b.add(a, c, name=name)


# ------------------------------------------------------------------------------------------
# Unrolling


def step_masks(b: Builder, plan: Plan, lens_t: gs.Tensor | None) -> list[gs.Tensor | None]:
    """Per step a [batch, 1] validity mask (None where every sequence is still running)."""
    steps = range(plan.seq_len)
    if lens_t is None:
        return [None for _ in steps]
    mask_dtype = np.bool_ if b.opset >= 9 else plan.dtype
    if plan.lens is not None:
        masks = []
        for t in steps:
            valid = (plan.lens > t).reshape(-1, 1)
            masks.append(None if valid.all() else b.const(valid, f"mask_t{t}", dtype=mask_dtype))
        return masks
    lens_col = b.reshape(b.cast(lens_t, plan.dtype, name="lens"), [-1, 1], name="lens_col")
    masks = []
    for t in steps:
        valid = b.greater(lens_col, float(t), name=f"mask_t{t}")
        masks.append(valid if b.opset >= 9 else b.cast(valid, plan.dtype, name=f"mask_t{t}_f"))
    return masks


def _initial(b: Builder, tensor: gs.Tensor | None, d: int, layout: int, name: str):
    return None if tensor is None else b.gather(tensor, d, axis=layout, name=name)


def run_direction(b: Builder, plan: Plan, node: gs.Node, d: int, masks,
                  prepare: Callable[..., Weights] = prepare_weights) -> tuple[list, tuple]:
    """Unroll one direction; returns (Y_t per time index, final state)."""
    seq_axis = 0 if plan.layout == 0 else 1
    w = prepare(b, plan, node, d)
    xw = b.matmul(node.inputs[0], w.w_t, name="XW")
    if w.bias is not None:
        xw = b.add(xw, w.bias, name="XW_bias")
    state = (_initial(b, node_input(node, 5), d, plan.layout, "H0"),)
    if plan.op == "LSTM":
        state += (_initial(b, node_input(node, 6), d, plan.layout, "C0"),)
    cell = CELLS[plan.op]
    steps = range(plan.seq_len)
    order = steps if plan.directions[d] == "forward" else reversed(steps)
    ys: list[Any] = [None] * plan.seq_len
    for t in order:
        bt = b.child(f"t{t}")
        new = cell(bt, bt.gather(xw, t, axis=seq_axis, name="XW_t"), state, w, plan.acts[d], plan)
        mask = masks[t]
        if mask is None:
            ys[t], state = new[0], new
        else:
            ys[t] = bt.select(mask, new[0], None, name="Y")
            state = tuple(bt.select(mask, n, s, name=f"keep{i}") for i, (n, s) in enumerate(zip(new, state)))
    return ys, state


def _stack_directions(b: Builder, parts: list[gs.Tensor], layout: int, name: str) -> gs.Tensor:
    """[batch, hidden] per direction -> [num_dir, batch, hidden] (layout 1: [batch, num_dir, hidden])."""
    axis = 0 if layout == 0 else 1
    expanded = [b.unsqueeze(p, [axis], name=f"{name}_d{i}") for i, p in enumerate(parts)]
    return b.concat(expanded, axis, name=name)


def lower(node: gs.Node, ctx: RewriteContext, plan: Plan, b: Builder | None = None,
          prepare: Callable[..., Weights] = prepare_weights) -> None:
    """Each direction unrolled (a static length) or as one Scan over time (a symbolic one);
    then Y, Y_h and Y_c from the directions' results. ``b`` and ``prepare``: the builder and
    the weights of a variant of the cell (:mod:`onnxmlu.rewrite.dqlstm`'s quantized products)."""
    b = b if b is not None else ctx.builder(node, plan.dtype)
    unrolled = plan.seq_len is not None
    lens = node_input(node, 4)
    masks = step_masks(b, plan, lens) if unrolled else lens
    results = []
    for d, direction in enumerate(plan.directions):
        bd = b.child("fw" if direction == "forward" else "bw") if plan.ndir == 2 else b
        results.append((run_direction if unrolled else _scan_direction)(bd, plan, node, d, masks, prepare))
    y_out, yh_out = node_output(node, 0), node_output(node, 1)
    yc_out = node_output(node, 2) if plan.op == "LSTM" else None
    detach(node, ctx.graph)
    if y_out is not None:
        b.finish((_unrolled_y if unrolled else _scanned_y)(b, plan, results), y_out)
    for index, out in ((0, yh_out), (1, yc_out)):
        if out is not None:
            finals = [state[index] for _, state in results]
            b.finish(_stack_directions(b, finals, plan.layout, "Y_h" if index == 0 else "Y_c"), out)


def _unrolled_y(b: Builder, plan: Plan, results: list) -> gs.Tensor:
    """Y from the step outputs of each direction: one Concat, a Reshape (+ a Transpose)."""
    steps = [results[d][0][t] for t in range(plan.seq_len) for d in range(plan.ndir)]
    flat = b.concat(steps, 1, name="Y_concat")  # [batch, seq * num_dir * hidden]
    y = b.reshape(flat, [0, plan.seq_len, plan.ndir, plan.hidden], name="Y_reshape")
    return b.transpose(y, [1, 2, 0, 3], name="Y_transpose") if plan.layout == 0 else y


# ------------------------------------------------------------------------------------------
# A Scan over time (symbolic sequence length)


def _scanned_y(b: Builder, plan: Plan, results: list) -> gs.Tensor:
    """Y from each direction's scanned output ([T, B, H] for layout 0, [B, T, H] for 1)."""
    axis = 1 if plan.layout == 0 else 2
    parts = [b.unsqueeze(ys, [axis], name=f"Y_d{d}") for d, (ys, _) in enumerate(results)]
    return b.concat(parts, axis, name="Y")


def _scan_direction(b: Builder, plan: Plan, node: gs.Node, d: int, lens: gs.Tensor | None,
                    prepare: Callable[..., Weights] = prepare_weights) -> tuple:
    """One direction as a Scan: (Y_d in time order, final states)."""
    seq_axis, batch_axis = (0, 1) if plan.layout == 0 else (1, 0)
    reverse = plan.directions[d] == "reverse"
    w = prepare(b.without_store(), plan, node, d)  # the body's weights live in the body
    xw = b.matmul(node.inputs[0], w.w_t, name="XW")
    if w.bias is not None:
        xw = b.add(xw, w.bias, name="XW_bias")
    x = node.inputs[0]
    states = []
    for index, name in ((5, "H0"), (6, "C0"))[: 2 if plan.op == "LSTM" else 1]:
        given = _initial(b, node_input(node, index), d, plan.layout, name)
        states.append(given if given is not None else _zeros_state(b, x, batch_axis, plan, name))
    lens_col = None
    if lens is not None:
        lens_col = b.reshape(b.cast(lens, np.int64, name="lens64"), [-1, 1], name="lens_col")
        states.append(_first_step(b, x, seq_axis, reverse))
    body, y_axis = _cell_body(b, plan, w, d, lens_col), seq_axis
    attrs = {"body": body, "num_scan_inputs": 1, "scan_input_axes": [seq_axis],
             "scan_input_directions": [int(reverse)], "scan_output_axes": [y_axis],
             "scan_output_directions": [int(reverse)]}
    outs = b.op("Scan", [*states, xw], attrs=attrs, name="scan", outputs=len(states) + 1)
    for out, state in zip(outs, states):
        out.dtype = tensor_dtype(state)  # the step counter is int64
    finals = tuple(outs[: 2 if plan.op == "LSTM" else 1])
    return outs[-1], finals


def _zeros_state(b: Builder, x: gs.Tensor, batch_axis: int, plan: Plan, name: str) -> gs.Tensor:
    """Zeros of [batch, hidden], the batch read from X at run time (any batch size works)."""
    batch = _dim_of(b, x, [batch_axis], f"{name}_batch")
    dims = b.op("Concat", [batch, b.int64([plan.hidden])], attrs={"axis": 0}, name=f"{name}_dims", dtype=np.int64)
    zero = onnx.numpy_helper.from_array(np.zeros(1, plan.dtype))
    return b.op("ConstantOfShape", [dims], attrs={"value": zero}, name=name, dtype=plan.dtype)


def _dim_of(b: Builder, x: gs.Tensor, axis, name: str) -> gs.Tensor:
    """X's size along ``axis`` at run time: [size] for a list ``axis``, a scalar for an int."""
    shape = b.op("Shape", [x], name=f"{name}_shape", dtype=np.int64)
    index = b.int64(axis, f"{name}_axis") if isinstance(axis, list) else b.scalar(axis, np.int64)
    return b.op("Gather", [shape, index], attrs={"axis": 0}, name=name, dtype=np.int64)


def _first_step(b: Builder, x: gs.Tensor, seq_axis: int, reverse: bool) -> gs.Tensor:
    """The step counter's first value: 0, or T-1 for the reverse direction."""
    if not reverse:
        return b.scalar(0, np.int64)
    length = _dim_of(b, x, seq_axis, "T")
    return b.op("Sub", [length, b.scalar(1, np.int64)], name="t0", dtype=np.int64)


def _cell_body(outer: Builder, plan: Plan, w: Weights, d: int, lens_col: gs.Tensor | None) -> gs.Graph:
    """The Scan body: carried states (and step counter), one projected step in; new states
    (and counter), the step's Y out."""
    gates, hid = plan.family.gates, plan.hidden
    graph = gs.Graph(opset=outer.opset)
    b = outer.in_graph(graph, "step")
    prev = [gs.Variable(outer.names.tensor(f"{b.prefix}/{n}"), dtype=plan.dtype, shape=[None, hid])
            for n in ("H_prev", "C_prev")[: 2 if plan.op == "LSTM" else 1]]
    t = gs.Variable(outer.names.tensor(f"{b.prefix}/t"), dtype=np.int64, shape=[]) if lens_col is not None else None
    xw_t = gs.Variable(outer.names.tensor(f"{b.prefix}/XW_t"), dtype=plan.dtype, shape=[None, gates * hid])
    new = CELLS[plan.op](b, xw_t, tuple(prev), w, plan.acts[d], plan)
    y, carried = new[0], list(new)
    if t is not None:
        valid = b.op("Greater", [lens_col, t], name="valid", dtype=np.bool_)  # [batch, 1]
        if b.opset < 9:
            valid = b.cast(valid, plan.dtype, name="valid_f")
        y = b.select(valid, new[0], None, name="Y")
        carried = [b.select(valid, n, p, name=f"keep{i}") for i, (n, p) in enumerate(zip(new, prev))]
        step = 1 if plan.directions[d] == "forward" else -1
        carried.append(b.op("Add", [t, b.scalar(step, np.int64)], name="t_next", dtype=np.int64))
    carried = [b.op("Identity", [c], name=f"carry{i}") for i, c in enumerate(carried)]  # distinct body outputs
    graph.inputs = [*prev, *([t] if t is not None else []), xw_t]
    graph.outputs = [*carried, b.op("Identity", [y], name="Y_t")]
    for out in graph.outputs:
        out.dtype = out.dtype or plan.dtype
    return graph


class RecurrentRewriter:
    """LSTM/GRU/RNN: ``plan`` reads the node (or refuses it), ``lower`` rewrites it; a variant
    (:mod:`onnxmlu.rewrite.dqlstm`) replaces the two."""

    name = "rnn"
    op_types = ("LSTM", "GRU", "RNN")
    plan = staticmethod(make_plan)
    lower = staticmethod(lower)

    def __init__(self, **_: object) -> None:
        pass

    def check(self, node: gs.Node, ctx: RewriteContext) -> str | None:
        try:
            self.plan(node, ctx)
        except Refusal as why:
            return str(why)
        return None

    def apply(self, node: gs.Node, ctx: RewriteContext) -> None:
        self.lower(node, ctx, self.plan(node, ctx))
