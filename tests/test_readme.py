"""The README's examples run as written in an empty folder: the "Everyday use" commands, then
every ``$`` command and Python block of the walkthrough sections, in order, in one folder, with
the installed ``onnxmlu`` first on PATH. Each must exit 0 without an ``error:`` line.

The walkthrough's planner and model figures (:data:`EXACT_OUTPUT`) must be what the commands
print now, to six significant digits: regenerate those blocks when a change moves them.

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


def printed(text: str) -> dict[str, list[str]]:
    """Walkthrough command -> the output lines the README shows under it (up to the next ``$``)."""
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
    return {command: _rounded(lines) for command, lines in shown.items()}


def _rounded(lines: list[str]) -> list[str]:
    """Lines without trailing blanks, each decimal number to 6 significant digits (a float
    summed in another order on another CPU differs in its last digits)."""
    rounded = [re.sub(r"\d+\.\d+", lambda m: f"{float(m[0]):.6g}", line.rstrip()) for line in lines]
    while rounded and not rounded[-1]:
        rounded.pop()
    return rounded


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


@pytest.mark.heavy
def test_readme_examples_run_as_written_in_an_empty_folder(library, tmp_path):
    assert shutil.which("jq"), "the README pipes --json into jq: install jq"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    shown = printed(README.read_text())
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
