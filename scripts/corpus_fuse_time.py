"""Fuse time of the real-world corpus, against an older checkout, in turns.

    python scripts/corpus_fuse_time.py --before-src /tmp/old-checkout              # symbolic-dim models
    python scripts/corpus_fuse_time.py --before-src /tmp/old --ids ppocrv4_det nudenet_320n --runs 5

Each run is a fresh interpreter doing what ``onnxmlu fuse MODEL OUT`` does (``api.fuse_to_file``,
dlfusion, no pins: scripts/bench.py's worker), this tree's and the older checkout's alternately,
the first of each pair rotating per round. The figure is the median of load + plan + save (the
import excluded: it is the same interpreter start on both sides). By default the cases are the
corpus models with a symbolic input dim, where shape and output-dims inference do their work;
a static model's fuse never runs them. Models the cache cannot provide are listed as skipped.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "tests" / "realworld")]

import bench  # noqa: E402
import corpus  # noqa: E402

TOOLS = ("onnxmlu", "onnxmlu@before")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before-src", required=True, help="a checkout whose onnxmlu runs as the 'before' side")
    parser.add_argument("--ids", nargs="*", help="corpus case ids (default: those with a symbolic input dim)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    before = str(Path(args.before_src).resolve())
    rows, skipped = [], []
    for case, path in cases(args.ids):
        if path is None:
            skipped.append(case.id)
            continue
        times, error = timed_in_turns(path, args.runs, before)
        rows.append(row(case.id, times) if not error else (case.id, "", "", error))
        print("  " + " | ".join(rows[-1]), flush=True)
    print(bench.table(("model", "head s", "before s", "head / before"), rows))
    if skipped:
        print(f"skipped (not in the cache): {', '.join(skipped)}")
    return 0


def cases(ids: list[str] | None):
    """(case, model path or None) for the chosen ids, or every case with a symbolic input dim."""
    for case in corpus.MODELS:
        if ids and case.id not in ids:
            continue
        try:
            path = corpus.model_path(case)
        except corpus.FetchError:
            yield case, None
            continue
        if ids or has_symbolic_input(path):
            yield case, path


def has_symbolic_input(path: Path) -> bool:
    graph = onnx.load(str(path), load_external_data=False).graph
    dims = (d for vi in graph.input for d in vi.type.tensor_type.shape.dim)
    return any(not d.HasField("dim_value") for d in dims)


def timed_in_turns(path: Path, runs: int, before: str) -> tuple[dict[str, list[float]], str]:
    """Seconds of load + plan + save per tool (round r starts with tool r mod 2), and the first
    failure ("" when none)."""
    times: dict[str, list[float]] = {t: [] for t in TOOLS}
    for r in range(runs):
        for tool in TOOLS[r % 2:] + TOOLS[:r % 2]:
            run = bench.run_child(tool, path, before_src=before, timeout=600)
            if run.error:
                return times, f"{tool} failed: {run.error[:80]}"
            times[tool].append(sum(v for k, v in run.phases.items() if k in ("load", "optimize", "save")))
    return times, ""


def row(case_id: str, times: dict[str, list[float]]) -> tuple[str, str, str, str]:
    head, old = (statistics.median(times[t]) for t in TOOLS)
    return case_id, f"{head:.2f}", f"{old:.2f}", f"{head / old:.2f}"


if __name__ == "__main__":
    raise SystemExit(main())
