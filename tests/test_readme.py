"""The README's examples run as written in an empty folder: the "Everyday use" commands, then
every ``$`` command and Python block of the walkthrough sections, in order, in one folder, with
the installed ``onnxmlu`` first on PATH. Each must exit 0 without an ``error:`` line.

The walkthrough's planner and model figures (:data:`EXACT_OUTPUT`) must be what the commands
print now, to six significant digits: regenerate those blocks when a change moves them. Every
other output the walkthrough shows holds figures of the host (CPU times, seconds) and is
compared by its structure (:func:`skeleton`): the same lines, columns, rows and words, every
number a placeholder, so a renamed column, a dropped row or a new line fails as surely.

Not run, each for its stated reason (:data:`NOT_RUN`): a command that writes about 1 GB.
``view`` serves until interrupted, so it runs until Netron says it is serving.
Marked heavy: it builds ResNet-18 and ResNet-50 and fuses and checks them (a few minutes).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
#: The sections whose examples run, in README order (up to the next "## " heading after the last).
SECTIONS = ("## Everyday use", "## Walkthrough")
END = "## The `MLUFusionBlock` node"
NOT_RUN = {"onnxmlu zoo all models/": "writes every zoo model, about 1 GB"}
#: Walkthrough commands whose printed output the README shows line for line, compared with what
#: they print now (:func:`printed`): their figures are the planner's and the performance
#: model's. The others print times or figures measured on the host, which no two runs share.
EXACT_OUTPUT = ("onnxmlu zoo resnet18 out/resnet18.onnx", "onnxmlu plan out/resnet50.onnx",
                "onnxmlu fuse out/resnet18.onnx out/resnet18.fused.onnx --json -", "onnxmlu compare --zoo --strategies")
SERVES = "onnxmlu view "
#: A README output line that stands for any number of lines the README leaves out.
ELIDED = "..."
#: A number as the CLI prints one (``-0.07947``, ``3.81e-06``, ``1.00×``'s ``1.00``), not part
#: of a word (``layer2``, ``block_0``, ``fp32`` keep their digits).
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")


def examples(text: str) -> list[tuple[str, str]]:
    """(kind, code) in README order: ("sh", command) and ("python", block)."""
    everyday = text.split(SECTIONS[0], 1)[1].split("\n## ", 1)[0]
    walkthrough = text.split(SECTIONS[1], 1)[1].split(END, 1)[0]
    found = [("sh", line) for line in _blocks(everyday, "") for line in _commands(line, prompt=False)]
    for lang, block in re.findall(r"^```(\w*)\n(.*?)^```", walkthrough, re.S | re.M):
        if lang == "python":
            found.append(("python", block))
        else:
            found += [("sh", c) for c in _commands(block, prompt=True)]
    return found


def printed(text: str, rounded: bool = True) -> dict[str, list[str]]:
    """Walkthrough command -> the output lines the README shows under it (up to the next ``$``),
    decimals to six digits (:func:`_rounded`; ``rounded=False``: as written)."""
    walkthrough = text.split(SECTIONS[1], 1)[1].split(END, 1)[0]
    shown: dict[str, list[str]] = {}
    for block in _blocks(walkthrough, ""):
        command = None
        for line in block.splitlines():
            if line.startswith("$ "):
                command = line[2:].split("  #", 1)[0].strip()
                shown[command] = []
            elif command is not None:
                shown[command].append(line.rstrip())
    return {command: _rounded(lines) if rounded else lines for command, lines in shown.items()}


def structural(text: str) -> dict[str, list[str]]:
    """The walkthrough commands whose shown output is compared by structure: every one with
    output that is not :data:`EXACT_OUTPUT` (``view`` serves: :func:`_serves` reads it)."""
    return {command: lines for command, lines in printed(text, rounded=False).items()
            if lines and not command.startswith(EXACT_OUTPUT) and not command.startswith(SERVES)}


def _rounded(lines: list[str]) -> list[str]:
    """Lines without trailing blanks, each decimal number to 6 significant digits (a float
    summed in another order on another CPU differs in its last digits)."""
    rounded = [re.sub(r"\d+\.\d+", lambda m: f"{float(m[0]):.6g}", line.rstrip()) for line in lines]
    while rounded and not rounded[-1]:
        rounded.pop()
    return rounded


def skeleton(lines: list[str]) -> list[str]:
    """The structure of printed lines: each number ``#``, runs of a table's rule character
    (``━━━`` -> ``━``) and of spaces as one (a column's width follows its numbers), no blank
    lines (:data:`ELIDED` lines kept as they are)."""
    shaped = []
    for line in lines:
        line = NUMBER.sub("#", line.strip())
        line = re.sub(r" +", " ", re.sub(r"([━─═])\1+", r"\1", line))
        if line:
            shaped.append(line)
    return shaped


def same_structure(shown: list[str], got: list[str]) -> str | None:
    """None when ``got`` (a command's output) has the structure of ``shown`` (the README's lines,
    an :data:`ELIDED` line standing for any lines); otherwise what differs, in one line."""
    pieces: list[list[str]] = [[]]
    for line in skeleton(shown):
        pieces.append([]) if line == ELIDED else pieces[-1].append(line)
    got, at, last = skeleton(got), 0, len(pieces) - 1
    for k, piece in enumerate(pieces):
        if k == 0:  # the output starts as the README does, and (no elision) ends there too
            starts = [0] if last or len(got) == len(piece) else []
        elif k == last:  # ... and ends as it does
            starts = [len(got) - len(piece)] if len(got) - len(piece) >= at else []
        else:
            starts = range(at, len(got) - len(piece) + 1)
        found = next((i for i in starts if got[i:i + len(piece)] == piece), None)
        if found is None:
            return _difference(piece, got[at:])
        at = found + len(piece)
    return None


def _difference(piece: list[str], got: list[str]) -> str:
    missing = next((line for line in piece if line not in got), None)
    if missing is not None:
        return f"the README shows {missing!r}, which is not printed"
    extra = next((line for line in got if line not in piece), None)
    return f"printed {extra!r}, which the README does not show" if extra else f"the lines come in another order: {got}"


def _blocks(section: str, lang: str) -> list[str]:
    return [b for g, b in re.findall(r"^```(\w*)\n(.*?)^```", section, re.S | re.M) if g == lang]


def _commands(block: str, prompt: bool) -> list[str]:
    lines = [line.strip() for line in block.splitlines()]
    if prompt:
        return [line[2:] for line in lines if line.startswith("$ ")]
    return [line for line in lines if line]


def test_the_examples_are_found():
    found = examples(README.read_text())
    shown = printed(README.read_text())
    assert all(any(c.startswith(p) and shown[c] for c in shown) for p in EXACT_OUTPUT), "an EXACT_OUTPUT command lost its output"
    commands = [code for kind, code in found if kind == "sh"]
    assert len(commands) >= 15 and sum(kind == "python" for kind, _ in found) >= 3
    assert commands[0].startswith("onnxmlu zoo resnet18 resnet18.onnx") and "mkdir out" in commands
    compared = structural(README.read_text())
    assert {c.split()[1] for c in compared} >= {"inspect", "fuse", "run", "compare", "report"}, sorted(compared)


def test_a_renamed_column_or_a_dropped_row_changes_the_structure():
    """The README's own check table against itself: other numbers match; a renamed column, a
    dropped row or a line more do not."""
    shown = next(lines for c, lines in structural(README.read_text()).items() if c.startswith("onnxmlu fuse"))
    assert same_structure(shown, [NUMBER.sub(lambda m: m[0] + "1", line) for line in shown]) is None
    header = next(k for k, line in enumerate(shown) if "sim µs" in line)
    renamed = shown[:header] + [shown[header].replace("sim µs", "sim us")] + shown[header + 1:]
    assert "sim µs" in str(same_structure(shown, renamed))
    row = next(k for k, line in enumerate(shown) if line.startswith("│") and "fp32" in line)
    assert same_structure(shown, shown[:row] + shown[row + 1:]) is not None
    assert "which the README does not show" in str(same_structure(shown, shown + ["one line more"]))


@pytest.mark.heavy
def test_readme_examples_run_as_written_in_an_empty_folder(library, tmp_path):
    assert shutil.which("jq"), "the README pipes --json into jq: install jq"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    env.pop("COLUMNS", None)  # the README shows what a pipe prints (test runners set COLUMNS=80)
    shown, compared = printed(README.read_text()), structural(README.read_text())
    for kind, code in examples(README.read_text()):
        command = code.split("  #", 1)[0].strip()
        if command in NOT_RUN:
            continue
        if command.startswith(SERVES):
            _serves(command, tmp_path, env)
            continue
        argv = ["bash", "-o", "pipefail", "-c", command] if kind == "sh" else [sys.executable, "-c", code]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0 and "error:" not in done.stderr, f"{command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        if command.startswith(EXACT_OUTPUT):
            assert _rounded(done.stdout.splitlines()) == shown[command], f"README shows another output for {command}"
        elif command in compared:
            difference = same_structure(compared[command], done.stdout.splitlines())
            assert difference is None, f"README shows another output for {command}: {difference}"


def _serves(command: str, folder: Path, env: dict) -> None:
    """Run a serving command until it says where it serves, then stop it."""
    command += " --port 18123" if "--port" not in command else ""
    process = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=folder, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        deadline, seen = time.monotonic() + 120, ""
        while "Serving" not in seen and time.monotonic() < deadline and process.poll() is None:
            seen += process.stdout.readline()
        assert "Serving" in seen, f"{command}: {seen[-2000:]}"
    finally:
        process.terminate()
        process.wait(timeout=30)
