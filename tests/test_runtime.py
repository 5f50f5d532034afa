"""The custom-op library and onnxmlu.runtime: fused models give the body's numbers, bad nodes
fail session creation with a message naming the node, and one session serves many threads."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxmlu import runtime
from onnxmlu.errors import RuntimeLibraryError
from onnxmlu.precisions import PRECISIONS

from runtime_helpers import (
    DOMAIN,
    block_node,
    body_model,
    conv_relu_body,
    conv_relu_fused,
    fused_model,
    vi,
)

#: The labels the runtime library accepts, as its messages list them (custom_ops/label_rule.h).
_LABELS = f"{', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}"

TOL = dict(atol=1e-5, rtol=1e-5)


def plain_run(model, feeds):
    """The model (or body) in plain onnxruntime, no library: the reference numbers."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def creation_error(model) -> str:
    with pytest.raises(Exception) as info:  # onnxruntime's own exception types
        runtime.InferenceSession(model)
    return str(info.value)


# --- numbers ---------------------------------------------------------------------------------


def test_conv_relu_block_with_plain_onnxruntime(library):
    model, body = conv_relu_fused(mp=2)
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = rand((1, 3, 8, 8), seed=1)
    (got,) = session.run(None, {"x": x})
    (want,) = plain_run(body, {"x": x})
    assert got.shape == (1, 4, 8, 8) and got.dtype == np.float32
    assert (got > 0).any() and (got == 0).any()  # Relu really clipped something
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("source", ["proto", "bytes", "path"])
def test_conv_relu_block_with_onnxmlu_session(library, tmp_path, source):
    model, body = conv_relu_fused(mp=4)
    arg = {"proto": model, "bytes": model.SerializeToString(), "path": tmp_path / "fused.onnx"}[source]
    if source == "path":
        arg.write_bytes(model.SerializeToString())
    x = rand((1, 3, 8, 8), seed=2)
    (got,) = runtime.InferenceSession(arg).run(None, {"x": x})
    np.testing.assert_allclose(got, plain_run(body, {"x": x})[0], **TOL)
    (ref,) = runtime.reference_session(model).run(None, {"x": x})
    np.testing.assert_allclose(ref, got, **TOL)


def test_string_body_attribute(library):
    model, body = conv_relu_fused(body_as="string")
    body_attr = next(a for a in model.graph.node[0].attribute if a.name == "body")
    assert body_attr.type == helper.AttributeProto.STRING
    assert b"\x00" in body_attr.s  # the string path must be binary-safe
    x = rand((1, 3, 8, 8), seed=3)
    (got,) = runtime.InferenceSession(model).run(None, {"x": x})
    np.testing.assert_allclose(got, plain_run(body, {"x": x})[0], **TOL)


def test_body_in_external_data(library, tmp_path):
    """onnx.save(convert_attribute=True) moves the body tensor out (the >2 GB route)."""
    model, body = conv_relu_fused()
    path = tmp_path / "fused.onnx"
    onnx.save(model, path, save_as_external_data=True, location="fused.data", size_threshold=0, convert_attribute=True)
    stored = onnx.load(path, load_external_data=False)
    body_attr = next(a for a in stored.graph.node[0].attribute if a.name == "body")
    assert body_attr.t.data_location == TensorProto.EXTERNAL
    x = rand((1, 3, 8, 8), seed=8)
    (got,) = runtime.InferenceSession(path).run(None, {"x": x})
    np.testing.assert_allclose(got, plain_run(body, {"x": x})[0], **TOL)


def test_metadata_attributes_are_ignored(library):
    model, body = conv_relu_fused(
        layers=["conv0", "relu0"], op_types=["Conv", "Relu"], gops=0.0016, sim_latency_us=3.5
    )
    x = rand((1, 3, 8, 8), seed=4)
    np.testing.assert_allclose(runtime.InferenceSession(model).run(None, {"x": x})[0], plain_run(body, {"x": x})[0], **TOL)


def test_two_chained_blocks_match_the_unfused_model(library):
    first = conv_relu_body(seed=10, in_ch=3, out_ch=4, in_name="x", out_name="h")
    second = conv_relu_body(seed=11, in_ch=4, out_ch=2, in_name="h", out_name="y")
    fused = fused_model(
        [
            block_node("block_0 (mp=2)", ["x"], ["h"], first, mp=2),
            block_node("block_1 (mp=1)", ["h"], ["y"], second, mp=1),
        ],
        [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [vi("y", TensorProto.FLOAT, [1, 2, 8, 8])],
        value_info=[vi("h", TensorProto.FLOAT, [1, 4, 8, 8])],
    )
    original = body_model(
        [*first.graph.node, *second.graph.node],
        [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [vi("y", TensorProto.FLOAT, [1, 2, 8, 8])],
        [*first.graph.initializer, *second.graph.initializer],
    )
    for seed in range(3):
        x = rand((1, 3, 8, 8), seed=seed)
        (got,) = runtime.InferenceSession(fused).run(None, {"x": x})
        (want,) = runtime.reference_session(original).run(None, {"x": x})
        np.testing.assert_allclose(got, want, **TOL)


def aliased_outputs_model(kind: str, shape) -> tuple[onnx.ModelProto, list]:
    """One block whose body outputs alias: ``input`` (an output that is the body's input, beside a
    computed one), ``repeat`` (the same tensor listed twice), ``only-inputs`` (every output is an
    input: nothing to compute); each block output then feeds a Neg. Returns the model and what
    each Neg must give for x, as functions of x."""
    outputs = {"input": (["x", "r"], [lambda x: -x, lambda x: -np.maximum(x, 0)]),
               "repeat": (["r", "r"], [lambda x: -np.maximum(x, 0)] * 2),
               "only-inputs": (["x", "x"], [lambda x: -x] * 2)}[kind]
    names, want = outputs
    body = body_model([helper.make_node("Relu", ["x"], ["r"])], [vi("x", TensorProto.FLOAT, shape)],
                      [vi(n, TensorProto.FLOAT, shape) for n in names])
    outer = [f"b{k}" for k in range(len(names))]
    model = fused_model([block_node("aliased (mp=1)", ["x"], outer, body, mp=1),
                         *[helper.make_node("Neg", [o], [f"{o}_neg"]) for o in outer]],
                        [vi("x", TensorProto.FLOAT, shape)], [vi(f"{o}_neg", TensorProto.FLOAT, shape) for o in outer],
                        value_info=[vi(o, TensorProto.FLOAT, shape) for o in outer])
    return model, want


@pytest.mark.parametrize("shape", [[2, 3], ["N", 3]], ids=["static", "dynamic"])
@pytest.mark.parametrize("kind", ["input", "repeat", "only-inputs"])
def test_body_outputs_that_are_inputs_or_repeat_get_their_values(library, kind, shape):
    """onnxruntime's Run leaves a preallocated output that is a graph input unwritten and fills
    only one of two outputs of one name: the kernel copies such outputs itself, whether their
    shape is static (written in place) or not, and on every run."""
    model, want = aliased_outputs_model(kind, shape)
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    for seed in range(2):
        x = rand((2, 3), seed=seed)
        got = session.run(None, {"x": x})
        for value, expected in zip(got, want):
            np.testing.assert_array_equal(value, expected(x))


def mixed_dtype_model():
    """block_0: float -> (int64 argmax, bool mask, int64 shape); block_1 consumes int64 + bool."""
    body0 = body_model(
        [
            helper.make_node("ArgMax", ["x"], ["idx"], axis=1, keepdims=0),
            helper.make_node("Greater", ["x", "zero"], ["mask"]),
            helper.make_node("Shape", ["x"], ["shape"]),
        ],
        [vi("x", TensorProto.FLOAT, [2, 5])],
        [vi("idx", TensorProto.INT64, [2]), vi("mask", TensorProto.BOOL, [2, 5]), vi("shape", TensorProto.INT64, [2])],
        [numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    body1 = body_model(
        [
            helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["idx", "one"], ["idx1"]),
        ],
        [vi("idx", TensorProto.INT64, [2]), vi("mask", TensorProto.BOOL, [2, 5])],
        [vi("maskf", TensorProto.FLOAT, [2, 5]), vi("idx1", TensorProto.INT64, [2])],
        [numpy_helper.from_array(np.array(1, np.int64), "one")],
    )
    return fused_model(
        [
            block_node("block_0 (mp=1)", ["x"], ["idx", "mask", "shape"], body0, mp=1),
            block_node("block_1 (mp=1)", ["idx", "mask"], ["maskf", "idx1"], body1, mp=1),
        ],
        [vi("x", TensorProto.FLOAT, [2, 5])],
        [
            vi("maskf", TensorProto.FLOAT, [2, 5]),
            vi("idx1", TensorProto.INT64, [2]),
            vi("mask", TensorProto.BOOL, [2, 5]),
            vi("shape", TensorProto.INT64, [2]),
        ],
        value_info=[vi("idx", TensorProto.INT64, [2])],
    )


def test_mixed_dtypes_cross_block_boundaries(library):
    x = rand((2, 5), seed=5)
    maskf, idx1, mask, shape = runtime.InferenceSession(mixed_dtype_model()).run(None, {"x": x})
    assert (maskf.dtype, idx1.dtype, mask.dtype, shape.dtype) == (np.float32, np.int64, np.bool_, np.int64)
    np.testing.assert_array_equal(mask, x > 0)
    np.testing.assert_array_equal(maskf, (x > 0).astype(np.float32))
    np.testing.assert_array_equal(idx1, x.argmax(axis=1) + 1)
    np.testing.assert_array_equal(shape, [2, 5])


def dynamic_batch_model(declared_out_batch="N"):
    body = conv_relu_body(seed=20)
    body.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    out_dim = body.graph.output[0].type.tensor_type.shape.dim[0]
    if isinstance(declared_out_batch, str):
        out_dim.dim_param = declared_out_batch
    else:
        out_dim.dim_value = declared_out_batch
    fused = fused_model(
        [block_node("block_0 (mp=2)", ["x"], ["y"], body, mp=2)],
        [vi("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [vi("y", TensorProto.FLOAT, ["N", 4, 8, 8])],
    )
    return fused, body


@pytest.mark.parametrize("batch", [1, 3])
def test_symbolic_batch_uses_the_copy_path(library, batch):
    fused, body = dynamic_batch_model()
    x = rand((batch, 3, 8, 8), seed=batch)
    (got,) = runtime.InferenceSession(fused).run(None, {"x": x})
    assert got.shape == (batch, 4, 8, 8)
    np.testing.assert_allclose(got, plain_run(body, {"x": x})[0], **TOL)


def test_run_error_names_the_node(library):
    # The body claims a static batch of 1 for its output but computes batch 2.
    fused, _ = dynamic_batch_model(declared_out_batch=1)
    session = runtime.InferenceSession(fused)
    session.run(None, {"x": rand((1, 3, 8, 8))})
    with pytest.raises(Exception, match=r"MLUFusionBlock 'block_0 \(mp=2\)'") as info:
        session.run(None, {"x": rand((2, 3, 8, 8))})
    # Static outputs are handed to the inner Run pre-allocated (written in place, no copy).
    assert "pre-allocated" in str(info.value)


# --- bad nodes fail session creation ---------------------------------------------------------


def nested_model():
    inner = conv_relu_body(seed=30)
    body = body_model(
        [block_node("inner_block", ["x"], ["y"], inner, mp=1)],
        [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [vi("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        extra_opsets=[helper.make_opsetid(DOMAIN, 1)],
    )
    return fused_model(
        [block_node("outer_block", ["x"], ["y"], body, mp=1)],
        [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [vi("y", TensorProto.FLOAT, [1, 4, 8, 8])],
    )


def two_input_node_one_input_body():
    body = conv_relu_body(seed=40)
    return fused_model(
        [block_node("block_3 (mp=8)", ["x", "z"], ["y"], body, mp=8)],
        [vi("x", TensorProto.FLOAT, [1, 3, 8, 8]), vi("z", TensorProto.FLOAT, [1, 3, 8, 8])],
        [vi("y", TensorProto.FLOAT, [1, 4, 8, 8])],
    )


def wrong_output_dtype():
    body = conv_relu_body(seed=41)
    return fused_model(
        [block_node("block_5 (mp=2)", ["x"], ["h"], body, mp=2), helper.make_node("Cast", ["h"], ["y"], to=1)],
        [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [vi("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        value_info=[vi("h", TensorProto.INT64, [1, 4, 8, 8])],
    )


def string_boundary():
    body = body_model(
        [helper.make_node("Identity", ["s"], ["t"])],
        [vi("s", TensorProto.STRING, [2])],
        [vi("t", TensorProto.STRING, [2])],
    )
    return fused_model(
        [block_node("block_s (mp=1)", ["s"], ["t"], body, mp=1)],
        [vi("s", TensorProto.STRING, [2])],
        [vi("t", TensorProto.STRING, [2])],
    )


def float_tensor_body():
    model, _ = conv_relu_fused(name="block_f (mp=2)")
    attr = next(a for a in model.graph.node[0].attribute if a.name == "body")
    attr.t.CopyFrom(helper.make_tensor("body", TensorProto.FLOAT, [2], [1.0, 2.0]))
    return model


BAD_NODES = {
    "mp=0": (lambda: conv_relu_fused(mp=0)[0], ["block_0 (mp=2)", "'mp' must be between 1 and 1024", "got 0"]),
    "mp=-3": (lambda: conv_relu_fused(mp=-3)[0], ["block_0 (mp=2)", "'mp' must be between 1 and 1024", "got -3"]),
    "mp huge": (lambda: conv_relu_fused(mp=100000)[0], ["block_0 (mp=2)", "got 100000"]),
    "missing mp": (lambda: conv_relu_fused(mp=None)[0], ["block_0 (mp=2)", "required attribute 'mp'"]),
    "missing body": (
        lambda: fused_model(
            [block_node("block_7 (mp=1)", ["x"], ["y"], None, mp=1)],
            [vi("x", TensorProto.FLOAT, [1])],
            [vi("y", TensorProto.FLOAT, [1])],
        ),
        ["block_7 (mp=1)", "required attribute 'body'"],
    ),
    "corrupt body": (
        lambda: fused_model(
            [block_node("block_9 (mp=1)", ["x"], ["y"], b"\x08\x07definitely not protobuf\xff\xff", mp=1)],
            [vi("x", TensorProto.FLOAT, [1])],
            [vi("y", TensorProto.FLOAT, [1])],
        ),
        ["block_9 (mp=1)", "body is not a valid ONNX model:"],
    ),
    "float body tensor": (float_tensor_body, ["block_f (mp=2)", "must be a 1-D uint8 tensor", "float"]),
    "input count": (two_input_node_one_input_body, ["MLUFusionBlock 'block_3 (mp=8)': body has 1 input but the node has 2"]),
    "output dtype": (
        wrong_output_dtype,
        ["MLUFusionBlock 'block_5 (mp=2)': body output 0 ('y') is float but the node's output 0 is int64"],
    ),
    "nested": (nested_model, ["MLUFusionBlock 'outer_block'", "blocks cannot be nested", "inner_block"]),
    "string boundary": (string_boundary, ["block_s (mp=1)", "string tensors cannot cross a block boundary"]),
    # An optional attribute of the wrong type is told from an absent one through the C API's
    # typed reads, and the message names the type found.
    "precision an int": (lambda: conv_relu_fused(precision=3)[0],
                         ["block_0 (mp=2)", f"attribute 'precision' must be a string ({_LABELS}), got an int"]),
    "precision a graph": (lambda: conv_relu_fused(precision=conv_relu_body().graph)[0],
                          ["attribute 'precision' must be a string", "got a graph, a list of strings or tensors, a sparse tensor or an empty list"]),
    "digest a list": (lambda: conv_relu_fused(body_crc32=[1, 2])[0],
                      ["attribute 'body_crc32' must be an int (the CRC-32 of the body's bytes), got a list of ints"]),
    "shared_weights a float": (lambda: conv_relu_fused(shared_weights=1.0)[0],
                               ["attribute shared_weights must be an int", "got a float"]),
}


@pytest.mark.parametrize("case", list(BAD_NODES))
def test_bad_node_fails_session_creation_clearly(library, case):
    build, fragments = BAD_NODES[case]
    message = creation_error(build())
    for fragment in fragments:
        assert fragment in message, message
    # The process survived and the library still works.
    model, body = conv_relu_fused()
    x = rand((1, 3, 8, 8))
    np.testing.assert_allclose(runtime.InferenceSession(model).run(None, {"x": x})[0], plain_run(body, {"x": x})[0], **TOL)


def test_inner_threads_override(library, monkeypatch):
    model, body = conv_relu_fused(mp=2)
    x = rand((1, 3, 8, 8), seed=6)
    monkeypatch.setenv("ONNXMLU_INNER_THREADS", "1")
    np.testing.assert_allclose(runtime.InferenceSession(model).run(None, {"x": x})[0], plain_run(body, {"x": x})[0], **TOL)
    monkeypatch.setenv("ONNXMLU_INNER_THREADS", "many")
    assert "ONNXMLU_INNER_THREADS must be a non-negative integer, got 'many'" in creation_error(model)


# --- threads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_one_session_shared_by_eight_threads(library, dynamic):
    fused, body = dynamic_batch_model() if dynamic else conv_relu_fused(mp=2)
    session = runtime.InferenceSession(fused)
    reference = ort.InferenceSession(body.SerializeToString(), providers=["CPUExecutionProvider"])
    jobs = [(t, i) for t in range(8) for i in range(50)]
    batch = (lambda t, i: 1 + (t + i) % 3) if dynamic else (lambda t, i: 1)
    feeds = {job: rand((batch(*job), 3, 8, 8), seed=1000 * job[0] + job[1]) for job in jobs}
    want = {job: reference.run(None, {"x": x})[0] for job, x in feeds.items()}
    barrier = threading.Barrier(8)

    def worker(t):
        barrier.wait()  # start together so Compute calls really overlap
        return [(i, session.run(None, {"x": feeds[(t, i)]})[0]) for i in range(50)]

    with ThreadPoolExecutor(8) as pool:
        results = dict(zip(range(8), pool.map(worker, range(8))))
    for t, runs in results.items():
        for i, got in runs:
            np.testing.assert_allclose(got, want[(t, i)], **TOL)


# --- the shared CPU arena ---------------------------------------------------------------------


def test_sessions_sharing_the_env_arena_keep_their_numbers(library):
    # Every inner session of the process allocates from one arena on the env: blocks of
    # different sessions, alive together and run alternately, must not see each other's memory.
    sessions = []
    for k in range(3):
        fused, body = conv_relu_fused(mp=1 + k % 2, seed=20 + k)
        sessions.append((runtime.InferenceSession(fused), body))
    for i in range(5):
        for k, (session, body) in enumerate(sessions):
            x = rand((1, 3, 8, 8), seed=100 * k + i)
            np.testing.assert_allclose(session.run(None, {"x": x})[0], plain_run(body, {"x": x})[0], **TOL)


_USER_ALLOCATOR_SCRIPT = """
import sys
import numpy as np
import onnxruntime as ort
sys.path.insert(0, sys.argv[1])
from runtime_helpers import conv_relu_fused
from onnxmlu import runtime
info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
ort.create_and_register_allocator(info, None)  # the user's env allocator, before the library's
fused, body = conv_relu_fused(mp=2)
x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
for _ in range(2):  # the second session finds the env allocator registered too
    got = runtime.InferenceSession(fused).run(None, {"x": x})[0]
    want = ort.InferenceSession(body.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
print("ok")
"""


def test_user_registered_env_allocator_is_used_not_an_error(library):
    # The library registers its arena on the process env; when the user already registered a
    # CPU allocator there, registration fails inside the library and the inner sessions use the
    # user's. Needs a fresh process: this one's env already has the library's arena.
    _run_in_fresh_process(_USER_ALLOCATOR_SCRIPT)


def _run_in_fresh_process(script: str):
    """Run ``script`` (tests/ on its sys.path via argv[1]) in a new interpreter; it must print ok."""
    import subprocess
    import sys

    tests_dir = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", script, tests_dir], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
    return done


_GLOBAL_POOL_SCRIPT = """
import sys
import numpy as np
import onnxruntime as ort
from onnxruntime.capi import _pybind_state
_pybind_state.set_global_thread_pool_sizes(2, 1)  # before the env exists
sys.path.insert(0, sys.argv[1])
from runtime_helpers import conv_relu_fused
from onnxmlu import runtime
fused, body = conv_relu_fused(mp=2)
x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
options = ort.SessionOptions()
options.use_per_session_threads = False  # onnxruntime's Python API requires it of every session here
got = runtime.InferenceSession(fused, options).run(None, {"x": x})[0]
assert options.get_session_config_entry(runtime.INNER_GLOBAL_POOL_KEY) == "1"
plain = ort.SessionOptions()
plain.use_per_session_threads = False
want = ort.InferenceSession(body.SerializeToString(), plain, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
print("ok")
"""


def test_global_thread_pools_reach_the_inner_sessions(library):
    # A process with global thread pools: the user's options have per-session threads off, the
    # inner sessions run on the global pool too. Needs a fresh process (pools are set before the env).
    done = _run_in_fresh_process(_GLOBAL_POOL_SCRIPT)
    assert "EP Error" not in done.stdout + done.stderr  # block layouts' sessions use the global pool too


# --- Python API ------------------------------------------------------------------------------


def test_session_options_apply_the_measured_set_up(library):
    options = runtime.session_options()
    assert options.intra_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry(runtime.INNER_THREADS_KEY) == "0"  # min(mp, hardware threads)
    assert options.get_session_config_entry(runtime.INNER_SPINNING_KEY) == "1"
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    slow = runtime.session_options(intra_op_threads=3, optimize=False)
    assert slow.intra_op_num_threads == 3
    assert slow.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL


def test_user_options_get_the_library_once(library):
    model, body = conv_relu_fused()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    x = rand((1, 3, 8, 8), seed=7)
    for _ in range(2):  # the second call must not register the library again
        (got,) = runtime.InferenceSession(model, sess_options=options).run(None, {"x": x})
        np.testing.assert_allclose(got, plain_run(body, {"x": x})[0], **TOL)
    assert options.intra_op_num_threads == 2


def test_registering_twice_is_harmless(library):
    """The user registered the library already; onnxmlu.InferenceSession must not fail."""
    model, body = conv_relu_fused()
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    options.register_custom_ops_library(library)
    assert options.get_session_config_entry("onnxmlu.custom_ops_registered") == "1"
    x = rand((1, 3, 8, 8), seed=9)
    (got,) = runtime.InferenceSession(model, sess_options=options).run(None, {"x": x})
    np.testing.assert_allclose(got, plain_run(body, {"x": x})[0], **TOL)


def test_missing_library_is_a_clear_error(monkeypatch, tmp_path):
    missing = tmp_path / "nope.so"
    monkeypatch.setenv(runtime.LIBRARY_ENV, str(missing))
    with pytest.raises(RuntimeLibraryError, match="nope.so"):
        runtime.custom_ops_library()
    with pytest.raises(RuntimeLibraryError):
        runtime.InferenceSession(conv_relu_fused()[0])


def test_default_library_path(library, monkeypatch):
    monkeypatch.delenv(runtime.LIBRARY_ENV, raising=False)
    path = runtime.custom_ops_library()
    assert os.path.isabs(path) and os.path.isfile(path)
    assert path.endswith(os.path.join("onnxmlu", "_lib", "libonnxmlu_ops.so"))


def test_missing_library_message_says_what_to_do_for_each_kind_of_install(tmp_path):
    """A source checkout is told to run `make install`; a pip install to reinstall the wheel
    (advice a pip user can follow), never the other way round."""
    checkout = tmp_path / "checkout"
    (checkout / "custom_ops").mkdir(parents=True)
    (checkout / "custom_ops" / "CMakeLists.txt").write_text("")
    (checkout / "Makefile").write_text("")
    text = runtime.session._missing_library_message(checkout / "onnxmlu" / "_lib" / "libonnxmlu_ops.so")
    assert "make install" in text and "pip install --force-reinstall" not in text
    site = tmp_path / "venv" / "lib" / "site-packages" / "onnxmlu" / "_lib" / "libonnxmlu_ops.so"
    text = runtime.session._missing_library_message(site)
    assert "pip install --force-reinstall onnxmlu" in text and "make install" not in text
    assert runtime.LIBRARY_ENV in text and "\n" not in text


# --- inner thread set-up ---------------------------------------------------------------------


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def threads_added_by(make_session):
    """Threads a session's creation starts (pool workers: intra-op threads - 1 per pool)."""
    before = thread_count()
    session = make_session()
    return thread_count() - before, session


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_user_thread_budget_goes_to_the_inner_sessions(library, monkeypatch):
    """intra_op_num_threads = T from the user gives the block T threads (T - 1 pool workers),
    whatever its mp; the outer keeps the user's setting."""
    monkeypatch.delenv("ONNXMLU_INNER_THREADS", raising=False)
    model, body = conv_relu_fused(mp=1)
    x = rand((1, 3, 8, 8), seed=11)
    want = plain_run(body, {"x": x})[0]
    for threads in (1, 4):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # outer: no pool, so every new thread is the block's
        options.add_session_config_entry(runtime.INNER_THREADS_KEY, str(threads))
        added, session = threads_added_by(lambda: runtime.InferenceSession(model, options))  # noqa: B023 - called now
        assert added == threads - 1
        np.testing.assert_allclose(session.run(None, {"x": x})[0], want, **TOL)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 3
    runtime.InferenceSession(model, options)
    assert options.get_session_config_entry(runtime.INNER_THREADS_KEY) == "3"
    assert options.intra_op_num_threads == 3


def test_user_spinning_off_reaches_the_inner_sessions(library):
    model, _ = conv_relu_fused()
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    runtime.InferenceSession(model, options)
    assert options.get_session_config_entry(runtime.INNER_SPINNING_KEY) == "0"
    explicit = ort.SessionOptions()
    explicit.add_session_config_entry(runtime.INNER_THREADS_KEY, "2")
    explicit.intra_op_num_threads = 5
    runtime.InferenceSession(model, explicit)
    assert explicit.get_session_config_entry(runtime.INNER_THREADS_KEY) == "2"  # the user's entry wins


def test_sessions_with_different_inner_set_ups_coexist(library):
    """Each inner set-up registers its own op; sessions made with either keep working."""
    model, body = conv_relu_fused(mp=2)
    x = rand((1, 3, 8, 8), seed=12)
    want = plain_run(body, {"x": x})[0]
    sessions = [runtime.InferenceSession(model, runtime.session_options(inner_threads=t, inner_spinning=spin))
                for t in (1, 2, 3) for spin in (True, False)]
    sessions.append(runtime.InferenceSession(model, runtime.session_options(inner_threads=2)))  # a repeat
    for session in sessions:
        np.testing.assert_allclose(session.run(None, {"x": x})[0], want, **TOL)


@pytest.mark.parametrize("key, value, message", [
    ("onnxmlu.inner_threads", "lots", "onnxmlu.inner_threads must be an integer from 0 to 4096, got 'lots'"),
    ("onnxmlu.inner_threads", "-1", "got '-1'"),
    ("onnxmlu.inner_threads", "", "got ''"),
    ("onnxmlu.inner_spinning", "yes", "onnxmlu.inner_spinning must be '0' or '1', got 'yes'"),
    ("onnxmlu.inner_global_pool", "on", "onnxmlu.inner_global_pool must be '0' or '1', got 'on'"),
])
def test_bad_inner_config_is_a_clear_error(library, key, value, message):
    options = ort.SessionOptions()
    options.add_session_config_entry(key, value)
    with pytest.raises(Exception, match=message):
        runtime.InferenceSession(conv_relu_fused()[0], options)


# --- block layouts ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mobilenetv2", "resnet18"])
def test_block_layouts_drop_reorders_and_keep_the_numbers(library, name):
    """Blocks exchanging NCHWc (residual Adds folded, boundary reorders dropped) give the same
    numbers as the blocks as written and as the original model."""
    from onnxmlu import api
    from onnxmlu.tools.verify import random_inputs
    from onnxmlu.tools.zoo import build_model

    original = build_model(name, batch=2)
    fused = api.fuse(original, strategy="dlfusion").model
    rewritten, removed = runtime.optimize_block_layouts(fused)
    assert removed > 0
    feeds = random_inputs(original, seed=3)
    want = runtime.reference_session(original).run(None, feeds)
    plain = runtime.InferenceSession(fused, block_layouts=False).run(None, feeds)
    for got in (runtime.InferenceSession(fused).run(None, feeds), runtime.InferenceSession(rewritten).run(None, feeds)):
        for g, w, p in zip(got, want, plain):
            np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)
            np.testing.assert_allclose(g, p, atol=1e-4, rtol=1e-4)


def test_block_layouts_leave_unloadable_bodies_to_the_library(library):
    """A corrupt body is not rewritten: session creation still fails with the library's message."""
    model, _ = conv_relu_fused(mp=2)
    body = next(a for a in model.graph.node[0].attribute if a.name == "body")
    body.t.raw_data = b"not a model"
    body.t.dims[:] = [len(body.t.raw_data)]
    assert runtime.optimize_block_layouts(model)[1] == 0
    assert "body is not a valid ONNX model" in creation_error(model)


def _parallel_copies(model: onnx.ModelProto) -> list[str]:
    """The Max(x, x) copies the layout pass gave the model's block bodies."""
    from onnxmlu.schema import body_model as stored_body, is_fusion_block

    return [n.name for node in model.graph.node if is_fusion_block(node)
            for n in stored_body(node).graph.node if n.op_type == "Max"]


def test_residual_copies_at_block_edges_run_on_the_block_threads(library):
    """A Conv whose fused residual Add reads a block input, or writes a block output, must copy
    the added tensor: a block on two threads gets that copy as a parallel Max(x, x), one on one
    thread keeps the kernel's own; both give the original's numbers."""
    from onnxmlu import api
    from onnxmlu.tools.verify import random_inputs
    from onnxmlu.tools.zoo import build_model

    original = build_model("resnet18", batch=2)
    fused = api.fuse(original, strategy="dlfusion").model
    two = _parallel_copies(runtime.optimize_block_layouts(fused, inner_threads=2)[0])
    assert any(n.endswith("_sum_copy") for n in two) and any(n.endswith("_out_copy") for n in two)
    assert _parallel_copies(runtime.optimize_block_layouts(fused, inner_threads=1)[0]) == []
    feeds = random_inputs(original, seed=3)
    want = runtime.reference_session(original).run(None, feeds)
    for threads in (1, 2):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        got = runtime.InferenceSession(fused, options).run(None, feeds)
        np.testing.assert_allclose(got[0], want[0], atol=1e-4, rtol=1e-4)
