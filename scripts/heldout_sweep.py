"""Held-out sweep of the whole pipeline over variants of the corpus's modern-transformer models.

The corpus (tests/realworld) fuses one model of each class issue-level work targets: opset-23
decoder layers (RMSNormalization, RotaryEmbedding, Attention), onnxruntime-optimized BERT
(contrib Attention/MultiHeadAttention, SkipLayerNormalization, FusedMatMul, BiasGelu/FastGelu),
MatMulNBits decoders (LLaMA-style, GenAI's GroupQueryAttention step), Optimum merged
``If(use_cache_branch)`` decoders, a shared-weight tower and string-input models. This script
builds *variants* of them from ``tests/realworld/built.py``'s builders (their keywords: heads,
key/value heads -- GQA ratios 1, 2, 4 and MQA --, hidden and head size, layers, rotary
interleaved or partial, causal or an additive mask, float16, MatMulNBits bits 4/8 with and
without zero points and block sizes 16/32/128; batch > 1 as a pin), and forms no corpus entry
had before: onnxruntime-genai's int4 CPU decoder (GQA lengths computed from the attention mask,
the SkipSimplifiedLayerNormalization residual chain, packed QKV with a bias, prefill, decode,
a padded batch, a static cache, partial rotary, a GatherBlockQuantized embedding, softcap and a
local window, smooth softmax and head sinks, rotary by RotaryEmbedding nodes), Optimum's
merged encoder-decoder decoders (Whisper/BART and T5: self-attention cache plus cross-attention
keys/values computed once or read from the cache, T5's relative position buckets, the encoder
padding, a 1024-row tied embedding, float16) and their decoder step as onnxruntime's optimizer
writes it (MultiHeadAttention with past/present, 4-D cross key/value, ``attention_bias``,
``key_padding_mask``); and for each one:

* fuses it pinned (``api.fuse_to_file`` with ``input_shapes``) and unpinned;
* reads the heavy-node coverage (share of heavy nodes in blocks; floor 90 %) and the blocks;
* compares the pinned fused file's size with the original's: it must stay within
  ``1.05 x original + metadata`` (8 KiB of framing per block, 256 bytes per body node, as
  tests/realworld/test_realworld.py counts it);
* runs ``api.check`` on the pinned fused file (its pins, the value-carrying inputs fixed);
* runs the reference (``onnxmlu.runtime.reference_session``: onnxruntime, optimizations off)
  and each fused file through ``onnxmlu.InferenceSession`` and through plain onnxruntime with only
  the custom-op library registered, at the pinned shape, at batch + 1 and at every other
  symbolic size doubled (``corpus.other_shapes``), and reports the largest absolute error;
  a float32 output must match to rtol 1e-4 and atol ``1e-4 x max(1, max|reference output|)``
  (float32 sums round relative to the magnitudes summed: a 512-wide layer whose outputs reach
  400 differs by 4e-4 where an output is near 0), a float16 one to rtol 2^-10 likewise;
* where a variant misses and its kernel quantizes activations (MatMulNBits at accuracy_level 4),
  judges the output again by ``onnxmlu check``'s rule for them
  (:func:`onnxmlu.tools.verify.judge_by_twin`, the sweep's tolerances): against the same model
  with float activations (accuracy_level 0), the fused output must be within the sweep's bound
  plus ``max|orig - float|`` of the reference, and on average no further from float than 1.25x
  the reference is. Such a pass reads ``ok (int8 rounding)``, with the figures per shape: the
  error, ``max|orig - float|`` and ``max|fused - float|``.

One row per variant: blocks (pinned/unpinned), coverage % (pinned/unpinned), size ratio and
the allowance it is held to, the max abs error per shape (over both fused files and both
runtimes), and the verdict (``ok``, ``ok (int8 rounding)`` or what failed). Exit status 1 when
any variant fails.

    .venv/bin/python scripts/heldout_sweep.py                 # every variant (about 60 s on 2 cores)
    .venv/bin/python scripts/heldout_sweep.py --only nbits    # variants whose name contains "nbits"
    .venv/bin/python scripts/heldout_sweep.py --list
    .venv/bin/python scripts/heldout_sweep.py --flips nbits_b8_blk32 batch+1   # where a miss starts
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import onnxmlu
from onnxmlu import api
from onnxmlu.ir import iter_graphs
from onnxmlu.runtime import custom_ops_library, reference_session
from onnxmlu.schema import body_model, is_fusion_block
from onnxmlu.sessions import new_options
from onnxmlu.tools.verify import FloatTwin, compare_outputs, judge_by_twin

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "realworld"))
import built  # noqa: E402
import corpus  # noqa: E402

HEAVY_FLOOR, SIZE_FACTOR = 0.9, 1.05
FRAMING_BYTES_PER_BLOCK, NODE_BYTES = 8 << 10, 256
RTOL = ATOL = 1e-4
FP16_RTOL = 2.0 ** -10


@dataclass(frozen=True)
class Variant:
    name: str
    builder: str
    kwargs: dict = field(default_factory=dict)
    pins: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)

    def case(self) -> corpus.ModelCase:
        return corpus.ModelCase(self.name, "built", self.builder, self.pins, ("symbolic-dims",), self.values)


def _opset23(name: str, batch: int = 1, **kw) -> Variant:
    hidden, heads, kv = kw.get("hidden", 64), kw.get("heads", 8), kw.get("kv_heads", 2)
    head, seq, past = hidden // heads, 4, 12
    pins = {"x": [batch, seq, hidden], "position_ids": [batch, seq], "past_key": [batch, kv, past, head],
            "past_value": [batch, kv, past, head]}
    if kw.get("causal", True) is False:
        pins["attn_mask"] = [batch, 1, seq, seq + past]
    return Variant(name, "opset23_decoder_layer", kw, pins, {"position_ids": (0, 128)})


def _bert(name: str, d: int, heads: int, batch: int = 1) -> Variant:
    return Variant(name, "ort_optimized_bert", {"d": d, "heads": heads}, {"x": [batch, 16, d], "mask": [batch, 16]},
                   {"mask": (0, 2)})


def _nbits(name: str, batch: int = 1, **kw) -> Variant:
    return Variant(name, "llama_matmulnbits_decoder", kw, {"input_ids": [batch, 16], "position_ids": [batch, 16]},
                   {"input_ids": (0, 96), "position_ids": (0, 64)})


def _genai(name: str, heads: int, kv: int) -> Variant:
    head = 64 // heads
    cache = {f"past_{k}_{i}": [1, kv, 8, head] for i in range(2) for k in ("key", "value")}
    return Variant(name, "genai_gqa_decoder_step", {"heads": heads, "kv": kv},
                   {"input_ids": [1, 1], "seqlens_k": [1], **cache},
                   {"input_ids": (0, 96), "seqlens_k": 4, "total_sequence_length": 5})


def _genai_int4(name: str, batch: int = 1, past: int = 8, seq: int = 1, mask=1, total: int | None = None,
                **kw) -> Variant:
    """A GenAI-builder int4 decoder (:func:`built.genai_int4_decoder`): decode (one new token)
    or prefill (``past`` 0); the mask all ones over past + new tokens (``mask`` a range:
    random 0/1, a right-padded batch's lengths); ``total``: a mask that long over a static
    cache of ``past`` rows (the buffer GenAI shares between past and present)."""
    heads, kv, layers = kw.get("heads", 4), kw.get("kv", 2), kw.get("layers", 2)
    cache = {f"past_key_values.{i}.{k}": [batch, kv, past, 64 // heads] for i in range(layers) for k in ("key", "value")}
    pins = {"input_ids": [batch, seq], "attention_mask": [batch, total or past + seq], **cache}
    values = {"input_ids": (0, 96), "attention_mask": mask}
    if kw.get("gqa", {}).get("rotary_op"):  # the positions of the new tokens
        pins["position_ids"], values["position_ids"] = [batch, seq], (past, past + 1) if seq == 1 else (0, 1)
    return Variant(name, "genai_int4_decoder", kw, pins, values)


def _encdec(name: str, cache: bool = True, batch: int = 1, past: int = 5, **kw) -> Variant:
    """An encoder-decoder merged decoder (:func:`built.encdec_merged_decoder`) at a decode step
    over a ``past``-row decoder cache (``cache``; T5's log-spaced buckets start at 16) or at the first step (4 tokens, the cache inputs
    the one-row dummies Optimum feeds); 6 encoder frames."""
    heads, head, layers = kw.get("heads", 4), kw.get("head", 16), kw.get("layers", 2)
    seq, past = (1, past) if cache else (4, 1)
    pins = {"input_ids": [batch, seq], "encoder_hidden_states": [batch, 6, heads * head]}
    pins |= {f"past_key_values.{i}.{s}.{k}": [batch, heads, past if s == "decoder" else 6, head]
             for i in range(layers) for s in ("decoder", "encoder") for k in ("key", "value")}
    values = {"input_ids": (0, 96), "use_cache_branch": cache}
    if kw.get("encoder_mask"):
        pins["encoder_attention_mask"], values["encoder_attention_mask"] = [batch, 6], (0, 2)
    return Variant(name, "encdec_merged_decoder", kw, pins, values)


def _ms_step(name: str, batch: int = 1, past: int = 5, **kw) -> Variant:
    """:func:`built.ort_mha_encdec_step` (MultiHeadAttention self and cross) at one new token."""
    heads, head, layers = kw.get("heads", 4), kw.get("head", 16), kw.get("layers", 2)
    pins = {"input_ids": [batch, 1]} | {f"past_key_values.{i}.{s}.{k}": [batch, heads, past if s == "decoder" else 6, head]
                                        for i in range(layers) for s in ("decoder", "encoder") for k in ("key", "value")}
    values = {"input_ids": (0, 96)}
    if kw.get("encoder_mask"):
        pins["encoder_attention_mask"], values["encoder_attention_mask"] = [batch, 6], (0, 2)
    return Variant(name, "ort_mha_encdec_step", kw, pins, values)


def _optimum(name: str, dtype: int = onnx.TensorProto.FLOAT, heads: int = 4, kv: int = 2, layers: int = 2) -> Variant:
    cache = {f"past_key_values.{i}.{k}": [1, kv, 5, 64 // heads] for i in range(layers) for k in ("key", "value")}
    return Variant(name, "optimum_merged_llama", {"dtype": dtype, "heads": heads, "kv": kv, "layers": layers},
                   {"input_ids": [1, 3], "attention_mask": [1, 8], "position_ids": [1, 3], **cache},
                   {"input_ids": (0, 96), "attention_mask": 1, "position_ids": (5, 8), "use_cache_branch": True})


def _merged_if(name: str, heads: int, dim: int) -> Variant:
    return Variant(name, "merged_if_decoder", {"heads": heads, "dim": dim},
                   {"input_ids": [1, 3], "past_key": [1, heads, 5, dim], "past_value": [1, heads, 5, dim]},
                   {"input_ids": (0, 64)})


def variants() -> list[Variant]:
    """Every variant swept: per class, sizes and forms its corpus entry does not have."""
    fp16 = onnx.TensorProto.FLOAT16
    return [
        _opset23("o23_mha_kv8", heads=8, kv_heads=8), _opset23("o23_gqa2_kv4", heads=8, kv_heads=4),
        _opset23("o23_mqa_kv1", heads=8, kv_heads=1), _opset23("o23_head16_h4", heads=4, kv_heads=2),
        _opset23("o23_hidden128", hidden=128, heads=8, kv_heads=2, ffn=256), _opset23("o23_batch2", batch=2),
        _opset23("o23_interleaved", interleaved=True), _opset23("o23_partial_rot4", rotary_dim=4),
        _opset23("o23_interleaved_partial", interleaved=True, rotary_dim=4), _opset23("o23_mask", causal=False),
        _opset23("o23_softcap_scale", attention={"softcap": 2.0, "scale": 0.5}),
        _opset23("o23_mask_softcap_mqa", causal=False, kv_heads=1, attention={"softcap": 5.0}),
        _bert("bert_d64_h8", 64, 8), _bert("bert_d48_h3", 48, 3), _bert("bert_d32_h1_b2", 32, 1, batch=2),
        _nbits("nbits_b4_blk16", block=16), _nbits("nbits_b4_blk32_nozp", zero_points=False),
        _nbits("nbits_b4_blk128_d128", d=128, block=128), _nbits("nbits_b8_blk32", bits=8),
        _nbits("nbits_b8_blk32_nozp", bits=8, zero_points=False), _nbits("nbits_b8_blk16_b2", bits=8, block=16, batch=2),
        _nbits("nbits_h8", heads=8), _nbits("nbits_d256_size", d=256, heads=8),
        _opset23("o23_hidden512_size", hidden=512, heads=8, kv_heads=2, ffn=1024), _nbits("nbits_b4_blk16_acc0", block=16, accuracy_level=0),
        _nbits("nbits_b8_blk32_acc0", bits=8, accuracy_level=0),
        _nbits("nbits_b4_blk128_d128_acc0", d=128, block=128, accuracy_level=0),
        _genai("genai_mha_kv4", 4, 4),
        _genai_int4("gb_int4_decode"), _genai_int4("gb_int4_prefill", past=0, seq=4),
        _genai_int4("gb_int4_qkv_bias", bias=True), _genai_int4("gb_int4_mqa_b2", batch=2, kv=1),
        _genai_int4("gb_int4_partial_rot_h2", heads=2, kv=1, rotary_dim=16),
        _genai_int4("gb_int4_embedding", int4_embedding=True),
        _genai_int4("gb_int4_prefill_mask_b2", batch=2, past=0, seq=4, mask=(0, 2)),
        _genai_int4("gb_int4_static_cache", past=16, total=9),
        _genai_int4("gb_int4_softcap_window", gqa={"softcap": 30.0, "local_window_size": 4}),
        _genai_int4("gb_int4_smooth_softmax", gqa={"smooth_softmax": 1}),
        _genai_int4("gb_int4_head_sink_prefill", past=0, seq=4, gqa={"head_sink": True}),
        _genai_int4("gb_int4_head_sink_window", gqa={"head_sink": True, "local_window_size": 4}),
        _genai_int4("gb_int4_rotary_op", gqa={"rotary_op": True}), _genai("genai_mqa_kv1", 4, 1), _genai("genai_h2_kv1", 2, 1),
        _optimum("optimum_mha_kv4", kv=4), _optimum("optimum_mqa_kv1", kv=1), _optimum("optimum_1layer", layers=1),
        _optimum("optimum_fp16_kv1", dtype=fp16, kv=1),
        _encdec("whisper_cache"), _encdec("whisper_first", cache=False), _encdec("whisper_h8_b2", heads=8, head=8, batch=2),
        _encdec("bart_encoder_mask_b2", batch=2, encoder_mask=True),
        _encdec("bart_encoder_mask_first", cache=False, encoder_mask=True),
        _encdec("whisper_fp16_cache", dtype=onnx.TensorProto.FLOAT16),
        _encdec("whisper_fp16_first_mask", cache=False, encoder_mask=True, dtype=onnx.TensorProto.FLOAT16), _encdec("t5_cache", t5=True), _encdec("t5_first", cache=False, t5=True), _encdec("t5_1layer", t5=True, layers=1),
        _encdec("t5_past40_log_buckets", t5=True, past=40),
        _ms_step("ortmha_whisper_step"), _ms_step("ortmha_whisper_h8_b2", heads=8, head=8, batch=2),
        _encdec("whisper_tied_vocab1024", vocab=1024), _ms_step("ortmha_whisper_tied_vocab1024", vocab=1024),
        _ms_step("ortmha_t5_step", t5=True), _ms_step("ortmha_t5_past40", t5=True, past=40),
        _ms_step("ortmha_bart_encoder_mask_b2", batch=2, encoder_mask=True),
        _ms_step("ortmha_t5_encoder_mask", t5=True, encoder_mask=True),
        _ms_step("ortmha_t5_encoder_bias_b2", t5=True, encoder_mask="bias", batch=2),
        _merged_if("merged_if_h4_d8", 4, 8), _merged_if("merged_if_h1_d32", 1, 32),
        Variant("siamese_b2", "siamese_tower", {}, {"left": [2, 3, 32, 32], "right": [2, 3, 32, 32]}),
        Variant("g2p_n1", "grapheme_to_phoneme", {}, {"letters": [1, 8]}),
        Variant("string_input", "string_input_mlp", {}, {}, {"text": "hello"}),
    ]  # fmt: skip


def _metadata_bytes(fused: onnx.ModelProto) -> int:
    """Each block's framing and its body's node records (as the corpus test counts them)."""
    bodies = [body_model(n) for g in iter_graphs(fused.graph) for n in g.node if is_fusion_block(n)]
    return FRAMING_BYTES_PER_BLOCK * len(bodies) + NODE_BYTES * sum(len(b.graph.node) for b in bodies)


def _fixed(variant: Variant, model: onnx.ModelProto) -> dict | None:
    """The inputs whose value the variant fixes (as ``--inputs``): fuse's probe runs them."""
    names = [n for n, v in variant.values.items() if not isinstance(v, tuple)]
    feeds = corpus.feeds(variant.case(), model, 0)
    return {n: np.asarray(feeds[n], dtype=str) if feeds[n].dtype == object else feeds[n] for n in names} or None


def _tolerances(want: np.ndarray) -> tuple[float, float]:
    """(atol, rtol) of an output (module docstring): atol scaled by its magnitude."""
    rtol = FP16_RTOL if want.dtype == np.float16 else RTOL
    return ATOL * max(1.0, float(np.max(np.abs(want.astype(np.float64)), initial=0.0))), rtol


def _error(got: np.ndarray, want: np.ndarray) -> tuple[float, bool]:
    """Largest absolute difference and whether it is within tolerance (strings: equal)."""
    want, got = np.asarray(want), np.asarray(got)
    if want.dtype.kind in "OUS":
        return (0.0 if np.array_equal(got, want) else float("inf")), bool(np.array_equal(got, want))
    a, b = got.astype(np.float64), want.astype(np.float64)
    atol, rtol = _tolerances(want)
    return float(np.max(np.abs(a - b), initial=0.0)), bool(np.allclose(a, b, rtol=rtol, atol=atol))


def _shapes(variant: Variant, model: onnx.ModelProto) -> list[tuple[str, dict | None]]:
    return [("pin", None), *corpus.other_shapes(variant.case(), model)]


def _sessions(fused: list[Path]) -> list[tuple[str, object]]:
    """Each fused file through ``onnxmlu.InferenceSession`` and through plain onnxruntime with
    only the custom-op library registered."""
    plain = new_options()
    plain.register_custom_ops_library(custom_ops_library())
    return [(f"{p.stem.split('.')[-1]}/{kind}", make(str(p))) for p in fused for kind, make in
            (("onnxmlu", onnxmlu.InferenceSession),
             ("ort", lambda path: ort.InferenceSession(path, plain, providers=["CPUExecutionProvider"])))]


def _compare(variant: Variant, src: Path, fused: list[Path], model: onnx.ModelProto) -> tuple[dict, list, list]:
    """Max abs error per shape over every fused file and both runtimes; the failures named
    (per shape and output: the sessions that miss, the worst error and the output's scale);
    the misses the rule for run-time int8 activation rounding passes (:func:`_miss`), apart."""
    ref, sessions, twin = reference_session(str(src)), _sessions(fused), FloatTwin.of(model)
    names = [o.name for o in ref.get_outputs()]
    errors, failures, rounded = {}, [], []
    for label, shapes in _shapes(variant, model):
        feeds = corpus.feeds(variant.case(), model, 0, shapes)
        try:
            want = ref.run(names, feeds)
        except Exception as error:  # noqa: BLE001 - a shape the original itself refuses: not the fused model's fault
            errors[label] = f"ref refuses ({type(error).__name__})"
            if label == "pin":
                failures.append("the original refuses its pins: not a valid variant")
            continue
        got = {tag: sess.run(names, feeds) for tag, sess in sessions}
        worst = 0.0
        for i, name in enumerate(names):
            results = {tag: _error(outs[i], want[i]) for tag, outs in got.items()}
            worst = max([worst, *(err for err, _ in results.values())])
            missed = {tag: got[tag][i] for tag, (_, ok) in results.items() if not ok}
            if missed:
                text, passed = _miss(f"{label} {name}", want[i], missed, twin, feeds)
                (rounded if passed else failures).append(text)
        errors[label] = f"{worst:.1e}"
    return errors, failures, rounded


def _miss(where: str, want: np.ndarray, missed: dict, twin: FloatTwin | None, feeds: dict) -> tuple[str, bool]:
    """A miss in words (the worst error, the output's scale, the sessions) and whether ``check``'s
    rule for outputs downstream of run-time int8 activation rounding passes it in every session
    that missed (:func:`~onnxmlu.tools.verify.judge_by_twin`, with the sweep's tolerances);
    the figures of that rule with it."""
    name = where.split(" ")[-1]
    errors = {tag: _error(out, want)[0] for tag, out in missed.items()}
    scale = float(np.max(np.abs(np.asarray(want, np.float64)), initial=0.0))
    text = f"{where}: err {max(errors.values()):.2g} (|ref| <= {scale:.3g}) in {len(missed)}/4 ({next(iter(missed))}...)"
    if twin is None or np.asarray(want).dtype.kind != "f":
        return text, False
    float_out = twin.run([name], feeds)[0]
    atol, rtol = _tolerances(np.asarray(want))
    judged = [judge_by_twin(compare_outputs([name], [out], [want], atol, rtol)[0], out, want, float_out,
                            (atol, rtol, 2.0)) for out in missed.values()]
    worst = max(judged, key=lambda d: (not d.ok, d.max_abs))
    figures = (f"|orig-float| max {worst.float_twin_orig:.2g} mean {worst.float_twin_orig_mean:.2g}, "
               f"|fused-float| max {worst.float_twin_fused:.2g} mean {worst.float_twin_fused_mean:.2g}")
    if all(d.ok for d in judged):
        return f"{where}: err {worst.max_abs:.2g}, {figures}", True
    return f"{text}; {figures}", False


def _scale(src: Path, variant: Variant, model: onnx.ModelProto) -> float:
    """The largest magnitude of the reference's numeric outputs at the pins (at least 1)."""
    outs = reference_session(str(src)).run(None, corpus.feeds(variant.case(), model, 0))
    return max([1.0, *(float(np.max(np.abs(o.astype(np.float64)), initial=0.0)) for o in outs if o.dtype.kind == "f")])


def _check(variant: Variant, src: Path, fused: Path, model: onnx.ModelProto, scale: float):
    """``onnxmlu check`` with the fuse pins, its atol scaled as the sweep's (``1e-4 x`` the
    outputs' magnitude); the inputs whose values matter (token ids, a mask, lengths) fixed to
    the variant's (as ``--inputs``)."""
    feeds = corpus.feeds(variant.case(), model, 0)
    fixed = {n: np.asarray(feeds[n], dtype=str) if feeds[n].dtype == object else feeds[n] for n in variant.values}
    return api.check(str(src), str(fused), input_shapes=variant.pins or None, inputs=fixed or None,
                     atol=ATOL * scale)


def _fuse(src: Path, out: Path, pins: dict | None, inputs: dict | None) -> tuple[int, float]:
    result = api.fuse_to_file(str(src), out, input_shapes=pins or None, inputs=inputs)
    return corpus.node_counts(onnx.load(out).graph)[0], result.coverage.heavy_share


def sweep_one(variant: Variant, tmp: Path) -> dict:
    """Fuse ``variant`` pinned and unpinned, then its coverage, size and outputs."""
    model = getattr(built, variant.builder)(**variant.kwargs)
    src = tmp / f"{variant.name}.onnx"
    onnx.save(model, src)
    pinned, unpinned = tmp / f"{variant.name}.pinned.onnx", tmp / f"{variant.name}.unpinned.onnx"
    blocks_p, share_p = _fuse(src, pinned, variant.pins, _fixed(variant, model))
    blocks_u, share_u = _fuse(src, unpinned, None, None)
    allowed = SIZE_FACTOR * src.stat().st_size + _metadata_bytes(onnx.load(pinned))
    errors, failures, rounded = _compare(variant, src, [pinned, unpinned], model)
    checked = _check(variant, src, pinned, model, _scale(src, variant, model))
    if not checked.ok:
        failures.append(f"check fails: {[(d.name, f'{d.max_abs:.2g}') for d in checked.diffs if not d.ok][:3]}")
    if min(share_p, share_u) < HEAVY_FLOOR:
        failures.append(f"coverage {share_p:.0%}/{share_u:.0%} < {HEAVY_FLOOR:.0%}")
    if pinned.stat().st_size > allowed:
        failures.append(f"size {pinned.stat().st_size} > {allowed:.0f}")
    return {"blocks": f"{blocks_p}/{blocks_u}", "coverage": f"{share_p:.0%}/{share_u:.0%}",
            "size": f"{pinned.stat().st_size / src.stat().st_size:.3f} (<= {allowed / src.stat().st_size:.3f})",
            "errors": errors, "verdict": "; ".join(failures) or _ok(rounded)}


def _ok(rounded: list[str]) -> str:
    """The verdict of a variant that passed: ``ok``, or ``ok (int8 rounding)`` with the misses
    the rule for run-time int8 activation rounding passed."""
    return f"ok (int8 rounding): {'; '.join(rounded)}" if rounded else "ok"


def _outputs(model: onnx.ModelProto, names: list[str], feeds: dict) -> dict:
    """The tensors ``names`` of ``model`` (made graph outputs), onnxruntime optimizations off."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    options = new_options("disable", model=probe)
    return dict(zip(names, ort.InferenceSession(probe.SerializeToString(), options).run(None, feeds)))


def flips(variant: Variant, label: str) -> None:
    """Per MatMulNBits of ``variant`` at shape ``label``: how far its A is between the original
    and the rewritten model (``api.rewrite``, unfused) and how many of A's per-block int8 values
    (what the kernel at accuracy_level 4 rounds A to) differ -- where an ulp upstream crosses a
    rounding boundary."""
    model = getattr(built, variant.builder)(**variant.kwargs)
    feeds = corpus.feeds(variant.case(), model, 0, dict(_shapes(variant, model))[label])
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    names = list(dict.fromkeys(n.input[0] for n in nodes))
    ref, rewritten = _outputs(model, names, feeds), _outputs(api.rewrite(model)[0], names, feeds)
    for node in nodes:
        block = next(a.i for a in node.attribute if a.name == "block_size")
        a, b = (x[node.input[0]].reshape(-1, x[node.input[0]].shape[-1] // block, block) for x in (ref, rewritten))
        q = [np.round(x * (np.float32(127) / np.abs(x).max(-1, keepdims=True))) for x in (a, b)]
        print(f"{node.name}: A differs by {np.abs(a - b).max():.2g}, {int((q[0] != q[1]).sum())} int8 values differ")


def _row(name: str, row: dict, seconds: float) -> str:
    errors = " ".join(f"{k}:{v}" for k, v in row.get("errors", {}).items())
    return (f"| {name} | {row.get('blocks', '-')} | {row.get('coverage', '-')} | {row.get('size', '-')} | {errors} "
            f"| {row['verdict'].replace('|', chr(92) + '|')} | {seconds:.0f} |")  # |x| in a cell: escaped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="sweep only the variants whose name contains this text")
    parser.add_argument("--list", action="store_true", help="list the variants and exit")
    parser.add_argument("--flips", nargs=2, metavar=("VARIANT", "SHAPE"),
                        help="trace a MatMulNBits variant's int8 rounding of A at SHAPE (pin, batch+1, 'size x2')")
    args = parser.parse_args(argv)
    if args.flips:
        flips(next(v for v in variants() if v.name == args.flips[0]), args.flips[1])
        return 0
    chosen = [v for v in variants() if args.only in v.name]
    if args.list:
        print("\n".join(f"{v.name}: {v.builder}({v.kwargs}) pins {v.pins}" for v in chosen))
        return 0
    print("| variant | blocks p/u | coverage p/u | size ratio (allowed) | max abs err per shape | verdict | s |")
    print("|---|---|---|---|---|---|---|")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="onnxmlu-heldout-") as tmp:
        for variant in chosen:
            start = time.perf_counter()
            try:
                row = sweep_one(variant, Path(tmp))
            except Exception as error:  # noqa: BLE001 - a crash is a row of the table, not the end of the sweep
                row = {"verdict": f"crash: {type(error).__name__}: {str(error).splitlines()[0][:160]}"}
            failed += not row["verdict"].startswith("ok")
            print(_row(variant.name, row, time.perf_counter() - start), flush=True)
    print(f"{len(chosen) - failed} of {len(chosen)} variants ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
