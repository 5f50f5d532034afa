"""Exploding fused models (each block as an ONNX function) and viewing them in Netron.

``explode`` turns every MLUFusionBlock node into a call of a model-local ONNX function
(domain ``com.onnxmlu.view``) whose definition is the block's body, its weights turned into
``Constant`` nodes (functions hold no initializers). The result is a valid, self-contained ONNX
model: plain onnxruntime runs it without the custom-op library and gives the fused model's
outputs, so ``onnxmlu fuse --portable`` writes it; and Netron opens a block with "Show Function
Definition", so ``onnxmlu view --explode`` serves it (from memory: no file is written).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper

from onnxmlu.errors import OnnxMluError
from onnxmlu.ir import copy_model, iter_graphs
from onnxmlu.optional import optional_import, require
from onnxmlu.schema import DIGEST, DOMAIN, block_index, body_model, is_fusion_block

VIEW_DOMAIN = "com.onnxmlu.view"
#: Model-local functions need IR version 8 (onnx 1.10).
_FUNCTIONS_IR_VERSION = 8
EXPLODED_NOTE = ("blocks are model-local ONNX functions (domain com.onnxmlu.view); runs in plain onnxruntime "
                 "without the onnxmlu custom-op library")


def explode(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a fused model with each block as a call of a model-local function holding its
    body; runnable without the custom-op library. Each body's digest is checked first."""
    view = copy_model(model)
    functions: list[onnx.FunctionProto] = []
    defined: set[tuple[str, str]] = set()
    imports = {o.domain or "": o.version for o in view.opset_import}
    for name, node in _blocks_to_explode(view.graph):
        body = body_model(node)
        functions.append(_function_of(name, body))
        for f in body.functions:  # functions the body's own nodes call
            if (f.domain, f.name) not in defined:
                defined.add((f.domain, f.name))
                functions.append(f)
        for o in body.opset_import:  # e.g. com.microsoft ops inside a block
            imports.setdefault(o.domain or "", o.version)
        _as_function_call(node, name)
    if not functions:
        raise OnnxMluError("model has no MLUFusionBlock nodes to explode")
    view.functions.extend(functions)
    imports.pop(DOMAIN, None)  # no MLUFusionBlock is left
    imports[VIEW_DOMAIN] = 1
    del view.opset_import[:]
    view.opset_import.extend(helper.make_opsetid(d, v) for d, v in imports.items())
    view.ir_version = max(view.ir_version, _FUNCTIONS_IR_VERSION)
    props = {p.key: p.value for p in view.metadata_props}
    props["onnxmlu.exploded"] = EXPLODED_NOTE
    props.pop("onnxmlu.runtime", None)  # that note names the library this copy does without
    helper.set_model_props(view, props)
    return view


def _blocks_to_explode(graph: onnx.GraphProto):
    """(function name, node) of every block: the main graph's as ``block_K``, those inside host
    control flow as ``SUBGRAPH/block_K`` -- K the block's index in its node's name (Netron shows
    the function's name over the node's: one name for the block), or the node's position in its
    graph when the names do not give each block its own index (nodes renamed by hand)."""
    for sub in iter_graphs(graph):
        prefix = "" if sub is graph else f"{sub.name}/"
        blocks = [(i, node) for i, node in enumerate(sub.node) if is_fusion_block(node)]
        named = [block_index(node.name) for _, node in blocks]
        if None in named or len(set(named)) != len(named):
            named = [i for i, _ in blocks]
        yield from ((f"{prefix}block_{k}", node) for k, (_, node) in zip(named, blocks))


def _function_of(name: str, body: onnx.ModelProto) -> onnx.FunctionProto:
    graph = body.graph
    constants = [helper.make_node("Constant", [], [t.name], name=f"{t.name}/const", value=t)
                 for t in graph.initializer]
    return helper.make_function(
        VIEW_DOMAIN, name, [i.name for i in graph.input], [o.name for o in graph.output],
        constants + list(graph.node), list(body.opset_import),
    )


def _as_function_call(node: onnx.NodeProto, function_name: str) -> None:
    keep = [a for a in node.attribute if a.name not in ("body", DIGEST)]
    del node.attribute[:]
    node.attribute.extend(keep)
    node.op_type, node.domain = function_name, VIEW_DOMAIN


def require_netron() -> None:
    """The one-line error for a missing netron, raised before a model is loaded or exploded."""
    require("netron")


def serve(path: str | Path, port: int = 8080, browse: bool = True, data: bytes | None = None) -> None:
    """Serve a model with Netron on 127.0.0.1 until interrupted: the file at ``path``, or
    ``data`` (a serialized model held in memory, shown under ``path``'s name; nothing is
    written)."""
    netron = optional_import("netron")
    # a bytearray is served as the bytes of the file `path` names (netron treats other objects
    # as experimental in-memory models of its own)
    netron.serve(str(path), bytearray(data) if data is not None else None, address=("127.0.0.1", port),
                 browse=browse)
    netron.wait()


@dataclass(frozen=True)
class Snapshot:
    """What Netron showed: the box labels of the model's graph (op types, read before names
    are shown), the selected node's properties (sidebar item name -> its text), and the box
    labels in the picture."""

    labels: list[str]
    sidebar: dict[str, str]
    pictured: list[str]


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def snapshot(path: str | Path, png: str | Path, *, port: int = 18080, size=(1600, 1000),
             timeout_s: float = 60.0, show_names: bool = True, scale: float = 1.0,
             select: str | None = None, open_function: bool = False) -> Snapshot:
    """Serve ``path`` with Netron on 127.0.0.1, screenshot it in headless Chromium, and
    return what a person sees there: the op-type labels of the graph boxes Netron drew and
    the selected node's properties as its sidebar lists them.

    ``scale`` is the device pixel ratio (2 draws every box twice as sharp for the docs);
    ``select`` clicks the node whose label starts with that name, opening its properties;
    ``open_function`` (with ``select``, on an exploded view copy) then follows the node's
    "Show Function Definition" and shows the block's body graph by op type."""
    netron, playwright = optional_import("netron"), optional_import("playwright.sync_api")
    address = netron.serve(str(path), None, address=("127.0.0.1", port), browse=False)
    try:
        with tempfile.TemporaryDirectory() as profile, playwright.sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS, device_scale_factor=scale,
                viewport={"width": size[0], "height": size[1]}, headless=True)
            try:
                page = browser.new_page()
                labels = _open(page, address, timeout_s * 1000)
                sidebar = _arrange(page, show_names, select, open_function)
                page.screenshot(path=str(png), full_page=False)
                return Snapshot(labels, sidebar, _box_labels(page))
            finally:
                browser.close()
    finally:
        netron.stop(address)


def _open(page, address, timeout_ms: float) -> list[str]:
    """Load Netron's page, get past its cookie consent, wait for the graph; the box labels."""
    page.goto(f"http://{address[0]}:{address[1]}/", timeout=timeout_ms)
    accept = page.get_by_text("Accept", exact=True)
    try:  # Netron asks for cookie consent before it draws the graph
        accept.click(timeout=10_000)
    except optional_import("playwright.sync_api").TimeoutError:  # no consent page to accept
        pass
    page.wait_for_selector("#canvas g.node", timeout=timeout_ms)
    return _box_labels(page)  # op types: read before "Show Names" swaps them for node names


def _arrange(page, show_names: bool, select: str | None, open_function: bool) -> dict[str, str]:
    """Put the page in the state to photograph (names shown, a node's sidebar, a function);
    returns the selected node's sidebar items ({} without ``select``)."""
    if show_names or select:  # selecting by name needs the names drawn
        _toggle_names(page)
    if not select:
        return {}
    _node_named(page, select).click()
    page.wait_for_selector("#sidebar-content", state="visible")
    sidebar = _sidebar_items(page)
    if open_function:
        page.get_by_text("\u0192", exact=True).last.click()  # the sidebar's "Show Function Definition"
        page.wait_for_selector("#toolbar-path-back-button", state="visible")  # inside the function
        page.wait_for_selector("#canvas g.node")
        page.keyboard.press("Escape")  # close the sidebar: the body graph gets the width
        if show_names:
            _toggle_names(page)  # inside a block the op types say more than the layer names
    return sidebar


def _sidebar_items(page) -> dict[str, str]:
    """The properties sidebar as name -> text (names are read-only <input>s in Netron)."""
    items = {}
    for item in page.query_selector_all("#sidebar-content .sidebar-item"):
        name = item.query_selector(".sidebar-item-name input")
        value = item.query_selector(".sidebar-item-value-line")  # not the "+" expander button
        if name is not None and value is not None:
            items.setdefault(name.get_attribute("value") or "", (value.text_content() or "").strip())
    return items


def _toggle_names(page) -> None:
    page.keyboard.press("Control+U")
    page.wait_for_timeout(500)


def _node_named(page, name: str):
    for node in page.query_selector_all("#canvas g.node"):
        if (node.text_content() or "").startswith(name):
            return node
    raise OnnxMluError(f"Netron drew no node named {name!r}")


def _box_labels(page) -> list[str]:
    """Op-type labels of the drawn boxes. Netron forbids ``window.eval``, which Playwright's
    own queries use, so read the DOM through the DevTools protocol instead."""
    cdp = page.context.new_cdp_session(page)
    root = cdp.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
    html = cdp.send("DOM.getOuterHTML", {"nodeId": root})["outerHTML"]
    return re.findall(r'class="node-item node-item-type[^"]*".*?<text[^>]*>([^<]*)</text>', html, flags=re.S)
