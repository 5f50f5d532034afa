"""Export-like models built in code, for graph shapes no bundled model has.

Each builder returns an ``onnx.ModelProto`` (deterministic: fixed seeds) that mimics what an
exporter emits: model-local functions (``export_modules_as_functions``), weights computed by
ConstantOfShape/Unsqueeze/Expand chains, shape arithmetic on a symbolic batch, LSTMs inside If
branches of a main graph stored out of topological order (branch weights from outer-scope
Constants), onnxruntime-quantized graphs (QOperator, QDQ and dynamic quantization, com.microsoft
contrib ops), a float16 model, onnxruntime's own LayerNormalization in an opset-14 model, a
200-step bidirectional LSTM, a string input, a ``torch.cond``-style ``If`` between two CNN
heads, a Keras LSTM as tf2onnx writes it (a ``Loop`` over a symbolic length), and an opset-23
LLaMA-style decoder layer (RMSNormalization, RotaryEmbedding, grouped-query Attention with a KV
cache), 4-bit MatMulNBits decoders, and Optimum's merged ``If(use_cache_branch)`` decoders (a
toy one, and a LLaMA one with the shape arithmetic, causal mask and tied LM head torch.onnx
writes, in float32 and float16). :data:`BUILDERS` maps a name to its builder; ``corpus.py`` caches the built files next to
the downloaded ones.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
import ortexport
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
FLOAT = TensorProto.FLOAT


def _rand(rng: np.random.Generator, *shape: int, scale: float = 0.1) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def _const(name: str, array) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(array)))


def _model(graph: onnx.GraphProto, opsets: dict[str, int] | None = None, **kw) -> onnx.ModelProto:
    imports = [helper.make_opsetid(d, v) for d, v in {"": OPSET, **(opsets or {})}.items()]
    model = helper.make_model(graph, opset_imports=imports, producer_name="onnxmlu-tests", **kw)
    model.ir_version = 8
    return model


def local_functions_cnn() -> onnx.ModelProto:
    """Small CNN whose Conv+Relu and Linear layers sit in model-local functions (dynamo style)."""
    rng = np.random.default_rng(1)
    dom = "pkg.onnxmlu.tests"
    conv_relu = helper.make_function(
        dom, "ConvRelu", ["x", "w", "b"], ["y"],
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])],
        [helper.make_opsetid("", OPSET)],
    )  # fmt: skip
    linear = helper.make_function(
        dom, "Linear", ["x", "w", "b"], ["y"],
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)],
        [helper.make_opsetid("", OPSET)],
    )  # fmt: skip
    nodes = [
        helper.make_node("ConvRelu", ["x", "w1", "b1"], ["h1"], domain=dom, name="conv1"),
        helper.make_node("MaxPool", ["h1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("ConvRelu", ["p1", "w2", "b2"], ["h2"], domain=dom, name="conv2"),
        helper.make_node("GlobalAveragePool", ["h2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Linear", ["f", "w3", "b3"], ["y"], domain=dom, name="fc"),
    ]
    inits = [_init("w1", _rand(rng, 8, 3, 3, 3)), _init("b1", _rand(rng, 8)),
             _init("w2", _rand(rng, 16, 8, 3, 3)), _init("b2", _rand(rng, 16)),
             _init("w3", _rand(rng, 10, 16)), _init("b3", _rand(rng, 10))]  # fmt: skip
    graph = helper.make_graph(
        nodes, "local_functions_cnn",
        [helper.make_tensor_value_info("x", FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("y", FLOAT, ["batch", 10])], inits,
    )  # fmt: skip
    return _model(graph, {dom: 1}, functions=[conv_relu, linear])


def conv_bn_relu_gemm() -> onnx.ModelProto:
    """Conv -> BatchNormalization (non-trivial scale/bias/mean/var) -> Relu -> pool -> Gemm, batch N."""
    rng = np.random.default_rng(2)
    c = 16
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"], epsilon=1e-5),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    inits = [
        _init("w", _rand(rng, c, 3, 3, 3)), _init("b", _rand(rng, c)),
        _init("s", (1 + _rand(rng, c)).astype(np.float32)), _init("bb", _rand(rng, c)),
        _init("m", _rand(rng, c)), _init("v", rng.uniform(0.5, 2, c).astype(np.float32)),
        _init("fw", _rand(rng, 10, c)), _init("fb", _rand(rng, 10)),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "conv_bn_relu_gemm",
        [helper.make_tensor_value_info("x", FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("y", FLOAT, ["N", 10])], inits,
    )  # fmt: skip
    return _model(graph)


def computed_weights() -> onnx.ModelProto:
    """Conv/Gemm weights computed at run time by ConstantOfShape, Unsqueeze and Expand chains."""
    fill = lambda v: numpy_helper.from_array(np.array([v], np.float32))  # noqa: E731
    nodes = [
        _const("wshape", np.array([8, 3, 3, 3], np.int64)),
        helper.make_node("ConstantOfShape", ["wshape"], ["w0"], value=fill(0.05)),
        _const("ramp", np.linspace(-1, 1, 8, dtype=np.float32)),
        _const("axes123", np.array([1, 2, 3], np.int64)),
        helper.make_node("Unsqueeze", ["ramp", "axes123"], ["ramp4"]),
        helper.make_node("Mul", ["w0", "ramp4"], ["w"]),  # per-channel scaled constant weight
        _const("scalar", np.array(0.1, np.float32)),
        _const("axes0", np.array([0], np.int64)),
        helper.make_node("Unsqueeze", ["scalar", "axes0"], ["b1"]),
        _const("bshape", np.array([8], np.int64)),
        helper.make_node("Expand", ["b1", "bshape"], ["b"]),
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        _const("gshape", np.array([8, 4], np.int64)),
        helper.make_node("ConstantOfShape", ["gshape"], ["gw"], value=fill(0.25)),
        helper.make_node("MatMul", ["f", "gw"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "computed_weights",
        [helper.make_tensor_value_info("x", FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", FLOAT, [1, 4])],
    )  # fmt: skip
    return _model(graph)


def shape_arith_expand() -> onnx.ModelProto:
    """``Expand(c, Concat([1], Shape(x, start=0, end=1), [4]))`` added to a MatMul of x (batch N)."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Shape", ["x"], ["n"], start=0, end=1),
        _const("one", np.array([1], np.int64)),
        _const("four", np.array([4], np.int64)),
        helper.make_node("Concat", ["one", "n", "four"], ["shape"], axis=0),
        helper.make_node("Expand", ["c", "shape"], ["e"]),
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        _const("axes0", np.array([0], np.int64)),
        helper.make_node("Unsqueeze", ["m", "axes0"], ["m3"]),
        helper.make_node("Add", ["e", "m3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "shape_arith_expand",
        [helper.make_tensor_value_info("x", FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", FLOAT, [1, "N", 4])],
        [_init("c", _rand(rng, 1, 1, 4, scale=1.0)), _init("w", _rand(rng, 8, 4, scale=1.0))],
    )  # fmt: skip
    return _model(graph)


def _lstm_branch(rng: np.random.Generator, tag: str, hidden: int) -> tuple[onnx.GraphProto, list]:
    """A branch: LSTM over the outer ``x``/``h``/``c``, then Sigmoid(last h @ G). Its W/R/B come
    from outer-scope Constant nodes, returned to be placed in the main graph."""
    feat = 16
    weights = [
        _const(f"W{tag}", _rand(rng, 1, 4 * hidden, feat)),
        _const(f"R{tag}", _rand(rng, 1, 4 * hidden, hidden)),
        _const(f"B{tag}", _rand(rng, 1, 8 * hidden)),
    ]
    nodes = [
        helper.make_node("LSTM", ["x", f"W{tag}", f"R{tag}", f"B{tag}", "", "h", "c"],
                         [f"Y{tag}", f"hn{tag}", f"cn{tag}"], hidden_size=hidden),
        _const(f"ax{tag}", np.array([0], np.int64)),
        helper.make_node("Squeeze", [f"hn{tag}", f"ax{tag}"], [f"hs{tag}"]),
        _const(f"G{tag}", _rand(rng, hidden, 1, scale=1.0)),
        helper.make_node("MatMul", [f"hs{tag}", f"G{tag}"], [f"lg{tag}"]),
        helper.make_node("Sigmoid", [f"lg{tag}"], [f"p{tag}"]),
        helper.make_node("Identity", [f"hn{tag}"], [f"ho{tag}"]),
        helper.make_node("Identity", [f"cn{tag}"], [f"co{tag}"]),
    ]  # fmt: skip
    outs = [helper.make_tensor_value_info(f"{n}{tag}", FLOAT, None) for n in ("p", "ho", "co")]
    return helper.make_graph(nodes, f"branch_{tag}", [], outs), weights


def lstm_in_if_unsorted() -> onnx.ModelProto:
    """Silero-like: ``If(sr == 16000)`` picks one of two LSTMs. The main graph is stored out of
    topological order (If first, then the Equal and the outer-scope weight Constants it uses);
    onnxruntime accepts that, while onnx.checker does not."""
    rng = np.random.default_rng(4)
    hidden = 32
    then_g, then_w = _lstm_branch(rng, "t", hidden)
    else_g, else_w = _lstm_branch(rng, "e", hidden)
    nodes = [
        helper.make_node("If", ["is16k"], ["prob", "hn", "cn"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Equal", ["sr", "sr16k"], ["is16k"]),
        _const("sr16k", np.array(16000, np.int64)),
        *then_w,
        *else_w,
    ]
    graph = helper.make_graph(
        nodes, "lstm_in_if_unsorted",
        [helper.make_tensor_value_info("x", FLOAT, ["seq", 1, 16]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, []),
         helper.make_tensor_value_info("h", FLOAT, [1, 1, hidden]),
         helper.make_tensor_value_info("c", FLOAT, [1, 1, hidden])],
        [helper.make_tensor_value_info("prob", FLOAT, [1, 1]),
         helper.make_tensor_value_info("hn", FLOAT, [1, 1, hidden]),
         helper.make_tensor_value_info("cn", FLOAT, [1, 1, hidden])],
    )  # fmt: skip
    return _model(graph)


def _lstm_matmul() -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    hidden, feat = 32, 16
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y", "hn"], hidden_size=hidden),
        helper.make_node("Squeeze", ["hn", "ax0"], ["hs"]),
        helper.make_node("MatMul", ["hs", "G"], ["y"]),
    ]
    inits = [_init("W", _rand(rng, 1, 4 * hidden, feat)), _init("R", _rand(rng, 1, 4 * hidden, hidden)),
             _init("B", _rand(rng, 1, 8 * hidden)), _init("ax0", np.array([0], np.int64)),
             _init("G", _rand(rng, hidden, 8, scale=1.0))]  # fmt: skip
    graph = helper.make_graph(
        nodes, "lstm_matmul", [helper.make_tensor_value_info("x", FLOAT, ["seq", 1, feat])],
        [helper.make_tensor_value_info("y", FLOAT, [1, 8])], inits,
    )  # fmt: skip
    return _model(graph)


def _quantize(model: onnx.ModelProto, static: bool, qdq: bool = False) -> onnx.ModelProto:
    """Run onnxruntime's quantizer on ``model`` (static QOperator, or QDQ with ``qdq``, with
    fixed calibration data, or dynamic) and return the result."""
    from onnxruntime import quantization as q

    logging.getLogger().setLevel(logging.ERROR)  # the quantizer logs pre-processing advice
    with tempfile.TemporaryDirectory(prefix="onnxmlu-quant-") as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "quant.onnx"
        onnx.save(model, src)
        if static:
            rng = np.random.default_rng(6)
            feeds = [{"x": rng.uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)} for _ in range(4)]

            class Reader(q.CalibrationDataReader):
                def __init__(self) -> None:
                    self._it = iter(feeds)

                def get_next(self):
                    return next(self._it, None)

            q.quantize_static(src, dst, Reader(), quant_format=q.QuantFormat.QDQ if qdq else q.QuantFormat.QOperator,
                              activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8)  # fmt: skip
        else:
            q.quantize_dynamic(src, dst, weight_type=q.QuantType.QUInt8)
        return onnx.load(dst)


def ort_static_quant_cnn() -> onnx.ModelProto:
    """:func:`conv_bn_relu_gemm` (batch 1) statically quantized by onnxruntime: QLinearConv,
    com.microsoft QLinearGlobalAveragePool/QGemm, (De)QuantizeLinear."""
    model = conv_bn_relu_gemm()
    for vi in (*model.graph.input, *model.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_value = 1
    return _quantize(model, static=True)


def ort_dynamic_quant_lstm() -> onnx.ModelProto:
    """An LSTM + MatMul dynamically quantized by onnxruntime: com.microsoft DynamicQuantizeLSTM,
    DynamicQuantizeLinear, MatMulInteger."""
    return _quantize(_lstm_matmul(), static=False)


def ort_qdq_cnn() -> onnx.ModelProto:
    """:func:`conv_bn_relu_gemm` (batch 1) statically quantized by onnxruntime in QDQ format:
    QuantizeLinear/DequantizeLinear pairs around the float operators."""
    model = conv_bn_relu_gemm()
    for vi in (*model.graph.input, *model.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_value = 1
    return _quantize(model, static=True, qdq=True)


def fp16_conv_chain() -> onnx.ModelProto:
    """A float16 model (input, weights, output) with a symbolic length: Relu -> Conv -> Relu ->
    Conv -> Relu; onnxruntime's CPU provider runs its Convs in float between Casts."""
    rng = np.random.default_rng(8)
    half = TensorProto.FLOAT16
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Conv", ["a", "w1"], ["b"], pads=[1, 1]),
             helper.make_node("Relu", ["b"], ["c"]), helper.make_node("Conv", ["c", "w2"], ["d"], pads=[1, 1]),
             helper.make_node("Relu", ["d"], ["y"])]
    inits = [_init("w1", _rand(rng, 8, 8, 3).astype(np.float16)), _init("w2", _rand(rng, 8, 8, 3).astype(np.float16))]
    graph = helper.make_graph(nodes, "fp16_conv_chain", [helper.make_tensor_value_info("x", half, [1, 8, "L"])],
                              [helper.make_tensor_value_info("y", half, [1, 8, "L"])], inits)
    return _model(graph)


def ort_optimized_layernorm14() -> onnx.ModelProto:
    """What onnxruntime's optimizer saves for an opset-14 transformer block: its own
    LayerNormalization (ONNX has it from opset 17) between two MatMuls."""
    rng = np.random.default_rng(9)
    d = 32
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["n", "W2"], ["y"])]
    inits = [_init("W1", _rand(rng, d, d)), _init("W2", _rand(rng, d, d)),
             _init("g", (1 + _rand(rng, d)).astype(np.float32)), _init("b", _rand(rng, d))]
    graph = helper.make_graph(nodes, "layernorm14", [helper.make_tensor_value_info("x", FLOAT, [1, 16, d])],
                              [helper.make_tensor_value_info("y", FLOAT, [1, 16, d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], producer_name="onnxmlu-tests")
    model.ir_version = 7
    return model


def long_bidirectional_lstm() -> onnx.ModelProto:
    """A bidirectional LSTM over 200 steps between two Relus (an EEG model's shape): the
    unrolled reverse direction is a dependency chain hundreds of nodes deep."""
    rng = np.random.default_rng(10)
    steps, feat, hidden = 200, 8, 8
    nodes = [helper.make_node("Relu", ["x"], ["xr"]),
             helper.make_node("LSTM", ["xr", "W", "R", "B"], ["Y"], hidden_size=hidden, direction="bidirectional"),
             helper.make_node("Relu", ["Y"], ["y"])]
    inits = [_init("W", _rand(rng, 2, 4 * hidden, feat, scale=0.3)), _init("R", _rand(rng, 2, 4 * hidden, hidden, scale=0.3)),
             _init("B", _rand(rng, 2, 8 * hidden))]
    graph = helper.make_graph(nodes, "long_bilstm", [helper.make_tensor_value_info("x", FLOAT, [steps, 1, feat])],
                              [helper.make_tensor_value_info("y", FLOAT, None)], inits)
    return _model(graph)


def string_input_mlp() -> onnx.ModelProto:
    """A model with a string input beside its float one (a tokenizer's pass-through)."""
    rng = np.random.default_rng(11)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"]),
             helper.make_node("Identity", ["text"], ["text_out"])]
    graph = helper.make_graph(
        nodes, "string_input", [helper.make_tensor_value_info("x", FLOAT, [1, 16]),
                                helper.make_tensor_value_info("text", TensorProto.STRING, [1])],
        [helper.make_tensor_value_info("y", FLOAT, [1, 16]), helper.make_tensor_value_info("text_out", TensorProto.STRING, [1])],
        [_init("W", _rand(rng, 16, 16))])
    return _model(graph)


def grapheme_to_phoneme() -> onnx.ModelProto:
    """A grapheme-to-phoneme encoder as a 2021 exporter wrote it (a singing synthesizer's): the
    letters of each word, strings [N, 8], looked up by an ``ai.onnx.ml`` LabelEncoder-1
    (whose output onnx cannot type), embedded, mixed over the 8 letters and over features by
    five MatMuls, and each letter's phoneme read from a string table by its ArgMax."""
    rng = np.random.default_rng(13)
    letters, feat, phonemes = 8, 16, 12
    classes = [chr(ord("a") + k) for k in range(26)]
    nodes = [helper.make_node("LabelEncoder", ["letters"], ["ids"], domain="ai.onnx.ml",
                              classes_strings=classes, default_int64=26),
             helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
             helper.make_node("Gather", ["embed", "ids64"], ["e"]),  # [N, 8, F]
             helper.make_node("MatMul", ["e", "w0"], ["h0"]), helper.make_node("Relu", ["h0"], ["r0"]),
             helper.make_node("Transpose", ["r0"], ["t0"], perm=[0, 2, 1]),  # [N, F, 8]: mix letters
             helper.make_node("MatMul", ["t0", "mix"], ["h1"]), helper.make_node("Relu", ["h1"], ["r1"]),
             helper.make_node("Transpose", ["r1"], ["t1"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["t1", "w2"], ["h2"]), helper.make_node("Add", ["h2", "b2"], ["a2"]),
             helper.make_node("Relu", ["a2"], ["r2"]),
             helper.make_node("MatMul", ["r2", "w3"], ["h3"]), helper.make_node("Relu", ["h3"], ["r3"]),
             helper.make_node("MatMul", ["r3", "w4"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["p"], axis=-1),
             helper.make_node("ArgMax", ["p"], ["best"], axis=-1, keepdims=0),
             helper.make_node("Gather", ["table", "best"], ["phs"])]
    inits = [_init("embed", _rand(rng, 27, feat, scale=1.0)), _init("w0", _rand(rng, feat, feat, scale=0.5)),
             _init("mix", _rand(rng, letters, letters, scale=0.5)), _init("w2", _rand(rng, feat, feat, scale=0.5)),
             _init("b2", _rand(rng, feat)), _init("w3", _rand(rng, feat, feat, scale=0.5)),
             _init("w4", _rand(rng, feat, phonemes, scale=0.5)),
             _init("table", np.array([f"ph{k}" for k in range(phonemes)], dtype=object))]
    graph = helper.make_graph(
        nodes, "grapheme_to_phoneme", [helper.make_tensor_value_info("letters", TensorProto.STRING, ["N", letters])],
        [helper.make_tensor_value_info("phs", TensorProto.STRING, ["N", letters]),
         helper.make_tensor_value_info("logits", FLOAT, ["N", letters, phonemes])], inits)
    return _model(graph, {"ai.onnx.ml": 1})


def _tower(tag: str, x: str) -> list[onnx.NodeProto]:
    """Conv(w1) -> Relu -> MaxPool -> Conv(w2) -> Relu -> GAP -> Flatten -> MatMul(fc) of ``x``."""
    return [helper.make_node("Conv", [x, "w1", "b1"], [f"{tag}_c1"], pads=[1, 1, 1, 1], name=f"{tag}_conv1"),
            helper.make_node("Relu", [f"{tag}_c1"], [f"{tag}_r1"], name=f"{tag}_relu1"),
            helper.make_node("MaxPool", [f"{tag}_r1"], [f"{tag}_p1"], kernel_shape=[2, 2], strides=[2, 2]),
            helper.make_node("Conv", [f"{tag}_p1", "w2", "b2"], [f"{tag}_c2"], pads=[1, 1, 1, 1], name=f"{tag}_conv2"),
            helper.make_node("Relu", [f"{tag}_c2"], [f"{tag}_r2"], name=f"{tag}_relu2"),
            helper.make_node("GlobalAveragePool", [f"{tag}_r2"], [f"{tag}_g"]),
            helper.make_node("Flatten", [f"{tag}_g"], [f"{tag}_f"]),
            helper.make_node("MatMul", [f"{tag}_f", "fc"], [f"{tag}_emb"], name=f"{tag}_fc")]


def siamese_tower() -> onnx.ModelProto:
    """A Siamese CNN: one tower (two convolutions and a projection, its weights one set of
    initializers) applied to two images, then the L1 distance of the embeddings. Cut into a
    block per tower, each block reads every weight of the tower."""
    rng = np.random.default_rng(14)
    nodes = [*_tower("a", "left"), *_tower("b", "right"),
             helper.make_node("Sub", ["a_emb", "b_emb"], ["diff"]), helper.make_node("Abs", ["diff"], ["l1"]),
             helper.make_node("ReduceSum", ["l1", "axes"], ["distance"], keepdims=0)]
    inits = [_init("w1", _rand(rng, 32, 3, 3, 3, scale=0.3)), _init("b1", _rand(rng, 32)),
             _init("w2", _rand(rng, 64, 32, 3, 3, scale=0.1)), _init("b2", _rand(rng, 64)),
             _init("fc", _rand(rng, 64, 128, scale=0.2)), _init("axes", np.array([1], np.int64))]
    image = lambda name: helper.make_tensor_value_info(name, FLOAT, ["N", 3, "H", "W"])  # noqa: E731
    graph = helper.make_graph(nodes, "siamese_tower", [image("left"), image("right")],
                              [helper.make_tensor_value_info("distance", FLOAT, ["N"])], inits)
    return _model(graph)


def _decoder_branch(past: bool, heads: int, dim: int) -> onnx.GraphProto:
    """One decoder layer and the LM head over the outer scope's weights, as Optimum exports each
    side of a merged decoder: token embedding, Q/K/V projections split into heads, the keys and
    values appended to ``past_key``/``past_value`` (``past``) or taken as they are, scaled dot
    product attention with its two MatMuls, the output projection, a residual ReLU MLP, the
    head. Outputs: logits, present key, present value."""
    tag = "wp" if past else "np"
    n = lambda op, ins, outs, **kw: helper.make_node(op, ins, [f"{tag}_{o}" if o else o for o in outs],  # noqa: E731
                                                     name=f"{tag}_{outs[0]}", **kw)
    t = lambda name: f"{tag}_{name}"  # noqa: E731
    heads_of = lambda x, out: [n("Reshape", [x, "heads_shape"], [f"{out}_r"]),  # noqa: E731
                               n("Transpose", [t(f"{out}_r")], [out], perm=[0, 2, 1, 3])]
    nodes = [n("Gather", ["embed", "input_ids"], ["h"]),
             n("MatMul", [t("h"), "wq"], ["q0"]), n("MatMul", [t("h"), "wk"], ["k0"]), n("MatMul", [t("h"), "wv"], ["v0"]),
             *heads_of(t("q0"), "q"), *heads_of(t("k0"), "k"), *heads_of(t("v0"), "v")]
    if past:
        nodes += [n("Concat", ["past_key", t("k")], ["key"], axis=2), n("Concat", ["past_value", t("v")], ["value"], axis=2)]
    else:
        nodes += [n("Identity", [t("k")], ["key"]), n("Identity", [t("v")], ["value"])]
    nodes += [n("Transpose", [t("key")], ["kt"], perm=[0, 1, 3, 2]),
              n("MatMul", [t("q"), t("kt")], ["s0"]), n("Mul", [t("s0"), "scale"], ["s"]),
              n("Softmax", [t("s")], ["p"], axis=-1), n("MatMul", [t("p"), t("value")], ["a0"]),
              n("Transpose", [t("a0")], ["a1"], perm=[0, 2, 1, 3]), n("Reshape", [t("a1"), "merge_shape"], ["a"]),
              n("MatMul", [t("a"), "wo"], ["o"]), n("Add", [t("h"), t("o")], ["r1"]),
              n("MatMul", [t("r1"), "w_up"], ["u"]), n("Relu", [t("u")], ["g"]), n("MatMul", [t("g"), "w_down"], ["d"]),
              n("Add", [t("r1"), t("d")], ["r2"]), n("MatMul", [t("r2"), "lm_head"], ["logits"])]
    kv = ["batch", heads, "total", dim]
    return helper.make_graph(nodes, f"{tag}_branch", [], [
        helper.make_tensor_value_info(t("logits"), FLOAT, None), helper.make_tensor_value_info(t("key"), FLOAT, kv),
        helper.make_tensor_value_info(t("value"), FLOAT, kv)])


def merged_if_decoder(heads: int = 2, dim: int = 16) -> onnx.ModelProto:
    """Optimum's merged decoder: ``If(use_cache_branch)`` between the decoder with its KV cache
    (keys and values appended to the past ones) and the decoder without (the first step), both
    branches reading the same outer-scope weights: a block in each reads them all. ``heads`` of
    ``dim`` channels each."""
    rng = np.random.default_rng(15)
    vocab = 64
    hidden = heads * dim
    nodes = [helper.make_node("If", ["use_cache_branch"], ["logits", "present_key", "present_value"],
                              then_branch=_decoder_branch(True, heads, dim), else_branch=_decoder_branch(False, heads, dim))]
    inits = [_init("embed", _rand(rng, vocab, hidden, scale=1.0)),
             *(_init(w, _rand(rng, hidden, hidden, scale=0.2)) for w in ("wq", "wk", "wv", "wo")),
             _init("w_up", _rand(rng, hidden, 4 * hidden, scale=0.2)), _init("w_down", _rand(rng, 4 * hidden, hidden, scale=0.1)),
             _init("lm_head", _rand(rng, hidden, vocab, scale=0.2)), _init("scale", np.float32(1 / np.sqrt(dim))),
             _init("heads_shape", np.array([0, 0, heads, dim], np.int64)), _init("merge_shape", np.array([0, 0, hidden], np.int64))]
    kv = ["batch", heads, "past", dim]
    graph = helper.make_graph(
        nodes, "merged_if_decoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("past_key", FLOAT, kv), helper.make_tensor_value_info("past_value", FLOAT, kv),
         helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])],
        [helper.make_tensor_value_info("logits", FLOAT, ["batch", "seq", vocab]),
         helper.make_tensor_value_info("present_key", FLOAT, ["batch", heads, "total", dim]),
         helper.make_tensor_value_info("present_value", FLOAT, ["batch", heads, "total", dim])], inits)
    return _model(graph)


def _conv_branch(tag: str, first: str, second: str, activation: str, pool: bool) -> onnx.GraphProto:
    """Conv(first) -> activation -> [MaxPool] -> Conv(second) -> Relu -> GAP -> Flatten -> MatMul(fc_TAG)."""
    a, b = f"{tag}_a", f"{tag}_b"
    nodes = [helper.make_node("Conv", ["x", first], [f"{a}_c"], pads=[1, 1, 1, 1]),
             helper.make_node(activation, [f"{a}_c"], [f"{a}_r"]),
             *([helper.make_node("MaxPool", [f"{a}_r"], [f"{a}_p"], kernel_shape=[2, 2], strides=[2, 2])] if pool else []),
             helper.make_node("Conv", [f"{a}_p" if pool else f"{a}_r", second], [f"{b}_c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", [f"{b}_c"], [f"{b}_r"]),
             helper.make_node("GlobalAveragePool", [f"{b}_r"], [f"{b}_g"]),
             helper.make_node("Flatten", [f"{b}_g"], [f"{b}_f"]),
             helper.make_node("MatMul", [f"{b}_f", f"fc_{tag}"], [f"y_{tag}"])]
    return helper.make_graph(nodes, f"{tag}_branch", [], [helper.make_tensor_value_info(f"y_{tag}", FLOAT, None)])


def cond_conv_branches() -> onnx.ModelProto:
    """``torch.cond``-style: ``If(mean(x) > 0)`` chooses between two small CNN heads, each a pair
    of convolutions and a classifier. The then-branch reads the main graph's initializers from
    the outer scope; the else-branch holds its weights in Constant nodes of its own."""
    rng = np.random.default_rng(11)
    then_g = _conv_branch("t", "wt1", "wt2", "Relu", pool=False)
    else_g = _conv_branch("e", "we1", "we2", "Sigmoid", pool=True)
    own = [_const("we1", _rand(rng, 8, 3, 3, 3, scale=0.3)), _const("we2", _rand(rng, 8, 8, 3, 3, scale=0.2)),
           _const("fc_e", _rand(rng, 8, 10, scale=0.5))]
    body = list(else_g.node)
    del else_g.node[:]
    else_g.node.extend([*own, *body])
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], keepdims=0),
             helper.make_node("Greater", ["mean", "zero"], ["positive"]),
             helper.make_node("If", ["positive"], ["logits"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    graph = helper.make_graph(
        nodes, "cond_conv_branches", [helper.make_tensor_value_info("x", FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("probs", FLOAT, ["N", 10])],
        [_init("zero", np.float32(0)), _init("wt1", _rand(rng, 8, 3, 3, 3, scale=0.3)),
         _init("wt2", _rand(rng, 8, 8, 3, 3, scale=0.2)), _init("fc_t", _rand(rng, 8, 10, scale=0.5))])
    return _model(graph)


def _lstm_cell_body(hidden: int) -> onnx.GraphProto:
    """tf2onnx's while-loop body of a Keras LSTM: gates from x_t (gathered from the outer
    sequence at the iteration number) and h, Split in four, then c and h; the condition is
    computed from the counter, the new h is also a scan output."""
    nodes = [helper.make_node("Gather", ["seq", "i"], ["x_t"], axis=0),
             helper.make_node("MatMul", ["x_t", "kernel"], ["xk"]),
             helper.make_node("MatMul", ["h", "recurrent"], ["hk"]),
             helper.make_node("Add", ["xk", "hk"], ["z0"]),
             helper.make_node("Add", ["z0", "bias"], ["z"]),
             helper.make_node("Split", ["z"], ["zi", "zf", "zc", "zo"], axis=1),
             helper.make_node("Sigmoid", ["zi"], ["gi"]), helper.make_node("Sigmoid", ["zf"], ["gf"]),
             helper.make_node("Tanh", ["zc"], ["gc"]), helper.make_node("Sigmoid", ["zo"], ["go"]),
             helper.make_node("Mul", ["gf", "c"], ["fc"]), helper.make_node("Mul", ["gi", "gc"], ["ic"]),
             helper.make_node("Add", ["fc", "ic"], ["c_next"]),
             helper.make_node("Tanh", ["c_next"], ["tc"]), helper.make_node("Mul", ["go", "tc"], ["h_next"]),
             helper.make_node("Add", ["i", "one"], ["i_next"]),
             helper.make_node("Less", ["i_next", "steps"], ["cond_next"]),
             helper.make_node("Identity", ["h_next"], ["h_seq"])]
    inputs = [helper.make_tensor_value_info("i", TensorProto.INT64, []),
              helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
              helper.make_tensor_value_info("h", FLOAT, ["N", hidden]), helper.make_tensor_value_info("c", FLOAT, ["N", hidden])]
    outputs = [helper.make_tensor_value_info("cond_next", TensorProto.BOOL, []),
               helper.make_tensor_value_info("h_next", FLOAT, ["N", hidden]),
               helper.make_tensor_value_info("c_next", FLOAT, ["N", hidden]),
               helper.make_tensor_value_info("h_seq", FLOAT, ["N", hidden])]
    return helper.make_graph(nodes, "lstm_while_body", inputs, outputs)


def keras_lstm_loop() -> onnx.ModelProto:
    """A Keras LSTM as tf2onnx converts it: the sequence [N, T, F] transposed to time major, a
    ``Loop`` over its symbolic length with zero initial states sized from the batch, the cell
    math in the body, then a Dense + Softmax on the last h."""
    rng = np.random.default_rng(12)
    hidden, feat = 16, 12
    nodes = [helper.make_node("Transpose", ["x"], ["seq"], perm=[1, 0, 2]),
             helper.make_node("Shape", ["seq"], ["seq_shape"]),
             helper.make_node("Gather", ["seq_shape", "zero_i"], ["steps"], axis=0),
             helper.make_node("Gather", ["seq_shape", "one_v"], ["batch"], axis=0),
             helper.make_node("Concat", ["batch", "hidden_v"], ["state_shape"], axis=0),
             helper.make_node("ConstantOfShape", ["state_shape"], ["zeros"],
                              value=numpy_helper.from_array(np.zeros(1, np.float32))),
             helper.make_node("Loop", ["steps", "true", "zeros", "zeros"], ["h_last", "c_last", "hs"],
                              body=_lstm_cell_body(hidden)),
             helper.make_node("MatMul", ["h_last", "dense"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    inits = [_init("zero_i", np.array(0, np.int64)), _init("one_v", np.array([1], np.int64)),
             _init("hidden_v", np.array([hidden], np.int64)), _init("true", np.array(True)),
             _init("one", np.array(1, np.int64)), _init("kernel", _rand(rng, feat, 4 * hidden, scale=0.3)),
             _init("recurrent", _rand(rng, hidden, 4 * hidden, scale=0.3)), _init("bias", _rand(rng, 4 * hidden)),
             _init("dense", _rand(rng, hidden, 5, scale=0.5))]
    graph = helper.make_graph(
        nodes, "keras_lstm_loop", [helper.make_tensor_value_info("x", FLOAT, ["N", "T", feat])],
        [helper.make_tensor_value_info("probs", FLOAT, ["N", 5]),
         helper.make_tensor_value_info("hs", FLOAT, ["T", "N", hidden])], inits)
    return _model(graph)


def _rms(x: str, weight: str, out: str) -> onnx.NodeProto:
    return helper.make_node("RMSNormalization", [x, weight], [out], epsilon=1e-6, axis=-1)


def opset23_decoder_layer(hidden: int = 64, heads: int = 8, kv_heads: int = 2, ffn: int = 128,
                          positions: int = 256, interleaved: bool = False, rotary_dim: int = 0,
                          causal: bool = True, attention: dict | None = None) -> onnx.ModelProto:
    """A LLaMA-style decoder layer as an opset-23 export writes it: RMSNormalization, the Q/K/V
    MatMuls, RotaryEmbedding of Q and K (3-D, ``num_heads``, caches indexed by
    ``position_ids``), grouped-query Attention (8 query heads, 2 key/value heads) with a KV cache
    on a symbolic past length and ``is_causal``, the output projection and residual, then
    RMSNormalization and a SwiGLU MLP with its residual. Batch, sequence and past are symbolic;
    the sizes are keywords (the corpus's defaults are small); ``positions``: the rotary tables'
    length, the longest past plus sequence the layer runs; ``interleaved``, ``rotary_dim`` (0: the
    whole head) the RotaryEmbedding attributes; ``causal`` False: an additive ``attn_mask`` input
    [batch, 1, seq, total] instead of ``is_causal``; ``attention``: more Attention attributes
    (``scale``, ``softcap``)."""
    rng = np.random.default_rng(23)
    head = hidden // heads
    rot = rotary_dim or head
    angles = np.arange(positions)[:, None] * (10000.0 ** (-np.arange(0, rot, 2) / rot))[None, :]
    rope = {k: v for k, v in (("interleaved", int(interleaved)), ("rotary_embedding_dim", rotary_dim)) if v}
    masking = {**({"is_causal": 1} if causal else {}), **(attention or {})}
    nodes = [_rms("x", "ln1", "h"),
             *(helper.make_node("MatMul", ["h", w], [o]) for w, o in (("wq", "q"), ("wk", "k"), ("wv", "v"))),
             helper.make_node("RotaryEmbedding", ["q", "cos", "sin", "position_ids"], ["q_rot"], num_heads=heads, **rope),
             helper.make_node("RotaryEmbedding", ["k", "cos", "sin", "position_ids"], ["k_rot"], num_heads=kv_heads, **rope),
             helper.make_node("Attention", ["q_rot", "k_rot", "v", "" if causal else "attn_mask", "past_key", "past_value"],
                              ["attn", "present_key", "present_value"], **masking, q_num_heads=heads,
                              kv_num_heads=kv_heads),
             helper.make_node("MatMul", ["attn", "wo"], ["o"]), helper.make_node("Add", ["x", "o"], ["r1"]),
             _rms("r1", "ln2", "h2"), helper.make_node("MatMul", ["h2", "wg"], ["g"]),
             helper.make_node("Sigmoid", ["g"], ["g_sig"]), helper.make_node("Mul", ["g", "g_sig"], ["silu"]),
             helper.make_node("MatMul", ["h2", "wu"], ["u"]), helper.make_node("Mul", ["silu", "u"], ["gu"]),
             helper.make_node("MatMul", ["gu", "wd"], ["d"]), helper.make_node("Add", ["r1", "d"], ["y"])]
    inits = [_init("ln1", 1 + _rand(rng, hidden)), _init("ln2", 1 + _rand(rng, hidden)),
             _init("wq", _rand(rng, hidden, heads * head, scale=0.2)),
             _init("wk", _rand(rng, hidden, kv_heads * head, scale=0.2)),
             _init("wv", _rand(rng, hidden, kv_heads * head, scale=0.2)),
             _init("wo", _rand(rng, heads * head, hidden, scale=0.2)), _init("wg", _rand(rng, hidden, ffn, scale=0.2)),
             _init("wu", _rand(rng, hidden, ffn, scale=0.2)), _init("wd", _rand(rng, ffn, hidden, scale=0.2)),
             _init("cos", np.cos(angles).astype(np.float32)), _init("sin", np.sin(angles).astype(np.float32))]
    cache = ["batch", kv_heads, "past", head]
    mask = [] if causal else [helper.make_tensor_value_info("attn_mask", FLOAT, ["batch", 1, "seq", "total"])]
    graph = helper.make_graph(
        nodes, "opset23_decoder_layer",
        [helper.make_tensor_value_info("x", FLOAT, ["batch", "seq", hidden]),
         helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("past_key", FLOAT, cache), helper.make_tensor_value_info("past_value", FLOAT, cache),
         *mask],
        [helper.make_tensor_value_info("y", FLOAT, ["batch", "seq", hidden]),
         helper.make_tensor_value_info("present_key", FLOAT, ["batch", kv_heads, "total", head]),
         helper.make_tensor_value_info("present_value", FLOAT, ["batch", kv_heads, "total", head])], inits)
    model = _model(graph, {"": 23})
    model.ir_version = 10
    return model


MS = "com.microsoft"


def _bert_attention(t: str, x: str, heads: int, packed: bool) -> list[onnx.NodeProto]:
    """The self-attention as the optimizer fuses it: com.microsoft Attention over one packed Q/K/V
    weight, or MatMuls for Q, K, V into MultiHeadAttention (the projection bias inside either)."""
    if packed:
        return [helper.make_node("Attention", [x, f"{t}Wqkv", f"{t}bqkv", "mask"], [f"{t}ctx"], domain=MS,
                                 num_heads=heads)]
    return [helper.make_node("MatMul", [x, f"{t}Wq"], [f"{t}q"]), helper.make_node("MatMul", [x, f"{t}Wk"], [f"{t}k"]),
            helper.make_node("MatMul", [x, f"{t}Wv"], [f"{t}v"]),
            helper.make_node("MultiHeadAttention", [f"{t}q", f"{t}k", f"{t}v", f"{t}bqkv", "mask"], [f"{t}ctx"],
                             domain=MS, num_heads=heads)]


def _bert_layer(rng, t: str, x: str, d: int, heads: int, gelu: str, packed: bool) -> tuple[list, list, str]:
    """One encoder layer as onnxruntime's transformer optimizer saves it: the fused attention,
    SkipLayerNormalization twice (the projection bias inside), the feed-forward activation a
    contrib Gelu with its bias."""
    nodes = _bert_attention(t, x, heads, packed) + [
        helper.make_node("MatMul", [f"{t}ctx", f"{t}Wo"], [f"{t}o"]),
        helper.make_node("SkipLayerNormalization", [f"{t}o", x, f"{t}g1", f"{t}b1", f"{t}bo"], [f"{t}ln1"],
                         domain=MS, epsilon=1e-12),
        helper.make_node("MatMul", [f"{t}ln1", f"{t}W1"], [f"{t}h"]),
        helper.make_node(gelu, [f"{t}h", f"{t}bh"], [f"{t}a"], domain=MS),
        helper.make_node("MatMul", [f"{t}a", f"{t}W2"], [f"{t}f"]),
        helper.make_node("SkipLayerNormalization", [f"{t}f", f"{t}ln1", f"{t}g2", f"{t}b2", f"{t}bf"],
                         [f"{t}out"], domain=MS, epsilon=1e-12)]
    projections = {"Wqkv": (d, 3 * d)} if packed else {"Wq": (d, d), "Wk": (d, d), "Wv": (d, d)}
    shapes = {**projections, "bqkv": (3 * d,), "Wo": (d, d), "bo": (d,), "b1": (d,), "W1": (d, 4 * d),
              "bh": (4 * d,), "W2": (4 * d, d), "bf": (d,), "b2": (d,)}
    inits = [_init(f"{t}{k}", _rand(rng, *shape)) for k, shape in shapes.items()]
    inits += [_init(f"{t}{g}", (1 + _rand(rng, d)).astype(np.float32)) for g in ("g1", "g2")]
    return nodes, inits, f"{t}out"


def ort_optimized_bert(d: int = 32, heads: int = 4) -> onnx.ModelProto:
    """Two BERT encoder layers as onnxruntime's transformer optimizer writes them (contrib
    MultiHeadAttention in one, Attention with packed weights in the other, SkipLayerNormalization,
    BiasGelu / FastGelu) and a head that its MatMul+Transpose fusion made a FusedMatMul (transB,
    alpha) with a QuickGelu; batch and length symbolic; ``d`` the hidden size, ``heads`` its heads."""
    rng = np.random.default_rng(12)
    nodes1, inits1, h1 = _bert_layer(rng, "l0_", "x", d, heads, "BiasGelu", False)
    nodes2, inits2, h2 = _bert_layer(rng, "l1_", h1, d, heads, "FastGelu", True)
    head = [helper.make_node("FusedMatMul", [h2, "Whead"], ["logits"], domain=MS, transB=1, alpha=0.5),
            helper.make_node("QuickGelu", ["logits"], ["y"], domain=MS)]
    graph = helper.make_graph(
        nodes1 + nodes2 + head, "ort_optimized_bert",
        [helper.make_tensor_value_info("x", FLOAT, ["B", "S", d]),
         helper.make_tensor_value_info("mask", TensorProto.INT32, ["B", "S"])],
        [helper.make_tensor_value_info("y", FLOAT, ["B", "S", 8])], inits1 + inits2 + [_init("Whead", _rand(rng, 8, d))])
    return _model(graph, {MS: 1})


def _pack4(q: np.ndarray) -> np.ndarray:
    """4-bit values [..., 2m] -> uint8 [..., m], the low nibble first (MatMulNBits' layout)."""
    q = q.astype(np.uint8)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _nbits_linear(rng, name: str, x: str, out: str, k: int, n: int, block: int = 32, bits: int = 4,
                  zero_points: bool = True, accuracy_level: int = 4) -> tuple[onnx.NodeProto, list]:
    """A linear layer quantized as onnxruntime's MatMul4BitsQuantizer writes it: 4-bit weights in
    blocks of 32 along K, float scales, packed uint8 zero points (``bits`` 8: a byte each;
    without ``zero_points``: none, the kernel's default mid-range one). K a multiple of ``block``."""
    blocks = k // block
    q = rng.integers(0, 1 << bits, (n, blocks, block))
    zp = rng.integers(6, 10, (n, blocks)) if bits == 4 else rng.integers(120, 136, (n, blocks))
    scales = rng.uniform(0.002, 0.02, (n, blocks)).astype(np.float32)
    pack = _pack4 if bits == 4 else lambda a: a.astype(np.uint8)  # noqa: E731
    packed_zp = pack(np.pad(zp, ((0, 0), (0, blocks % 2 if bits == 4 else 0))))  # a row's zero points pad to bytes
    node = helper.make_node("MatMulNBits", [x, f"{name}_B", f"{name}_s"] + [f"{name}_zp"] * zero_points, [out],
                            domain=MS, K=k, N=n, bits=bits, block_size=block, accuracy_level=accuracy_level, name=name)
    return node, [_init(f"{name}_B", pack(q)), _init(f"{name}_s", scales)] + [_init(f"{name}_zp", packed_zp)] * zero_points


def _rotary(t: str, x: str, out: str, heads: int, head: int) -> list[onnx.NodeProto]:
    """Rotary embedding with standard ops on [B, S, heads * head]: x cos + rotate_half(x) sin."""
    half = head // 2
    return [helper.make_node("Reshape", [f"{t}{x}", "heads_shape"], [f"{t}{x}4"]),
            helper.make_node("Split", [f"{t}{x}4", "halves"], [f"{t}{x}1", f"{t}{x}2"], axis=-1),
            helper.make_node("Neg", [f"{t}{x}2"], [f"{t}{x}2n"]),
            helper.make_node("Concat", [f"{t}{x}2n", f"{t}{x}1"], [f"{t}{x}_rh"], axis=-1),
            helper.make_node("Mul", [f"{t}{x}4", "cos"], [f"{t}{x}c"]),
            helper.make_node("Mul", [f"{t}{x}_rh", "sin"], [f"{t}{x}s"]),
            helper.make_node("Add", [f"{t}{x}c", f"{t}{x}s"], [f"{t}{x}rot"]),
            helper.make_node("Reshape", [f"{t}{x}rot", "merge_shape"], [out])] if half else []


def _llama_layer(rng, t: str, x: str, d: int, heads: int, ffn: int, quant: dict) -> tuple[list, list, str]:
    head = d // heads
    nodes = [helper.make_node("SimplifiedLayerNormalization", [x, f"{t}n1"], [f"{t}xn"], epsilon=1e-6)]
    inits = [_init(f"{t}n1", (1 + _rand(rng, d)).astype(np.float32)), _init(f"{t}n2", (1 + _rand(rng, d)).astype(np.float32))]
    for proj in "qkv":
        node, weights = _nbits_linear(rng, f"{t}{proj}_proj", f"{t}xn", f"{t}{proj}", d, d, **quant)
        nodes.append(node)
        inits += weights
    nodes += _rotary(t, "q", f"{t}qr", heads, head) + _rotary(t, "k", f"{t}kr", heads, head)
    nodes.append(helper.make_node("MultiHeadAttention", [f"{t}qr", f"{t}kr", f"{t}v"], [f"{t}ctx"], domain=MS,
                                  num_heads=heads, unidirectional=1))
    mlp, mlp_weights, out = _nbits_mlp(rng, t, x, f"{t}ctx", d, ffn, **quant)
    return nodes + mlp, inits + mlp_weights, out


def _nbits_mlp(rng, t: str, x: str, attn: str, d: int, ffn: int, **quant) -> tuple[list, list, str]:
    """What follows the attention in both 4-bit decoder layers: the o_proj, the residual and the
    next norm in one SkipSimplifiedLayerNormalization (its sum the new residual), then the
    SiLU-gated MLP and its residual; every linear layer a MatMulNBits."""
    nodes, inits = [], []
    for name, src, out, k, n in (("o_proj", attn, f"{t}o", d, d), ("gate_proj", f"{t}hn", f"{t}g", d, ffn),
                                 ("up_proj", f"{t}hn", f"{t}u", d, ffn), ("down_proj", f"{t}m", f"{t}dn", ffn, d)):
        node, weights = _nbits_linear(rng, f"{t}{name}", src, out, k, n, **quant)
        nodes.append(node)
        inits += weights
        if name == "o_proj":
            nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [f"{t}o", x, f"{t}n2"],
                                          [f"{t}hn", "", "", f"{t}h"], domain=MS, epsilon=1e-6))
        if name == "up_proj":
            nodes += [helper.make_node("Sigmoid", [f"{t}g"], [f"{t}gs"]), helper.make_node("Mul", [f"{t}g", f"{t}gs"], [f"{t}silu"]),
                      helper.make_node("Mul", [f"{t}silu", f"{t}u"], [f"{t}m"])]
    nodes.append(helper.make_node("Add", [f"{t}h", f"{t}dn"], [f"{t}out"]))
    return nodes, inits, f"{t}out"


def llama_matmulnbits_decoder(d: int = 64, heads: int = 4, bits: int = 4, block: int = 32,
                              zero_points: bool = True, accuracy_level: int = 4) -> onnx.ModelProto:
    """A LLaMA-style decoder (embedding, two layers: RMS norms -- SimplifiedLayerNormalization,
    SkipSimplifiedLayerNormalization with the residual --, rotary on Q and K by position, causal
    MultiHeadAttention, SiLU-gated MLP; final norm and LM head) whose 15 linear layers are 4-bit
    MatMulNBits at accuracy_level 4, as onnxruntime's quantizer and transformer optimizer leave
    it; batch and length symbolic. ``d``, ``heads``: the sizes; ``bits``, ``block``, ``zero_points``,
    ``accuracy_level``: the quantization (d a multiple of ``block``)."""
    rng = np.random.default_rng(13)
    ffn, vocab, max_pos = 2 * d, 96, 64
    quant = {"bits": bits, "block": block, "zero_points": zero_points, "accuracy_level": accuracy_level}
    head = d // heads
    inv = 1.0 / (10000 ** (np.arange(0, head, 2) / head))
    angles = np.arange(max_pos)[:, None] * inv[None, :]
    tables = {n: np.concatenate([f(angles)] * 2, axis=-1).astype(np.float32) for n, f in (("cos", np.cos), ("sin", np.sin))}
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h0"])]
    for n in ("cos", "sin"):  # [B, S, 1, head] by position
        nodes += [helper.make_node("Gather", [f"{n}_table", "position_ids"], [f"{n}3"]),
                  helper.make_node("Unsqueeze", [f"{n}3", "axis2"], [n])]
    inits = [_init("embed", _rand(rng, vocab, d, scale=1.0)), _init("cos_table", tables["cos"]),
             _init("sin_table", tables["sin"]), _init("axis2", np.array([2], np.int64)),
             _init("heads_shape", np.array([0, 0, heads, head], np.int64)), _init("merge_shape", np.array([0, 0, d], np.int64)),
             _init("halves", np.array([head // 2, head // 2], np.int64)), _init("final_norm", np.ones(d, np.float32))]
    x = "h0"
    for layer in range(2):
        layer_nodes, layer_inits, x = _llama_layer(rng, f"l{layer}_", x, d, heads, ffn, quant)
        nodes += layer_nodes
        inits += layer_inits
    nodes.append(helper.make_node("SimplifiedLayerNormalization", [x, "final_norm"], ["hf"], epsilon=1e-6))
    lm_head, lm_weights = _nbits_linear(rng, "lm_head", "hf", "logits", d, vocab, **quant)
    graph = helper.make_graph(
        nodes + [lm_head], "llama_matmulnbits",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "S"]),
         helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["B", "S"])],
        [helper.make_tensor_value_info("logits", FLOAT, ["B", "S", vocab])], inits + lm_weights)
    return _model(graph, {MS: 1})


def _genai_layer(rng, t: str, x: str, norm_in: str, d: int, heads: int, kv: int, ffn: int) -> tuple[list, list, str]:
    """One decoder layer as onnxruntime's GenAI builder writes it for a 4-bit CPU model: the
    residual added by SkipSimplifiedLayerNormalization, one packed QKV MatMulNBits into
    GroupQueryAttention (rotary inside, the KV cache past and present), MatMulNBits MLP."""
    head = d // heads
    qkv, qkv_weights = _nbits_linear(rng, f"{t}qkv_proj", norm_in, f"{t}qkv", d, (heads + 2 * kv) * head)
    nodes = [qkv, helper.make_node("GroupQueryAttention",
                                   [f"{t}qkv", "", "", f"past_key_{t[1]}", f"past_value_{t[1]}", "seqlens_k",
                                    "total_sequence_length", "cos_cache", "sin_cache"],
                                   [f"{t}attn", f"present_key_{t[1]}", f"present_value_{t[1]}"], domain=MS,
                                   num_heads=heads, kv_num_heads=kv, do_rotary=1)]
    inits = qkv_weights + [_init(f"{t}n2", (1 + _rand(rng, d)).astype(np.float32))]
    mlp, mlp_weights, out = _nbits_mlp(rng, t, x, f"{t}attn", d, ffn)
    return nodes + mlp, inits + mlp_weights, out


def genai_gqa_decoder_step(heads: int = 4, kv: int = 2) -> onnx.ModelProto:
    """One token of a LLaMA-style decoder as onnxruntime's GenAI builder writes a 4-bit CPU model:
    two layers of packed-QKV MatMulNBits -> GroupQueryAttention (rotary, KV cache buffers of a
    symbolic length P, ``seqlens_k`` and ``total_sequence_length`` run-time values), the RMS norms
    as SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization, MatMulNBits MLP and LM
    head; batch and past length symbolic; ``heads``/``kv`` the query and key/value heads of its 64
    channels."""
    rng = np.random.default_rng(14)
    d, ffn, vocab, max_pos = 64, 128, 96, 32
    head = d // heads
    angles = np.arange(max_pos)[:, None] / (10000 ** (np.arange(0, head, 2) / head))[None, :]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h0"]),
             helper.make_node("SimplifiedLayerNormalization", ["h0", "n_in"], ["h0n"], epsilon=1e-6)]
    inits = [_init("embed", _rand(rng, vocab, d, scale=1.0)), _init("n_in", np.ones(d, np.float32)),
             _init("cos_cache", np.cos(angles).astype(np.float32)), _init("sin_cache", np.sin(angles).astype(np.float32)),
             _init("final_norm", np.ones(d, np.float32))]
    x, normed = "h0", "h0n"
    for layer in range(2):
        layer_nodes, layer_inits, x = _genai_layer(rng, f"l{layer}_", x, normed, d, heads, kv, ffn)
        nodes += layer_nodes
        inits += layer_inits
        normed = f"l{layer + 1}_in"
        nodes.append(helper.make_node("SimplifiedLayerNormalization", [x, "final_norm" if layer else "n_in"],
                                      [normed], epsilon=1e-6))
    lm_head, lm_weights = _nbits_linear(rng, "lm_head", normed, "logits", d, vocab)
    cache = [helper.make_tensor_value_info(f"past_{kind}_{i}", FLOAT, ["B", kv, "P", head])
             for i in range(2) for kind in ("key", "value")]
    presents = [helper.make_tensor_value_info(f"present_{kind}_{i}", FLOAT, ["B", kv, "T", head])
                for i in range(2) for kind in ("key", "value")]
    graph = helper.make_graph(
        nodes + [lm_head], "genai_gqa_step",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", 1]),
         helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
         helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [1])] + cache,
        [helper.make_tensor_value_info("logits", FLOAT, ["B", 1, vocab])] + presents, inits + lm_weights)
    return _model(graph, {MS: 1})


class _Emitter:
    """Appends nodes to a list, each output prefixed by ``tag`` (two branches, one namespace)."""

    def __init__(self, tag: str, dtype: int = FLOAT) -> None:
        self.tag, self.nodes, self.dtype = tag, [], dtype

    def __call__(self, op: str, ins: list[str], outs: list[str], **kw) -> str:
        outs = [f"{self.tag}_{o}" for o in outs]
        self.nodes.append(helper.make_node(op, ins, outs, name=outs[0], **kw))
        return outs[0]


def _hf_shapes(n: _Emitter) -> dict[str, str]:
    """The shape arithmetic a PyTorch export writes (batch and length read with Shape/Gather), and
    the additive mask: padding from ``attention_mask`` [B, T], causal from the positions
    ``T - S .. T`` of the queries against ``0 .. T`` of the keys (Range, Less, Where)."""
    ids = n("Shape", ["input_ids"], ["ids_shape"])
    b = n("Unsqueeze", [n("Gather", [ids, "c0"], ["bsz"], axis=0), "ax0"], ["bsz1"])
    s = n("Unsqueeze", [n("Gather", [ids, "c1"], ["seq"], axis=0), "ax0"], ["seq1"])
    am = n("Cast", [n("Unsqueeze", ["attention_mask", "ax12"], ["am4"])], ["amf"], to=n.dtype)
    pad = n("Mul", [n("Sub", ["one", am], ["inv"]), "neg_big"], ["pad"])
    total = n("Gather", [n("Shape", ["attention_mask"], ["am_shape"]), "c1"], ["total"], axis=0)
    start = n("Sub", [total, n("Gather", [ids, "c1"], ["seq_s"], axis=0)], ["past_len"])
    qpos = n("Unsqueeze", [n("Range", [start, total, "c1"], ["qpos"]), "ax1"], ["qpos2"])
    future = n("Less", [qpos, n("Range", ["c0", total, "c1"], ["kpos"])], ["future"])
    mask = n("Add", [pad, n("Where", [future, "neg_big", "zero"], ["causal"])], ["mask"])
    cos = n("Unsqueeze", [n("Gather", ["cos_cached", "position_ids"], ["cos3"]), "ax1"], ["cos"])
    sin = n("Unsqueeze", [n("Gather", ["sin_cached", "position_ids"], ["sin3"]), "ax1"], ["sin"])
    return {"b": b, "mask": mask, "cos": cos, "sin": sin, "q": n("Concat", [b, s, "c_heads", "c_hd"], ["qshape"], axis=0),
            "kv": n("Concat", [b, s, "c_kv", "c_hd"], ["kshape"], axis=0), "o": n("Concat", [b, s, "c_d"], ["oshape"], axis=0)}


def _hf_rms(n: _Emitter, x: str, w: str, t: str) -> str:
    """LlamaRMSNorm as exported: Pow, ReduceMean, Add eps, Sqrt, Div, Mul, Mul by the weight."""
    var = n("ReduceMean", [n("Pow", [x, "two"], [f"{t}_sq"])], [f"{t}_var"], axes=[-1])
    r = n("Div", ["one", n("Sqrt", [n("Add", [var, "eps"], [f"{t}_ve"])], [f"{t}_sd"])], [f"{t}_r"])
    return n("Mul", [w, n("Mul", [x, r], [f"{t}_n"])], [f"{t}_o"])


def _hf_rope(n: _Emitter, x: str, sh: dict, t: str) -> str:
    """x cos + rotate_half(x) sin, rotate_half by two Slices (the second to INT64-large), Neg, Concat."""
    x1 = n("Slice", [x, "s0", "shalf", "sm1"], [f"{t}_x1"])
    x2 = n("Slice", [x, "shalf", "sbig", "sm1"], [f"{t}_x2"])
    rh = n("Concat", [n("Neg", [x2], [f"{t}_nx2"]), x1], [f"{t}_rh"], axis=-1)
    return n("Add", [n("Mul", [x, sh["cos"]], [f"{t}_xc"]), n("Mul", [rh, sh["sin"]], [f"{t}_rs"])], [f"{t}_rot"])


def _hf_heads(n: _Emitter, x: str, w: str, shape: str, t: str) -> str:
    """A projection split into heads: MatMul, Reshape by a computed shape, Transpose."""
    r = n("Reshape", [n("MatMul", [x, w], [f"{t}0"]), shape], [f"{t}1"])
    return n("Transpose", [r], [t], perm=[0, 2, 1, 3])


def _hf_repeat_kv(n: _Emitter, x: str, sh: dict, t: str) -> str:
    """repeat_kv: Unsqueeze, Expand to [B, kv, rep, T, hd] and Reshape to [B, heads, T, hd],
    both shapes computed from Shape(x)."""
    total = n("Unsqueeze", [n("Gather", [n("Shape", [x], [f"{t}_shape"]), "c2"], [f"{t}_T"], axis=0), "ax0"], [f"{t}_T1"])
    ex = n("Expand", [n("Unsqueeze", [x, "ax2"], [f"{t}_u"]),
                      n("Concat", [sh["b"], "c_kv", "c_rep", total, "c_hd"], [f"{t}_ex"], axis=0)], [f"{t}_e"])
    return n("Reshape", [ex, n("Concat", [sh["b"], "c_heads", total, "c_hd"], [f"{t}_rs"], axis=0)], [f"{t}_rep"])


def _hf_attention(n: _Emitter, h: str, xn: str, sh: dict, layer: int, past: bool) -> tuple[str, list[str]]:
    """One LLaMA attention as exported, with the KV cache appended (``past``) or started; the
    residual sum and the present key and value."""
    p = f"l{layer}"
    q = _hf_rope(n, _hf_heads(n, xn, f"{p}.wq", sh["q"], f"{p}_q"), sh, f"{p}_q")
    k = _hf_rope(n, _hf_heads(n, xn, f"{p}.wk", sh["kv"], f"{p}_k"), sh, f"{p}_k")
    v = _hf_heads(n, xn, f"{p}.wv", sh["kv"], f"{p}_v")
    if past:
        key = n("Concat", [f"past_key_values.{layer}.key", k], [f"present.{layer}.key"], axis=2)
        value = n("Concat", [f"past_key_values.{layer}.value", v], [f"present.{layer}.value"], axis=2)
    else:
        key, value = (n("Identity", [x], [f"present.{layer}.{kind}"]) for x, kind in ((k, "key"), (v, "value")))
    kt = n("Transpose", [_hf_repeat_kv(n, key, sh, f"{p}_kr")], [f"{p}_kt"], perm=[0, 1, 3, 2])
    scores = n("Div", [n("MatMul", [q, kt], [f"{p}_qk"]), "sqrt_hd"], [f"{p}_sc"])
    masked = n("Add", [scores, sh["mask"]], [f"{p}_masked"])
    if n.dtype == FLOAT:
        probs = n("Softmax", [masked], [f"{p}_p"], axis=-1)
    else:  # softmax in float32, as the fp16 export writes it (upcast_softmax): a Cast chain around it
        up = n("Softmax", [n("Cast", [masked], [f"{p}_masked32"], to=FLOAT)], [f"{p}_p32"], axis=-1)
        probs = n("Cast", [up], [f"{p}_p"], to=n.dtype)
    ctx = n("Transpose", [n("MatMul", [probs, _hf_repeat_kv(n, value, sh, f"{p}_vr")], [f"{p}_ctx0"])],
            [f"{p}_ctx1"], perm=[0, 2, 1, 3])
    out = n("MatMul", [n("Reshape", [ctx, sh["o"]], [f"{p}_ctx"]), f"{p}.wo"], [f"{p}_o"])
    return n("Add", [h, out], [f"{p}_r1"]), [key, value]


def _hf_branch(past: bool, layers: int, shapes: dict[str, list], dtype: int) -> onnx.GraphProto:
    """One side of Optimum's merged LLaMA decoder: the whole decoder over the outer scope's
    weights, the cache appended to (``past``) or built from scratch; the LM head tied to the
    embedding (``MatMul`` by ``Transpose(embed)``)."""
    n = _Emitter("wp" if past else "np", dtype)
    sh = _hf_shapes(n)
    h = n("Gather", ["embed", "input_ids"], ["h0"])
    presents = []
    for layer in range(layers):
        p = f"l{layer}"
        h, kv = _hf_attention(n, h, _hf_rms(n, h, f"{p}.in_norm", f"{p}_n1"), sh, layer, past)
        presents += kv
        xn = _hf_rms(n, h, f"{p}.post_norm", f"{p}_n2")
        gate = n("MatMul", [xn, f"{p}.wg"], [f"{p}_g"])
        silu = n("Mul", [gate, n("Sigmoid", [gate], [f"{p}_gs"])], [f"{p}_silu"])
        m = n("Mul", [silu, n("MatMul", [xn, f"{p}.wu"], [f"{p}_u"])], [f"{p}_m"])
        h = n("Add", [h, n("MatMul", [m, f"{p}.wd"], [f"{p}_dn"])], [f"{p}_r2"])
    logits = n("MatMul", [_hf_rms(n, h, "final_norm", "fn"), n("Transpose", ["embed"], ["lm_head"], perm=[1, 0])],
               ["logits"])
    outputs = [helper.make_tensor_value_info(name, dtype, dims)
               for name, dims in zip([logits, *presents], [shapes["logits"]] + [shapes["kv"]] * len(presents))]
    return helper.make_graph(n.nodes, f"{n.tag}_branch", [], outputs)


def _hf_weights(rng, layers: int, d: int, kv_dim: int, ffn: int, vocab: int, head: int) -> list:
    """Outer-scope weights ([in, out], as torch.onnx writes Linear's MatMul) and the constants the
    branches share."""
    angles = np.arange(64)[:, None] / (10000 ** (np.arange(0, head, 2) / head))[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    inits = [_init("embed", _rand(rng, vocab, d, scale=1.0)), _init("cos_cached", np.cos(angles).astype(np.float32)),
             _init("sin_cached", np.sin(angles).astype(np.float32)), _init("final_norm", 1 + _rand(rng, d))]
    for p in (f"l{layer}" for layer in range(layers)):
        inits += [_init(f"{p}.in_norm", 1 + _rand(rng, d)), _init(f"{p}.post_norm", 1 + _rand(rng, d))]
        inits += [_init(f"{p}.{w}", _rand(rng, *dims)) for w, dims in
                  (("wq", (d, d)), ("wk", (d, kv_dim)), ("wv", (d, kv_dim)), ("wo", (d, d)), ("wg", (d, ffn)),
                   ("wu", (d, ffn)), ("wd", (ffn, d)))]
    ints = {"c0": 0, "c1": 1, "c2": 2, "ax0": [0], "ax1": [1], "ax2": [2], "ax12": [1, 2], "c_hd": [head], "c_d": [d],
            "c_kv": [kv_dim // head], "c_heads": [d // head], "c_rep": [d // kv_dim], "s0": [0], "shalf": [head // 2],
            "sbig": [2 ** 62], "sm1": [-1]}
    floats = {"one": 1.0, "two": 2.0, "zero": 0.0, "neg_big": -1e9, "eps": 1e-6, "sqrt_hd": np.sqrt(head)}
    return (inits + [_init(k, np.array(v, np.int64)) for k, v in ints.items()]
            + [_init(k, np.array(v, np.float32)) for k, v in floats.items()])


def _as_fp16(inits: list) -> list:
    """The float initializers in float16 (-1e9 becomes float16's lowest, -65504)."""
    half = lambda t: _init(t.name, np.maximum(numpy_helper.to_array(t), -65504).astype(np.float16))  # noqa: E731
    return [half(t) if t.data_type == FLOAT else t for t in inits]


def optimum_merged_llama(dtype: int = FLOAT, heads: int = 4, kv: int = 2, layers: int = 2) -> onnx.ModelProto:
    """Optimum's merged LLaMA decoder (``decoder_model_merged.onnx``): ``If(use_cache_branch)``
    between two whole two-layer decoders -- grouped-query attention with rotary embeddings, the
    cache appended to in one branch and built from scratch in the other --, the shape
    arithmetic and the causal mask computed from ``attention_mask`` as torch.onnx writes them,
    the weights outer-scope initializers both branches read, the LM head tied to the embedding.
    Pins that the cache branch takes (a mask over past + new tokens) are pins the other branch
    cannot take (its keys are the new tokens alone): its attention scores cannot be sized there.
    ``heads``, ``kv``, ``layers``: the sizes of the 64-channel decoder."""
    d, ffn, vocab = 64, 128, 96
    head = d // heads
    shapes = {"logits": ["batch", "seq", vocab], "kv": ["batch", kv, "total", head]}
    outs = ["logits"] + [f"present.{layer}.{k}" for layer in range(layers) for k in ("key", "value")]
    node = helper.make_node("If", ["use_cache_branch"], outs, name="optimum::if",
                            then_branch=_hf_branch(True, layers, shapes, dtype),
                            else_branch=_hf_branch(False, layers, shapes, dtype))
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", length]) for name, length in
              (("input_ids", "seq"), ("attention_mask", "total"), ("position_ids", "seq"))]
    inputs += [helper.make_tensor_value_info(f"past_key_values.{layer}.{k}", dtype, ["batch", kv, "past", head])
               for layer in range(layers) for k in ("key", "value")]
    inputs.append(helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]))
    outputs = [helper.make_tensor_value_info("logits", dtype, shapes["logits"])]
    outputs += [helper.make_tensor_value_info(o, dtype, shapes["kv"]) for o in outs[1:]]
    inits = _hf_weights(np.random.default_rng(16), layers, d, kv * head, ffn, vocab, head)
    inits = inits if dtype == FLOAT else _as_fp16(inits)
    return _model(helper.make_graph([node], "optimum_merged_llama", inputs, outputs, inits))


def optimum_merged_llama_fp16() -> onnx.ModelProto:
    """:func:`optimum_merged_llama` exported in float16 (weights, cache and logits), the softmax
    computed in float32 between two Casts."""
    return optimum_merged_llama(TensorProto.FLOAT16)



# --- GenAI int4 decoders and encoder-decoder decoders (Whisper/BART/T5 as Optimum and onnxruntime write them) ---


def _genai_bias_linear(rng, name: str, x: str, out: str, k: int, n: int, bias: bool) -> tuple[onnx.NodeProto, list]:
    """:func:`_nbits_linear` (4-bit, blocks of 32, accuracy_level 4), with a float ``bias``
    input (MatMulNBits' sixth, g_idx absent) where ``bias`` -- Qwen's q/k/v bias."""
    node, weights = _nbits_linear(rng, name, x, out, k, n)
    if bias:
        node.input.extend(["", f"{name}_bias"])
        weights.append(_init(f"{name}_bias", _rand(rng, n)))
    return node, weights


def _genai_lengths() -> list[onnx.NodeProto]:
    """GQA's lengths computed from ``attention_mask`` [B, T] as the GenAI builder writes them:
    ``seqlens_k = ReduceSum(mask, 1) - 1`` (int32) and ``total_sequence_length = T`` (an int32
    scalar from Shape/Gather)."""
    return [helper.make_node("ReduceSum", ["attention_mask", "g_ax1"], ["g_sum"], keepdims=0),
            helper.make_node("Sub", ["g_sum", "g_one"], ["g_seqlens64"]),
            helper.make_node("Cast", ["g_seqlens64"], ["seqlens_k"], to=TensorProto.INT32),
            helper.make_node("Shape", ["attention_mask"], ["g_mask_shape"]),
            helper.make_node("Gather", ["g_mask_shape", "g_idx1"], ["g_total64"], axis=0),
            helper.make_node("Cast", ["g_total64"], ["total_sequence_length"], to=TensorProto.INT32)]


def _genai_block(rng, i: int, normed: str, d: int, heads: int, kv: int, bias: bool,
                 gqa_attrs: dict) -> tuple[list, list]:
    """Layer ``i``'s attention: the packed QKV MatMulNBits (N = (heads + 2 kv) head), GQA with
    key and value absent and rotary inside (``gqa_attrs`` more attributes; ``head_sink``: a
    per-head sink logit input, as gpt-oss's), the o_proj."""
    head, t = d // heads, f"l{i}_"
    qkv, inits = _genai_bias_linear(rng, f"{t}qkv_proj", normed, f"{t}qkv", d, (heads + 2 * kv) * head, bias)
    attrs = {k: v for k, v in gqa_attrs.items() if k not in ("head_sink", "rotary_op")}
    sink = ["", "", f"{t}sink"] if gqa_attrs.get("head_sink") else []
    inits += [_init(f"{t}sink", rng.uniform(-1, 2, heads).astype(np.float32))] if sink else []
    qkv_in, nodes = [f"{t}qkv", "", ""], [qkv]
    if gqa_attrs.get("rotary_op"):  # the older builder: Split, com.microsoft RotaryEmbedding on Q and K
        qkv_in = [f"{t}q", f"{t}kr", f"{t}v"]
        nodes += [helper.make_node("Split", [f"{t}qkv", f"{t}qkv_sizes"], [f"{t}q0", f"{t}k0", f"{t}v"], axis=-1)]
        nodes += [helper.make_node("RotaryEmbedding", [f"{t}{x}0", "position_ids", "cos_cache", "sin_cache"], [out],
                                   domain=MS, num_heads=n) for x, out, n in (("q", f"{t}q", heads), ("k", f"{t}kr", kv))]
        inits.append(_init(f"{t}qkv_sizes", np.array([heads * head, kv * head, kv * head], np.int64)))
    gqa = helper.make_node("GroupQueryAttention",
                           [*qkv_in, f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k",
                            "total_sequence_length", *(["", ""] if gqa_attrs.get("rotary_op") else ["cos_cache", "sin_cache"]),
                            *sink],
                           [f"{t}attn", f"present.{i}.key", f"present.{i}.value"], domain=MS, name=f"{t}gqa",
                           num_heads=heads, kv_num_heads=kv, do_rotary=int(not gqa_attrs.get("rotary_op")),
                           scale=float(head) ** -0.5, **attrs)
    o_proj, o_weights = _nbits_linear(rng, f"{t}o_proj", f"{t}attn", f"{t}o", d, d)
    return nodes + [gqa, o_proj], inits + o_weights


def _genai_mlp(rng, t: str, normed: str, d: int, ffn: int) -> tuple[list, list, str]:
    nodes, inits = [], []
    for name, src, out, k, n in (("gate_proj", normed, f"{t}g", d, ffn), ("up_proj", normed, f"{t}u", d, ffn),
                                 ("down_proj", f"{t}m", f"{t}dn", ffn, d)):
        node, weights = _nbits_linear(rng, f"{t}{name}", src, out, k, n)
        nodes.append(node)
        inits += weights
    nodes[2:2] = [helper.make_node("Sigmoid", [f"{t}g"], [f"{t}gs"]), helper.make_node("Mul", [f"{t}g", f"{t}gs"], [f"{t}silu"]),
                  helper.make_node("Mul", [f"{t}silu", f"{t}u"], [f"{t}m"])]
    return nodes, inits, f"{t}dn"


def _int4_embedding(rng, vocab: int, d: int, block: int = 32) -> tuple[onnx.NodeProto, list]:
    """The token embedding as the GenAI builder writes an int4 one: GatherBlockQuantized of
    packed 4-bit rows (uint8, two a byte), a float scale and a packed zero point per block of
    ``block`` along the row."""
    q, zp = rng.integers(0, 16, (vocab, d)), rng.integers(6, 10, (vocab, d // block))
    node = helper.make_node("GatherBlockQuantized", ["embed_q", "input_ids", "embed_s", "embed_zp"], ["h0"], domain=MS,
                            bits=4, block_size=block, gather_axis=0, quantize_axis=1)
    return node, [_init("embed_q", _pack4(q)), _init("embed_s", rng.uniform(0.05, 0.2, (vocab, d // block)).astype(np.float32)),
                  _init("embed_zp", _pack4(zp))]


def genai_int4_decoder(heads: int = 4, kv: int = 2, layers: int = 2, bias: bool = False,
                       rotary_dim: int | None = None, int4_embedding: bool = False,
                       gqa: dict | None = None) -> onnx.ModelProto:
    """A decoder as onnxruntime-genai's model builder writes an int4 CPU model (prefill and
    decode in one graph): ``input_ids`` [B, S], ``attention_mask`` [B, T] and a KV cache of P
    rows per layer (T = P + S); GQA's ``seqlens_k``/``total_sequence_length`` computed from the
    mask in the graph; per layer SkipSimplifiedLayerNormalization adds the residual and norms,
    its 4th output (the residual sum) feeding the next one; packed QKV MatMulNBits (``bias``:
    with a bias input) into GroupQueryAttention (key/value absent, ``do_rotary=1``, cos/sin
    caches); MatMulNBits MLP and LM head, all at accuracy_level 4. ``heads``/``kv`` of 64
    channels; ``rotary_dim`` below the head size: partial rotary (the caches narrower);
    ``int4_embedding``: the embedding a GatherBlockQuantized (:func:`_int4_embedding`); ``gqa``:
    more GQA attributes (softcap, local_window_size, smooth_softmax; ``head_sink``: the input;
    ``rotary_op``: rotary by com.microsoft RotaryEmbedding nodes on a ``position_ids`` input)."""
    rng = np.random.default_rng(31)
    d, ffn, vocab, max_pos = 64, 128, 96, 64
    head = d // heads
    rot = rotary_dim or head
    angles = np.arange(max_pos)[:, None] / (10000 ** (np.arange(0, rot, 2) / rot))[None, :]
    embed, embed_inits = (_int4_embedding(rng, vocab, d) if int4_embedding else
                          (helper.make_node("Gather", ["embed", "input_ids"], ["h0"]), [_init("embed", _rand(rng, vocab, d, scale=1.0))]))
    nodes = [embed, *_genai_lengths(),
             helper.make_node("SimplifiedLayerNormalization", ["h0", "l0_n1"], ["l0_xn"], epsilon=1e-6)]
    inits = embed_inits + [_init("cos_cache", np.cos(angles).astype(np.float32)),
             _init("sin_cache", np.sin(angles).astype(np.float32)), _init("g_ax1", np.array([1], np.int64)),
             _init("g_one", np.array(1, np.int64)), _init("g_idx1", np.array(1, np.int64))]
    residual, normed = "h0", "l0_xn"
    for i in range(layers):
        t = f"l{i}_"
        attn, attn_inits = _genai_block(rng, i, normed, d, heads, kv, bias, gqa or {})
        post = helper.make_node("SkipSimplifiedLayerNormalization", [f"{t}o", residual, f"{t}n2"],
                                [f"{t}hn", "", "", f"{t}h"], domain=MS, epsilon=1e-6)
        mlp, mlp_inits, out = _genai_mlp(rng, t, f"{t}hn", d, ffn)
        last = i == layers - 1
        nxt = "final_" if last else f"l{i + 1}_"
        skip = helper.make_node("SkipSimplifiedLayerNormalization", [out, f"{t}h", f"{nxt}n1"],
                                ["final_xn"] if last else [f"{nxt}xn", "", "", f"{nxt}res"], domain=MS, epsilon=1e-6)
        nodes += attn + [post] + mlp + [skip]
        inits += attn_inits + mlp_inits + [_init(f"{t}n1", 1 + _rand(rng, d)), _init(f"{t}n2", 1 + _rand(rng, d))]
        residual, normed = f"{nxt}res", ("final_xn" if last else f"{nxt}xn")
    lm_head, lm_weights = _nbits_linear(rng, "lm_head", "final_xn", "logits", d, vocab)
    inits += [_init("final_n1", 1 + _rand(rng, d))]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "S"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "T"])]
    inputs += [helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["B", "S"])] * bool((gqa or {}).get("rotary_op"))
    inputs += [helper.make_tensor_value_info(f"past_key_values.{i}.{k}", FLOAT, ["B", kv, "P", head])
               for i in range(layers) for k in ("key", "value")]
    outputs = [helper.make_tensor_value_info("logits", FLOAT, ["B", "S", vocab])]
    outputs += [helper.make_tensor_value_info(f"present.{i}.{k}", FLOAT, ["B", kv, "T", head])
                for i in range(layers) for k in ("key", "value")]
    graph = helper.make_graph(nodes + [lm_head], "genai_int4_decoder", inputs, outputs, inits + lm_weights)
    return _model(graph, {MS: 1})



def _ed_heads(n: _Emitter, x: str, w: str, t: str, bias: str | None = None) -> str:
    """A projection (``bias``: plus a bias) split into heads [B, N, L, H]."""
    y = n("MatMul", [x, w], [f"{t}0"])
    y = n("Add", [y, bias], [f"{t}b"]) if bias else y
    return n("Transpose", [n("Reshape", [y, "ed_heads_shape"], [f"{t}1"])], [t], perm=[0, 2, 1, 3])


def _ed_attend(n: _Emitter, q: str, k: str, v: str, bias: str | None, cfg: dict, t: str) -> str:
    """softmax(Q K^T [x scale] [+ bias]) V merged back to [B, S, D] (T5 does not scale)."""
    s = n("MatMul", [q, n("Transpose", [k], [f"{t}_kt"], perm=[0, 1, 3, 2])], [f"{t}_qk"])
    s = s if cfg["t5"] else n("Mul", [s, "ed_scale"], [f"{t}_sc"])
    s = n("Add", [s, bias], [f"{t}_biased"]) if bias else s
    ctx = n("MatMul", [n("Softmax", [s], [f"{t}_p"], axis=-1), v], [f"{t}_ctx"])
    return n("Reshape", [n("Transpose", [ctx], [f"{t}_bsnh"], perm=[0, 2, 1, 3]), "ed_merge_shape"], [f"{t}_m"])


def _ed_norm(n: _Emitter, x: str, p: str, cfg: dict, t: str) -> str:
    """Whisper/BART: LayerNormalization; T5: its RMS norm as exported (Pow, ReduceMean, Sqrt, Div)."""
    if cfg["t5"]:
        return _hf_rms(n, x, f"{p}.g", t)
    return n("LayerNormalization", [x, f"{p}.g", f"{p}.b"], [t], axis=-1, epsilon=1e-5)


def _ed_positions(n: _Emitter, past: bool, cfg: dict) -> dict[str, str]:
    """Query positions P .. P + S (P the decoder cache length, 0 without cache), key positions
    0 .. T, the causal mask [S, T], and T5's relative position bias [1, N, S, T] (decoder:
    unidirectional buckets, a Gather of the bucket table) plus the causal mask."""
    seq = n("Gather", [n("Shape", ["input_ids"], ["ids_shape"]), "c1"], ["seq"], axis=0)
    start = n("Gather", [n("Shape", ["past_key_values.0.decoder.key"], ["pk_shape"]), "c2"], ["P"], axis=0) \
        if past else "c0"
    total = n("Add", [start, seq], ["T"])
    qpos, kpos = n("Range", [start, total, "c1"], ["qpos"]), n("Range", ["c0", total, "c1"], ["kpos"])
    causal = n("Where", [n("Less", [n("Unsqueeze", [qpos, "ax1"], ["qpos2"]), kpos], ["future"]), "neg_big", "zero"],
               ["causal"])
    if not cfg["t5"]:
        return {"qpos": qpos, "self": causal}
    rel = n("Neg", [n("Min", [n("Sub", [kpos, n("Unsqueeze", [qpos, "ax1"], ["qcol"])], ["rel"]), "c0"], ["relmin"])],
            ["rp"])
    ratio = n("Div", [n("Log", [n("Div", [n("Cast", [rel], ["rpf"], to=FLOAT), "exact_f"], ["rpr"])], ["rpl"]),
                      "log_span"], ["rpd"])
    large = n("Min", [n("Add", ["exact", n("Cast", [n("Mul", [ratio, "span_buckets"], ["rpm"])], ["rpi"],
                                               to=TensorProto.INT64)], ["large0"]), "last_bucket"], ["large"])
    bucket = n("Where", [n("Less", [rel, "exact"], ["small"]), rel, large], ["bucket"])
    bias = n("Unsqueeze", [n("Transpose", [n("Gather", ["rel_bias", bucket], ["rb"])], ["rbt"], perm=[2, 0, 1]), "ax0"],
             ["rb4"])
    return {"qpos": qpos, "self": n("Add", [bias, causal], ["self_bias"])}


def _ed_layer(n: _Emitter, h: str, i: int, pos: dict, past: bool, cfg: dict) -> tuple[str, list[str]]:
    """One decoder layer: causal self-attention over the decoder cache (appended to, or
    started), cross-attention over the encoder's keys/values (read from the cache, or computed
    from ``encoder_hidden_states``), the MLP; its output and the four present caches."""
    p, qb = f"l{i}", (None if cfg["t5"] else f"l{i}.bq")
    xn = _ed_norm(n, h, f"{p}.n1", cfg, f"{p}_n1")
    q, k, v = (_ed_heads(n, xn, f"{p}.w{c}", f"{p}_{c}", b) for c, b in (("q", qb), ("k", None), ("v", None)))
    cache = [f"past_key_values.{i}.decoder.{kind}" for kind in ("key", "value")]
    key, value = ((n("Concat", [c, x], [f"{p}_present_{kind}"], axis=2) if past else n("Identity", [x], [f"{p}_present_{kind}"]))
                  for c, x, kind in zip(cache, (k, v), ("key", "value")))
    h = n("Add", [h, n("MatMul", [_ed_attend(n, q, key, value, pos["self"], cfg, f"{p}_sa"), f"{p}.wo"], [f"{p}_o"])],
          [f"{p}_r1"])
    xn = _ed_norm(n, h, f"{p}.n2", cfg, f"{p}_n2")
    cq = _ed_heads(n, xn, f"{p}.cq", f"{p}_cq", None if cfg["t5"] else f"{p}.cbq")
    if past:
        ck, cv = (n("Identity", [f"past_key_values.{i}.encoder.{kind}"], [f"{p}_cross_{kind}"]) for kind in ("key", "value"))
    else:
        ck, cv = (_ed_heads(n, "encoder_hidden_states", f"{p}.c{c}", f"{p}_cross_{kind}") for c, kind in
                  (("k", "key"), ("v", "value")))
    h = n("Add", [h, n("MatMul", [_ed_attend(n, cq, ck, cv, pos.get("cross"), cfg, f"{p}_ca"), f"{p}.co"], [f"{p}_co"])],
          [f"{p}_r2"])
    up = n("MatMul", [_ed_norm(n, h, f"{p}.n3", cfg, f"{p}_n3"), f"{p}.w1"], [f"{p}_up"])
    act = n("Relu", [up], [f"{p}_act"]) if cfg["t5"] else n("Mul", [up, n("Sigmoid", [n("Mul", [up, "gelu_k"], [f"{p}_uk"])],
                                                                        [f"{p}_sig"])], [f"{p}_act"])
    return n("Add", [h, n("MatMul", [act, f"{p}.w2"], [f"{p}_dn"])], [f"{p}_r3"]), [key, value, ck, cv]


def _ed_branch(past: bool, cfg: dict) -> onnx.GraphProto:
    """One side of Optimum's merged encoder-decoder decoder over the outer scope's weights."""
    n = _Emitter("wp" if past else "np", cfg["dtype"])
    pos = _ed_positions(n, past, cfg)
    if cfg["encoder_mask"]:  # BART's _prepare_4d_attention_mask: masked_fill(mask == 0, finfo.min) as [B, 1, 1, E]
        pad = n("Equal", [n("Unsqueeze", ["encoder_attention_mask", "ax12"], ["em4"]), "c0"], ["em_pad"])
        pos["cross"] = n("Where", [pad, "f32_min", "zero"], ["cross_mask"])
    h = n("Gather", ["embed", "input_ids"], ["tok"])
    h = h if cfg["t5"] else n("Add", [h, n("Gather", ["pos_embed", pos["qpos"]], ["pe"])], ["h0"])
    presents = []
    for i in range(cfg["layers"]):
        h, kv = _ed_layer(n, h, i, pos, past, cfg)
        presents += kv
    logits = n("MatMul", [_ed_norm(n, h, "final", cfg, "fn"), n("Transpose", ["embed"], ["lm_head"], perm=[1, 0])], ["logits"])
    outputs = [helper.make_tensor_value_info(logits, cfg["dtype"], ["B", "S", cfg["vocab"]])]
    outputs += [helper.make_tensor_value_info(x, cfg["dtype"], ["B", cfg["heads"], None, cfg["head"]]) for x in presents]
    return helper.make_graph(n.nodes, f"{n.tag}_branch", [], outputs)


def _ed_weights(rng, cfg: dict) -> list:
    d, ffn = cfg["heads"] * cfg["head"], 2 * cfg["heads"] * cfg["head"]
    inits = [_init("embed", _rand(rng, cfg["vocab"], d, scale=1.0)), _init("final.g", 1 + _rand(rng, d))]
    inits += [_init("final.b", _rand(rng, d)), _init("pos_embed", _rand(rng, 64, d))] if not cfg["t5"] else \
        [_init("rel_bias", _rand(rng, 32, cfg["heads"], scale=1.0))]
    for p in (f"l{i}" for i in range(cfg["layers"])):
        inits += [_init(f"{p}.{w}", _rand(rng, *dims)) for w, dims in
                  (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)), ("cq", (d, d)), ("ck", (d, d)),
                   ("cv", (d, d)), ("co", (d, d)), ("w1", (d, ffn)), ("w2", (ffn, d)), ("bq", (d,)), ("cbq", (d,)))]
        inits += [_init(f"{p}.n{j}.{g}", (1 + _rand(rng, d)) if g == "g" else _rand(rng, d)) for j in (1, 2, 3) for g in "gb"]
    ints = {"c0": 0, "c1": 1, "c2": 2, "ax0": [0], "ax1": [1], "ax12": [1, 2], "exact": 16, "last_bucket": 31,
            "ed_heads_shape": [0, 0, cfg["heads"], cfg["head"]], "ed_merge_shape": [0, 0, d]}
    floats = {"one": 1.0, "two": 2.0, "zero": 0.0, "neg_big": -1e9, "f32_min": np.finfo(np.float32).min, "eps": 1e-6,
              "ed_scale": cfg["head"] ** -0.5,
              "gelu_k": 1.702, "exact_f": 16.0, "log_span": np.log(128 / 16), "span_buckets": 16.0}
    return (inits + [_init(k, np.array(v, np.int64)) for k, v in ints.items()]
            + [_init(k, np.array(v, np.float32)) for k, v in floats.items()])


def encdec_merged_decoder(t5: bool = False, heads: int = 4, layers: int = 2, head: int = 16,
                          vocab: int = 96, encoder_mask: bool = False, dtype: int = FLOAT) -> onnx.ModelProto:
    """Optimum's merged decoder of an encoder-decoder model (``decoder_model_merged.onnx`` of
    Whisper/BART; ``t5``: of T5): ``If(use_cache_branch)`` between the decoder that appends to
    its self-attention cache and reads the cross-attention keys/values from the cache
    (``past_key_values.i.encoder.*``) and the one that starts the cache and computes them from
    ``encoder_hidden_states`` once. Whisper/BART: LayerNorm, learned positions, scaled scores, a
    sigmoid-GELU MLP; T5: RMS norm, unscaled scores plus the relative position bias (buckets by
    Log/Div/Cast/Min/Where, a Gather of the bucket table), a ReLU MLP. Tied LM head; the
    weights outer-scope initializers. Batch, lengths symbolic; ``vocab`` the embedding's rows;
    ``encoder_mask``: an ``encoder_attention_mask`` [B, E] input, the lowest float added to the
    cross-attention scores of padded frames (as BART's export writes it); ``dtype`` float16 (not
    with ``t5``): an fp16 export, weights, cache, logits and softmax in float16."""
    cfg = {"t5": t5, "heads": heads, "head": head, "layers": layers, "vocab": vocab, "encoder_mask": encoder_mask,
           "dtype": dtype}
    d = heads * head
    outs = ["logits"] + [f"present.{i}.{s}.{k}" for i in range(layers) for s in ("decoder", "encoder")
                         for k in ("key", "value")]
    node = helper.make_node("If", ["use_cache_branch"], outs, name="optimum::if",
                            then_branch=_ed_branch(True, cfg), else_branch=_ed_branch(False, cfg))
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "S"]),
              helper.make_tensor_value_info("encoder_hidden_states", dtype, ["B", "E", d])]
    inputs += [helper.make_tensor_value_info(f"past_key_values.{i}.{s}.{k}", dtype, ["B", heads, "P" if s == "decoder" else "E", head])
               for i in range(layers) for s in ("decoder", "encoder") for k in ("key", "value")]
    inputs.append(helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]))
    inputs += [helper.make_tensor_value_info("encoder_attention_mask", TensorProto.INT64, ["B", "E"])] * encoder_mask
    outputs = [helper.make_tensor_value_info("logits", dtype, ["B", "S", cfg["vocab"]])]
    outputs += [helper.make_tensor_value_info(o, dtype, ["B", heads, None, head]) for o in outs[1:]]
    read = {x for g in (node.attribute[0].g, node.attribute[1].g) for m in g.node for x in m.input}
    inits = [t for t in _ed_weights(np.random.default_rng(32 + t5), cfg) if t.name in read]  # one style's weights
    inits = inits if dtype == FLOAT else _as_fp16(inits)
    return _model(helper.make_graph([node], "encdec_merged_decoder", inputs, outputs, inits))



def _ms_layer(n: _Emitter, h: str, i: int, pos: dict, cfg: dict) -> tuple[str, list[str]]:
    """One decoder layer as onnxruntime's transformer optimizer fuses it: self-attention one
    MultiHeadAttention (Q/K/V from MatMuls, the Q bias in its packed ``bias``, the decoder cache
    as ``past_key``/``past_value``, presents out; Whisper/BART ``unidirectional``, T5 the
    position bias plus causal mask as ``attention_bias`` and ``scale`` 1), cross-attention one
    MultiHeadAttention whose key/value are the 4-D [B, N, E, H] encoder cache."""
    p, t5 = f"l{i}", cfg["t5"]
    xn = _ed_norm(n, h, f"{p}.n1", cfg, f"{p}_n1")
    q, k, v = (n("MatMul", [xn, f"{p}.w{c}"], [f"{p}_{c}"]) for c in "qkv")
    attrs = {"num_heads": cfg["heads"], **({"scale": 1.0} if t5 else {"unidirectional": 1})}
    ctx = n("MultiHeadAttention", [q, k, v, "" if t5 else f"{p}.qkv_bias", "", pos["self"] if t5 else "",
                                   f"past_key_values.{i}.decoder.key", f"past_key_values.{i}.decoder.value"],
            [f"{p}_sa", f"{p}_present_key", f"{p}_present_value"], domain=MS, **attrs)
    h = n("Add", [h, n("MatMul", [ctx, f"{p}.wo"], [f"{p}_o"])], [f"{p}_r1"])
    cq = n("MatMul", [_ed_norm(n, h, f"{p}.n2", cfg, f"{p}_n2"), f"{p}.cq"], [f"{p}_cq0"])
    cq = cq if t5 else n("Add", [cq, f"{p}.cbq"], [f"{p}_cq"])
    mask = {False: [], True: ["", "encoder_attention_mask"], "bias": ["", "", "enc_bias"]}[cfg.get("encoder_mask", False)]
    cross = n("MultiHeadAttention", [cq, f"past_key_values.{i}.encoder.key", f"past_key_values.{i}.encoder.value", *mask],
              [f"{p}_ca"], domain=MS, num_heads=cfg["heads"], **({"scale": 1.0} if t5 else {}))
    h = n("Add", [h, n("MatMul", [cross, f"{p}.co"], [f"{p}_co"])], [f"{p}_r2"])
    up = n("MatMul", [_ed_norm(n, h, f"{p}.n3", cfg, f"{p}_n3"), f"{p}.w1"], [f"{p}_up"])
    act = n("Relu", [up], [f"{p}_act"]) if t5 else n("Mul", [up, n("Sigmoid", [n("Mul", [up, "gelu_k"], [f"{p}_uk"])],
                                                                    [f"{p}_sig"])], [f"{p}_act"])
    return n("Add", [h, n("MatMul", [act, f"{p}.w2"], [f"{p}_dn"])], [f"{p}_r3"]), [f"ort_{p}_present_key",
                                                                                  f"ort_{p}_present_value"]


def ort_mha_encdec_step(t5: bool = False, heads: int = 4, layers: int = 2, head: int = 16,
                        vocab: int = 96, encoder_mask: bool | str = False) -> onnx.ModelProto:
    """The decoder-with-past of an encoder-decoder model (:func:`encdec_merged_decoder`'s cache
    side) after onnxruntime's transformer optimizer: every attention a com.microsoft
    MultiHeadAttention -- self-attention with the decoder cache as past/present, cross-attention
    over the 4-D (BNSH) encoder cache, T5's relative position bias as ``attention_bias``.
    Outputs: logits and the decoder presents; ``vocab`` the embedding's rows; ``encoder_mask``:
    the encoder's padding (``encoder_attention_mask`` [B, E] int32) as cross-attention's
    ``key_padding_mask`` (``"bias"``: made additive in the graph, its ``attention_bias``)."""
    cfg = {"t5": t5, "heads": heads, "head": head, "layers": layers, "vocab": vocab, "encoder_mask": encoder_mask}
    n = _Emitter("ort")
    pos = _ed_positions(n, True, cfg)
    h = n("Gather", ["embed", "input_ids"], ["tok"])
    h = h if t5 else n("Add", [h, n("Gather", ["pos_embed", pos["qpos"]], ["pe"])], ["h0"])
    if encoder_mask == "bias":  # (1 - mask) * -1e9 as [B, 1, 1, E]
        m = n("Cast", [n("Unsqueeze", ["encoder_attention_mask", "ax12"], ["em4"])], ["emf"], to=FLOAT)
        n.nodes.append(helper.make_node("Mul", [n("Sub", ["one", m], ["em_inv"]), "neg_big"], ["enc_bias"]))
    presents = []
    for i in range(layers):
        h, kv = _ms_layer(n, h, i, pos, cfg)
        presents += kv
    logits = n("MatMul", [_ed_norm(n, h, "final", cfg, "fn"), n("Transpose", ["embed"], ["lm_head"], perm=[1, 0])],
               ["logits"])
    d = heads * head
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "S"])]
    inputs += [helper.make_tensor_value_info(f"past_key_values.{i}.{s}.{k}", FLOAT, ["B", heads, "P" if s == "decoder" else "E", head])
               for i in range(layers) for s in ("decoder", "encoder") for k in ("key", "value")]
    inputs += [helper.make_tensor_value_info("encoder_attention_mask", TensorProto.INT32, ["B", "E"])] * bool(encoder_mask)
    outputs = [helper.make_tensor_value_info(logits, FLOAT, ["B", "S", cfg["vocab"]])]
    outputs += [helper.make_tensor_value_info(x, FLOAT, ["B", heads, "T", head]) for x in presents]
    weights = _ed_weights(np.random.default_rng(34 + t5), cfg)
    weights += [_init(f"l{i}.qkv_bias", np.concatenate([numpy_helper.to_array(next(w for w in weights if w.name == f"l{i}.bq")),
                                                         np.zeros(2 * d, np.float32)])) for i in range(layers)]
    read = {x for m in n.nodes for x in m.input}
    graph = helper.make_graph(n.nodes, "ort_mha_encdec_step", inputs, outputs, [w for w in weights if w.name in read])
    return _model(graph, {MS: 1})



def whisper_merged_decoder() -> onnx.ModelProto:
    """:func:`encdec_merged_decoder` Whisper-style with a 1024-row tied embedding (256 KiB: a
    folded copy of its LM head's transpose would show in the file's size)."""
    return encdec_merged_decoder(vocab=1024)


def t5_merged_decoder() -> onnx.ModelProto:
    """:func:`encdec_merged_decoder` T5-style (relative position bias) with a 1024-row tied embedding."""
    return encdec_merged_decoder(t5=True, vocab=1024)


def ort_mha_t5_step() -> onnx.ModelProto:
    """:func:`ort_mha_encdec_step` of T5: the position bias as MultiHeadAttention's attention_bias."""
    return ort_mha_encdec_step(t5=True)


def ort_transformer_bert() -> onnx.ModelProto:
    """A two-layer BERT encoder as torch.onnx exports it, saved by onnxruntime's transformer
    optimizer (:mod:`ortexport`): EmbedLayerNormalization (its mask index feeding every
    Attention), Attention with packed Q/K/V weights, SkipLayerNormalization, BiasGelu."""
    return ortexport.optimized("bert")


def ort_transformer_bert_fp16() -> onnx.ModelProto:
    """:func:`ort_transformer_bert` converted to float16 by the optimizer (float32 inputs and outputs)."""
    return ortexport.optimized("bert", float16=True)


def ort_transformer_bert_core_ln() -> onnx.ModelProto:
    """:func:`ort_transformer_bert` with the embeddings left unfused: onnxruntime's opset-14
    LayerNormalization (its core fusion) and Attention reading a mask index made by ReduceSum."""
    return ortexport.optimized("bert", variant="no_embed_layernorm")


def ort_transformer_bert_mha() -> onnx.ModelProto:
    """:func:`ort_transformer_bert` with MultiHeadAttention over separate Q/K/V MatMuls and the
    raw [B, S] attention mask."""
    return ortexport.optimized("bert", variant="mha_raw_mask")


def ort_transformer_gpt2() -> onnx.ModelProto:
    """A two-layer GPT-2 decoder with a packed past, saved by onnxruntime's transformer optimizer:
    Attention with ``unidirectional=1``, ``past``/``present`` and a raw attention mask,
    EmbedLayerNormalization, SkipLayerNormalization, FastGelu."""
    return ortexport.optimized("gpt2")


def ort_transformer_gpt2_fp16() -> onnx.ModelProto:
    """:func:`ort_transformer_gpt2` converted to float16 by the optimizer (float32 inputs and outputs)."""
    return ortexport.optimized("gpt2", float16=True)


BUILDERS = {
    f.__name__: f
    for f in (local_functions_cnn, conv_bn_relu_gemm, computed_weights, shape_arith_expand,
              lstm_in_if_unsorted, ort_static_quant_cnn, ort_dynamic_quant_lstm, ort_qdq_cnn, fp16_conv_chain,
              ort_optimized_layernorm14, long_bidirectional_lstm, string_input_mlp, cond_conv_branches,
              keras_lstm_loop, opset23_decoder_layer, ort_optimized_bert, llama_matmulnbits_decoder,
              genai_gqa_decoder_step, grapheme_to_phoneme, siamese_tower, merged_if_decoder, optimum_merged_llama,
              optimum_merged_llama_fp16, genai_int4_decoder, encdec_merged_decoder, ort_mha_encdec_step,
              whisper_merged_decoder, t5_merged_decoder, ort_mha_t5_step, ort_transformer_bert,
              ort_transformer_bert_fp16, ort_transformer_bert_core_ln, ort_transformer_bert_mha,
              ort_transformer_gpt2, ort_transformer_gpt2_fp16)
}  # fmt: skip
