"""The sympy-free polynomial tier of output dims (onnxmlu/collapse/polydims.py): each rule against
onnxruntime's symbolic engine, whose text the tier must equal wherever it settles an output (a
wrong dim fails a run in the library), sympy's own printing of polynomials, and a KV-cache
decoder fused without importing sympy.

Bodies are built in code: one or two nodes on symbolic inputs, the output's shape undeclared.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import api
from onnxmlu.collapse import dims as tiers_module
from onnxmlu.collapse import polydims as poly

sys.path.insert(0, str(Path(__file__).resolve().parent / "realworld"))
import corpus  # noqa: E402
from ci import unavailable  # noqa: E402
from test_output_dims import kv_model  # noqa: E402

from onnxmlu.schema import body_model, is_fusion_block  # noqa: E402

F = TensorProto.FLOAT


def _body(nodes, inputs, inits=(), outputs=("y",), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "b", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(o, F, None) for o in outputs],
                              [numpy_helper.from_array(np.array(v, dtype), n) for n, v, dtype in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _texts(body: onnx.ModelProto) -> tuple[str | None, str | None, bool]:
    """(the text with the tier, the engine's text without it, whether the engine ran with it)."""
    tiers, ran = tiers_module._INFERENCES, []
    engine = tiers_module._symbolic_inferred_dims
    try:
        tiers_module._INFERENCES = (tiers[0], tiers[1], (lambda light: (ran.append(1), engine(light))[1], False))
        mine = tiers_module.output_dims_text(body)
        tiers_module._INFERENCES = (tiers[0], tiers[2])
        theirs = tiers_module.output_dims_text(body)
    finally:
        tiers_module._INFERENCES = tiers
    return mine, theirs, bool(ran)


I64 = np.int64
I64_TYPE = TensorProto.INT64
X4 = [("x", F, ["n", 3, "h", "w"])]
SEQ = [("x", F, ["b", "s", 64])]
DOUBLE = helper.make_node("Concat", ["x", "x"], ["xx"], axis=1)  # [b, 2s, 64]: a sum onnx's inference cannot carry
KV = [("past", F, ["b", 2, "p", 8]), ("new", F, ["b", 2, "s", 8])]
CASES = {
    # rule: (nodes, inputs, initializers, the settled text, or None where the tier leaves it to the engine)
    "concat_kv": ([helper.make_node("Concat", ["past", "new"], ["y"], axis=2)], KV, (), "i0.0,2,i0.2+i1.2,8"),
    "relu_same": ([helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Concat", ["t", "t"], ["y"], axis=1)],
                  SEQ, (), "i0.0,2*i0.1,64"),
    "conv_stride1": ([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], X4,
                     [("w", np.zeros((4, 3, 3, 3)), np.float32)], "i0.0,4,i0.2,i0.3"),
    "conv_stride2": ([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])], X4,
                     [("w", np.zeros((4, 3, 3, 3)), np.float32)], "?"),
    # H/2 x W/2 merged by Reshape: a product of two floors, written factored or not: no polynomial
    "reshape_strided": ([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
                         helper.make_node("Reshape", ["c", "shape"], ["y"])], X4,
                        [("w", np.zeros((4, 3, 3, 3)), np.float32), ("shape", [0, 4, -1], I64)], "?"),
    "pool_valid": ([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3])], X4, (), "i0.0,3,i0.2-2,i0.3-2"),
    "pad_const": ([helper.make_node("Pad", ["x", "pads"], ["y"])], X4,
                  [("pads", [0, 0, 1, 0, 0, 0, 2, 192], I64)], "i0.0,3,i0.2+3,i0.3+192"),
    "reshape_heads": ([DOUBLE, helper.make_node("Reshape", ["xx", "shape"], ["y"])], SEQ,
                      [("shape", [0, 0, 4, 16], I64)], "i0.0,2*i0.1,4,16"),
    "reshape_minus1": ([helper.make_node("Reshape", ["x", "shape"], ["y"])], SEQ,
                       [("shape", [0, -1, 16], I64)], "i0.0,4*i0.1,16"),
    "reshape_merge": ([helper.make_node("Reshape", ["x", "shape"], ["y"])], SEQ,
                      [("shape", [-1, 64], I64)], "i0.0*i0.1,64"),
    "shape_arith": ([helper.make_node("Shape", ["x"], ["sh"]),
                     helper.make_node("Gather", ["sh", "one"], ["s1"]),
                     helper.make_node("Mul", ["s1", "two"], ["s2"]),
                     helper.make_node("Concat", ["first", "s2", "half"], ["shape"], axis=0),
                     helper.make_node("Reshape", ["x", "shape"], ["y"])], SEQ,
                    [("one", [1], I64), ("two", [2], I64), ("first", [-1], I64), ("half", [32], I64)],
                    "i0.0,2*i0.1,32"),
    "resize_whole": ([helper.make_node("Resize", ["x", "", "scales"], ["y"])], X4,
                     [("scales", [1, 1, 2, 2], np.float32)], "i0.0,3,2*i0.2,2*i0.3"),
    "matmul": ([DOUBLE, helper.make_node("MatMul", ["xx", "w"], ["y"])], SEQ,
               [("w", np.zeros((64, 8)), np.float32)], "i0.0,2*i0.1,8"),
    "transpose_flatten": ([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
                           helper.make_node("Flatten", ["t"], ["y"], axis=2)], SEQ, (), None),  # onnx: unk, the engine renames all
    # p and s broadcast together: the engine merges s into p (the first input's) for the body
    # Range(0.0, s, 1.0) over the sequence: floats read as ints, Max(s, 0) is s for a positive s
    "range_positions": ([DOUBLE, helper.make_node("Shape", ["xx"], ["sh"]),
                         helper.make_node("Gather", ["sh", "one"], ["n"]),
                         helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
                         helper.make_node("Range", ["start", "nf", "step"], ["y"])], SEQ,
                        [("one", 1, I64), ("start", 0.0, np.float32), ("step", 1.0, np.float32)], "2*i0.1"),
    # positions of the new tokens: Range(total - s, total) counts s
    "range_new_positions": ([helper.make_node("Shape", ["past"], ["ps"]), helper.make_node("Shape", ["new"], ["ns"]),
                             helper.make_node("Gather", ["ps", "two"], ["p"]), helper.make_node("Gather", ["ns", "two"], ["s"]),
                             helper.make_node("Add", ["p", "s"], ["total"]), helper.make_node("Sub", ["total", "s"], ["first"]),
                             helper.make_node("Range", ["first", "total", "unit"], ["y"])], KV,
                            [("two", 2, I64), ("unit", 1, I64)], "i1.2"),
    "range_shifted": ([helper.make_node("Shape", ["x"], ["sh"]),
                       helper.make_node("Gather", ["sh", "one"], ["n"]),
                       helper.make_node("Range", ["three", "n", "unit"], ["y"])], SEQ,
                      [("one", 1, I64), ("three", 3, I64), ("unit", 1, I64)], None),  # Max(s - 3, 0)
    # no axes: the engine drops the literal 1s and keeps every symbolic dim
    "squeeze_no_axes": ([DOUBLE, helper.make_node("Unsqueeze", ["xx", "ax"], ["u"]),
                         helper.make_node("Squeeze", ["u"], ["y"])], SEQ, [("ax", [0], I64)], "i0.0,2*i0.1,64"),
    # a running sum over the sequence: the scan output gets the scan input's length
    "scan_outputs": ([helper.make_node("Scan", ["init", "seq"], ["last", "ys"], num_scan_inputs=1, body=helper.make_graph(
        [helper.make_node("Add", ["st", "xt"], ["st2"]), helper.make_node("Identity", ["st2"], ["yt"])], "step",
        [helper.make_tensor_value_info("st", F, [64]), helper.make_tensor_value_info("xt", F, [64])],
        [helper.make_tensor_value_info("st2", F, [64]), helper.make_tensor_value_info("yt", F, [64])])),
        helper.make_node("Concat", ["ys", "ys"], ["y"], axis=0)],
        [("init", F, [64]), ("seq", F, ["s", 64])], (), "2*i1.0,64"),
    "argmax": ([DOUBLE, helper.make_node("ArgMax", ["xx"], ["y"], axis=2, keepdims=0)], SEQ, (), "i0.0,2*i0.1"),
    "broadcast_merge": ([helper.make_node("Add", ["past", "new"], ["y"])], KV, (), "i0.0,2,i0.2,8"),
    "merge_then_concat": ([helper.make_node("Add", ["past", "new"], ["t"]),
                           helper.make_node("Concat", ["new", "t"], ["y"], axis=2)], KV, (), "i0.0,2,2*i0.2,8"),
    "unknown_against_symbol": ([helper.make_node("NonZero", ["x"], ["nz"]),
                                helper.make_node("Concat", ["nz", "nz"], ["y"], axis=0)], SEQ, (), None),
    # the last token: the engine's d - (d - 1) = 1 (it assumes d >= 1)
    "slice_last": ([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])], SEQ,
                   [("st", [-1], I64), ("en", [2**31 - 1], I64), ("ax", [1], I64)], "i0.0,1,64"),
    "slice_drop_last": ([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])], SEQ,
                        [("st", [0], I64), ("en", [-1], I64), ("ax", [1], I64)], "i0.0,i0.1-1,64"),
    # an end below int_max on a symbolic dim: Min(10**9, s), no polynomial
    "slice_min": ([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])], SEQ,
                  [("st", [0], I64), ("en", [10**9], I64), ("ax", [1], I64)], "?"),
    # position embeddings [512, 64] cut to the sequence (Min(s, 512)), added to x: merged into s
    "slice_by_shape_then_add": ([helper.make_node("Shape", ["x"], ["sh"]),
                                 helper.make_node("Slice", ["sh", "one", "two"], ["len"]),
                                 helper.make_node("Slice", ["table", "zero", "len", "zero"], ["pos"]),
                                 helper.make_node("Add", ["x", "pos"], ["y"])], SEQ,
                                [("table", np.zeros((512, 64)), np.float32), ("zero", [0], I64),
                                 ("one", [1], I64), ("two", [2], I64)], "i0.0,i0.1,64"),
    "resize_sizes": ([helper.make_node("Shape", ["skip"], ["sizes"]),
                      helper.make_node("Resize", ["x", "", "", "sizes"], ["y"])],
                     X4 + [("skip", F, ["n", 3, "H", "W"])], (), "i0.0,3,i1.2,i1.3"),
    # no rule in the engine: onnx leaves the spatial dims, the engine names all four anew, and
    # the bias add merges the channel into 4
    "conv_transpose_bias": ([helper.make_node("ConvTranspose", ["x", "w"], ["t"], strides=[2, 2]),
                             helper.make_node("Add", ["t", "bias"], ["y"])], X4,
                            [("w", np.zeros((3, 4, 2, 2)), np.float32), ("bias", np.zeros((1, 4, 1, 1)), np.float32)],
                            "?"),
    "unknown_op": ([helper.make_node("NonZero", ["x"], ["y"])], SEQ, (), None),
    # a BERT pooler's first token: indices [b, 1] into [b, 2s, 64] with batch_dims 1
    "gather_nd": ([DOUBLE, helper.make_node("GatherND", ["xx", "first"], ["y"], batch_dims=1)],
                  SEQ + [("first", I64_TYPE, ["b", 1])], (), "i0.0,64"),
    "reduce_split": ([DOUBLE, helper.make_node("ReduceSum", ["xx", "ax"], ["r"], keepdims=1),
                      helper.make_node("Split", ["r"], ["y", "z"], axis=1)], SEQ, [("ax", [2], I64)],
                     "i0.0,i0.1,1;i0.0,i0.1,1"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_rule_settles_what_the_engine_derives(name):
    nodes, inputs, inits, want = CASES[name]
    outputs = [o for n in nodes[-1:] for o in n.output]
    mine, theirs, ran = _texts(_body(nodes, inputs, inits, outputs))
    assert mine == theirs
    if want is None:
        assert ran, "the tier settled a body it should leave to the engine"
    else:
        assert not ran and (mine or "?").replace("(", "").replace(")", "") == want, mine


_NAMES = st.sampled_from(["B", "H", "W", "a", "batch", "past_sequence", "sequence", "x_1"])
_TERMS = st.lists(st.tuples(st.integers(-5, 5), st.lists(_NAMES, max_size=3)), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(_TERMS)
def test_polynomials_print_as_sympy_prints_them(terms):
    sympy = pytest.importorskip("sympy")
    total, expr = poly.const(0), sympy.Integer(0)
    for c, names in terms:
        term, sym = poly.const(c), sympy.Integer(c)
        for n in names:
            term = poly.mul(term, poly.var(("s", n))) if len(term) <= 1 else term
            sym = sym * sympy.Symbol(n, integer=True, positive=True)
        total, expr = poly.add(total, term), expr + sym
    text = poly.sympy_text(total)
    assert (str(text) if text is not None else None) == str(sympy.expand(expr))


def test_a_node_the_tier_cannot_read_leaves_the_body_to_the_engine():
    """A Concat without its axis (malformed: the checker would say so) stops the tier, not the
    fuse: the engine is asked, as before the tier existed."""
    nodes = [helper.make_node("Concat", ["past", "new"], ["y"])]
    mine, theirs, ran = _texts(_body(nodes, KV))
    assert ran and mine == theirs


def test_floor_division_is_a_polynomial_only_where_sympy_drops_the_floor():
    h = poly.var(("s", "h"))
    assert poly.floordiv(poly.add(poly.mul(poly.const(2), h), poly.const(3)), poly.const(2)) == poly.add(h, poly.const(1))
    assert poly.sympy_text(poly.floordiv(poly.add(h, poly.const(1)), poly.const(2))) is None  # floor((h + 1)/2)
    cancelled = poly.add(poly.add(poly.mul(poly.const(2), poly.floordiv(h, poly.const(2))), h),
                      poly.mul(poly.const(-2), poly.floordiv(h, poly.const(2))))
    assert poly.sympy_text(cancelled) == "h"  # an atom that cancels leaves a polynomial


def _engine_only(fused: onnx.ModelProto) -> list:
    """Each block's dims text as onnx's inference and the engine alone give it (no tier)."""
    tiers = tiers_module._INFERENCES
    try:
        tiers_module._INFERENCES = (tiers[0], tiers[2])
        return [tiers_module.output_dims_text(body_model(n)) for n in fused.graph.node if is_fusion_block(n)]
    finally:
        tiers_module._INFERENCES = tiers


def test_a_kv_cache_decoder_fuses_without_importing_sympy(tmp_path):
    """A fresh interpreter fuses a KV-cache layer (``present = Concat(past, new)``): sympy is never
    imported, and the present cache's dims are the engine's ``past + new``."""
    source, path = tmp_path / "kv_in.onnx", tmp_path / "kv.onnx"
    onnx.save(kv_model(), str(source))
    script = (
        "import sys\n"
        "from onnxmlu import api\n"
        f"api.fuse_to_file({str(source)!r}, {str(path)!r})\n"
        "print('sympy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"
    fused = onnx.load(str(path))
    written = [{p.key: p.value for p in body_model(n).metadata_props}.get(tiers_module.DIMS_KEY)
               for n in fused.graph.node if is_fusion_block(n)]
    assert written == _engine_only(fused) and any(written)


def test_the_corpus_decoder_blocks_need_no_engine_and_keep_its_dims(monkeypatch, tmp_path):
    """The opset-23 decoder layer's block (its present caches ``past + sequence``, which onnx's
    inference cannot add) is settled by the tier: the engine is never asked for output dims, and
    the metadata written is what it would have written."""
    case = next(c for c in corpus.MODELS if c.id == "built_opset23_decoder")
    tiers = tiers_module._INFERENCES

    def engine(_light):
        raise AssertionError("the symbolic engine ran for a block body")

    monkeypatch.setattr(tiers_module, "_INFERENCES", (tiers[0], tiers[1], (engine, False)))
    api.fuse_to_file(str(corpus.model_path(case)), tmp_path / "f.onnx")
    monkeypatch.setattr(tiers_module, "_INFERENCES", tiers)
    fused = onnx.load(str(tmp_path / "f.onnx"))
    written = [{p.key: p.value for p in body_model(n).metadata_props}.get(tiers_module.DIMS_KEY)
               for n in fused.graph.node if is_fusion_block(n)]
    assert written == _engine_only(fused)


def _symbolic_cases() -> list:
    """The corpus's built models (always) and its packaged ones (where cached or fetched)."""
    return [c for c in corpus.MODELS if c.package == "built"] + [
        pytest.param(c, marks=pytest.mark.realworld) for c in corpus.MODELS if c.package != "built"]


@pytest.mark.parametrize("case", _symbolic_cases(), ids=lambda c: c.id)
def test_every_corpus_block_gets_the_engines_text(case, monkeypatch, tmp_path):
    """Each block body of a corpus fuse, as collapse hands it over (constants still to splice
    included): the text with the tier equals the text of onnx's inference and the engine alone."""
    try:
        source = corpus.model_path(case)
    except corpus.FetchError as error:
        unavailable(str(error))
    tiers, pairs = tiers_module._INFERENCES, []

    def both(body, absent=()):
        mine = tiers_module.output_dims_text(body, absent)
        monkeypatch.setattr(tiers_module, "_INFERENCES", (tiers[0], tiers[2]))
        pairs.append((mine, tiers_module.output_dims_text(body, absent)))
        monkeypatch.setattr(tiers_module, "_INFERENCES", tiers)
        return mine

    monkeypatch.setattr("onnxmlu.collapse.outputs.output_dims_text", both)
    api.fuse_to_file(str(source), tmp_path / "f.onnx")
    assert [mine for mine, _ in pairs] == [engine for _, engine in pairs]
