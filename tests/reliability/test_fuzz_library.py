"""The custom-op library under attack (issue 7, item 3): a seeded mutation fuzz loop.

Cases run in child processes (fuzz_blocks.py) in chunks, so a crash (a signal, an abort, a
non-zero exit) is caught and reported with the seed and the case to replay. Every session
creation must succeed or fail with a message naming MLUFusionBlock; see fuzz_blocks.py for the
mutations. The quick test runs 200 cases; the slow one 12,000 (and 10,000 under ASan + UBSan
when ``make sanitize`` has built that library).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onnxmlu import runtime

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("fuzz_blocks.py")
ASAN_LIBRARY = REPO / "build" / "sanitize" / "libonnxmlu_ops_asan.so"  # `make sanitize`


pytestmark = pytest.mark.usefixtures("library")


def _chunk(seed: int, start: int, count: int, env: dict) -> dict:
    proc = subprocess.run([sys.executable, str(WORKER), str(seed), str(start), str(count)],
                          capture_output=True, text=True, env=env, timeout=1800, errors="replace")
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].startswith("summary "):
        last = next((l for l in reversed(lines) if l.startswith("case ")), f"case {start}")
        case = int(last.split()[1])
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        pytest.fail(f"fuzz worker died ({how}) at case {case} of seed {seed}; replay with "
                    f"`python {WORKER.relative_to(REPO)} {seed} {case} 1`\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("summary "):])


def fuzz(seed: int, total: int, chunk: int, extra_env: dict | None = None) -> tuple[dict, float]:
    env = dict(os.environ, PYTHONPATH=str(REPO), **(extra_env or {}))
    totals: dict = {"cases": 0, "created": 0, "ran": 0, "creation_errors": 0, "run_errors": 0,
                    "bad_messages": [], "applied": {}}
    started = time.perf_counter()
    for start in range(0, total, chunk):
        stats = _chunk(seed, start, min(chunk, total - start), env)
        for key in ("cases", "created", "ran", "creation_errors", "run_errors"):
            totals[key] += stats[key]
        totals["bad_messages"] += stats["bad_messages"]
        for name, n in stats["applied"].items():
            totals["applied"][name] = totals["applied"].get(name, 0) + n
    return totals, time.perf_counter() - started


def check(totals: dict, total: int, min_per_mutation: int) -> None:
    assert totals["cases"] == total
    assert not totals["bad_messages"], json.dumps(totals["bad_messages"][:5], indent=1)
    from fuzz_blocks import MUTATIONS

    assert {m.__name__ for m in MUTATIONS} <= set(totals["applied"]), totals["applied"]
    assert min(totals["applied"].values()) >= min_per_mutation, totals["applied"]
    assert totals["created"] > 0.03 * total and totals["ran"] > 0, totals  # Compute was exercised too


def test_fuzz_quick():
    totals, _ = fuzz(seed=11, total=200, chunk=200)
    check(totals, 200, 1)


@pytest.mark.slow
def test_fuzz_twelve_thousand_cases():
    totals, seconds = fuzz(seed=20261121, total=12_000, chunk=1_000)
    summary = {k: v for k, v in totals.items() if k not in ("bad_messages", "applied")}
    print(f"\nfuzz: {summary} in {seconds:.1f} s")
    check(totals, 12_000, 300)


def _asan_env() -> dict:
    def gcc_file(name):
        return subprocess.run(["g++", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()

    return {
        runtime.LIBRARY_ENV: str(ASAN_LIBRARY),
        "LD_PRELOAD": f"{gcc_file('libasan.so')} {os.path.realpath(gcc_file('libstdc++.so'))}",
        "ASAN_OPTIONS": "detect_leaks=0",  # onnxruntime and CPython keep memory until exit
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    }


@pytest.mark.slow
def test_fuzz_under_address_sanitizer():
    if not ASAN_LIBRARY.is_file():
        pytest.skip("run `make sanitize` first to build the ASan + UBSan library")
    totals, seconds = fuzz(seed=77, total=10_000, chunk=1_000, extra_env=_asan_env())
    print(f"\nfuzz under ASan: {totals['cases']} cases, {totals['created']} sessions, {totals['ran']} runs in {seconds:.1f} s")
    check(totals, 10_000, 200)
