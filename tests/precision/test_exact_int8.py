"""INT8 arithmetic is exact (32-bit accumulation) on every host, and every session the package
makes is set up for it (onnxmlu/sessions.py).

On this suite's usual host (x86 with AVX-512 VNNI) onnxruntime's integer kernels are exact
anyway, so a comparison run only here could not fail for the bug that matters: on CPUs without
VNNI the u8 x s8 kernels saturate 16-bit pair sums. The same check therefore also runs under
user-mode emulation of CPUs without VNNI (Debian's ``qemu-user``: ``qemu-x86_64 -cpu
Skylake-Client`` is AVX2, ``-cpu Nehalem`` SSE4.2), where onnxruntime's dispatch picks those
CPUs' kernels. The reference is exact integer arithmetic in numpy (exact_int8_check.py).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ci import unavailable
from exact_int8_check import check

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: Emulated CPU -> what it lacks; its kernels, not this host's, run under qemu.
EMULATED = {"Skylake-Client": "AVX2, no VNNI", "Nehalem": "SSE4.2, no AVX"}
#: Where a plain onnxruntime session on that CPU is not exact for these layers (measured):
#: the proof that the emulation reaches the saturating kernels, so the test can fail.
SATURATES = {"Skylake-Client"}
#: The library's switch that makes its retry without the exact entry an error (inner_session.cc).
RETRY_IS_AN_ERROR = "ONNXMLU_EXACT_INT8_STRICT"


def _assert_exact(result: dict) -> None:
    for layer, runs in result.items():
        assert runs["fused"] < 1, f"{layer}: the fused model is {runs['fused']} steps from exact"
        assert runs["reference"] < 1, f"{layer}: the reference is {runs['reference']} steps from exact"
        assert runs["options"] < 1, f"{layer}: the package's session options are {runs['options']} steps from exact"
        assert runs["timing"] < 1, f"{layer}: the timed plain session is {runs['timing']} steps from exact"
        assert runs["whole"] < 1, f"{layer}: onnxmlu.InferenceSession of the original is {runs['whole']} steps from exact"
        assert runs["external"] < 1, f"{layer}: the original with external data is {runs['external']} steps from exact"


def test_int8_layers_are_exact_here(library):
    _assert_exact(check())


@pytest.mark.parametrize("cpu", sorted(EMULATED))
def test_int8_layers_are_exact_on_an_emulated_cpu_without_vnni(cpu, library):
    # strict: a block that needs the library's retry without the exact entry is an error
    done = _emulated(cpu, [], strict=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if cpu in SATURATES:
        assert max(runs["default"] for runs in result.values()) > 0, f"{cpu} ({EMULATED[cpu]}) did not saturate"
    _assert_exact(result)


def _emulated(cpu: str, args: list[str], strict: bool) -> subprocess.CompletedProcess:
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        unavailable("qemu-x86_64 is not installed (Debian: apt-get install qemu-user)")
    env = {**os.environ, RETRY_IS_AN_ERROR: "1" if strict else "0"}
    return subprocess.run([qemu, "-cpu", cpu, sys.executable, str(HERE / "exact_int8_check.py"), *args], cwd=HERE,
                          capture_output=True, text=True, timeout=600, check=False, env=env)


def test_a_block_retried_without_exact_kernels_says_so_once(library):
    """A third-party file whose block shares a quantized weight: on an AVX2 CPU the library loads
    it without the exact entry, and says once, through onnxruntime's logger, that its INT8
    arithmetic may saturate (here it does); the package's own fuse of the same model is exact
    without the retry (``qlinear_matmul_shared`` above, run strict)."""
    done = _emulated("Skylake-Client", ["third-party"], strict=False)
    assert done.returncode == 0, done.stderr[-2000:]
    warnings = [line for line in done.stderr.splitlines() if "may saturate on this CPU" in line]
    assert len(warnings) == 1, done.stderr[-2000:]
    assert "MLUFusionBlock 'block_0" in warnings[0]
    assert json.loads(done.stdout.strip().splitlines()[-1]) > 0, "the retried block did not saturate"


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and (getattr(n.func, "attr", None) == name or getattr(n.func, "id", None) == name)]


def test_every_onnxruntime_session_gets_its_options_from_one_helper():
    """By construction: ``SessionOptions()`` is called only in onnxmlu/sessions.py, and every
    ``ort.InferenceSession(...)`` in the package and its scripts is given options (the
    package's own InferenceSession adds the entry to a caller's)."""
    made, bare = [], []
    for path in sorted([*(ROOT / "onnxmlu").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(ROOT).as_posix()
        made += [f"{where}:{c.lineno}" for c in _calls(tree, "SessionOptions") if where != "onnxmlu/sessions.py"]
        bare += [f"{where}:{c.lineno}" for c in _calls(tree, "InferenceSession")
                 if getattr(c.func, "value", None) is not None and getattr(c.func.value, "id", "") in ("ort", "onnxruntime")
                 and len(c.args) < 2 and not any(k.arg == "sess_options" for k in c.keywords)]
    assert not made, f"SessionOptions() made outside onnxmlu/sessions.py (use new_options): {made}"
    assert not bare, f"onnxruntime sessions without options (pass onnxmlu.sessions.new_options()): {bare}"


def _bodies_load_with_the_exact_entry(fused) -> None:
    """Each block body of ``fused`` creates an onnxruntime session with the exact-INT8 entry set
    (onnxruntime applies it on every x86 host when it is set)."""
    import onnxruntime as ort

    from onnxmlu.schema import body_model
    from onnxmlu.sessions import EXACT_INT8_KEY, new_options

    bodies = [body_model(n) for n in fused.graph.node if n.op_type == "MLUFusionBlock"]
    assert bodies
    for body in bodies:
        options = new_options("all", exact=False)
        options.add_session_config_entry(EXACT_INT8_KEY, "1")
        ort.InferenceSession(body.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])


def test_int8_bodies_load_with_the_exact_entry_on_any_host(library):
    """onnxruntime applies :data:`~onnxmlu.sessions.EXACT_INT8_KEY` on every x86 host when it is
    set, so this host shows what a host without VNNI meets: a quantized constant that two nodes
    read (the ``1`` both Adds of auto_plan_check.py's model add) made session creation fail, and
    the library's retry without the entry ran the saturating kernels."""
    from auto_plan_check import sensitive_model
    from onnxmlu import api

    fused = api.fuse(sensitive_model(), precision="int8").model
    _bodies_load_with_the_exact_entry(fused)


def test_a_model_arriving_quantized_loads_with_the_exact_entry_too(library, tmp_path):
    """The same for a block that keeps the model's own quantization: onnxruntime's quantizer
    writes auto_plan_check.py's model with one quantized ``1`` that both Adds read."""
    import numpy as np
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_static

    from auto_plan_check import C, HW, sensitive_model
    from onnxmlu import api

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"x": np.random.default_rng(k).standard_normal((1, C, HW, HW)).astype(np.float32)}
                               for k in range(2)])

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(sensitive_model(), tmp_path / "q.onnx", Reader(), activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, per_channel=True)
    fused = api.fuse(onnx.load(tmp_path / "q.onnx")).model
    _bodies_load_with_the_exact_entry(fused)


def test_qlinearmatmul_weights_that_cannot_saturate_keep_s8(library):
    """The opset-21 QLinearMatMul rewrite (u8 weights: exact everywhere, slower u8 x u8 kernels on
    VNNI hosts) is skipped where every ``|w| <= 64``: no 16-bit pair sum can saturate then (that
    case's exactness under Skylake-Client, ``default`` included, is test above's)."""
    import numpy as np
    from onnx import numpy_helper

    from exact_int8_check import qlinear_matmul_7bit, qlinear_matmul_u8
    from onnxmlu import api
    from onnxmlu.schema import body_model

    def weight_type(build) -> np.dtype:
        model = build(np.random.default_rng(0))[0]
        bodies = [body_model(n) for n in api.fuse(model, precision="int8").model.graph.node
                  if n.op_type == "MLUFusionBlock"]
        [body] = bodies
        inits = {t.name: t for t in body.graph.initializer}
        [node] = [n for n in body.graph.node if n.op_type == "QLinearMatMul"]
        return numpy_helper.to_array(inits[node.input[3]]).dtype

    assert weight_type(qlinear_matmul_7bit) == np.int8
    assert weight_type(qlinear_matmul_u8) == np.uint8


def test_a_host_graph_sharing_a_quantized_weight_loads_with_the_exact_entry(library):
    """onnxmlu.InferenceSession's own graph (a fused model's host part, or a model run whole)
    with one quantized weight read by two nodes: where the exact entry is set (every x86 host
    without VNNI; forced here, where onnxruntime applies it too) the session failed to load
    ("Attempt to replace the existing tensor"); it loads and computes the integers exactly."""
    import numpy as np
    import onnxruntime as ort

    from exact_int8_check import matmul_integer_shared, qlinear_matmul_shared
    from onnxmlu import InferenceSession
    from onnxmlu.sessions import EXACT_INT8_KEY

    for build in (qlinear_matmul_shared, matmul_integer_shared):
        model, feeds, exact, _ = build(np.random.default_rng(0))
        options = ort.SessionOptions()
        options.add_session_config_entry(EXACT_INT8_KEY, "1")
        got = InferenceSession(model, options).run(None, feeds)[0]
        assert np.array_equal(got.astype(np.int64), exact.astype(np.int64)), build.__name__


def test_qdq_products_beside_an_s8_qlinearconv_get_u8_weights(library):
    """A block holding an s8-activation QLinearConv loads only without the exact entry (on a CPU
    without VNNI the library retries it so): its u8-activation QDQ Conv, which onnxruntime's QDQ
    fusion makes a u8 x s8 kernel, saturated there (5 output steps under Skylake-Client,
    ``s8_conv_and_u8_qdq_conv`` above). Seen on any host: the body's weight DequantizeLinear
    reads u8 weights (``w ^ 0x80``, the same floats), and onnxruntime fuses it into a u8 x u8
    QLinearConv, exact without the entry; the s8 x s8 layer keeps its s8 weights."""
    import numpy as np
    import onnx

    from exact_int8_check import s8_conv_and_u8_qdq_conv
    from onnxmlu import api
    from onnxmlu.runtime import reference_session
    from onnxmlu.schema import body_model
    from onnxmlu.sessions import needs_default_kernels

    model, feeds, exact, step = s8_conv_and_u8_qdq_conv(np.random.default_rng(0))
    [body] = [body_model(n) for n in api.fuse(model, precision="int8").model.graph.node if n.op_type == "MLUFusionBlock"]
    assert needs_default_kernels(body)
    inits = {t.name: t.data_type for t in body.graph.initializer}
    [conv] = [n for n in body.graph.node if n.op_type == "QLinearConv"]
    weights = [inits[n.input[0]] for n in body.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert inits[conv.input[3]] == onnx.TensorProto.INT8
    assert weights == [onnx.TensorProto.UINT8]
    got = reference_session(body).run(["y2"], feeds)[0]
    assert np.max(np.abs(got - exact)) / step < 1


def test_the_timed_plain_session_loads_what_every_session_loads(library, monkeypatch, tmp_path):
    """The plain session the demo, benchmarks and profiles time the original with
    (onnxmlu.tools.timing.plain_session) gets the package's exact entry where the host needs it
    (forced here: onnxruntime applies it on every x86 host) and the model bytes every other
    session gets: a weight two quantized nodes share made it fail to load ("Attempt to replace
    the existing tensor"); an opset-21 QLinearMatMul timed a saturating kernel (35 steps under
    Skylake-Client, the ``timing`` runs above). From a ModelProto and from a path."""
    import numpy as np
    import onnx

    from exact_int8_check import qlinear_matmul_shared, qlinear_matmul_u8, s8_conv_and_u8_qdq_conv
    from onnxmlu import sessions
    from onnxmlu.tools.timing import plain_session

    monkeypatch.setattr(sessions, "default_kernels_exact", lambda: False)
    for build in (qlinear_matmul_shared, qlinear_matmul_u8, s8_conv_and_u8_qdq_conv):
        model, feeds, exact, _ = build(np.random.default_rng(0))
        path = tmp_path / f"{build.__name__}.onnx"
        onnx.save(model, path)
        for source in (model, str(path)):
            session = plain_session(source, 1)
            entry = "0" if build is s8_conv_and_u8_qdq_conv else "1"  # onnxruntime has no kernel under it there
            assert session.get_session_options().get_session_config_entry(sessions.EXACT_INT8_KEY) == entry
            got = session.run(None, feeds)[0]
            assert np.array_equal(got.astype(np.int64), exact.astype(np.int64)), build.__name__


def test_a_model_with_an_s8_qlinearconv_loads_under_the_exact_entry(library):
    """onnxmlu.InferenceSession of a model whose own graph holds an s8-activation QLinearConv
    (with a u8 x s8 QDQ Conv beside it), given options that set the exact entry (the package's
    own do on every x86 host without VNNI; onnxruntime applies it here too): onnxruntime has no
    kernel for it under the entry, and the session failed to load. It loads without the entry,
    its u8 x s8 layer made u8 x u8, exact, and the caller's options keep the entry."""
    import numpy as np
    import onnxruntime as ort

    from exact_int8_check import s8_conv_and_u8_qdq_conv
    from onnxmlu import InferenceSession
    from onnxmlu.sessions import EXACT_INT8_KEY

    model, feeds, exact, step = s8_conv_and_u8_qdq_conv(np.random.default_rng(0))
    options = ort.SessionOptions()
    options.add_session_config_entry(EXACT_INT8_KEY, "1")
    session = InferenceSession(model, options)
    assert session.get_session_options().get_session_config_entry(EXACT_INT8_KEY) == "0"
    assert np.max(np.abs(session.run(None, feeds)[0] - exact)) / step < 1
    assert options.get_session_config_entry(EXACT_INT8_KEY) == "1"


@pytest.mark.parametrize("threshold", [0, 64])
def test_a_model_with_external_data_is_rewritten_without_reading_its_weights(library, tmp_path, threshold):
    """A model file whose tensors (every one, or those of 64 bytes or more) are in an external
    file, given to onnxmlu.InferenceSession by path with the exact entry set (the package's
    options set it on every x86 host without VNNI; onnxruntime applies it here too): it was
    loaded as it is, so a weight two nodes share failed to load, an s8-activation QLinearConv
    found no kernel, and an opset-21 QLinearMatMul saturated (35 steps under Skylake-Client,
    ``external`` above). Its graph is rewritten without the weights' bytes (none is inline in
    the bytes onnxruntime gets), and the outputs are exact."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from exact_int8_check import matmul_integer_shared, qlinear_matmul_shared, qlinear_matmul_u8, s8_conv_and_u8_qdq_conv
    from onnxmlu import InferenceSession
    from onnxmlu.runtime import loadable_source
    from onnxmlu.sessions import EXACT_INT8_KEY

    for build in (qlinear_matmul_shared, matmul_integer_shared, qlinear_matmul_u8, s8_conv_and_u8_qdq_conv):
        model, feeds, exact, step = build(np.random.default_rng(0))
        path = tmp_path / f"{build.__name__}.onnx"
        onnx.save(model, path, save_as_external_data=True, location=f"{build.__name__}.data", size_threshold=threshold)
        options = ort.SessionOptions()
        options.add_session_config_entry(EXACT_INT8_KEY, "1")
        got = InferenceSession(str(path), options).run(None, feeds)[0]
        assert np.max(np.abs(got.astype(np.float64) - exact)) / step < 1, build.__name__
        with loadable_source(str(path), options) as source:
            inline = [t.name for t in onnx.load_from_string(source).graph.initializer
                      if t.data_location != onnx.TensorProto.EXTERNAL and np.prod(t.dims) >= 64]
            assert not inline, f"{build.__name__}: weights read into the rewritten graph: {inline}"
