"""``onnxmlu report``: one self-contained HTML page about a plan or a fused model.

Everything is inline -- styles in a ``<style>`` element, charts as inline SVG, no script, no
font, no image file -- so the page opens from disk, offline, and can be mailed as one file.
Sections: a timeline of the blocks on the simulated accelerator (each bar as wide as the
block's simulated latency, coloured by its MP), the per-block table, the host nodes with their
reasons, coverage figures, the blocks inside host control flow (If branches, Loop/Scan
bodies), and, where the report has them, the ``--precision auto`` latency /
accuracy chart of the plans considered and the check's results.

The input is a report dict: the ``fuse`` report (``FuseResult.to_dict()``) for a model fused
now, or the ``inspect-fused`` report for a fused file (whose host nodes carry no reason: the
file does not record one).
"""

from __future__ import annotations

import html
import math
from pathlib import Path

from onnxmlu.collapse.atomic import write_bytes_atomic

_WIDTH = 960
_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; background: #f4f4f4; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.fig { display: flex; gap: 2em; flex-wrap: wrap; } .fig div { background: #f7f7f7; padding: 6px 12px; }
.ok { color: #17702a; font-weight: bold; } .bad { color: #b00020; font-weight: bold; }
"""


def write_report(report: dict, path: str | Path, title: str) -> Path:
    """Write the page for ``report`` (a ``fuse`` or ``inspect-fused`` report dict) to ``path``."""
    path = Path(path)
    write_bytes_atomic(render(report, title).encode("utf-8"), path)
    return path


def render(report: dict, title: str) -> str:
    blocks = [_block(b) for b in report.get("blocks", []) if not b.get("graph")]
    parts = [_header(report, title, blocks), _section("Timeline (simulated accelerator)", _timeline(blocks)),
             _section("Blocks", _block_table(blocks)),
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
    """One block's fields, from either report's block row."""
    layers = row.get("layers")
    return {"name": row["block"] if isinstance(row["block"], str) else f"block_{row['block']}",
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


def _mp_colour(mp) -> str:
    """A hue per MP on a log scale, from blue (1 core) to red (32 and more)."""
    if not isinstance(mp, int) or mp < 1:
        return "#999"
    hue = 220 - 44 * min(math.log2(mp), 5.0)
    return f"hsl({hue:.0f},65%,50%)"


def _timeline(blocks: list[dict]) -> str:
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
                f"fill=\"{_mp_colour(b['mp'])}\" stroke=\"#fff\"/>")
        bars.append(f"<g class=\"block\"><title>{_e(label)}</title>{rect}{text}</g>")
        x += w
    axis = f"<text x=\"0\" y=\"68\" font-size=\"11\">0 µs</text><text x=\"{_WIDTH}\" y=\"68\" font-size=\"11\" " \
           f"text-anchor=\"end\">{total:.1f} µs</text>"
    return (f"<svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{_WIDTH}\" height=\"76\" "
            f"role=\"img\">{''.join(bars)}{axis}</svg>")


def _table(headers: list[str], rows: list[list], numeric: set[int], table_id: str) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    numeric_cell = '<td class="n">'
    body = "".join("<tr>" + "".join(f"{numeric_cell if i in numeric else '<td>'}{_e(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table id=\"{table_id}\"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _block_table(blocks: list[dict]) -> str:
    rows = [[b["name"], b["mp"], b["precision"], b["layers"], "–" if b["sim_us"] is None else f"{b['sim_us']:.1f}",
             "" if b["gops"] is None else f"{b['gops']:.3f}", b["first"], b["last"]] for b in blocks]
    return _table(["block", "mp", "precision", "layers", "sim µs", "GOPs", "first layer", "last layer"], rows,
                  {1, 3, 4, 5}, "blocks")


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
    rows = [[h["node"], h["op_type"], h.get("reason", "(not recorded in a fused file)")] for h in host_nodes]
    return _table(["node", "op", "reason"], rows, set(), "host")


def _coverage(report: dict, blocks: list[dict]) -> str:
    in_blocks = sum(b["layers"] for b in blocks)
    host = len(report.get("host_nodes", []))
    share = f"{100 * in_blocks / (in_blocks + host):.1f}%" if in_blocks + host else "–"
    facts = [("layers in blocks", in_blocks), ("host nodes", host), ("nodes on the accelerator", share)]
    gops = [b["gops"] for b in blocks if b["gops"] is not None]
    if gops:
        facts.append(("GOPs in blocks", f"{sum(gops):.3f}"))
    cells = "".join(f"<div>{_e(k)}: <b>{_e(v)}</b></div>" for k, v in facts)
    return f"<div class=\"fig\" id=\"coverage\">{cells}</div>"


def _pareto(auto: dict) -> str:
    """Simulated latency (x) against measured (else estimated) worst cosine (y) per plan."""
    points = []
    for c in auto.get("candidates", []):
        accuracy = c.get("measured") or c["estimated"]
        points.append((c["latency_us"], accuracy["cosine"], c.get("measured") is not None))
    chosen = (auto["latency_us"], auto["measured"]["cosine"])
    xs, ys = [p[0] for p in points] + [chosen[0]], [p[1] for p in points] + [chosen[1]]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    width, height, pad = 600, 300, 40

    def at(x, y):
        return (pad + (width - 2 * pad) * ((x - x0) / (x1 - x0) if x1 > x0 else 0.5),
                height - pad - (height - 2 * pad) * ((y - y0) / (y1 - y0) if y1 > y0 else 0.5))

    dots = "".join(f"<circle class=\"plan\" cx=\"{at(x, y)[0]:.1f}\" cy=\"{at(x, y)[1]:.1f}\" r=\"4\" "
                   f"fill=\"{'#1f5fbf' if measured else '#aaa'}\"><title>{x:.1f} µs · cosine {y:.6f}"
                   f"{'' if measured else ' (estimated)'}</title></circle>" for x, y, measured in points)
    cx, cy = at(*chosen)
    star = (f"<circle id=\"chosen\" cx=\"{cx:.1f}\" cy=\"{cy:.1f}\" r=\"7\" fill=\"none\" stroke=\"#b00020\" "
            "stroke-width=\"2\"/>")
    axes = (f"<text x=\"{pad}\" y=\"{height - 8}\" font-size=\"11\">{x0:.0f} µs</text><text x=\"{width - pad}\" "
            f"y=\"{height - 8}\" font-size=\"11\" text-anchor=\"end\">{x1:.0f} µs (simulated latency)</text>"
            f"<text x=\"4\" y=\"{pad - 8}\" font-size=\"11\">worst cosine {y1:.6f}</text>"
            f"<text x=\"4\" y=\"{height - pad + 14}\" font-size=\"11\">{y0:.6f}</text>")
    caption = (f"<p>Budget {_e(auto['budget'])}: chosen plan (red ring) {auto['latency_us']:.1f} µs, "
               f"{auto['speedup']:.2f}× the FP32 plan; blue: measured, grey: estimated only.</p>")
    return (f"<svg id=\"pareto\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\">"
            f"{dots}{star}{axes}</svg>{caption}")


def _check(check: dict) -> str:
    verdict = "<p class=\"ok\">check passed</p>" if check["ok"] else "<p class=\"bad\">check FAILED</p>"
    rows = [[o["name"], "×".join(map(str, o["shape"])), f"{o['max_abs']:.3g}", f"{o['max_rel']:.3g}",
             "yes" if o["ok"] else "no"] for o in check.get("outputs", [])]
    judged = (f"judged by {check['budget']}" if check.get("budget")
              else f"atol {check['atol']:g}, rtol {check['rtol']:g}")
    return (f"<p id=\"check-rule\">{_e(judged)} · seeds {_e(check.get('seeds'))}</p>"
            + _table(["output", "shape", "max abs err", "max rel err", "within tol"], rows, {2, 3}, "check") + verdict)
