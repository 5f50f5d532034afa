"""``onnxmlu report``: one self-contained HTML page (no script, no external resource) with the
plan's timeline, per-block table, host nodes and reasons, coverage, the auto plans and the
check; for a fused file, what it holds. The page is parsed here; a real browser renders it in
the ``browser``-marked test (Debian's chromium, when installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnxmlu import api
from onnxmlu.cli import app
from onnxmlu.errors import OnnxMluError
from onnxmlu.frontend.pins import DimRange
from onnxmlu.schema import PRICING_SHAPE_KEY, model_metadata, record_pricing_shape
from onnxmlu.tools.testing import conv_chain_model


class Page(HTMLParser):
    """Tags, attributes and text of a page, and the rows of each table by id."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.text: list[str] = []
        self._summaries: list[str] = []
        self._table = self._row = self._summary = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "summary":
            self._summary = []
        elif tag == "table":
            self._table = self.tables.setdefault(attrs.get("id", ""), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
            self._table.append(self._row)

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif tag == "summary" and self._summary is not None:
            self._summaries.append(" ".join("".join(self._summary).split()))
            self._summary = None

    def handle_data(self, data):
        self.text.append(data)
        if self._summary is not None:
            self._summary.append(data)
        if self._row is not None and data.strip():
            self._row.append(data.strip())

    def summaries(self) -> list[str]:
        """The text of each ``<summary>`` (a ``<details>``' heading), in order."""
        return list(self._summaries)

    def words(self) -> str:
        """The page's text, whitespace collapsed."""
        return " ".join(" ".join(self.text).split())

    def count(self, tag: str, **attrs) -> int:
        return sum(t == tag and all(a.get(k) == v for k, v in attrs.items()) for t, a in self.tags)


def assert_self_contained(page: Page) -> None:
    assert not [t for t, _ in page.tags if t in ("script", "link", "img", "iframe", "object")]
    assert not [a for _, attrs in page.tags for k, a in attrs.items() if k == "src" or (k == "href" and a[:1] != "#")]


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
    result = api.fuse(chain_file)
    onnx.save(result.model, fused)
    path = api.report(fused, tmp_path / "f.html")
    page = Page(path.read_text())
    assert_self_contained(page)
    # the host node's reason travels in the file (its doc_string), the same words fuse said
    said = [[h["node"], h["op_type"], h["reason"]] for h in result.to_dict()["host_nodes"]]
    assert len(page.tables["blocks"]) == 3 and [row[:3] for row in page.tables["host"][1:]] == said
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


def symbolic_conv() -> onnx.ModelProto:
    """images [N, 3, H, W] -> Conv -> Relu -> Conv: priced where --input-shape says."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w0"),
               numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w1")]
    nodes = [helper.make_node("Conv", ["images", "w0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1"], ["y"], pads=[1, 1, 1, 1], name="conv1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


RANGE = {"images": [1, 3, DimRange(16, 32, 64), 32]}


def test_the_report_shows_the_pricing_shape_and_its_profile(tmp_path):
    path = api.report(symbolic_conv(), tmp_path / "r.html", input_shapes=RANGE, strategy="none")
    fused = api.fuse(symbolic_conv(), input_shapes=RANGE, strategy="none").to_dict()
    page = Page(path.read_text())
    assert "priced at images:1x3x32x32. Simulated figures are for this shape." in page.words()
    profile = page.tables["profile"][1:]
    assert [row[:2] for row in profile] == [["min", "images:1x3x16x32"], ["opt", "images:1x3x32x32"],
                                             ["max", "images:1x3x64x32"]]
    assert [float(row[2]) for row in profile] == [round(fused["profile"]["sim_latency_us"][p], 1)
                                                  for p in ("min", "opt", "max")]


def test_the_timeline_has_a_legend_and_a_time_axis(tmp_path):
    path = api.report(symbolic_conv(), tmp_path / "r.html", input_shapes=RANGE, strategy="dynamic-mp")
    blocks = api.fuse(symbolic_conv(), input_shapes=RANGE, strategy="dynamic-mp").block_rows()
    page = Page(path.read_text())
    fills = {a["fill"] for t, a in page.tags if t == "rect"}
    swatches = [a["style"] for t, a in page.tags if t == "span" and a.get("class") == "swatch"]
    assert len(fills) == len(swatches) == len({b["mp"] for b in blocks})  # one distinct colour per MP
    assert {f"background:{f}" for f in fills} == set(swatches)
    assert page.count("g", id="time-axis") == 1 and "simulated time (µs)" in page.words()


def test_each_block_opens_onto_its_layers(tmp_path):
    result = api.fuse(symbolic_conv(), input_shapes=RANGE, strategy="none")
    page = Page(api.report(symbolic_conv(), tmp_path / "r.html", input_shapes=RANGE, strategy="none").read_text())
    assert page.count("details", **{"class": "layers"}) == len(result.plan.blocks)
    for k, (block, latency) in enumerate(zip(result.plan.blocks, result.block_latency_us)):
        head, *rows = page.tables[f"layers-{k}"]
        assert head == ["layer", "op", "precision", "mp", "sim µs", "compute µs", "memory µs", "KB moved",
                        "bound by"]
        assert [r[0] for r in rows] == [layer.name for layer in block.layers(result.analysis.layers)]
        assert all(r[3] == str(block.mp) and r[8] in ("compute", "memory") for r in rows)
        assert 0 < sum(float(r[4]) for r in rows) <= latency  # the block adds its launch and fill
        bound = "compute" if float(rows[0][5]) >= float(rows[0][6]) else "memory"
        assert rows[0][8] == bound


def test_a_fused_file_report_reads_the_pricing_shape_and_the_layers_of_each_block(tmp_path):
    fused = tmp_path / "f.onnx"
    onnx.save(api.fuse(symbolic_conv(), strategy="all-fusion").model, fused)
    page = Page(api.report(fused, tmp_path / "f.html").read_text())
    assert "priced at images:1x3x224x224 (default for symbolic dims N, H, W; pin with --input-shape)" in page.words()
    assert [r[:2] for r in page.tables["layers-0"][1:]] == [["conv0", "Conv"], ["relu0", "Relu"], ["conv1", "Conv"]]


def test_a_fused_file_report_shows_the_simulated_us_of_its_profile(tmp_path):
    """The min / opt / max table of a fused file read '–' for every simulated µs: the file kept
    the shapes only. It reads the figures fuse recorded; a file without them says so."""
    fused, result = tmp_path / "f.onnx", api.fuse(symbolic_conv(), input_shapes=RANGE, strategy="none")
    onnx.save(result.model, fused)
    profile = Page(api.report(fused, tmp_path / "f.html").read_text()).tables["profile"][1:]
    assert [row[0] for row in profile] == ["min", "opt", "max"]
    assert [float(row[2]) for row in profile] == [round(result.profile.latency_us[p], 1) for p in ("min", "opt", "max")]
    older = onnx.load(fused)
    record = json.loads(model_metadata(older)[PRICING_SHAPE_KEY])
    del record["sim_latency_us"]  # as written before the record held them
    record_pricing_shape(older, record)
    onnx.save(older, fused)
    page = Page(api.report(fused, tmp_path / "g.html").read_text())
    assert [row[2] for row in page.tables["profile"][1:]] == ["–"] * 3
    assert "'–': simulated µs at min/opt/max not recorded in this file (fused before it was)." in page.words()


def test_the_auto_chart_has_labelled_axes_and_a_legend(library, chain_file, tmp_path):
    page = Page(api.report(chain_file, tmp_path / "a.html", precision="auto", accuracy="cosine>=0.99").read_text())
    text = page.words()
    assert "simulated latency (µs)" in text and "worst cosine similarity" in text
    assert "measured on the validation samples" in text and "chosen plan" in text


def test_the_check_says_what_it_ran_never_seeds_of_nothing(library, chain_file, tmp_path):
    """The seeds a check ran, once (the line read ``seed 0 · inputs: seeded random inputs (seed 0)``),
    and ``no random seed`` when it ran on samples (it read ``seeds []``)."""
    plain = Page(api.report(chain_file, tmp_path / "r.html", check=True).read_text())
    assert plain.tables["check-shapes"][1][:3] == ["default", "x:1x8x16x16", "ok"]
    words = plain.words()
    assert "inputs: seeded random inputs (seed 0)" in words and len(re.findall(r"\bseed 0\b", words)) == 1, words
    auto = Page(api.report(chain_file, tmp_path / "a.html", check=True, precision="auto").read_text())
    assert "seeds []" not in auto.words() and "no random seed · inputs:" in auto.words()


def png_pixels(path: Path) -> np.ndarray:
    """The RGB(A) pixels of an 8-bit PNG (no imaging library: zlib and the five row filters)."""
    data = path.read_bytes()
    chunks, at = {}, 8
    while at < len(data):
        size, kind = int.from_bytes(data[at:at + 4], "big"), data[at + 4:at + 8]
        chunks[kind] = chunks.get(kind, b"") + data[at + 8:at + 8 + size]
        at += 12 + size
    width, height = int.from_bytes(chunks[b"IHDR"][:4], "big"), int.from_bytes(chunks[b"IHDR"][4:8], "big")
    channels = {2: 3, 6: 4}[chunks[b"IHDR"][9]]
    raw, stride = zlib.decompress(chunks[b"IDAT"]), width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a, b = line[i - channels] if i >= channels else 0, previous[i]
            c = previous[i - channels] if i >= channels else 0
            p = a + b - c
            predictor = {0: 0, 1: a, 2: b, 3: (a + b) // 2,
                         4: a if abs(p - a) <= min(abs(p - b), abs(p - c)) else b if abs(p - b) <= abs(p - c) else c}
            line[i] = (line[i] + predictor[kind]) & 0xFF
        rows.append(bytes(line))
        previous = line
    return np.frombuffer(b"".join(rows), np.uint8).reshape(height, width, channels)[..., :3]


@pytest.mark.browser
def test_the_page_is_drawn_as_laid_out_in_a_headless_browser(tmp_path):
    """A real chromium draws the page (offline, from disk): the timeline's bars in their
    legend's colours, as wide as their share of the time, and the drill-down opened in the DOM."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    result = api.fuse(symbolic_conv(), input_shapes=RANGE, strategy="none")
    path = api.report(symbolic_conv(), tmp_path / "r.html", input_shapes=RANGE, strategy="none")
    shot = tmp_path / "r.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1100,900", f"--screenshot={shot}", Path(path).as_uri()],
                   capture_output=True, timeout=120, check=True)
    pixels = png_pixels(shot)
    colour = np.array([0x4E, 0x79, 0xA7])  # the first MP's colour (the plan's only one: strategy none)
    painted = np.all(pixels == colour, axis=-1)
    rows = painted.sum(axis=1)
    bar_rows = rows > 0.5 * rows.max()
    assert rows.max() > 600 and 30 <= bar_rows.sum() <= 50  # one 40-px band the width of the timeline
    legend = painted & ~bar_rows[:, None]
    assert legend.sum() >= 100  # the legend's swatch, above the band
    band = painted[np.argmax(bar_rows)]
    cuts = np.flatnonzero(np.diff(band.astype(int)) == -1)  # where each block's bar ends (a white stroke)
    shares = np.diff(np.concatenate([[np.argmax(band)], cuts])) / band.sum()
    expected = np.array(result.block_latency_us) / result.sim_latency_us
    assert len(shares) == len(expected) and np.allclose(shares, expected, atol=0.02)


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
