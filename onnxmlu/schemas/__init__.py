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
from pathlib import Path
from typing import Any

from onnxmlu.precisions import DEFAULT_PRECISION, PRECISIONS, RECORDS

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


def with_precisions(schema: Any) -> Any:
    """``schema`` with every part that lists the precisions derived from
    :data:`onnxmlu.precisions.RECORDS`: an ``enum`` holding the default precision lists them all
    (a ``null`` kept); an object whose keys are precision names is keyed by all of them, or by
    all but the default when it lacks that (the lowered ones), a new key's entry copied from
    its neighbour's with the name changed; a hardware profile's peak fields are one per record
    (its ``peak``). The files hold the result (tests/test_schemas.py compares; :func:`regenerate`
    writes it)."""
    if isinstance(schema, list):
        return [with_precisions(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: with_precisions(v) for k, v in schema.items()}
    enum = out.get("enum")
    if isinstance(enum, list) and DEFAULT_PRECISION in enum:
        out["enum"] = [*PRECISIONS, *(v for v in enum if not isinstance(v, str))]
    props = out.get("properties")
    if isinstance(props, dict) and props:
        keyed = _precision_keys(props)
        if keyed is not None:
            out["properties"] = {p: props.get(p) or _renamed(props[keyed[0]], keyed[0], p) for p in keyed[1]}
            if "required" in out:
                out["required"] = list(keyed[1])
        elif any(k.startswith("peak_") and k.endswith("_per_core") for k in props):
            out["properties"], out["required"] = _with_peaks(props), _with_peaks(out.get("required", []))
    return out


def _precision_keys(props: dict) -> tuple[str, tuple[str, ...]] | None:
    """(an existing key, the keys it should have) for an object keyed by precisions; else None."""
    if len(props) < 2 or not set(props) <= set(PRECISIONS):
        return None
    return next(iter(props)), (PRECISIONS if DEFAULT_PRECISION in props else PRECISIONS[1:])


def _renamed(entry: Any, old: str, new: str) -> Any:
    """``entry`` with the precision name ``old`` in its descriptions changed to ``new``."""
    text = json.dumps(entry).replace(old.upper(), new.upper()).replace(old, new)
    return json.loads(text)


def _with_peaks(keys: Any) -> Any:
    """The properties (dict) or required list with the peak fields, at the first one's place,
    one per precision record."""
    is_peak = [k.startswith("peak_") and k.endswith("_per_core") for k in keys]
    if not any(is_peak):
        return keys
    at = is_peak.index(True)
    names = [k for k, peak in zip(keys, is_peak) if not peak]
    peaks = [p.peak for p in RECORDS.values()]
    order = names[:at] + peaks + names[at:]
    if isinstance(keys, list):
        return order
    entry = {p.peak: {"type": "number", "exclusiveMinimum": 0, "description": f"peak {p.name.upper()} compute per core"}
             for p in RECORDS.values()}
    return {k: keys[k] if k in names else entry[k] for k in order}


def regenerate(names: tuple[str, ...] = NAMES) -> list[str]:
    """Rewrite the schema files whose precision parts are not :func:`with_precisions`'s; the
    names rewritten (run after adding a precision record)."""
    changed = []
    for name in names:
        schema = load(name)
        derived = with_precisions(schema)
        if derived != schema:
            path = Path(str(resources.files(__name__) / f"{name}.json"))
            path.write_text(json.dumps(derived, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            changed.append(name)
    return changed
