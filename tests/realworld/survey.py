"""Survey: fuse every corpus model with the onnxmlu CLI and compare it against the original.

    .venv/bin/python tests/realworld/survey.py [--only ID ...] [--json out.json] [--timeout S] [--unpinned]

Each model runs in its own worker process (so a crash or hang costs one row): the worker runs
``onnxmlu fuse MODEL OUT --input-shape ... --json -`` in a fresh temporary working directory,
notes any file left there, counts MLUFusionBlock and host nodes (subgraphs included) and the
heavy nodes (Conv, MatMul, Gemm, LSTM, ... in every graph, block bodies included) inside blocks
(``heavy``: in blocks / all, read from the fused file alone, so any version's output compares), and runs
the original (graph optimizations disabled) and the fused model (custom-op library registered)
in onnxruntime on the same seeded inputs, at the pins and at ``corpus.other_shapes`` (column
``shapes``: matched / run there; shapes the original refuses are not counted). ``--unpinned``
fuses each model a second time without its pins (columns ``blk-u``, ``host-u``): pins only
choose the plan, so an unpinned model should fuse as well. One line per model; errors show
their first line only.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import corpus
import onnxmlu

CLI = Path(sys.executable).with_name("onnxmlu")
#: What carries a model's arithmetic (kept here, not imported, so any version's output reads).
HEAVY_OPS = frozenset({
    "Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN", "QLinearConv", "ConvInteger",
    "QLinearMatMul", "MatMulInteger", "QGemm", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
    "DynamicQuantizeLSTM", "QAttention", "FusedConv", "FusedMatMul", "FusedGemm",
})
BLOCK = ("com.onnxmlu", "MLUFusionBlock")
COLUMNS = ("id", "package", "fuse", "blocks", "host", "heavy", "max_err", "shapes", "blk-u", "host-u", "orig",
           "fused", "secs", "cwd")
WIDTHS = (24, 22, 4, 6, 5, 9, 8, 6, 5, 6, 7, 7, 6, 5)
LEFT = {0, 1, 2, 13}  # left-aligned columns
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ORT_LOG = re.compile(r"^\S+ \S+ \[[VIWEF]:onnxruntime:")  # onnxruntime's own log lines


def _first_line(text: str) -> str:
    """The gist of an error output: its first ``error`` line, else a traceback's last line,
    else its first line (onnxruntime's log lines skipped)."""
    lines = [ANSI.sub("", ln).strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not ORT_LOG.match(ln)] or ["(no output)"]
    errors = [ln for ln in lines if ln.lower().startswith("error")]
    if errors:
        return errors[0]
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]


def _heavy(graph, in_block: bool = False) -> tuple[int, int]:
    """(heavy nodes inside block bodies, heavy nodes) of ``graph`` and everything nested in
    it, block bodies decoded (the file format: a uint8 ``body`` tensor holding a ModelProto)."""
    inside = total = 0
    for node in graph.node:
        subs = [a.g for a in node.attribute if a.HasField("g")] + [g for a in node.attribute for g in a.graphs]
        if (node.domain, node.op_type) == BLOCK:
            body = next((a for a in node.attribute if a.name == "body"), None)
            raw = body.t.raw_data if body is not None and body.HasField("t") else (body.s if body is not None else b"")
            subs, in_here = [onnx.load_from_string(raw).graph] if raw else [], True
        else:
            in_here = in_block
            if node.op_type in HEAVY_OPS:
                total += 1
                inside += in_block
        for sub in subs:
            i, t = _heavy(sub, in_here)
            inside, total = inside + i, total + t
    return inside, total


def _compare(case: corpus.ModelCase, original: Path, fused: Path, shapes: dict | None = None) -> float:
    """Max abs difference over all outputs at the pins (or ``shapes``); raises on a shape
    mismatch, and where either model fails."""

    def session(path: Path, custom: bool) -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3
        if custom:
            so.register_custom_ops_library(onnxmlu.custom_ops_library())
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    feeds = corpus.feeds(case, onnx.load(original, load_external_data=False), 0, shapes)
    ref_sess, fused_sess = session(original, False), session(fused, True)
    names = [o.name for o in ref_sess.get_outputs()]
    ref = ref_sess.run(None, feeds)
    fused_inputs = {i.name for i in fused_sess.get_inputs()}
    got = fused_sess.run(names, {k: v for k, v in feeds.items() if k in fused_inputs})
    err = 0.0
    for name, a, b in zip(names, ref, got):
        if a.shape != b.shape:
            raise ValueError(f"output {name}: shape {list(b.shape)}, expected {list(a.shape)}")
        if a.dtype.kind in "OUS":  # strings: equal or not
            err = max(err, 0.0 if np.array_equal(a, b) else float("inf"))
        elif a.size:
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            err = max(err, float(np.nanmax(np.where(np.isnan(a) & np.isnan(b), 0, diff))))
    return err


def _other_shapes(case: corpus.ModelCase, original: Path, fused: Path) -> str:
    """``matched/run`` over ``corpus.other_shapes`` where the original runs."""
    ran = matched = 0
    for _, shapes in corpus.other_shapes(case, onnx.load(original, load_external_data=False)):
        try:
            _reference(case, original, shapes)
        except Exception:  # noqa: BLE001 - the original refuses this shape: not counted
            continue
        ran += 1
        try:
            matched += _compare(case, original, fused, shapes) <= 1e-3
        except Exception:  # noqa: BLE001 - the fused model fails where the original runs
            pass
    return f"{matched}/{ran}"


def _reference(case: corpus.ModelCase, original: Path, shapes: dict) -> None:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    sess = ort.InferenceSession(str(original), so, providers=["CPUExecutionProvider"])
    sess.run(None, corpus.feeds(case, onnx.load(original, load_external_data=False), 0, shapes))


def _unpinned(original: Path, outdir: Path, cwd: Path, timeout: float) -> tuple:
    """(blocks, host nodes) of the model fused without pins, or ("x", "x") when that fails."""
    out = outdir / "unpinned.onnx"
    try:
        proc = subprocess.run([str(CLI), "fuse", str(original), str(out), "-q"], cwd=cwd, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "x", "x"
    if proc.returncode != 0 or not out.is_file():
        return "x", "x"
    return corpus.node_counts(onnx.load(out, load_external_data=False).graph)


def _fixed_inputs(case: corpus.ModelCase, original: Path, outdir: Path) -> list[str]:
    """``--inputs`` with the values the case fixes (a sample rate), as the corpus test passes them."""
    fixed = [name for name, value in case.values.items() if not isinstance(value, tuple)]
    if not fixed:
        return []
    feeds = corpus.feeds(case, onnx.load(original, load_external_data=False))
    path = outdir / "inputs.npz"  # removed with outdir; not counted in fused_bytes
    np.savez(path, **{n: np.asarray(feeds[n], dtype=str) if feeds[n].dtype == object else feeds[n] for n in fixed})
    return ["--inputs", str(path)]


def work(case_id: str, timeout: float, unpinned: bool = False) -> dict:
    """Fuse and compare one case (runs inside the worker process)."""
    case = next(c for c in corpus.MODELS if c.id == case_id)
    row = {"id": case.id, "package": case.package, "classes": list(case.classes)}
    try:
        original = corpus.model_path(case)
    except corpus.FetchError as error:
        return row | {"error": f"fetch: {error}"}
    row["orig_bytes"] = original.stat().st_size
    outdir, cwd = Path(tempfile.mkdtemp(prefix="survey-out-")), Path(tempfile.mkdtemp(prefix="survey-cwd-"))
    try:
        fused = outdir / f"{case.id}.fused.onnx"
        cmd = [str(CLI), "fuse", str(original), str(fused), *case.shape_args(), *_fixed_inputs(case, original, outdir),
               "--json", "-"]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc = None
        row["secs"] = round(time.perf_counter() - start, 2)
        row["left_in_cwd"] = sorted(p.name for p in cwd.iterdir())
        if proc is None:
            return row | {"error": f"fuse timed out after {timeout:g} s"}
        if proc.returncode != 0 or not fused.is_file():
            return row | {"error": _first_line(proc.stderr or proc.stdout)}
        row["fused_bytes"] = sum(p.stat().st_size for p in outdir.iterdir() if p.suffix != ".npz")  # external data too
        fused_model = onnx.load(fused)
        row["blocks"], row["host"] = corpus.node_counts(fused_model.graph)
        row["heavy_in_blocks"], row["heavy"] = _heavy(fused_model.graph)
        del fused_model
        try:
            row["max_abs_err"] = _compare(case, original, fused)
            row["shapes"] = _other_shapes(case, original, fused)
        except Exception as error:  # noqa: BLE001 - a diagnostic: report, don't stop
            message = _first_line(str(error)).replace(str(fused), fused.name)
            row["error"] = f"compare: {type(error).__name__}: {message}"
        if unpinned and case.pins:
            row["blocks_unpinned"], row["host_unpinned"] = _unpinned(original, outdir, cwd, timeout)
        return row
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
        shutil.rmtree(cwd, ignore_errors=True)


def run_one(case: corpus.ModelCase, timeout: float, unpinned: bool = False) -> dict:
    """Run :func:`work` for ``case`` in a fresh worker process and return its row."""
    cmd = [sys.executable, __file__, "--worker", case.id, "--timeout", str(timeout), *(["--unpinned"] * unpinned)]
    base = {"id": case.id, "package": case.package, "classes": list(case.classes)}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=2 * timeout + 120)
    except subprocess.TimeoutExpired:
        return base | {"error": "worker timed out"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    why = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    return base | {"error": f"worker crashed ({why}): {_first_line(proc.stderr)}"}


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    if n < 1024:
        return f"{n}B"
    return f"{n / 1024:.1f}K" if n < 1024**2 else f"{n / 1024**2:.1f}M"


def format_row(row: dict) -> str:
    err = row.get("max_abs_err")
    left = row.get("left_in_cwd")
    cells = [
        row["id"], row["package"], "ok" if "error" not in row else "FAIL",
        str(row.get("blocks", "-")), str(row.get("host", "-")),
        f"{row['heavy_in_blocks']}/{row['heavy']}" if "heavy" in row else "-",
        "-" if err is None else f"{err:.1e}", str(row.get("shapes", "-")),
        str(row.get("blocks_unpinned", "-")), str(row.get("host_unpinned", "-")),
        _size(row.get("orig_bytes")), _size(row.get("fused_bytes")),
        str(row.get("secs", "-")), "-" if left is None else ("clean" if not left else ",".join(left)),
    ]  # fmt: skip
    return _line(cells) + (f"  {row['error']}" if "error" in row else "")


def _line(cells) -> str:
    return " ".join(c.ljust(w) if i in LEFT else c.rjust(w) for i, (c, w) in enumerate(zip(cells, WIDTHS)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="ID", help="survey only this case (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--timeout", type=float, default=300, help="seconds allowed for one fuse")
    parser.add_argument("--unpinned", action="store_true", help="also fuse each pinned model without its pins")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(work(args.worker, args.timeout, args.unpinned)))
        return 0
    cases = [c for c in corpus.MODELS if not args.only or c.id in args.only]
    if args.only and (unknown := set(args.only) - {c.id for c in cases}):
        parser.error(f"unknown id(s): {', '.join(sorted(unknown))}")
    print(_line(COLUMNS) + "  error")
    rows = []
    for case in cases:
        row = run_one(case, args.timeout, args.unpinned)
        rows.append(row)
        print(format_row(row), flush=True)
    ok = sum("error" not in r for r in rows)
    print(f"{ok} of {len(rows)} fused and compared")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
