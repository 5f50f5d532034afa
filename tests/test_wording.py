"""Counts in words: no message reads "1 blocks" (onnxmlu/wording.py, used wherever a count
meets a noun in the CLI's output and the reports)."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
from typer.testing import CliRunner

from onnxmlu.cli import app
from onnxmlu.wording import noun, plural

from runtime_helpers import conv_relu_body

PACKAGE = Path(__file__).resolve().parents[1] / "onnxmlu"
#: Where the user reads counts: the CLI, the reports and what they print.
MESSAGES = ("cli.py", "reports.py", "api.py", "pipeline.py", "plots.py", "tools/html_report.py", "tools/run.py",
            "tools/verify.py", "analyze/coverage.py", "precision/calibration.py")


def test_one_is_singular_and_every_other_count_plural():
    assert [plural(n, "block") for n in (0, 1, 2)] == ["0 blocks", "1 block", "2 blocks"]
    assert plural(1.0, "step", spec="g") == "1 step" and plural(2.5, "step", spec="g") == "2.5 steps"
    assert plural(3, "matrix", "matrices") == "3 matrices" and noun(1, "core") == "core"


def test_no_count_meets_a_plural_noun_by_hand():
    """``{len(x)} blocks`` in an f-string prints "1 blocks" for one: such a message goes through
    :func:`plural` instead."""
    by_hand = re.compile(r"\{[^{}]*(len\(|\.runs|repeat|qtol|cores|count)[^{}]*\}\s+[a-z]+s\b")
    found = [f"{name}:{k}: {line.strip()}" for name in MESSAGES
             for k, line in enumerate((PACKAGE / name).read_text().splitlines(), 1) if by_hand.search(line)]
    assert not found, "\n".join(found)


def test_no_message_spells_a_plural_by_hand():
    """``node(s)`` and ``block{'s' * (n != 1)}`` are the rule spelled again: :func:`plural` says it."""
    by_hand = re.compile(r"""[a-z]\(s\)"|\{'s' \* \(""")
    found = [f"{name}:{k}: {line.strip()}" for name in MESSAGES + ("precision/bodies.py",)
             for k, line in enumerate((PACKAGE / name).read_text().splitlines(), 1) if by_hand.search(line)]
    assert not found, "\n".join(found)


def test_fuse_of_one_block_says_one_block(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(conv_relu_body(), src)
    result = CliRunner().invoke(app, ["fuse", str(src), str(out), "-s", "all-fusion"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "(1 block," in result.output and "1 block · strategy all-fusion" in result.output, result.output
    assert not re.search(r"\b1 [a-z]+s\b", result.output), result.output
