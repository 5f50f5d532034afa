"""``onnxmlu report``: one self-contained HTML page (no script, no external resource) with the
plan's timeline, per-block table, host nodes and reasons, coverage, the auto plans and the
check; for a fused file, what it holds. The page is parsed here; a real browser renders it in
the ``browser``-marked test (Debian's chromium, when installed)."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import onnx
import pytest
from typer.testing import CliRunner

from onnxmlu import api
from onnxmlu.cli import app
from onnxmlu.errors import OnnxMluError
from onnxmlu.tools.testing import conv_chain_model


class Page(HTMLParser):
    """Tags, attributes and text of a page, and the rows of each table by id."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.text: list[str] = []
        self._table = self._row = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "table":
            self._table = self.tables.setdefault(attrs.get("id", ""), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
            self._table.append(self._row)

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None

    def handle_data(self, data):
        self.text.append(data)
        if self._row is not None and data.strip():
            self._row.append(data.strip())

    def words(self) -> str:
        """The page's text, whitespace collapsed."""
        return " ".join(" ".join(self.text).split())

    def count(self, tag: str, **attrs) -> int:
        return sum(t == tag and all(a.get(k) == v for k, v in attrs.items()) for t, a in self.tags)


def assert_self_contained(page: Page) -> None:
    assert not [t for t, _ in page.tags if t in ("script", "link", "img", "iframe", "object")]
    assert not [a for _, attrs in page.tags for k, a in attrs.items() if k in ("src", "href")]


@pytest.fixture
def chain_file(tmp_path):
    path = tmp_path / "chain.onnx"
    onnx.save(conv_chain_model(), path)
    return path


def test_a_plan_report_shows_timeline_blocks_host_nodes_coverage_and_check(library, chain_file, tmp_path):
    result = CliRunner().invoke(app, ["report", str(chain_file), "-o", str(tmp_path / "r.html"), "--check"])
    assert result.exit_code == 0, result.output
    fused = api.fuse(chain_file).to_dict()
    page = Page((tmp_path / "r.html").read_text())
    assert_self_contained(page)
    blocks = len(fused["blocks"])
    assert page.count("g", **{"class": "block"}) == blocks and len(page.tables["blocks"]) == blocks + 1
    host = page.tables["host"][1:]
    assert [row[0] for row in host] == [h["node"] for h in fused["host_nodes"]] == ["topk1"]
    assert host[0][2] == fused["host_nodes"][0]["reason"]
    text = page.words()
    assert "check passed" in text and "layers in blocks" in text and "host nodes: 1" in text


def test_a_fused_file_report_lists_what_it_holds(library, chain_file, tmp_path):
    fused = tmp_path / "f.onnx"
    onnx.save(api.fuse(chain_file).model, fused)
    path = api.report(fused, tmp_path / "f.html")
    page = Page(path.read_text())
    assert_self_contained(page)
    assert len(page.tables["blocks"]) == 3 and page.tables["host"][1][2] == "(not recorded in a fused file)"
    assert "strategy: dlfusion" in page.words()


def test_an_auto_report_plots_the_plans_considered(library, chain_file, tmp_path):
    path = api.report(chain_file, tmp_path / "a.html", precision="auto", accuracy="cosine>=0.99")
    auto = api.fuse(chain_file, precision="auto", accuracy="cosine>=0.99").to_dict()["auto"]
    page = Page(path.read_text())
    assert page.count("svg", id="pareto") == 1
    assert page.count("circle", **{"class": "plan"}) == len(auto["candidates"]) and page.count("circle", id="chosen") == 1


def test_the_destination_is_checked_before_any_work(tmp_path):
    with pytest.raises(OnnxMluError, match="does not exist"):
        api.report(tmp_path / "no-such-model.onnx", tmp_path / "missing" / "r.html")


@pytest.mark.browser
def test_the_page_renders_in_a_headless_browser(library, chain_file, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    path = api.report(chain_file, tmp_path / "r.html", check=True)
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          Path(path).as_uri()], capture_output=True, text=True, timeout=120, check=True).stdout
    page = Page(dom)
    assert page.count("rect") == len(api.fuse(chain_file).plan.blocks) and "check passed" in dom
