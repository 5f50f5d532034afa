"""Counts in words: no message reads "1 blocks" (onnxmlu/wording.py, used wherever a count
meets a noun: the CLI's output, the reports, and every error, diagnostic, rewrite reason and
runtime message, scanned module by module)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import onnx
from typer.testing import CliRunner

from onnxmlu.cli import app
from onnxmlu.wording import noun, plural

from runtime_helpers import conv_relu_body

PACKAGE = Path(__file__).resolve().parents[1] / "onnxmlu"


def test_one_is_singular_and_every_other_count_plural():
    assert [plural(n, "block") for n in (0, 1, 2)] == ["0 blocks", "1 block", "2 blocks"]
    assert plural(1.0, "step", spec="g") == "1 step" and plural(2.5, "step", spec="g") == "2.5 steps"
    assert plural(3, "matrix", "matrices") == "3 matrices" and noun(1, "core") == "core"


#: Words ending in s that follow a placeholder without being a plural noun it counts: verbs of
#: the subject the placeholder names (``{name} has``), ``its``/``this``, units (``{t:.2f} ms``),
#: singular nouns (``along axis``).
NOT_NOUNS = {"is", "was", "has", "does", "as", "vs", "ms", "its", "this", "holds", "needs", "requires", "provides",
             "reads", "says", "serializes", "crosses", "matches", "starts", "ends", "spans", "runs", "chooses",
             "computes", "axis", "bias"}
#: A placeholder whose last name ends so is a label, not a count (``{r['precision']} layers``).
LABEL = re.compile(r"(name|type|kind|precision|dtype|path)$")
#: A plural-looking word after a placeholder, up to two other words between (``{n} heavy nodes``).
NOUN_AFTER = re.compile(r"\s+(?:[a-z][a-z-]*[^s\W]\s+){0,2}([a-z][a-z-]*s)\b")


def _counted(expr: ast.expr) -> bool:
    """Whether a placeholder may be a bare count: not a label (:data:`LABEL`), not :func:`plural`'s words."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in ("plural", "noun"):
        return False
    return not LABEL.search(_last_name(expr))


def _last_name(expr: ast.expr) -> str:
    """``x.name`` -> ``name``, ``row['op_type']`` -> ``op_type``, ``len(x)`` -> ``''``."""
    while isinstance(expr, (ast.Subscript, ast.Attribute)):
        if isinstance(expr, ast.Attribute):
            return expr.attr
        if isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, str):
            return expr.slice.value
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else ""


def counts_before_plurals(source: str) -> list[str]:
    """Each f-string placeholder followed by a plural noun (``f"{len(x)} blocks"``), which reads
    "1 blocks" for one: ``line: {placeholder} noun``. A ratio's denominator (``{a}/{b} nodes``) is not one."""
    found = []
    for node in (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.JoinedStr)):
        for before, value, after in zip([None, *node.values], node.values, [*node.values[1:], None]):
            if not isinstance(value, ast.FormattedValue) or not isinstance(after, ast.Constant):
                continue
            noun_ = NOUN_AFTER.match(after.value)
            ratio = isinstance(before, ast.Constant) and before.value.endswith("/")
            if noun_ and noun_.group(1) not in NOT_NOUNS and _counted(value.value) and not ratio:
                found.append(f"{node.lineno}: {{{ast.unparse(value.value)}}} {noun_.group(1)}")
    return found


def test_no_count_meets_a_plural_noun_by_hand():
    """In every module (errors, diagnostics, rewrite reasons, runtime and frontend messages, the
    CLI and the reports): ``{len(x)} blocks`` prints "1 blocks" for one; :func:`plural` instead."""
    found = [f"{path.relative_to(PACKAGE)}:{hit}" for path in sorted(PACKAGE.rglob("*.py"))
             for hit in counts_before_plurals(path.read_text())]
    assert not found, "\n".join(found)


CUSTOM_OPS = PACKAGE.parent / "custom_ops"
#: ``std::to_string(n) + " inputs"`` in the library's C++ messages: its Plural() says the noun.
CPP_BY_HAND = re.compile(r"std::to_string\((?:[^()]|\([^()]*\))*\)\s*\+\s*\"" + NOUN_AFTER.pattern)


def test_no_cpp_message_puts_a_count_before_a_plural_by_hand():
    """The custom-op library's errors (``body has 1 inputs but the node has 2``) say counts as
    :func:`plural` does, through ``Plural()`` in ort_support.h."""
    found = [f"{path.name}: {m.group(0)}" for path in sorted(CUSTOM_OPS.glob("*.[ch]*"))
             for m in CPP_BY_HAND.finditer(path.read_text()) if m.group(1) not in NOT_NOUNS]
    assert not found, "\n".join(found)
    planted = 'throw BlockError(code, "body has " + std::to_string(n.size()) +\n  " outputs but");'
    assert [m.group(1) for m in CPP_BY_HAND.finditer(planted)] == ["outputs"]


def test_the_scan_finds_a_count_before_a_plural_in_any_form():
    planted = '''
def f(n, x, blocks, row):
    a = f"{n} blocks"
    b = (f"has {len(x)} heavy host " "nodes")
    c = f"{n:,} inputs left"
    d = f"{x.count} samples" + f"{row['name']} has {n} more nodes"
'''
    assert counts_before_plurals(planted) == ["3: {n} blocks", "4: {len(x)} nodes", "5: {n} inputs",
                                              "6: {x.count} samples", "6: {n} nodes"]
    fine = """
def g(node, n, row, a, b, t):
    x = f"{node.name} has {plural(n, 'block')}; {row['op_type']} nodes; {a}/{b} heavy nodes; {t:.2f} ms"
    y = f"{plural(n, 'unit')} for their trials"
"""
    assert counts_before_plurals(fine) == []


def test_an_error_of_one_dim_says_one_dim(tmp_path):
    """The frontend's refusal of a pin of the wrong rank (it read "gives input 'x' 1 dims")."""
    onnx.save(conv_relu_body(), tmp_path / "m.onnx")
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "m.onnx"), "--input-shape", "x:1"])
    assert result.exit_code == 2 and "gives input 'x' 1 dim; the model declares rank 4" in result.output, result.output


def test_no_message_spells_a_plural_by_hand():
    """``node(s)`` and ``block{'s' * (n != 1)}`` are the rule spelled again: :func:`plural` says it."""
    by_hand = re.compile(r"""[a-z]\(s\)"|\{'s' \* \(""")
    found = [f"{path.relative_to(PACKAGE)}:{k}: {line.strip()}" for path in sorted(PACKAGE.rglob("*.py"))
             for k, line in enumerate(path.read_text().splitlines(), 1) if by_hand.search(line)]
    assert not found, "\n".join(found)


def test_fuse_of_one_block_says_one_block(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(conv_relu_body(), src)
    result = CliRunner().invoke(app, ["fuse", str(src), str(out), "-s", "all-fusion"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "(1 block," in result.output and "1 block · strategy all-fusion" in result.output, result.output
    assert not re.search(r"\b1 [a-z]+s\b", result.output), result.output
