"""Citations resolve: every ``[Key]`` the package or the docs cite is an entry of
docs/references.md, and every entry there is cited somewhere.

A citation is a bracketed key that starts with a capital and holds a lower-case letter
(``[DLFusion]``, ``[ONNX-ops]``), written after a space, a parenthesis or a quote and not
followed by a parenthesis (a Markdown link). Python's ``[None]``/``[True]``/``[False]`` and
subscripts (``list[Layer]``) are not citations.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "docs" / "references.md"
CITATION = re.compile(r"(?<![^\s(\"'])\[([A-Z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)*)\](?!\()")
NOT_KEYS = {"None", "True", "False"}


def entries() -> list[str]:
    return re.findall(r"^- \*\*\[([^\]]+)\]\*\*", REFERENCES.read_text(), re.M)


def citations() -> dict[str, list[str]]:
    """key -> the files citing it (the package's code and schemas, every page but the list)."""
    files = [*sorted((ROOT / "onnxmlu").rglob("*.py")), *sorted((ROOT / "onnxmlu").rglob("*.json")),
             *sorted(p for p in (ROOT / "docs").glob("*.md") if p != REFERENCES)]
    found: dict[str, list[str]] = {}
    for path in files:
        for key in CITATION.findall(path.read_text(encoding="utf-8")):
            if key not in NOT_KEYS and re.search("[a-z]", key):
                found.setdefault(key, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_key_cited_is_listed():
    listed = set(entries())
    unknown = {k: sorted(set(v)) for k, v in citations().items() if k not in listed}
    assert not unknown, f"cited but not in docs/references.md: {unknown}"


def test_every_entry_is_cited():
    keys = entries()
    assert len(keys) == len(set(keys)), "a key listed twice"
    assert set(keys) - set(citations()) == set(), "listed in docs/references.md but never cited"


def test_the_papers_are_cited_by_key_in_the_package():
    """The package names the papers' equations, figures and tables through their keys."""
    cited = citations()
    assert len([f for f in cited["DLFusion"] if f.startswith("onnxmlu/")]) >= 20
    assert any(f.startswith("onnxmlu/") for f in cited["Paleozoic"])


def test_paper_parts_sit_beside_their_key():
    """A file of the package that names an equation, figure, table or algorithm of a paper
    cites that paper by key (the first mention; later ones in the file may stay short)."""
    part = re.compile(r"\b(Eq\. ?\d|Fig\. ?\d|Table I|Algorithm \d|the paper)")
    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "onnxmlu").rglob("*"))
               if p.suffix in (".py", ".json") and part.search(text := p.read_text(encoding="utf-8"))
               and not re.search(r"\[(DLFusion|Paleozoic)\]", text)]
    assert not missing, f"names a paper's figure or equation without its key: {missing}"
