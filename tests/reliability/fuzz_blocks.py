"""Mutation fuzzer for the MLUFusionBlock custom-op library (a child process of test_fuzz_library).

    python fuzz_blocks.py SEED START COUNT

Case ``i`` is generated from ``random.Random(f"{SEED}:{i}")`` alone, so any case can be replayed.
Each case takes a valid fused model from a small corpus (one or two blocks; float, mixed dtypes,
symbolic batch, a body with an If subgraph) and applies one to three mutations:

* body bytes: bit flips, truncation, splices with random bytes or with another body, deletions,
  duplicated ranges, an empty body;
* body structure: input/output dtypes, counts and names, opset and IR version, dropped
  initializers, an unknown op, zero nodes, nested MLUFusionBlock (directly and inside an If);
* attributes: ``mp`` 0 / negative / huge / of the wrong type / missing, ``body`` missing, as a
  STRING, as a float or 2-D tensor, typed data instead of raw bytes, dims that lie about its
  size, external data that does not exist; ``body_crc32`` right (so later byte mutations meet
  the digest check), wrong, out of range, of the wrong type or missing;
* the outer graph: wrong value_info dtypes, missing value_info, extra or missing node inputs
  and outputs.

Contract checked per case: creating the session succeeds (then the model runs once when inputs
can be built from its declared types) or raises with a message naming ``MLUFusionBlock``. The
process must never crash: the parent runs cases in chunks and treats a signal or non-zero exit
as a failure, with the last case this process announced on stdout (``case i``).

The address space is capped (RLIMIT_AS) so that a mutation that makes onnxruntime reserve
absurd amounts of memory fails with an allocation error instead of starving the machine.
"""

from __future__ import annotations

import json
import os
import random
import resource
import sys
import zlib

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import runtime

DOMAIN, OP = "com.onnxmlu", "MLUFusionBlock"
OPSET = 17
ADDRESS_SPACE_LIMIT = 8 * 2**30
#: Under AddressSanitizer a failed allocation aborts the process by design (its operator new
#: never throws std::bad_alloc), so sizes that make onnxruntime attempt absurd allocations are
#: left to the release-build run, where they must fail cleanly.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
ABSURD_DIMS = [] if UNDER_ASAN else [2**31, 2**62]
ABSURD_BYTES = [] if UNDER_ASAN else [2**33, 2**62]


# --- corpus ------------------------------------------------------------------------------------


def vi(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def body_model(nodes, inputs, outputs, inits=(), opsets=None) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "body", list(inputs), list(outputs), initializer=list(inits))
    return helper.make_model(graph, opset_imports=opsets or [helper.make_opsetid("", OPSET)], ir_version=8)


def conv_relu_body(seed=0, cin=3, cout=4, batch=1, x="x", y="y") -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((cout, cin, 3, 3)).astype(np.float32), f"{y}_w")
    b = numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), f"{y}_b")
    nodes = [helper.make_node("Conv", [x, w.name, b.name], [f"{y}_c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", [f"{y}_c"], [y])]
    return body_model(nodes, [vi(x, TensorProto.FLOAT, [batch, cin, 8, 8])], [vi(y, TensorProto.FLOAT, [batch, cout, 8, 8])],
                      [w, b])


def mixed_body() -> onnx.ModelProto:
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    nodes = [helper.make_node("ArgMax", ["x"], ["idx"], axis=1, keepdims=0),
             helper.make_node("Greater", ["x", "zero"], ["mask"]),
             helper.make_node("Shape", ["x"], ["shape"])]
    return body_model(nodes, [vi("x", TensorProto.FLOAT, [2, 5])],
                      [vi("idx", TensorProto.INT64, [2]), vi("mask", TensorProto.BOOL, [2, 5]),
                       vi("shape", TensorProto.INT64, [2])], [zero])


def if_body(inner_nodes=None) -> onnx.ModelProto:
    """y = If(sum(x) > 0, x * 2, x - 1): a body with subgraphs (where a nested block can hide)."""
    def branch(name, node):
        return helper.make_graph([node], name, [], [vi(f"{name}_out", TensorProto.FLOAT, [2, 3])])

    two = numpy_helper.from_array(np.full((2, 3), 2.0, np.float32), "two")
    then = branch("then", helper.make_node("Mul", ["x", "two"], ["then_out"]))
    other = branch("else", inner_nodes or helper.make_node("Sub", ["x", "two"], ["else_out"]))
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    return body_model(nodes, [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, [2, 3])], [two, zero])


def block_node(name, inputs, outputs, body, mp=1) -> onnx.NodeProto:
    data = body.SerializeToString()
    tensor = helper.make_tensor("body", TensorProto.UINT8, [len(data)], data, raw=True)
    return helper.make_node(OP, list(inputs), list(outputs), name=name, domain=DOMAIN, mp=mp, body=tensor)


def fused(nodes, inputs, outputs, value_info=()) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "fused", list(inputs), list(outputs), value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)],
                             ir_version=8)


def corpus_conv() -> onnx.ModelProto:
    return fused([block_node("block_0 (mp=2)", ["x"], ["y"], conv_relu_body(), mp=2)],
                 [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])], [vi("y", TensorProto.FLOAT, [1, 4, 8, 8])])


def corpus_chain() -> onnx.ModelProto:
    first = conv_relu_body(1, 3, 4, x="x", y="h")
    second = conv_relu_body(2, 4, 2, x="h", y="y")
    return fused([block_node("block_0 (mp=2)", ["x"], ["h"], first, mp=2),
                  block_node("block_1 (mp=1)", ["h"], ["y"], second, mp=1)],
                 [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])], [vi("y", TensorProto.FLOAT, [1, 2, 8, 8])],
                 [vi("h", TensorProto.FLOAT, [1, 4, 8, 8])])


def corpus_mixed() -> onnx.ModelProto:
    return fused([block_node("block_m (mp=1)", ["x"], ["idx", "mask", "shape"], mixed_body())],
                 [vi("x", TensorProto.FLOAT, [2, 5])],
                 [vi("idx", TensorProto.INT64, [2]), vi("mask", TensorProto.BOOL, [2, 5]), vi("shape", TensorProto.INT64, [2])])


def corpus_dynamic() -> onnx.ModelProto:
    body = conv_relu_body(3, batch="N")
    return fused([block_node("block_d (mp=4)", ["x"], ["y"], body, mp=4)],
                 [vi("x", TensorProto.FLOAT, ["N", 3, 8, 8])], [vi("y", TensorProto.FLOAT, ["N", 4, 8, 8])])


def corpus_if() -> onnx.ModelProto:
    return fused([block_node("block_if (mp=1)", ["x"], ["y"], if_body())],
                 [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, [2, 3])])


CORPUS = [corpus_conv, corpus_chain, corpus_mixed, corpus_dynamic, corpus_if]
_CORPUS_CACHE: list[bytes] = []


def corpus(rng: random.Random) -> onnx.ModelProto:
    if not _CORPUS_CACHE:
        _CORPUS_CACHE.extend(build().SerializeToString() for build in CORPUS)
    return onnx.load_from_string(rng.choice(_CORPUS_CACHE))


# --- mutations ---------------------------------------------------------------------------------


def blocks(model):
    return [n for n in model.graph.node if n.op_type == OP]


def attr(node, name):
    return next((a for a in node.attribute if a.name == name), None)


def body_bytes(node) -> bytes:
    a = attr(node, "body")
    if a is None:
        return b""
    return a.t.raw_data if a.type == onnx.AttributeProto.TENSOR else a.s


def set_body_bytes(node, data: bytes) -> None:
    a = attr(node, "body")
    if a is None:
        node.attribute.append(helper.make_attribute("body", helper.make_tensor("body", TensorProto.UINT8, [len(data)], data, raw=True)))
        return
    if a.type == onnx.AttributeProto.TENSOR:
        a.t.raw_data = data
        del a.t.dims[:]
        a.t.dims.append(len(data))
    else:
        a.s = data


def get_body(node) -> onnx.ModelProto | None:
    body = onnx.ModelProto()
    try:
        body.ParseFromString(body_bytes(node))
    except Exception:  # noqa: BLE001 - a mutated body may fail any way
        return None
    return body


def set_body(node, body: onnx.ModelProto) -> None:
    set_body_bytes(node, body.SerializeToString())


def set_attr(node, name, value) -> None:
    old = attr(node, name)
    if old is not None:
        node.attribute.remove(old)
    if value is not None:
        node.attribute.append(helper.make_attribute(name, value) if not isinstance(value, onnx.AttributeProto) else value)


# byte-level mutations of one block's body
def m_bitflip(rng, model, node):
    data = bytearray(body_bytes(node))
    for _ in range(rng.randint(1, 8)):
        if data:
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    set_body_bytes(node, bytes(data))


def m_truncate(rng, model, node):
    data = body_bytes(node)
    set_body_bytes(node, data[: rng.randrange(len(data) + 1)] if data else data)


def m_splice_random(rng, model, node):
    data = body_bytes(node)
    a = rng.randrange(len(data) + 1)
    b = min(len(data), a + rng.randint(0, 64))
    set_body_bytes(node, data[:a] + rng.randbytes(rng.randint(0, 64)) + data[b:])


def m_splice_other(rng, model, node):
    data, other = body_bytes(node), body_bytes(blocks(corpus(rng))[0])
    a, b = sorted(rng.randrange(len(data) + 1) for _ in range(2))
    c, d = sorted(rng.randrange(len(other) + 1) for _ in range(2))
    set_body_bytes(node, data[:a] + other[c:d] + data[b:])


def m_delete(rng, model, node):
    data = body_bytes(node)
    a = rng.randrange(len(data) + 1)
    set_body_bytes(node, data[:a] + data[a + rng.randint(1, 32):])


def m_duplicate(rng, model, node):
    data = body_bytes(node)
    a, b = sorted(rng.randrange(len(data) + 1) for _ in range(2))
    set_body_bytes(node, data[:b] + data[a:b] + data[b:])


def m_empty(rng, model, node):
    set_body_bytes(node, b"")


ELEM_TYPES = [TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL, TensorProto.DOUBLE, TensorProto.UINT8,
              TensorProto.STRING, TensorProto.FLOAT16, 0, 99]


# structural mutations of one block's body
def _body_edit(fn):
    def mutate(rng, model, node):
        body = get_body(node)
        if body is None or not body.HasField("graph"):
            return m_bitflip(rng, model, node)
        fn(rng, body)
        set_body(node, body)
    mutate.__name__ = fn.__name__
    return mutate


@_body_edit
def b_io_dtype(rng, body):
    values = list(body.graph.input) + list(body.graph.output)
    rng.choice(values).type.tensor_type.elem_type = rng.choice(ELEM_TYPES)


@_body_edit
def b_io_count(rng, body):
    g = body.graph
    choice = rng.randrange(4)
    if choice == 0 and g.input:
        g.input.pop()
    elif choice == 1 and g.output:
        g.output.pop()
    elif choice == 2:
        g.input.append(vi(f"extra{rng.randrange(9)}", rng.choice(ELEM_TYPES[:3]), [1]))
    else:
        g.output.append(vi(rng.choice([o.name for o in g.output] + ["ghost"]), TensorProto.FLOAT, [1]))


@_body_edit
def b_io_name(rng, body):
    rng.choice(list(body.graph.input) + list(body.graph.output)).name = rng.choice(["", "x", "y", "ghost", "h"])


@_body_edit
def b_io_shape(rng, body):
    v = rng.choice(list(body.graph.input) + list(body.graph.output))
    shape = v.type.tensor_type.shape
    if shape.dim:
        d = rng.choice(shape.dim)
        d.dim_value = rng.choice([0, 1, 2, 7, *ABSURD_DIMS])
    else:
        shape.dim.add().dim_value = rng.choice([0, 3])


@_body_edit
def b_versions(rng, body):
    if rng.random() < 0.5:
        body.ir_version = rng.choice([0, 1, 3, 99, 2**40])
    else:
        del body.opset_import[:]
        if rng.random() < 0.7:
            body.opset_import.append(helper.make_opsetid(rng.choice(["", "ai.onnx", "com.onnxmlu"]), rng.choice([1, 6, 99])))


@_body_edit
def b_drop_initializer(rng, body):
    if body.graph.initializer:
        body.graph.initializer.pop(rng.randrange(len(body.graph.initializer)))


@_body_edit
def b_unknown_op(rng, body):
    if body.graph.node:
        n = rng.choice(body.graph.node)
        n.op_type = rng.choice(["NoSuchOp", "MLUFusionBlock", "Conv", ""])
        if rng.random() < 0.5:
            n.domain = rng.choice(["", "com.onnxmlu", "com.example"])


@_body_edit
def b_no_nodes(rng, body):
    del body.graph.node[:]


@_body_edit
def b_initializer_lies(rng, body):
    if body.graph.initializer:
        t = rng.choice(body.graph.initializer)
        del t.dims[:]
        t.dims.extend(rng.choice([*([[d, d] for d in ABSURD_DIMS[:1]]), [0], [-1, 4], [3], [1, 2, 3, 4, 5]]))


def m_nested(rng, model, node):
    """The body itself holds a block (directly, or in an If branch, or two levels deep)."""
    inner = conv_relu_body(rng.randrange(100))
    depth = rng.choice(["direct", "if", "deep"])
    if depth == "if":
        nested = block_node("hidden_block", ["x"], ["else_out"], inner)
        body = if_body(nested)
        body.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    else:
        if depth == "deep":
            inner = body_model([block_node("deepest", ["x"], ["y"], inner)], [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                               [vi("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                               opsets=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)])
        body = body_model([block_node("inner_block", ["x"], ["y"], inner)], [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [vi("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                          opsets=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)])
    set_body(node, body)


# attribute mutations
MP_VALUES = [0, -1, -(2**63), 2**63 - 1, 1025, 1024, 1, 2, 32, 2**31, -(2**31)]


def a_mp(rng, model, node):
    choice = rng.randrange(5)
    if choice == 0:
        set_attr(node, "mp", rng.choice(MP_VALUES))
    elif choice == 1:
        set_attr(node, "mp", None)
    elif choice == 2:
        set_attr(node, "mp", rng.choice([2.5, "8", b"\x00", [1, 2]]))
    elif choice == 3:
        set_attr(node, "mp", helper.make_tensor("mp", TensorProto.INT64, [1], [4]))
    else:
        set_attr(node, "mp", rng.randint(-(2**63), 2**63 - 1))


def a_body_kind(rng, model, node):
    data = body_bytes(node)
    choice = rng.randrange(8)
    if choice == 0:
        set_attr(node, "body", None)
    elif choice == 1:
        set_attr(node, "body", data)  # STRING attribute
    elif choice == 2:
        set_attr(node, "body", helper.make_tensor("body", TensorProto.FLOAT, [2], [1.0, 2.0]))
    elif choice == 3:
        half = len(data) // 2
        set_attr(node, "body", helper.make_tensor("body", TensorProto.UINT8, [2, half], data[: 2 * half], raw=True))
    elif choice == 4:  # typed field instead of raw bytes
        set_attr(node, "body", helper.make_tensor("body", TensorProto.UINT8, [len(data)], list(data)))
    elif choice == 5:  # dims that lie about the size
        t = helper.make_tensor("body", TensorProto.UINT8, [len(data)], data, raw=True)
        del t.dims[:]
        t.dims.append(rng.choice([0, 1, len(data) + 1, max(0, len(data) - 1), *ABSURD_BYTES]))
        set_attr(node, "body", t)
    elif choice == 6:  # external data that is not there
        t = TensorProto(name="body", data_type=TensorProto.UINT8, dims=[len(data)])
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", rng.choice(["missing.data", "/etc/passwd", "../../x", ""])),
                           ("offset", str(rng.choice([0, 7, 2**40]))), ("length", str(len(data)))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        set_attr(node, "body", t)
    else:
        set_attr(node, "body", [data, data])  # STRINGS attribute


def a_digest(rng, model, node):
    """body_crc32: the body's real CRC-32 (later byte mutations then hit the digest check), a
    wrong one, out of range, of the wrong type, or none."""
    choice = rng.randrange(6)
    if choice <= 1:
        set_attr(node, "body_crc32", zlib.crc32(body_bytes(node)))
    elif choice == 2:
        set_attr(node, "body_crc32", rng.randrange(2**32))
    elif choice == 3:
        set_attr(node, "body_crc32", rng.choice([-1, 2**32, -(2**63), 2**63 - 1]))
    elif choice == 4:
        set_attr(node, "body_crc32", rng.choice([1.5, "deadbeef", b"\xff", [1, 2]]))
    else:
        set_attr(node, "body_crc32", None)


def o_value_info(rng, model, node):
    g = model.graph
    if rng.random() < 0.5 and g.value_info:
        g.value_info.pop(rng.randrange(len(g.value_info)))
    else:
        values = list(g.value_info) + list(g.output) + list(g.input)
        # valid types only: an outer graph onnxruntime cannot load is not the block's business
        rng.choice(values).type.tensor_type.elem_type = rng.choice(ELEM_TYPES[:-2])


def o_node_io(rng, model, node):
    choice = rng.randrange(5)
    if choice == 0:
        node.input.append(rng.choice(list(node.input) or ["x"]))
    elif choice == 1 and len(node.input) > 1:
        node.input.pop()
    elif choice == 2:
        taken = {o for n in model.graph.node for o in n.output}  # a name defined twice breaks the outer graph
        node.output.append(next(f"extra_out{k}" for k in range(len(taken) + 1) if f"extra_out{k}" not in taken))
    elif choice == 3 and len(node.output) > 1 and node.output[-1] not in {o.name for o in model.graph.output}:
        node.output.pop()
    else:
        node.input.append("")  # an omitted optional input


MUTATIONS = [m_bitflip, m_truncate, m_splice_random, m_splice_other, m_delete, m_duplicate, m_empty,
             b_io_dtype, b_io_count, b_io_name, b_io_shape, b_versions, b_drop_initializer, b_unknown_op,
             b_no_nodes, b_initializer_lies, m_nested, a_mp, a_body_kind, a_digest, o_value_info, o_node_io]
BYTE_MUTATIONS = {m_bitflip, m_truncate, m_splice_random, m_splice_other, m_delete, m_duplicate, m_empty}


def mutate(seed: int, index: int) -> tuple[onnx.ModelProto, list[str]]:
    rng = random.Random(f"{seed}:{index}")
    model = corpus(rng)
    applied = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        node = rng.choice(blocks(model))
        fn = rng.choice(MUTATIONS)
        try:
            fn(rng, model, node)
        except (ValueError, TypeError) as exc:  # onnx.helper refused to build it: a fuzzer bug
            raise RuntimeError(f"mutation {fn.__name__} of case {index} cannot be built: {exc}") from exc
        applied.append(fn.__name__)
    return model, applied


# --- running a case ---------------------------------------------------------------------------

NUMPY_TYPES = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64, TensorProto.BOOL: np.bool_,
               TensorProto.DOUBLE: np.float64, TensorProto.UINT8: np.uint8, TensorProto.FLOAT16: np.float16}


def build_inputs(session, rng: np.random.Generator) -> dict | None:
    feeds = {}
    for arg in session.get_inputs():
        dtype = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_,
                 "tensor(double)": np.float64, "tensor(uint8)": np.uint8, "tensor(float16)": np.float16}.get(arg.type)
        dims = [d if isinstance(d, int) and 0 <= d <= 64 else 1 for d in (arg.shape or [])]
        if dtype is None or np.prod(dims, dtype=np.int64) > 10**6:
            return None
        feeds[arg.name] = (rng.standard_normal(dims) * 3).astype(dtype)
    return feeds


def run_case(seed: int, index: int, stats: dict) -> None:
    model, applied = mutate(seed, index)
    for name in applied:
        stats["applied"][name] = stats["applied"].get(name, 0) + 1
    data = model.SerializeToString()
    try:
        session = runtime.InferenceSession(data)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's Fail / InvalidGraph / ... and our own errors
        text = str(exc)
        stats["creation_errors"] += 1
        if OP not in text:
            stats["bad_messages"].append({"case": index, "mutations": applied, "message": text[:400]})
        return
    stats["created"] += 1
    feeds = build_inputs(session, np.random.default_rng(index))
    if feeds is None:
        return
    try:
        session.run(None, feeds)
        stats["ran"] += 1
    except Exception:  # noqa: BLE001 - counted, not raised
        stats["run_errors"] += 1


def main() -> None:
    seed, start, count = (int(a) for a in sys.argv[1:4])
    if not UNDER_ASAN:  # ASan reserves terabytes of shadow memory
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = ADDRESS_SPACE_LIMIT if hard == resource.RLIM_INFINITY else min(ADDRESS_SPACE_LIMIT, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    ort.set_default_logger_severity(4)
    stats = {"cases": 0, "created": 0, "ran": 0, "creation_errors": 0, "run_errors": 0, "bad_messages": [],
             "applied": {}}
    for index in range(start, start + count):
        print(f"case {index}", flush=True)
        run_case(seed, index, stats)
        stats["cases"] += 1
    print("summary " + json.dumps(stats), flush=True)


if __name__ == "__main__":
    main()
