"""A BERT encoder and a GPT-2 decoder as torch.onnx writes them (opset 14), and what onnxruntime's
transformer optimizer makes of them -- the contrib-op models many users ship.

The exports are the graphs the optimizer's pattern fusions are written for: LayerNorm decomposed
(``ReduceMean -> Sub -> Pow -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul -> Add``), BERT's
embeddings (word, position ids sliced from a buffer by the input's length, segment), its additive
mask ``(1 - mask) * -10000`` over ``Q K^T / sqrt(d)``, erf GELU; GPT-2's fused Q/K/V projection
split three ways, a packed ``past`` [2, B, H, P, d] split and concatenated to ``present``, the
causal mask sliced from a lower-triangular buffer by the past length (``Where``), the output
projection a ``Gemm`` between Reshapes, tanh GELU. Weights are seeded.

:func:`optimized` runs ``onnxruntime.transformers.optimizer.optimize_model`` on one of them
(a temporary file, no GPU) and returns the optimized model, optionally converted to float16
(``convert_float_to_float16``, inputs and outputs kept float32 where the optimizer keeps them).
Which contrib ops come out depends on the optimizer's version: :data:`EXPECTED` lists what the
tests assert for the pinned onnxruntime range.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 14
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


class _Graph:
    """Nodes and initializers under construction; ``n(op, inputs, **attrs)`` returns the output name."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.nodes, self.inits, self._count = rng, [], [], 0

    def n(self, op: str, inputs: list[str], outputs: int = 1, **attrs):
        self._count += 1
        if op in ("Squeeze", "Unsqueeze") and "axes" in attrs:  # an input from opset 13
            inputs = [*inputs, self.c(f"axes_{self._count}", attrs.pop("axes"), np.int64)]
        names = [f"{op.lower()}_{self._count}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, names, name=f"{op}_{self._count}", **attrs))
        return names[0] if outputs == 1 else names

    def c(self, name: str, value, dtype=None) -> str:
        """An initializer (a weight or a shape constant); the name is returned."""
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def w(self, name: str, *shape: int, scale: float = 0.1, offset: float = 0.0) -> str:
        return self.c(name, (offset + self.rng.standard_normal(shape) * scale).astype(np.float32))


def _layernorm(g: _Graph, x: str, t: str, d: int, eps: float) -> str:
    """LayerNorm over the last axis as torch exported it before opset 17."""
    mean = g.n("ReduceMean", [x], axes=[-1])
    centred = g.n("Sub", [x, mean])
    var = g.n("ReduceMean", [g.n("Pow", [centred, g.c(f"{t}two", np.float32(2))])], axes=[-1])
    std = g.n("Sqrt", [g.n("Add", [var, g.c(f"{t}eps", np.float32(eps))])])
    scaled = g.n("Mul", [g.n("Div", [centred, std]), g.w(f"{t}gamma", d, offset=1.0)])
    return g.n("Add", [scaled, g.w(f"{t}beta", d)])


def _linear(g: _Graph, x: str, t: str, k: int, n: int) -> str:
    return g.n("Add", [g.n("MatMul", [x, g.w(f"{t}W", k, n)]), g.w(f"{t}b", n)])


def _bert_embeddings(g: _Graph, d: int, vocab: int, positions: int) -> str:
    """word + segment + position embeddings (position ids: a [1, positions] buffer sliced to the
    input's length), then LayerNorm."""
    length = g.n("Unsqueeze", [g.n("Gather", [g.n("Shape", ["input_ids"]), g.c("one", np.int64(1))])], axes=[0])
    ids = g.n("Slice", [g.c("position_ids", np.arange(positions, dtype=np.int64)[None]), g.c("zero1", [0], np.int64),
                        length, g.c("axis1", [1], np.int64), g.c("step1", [1], np.int64)])
    words = g.n("Gather", [g.w("word_embeddings", vocab, d, scale=1.0), "input_ids"])
    segments = g.n("Gather", [g.w("token_type_embeddings", 2, d, scale=1.0), "token_type_ids"])
    summed = g.n("Add", [g.n("Add", [words, segments]), g.n("Gather", [g.w("position_embeddings", positions, d), ids])])
    return _layernorm(g, summed, "emb_ln_", d, 1e-12)


def _bert_self_attention(g: _Graph, x: str, mask: str, t: str, d: int, heads: int) -> str:
    head = d // heads
    split = g.c(f"{t}heads", [0, 0, heads, head], np.int64)
    q = g.n("Transpose", [g.n("Reshape", [_linear(g, x, f"{t}q", d, d), split])], perm=[0, 2, 1, 3])
    k = g.n("Transpose", [g.n("Reshape", [_linear(g, x, f"{t}k", d, d), split])], perm=[0, 2, 3, 1])
    v = g.n("Transpose", [g.n("Reshape", [_linear(g, x, f"{t}v", d, d), split])], perm=[0, 2, 1, 3])
    scores = g.n("Div", [g.n("MatMul", [q, k]), g.c(f"{t}sqrt_d", np.float32(math.sqrt(head)))])
    probs = g.n("Softmax", [g.n("Add", [scores, mask])], axis=-1)
    ctx = g.n("Transpose", [g.n("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    ctx = g.n("Reshape", [ctx, g.c(f"{t}merge", [0, 0, d], np.int64)])
    return _layernorm(g, g.n("Add", [_linear(g, ctx, f"{t}o", d, d), x]), f"{t}ln1_", d, 1e-12)


def _erf_gelu(g: _Graph, x: str, t: str) -> str:
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` as transformers' BERT writes it."""
    erf = g.n("Erf", [g.n("Div", [x, g.c(f"{t}sqrt2", np.float32(math.sqrt(2)))])])
    half = g.n("Mul", [x, g.c(f"{t}half", np.float32(0.5))])
    return g.n("Mul", [half, g.n("Add", [erf, g.c(f"{t}one", np.float32(1))])])


def _bert_mask(g: _Graph) -> str:
    """The extended attention mask [B, 1, 1, S]: 0 where attended, -10000 where masked."""
    wide = g.n("Unsqueeze", [g.n("Unsqueeze", ["attention_mask"], axes=[1])], axes=[2])
    inverted = g.n("Sub", [g.c("mask_one", np.float32(1)), g.n("Cast", [wide], to=FLOAT)])
    return g.n("Mul", [inverted, g.c("mask_filter", np.float32(-10000))])


def bert_export(d: int = 32, heads: int = 4, layers: int = 2, vocab: int = 128, positions: int = 64) -> onnx.ModelProto:
    """A BERT encoder (``layers`` layers, hidden ``d``) with its pooler, as torch.onnx exports it."""
    g = _Graph(np.random.default_rng(21))
    mask, h = _bert_mask(g), _bert_embeddings(g, d, vocab, positions)
    for i in range(layers):
        t = f"l{i}_"
        h = _bert_self_attention(g, h, mask, t, d, heads)
        ffn = _linear(g, _erf_gelu(g, _linear(g, h, f"{t}ffn1", d, 4 * d), t), f"{t}ffn2", 4 * d, d)
        h = _layernorm(g, g.n("Add", [ffn, h]), f"{t}ln2_", d, 1e-12)
    g.nodes.append(helper.make_node("Identity", [h], ["last_hidden_state"]))
    first = g.n("Gather", [h, g.c("first", np.int64(0))], axis=1)
    g.nodes.append(helper.make_node("Tanh", [g.n("Gemm", [first, g.w("pool_W", d, d), g.w("pool_b", d)], transB=1)],
                                    ["pooler_output"]))
    ids = [helper.make_tensor_value_info(n, INT64, ["batch", "sequence"])
           for n in ("input_ids", "token_type_ids", "attention_mask")]
    outputs = [helper.make_tensor_value_info("last_hidden_state", FLOAT, ["batch", "sequence", d]),
               helper.make_tensor_value_info("pooler_output", FLOAT, ["batch", d])]
    return _export(helper.make_graph(g.nodes, "bert", ids, outputs, g.inits))


def _gpt2_past(g: _Graph, t: str, past: str, k: str, v: str) -> tuple[str, str, str]:
    """Split the packed past [2, B, H, P, d] and append this step's keys and values on the length
    axis; present = both stacked again."""
    pk, pv = g.n("Split", [past, g.c(f"{t}split11", [1, 1], np.int64)], outputs=2, axis=0)
    axis0 = g.c(f"{t}axis0", [0], np.int64)
    keys = g.n("Concat", [g.n("Squeeze", [pk, axis0]), k], axis=-2)
    values = g.n("Concat", [g.n("Squeeze", [pv, axis0]), v], axis=-2)
    stacked = [g.n("Unsqueeze", [keys, axis0]), g.n("Unsqueeze", [values, axis0])]
    present = f"present_{t[1:-1]}"  # a graph output itself, as the fusion wants it
    g.nodes.append(helper.make_node("Concat", stacked, [present], name=f"{t}present", axis=0))
    return keys, values, present


def _gpt2_causal(g: _Graph, t: str, q: str, keys: str, scores: str, window: int) -> str:
    """Where(bias[.., P:P+S, :P+S], scores, -10000) with the lower-triangular buffer ``bias``."""
    def length(x: str) -> str:
        axis0 = g.c(f"{t}len_axis{g._count}", [0], np.int64)
        sliced = g.n("Slice", [g.n("Shape", [x]), g.c(f"{t}m2_{g._count}", [-2], np.int64),
                               g.c(f"{t}m1_{g._count}", [-1], np.int64), axis0])
        return g.n("Squeeze", [sliced, axis0])
    total = length(keys)
    axis0 = g.c(f"{t}unsq0", [0], np.int64)
    start = g.n("Unsqueeze", [g.n("Sub", [total, length(q)]), axis0])
    end = g.n("Unsqueeze", [total, axis0])
    bias = g.c(f"{t}bias", np.tril(np.ones((window, window), np.uint8))[None, None])
    rows = g.n("Slice", [bias, start, end, g.c(f"{t}ax2", [2], np.int64), g.c(f"{t}st1", [1], np.int64)])
    cols = g.n("Slice", [rows, g.c(f"{t}zero", [0], np.int64), end, g.c(f"{t}ax3", [3], np.int64), f"{t}st1"])
    return g.n("Where", [g.n("Cast", [cols], to=TensorProto.BOOL), scores, g.c(f"{t}masked", np.float32(-10000))])


def _gpt2_heads(g: _Graph, x: str, t: str, heads: int, head: int) -> str:
    shape = g.c(f"{t}shape{g._count}", [0, 0, heads, head], np.int64)
    return g.n("Transpose", [g.n("Reshape", [x, shape])], perm=[0, 2, 1, 3])


def _gpt2_projection(g: _Graph, ctx: str, t: str, d: int) -> str:
    """The output projection as transformers' Conv1D exports: flatten, Gemm, reshape back."""
    merged = g.n("Reshape", [ctx, g.c(f"{t}merge", [0, 0, d], np.int64)])
    shape = g.n("Shape", [merged])
    dims = [g.n("Unsqueeze", [g.n("Gather", [shape, g.c(f"{t}i{i}", np.int64(i))])], axes=[0]) for i in (0, 1)]
    flat = g.n("Reshape", [merged, g.c(f"{t}flat", [-1, d], np.int64)])
    out = g.n("Gemm", [flat, g.w(f"{t}proj_W", d, d), g.w(f"{t}proj_b", d)])
    return g.n("Reshape", [out, g.n("Concat", [*dims, g.c(f"{t}d", [d], np.int64)], axis=0)])


def _gpt2_attention(g: _Graph, h: str, mask: str, t: str, d: int, heads: int, window: int) -> tuple[str, str]:
    x = _layernorm(g, h, f"{t}ln1_", d, 1e-5)
    q, k, v = g.n("Split", [_linear(g, x, f"{t}qkv", d, 3 * d), g.c(f"{t}split", [d] * 3, np.int64)],
                  outputs=3, axis=2)
    q, k, v = (_gpt2_heads(g, y, t, heads, d // heads) for y in (q, k, v))
    keys, values, present = _gpt2_past(g, t, f"past_{t[1:-1]}", k, v)
    keys_t = g.n("Transpose", [keys], perm=[0, 1, 3, 2])
    scores = g.n("Div", [g.n("MatMul", [q, keys_t]), g.c(f"{t}sqrt_d", np.float32(math.sqrt(d // heads)))])
    masked = g.n("Add", [_gpt2_causal(g, t, q, keys, scores, window), mask])
    ctx = g.n("Transpose", [g.n("MatMul", [g.n("Softmax", [masked], axis=3), values])], perm=[0, 2, 1, 3])
    return g.n("Add", [_gpt2_projection(g, ctx, t, d), h]), present


def _tanh_gelu(g: _Graph, x: str, t: str) -> str:
    """transformers' ``gelu_new``: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    cube = g.n("Mul", [g.n("Pow", [x, g.c(f"{t}three", np.float32(3))]), g.c(f"{t}c", np.float32(0.044715))])
    inner = g.n("Mul", [g.n("Add", [x, cube]), g.c(f"{t}s", np.float32(math.sqrt(2 / math.pi)))])
    half = g.n("Mul", [g.c(f"{t}gh", np.float32(0.5)), x])
    return g.n("Mul", [half, g.n("Add", [g.c(f"{t}g1", np.float32(1)), g.n("Tanh", [inner])])])


def gpt2_export(d: int = 32, heads: int = 4, layers: int = 2, vocab: int = 96, window: int = 64) -> onnx.ModelProto:
    """A GPT-2 decoder with a packed past per layer (``past_i`` [2, B, H, P, d/H], ``present_i``
    out), a float attention mask over past + new tokens and the LM head tied to the embeddings."""
    g = _Graph(np.random.default_rng(22))
    wide = g.n("Unsqueeze", [g.n("Unsqueeze", [g.n("Reshape", ["attention_mask", g.c("mask_shape", [0, -1], np.int64)])],
                                 axes=[1])], axes=[2])
    mask = g.n("Mul", [g.n("Sub", [g.c("mask_one", np.float32(1)), wide]), g.c("mask_filter", np.float32(-10000))])
    wte = g.w("wte", vocab, d, scale=1.0)
    h = g.n("Add", [g.n("Gather", [wte, "input_ids"]), g.n("Gather", [g.w("wpe", window, d), "position_ids"])])
    presents = []
    for i in range(layers):
        t = f"h{i}_"
        h, present = _gpt2_attention(g, h, mask, t, d, heads, window)
        presents.append(present)
        mlp = _linear(g, _tanh_gelu(g, _linear(g, _layernorm(g, h, f"{t}ln2_", d, 1e-5), f"{t}fc", d, 4 * d), t),
                      f"{t}mproj", 4 * d, d)
        h = g.n("Add", [h, mlp])
    head = g.c("wte_t", numpy_helper.to_array(next(i for i in g.inits if i.name == wte)).T.copy())
    g.nodes.append(helper.make_node("MatMul", [_layernorm(g, h, "ln_f_", d, 1e-5), head], ["logits"]))
    cache = [2, "batch", heads, "past", d // heads]
    inputs = [helper.make_tensor_value_info("input_ids", INT64, ["batch", "sequence"]),
              helper.make_tensor_value_info("position_ids", INT64, ["batch", "sequence"]),
              helper.make_tensor_value_info("attention_mask", FLOAT, ["batch", "total"])]
    inputs += [helper.make_tensor_value_info(f"past_{i}", FLOAT, cache) for i in range(layers)]
    outputs = [helper.make_tensor_value_info("logits", FLOAT, ["batch", "sequence", vocab])]
    outputs += [helper.make_tensor_value_info(p, FLOAT, [2, "batch", heads, "total", d // heads]) for p in presents]
    return _export(helper.make_graph(g.nodes, "gpt2", inputs, outputs, g.inits))


def _export(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="pytorch")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


#: What onnxruntime's optimizer (opt_level 0, CPU) writes for each export: contrib ops by
#: count; no ``Softmax`` and no decomposed LayerNorm (``ReduceMean``) is left. Another version may
#: fuse otherwise: 1.23.0 (the lowest the project allows) and 1.32.0 write these counts (and the same for
#: :data:`VARIANTS`); the test that asserts them names the version it ran.
EXPECTED = {"bert": {"EmbedLayerNormalization": 1, "Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2},
            "gpt2": {"EmbedLayerNormalization": 1, "Attention": 2, "SkipLayerNormalization": 4, "FastGelu": 2}}

EXPORTS = {"bert": (bert_export, {"num_heads": 4, "hidden_size": 32}),
           "gpt2": (gpt2_export, {"num_heads": 4, "hidden_size": 32})}


def _options(model_type: str, variant: str):
    """The optimizer's fusion options for a :data:`VARIANTS` name (None: its defaults)."""
    from onnxruntime.transformers.fusion_options import FusionOptions

    if variant == "default":
        return None
    options = FusionOptions(model_type)
    for setting in VARIANTS[variant]:
        if setting == "raw_mask":
            options.use_raw_attention_mask(True)
        else:
            setattr(options, setting[0], setting[1])
    return options


#: Fusion options users set (``FusionOptions``): the embeddings left unfused (the core LayerNorm
#: fusion's ``LayerNormalization`` and a mask index from ``ReduceSum`` instead), MultiHeadAttention
#: over separate Q/K/V MatMuls with the raw [B, S] mask.
VARIANTS = {"default": (), "no_embed_layernorm": (("enable_embed_layer_norm", False),),
            "mha_raw_mask": (("use_multi_head_attention", True), "raw_mask")}


def optimized(model_type: str, float16: bool = False, opt_level: int = 0, variant: str = "default") -> onnx.ModelProto:
    """onnxruntime's transformer optimizer applied to :data:`EXPORTS`' ``model_type`` export (its
    Python fusions only at ``opt_level`` 0, as levels 1 and 99 need torch; no GPU), with the
    fusion options of ``variant`` (:data:`VARIANTS`)."""
    from onnxruntime.transformers import optimizer

    build, sizes = EXPORTS[model_type]
    options = _options(model_type, variant)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "export.onnx"
        onnx.save(build(), path)
        result = optimizer.optimize_model(str(path), model_type=model_type, opt_level=opt_level, use_gpu=False,
                                          optimization_options=options, **sizes)
        if float16:
            result.convert_float_to_float16(keep_io_types=True)
        # saved as a user saves it: the file gets the com.microsoft opset import the model in
        # memory lacks (OnnxModel.save adds it)
        result.save_model_to_file(str(path))
        return onnx.load(path)
