"""scripts/bench.py writes well-formed tables and keeps the hand-written before/after section.

No figure is asserted (benchmarks are scripts, never timed tests); only the document's shape.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_script", ROOT / "scripts" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _tables(text: str) -> list[list[str]]:
    """Markdown tables of ``text``: runs of lines starting with '|'."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def _assert_well_formed(text: str) -> None:
    tables = _tables(text)
    assert tables
    for rows in tables:
        widths = {row.count("|") for row in rows}
        assert len(widths) == 1, rows
        assert set(rows[1].replace("|", "")) == {"-"}


def test_table_escapes_pipes_and_keeps_width():
    bench = _bench()
    text = bench.table(("a", "b"), [("x|y", 1), ("", 2.5)])
    _assert_well_formed(text)
    assert "x/y" in text


def test_before_after_section_survives_regeneration(tmp_path):
    bench = _bench()
    out = tmp_path / "B.md"
    hand = bench.SEED_BEFORE_AFTER.replace("| 1.3 s | |", "| 1.3 s | 0.4 s |")
    out.write_text("# old\n\n" + hand + "\n\n## Planner\n\nold figures\n")
    kept = bench.before_after(out, tmp_path / "missing.md")
    assert kept == hand
    text = bench.render(bench.QUICK, "today", kept, {"planner": bench.table(("m",), [("x",)])}, [])
    assert hand in text and "old figures" not in text
    _assert_well_formed(text)


def test_seed_when_no_file_has_the_section(tmp_path):
    bench = _bench()
    assert bench.before_after(tmp_path / "none.md") == bench.SEED_BEFORE_AFTER
    assert "2c7c82e" in bench.SEED_BEFORE_AFTER


def test_narrowed_runs_do_not_target_the_full_report():
    bench = _bench()
    cfg, narrowed = bench.configure(bench.parse(["--models", "resnet18", "--runs", "1"]))
    assert narrowed and cfg.models == ("resnet18",) and cfg.peer_runs == 1 and cfg.big_models == ()
    assert bench.configure(bench.parse([])) == (bench.FULL, False)


@pytest.mark.slow
def test_tiny_end_to_end_run_writes_every_table(tmp_path):
    out = tmp_path / "B.md"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--sections", "peers", "scaling", "planner",
                    "--models", "alexnet", "--tools", "onnxmlu", "--sizes", "100", "--big-mb", "0", "--runs", "1",
                    "--out", str(out)], check=True, cwd=tmp_path, timeout=600)
    text = out.read_text()
    for title in ("Fuse speed vs peers", "Scaling", "Planner", "Before/after"):
        assert f"## {title}" in text
    _assert_well_formed(text)


#: How many commits that change the package or the library BENCHMARKS.md may be behind: about
#: two working sessions. Past that, its figures describe code that is no longer there.
MAX_CODE_COMMITS_BEHIND = 40


def test_benchmarks_md_measures_recent_code():
    """BENCHMARKS.md names the commit it measured; no more than MAX_CODE_COMMITS_BEHIND commits
    touching onnxmlu/ or custom_ops/ may follow it (regenerate with ``make bench``)."""
    import re

    header = (ROOT / "BENCHMARKS.md").read_text().split("\n", 3)[2]
    match = re.search(r"commit ([0-9a-f]{7,40})", header)
    assert match, f"BENCHMARKS.md does not name the commit it measured: {header!r}"
    git = ["git", "-C", str(ROOT)]
    if subprocess.run([*git, "cat-file", "-e", f"{match[1]}^{{commit}}"], capture_output=True).returncode:
        pytest.fail(f"BENCHMARKS.md measured commit {match[1]}, which this clone does not have")
    since = subprocess.run([*git, "rev-list", "--count", f"{match[1]}..HEAD", "--", "onnxmlu", "custom_ops"],
                           capture_output=True, text=True, check=True).stdout
    assert int(since) <= MAX_CODE_COMMITS_BEHIND, (
        f"BENCHMARKS.md measured commit {match[1]}, {int(since)} code commits ago: run make bench")
