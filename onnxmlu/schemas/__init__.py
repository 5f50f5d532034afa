"""JSON Schemas (draft 2020-12) of onnxmlu's ``--json`` reports and of hardware profiles.

One file per report command — ``fuse``, ``check``, ``inspect`` (``inspect-fused`` for a fused
model), ``rewrite``, ``plan``,
``compare``, ``run``, ``zoo`` — named by the report's ``"schema"`` tag (``"onnxmlu.fuse/1"``
-> ``fuse.json``), and ``hardware.json`` for hardware profiles (``--hw FILE.json``, what
``onnxmlu hw show`` prints). Each file stands alone (``fuse.json`` carries the ``check``
report it embeds under ``$defs``), so any JSON Schema validator takes it as it is::

    import json, jsonschema, onnxmlu.schemas
    jsonschema.validate(json.load(open("report.json")), onnxmlu.schemas.load("fuse"))

The schemas are closed (``additionalProperties: false``) and list every key a report of this
version carries; docs/json.md is the same content for people.
"""

from __future__ import annotations

import json
from importlib import resources

#: The report commands, in docs/json.md's order, then the hardware profile.
REPORTS = ("fuse", "check", "inspect", "inspect-fused", "rewrite", "plan", "compare", "run", "zoo")
NAMES = REPORTS + ("hardware",)


def load(name: str) -> dict:
    """The schema ``name`` (one of :data:`NAMES`) as a dict."""
    if name not in NAMES:
        raise ValueError(f"no schema {name!r} (known: {', '.join(NAMES)})")
    return json.loads((resources.files(__name__) / f"{name}.json").read_text(encoding="utf-8"))


def for_report(report: dict) -> dict:
    """The schema of a report, picked by its ``"schema"`` tag (``"onnxmlu.<command>/1"``)."""
    tag = report.get("schema", "") if isinstance(report, dict) else ""
    command, _, version = tag.removeprefix("onnxmlu.").partition("/")
    if not tag.startswith("onnxmlu.") or command not in REPORTS or version != "1":
        raise ValueError(f"not an onnxmlu report of a known version: schema {tag!r}")
    return load(command)
