"""Consecutive blocks merged into one inner session (onnxmlu.runtime.merge): the same function.

The merged body is its members' bodies wired together; what could go wrong is a name two
bodies share, a body output that is its own input or repeats another, a member output read
after the run, and members that must stay apart (different opsets, a host op between them).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxmlu import runtime
from onnxmlu.ir.graphs import copy_model
from onnxmlu.runtime.merge import merge_consecutive_blocks

from runtime_helpers import block_node, body_model, conv_relu_body, fused_model, vi

TOL = dict(rtol=1e-4, atol=1e-4)
F = TensorProto.FLOAT


def _passing_body() -> onnx.ModelProto:
    """Outputs (its input unchanged, Relu of it, the same Relu again)."""
    return body_model([helper.make_node("Relu", ["a"], ["r"])], [vi("a", F, [1, 4, 8, 8])],
                      [vi("a", F, [1, 4, 8, 8]), vi("r", F, [1, 4, 8, 8]), vi("r", F, [1, 4, 8, 8])])


def _relu_body() -> onnx.ModelProto:
    """Outputs (Neg of its input, Relu of it, a copy of that): each output its own tensor."""
    nodes = [helper.make_node("Neg", ["a"], ["n"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Identity", ["r"], ["r2"])]
    return body_model(nodes, [vi("a", F, [1, 4, 8, 8])], [vi(n, F, [1, 4, 8, 8]) for n in ("n", "r", "r2")])


def chained(opset_of_second: int = 17, host_op: bool = False, passing: bool = True) -> onnx.ModelProto:
    """x -> block_0 -> h -> block_1 -> z -> block_2 -> (p, q, q2); a host Neg reads h after the
    run, and (``host_op``) another sits between block_1 and block_2. Blocks 0 and 1 have bodies
    with the very same names (conv_relu_body's x, y, y_w, y_b, y_conv). Block 2 passes its input
    through as p (``passing``; else p = -z) and writes q = q2 = Relu(z)."""
    second = conv_relu_body(seed=2, in_ch=4, out_ch=4)
    second.opset_import[0].version = opset_of_second
    z = "zn" if host_op else "z"
    nodes = [block_node("block_0", ["x"], ["h"], conv_relu_body(seed=1, in_ch=3, out_ch=4), mp=2),
             block_node("block_1", ["h"], ["z"], second, mp=4)]
    nodes += [helper.make_node("Neg", ["z"], ["zn"])] if host_op else []
    nodes += [block_node("block_2", [z], ["p", "q", "q2"], _passing_body() if passing else _relu_body(), mp=1),
              helper.make_node("Neg", ["h"], ["hn"])]
    shape = [1, 4, 8, 8]
    return fused_model(nodes, [vi("x", F, [1, 3, 8, 8])], [vi(n, F, shape) for n in ("p", "q", "q2", "hn")],
                       value_info=[vi(n, F, shape) for n in ("h", "z", "zn")[: 3 if host_op else 2]])


def original(host_op: bool = False, passing: bool = True) -> onnx.ModelProto:
    """What ``chained`` computes, as one plain graph (the same weights: same seeds)."""
    first = conv_relu_body(seed=1, in_ch=3, out_ch=4, out_name="h")
    second = conv_relu_body(seed=2, in_ch=4, out_ch=4, in_name="h", out_name="z")
    z = "zn" if host_op else "z"
    nodes = [*first.graph.node, *second.graph.node, *([helper.make_node("Neg", ["z"], ["zn"])] if host_op else []),
             helper.make_node("Identity" if passing else "Neg", [z], ["p"]), helper.make_node("Relu", [z], ["q"]),
             helper.make_node("Identity", ["q"], ["q2"]), helper.make_node("Neg", ["h"], ["hn"])]
    return body_model(nodes, [vi("x", F, [1, 3, 8, 8])], [vi(n, F, [1, 4, 8, 8]) for n in ("p", "q", "q2", "hn")],
                      [*first.graph.initializer, *second.graph.initializer])


def _check(model: onnx.ModelProto, reference: onnx.ModelProto, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)
    got = runtime.InferenceSession(model, block_layouts=False).run(None, {"x": x})
    for got_one, want in zip(got, runtime.reference_session(reference).run(None, {"x": x})):
        np.testing.assert_allclose(got_one, want, **TOL)


def test_a_run_of_blocks_becomes_one_node_computing_the_same():
    model = chained()
    merged = copy_model(model)
    assert merge_consecutive_blocks(merged) == 2
    blocks = [n for n in merged.graph.node if n.op_type == "MLUFusionBlock"]
    assert len(blocks) == 1 and list(blocks[0].output) == ["h", "p", "q", "q2"]  # h: read by the host Neg
    assert onnx.helper.get_attribute_value(next(a for a in blocks[0].attribute if a.name == "mp")) == 4
    onnx.checker.check_model(merged, full_check=True)
    _check(model, original(), seed=0)


def test_blocks_with_different_opsets_or_a_host_op_between_stay_apart():
    different = copy_model(chained(opset_of_second=13, passing=False))
    assert merge_consecutive_blocks(different) == 0  # opsets 17, 13, 17: no two neighbours agree
    split = copy_model(chained(host_op=True, passing=False))
    assert merge_consecutive_blocks(split) == 1  # block_0 + block_1; block_2 after the host Neg alone
    _check(chained(opset_of_second=13, passing=False), original(passing=False), seed=1)
    _check(chained(host_op=True, passing=False), original(host_op=True, passing=False), seed=2)


def test_a_block_whose_mp_is_no_int_is_left_for_the_library_to_refuse():
    """A damaged file (an ``mp`` written as a string) joined with its neighbour compared a string
    with an int: a TypeError that named no block. Now the block stays apart and the library's
    own message names it."""
    model = chained(passing=False)
    mp = next(a for a in model.graph.node[1].attribute if a.name == "mp")
    mp.CopyFrom(helper.make_attribute("mp", "4"))
    assert merge_consecutive_blocks(copy_model(model)) == 0  # block_1 stays apart: no two neighbours join
    with pytest.raises(Exception, match="MLUFusionBlock"):
        runtime.InferenceSession(model)


def test_the_callers_model_is_left_as_it_was():
    model = chained()
    before = model.SerializeToString()
    runtime.InferenceSession(model)
    assert model.SerializeToString() == before


def test_bodies_whose_nodes_share_names_merge_into_a_valid_body():
    """Two bodies naming their nodes alike (each layout pass writes a "ReorderOutput"): the
    merged body must still name every node once, or onnxruntime refuses it."""
    from onnxmlu.schema import body_model as body_of

    model = chained()
    for i, node in enumerate(list(model.graph.node[:2])):
        body = body_of(node)
        for k, inner in enumerate(body.graph.node):
            inner.name = f"shared_{k}"
        mp = next(a.i for a in node.attribute if a.name == "mp")
        model.graph.node[i].CopyFrom(block_node(node.name, list(node.input), list(node.output), body, mp=mp))
    merged = copy_model(model)
    assert merge_consecutive_blocks(merged) == 2
    names = [n.name for n in body_of(next(n for n in merged.graph.node if n.op_type == "MLUFusionBlock")).graph.node
             if n.name]
    assert len(names) == len(set(names)) and any(n.endswith("shared_0") for n in names)
    _check(model, original(), seed=3)


def test_a_member_passing_the_runs_input_through_merges_without_a_copy_node():
    """block_0 writes h and passes the run's input x through as xp; block_1 reads h. The merged
    body lists its own input x as an output (no Identity: the library copies such an output),
    and the run gives what the blocks give unmerged."""
    from onnxmlu.schema import body_model as body_of

    first = conv_relu_body(seed=1, in_ch=3, out_ch=4)
    first.graph.output.append(vi("x", F, [1, 3, 8, 8]))
    model = fused_model([block_node("block_0", ["x"], ["h", "xp"], first, mp=1),
                         block_node("block_1", ["h"], ["z"], conv_relu_body(seed=2, in_ch=4, out_ch=4), mp=1)],
                        [vi("x", F, [1, 3, 8, 8])], [vi("xp", F, [1, 3, 8, 8]), vi("z", F, [1, 4, 8, 8])],
                        value_info=[vi("h", F, [1, 4, 8, 8])])
    merged = copy_model(model)
    assert merge_consecutive_blocks(merged) == 1
    body = body_of(next(n for n in merged.graph.node if n.op_type == "MLUFusionBlock"))
    assert [o.name for o in body.graph.output] == ["x", "z"] and "Identity" not in {n.op_type for n in body.graph.node}
    x = np.random.default_rng(4).standard_normal((1, 3, 8, 8)).astype(np.float32)
    got = runtime.InferenceSession(model, block_layouts=False).run(None, {"x": x})
    unmerged = runtime.InferenceSession(model, block_layouts=False, merge_blocks=False).run(None, {"x": x})
    np.testing.assert_array_equal(got[0], x)
    np.testing.assert_allclose(got[1], unmerged[1], **TOL)


def test_merged_bodies_keep_every_weight_however_it_is_stored():
    """The pass leaves the members' ``raw_data`` unparsed and splices it back after renaming:
    a weight in ``raw_data`` with fields after it (``doc_string``), one in ``float_data``, and
    a body whose fields are not in protobuf's order all come back as the same tensors."""
    from onnx import numpy_helper

    from onnxmlu.schema import body_model as body_of

    first, second = conv_relu_body(seed=1, in_ch=3, out_ch=4), conv_relu_body(seed=2, in_ch=4, out_ch=4)
    weight = first.graph.initializer[0]
    weight.float_data.extend(numpy_helper.to_array(weight).ravel().tolist())
    weight.ClearField("raw_data")
    second.graph.initializer[1].doc_string = "bias, written after its raw data"
    nodes = [block_node("block_0", ["x"], ["h"], first, mp=1),
             block_node("block_1", ["h"], ["z"], second, mp=1)]
    data = second.SerializeToString()
    graph_first = onnx.ModelProto(graph=second.graph).SerializeToString()
    reordered = graph_first + onnx.ModelProto(**{f: getattr(second, f) for f in ("ir_version", "opset_import")}
                                              ).SerializeToString()
    assert onnx.ModelProto.FromString(reordered) == onnx.ModelProto.FromString(data)
    nodes[1] = block_node("block_1", ["h"], ["z"], reordered, mp=1)  # the graph first, as bytes
    model = fused_model(nodes, [vi("x", F, [1, 3, 8, 8])], [vi("z", F, [1, 4, 8, 8])],
                        value_info=[vi("h", F, [1, 4, 8, 8])])
    merged = copy_model(model)
    assert merge_consecutive_blocks(merged) == 1
    got = {t.name.split("/")[-1] + t.name.split("/")[0][-1]: t for t in body_of(merged.graph.node[0]).graph.initializer}
    for k, body in enumerate((first, second)):
        for tensor in body.graph.initializer:
            np.testing.assert_array_equal(numpy_helper.to_array(got[tensor.name + str(k)]), numpy_helper.to_array(tensor))
            assert got[tensor.name + str(k)].doc_string == tensor.doc_string
    first_only = original().graph
    reference = body_model([*first_only.node[:4]], [vi("x", F, [1, 3, 8, 8])], [vi("z", F, [1, 4, 8, 8])],
                           list(first_only.initializer))
    _check(model, reference, seed=4)
