"""LSTM / GRU / RNN unrolling against onnxruntime's kernels and ONNX's reference evaluator.

Property tests draw the op, every attribute (direction, layout, clip, input_forget,
linear_before_reset, activations with explicit alpha/beta), the optional inputs (B, constant or
dynamic sequence_lens, initial_h/c, P), constant or dynamic weights, which outputs exist and the
opset. The oracle is onnxruntime on the original node; ORT rejects layout=1, so for layout 1 it
runs the layout-0 twin on transposed tensors. Where ONNX's ReferenceEvaluator implements the
features drawn (it ignores sequence_lens, clip, input_forget and non-default activations), it
is checked as a second oracle. Tolerance rtol = atol = 1e-4 (float32, <= 5 steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from rw_util import assert_close, full_check, op_types, run_ort

from onnxmlu.errors import OnnxMluError
from onnxmlu.rewrite import rewrite_model

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
ACT_PARAMS = {  # name -> (alpha range or None, beta range or None)
    "Relu": (None, None),
    "Tanh": (None, None),
    "Sigmoid": (None, None),
    "Softsign": (None, None),
    "Softplus": (None, None),
    "Affine": ((-1.5, 1.5), (-0.5, 0.5)),
    "LeakyRelu": ((0.0, 0.5), None),
    "ThresholdedRelu": ((0.0, 0.8), None),
    "ScaledTanh": ((0.5, 2.0), (0.5, 2.0)),
    "HardSigmoid": ((0.1, 0.5), (0.3, 0.7)),
    "Elu": ((0.5, 2.0), None),
}
N_OUTPUTS = {"LSTM": 3, "GRU": 2, "RNN": 2}


@dataclass
class Cfg:
    op: str
    direction: str = "forward"
    layout: int = 0
    seq: int = 2
    batch: int = 2
    inp: int = 3
    hidden: int = 3
    bias: bool = False
    h0: bool = False
    c0: bool = False
    peep: bool = False
    lens: str = "none"  # none | const | dynamic
    clip: float | None = None
    input_forget: int = 0
    lbr: int = 0
    acts: list[str] | None = None
    alphas: list[float] = field(default_factory=list)
    betas: list[float] = field(default_factory=list)
    outputs: tuple[bool, ...] = (True, True, True)
    const_weights: bool = False
    opset: int = 14
    seed: int = 0

    @property
    def ndir(self) -> int:
        return 2 if self.direction == "bidirectional" else 1


def _arrays(cfg: Cfg) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(cfg.seed)
    g, h, d = GATES[cfg.op], cfg.hidden, cfg.ndir

    def u(*shape, scale=1.0):
        return (rng.uniform(-1, 1, size=shape) * scale).astype(np.float32)

    x_shape = (cfg.seq, cfg.batch, cfg.inp) if cfg.layout == 0 else (cfg.batch, cfg.seq, cfg.inp)
    state_shape = (d, cfg.batch, h) if cfg.layout == 0 else (cfg.batch, d, h)
    arrays = {"X": u(*x_shape), "W": u(d, g * h, cfg.inp, scale=0.8), "R": u(d, g * h, h, scale=0.8)}
    if cfg.bias:
        arrays["B"] = u(d, 2 * g * h, scale=0.5)
    if cfg.lens != "none":
        arrays["sequence_lens"] = rng.integers(1, cfg.seq + 1, size=cfg.batch).astype(np.int32)
    if cfg.h0:
        arrays["initial_h"] = u(*state_shape)
    if cfg.op == "LSTM" and cfg.c0:
        arrays["initial_c"] = u(*state_shape)
    if cfg.op == "LSTM" and cfg.peep:
        arrays["P"] = u(d, 3 * h, scale=0.5)
    return arrays


def _input_order(op: str) -> list[str]:
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h"]
    return names + ["initial_c", "P"] if op == "LSTM" else names


def _node_attrs(cfg: Cfg, layout: int | None) -> dict:
    attrs: dict = {"hidden_size": cfg.hidden, "direction": cfg.direction}
    if layout is not None and cfg.opset >= 14:
        attrs["layout"] = layout
    if cfg.clip is not None:
        attrs["clip"] = cfg.clip
    if cfg.op == "LSTM" and cfg.input_forget:
        attrs["input_forget"] = 1
    if cfg.op == "GRU" and cfg.lbr:
        attrs["linear_before_reset"] = 1
    if cfg.acts is not None:
        attrs["activations"] = cfg.acts
        if cfg.alphas:
            attrs["activation_alpha"] = cfg.alphas
        if cfg.betas:
            attrs["activation_beta"] = cfg.betas
    return attrs


def _output_names(cfg: Cfg) -> list[str]:
    names = [n if keep else "" for n, keep in zip(["Y", "Y_h", "Y_c"], cfg.outputs)]
    names = names[: N_OUTPUTS[cfg.op]]
    while names and not names[-1]:
        names.pop()
    return names


def build(cfg: Cfg, arrays: dict[str, np.ndarray], layout: int) -> onnx.ModelProto:
    """The recurrent node in ``layout`` with ``arrays``; weights as initializers if asked."""
    constant = {"W", "R", "B", "P"} if cfg.const_weights else set()
    if cfg.lens == "const":
        constant.add("sequence_lens")
    order = _input_order(cfg.op)
    inputs = [n if n in arrays else "" for n in order]
    while not inputs[-1]:
        inputs.pop()
    outputs = _output_names(cfg)
    node = helper.make_node(cfg.op, inputs, outputs, name="rnn0", **_node_attrs(cfg, layout))
    g_inputs, inits = [], []
    for name in inputs:
        if not name:
            continue
        arr = arrays[name]
        if name in constant:
            inits.append(onnx.numpy_helper.from_array(arr, name))
        else:
            elem = TensorProto.INT32 if arr.dtype == np.int32 else TensorProto.FLOAT
            g_inputs.append(helper.make_tensor_value_info(name, elem, arr.shape))
    g_outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs if n]
    graph = helper.make_graph([node], "g", g_inputs, g_outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", cfg.opset)], ir_version=10)


def _to_layout0(cfg: Cfg, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if cfg.layout == 0:
        return arrays
    swapped = dict(arrays)
    for name in ("X", "initial_h", "initial_c"):
        if name in swapped:
            swapped[name] = np.ascontiguousarray(np.swapaxes(swapped[name], 0, 1))
    return swapped


def expected_outputs(cfg: Cfg, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's kernel on the layout-0 twin, transposed back for layout 1."""
    twin_arrays = _to_layout0(cfg, arrays)
    twin = build(cfg, twin_arrays, layout=0)
    outs = run_ort(twin, twin_arrays)
    if cfg.layout == 1:
        names = [n for n in _output_names(cfg) if n]
        outs = [o.transpose(2, 0, 1, 3) if n == "Y" else o.transpose(1, 0, 2) for n, o in zip(names, outs)]
    return outs


def reference_supports(cfg: Cfg) -> bool:
    return cfg.lens == "none" and cfg.acts is None and cfg.clip is None and not cfg.input_forget


def check_case(cfg: Cfg, run: bool = True) -> None:
    arrays = _arrays(cfg)
    model = build(cfg, arrays, cfg.layout)
    rewritten, report = rewrite_model(model, only=["rnn"])
    assert report.applied == {"rnn": 1}, report.skipped
    assert not {"LSTM", "GRU", "RNN"} & set(op_types(rewritten))
    full_check(rewritten)
    assert rewritten.opset_import[0].version == cfg.opset
    if not run:
        return
    got = run_ort(rewritten, arrays)
    assert_close(got, expected_outputs(cfg, arrays), what=f"{cfg} vs onnxruntime")
    if reference_supports(cfg):
        feeds = {i.name: arrays[i.name] for i in model.graph.input}
        assert_close(got, ReferenceEvaluator(model).run(None, feeds), what=f"{cfg} vs reference")


# ---------------------------------------------------------------------------------------------
# Strategies


@st.composite
def activation_lists(draw, op: str, ndir: int):
    names = [draw(st.sampled_from(sorted(ACT_PARAMS))) for _ in range(len(DEFAULT_ACTS[op]) * ndir)]
    alphas, betas = [], []
    for name in names:
        a_range, b_range = ACT_PARAMS[name]
        if a_range:
            alphas.append(round(draw(st.floats(*a_range)), 3))
        if b_range:
            betas.append(round(draw(st.floats(*b_range)), 3))
    return names, alphas, betas


@st.composite
def configs(draw, op: str | None = None):
    op = op or draw(st.sampled_from(["LSTM", "GRU", "RNN"]))
    opset = draw(st.sampled_from([7, 9, 13, 14, 22, 26]))
    cfg = Cfg(
        op=op,
        direction=draw(st.sampled_from(["forward", "reverse", "bidirectional"])),
        layout=draw(st.sampled_from([0, 1])) if opset >= 14 else 0,
        seq=draw(st.integers(1, 5)),
        batch=draw(st.integers(1, 3)),
        inp=draw(st.integers(1, 4)),
        hidden=draw(st.integers(1, 4)),
        bias=draw(st.booleans()),
        h0=draw(st.booleans()),
        c0=draw(st.booleans()),
        peep=draw(st.booleans()),
        lens=draw(st.sampled_from(["none", "const", "dynamic"])),
        clip=draw(st.none() | st.floats(0.3, 3.0).map(lambda v: round(v, 2))),
        input_forget=draw(st.sampled_from([0, 1])),
        lbr=draw(st.sampled_from([0, 1])),
        outputs=tuple(draw(st.booleans()) for _ in range(3)),
        const_weights=draw(st.booleans()),
        opset=opset,
        seed=draw(st.integers(0, 2**16)),
    )
    if not any(cfg.outputs[: N_OUTPUTS[op]]):
        cfg.outputs = (False, True, False)
    if draw(st.booleans()):
        cfg.acts, cfg.alphas, cfg.betas = draw(activation_lists(op, cfg.ndir))
    return cfg


PROPERTY = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@PROPERTY
@given(data=st.data())
def test_unrolled_matches_onnxruntime(op, data):
    check_case(data.draw(configs(op)))


# ---------------------------------------------------------------------------------------------
# Targeted cases


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("layout", [0, 1])
def test_plain_matches_reference_evaluator(op, layout):
    check_case(Cfg(op, direction="bidirectional", layout=layout, seq=4, bias=True, h0=True, c0=True, peep=True))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lens", ["const", "dynamic"])
def test_sequence_lens(op, direction, lens):
    check_case(Cfg(op, direction=direction, lens=lens, seq=5, batch=3, bias=True, h0=True, c0=True, seed=7))


ORT_MAX_OPSET = 26  # onnxruntime 1.31 runs models up to opset 26; onnx 1.23 knows more


@pytest.mark.parametrize("opset", range(7, onnx.defs.onnx_opset_version() + 1))
def test_every_opset(opset):
    """Opset-dependent emission (Split/Unsqueeze inputs vs attributes, Clip, Where,
    ThresholdedRelu) for every opset the installed onnx knows; run where ORT can."""
    run = opset <= ORT_MAX_OPSET
    for op, lens in (("LSTM", "dynamic"), ("GRU", "const"), ("RNN", "dynamic")):
        acts = {"LSTM": ["Sigmoid", "ThresholdedRelu", "Tanh"] * 2, "GRU": ["HardSigmoid", "Tanh"] * 2,
                "RNN": ["ThresholdedRelu", "Tanh"]}[op]  # fmt: skip
        cfg = Cfg(op, direction="bidirectional", seq=3, batch=2, bias=True, h0=True, c0=True,
                  peep=True, lens=lens, clip=1.5, lbr=1, acts=acts, alphas=[0.2] * 6, betas=[0.6] * 6,
                  layout=int(opset >= 14), opset=opset)  # fmt: skip
        check_case(cfg, run=run)


def test_sequence_lens_layout1_and_opset7_masks():
    check_case(Cfg("LSTM", direction="bidirectional", layout=1, lens="dynamic", seq=4, batch=3, h0=True))
    check_case(Cfg("GRU", direction="reverse", lens="dynamic", seq=4, batch=3, opset=7, h0=True))
    check_case(Cfg("RNN", direction="reverse", lens="const", seq=4, batch=3, opset=7))


def test_one_activation_list_for_two_directions_is_refused():
    """The spec wants 3 (LSTM) activations per direction; ORT rejects a short list as well."""
    cfg = Cfg("LSTM", direction="bidirectional", acts=["HardSigmoid", "Softsign", "Elu"],
              alphas=[0.3, 0.7], betas=[0.4])  # fmt: skip
    rewritten, report = rewrite_model(build(cfg, _arrays(cfg), 0), only=["rnn"])
    assert report.total == 0 and "need 6" in report.skipped[0].message
    assert op_types(rewritten) == ["LSTM"]


def _spec_activation(name, x, alpha=None, beta=None):
    return {
        "Affine": lambda: alpha * x + beta,
        "ThresholdedRelu": lambda: np.where(x > alpha, x, 0.0),
        "LeakyRelu": lambda: np.where(x >= 0, x, alpha * x),
        "HardSigmoid": lambda: np.clip(alpha * x + beta, 0, 1),
        "Elu": lambda: np.where(x >= 0, x, alpha * (np.exp(x) - 1)),
    }[name]()


@pytest.mark.parametrize(
    ("act", "alpha", "beta"),
    [("Affine", 1.0, 0.0), ("ThresholdedRelu", 1.0, None), ("LeakyRelu", 0.01, None),
     ("HardSigmoid", 0.2, 0.5), ("Elu", 1.0, None)],
)  # fmt: skip
def test_activation_defaults_follow_onnx_operators(act, alpha, beta):
    """Without activation_alpha/beta the ONNX operator defaults apply (ORT deviates for
    ThresholdedRelu and Affine, where it uses 0), so the oracle here is numpy."""
    cfg = Cfg("RNN", acts=[act], seq=3, batch=2, bias=True, h0=True, seed=3)
    arrays = _arrays(cfg)
    rewritten, report = rewrite_model(build(cfg, arrays, 0), only=["rnn"])
    assert report.total == 1
    (got,) = run_ort(rewritten, arrays)[:1]
    w, r, b = arrays["W"][0], arrays["R"][0], arrays["B"][0]
    h = arrays["initial_h"][0]
    for t in range(cfg.seq):
        pre = arrays["X"][t] @ w.T + h @ r.T + b[: cfg.hidden] + b[cfg.hidden :]
        h = _spec_activation(act, pre.astype(np.float64), alpha, beta)
    np.testing.assert_allclose(got[-1, 0], h, rtol=1e-4, atol=1e-4)


def test_scaled_tanh_without_values_is_refused():
    cfg = Cfg("RNN", acts=["ScaledTanh"])
    _, report = rewrite_model(build(cfg, _arrays(cfg), 0), only=["rnn"])
    assert report.total == 0 and "ScaledTanh" in report.skipped[0].message


# ---------------------------------------------------------------------------------------------
# A symbolic sequence length: one Scan per direction, checked at several lengths and batches


def symbolic(model: onnx.ModelProto, cfg: Cfg) -> onnx.ModelProto:
    """``model`` with X's sequence and batch dims (and the batch of the states and lengths)
    symbolic: T and N."""
    seq_axis, batch_axis = (0, 1) if cfg.layout == 0 else (1, 0)
    state_batch = 1 if cfg.layout == 0 else 0
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if vi.name == "X":
            dims[seq_axis].dim_param, dims[batch_axis].dim_param = "T", "N"
        elif vi.name in ("initial_h", "initial_c"):
            dims[state_batch].dim_param = "N"
        elif vi.name == "sequence_lens":
            dims[0].dim_param = "N"
    return model


def check_scan_case(cfg: Cfg, shapes: list[tuple[int, int]]) -> None:
    """Rewrite the symbolic-length model once; run it at each (length, batch) in ``shapes``
    with the same weights, against onnxruntime's kernel at that shape."""
    first = _arrays(cfg)
    model = symbolic(build(cfg, first, cfg.layout), cfg)
    rewritten, report = rewrite_model(model, only=["rnn"])
    assert report.applied == {"rnn": 1}, report.skipped
    assert "Scan" in op_types(rewritten) and not {"LSTM", "GRU", "RNN"} & set(op_types(rewritten))
    full_check(rewritten)
    for seq, batch in shapes:
        at = Cfg(**{**cfg.__dict__, "seq": seq, "batch": batch})
        arrays = _arrays(at) | {k: v for k, v in first.items() if k in ("W", "R", "B", "P")}
        if cfg.lens == "const":
            arrays["sequence_lens"] = first["sequence_lens"]
        got = run_ort(rewritten, {k: v for k, v in arrays.items() if k in {i.name for i in rewritten.graph.input}})
        assert_close(got, expected_outputs(at, arrays), what=f"{at} (Scan) vs onnxruntime")


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@PROPERTY
@given(data=st.data())
def test_scan_over_time_matches_onnxruntime_at_every_length(op, data):
    cfg = data.draw(configs(op).filter(lambda c: c.opset >= 9))
    lengths = data.draw(st.lists(st.integers(1, 7), min_size=2, max_size=3))
    if cfg.lens == "const":  # the model's own lengths, at most cfg.seq, for its own batch
        lengths, batches = [max(n, cfg.seq) for n in lengths], [cfg.batch] * len(lengths)
    else:
        batches = data.draw(st.lists(st.integers(1, 3), min_size=len(lengths), max_size=len(lengths)))
    check_scan_case(cfg, list(zip(lengths, batches)))


def test_a_symbolic_length_before_opset_9_stays_with_its_reason():
    cfg = Cfg("LSTM", opset=8)
    model = symbolic(build(cfg, _arrays(cfg), 0), cfg)
    rewritten, report = rewrite_model(model)
    assert report.applied["rnn"] == 0
    assert "has no Scan" in report.skipped[0].message
    assert op_types(rewritten) == ["LSTM"]


def test_dynamic_batch_is_fine():
    cfg = Cfg("GRU", direction="bidirectional", seq=3, batch=2, h0=True, bias=True, lens="dynamic")
    arrays = _arrays(cfg)
    model = build(cfg, arrays, 0)
    for vi in model.graph.input:
        if vi.name in ("X", "initial_h", "sequence_lens"):
            dim = 0 if vi.name == "sequence_lens" else 1
            vi.type.tensor_type.shape.dim[dim].dim_param = "N"
    rewritten, report = rewrite_model(model)
    assert report.applied["rnn"] == 1
    full_check(rewritten)
    assert_close(run_ort(rewritten, arrays), expected_outputs(cfg, arrays))


def test_float64_matches_reference_evaluator():
    cfg = Cfg("LSTM", direction="bidirectional", seq=3, bias=True, h0=True, peep=True)
    arrays = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in _arrays(cfg).items()}
    model = build(cfg, arrays, 0)
    for vi in list(model.graph.input) + list(model.graph.output):
        vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    rewritten, _ = rewrite_model(model)
    full_check(rewritten)
    want = ReferenceEvaluator(model).run(None, arrays)
    assert_close(run_ort(rewritten, arrays), want, rtol=1e-10, atol=1e-10)


def test_names_derive_from_node_and_are_unique():
    cfg = Cfg("LSTM", direction="bidirectional", seq=2, bias=True)
    rewritten, _ = rewrite_model(build(cfg, _arrays(cfg), 0))
    names = [n.name for n in rewritten.graph.node]
    assert len(names) == len(set(names))
    assert all(n.startswith("rnn0/") for n in names)
    assert any(n.startswith("rnn0/bw/t1/") for n in names)


def test_bad_options():
    cfg = Cfg("RNN")
    model = build(cfg, _arrays(cfg), 0)
    with pytest.raises(OnnxMluError):
        rewrite_model(model, only=["lstm"])


@pytest.mark.parametrize("op,steps", [("LSTM", 300), ("GRU", 300), ("RNN", 400)])
def test_long_reverse_recurrence_with_a_consumer_rewrites(op, steps):
    """Length is never a reason to fail: a reverse recurrence unrolled to hundreds of steps, read
    by a node listed after it, once made the export's recursive sort exceed Python's stack."""
    rng = np.random.default_rng(3)
    gates, inp, hidden = GATES[op], 2, 3
    w = (rng.standard_normal((1, gates * hidden, inp)) * 0.3).astype(np.float32)
    r = (rng.standard_normal((1, gates * hidden, hidden)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["xr"]),
             helper.make_node(op, ["xr", "W", "R"], ["y"], hidden_size=hidden, direction="reverse"),
             helper.make_node("Relu", ["y"], ["out"])]
    graph = helper.make_graph(
        nodes, "long", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, inp])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "W"), onnx.numpy_helper.from_array(r, "R")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rewritten, _ = rewrite_model(model)
    assert op not in op_types(rewritten)
    x = rng.standard_normal((steps, 1, inp)).astype(np.float32)
    assert_close(run_ort(rewritten, {"x": x}), run_ort(model, {"x": x}), what=f"{op} x{steps}")
