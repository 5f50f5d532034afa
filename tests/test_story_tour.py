"""The tour of issue 33 with models of its kinds, built here: a QDQ CNN, a model with symbolic
dims, a token-id encoder with an embedding, a model whose outputs are NaN in both runs. Each
test is a contradiction the tour found between two commands (or two renderings of one
verdict), held fixed: the table ``fuse --check`` prints, the JSON and the HTML report must give
one verdict and one rule; ``inspect`` says the shape its sizes are at, as ``fuse`` does."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnxmlu.cli import app
from onnxmlu.tools.testing import make_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_html_report import Page  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "precision"))
from quantized_models import float_cnn, quantized  # noqa: E402

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _weight(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)


def nan_in_both() -> onnx.ModelProto:
    """conv -> Log -> conv: random inputs make negative conv outputs, so both runs hold NaN at
    the same places (the reference and the fused model agree, and the check must still fail)."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Log", ["c1"], ["l"], name="log"),
             helper.make_node("Conv", ["l", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "nan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [_weight(rng, "w1", 8, 3, 3, 3), _weight(rng, "w2", 4, 8, 3, 3)])
    return make_model(graph, 17)


#: The check table's columns in the report: output, shape, max abs err, max rel err, rule, verdict.
RULE, VERDICT = 4, 5


def _check_rows(page: Page) -> list[list[str]]:
    return page.tables["check"][1:]  # the header row first


def test_the_report_fails_an_output_that_is_nan_in_both_as_check_does(tmp_path):
    src = tmp_path / "nan.onnx"
    onnx.save(nan_in_both(), src)
    fused = invoke("fuse", src, tmp_path / "f.onnx", "--check")
    assert fused.exit_code != 0 and "NO (NaN/Inf)" in fused.stdout, fused.stdout
    assert invoke("report", src, "-o", tmp_path / "r.html", "--check").exit_code == 0
    page = Page((tmp_path / "r.html").read_text())
    (row,) = _check_rows(page)
    assert row[VERDICT] == "no (NaN/Inf)", row  # was "yes": within tolerance on the finite elements
    assert "check FAILED" in page.words()


def test_the_report_states_the_rule_check_judged_a_quantized_output_by(tmp_path):
    src = tmp_path / "qdq.onnx"
    onnx.save(quantized(float_cnn(), "qdq"), src)
    fused = invoke("fuse", src, tmp_path / "f.onnx", "--check", "--json", tmp_path / "f.json")
    assert fused.exit_code == 0, fused.stdout
    rule = json.loads((tmp_path / "f.json").read_text())["check"]["outputs"][0]["rule"]
    assert "steps of" in rule and rule in fused.stdout
    assert invoke("report", src, "-o", tmp_path / "r.html", "--check").exit_code == 0
    page = Page((tmp_path / "r.html").read_text())
    (row,) = _check_rows(page)
    assert row[RULE] == rule and row[VERDICT] == "yes", row
    assert page.tables["check"][0][RULE:] == ["rule", "ok"]  # check's headers: no budget, so the column is the verdict
    assert "qtol 2 steps" in page.words()


def symbolic_cnn() -> onnx.ModelProto:
    """conv -> relu -> conv, input ``[batch, 3, height, ?]``: a named and an unnamed free dim."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", None])
    graph = helper.make_graph(nodes, "sym", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [_weight(rng, "w1", 8, 3, 3, 3), _weight(rng, "w2", 4, 8, 3, 3)])
    return make_model(graph, 17)


def test_check_names_a_free_dim_as_the_pricing_line_does(tmp_path):
    src = tmp_path / "sym.onnx"
    onnx.save(symbolic_cnn(), src)
    fused = invoke("fuse", src, tmp_path / "f.onnx", "--check")
    assert fused.exit_code == 0, fused.stdout
    assert "default for symbolic dims batch, height, x[3]" in fused.stdout  # the pricing line's names
    labels = [line.split(":")[0] for line in fused.stdout.splitlines() if line.startswith("shape ")]
    assert labels == ["shape default", "shape other batch", "shape other height (x[2])", "shape other x[3]"], labels


def test_inspect_says_the_shape_its_sizes_are_at_as_fuse_does(tmp_path):
    """``inspect`` sized a free-dim model's layers at the defaults without saying so, where
    ``fuse`` prints ``priced at ... (default for symbolic dims ...)``: both print that line."""
    src = tmp_path / "sym.onnx"
    onnx.save(symbolic_cnn(), src)
    priced = [line for line in invoke("fuse", src, tmp_path / "f.onnx").stdout.splitlines()
              if line.startswith("priced at")]
    inspected = invoke("inspect", src).stdout.splitlines()
    assert priced and priced[0] in inspected, (priced, inspected[-3:])
    pinned = invoke("inspect", src, "--input-shape", "x:2,3,32,16").stdout.splitlines()
    assert "priced at x:2x3x32x16" in pinned


def test_inspect_of_a_fused_file_writes_the_unit_fuse_writes(tmp_path):
    src = tmp_path / "sym.onnx"
    onnx.save(symbolic_cnn(), src)
    fused = invoke("fuse", src, tmp_path / "f.onnx").stdout
    held = invoke("inspect", tmp_path / "f.onnx").stdout
    assert "sim µs" in fused and "sim µs" in held, held  # was "sim us" and "simulated 252.6 us"
    assert "sim us" not in held and not re.search(r"\d us\b", held), held


def _pricing_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("priced at", "input profile:"))]


def test_plan_says_the_shape_it_priced_at_as_fuse_does(tmp_path):
    """``plan`` priced at the default sizes of free dims without saying so, where ``fuse`` prints
    ``priced at ...`` and ``input profile: ...``; at 80 columns its block lines were wrapped by
    the console between a figure and its unit (``232.2`` / ``µs``)."""
    src, ranges = tmp_path / "sym.onnx", ("--input-shape", "x:1,3,16/32/48,24")
    model = symbolic_cnn()
    for node in model.graph.node:  # torch's long scoped names: a block line wider than 80 columns
        node.name = f"/backbone/stage1/block0/{node.name}/Conv_output_0"
    onnx.save(model, src)
    fused = invoke("fuse", src, tmp_path / "f.onnx", *ranges)
    planned = runner.invoke(app, ["plan", str(src), *ranges], env={"COLUMNS": "80"}, catch_exceptions=False)
    assert planned.exit_code == 0, planned.output
    assert _pricing_lines(planned.output) == _pricing_lines(fused.output) != [], planned.output
    rows = [line for line in planned.output.splitlines() if line.startswith("block ")]
    assert rows and all(line.endswith(" µs") for line in rows), planned.output  # one line each, never cut
    report = json.loads(invoke("plan", src, *ranges, "--json", "-", "-q").stdout)
    recorded = json.loads(invoke("inspect", tmp_path / "f.onnx", "--json", "-", "-q").stdout)["pricing_shape"]
    assert report["pricing_shape"] == recorded and recorded["profile"] is not None


def test_check_writes_its_shapes_as_the_pricing_line_and_the_report_do(tmp_path):
    """``fuse --check`` printed ``shape pinned: x [1, 3, 32, 24]`` where the pricing line and the
    report's check table write ``x:1x3x32x24``, and ``seeds 0`` for its one seed."""
    src, ranges = tmp_path / "sym.onnx", ("--input-shape", "x:1,3,16/32/48,24")
    onnx.save(symbolic_cnn(), src)
    fused = invoke("fuse", src, tmp_path / "f.onnx", "--check", *ranges)
    assert fused.exit_code == 0, fused.stdout
    printed = [line for line in fused.stdout.splitlines() if line.startswith("shape ")]
    assert "priced at x:1x3x32x24" in fused.stdout and "shape pinned: x:1x3x32x24: ok" in printed, printed
    assert "seeded random inputs (seed 0)" in fused.stdout, fused.stdout
    assert invoke("report", src, "-o", tmp_path / "r.html", "--check", *ranges).exit_code == 0
    rows = Page((tmp_path / "r.html").read_text()).tables["check-shapes"][1:]
    assert printed == [f"shape {label}: {shapes}: {status}" for label, shapes, status, *_ in rows], (printed, rows)


def _summaries(counts: dict[str, int]) -> re.Pattern:
    """Every whole-item summary of a block's op types: the first k types with their counts and
    ``+N`` for the rest, or the first type's name cut in the middle, its count kept."""
    items = [f"{op}×{n}" if n > 1 else op for op, n in counts.items()]
    shown = [" ".join(items[:k]) + (f" +{len(items) - k}" if len(items) > k else "") for k in range(1, 4)]
    first = items[0].partition("×")
    cut = rf"\S*…\S*{re.escape(first[1] + first[2])}" + (rf" \+{len(items) - 1}" if len(items) > 1 else "")
    return re.compile(rf"(?:{'|'.join(map(re.escape, shown))}|{cut}) \d+\.\d{{3}} ")


def test_the_op_types_column_at_80_columns_keeps_every_count(tmp_path):
    """At 80 columns the QDQ block's op types read ``Quant…v×2 +5``: the middle of the text cut
    away ``×8`` and left a ``+5`` that counted types no longer shown. Now fewer types are shown,
    each with its count, and ``+N`` counts the rest."""
    src = tmp_path / "qdq.onnx"
    onnx.save(quantized(float_cnn(), "qdq"), src)
    report = json.loads(invoke("fuse", src, tmp_path / "f.onnx", "--json", "-", "-q").stdout)
    printed = runner.invoke(app, ["fuse", str(src), str(tmp_path / "g.onnx")], env={"COLUMNS": "80"},
                            catch_exceptions=False).stdout
    rows = [line for line in printed.splitlines() if re.match(r"\s+\d+\s+\d+ (fp32|fp16|int8) ", line)]
    assert len(rows) == len(report["blocks"]) and max(map(len, printed.splitlines())) <= 80, printed
    for line, block in zip(rows, report["blocks"]):
        assert _summaries(block["op_types"]).search(line), (line, block["op_types"])


def host_conv_model() -> onnx.ModelProto:
    """conv -> relu -> com.microsoft FusedConv (a heavy node left on the host) -> conv: on an
    x86 host with AVX2, onnxruntime's optimizer turns the host conv into an NCHWc Conv between
    a ReorderInput and a ReorderOutput, nodes the file does not hold."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("FusedConv", ["r1", "w2"], ["c2"], name="host_conv", pads=[1, 1, 1, 1],
                              activation="Relu", domain="com.microsoft"),
             helper.make_node("Conv", ["c2", "w3"], ["y"], name="conv3", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "host", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [_weight(rng, "w1", 16, 3, 3, 3), _weight(rng, "w2", 16, 16, 3, 3),
                               _weight(rng, "w3", 8, 16, 3, 3)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8)


def _kernel_times(path: Path) -> dict[str, float]:
    """Every kernel onnxruntime's profiler timed in one run of the fused model: name -> µs."""
    import onnxmlu.runtime as runtime  # noqa: PLC0415 - the custom-op library, only here
    options = runtime.session_options()
    options.enable_profiling, options.profile_file_prefix = True, str(path.parent / "ort")
    session = runtime.InferenceSession(onnx.load(path), options, merge_blocks=False)
    session.run(None, {"x": np.zeros((1, 3, 32, 32), np.float32)})
    events = json.loads(Path(session.end_profiling()).read_text())
    return {e["name"][: -len("_kernel_time")]: e["dur"] for e in events
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")}


def test_run_profile_leaves_out_no_kernel_onnxruntime_timed(tmp_path):
    """``run --profile`` listed only the file's nodes: the NCHWc Conv and reorders onnxruntime
    made of a host conv were dropped, their time missing from the table and its total."""
    src, fused = tmp_path / "host.onnx", tmp_path / "f.onnx"
    onnx.save(host_conv_model(), src)
    assert invoke("fuse", src, fused, "-q").exit_code == 0
    ran = invoke("run", fused, "--profile", "--repeat", "2", "--json", tmp_path / "r.json")
    assert ran.exit_code == 0, ran.output
    rows = json.loads((tmp_path / "r.json").read_text())["profile"]
    timed = _kernel_times(fused)
    assert {r["name"] for r in rows} == set(timed), (rows, timed)
    made = [r["name"] for r in rows if r["from_optimizer"]]
    assert made == [r["name"] for r in rows if r["name"] not in {n.name for n in onnx.load(fused).graph.node}]
    assert not made or f"not in the file: {', '.join(made)}" in ran.output, ran.output
    host = [line for line in ran.output.splitlines() if any(f"│ {name} " in line for name in made)]
    assert all("–" not in line for line in host), host  # '–' is a block not priced; a host node's cell is empty


def test_a_table_whose_headers_do_not_fit_cuts_no_number(tmp_path):
    """At 80 columns a table whose cells fit but whose headers (``weights KB``) do not was left to
    the console, which squeezed the number columns: ``0.02…``, ``224×…`` (issue 33's symptom,
    on a model whose names are short)."""
    src = tmp_path / "sym.onnx"
    onnx.save(symbolic_cnn(), src)
    printed = runner.invoke(app, ["inspect", str(src)], env={"COLUMNS": "80"}, catch_exceptions=False).stdout
    layers = json.loads(invoke("inspect", src, "--json", "-", "-q").stdout)["layers"]
    table = printed.split("priced at")[0]  # the pricing line is one line, the terminal wraps it
    assert "…" not in table and max(map(len, table.splitlines())) <= 80, printed
    for layer in layers:
        assert f"{layer['gops']:.4f}" in printed and "×".join(map(str, layer["out_hw"])) in printed, printed


def test_the_report_of_a_fused_file_gives_each_block_what_its_node_carries(tmp_path):
    """The fused file's report left GOPs and first/last layer empty although every block node
    carries them (``gops``, ``layers``): they now read as the model's report of the same plan."""
    src, fused = tmp_path / "sym.onnx", tmp_path / "f.onnx"
    onnx.save(symbolic_cnn(), src)
    assert invoke("fuse", src, fused, "-q").exit_code == 0
    assert invoke("report", src, "-o", tmp_path / "m.html", "-q").exit_code == 0
    assert invoke("report", fused, "-o", tmp_path / "f.html", "-q").exit_code == 0
    gops, last = 5, 8  # the blocks table: block, mp, precision, layers, sim µs, GOPs, first layer, last layer
    of_model = [row[gops:last] for row in Page((tmp_path / "m.html").read_text()).tables["blocks"][1:]]
    of_file = [row[gops:last] for row in Page((tmp_path / "f.html").read_text()).tables["blocks"][1:]]
    assert of_file == of_model and all(row[0] and row[1] for row in of_file), (of_file, of_model)


def test_a_block_has_one_name_in_inspect_both_reports_and_run_profile(library, tmp_path):
    """The model's report named a block ``block_0`` where the fused file, its report, ``inspect``
    and ``run --profile`` name it ``block_0 (mp=1)`` (its node's name, which Netron shows)."""
    src, fused = tmp_path / "sym.onnx", tmp_path / "f.onnx"
    onnx.save(symbolic_cnn(), src)
    assert invoke("fuse", src, fused, "-s", "dynamic-mp", "-q").exit_code == 0
    nodes = [n.name for n in onnx.load(fused).graph.node if n.op_type == "MLUFusionBlock"]
    assert nodes and all(re.fullmatch(r"block_\d+ \(mp=\d+\)", n) for n in nodes), nodes
    assert invoke("report", src, "-o", tmp_path / "m.html", "-s", "dynamic-mp", "-q").exit_code == 0
    assert invoke("report", fused, "-o", tmp_path / "f.html", "-q").exit_code == 0
    named = {"inspect": [b["block"] for b in json.loads(invoke("inspect", fused, "--json", "-", "-q").stdout)["blocks"]],
             "run --profile": [p["name"] for p in json.loads(invoke("run", fused, "--profile", "--repeat", "1", "--json",
                                                                    "-", "-q").stdout)["profile"] if p["mp"]]}
    for report in ("m", "f"):
        page = Page((tmp_path / f"{report}.html").read_text())
        named[f"report {report}"] = [row[0] for row in page.tables["blocks"][1:]]
        named[f"report {report} drill-down"] = [s.split(" · ")[0] for s in page.summaries()]
    assert all(names == nodes for names in named.values()), (nodes, named)


def test_the_report_names_the_blocks_whose_best_mp_moves_as_fuse_does(tmp_path):
    """``fuse`` and ``plan`` print ``block 0 runs at mp=…; … its fastest MP would be …`` for a
    block whose best MP moves over the ranges; the report showed the ranges' totals only."""
    src, ranges = tmp_path / "sym.onnx", ("--input-shape", "x:1,3,16/64/256,64")
    onnx.save(symbolic_cnn(), src)
    printed = invoke("fuse", src, tmp_path / "f.onnx", *ranges).stdout
    moves = [line.strip() for line in printed.splitlines() if line.strip().startswith("block ")]
    assert moves, printed  # the model's best MP moves between 16 and 256 rows
    assert invoke("report", src, "-o", tmp_path / "r.html", *ranges).exit_code == 0
    words = Page((tmp_path / "r.html").read_text()).words()
    assert all(line in words for line in moves), (moves, words)


def test_inspect_of_a_fused_file_gives_each_host_node_the_reason_inspect_of_the_model_gives(tmp_path):
    """The fuse writes each host node's reason into the file (its doc_string, which Netron
    shows): before, ``inspect`` of the fused file listed host nodes without a word why."""
    src, fused = tmp_path / "host.onnx", tmp_path / "f.onnx"
    onnx.save(host_conv_model(), src)
    assert invoke("fuse", str(src), str(fused)).exit_code == 0

    def host_lines(path: Path) -> list[str]:
        return [line for line in invoke("inspect", str(path)).output.splitlines() if line.startswith("host: ")]

    said = host_lines(src)
    assert said and all(": " in line.split(")", 1)[1] for line in said), said
    assert host_lines(fused) == said
    node = next(n for n in onnx.load(str(fused)).graph.node if n.name == "host_conv")
    assert node.doc_string.startswith("onnxmlu: on the host: ")
