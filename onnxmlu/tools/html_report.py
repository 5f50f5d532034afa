"""``onnxmlu report``: one self-contained HTML page about a plan or a fused model.

Everything is inline -- styles in a ``<style>`` element, charts as inline SVG, no script, no
font, no image file, links only to the page's own anchors -- so the page opens from disk,
offline, and can be mailed as one file. Sections: the shape the plan was priced at and, with
``--input-shape`` ranges, its min / opt / max profile (the simulated µs at each point: the
``fuse`` report's, or a fused file's ``onnxmlu.pricing_shape`` record); a timeline of the blocks on the simulated
accelerator (each bar as wide as the block's simulated latency, coloured by its MP, a legend
naming each colour, a time axis); the per-block table, each block opening onto its layers
(``<details>``: per layer its simulated time, compute and memory time, bytes moved and which
side of the roofline bounds it, :func:`onnxmlu.plan.perf.model.layer_estimates`); the host nodes
with their reasons; coverage figures; the blocks inside host control flow (If branches,
Loop/Scan bodies); and, where the report has them, the ``--precision auto`` latency / accuracy
chart of the plans considered (both axes labelled) and the check's results with the inputs and
shapes it ran.

The input is a report dict: the ``fuse`` report (``FuseResult.to_dict()``) for a model fused
now, or the ``inspect-fused`` report for a fused file (whose host nodes carry no reason and
whose layers carry no simulated time: the file does not record them); and the layers of each
block (``layers``: one list of rows per block, as :meth:`onnxmlu.reports.FuseResult.layer_rows`
gives, or names and op types read from a fused file's nodes).
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

from onnxmlu.analyze.coverage import Coverage
from onnxmlu.collapse.atomic import write_bytes_atomic
from onnxmlu.frontend.pins import POINTS, PricingShape, shapes_text
from onnxmlu.plan.profile import BlockAcross
from onnxmlu.schema import PRICING_SHAPE_KEY, block_node_name
from onnxmlu.tools.verify import nan_fails, seeded_inputs, twin_lines
from onnxmlu.wording import plural

_WIDTH = 960
_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 6px 0; max-width: 100%; } td { overflow-wrap: anywhere; }
td, th { padding: 2px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; background: #f4f4f4; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.fig { display: flex; gap: 2em; flex-wrap: wrap; } .fig div { background: #f7f7f7; padding: 6px 12px; }
.ok { color: #17702a; font-weight: bold; } .bad { color: #b00020; font-weight: bold; }
.legend { display: flex; gap: 1.2em; flex-wrap: wrap; margin: 4px 0 8px; font-size: 0.9em; }
.swatch { display: inline-block; width: 14px; height: 14px; vertical-align: -2px; margin-right: 4px; }
details { margin: 4px 0; } summary { cursor: pointer; } details table { margin: 4px 0 10px 1.5em; }
td.memory { color: #8a4b00; } td.compute { color: #1f4f99; }
"""
#: Distinguishable colours (Tableau 10), one per MP used in the plan, in MP order.
_PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
            "#9c755f", "#bab0ac")


def write_report(report: dict, path: str | Path, title: str, layers: list[list[dict]] | None = None) -> Path:
    """Write the page for ``report`` (a ``fuse`` or ``inspect-fused`` report dict) to ``path``."""
    path = Path(path)
    write_bytes_atomic(render(report, title, layers).encode("utf-8"), path)
    return path


def render(report: dict, title: str, layers: list[list[dict]] | None = None) -> str:
    blocks = [_block(b) for b in report.get("blocks", []) if not b.get("graph")]
    colours = _mp_colours(blocks)
    parts = [_header(report, title, blocks), _section("Pricing shape", _pricing(report)),
             _section("Timeline (simulated accelerator)", _legend(colours) + _timeline(blocks, colours)),
             _section("Blocks", _block_table(blocks) + _drill_down(blocks, layers or [])),
             _section("Host nodes", _host_table(report.get("host_nodes", []))),
             _section("Coverage", _coverage(report, blocks))]
    inside = _inside_control_flow(report)
    if inside:
        parts.append(_section("Blocks inside control flow (If branches, Loop and Scan bodies)", inside))
    auto = report.get("auto")
    if auto:
        parts.append(_section("--precision auto: plans considered", _pareto(auto)))
    if report.get("check"):
        parts.append(_section("Check", _check(report["check"])))
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _block(row: dict) -> dict:
    """One block's fields, from either report's block row: a fused file's gives its node's name,
    a plan's its index, named as its node is (:func:`~onnxmlu.schema.block_node_name`)."""
    layers = row.get("layers")
    name = row["block"] if isinstance(row["block"], str) else block_node_name(row["block"], row.get("mp"))
    return {"name": name,
            "mp": row.get("mp"), "precision": row.get("precision", "fp32"),
            "layers": layers if isinstance(layers, int) else len(layers or []),
            "sim_us": row.get("sim_latency_us"), "first": row.get("first", ""), "last": row.get("last", ""),
            "gops": row.get("gops")}


def _header(report: dict, title: str, blocks: list[dict]) -> str:
    total = report.get("sim_latency_us")
    facts = [("blocks", len(blocks)), ("simulated latency", "–" if total is None else f"{total:.1f} µs")]
    if report.get("sim_fps"):
        facts.append(("simulated FPS", f"{report['sim_fps']:.1f}"))
    meta = report.get("metadata", {})
    for key, label in (("strategy", "strategy"), ("hardware", "hardware")):
        value = report.get(key) or meta.get(f"onnxmlu.{key}")
        if value:
            facts.append((label, value))
    figures = "".join(f"<div>{_e(k)}: <b>{_e(v)}</b></div>" for k, v in facts)
    return f"<h1>{_e(title)}</h1><div class=\"fig\">{figures}</div>"


def _section(heading: str, body: str) -> str:
    return f"<section><h2>{_e(heading)}</h2>{body}</section>"


def _report_pricing(report: dict) -> PricingShape | None:
    """The report's pricing shape: a ``fuse`` report's ``pricing_shape``, or the record in a
    fused file's metadata (``onnxmlu.pricing_shape``); None when neither has one."""
    record = report.get("pricing_shape")
    if record is None and PRICING_SHAPE_KEY in report.get("metadata", {}):
        try:
            record = json.loads(report["metadata"][PRICING_SHAPE_KEY])
        except ValueError:  # a hand-edited record: the page says none is recorded
            record = None
    return PricingShape.from_dict(record) if isinstance(record, dict) else None


def _pricing(report: dict) -> str:
    """The pricing shape in words, then the min / opt / max table of the input profile."""
    pricing = _report_pricing(report)
    if pricing is None:
        return "<p id=\"pricing\">No pricing shape is recorded (a file fused before it was).</p>"
    text = f"<p id=\"pricing\">{_e(pricing.describe())}. Simulated figures are for this shape.</p>"
    if not pricing.profile:
        return text + "<p>No <code>--input-shape</code> range: the plan was priced at this shape only.</p>"
    latency = (report.get("profile") or {}).get("sim_latency_us") or pricing.latency_us or {}
    rows = [[point, shapes_text(pricing.profile[point]),
             f"{latency[point]:.1f}" if point in latency else "–"] for point in POINTS if point in pricing.profile]
    unrecorded = ("" if latency else f"<p id=\"profile-unrecorded\">'–': {_e(pricing.ranges_text())}.</p>")
    return (text + _table(["point", "input shapes", "simulated µs"], rows, {2}, "profile") + unrecorded
            + _mp_moves(report))


def _mp_moves(report: dict) -> str:
    """The blocks whose best MP moves over the ranges, in the words ``fuse`` and ``plan`` print
    (:meth:`~onnxmlu.plan.profile.BlockAcross.sentence`)."""
    blocks = [BlockAcross(b["block"], b["mp"], b["sim_latency_us"], b["best_mp"])
              for b in (report.get("profile") or {}).get("blocks", [])]
    strategy = report.get("strategy") or "the strategy"
    return "".join(f"<p class=\"mp-moves\">{_e(b.sentence(strategy))}</p>" for b in blocks if b.mp_moves)


def _mp_colours(blocks: list[dict]) -> dict:
    """MP -> its colour: one distinct colour per MP the plan uses (cycling past ten)."""
    mps = sorted({b["mp"] for b in blocks if isinstance(b["mp"], int)})
    return {mp: _PALETTE[k % len(_PALETTE)] for k, mp in enumerate(mps)}


def _legend(colours: dict) -> str:
    items = "".join(f"<span><span class=\"swatch\" style=\"background:{c}\"></span>mp {mp} "
                    f"({plural(mp, 'core')})</span>" for mp, c in colours.items())
    return f"<div class=\"legend\" id=\"legend\">Colour: the block's MP · {items}</div>" if colours else ""


def _ticks(total: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to ``total`` (steps of 1, 2 or 5 times a power of ten)."""
    raw = total / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [k * step for k in range(int(total // step) + 1)]


def _timeline(blocks: list[dict], colours: dict) -> str:
    times = [b["sim_us"] or 0.0 for b in blocks]
    total = sum(times)
    if not blocks or total <= 0:
        return "<p>No simulated latencies recorded.</p>"
    x, bars = 0.0, []
    for b, t in zip(blocks, times):
        w = _WIDTH * t / total
        label = f"{b['name']} · mp {b['mp']} · {b['precision']} · {t:.1f} µs"
        text = (f"<text x=\"{x + 4:.1f}\" y=\"34\" font-size=\"11\" fill=\"#fff\">mp {_e(b['mp'])}</text>"
                if w > 40 else "")
        rect = (f"<rect x=\"{x:.1f}\" y=\"10\" width=\"{max(w, 0.5):.1f}\" height=\"40\" "
                f"fill=\"{colours.get(b['mp'], '#999')}\" stroke=\"#fff\"/>")
        bars.append(f"<g class=\"block\"><title>{_e(label)}</title>{rect}{text}</g>")
        x += w
    return (f"<svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{_WIDTH + 20}\" height=\"96\" "
            f"role=\"img\">{''.join(bars)}{_time_axis(total)}</svg>")


def _time_axis(total: float) -> str:
    """The timeline's x axis: a line, round ticks in µs, and its title."""
    marks = []
    for value in _ticks(total):
        at = _WIDTH * value / total
        marks.append(f"<line x1=\"{at:.1f}\" y1=\"52\" x2=\"{at:.1f}\" y2=\"57\" stroke=\"#555\"/>"
                     f"<text x=\"{at:.1f}\" y=\"69\" font-size=\"10\" "
                     f"text-anchor=\"{'start' if value == 0 else 'middle'}\">{value:g}</text>")
    return (f"<g class=\"axis\" id=\"time-axis\"><line x1=\"0\" y1=\"52\" x2=\"{_WIDTH}\" y2=\"52\" stroke=\"#555\"/>"
            f"{''.join(marks)}<text x=\"{_WIDTH / 2:.0f}\" y=\"88\" font-size=\"11\" text-anchor=\"middle\">"
            f"simulated time (µs), {total:.1f} µs in all</text></g>")


def _table(headers: list[str], rows: list[list], numeric: set[int], table_id: str) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"{_cell(i in numeric, c)}{_e(c)}</td>" for i, c in enumerate(row)) + "</tr>"
                   for row in rows)
    return f"<table id=\"{table_id}\"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(numeric: bool, value) -> str:
    """A cell's opening tag: numbers right-aligned, a roofline bound in its colour."""
    if numeric:
        return '<td class="n">'
    return f'<td class="{value}">' if value in ("compute", "memory") else "<td>"


def _block_table(blocks: list[dict]) -> str:
    rows = [[b["name"], b["mp"], b["precision"], b["layers"], "–" if b["sim_us"] is None else f"{b['sim_us']:.1f}",
             "" if b["gops"] is None else f"{b['gops']:.3f}", b["first"], b["last"]] for b in blocks]
    return _table(["block", "mp", "precision", "layers", "sim µs", "GOPs", "first layer", "last layer"], rows,
                  {1, 3, 4, 5}, "blocks")


#: A layer row's columns in the drill-down: (heading, key, format; None: the text as it is).
_LAYER_COLUMNS = (("layer", "name", None), ("op", "op_type", None), ("precision", "precision", None),
                  ("mp", "mp", None), ("sim µs", "sim_us", "{:.2f}"), ("compute µs", "compute_us", "{:.2f}"),
                  ("memory µs", "memory_us", "{:.2f}"), ("KB moved", "bytes", "{:.1f}"), ("bound by", "bound", None))


def _drill_down(blocks: list[dict], layers: list[list[dict]]) -> str:
    """Each block opening onto its layers (``<details>``, no script): the columns a row has."""
    if not layers:
        return ""
    parts = ["<p>Open a block for its layers. A layer's time is max(compute, memory) plus the overlap "
             "term; the block adds its launch, issue, dispatch and pipeline fill. <i>bound by</i>: the side "
             "of the roofline that limits the layer.</p>"]
    for k, (b, rows) in enumerate(zip(blocks, layers)):
        columns = [c for c in _LAYER_COLUMNS if rows and c[1] in rows[0]]
        cells = [[_layer_cell(r, key, fmt) for _, key, fmt in columns] for r in rows]
        sim = "–" if b["sim_us"] is None else f"{b['sim_us']:.1f} µs"
        summary = f"{b['name']} · mp {b['mp']} · {b['precision']} · {plural(len(rows), 'layer')} · {sim}"
        numeric = {i for i, c in enumerate(columns) if c[2] is not None or c[1] == "mp"}
        table = _table([c[0] for c in columns], cells, numeric, f"layers-{k}")
        parts.append(f"<details id=\"block-{k}\" class=\"layers\"><summary>{_e(summary)}</summary>{table}</details>")
    return "".join(parts)


def _layer_cell(row: dict, key: str, fmt: str | None):
    value = row.get(key)
    if value is None:
        return "–"
    if key == "bytes":
        return fmt.format(value / 1024)
    return fmt.format(value) if fmt else value


def _inside_control_flow(report: dict) -> str:
    """The blocks of host control flow's subgraphs: per subgraph of a ``fuse`` report
    (``branches``), or per block of an ``inspect-fused`` report (``graph`` set); "" for none."""
    if report.get("branches"):
        rows = [[b["graph"], b["op_type"], "–" if b["runs"] is None else b["runs"], len(b["blocks"]),
                 f"{b['sim_latency_us']:.1f}"] for b in report["branches"]]
        return _table(["subgraph", "op", "runs per run of its graph", "blocks", "sim µs per run"], rows,
                      {2, 3, 4}, "branches")
    nested = [b for b in report.get("blocks", []) if b.get("graph")]
    if not nested:
        return ""
    rows = [[b["graph"], b["block"], b.get("mp"), b.get("precision", "fp32"),
             "–" if b.get("sim_latency_us") is None else f"{b['sim_latency_us']:.1f}"] for b in nested]
    return _table(["subgraph", "block", "mp", "precision", "sim µs"], rows, {2, 4}, "branches")


def _host_table(host_nodes: list[dict]) -> str:
    if not host_nodes:
        return "<p>None: every node runs in a block.</p>"
    unknown = "(not recorded in the file: a constant computed once, or an older file)"
    rows = [[h["node"], h["op_type"], h.get("reason", unknown)] for h in host_nodes]
    return _table(["node", "op", "reason"], rows, set(), "host")


def _coverage(report: dict, blocks: list[dict]) -> str:
    in_blocks = sum(b["layers"] for b in blocks)
    host = len(report.get("host_nodes", []))
    share = f"{100 * in_blocks / (in_blocks + host):.1f}%" if in_blocks + host else "–"
    facts = [("layers in blocks", in_blocks), ("host nodes", host), ("nodes on the accelerator", share)]
    if report.get("coverage"):  # a plan's: the heavy nodes, in the words fuse prints
        facts.insert(0, ("heavy nodes", Coverage.from_dict(report["coverage"]).summary()))
    gops = [b["gops"] for b in blocks if b["gops"] is not None]
    if gops:
        facts.append(("GOPs in blocks", f"{sum(gops):.3f}"))
    cells = "".join(f"<div>{_e(k)}: <b>{_e(v)}</b></div>" for k, v in facts)
    return f"<div class=\"fig\" id=\"coverage\">{cells}</div>"


def _pareto(auto: dict) -> str:
    """Simulated latency (x) against measured (else estimated) worst cosine (y) per plan, on
    labelled axes with ticks; the chosen plan ringed; a legend for the colours."""
    points = []
    for c in auto.get("candidates", []):
        accuracy = c.get("measured") or c["estimated"]
        points.append((c["latency_us"], accuracy["cosine"], c.get("measured") is not None))
    chosen = (auto["latency_us"], auto["measured"]["cosine"])
    xs, ys = [p[0] for p in points] + [chosen[0]], [p[1] for p in points] + [chosen[1]]
    box = _Plot(min(xs), max(xs), min(ys), max(ys))
    dots = "".join(f"<circle class=\"plan\" cx=\"{box.x(x):.1f}\" cy=\"{box.y(y):.1f}\" r=\"4\" "
                   f"fill=\"{'#1f5fbf' if measured else '#aaa'}\"><title>{x:.1f} µs · cosine {y:.6f}"
                   f"{'' if measured else ' (estimated)'}</title></circle>" for x, y, measured in points)
    star = (f"<circle id=\"chosen\" cx=\"{box.x(chosen[0]):.1f}\" cy=\"{box.y(chosen[1]):.1f}\" r=\"7\" "
            "fill=\"none\" stroke=\"#b00020\" stroke-width=\"2\"/>")
    legend = ("<div class=\"legend\" id=\"pareto-legend\"><span><span class=\"swatch\" style=\"background:#1f5fbf\">"
              "</span>measured on the validation samples</span><span><span class=\"swatch\" "
              "style=\"background:#aaa\"></span>estimated only</span><span><span class=\"swatch\" "
              "style=\"border:2px solid #b00020\"></span>chosen plan</span></div>")
    caption = (f"<p>Budget {_e(auto['budget'])}: chosen plan {auto['latency_us']:.1f} µs, "
               f"{auto['speedup']:.2f}× the FP32 plan.</p>")
    return (f"{legend}<svg id=\"pareto\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{box.width}\" "
            f"height=\"{box.height}\">{box.axes('simulated latency (µs)', 'worst cosine similarity')}{dots}{star}"
            f"</svg>{caption}")


class _Plot:
    """An SVG plot area: data ranges mapped into it (a flat range at the middle), and its axes."""

    width, height, left, right, top, bottom = 640, 340, 80, 20, 16, 50

    def __init__(self, x0: float, x1: float, y0: float, y1: float) -> None:
        dx, dy = 0.06 * (x1 - x0), 0.06 * (y1 - y0)  # points clear of the axes and the edges
        self.x0, self.x1, self.y0, self.y1 = x0 - dx, x1 + dx, y0 - dy, y1 + dy

    def x(self, value: float) -> float:
        span = self.width - self.left - self.right
        return self.left + span * ((value - self.x0) / (self.x1 - self.x0) if self.x1 > self.x0 else 0.5)

    def y(self, value: float) -> float:
        span = self.height - self.top - self.bottom
        share = (value - self.y0) / (self.y1 - self.y0) if self.y1 > self.y0 else 0.5
        return self.height - self.bottom - span * share

    def axes(self, x_title: str, y_title: str) -> str:
        """Both axes: lines, a tick and value at each end and the middle, and their titles."""
        base, edge = self.height - self.bottom, self.left
        parts = [f"<g class=\"axis\"><line x1=\"{edge}\" y1=\"{base}\" x2=\"{self.width - self.right}\" "
                 f"y2=\"{base}\" stroke=\"#555\"/><line x1=\"{edge}\" y1=\"{self.top}\" x2=\"{edge}\" "
                 f"y2=\"{base}\" stroke=\"#555\"/>"]
        for k in range(3):
            xv, yv = self.x0 + (self.x1 - self.x0) * k / 2, self.y0 + (self.y1 - self.y0) * k / 2
            parts.append(f"<text x=\"{self.x(xv):.1f}\" y=\"{base + 16}\" font-size=\"10\" text-anchor=\"middle\">"
                         f"{xv:,.0f}</text><text x=\"{edge - 4}\" y=\"{self.y(yv) + 3:.1f}\" font-size=\"10\" "
                         f"text-anchor=\"end\">{yv:.6f}</text>")
        parts.append(f"<text x=\"{(edge + self.width - self.right) / 2:.0f}\" y=\"{self.height - 8}\" "
                     f"font-size=\"11\" text-anchor=\"middle\">{_e(x_title)}</text><text x=\"12\" "
                     f"y=\"{(self.top + base) / 2:.0f}\" font-size=\"11\" text-anchor=\"middle\" "
                     f"transform=\"rotate(-90 12 {(self.top + base) / 2:.0f})\">{_e(y_title)}</text></g>")
        return "".join(parts)


def _output_verdict(output: dict, check: dict) -> str:
    """An output's cell as ``check`` prints it: within its rule, and NaN/Inf named (failing
    unless ``allow_nan`` lets the reference's own pass, :func:`~onnxmlu.tools.verify.nan_fails`)."""
    if output.get("nonfinite"):
        return "no (NaN/Inf)" if nan_fails(output["nonfinite"], check.get("allow_nan", False)) else "yes (NaN/Inf)"
    return "yes" if output["ok"] else "no"


def _check(check: dict) -> str:
    """The verdict, the rule and what the models ran on (the seeds, or the samples when no
    seed was drawn), the inputs' shapes of every run, and the per-output differences, each
    beside the rule that judged it."""
    verdict = "<p class=\"ok\">check passed</p>" if check["ok"] else "<p class=\"bad\">check FAILED</p>"
    rows = [[o["name"], "×".join(map(str, o["shape"])), f"{o['max_abs']:.3g}", f"{o['max_rel']:.3g}",
             o.get("rule", ""), _output_verdict(o, check)] for o in check.get("outputs", [])]
    quantized = any(o.get("step") is not None for o in check.get("outputs", []))
    steps = f", qtol {plural(check['qtol'], 'step', spec='g')}" if quantized else ""
    tolerances = f"atol {check['atol']:g}, rtol {check['rtol']:g}{steps}"
    judged = f"judged by {check['budget']}" if check.get("budget") else tolerances
    seeds = check.get("seeds") or []
    said = check.get("data") or (seeded_inputs(seeds) if seeds else "")  # a seeded check's names its seeds
    data = ("" if seeds else " · no random seed") + (f" · inputs: {said}" if said else "")
    shapes = [[run["label"], shapes_text(run["inputs"]) or "scalars only", run["status"], run.get("note", "")]
              for run in check.get("shapes", [])]
    twins = "".join(f"<p class=\"check-twin\">{_e(' '.join(twin_lines(o)))}</p>" for o in check.get("outputs", [])
                    if o.get("float_twin_orig") is not None)  # the float twin's figures, as check prints them
    return (f"<p id=\"check-rule\">{_e(judged)}{_e(data)}</p>"
            + (_table(["run", "input shapes", "status", "note"], shapes, set(), "check-shapes") if shapes else "")
            + _table(["output", "shape", "max abs err", "max rel err", "rule",
                      "within tol" if check.get("budget") else "ok"], rows, {2, 3}, "check")  # check's own headers
            + twins + verdict)
