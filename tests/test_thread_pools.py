"""Thread pools of fused models: no more threads and no more pool wake-ups than the originals.

Each MLUFusionBlock kernel runs its block in an inner onnxruntime session, and a session on T
intra-op threads owns a pool of T - 1 workers unless it runs on the env's global pool. Three
fused models of four blocks each, loaded with 16 intra-op threads (any machine can create
them), would hold 3 x (4 + 1) pools of 15 workers where three originals hold 3 pools; every run
would wake four pools where the original wakes one. The checks run in fresh processes (thread
counts through /proc/self/task; global pools must be set before the process's first session)
and read the pools through the library's own report (onnxmlu.runtime.threads).

Two set-ups keep a pool per block, named here: plain onnxruntime with per-session pools (the
library cannot reach another session's pool, and onnxruntime offers no pool a custom op could
share but the env's global one, which only its user can create), and blocks separated by host
ops in onnxmlu.InferenceSession (each run of consecutive blocks is one inner session).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from runtime_helpers import block_node, conv_relu_body, fused_model, vi

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")

THREADS = 16
BLOCKS = 4
CHANNELS = 4

_SCRIPT = """
import json, os, sys
import numpy as np
import onnx
import onnxruntime as ort
kind, path, threads, global_pools = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
if global_pools:
    ort.set_global_thread_pool_sizes(threads, 1)  # before the process's first session
from onnxmlu import runtime
from onnxmlu.runtime.threads import thread_report
models = [onnx.load(path) for _ in range(3)]
sessions = []
for model in models:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.use_per_session_threads = not global_pools
    if kind == "onnxmlu":
        sessions.append(runtime.InferenceSession(model, options))
    else:  # plain onnxruntime; the library registered as a user of a fused file must
        options.register_custom_ops_library(runtime.custom_ops_library())
        sessions.append(ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]))
x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
outputs = [s.run(None, {"x": x})[0] for s in sessions]
before = thread_report()
sessions[0].run(None, {"x": x})
ran = thread_report() - before
print(json.dumps({"threads": len(os.listdir("/proc/self/task")), "own_pools": before.own_pools,
                  "own_pool_wakeups": ran.own_pool_runs, "global_pool_runs": ran.global_runs,
                  "output": outputs[0].ravel().tolist()}))
"""


def _link(k: int) -> onnx.ModelProto:
    """Chain link ``k`` (Conv + Relu, input t{k}, output t{k+1}) as a standalone model."""
    return conv_relu_body(seed=k, in_ch=3 if k == 0 else CHANNELS, out_ch=CHANNELS, in_name=_t(k), out_name=_t(k + 1))


def _t(k: int) -> str:
    return "x" if k == 0 else f"t{k}"


def original_chain() -> onnx.ModelProto:
    bodies = [_link(k) for k in range(BLOCKS)]
    graph = helper.make_graph([n for b in bodies for n in b.graph.node], "chain",
                              [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [vi(_t(BLOCKS), TensorProto.FLOAT, [1, CHANNELS, 8, 8])],
                              initializer=[t for b in bodies for t in b.graph.initializer])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def fused_chain(host_op_after: int | None = None) -> onnx.ModelProto:
    """The chain as one block per link (mp = 16: its threads follow the user's budget); with
    ``host_op_after`` = k an Identity on the host between block k and block k + 1."""
    nodes, infos = [], []
    for k in range(BLOCKS):
        source = _t(k) if host_op_after is None or k != host_op_after + 1 else f"host{k}"
        nodes.append(block_node(f"block_{k} (mp=16)", [source], [_t(k + 1)], _link(k), mp=16))
        infos.append(vi(_t(k + 1), TensorProto.FLOAT, [1, CHANNELS, 8, 8]))
        if host_op_after == k:
            nodes.append(helper.make_node("Identity", [_t(k + 1)], [f"host{k + 1}"], name="host"))
            infos.append(vi(f"host{k + 1}", TensorProto.FLOAT, [1, CHANNELS, 8, 8]))
    return fused_model(nodes, [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                       [vi(_t(BLOCKS), TensorProto.FLOAT, [1, CHANNELS, 8, 8])], value_info=infos[:-1])


def _load_three(tmp_path, model: onnx.ModelProto, kind: str, global_pools: bool) -> dict:
    """Thread count, pools and one run's wake-ups of a fresh process holding three copies."""
    path = tmp_path / f"{kind}-{len(model.graph.node)}-{int(global_pools)}.onnx"
    onnx.save(model, path)
    done = subprocess.run([sys.executable, "-c", _SCRIPT, kind, str(path), str(THREADS), "1" if global_pools else "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _pools_woken(report: dict) -> int:
    """Pools one run woke: each inner session with its own pool, plus the global pool if used."""
    return report["own_pool_wakeups"] + (1 if report["global_pool_runs"] else 0)


@pytest.mark.parametrize("kind, global_pools", [("onnxmlu", False), ("onnxmlu", True), ("plain", True)],
                         ids=["onnxmlu-per-session-pools", "onnxmlu-global-pool", "plain-onnxruntime-global-pool"])
def test_three_fused_models_hold_no_more_threads_than_three_originals(library, tmp_path, kind, global_pools):
    original = _load_three(tmp_path, original_chain(), "plain", global_pools)
    fused = _load_three(tmp_path, fused_chain(), kind, global_pools)
    np.testing.assert_allclose(fused["output"], original["output"], rtol=1e-4, atol=1e-4)
    assert fused["threads"] <= original["threads"], (fused, original)
    assert _pools_woken(fused) <= 1, fused  # the original's run wakes its one pool


def test_plain_onnxruntime_with_per_session_pools_keeps_a_pool_per_block(library, tmp_path):
    # Named case: onnxruntime builds each inner session's pool and offers a custom op no pool to
    # share but the env's global one, which only the user can create (README, "Threads").
    fused = _load_three(tmp_path, fused_chain(), "plain", False)
    assert fused["own_pools"] == 3 * BLOCKS and fused["own_pool_wakeups"] == BLOCKS


def test_blocks_split_by_a_host_op_keep_a_pool_per_run_of_blocks(library, tmp_path):
    # Named case: a host op between blocks 1 and 2 leaves two runs of blocks, two inner sessions.
    fused = _load_three(tmp_path, fused_chain(host_op_after=1), "onnxmlu", False)
    assert fused["own_pools"] == 3 * 2 and fused["own_pool_wakeups"] == 2


def test_pool_note_names_the_missing_global_pool():
    from onnxmlu.runtime.threads import ThreadReport, pool_note

    assert pool_note(ThreadReport(1, 15, 0, 0, 0)) is None
    assert "global thread pool" in pool_note(ThreadReport(2, 30, 0, 0, 0))


@pytest.mark.parametrize("host_op", [True, False], ids=["split-by-a-host-op", "blocks-only"])
def test_run_profile_says_when_blocks_pay_for_a_pool_each(library, tmp_path, monkeypatch, host_op):
    from typer.testing import CliRunner

    from onnxmlu.cli import app

    path = tmp_path / "fused.onnx"
    onnx.save(fused_chain(host_op_after=1 if host_op else None), path)
    monkeypatch.setenv("ONNXMLU_INNER_THREADS", "2")  # a pool per inner session on any host
    result = CliRunner().invoke(app, ["run", str(path), "--repeat", "2", "--profile", "--json",
                                      str(tmp_path / "run.json")], catch_exceptions=False, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    note = json.loads((tmp_path / "run.json").read_text()).get("thread_note")
    if host_op:
        assert note is not None and note.startswith("2 blocks run in inner sessions with a thread pool each")
        assert "global thread pool" in note
        # one line, as every other note (it was cut at 80 columns wherever the words fell)
        assert f"threads: {note}" in result.output.splitlines(), result.output
    else:
        assert note is None
