"""The ``--json`` reports against their JSON Schemas (onnxmlu/schemas/*.json, in the package).

Every report command runs here and its output is validated with ``jsonschema``. The schemas
are closed (``additionalProperties: false``, ``required`` lists), so an undocumented key, a key
of the wrong type and a missing key all fail; every property a schema lists must also show up
in some output (no dead documentation), and docs/json.md, the page for people, names every key
path and points to the files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import onnx
import pytest
from typer.testing import CliRunner

from onnxmlu import schemas
from onnxmlu.cli import app

DOC = Path(__file__).resolve().parents[1] / "docs" / "json.md"


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def json_of(*args) -> dict:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # --json - owns stdout: nothing else may be there


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = schemas.load(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors(name: str, value) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<top>'}: {e.message}"
            for e in validator(name).iter_errors(value)]


def property_paths(schema: dict, prefix: str = "", root: dict | None = None) -> set[str]:
    """Every key path a schema defines, in docs/json.md's notation (``a.b``, ``a[].b``, ``a.*``)."""
    root = root or schema
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    paths: set[str] = set()
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        paths |= {path} | property_paths(sub, path, root)
    if isinstance(schema.get("additionalProperties"), dict):
        paths |= {f"{prefix}.*"} | property_paths(schema["additionalProperties"], f"{prefix}.*", root)
    if isinstance(schema.get("items"), dict):
        paths |= property_paths(schema["items"], f"{prefix}[]", root)
    return paths


def value_paths(value, schema: dict, prefix: str = "", root: dict | None = None) -> set[str]:
    """The key paths a JSON value actually has, in the same notation (maps become ``.*``)."""
    root = root or schema
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, sub in value.items():
            if key in schema.get("properties", {}):
                path, sub_schema = (f"{prefix}.{key}" if prefix else key), schema["properties"][key]
            else:
                path, sub_schema = f"{prefix}.*", schema.get("additionalProperties") or {}
            paths |= {path} | value_paths(sub, sub_schema, path, root)
    elif isinstance(value, list):
        for item in value:
            paths |= value_paths(item, schema.get("items") or {}, f"{prefix}[]", root)
    return paths


@pytest.fixture
def chain_file(tmp_path, chain_model):
    path = tmp_path / "chain.onnx"
    onnx.save(chain_model, path)
    return path


@pytest.fixture
def training_bn_file(tmp_path):
    """A training-mode BatchNormalization: the bn rewriter must skip it (a 'skipped' row)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from onnxmlu.tools.testing import make_model

    stats = [numpy_helper.from_array(np.ones(4, np.float32), n) for n in ("s", "b", "m", "v")]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn", training_mode=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])], stats)
    path = tmp_path / "train_bn.onnx"
    onnx.save(make_model(graph, opset=15), path)
    return path


@pytest.fixture
def host_node_file(tmp_path):
    """relu -> Mod (not in the accelerator's op table) -> relu: two blocks around a host node;
    a com.microsoft FusedConv (a heavy node outside the standard domain, no rewriter for it) stays
    on the host too."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from onnxmlu.tools.testing import make_model

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu0"),
             helper.make_node("Mod", ["a", "three"], ["b"], name="mod", fmod=1),
             helper.make_node("Relu", ["b"], ["y"], name="relu1"),
             helper.make_node("FusedConv", ["img", "kernel"], ["z"], name="fused_conv", domain="com.microsoft",
                              activation="Relu")]
    three = numpy_helper.from_array(np.full(4, 3.0, np.float32), "three")
    kernel = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "kernel")
    img = helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 1, 3, 3])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 1, 3, 3])
    graph = helper.make_graph(nodes, "host", [x, img], [y, z], [three, kernel])
    path = tmp_path / "host.onnx"
    path.write_bytes(make_model(graph, extra_opsets={"com.microsoft": 1}).SerializeToString())
    return path


@pytest.fixture
def branch_file(tmp_path):
    """An If whose branches each hold a MatMul and a Relu: blocks inside control flow (``branches``)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from onnxmlu.tools.testing import make_model

    def branch(name: str) -> onnx.GraphProto:
        nodes = [helper.make_node("MatMul", ["x", "w"], [f"{name}_mm"], name=f"{name}_mm"),
                 helper.make_node("Relu", [f"{name}_mm"], [f"{name}_y"], name=f"{name}_relu")]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)])

    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    node = helper.make_node("If", ["flag"], ["y"], name="cond", then_branch=branch("a"), else_branch=branch("b"))
    graph = helper.make_graph([node], "cond", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                               helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    path = tmp_path / "cond.onnx"
    onnx.save(make_model(graph, opset=13), path)
    return path


@pytest.fixture
def dynamic_chain_file(tmp_path, chain_model):
    """The chain with a symbolic batch: ranges, profiles and checks at several shapes."""
    chain_model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    path = tmp_path / "dynamic_chain.onnx"
    onnx.save(chain_model, path)
    return path


def test_every_json_report_matches_its_schema(library, chain_file, training_bn_file, host_node_file,
                                              dynamic_chain_file, branch_file, tmp_path):
    fused = tmp_path / "fused.onnx"
    ranged = ("--input-shape", "x:1/2/8,8,16,16")
    reports = {
        "fuse": [json_of("fuse", chain_file, fused, "-s", "all-fusion", "--check", "--json", "-"),
                 json_of("fuse", dynamic_chain_file, tmp_path / "f6.onnx", *ranged, "--check", "--json", "-"),
                 json_of("fuse", chain_file, tmp_path / "f2.onnx", "--json", "-"),
                 json_of("fuse", host_node_file, tmp_path / "f3.onnx", "-s", "all-fusion", "--json", "-"),
                 json_of("fuse", branch_file, tmp_path / "f7.onnx", "--json", "-"),
                 json_of("fuse", chain_file, tmp_path / "f4.onnx", "--precision", "int8", "--json", "-"),
                 json_of("fuse", chain_file, tmp_path / "f5.onnx", "--precision", "auto", "--json", "-")],
        "check": [json_of("check", chain_file, fused, "--seed", "0", "--seed", "1", "--json", "-")],
        "inspect": [json_of("inspect", chain_file, "--json", "-"), json_of("inspect", dynamic_chain_file, *ranged, "--json", "-")],
        "inspect-fused": [json_of("inspect", fused, "--json", "-"), json_of("inspect", tmp_path / "f3.onnx", "--json", "-"),
                          json_of("inspect", tmp_path / "f6.onnx", "--json", "-")],
        "rewrite": [json_of("rewrite", training_bn_file, tmp_path / "rw.onnx", "--json", "-")],
        "plan": [json_of("plan", chain_file, "-s", "optimal", "--json", "-"),
                 json_of("plan", dynamic_chain_file, *ranged, "--json", "-"),
                 json_of("plan", chain_file, "--precision", "fp16", "--json", "-"),
                 json_of("plan", chain_file, "--precision", "auto", "--accuracy", "cosine>=0.99", "--json", "-")],
        "compare": [json_of("compare", chain_file, "--strategies", "dlfusion,oracle", "--json", "-"),
                    json_of("compare", chain_file, "--strategies", "dlfusion", "--precision", "fp16,int8",
                            "--json", "-")],
        "run": [json_of("run", fused, "--repeat", "2", "--profile", "--json", "-"),
                json_of("run", fused, "--repeat", "1", "--json", "-")],
        "zoo": [json_of("zoo", "lstm", tmp_path / "lstm.onnx", "--batch", "N", "--json", "-")],
        "hardware": [json_of("hw", "show", "mlu100"), json_of("hw", "show", "edge4")],
    }
    assert set(reports) == set(schemas.NAMES)  # every published schema is exercised here
    problems = [f"{name}: {e}" for name, outputs in reports.items() for r in outputs for e in errors(name, r)]
    assert not problems, "\n".join(problems)
    for name, outputs in reports.items():
        if name == "hardware":  # an input format too: optional parameters the built-ins leave out
            continue
        assert all(schemas.for_report(r) == schemas.load(name) for r in outputs)
        seen = set().union(*(value_paths(r, schemas.load(name)) for r in outputs))
        assert property_paths(schemas.load(name)) <= seen, f"{name}: defined but never produced: " \
            f"{sorted(property_paths(schemas.load(name)) - seen)}"


def test_schemas_catch_drift():
    """An undocumented key, a wrong type and a missing key each fail validation."""
    good = {"schema": "onnxmlu.zoo/1",
            "models": [{"name": "lstm", "path": "l.onnx", "batch": 1, "seed": 0, "bytes": 10}]}
    assert errors("zoo", good) == []
    assert errors("zoo", {**good, "models": [{**good["models"][0], "batch": "N"}]}) == []
    extra = {**good, "elapsed": 1.0}
    assert errors("zoo", extra) == ["<top>: Additional properties are not allowed ('elapsed' was unexpected)"]
    wrong = {**good, "models": [{**good["models"][0], "bytes": "10"}]}
    assert errors("zoo", wrong) == ["models/0/bytes: '10' is not of type 'integer'"]
    missing = {**good, "models": [{k: v for k, v in good["models"][0].items() if k != "seed"}]}
    assert errors("zoo", missing) == ["models/0: 'seed' is a required property"]
    assert errors("zoo", {**good, "schema": "onnxmlu.zoo/2"})  # another version is another schema


def test_fuse_embeds_the_check_schema_unchanged():
    fuse, check = schemas.load("fuse"), schemas.load("check")
    assert fuse["$defs"]["check"] == {k: v for k, v in check.items() if k not in ("$schema", "title")}
    assert fuse["properties"]["check"]["$ref"] == "#/$defs/check"


def test_fuse_and_plan_describe_auto_alike():
    assert schemas.load("fuse")["$defs"]["auto"] == schemas.load("plan")["$defs"]["auto"]


def test_schemas_ship_in_the_package_and_docs_point_to_them():
    from importlib import resources

    files = {p.name for p in resources.files("onnxmlu.schemas").iterdir() if p.name.endswith(".json")}
    assert files == {f"{n}.json" for n in schemas.NAMES}
    text = DOC.read_text()
    for name in schemas.NAMES:
        assert f"onnxmlu/schemas/{name}.json" in text, name
        for path in property_paths(schemas.load(name)):  # the page for people names every key
            assert any(f"`{p}`" in text for p in _as_other_precisions(path)), \
                f"docs/json.md does not mention {name} key `{path}`"
    with pytest.raises(ValueError, match="known version"):
        schemas.for_report({"schema": "onnxmlu.fuse/2"})


def _as_other_precisions(path: str) -> set[str]:
    """``path`` and, when one of its keys is a precision name (or a profile's peak field), the
    same path at each other precision: docs/json.md describes a key per precision once, at the
    precisions it names."""
    from onnxmlu.precisions import PRECISIONS, RECORDS

    peaks = [p.peak for p in RECORDS.values()]
    parts = path.split(".")
    return {path} | {".".join(q if k == i else part for k, part in enumerate(parts))
                     for i, part in enumerate(parts) for family in (PRECISIONS, peaks) if part in family
                     for q in family}


def test_every_schema_lists_the_precisions_of_the_records():
    """The enums of precision names, the objects keyed by them and the hardware profile's peak
    fields are what onnxmlu.schemas.with_precisions derives from onnxmlu.precisions.RECORDS."""
    for name in schemas.NAMES:
        assert schemas.with_precisions(schemas.load(name)) == schemas.load(name), name


def test_a_new_precision_record_reaches_every_schema(monkeypatch):
    from dataclasses import replace

    from onnxmlu.precisions import FP16, RECORDS

    new = replace(FP16, name="xp9", peak="peak_tflops_xp9_per_core")  # a name no record has
    records = {**RECORDS, new.name: new}
    names = list(records)
    monkeypatch.setattr(schemas, "RECORDS", records)
    monkeypatch.setattr(schemas, "PRECISIONS", tuple(records))
    fuse, hw = schemas.with_precisions(schemas.load("fuse")), schemas.with_precisions(schemas.load("hardware"))
    text = json.dumps(fuse)
    assert f'"enum": {json.dumps(names)}' in text and "deficits with the unit at XP9" in text
    assert "blocks at xp9" in text and f'"required": {json.dumps(names[1:])}' in text
    assert hw["properties"]["peak_tflops_xp9_per_core"]["description"] == "peak XP9 compute per core"
    assert hw["required"][2:2 + len(names)] == [p.peak for p in records.values()]
    assert json.dumps([*names, None]) in json.dumps(schemas.with_precisions(schemas.load("run")))


def test_hardware_schema_s_model_is_derived_from_the_parameter_record():
    from onnxmlu.plan.perf.hardware import model_schema

    assert schemas.load("hardware")["properties"]["model"] == model_schema()


def test_hardware_schema_and_loader_agree(tmp_path):
    """The loader's checks (onnxmlu.plan.perf.hardware) and hardware.json accept and refuse the
    same profiles."""
    from onnxmlu.errors import OnnxMluError
    from onnxmlu.plan.perf.hardware import load_hardware, profile_names

    base = json.loads(invoke("hw", "show", "mlu100").stdout)
    cases = [{}, {"cores": "32"}, {"cores": 0}, {"cores": 2000}, {"cores": 8.0}, {"dram_gbps": -5},
             {"frequency_ghz": 0}, {"name": ""}, {"bogus": 1}, {"model": {"launch_us": -1}},
             {"model": {"overlap_theta": 1.5}}, {"model": {"nope": 1.0}}, {"model": {"grouped_conv_as_dense": 2}},
             {"model": {"search_max_block_layers": 64}}, {"description": 3}]
    for i, patch in enumerate(cases):
        path = tmp_path / f"p{i}.json"
        path.write_text(json.dumps({**base, **patch}))
        schema_ok = not errors("hardware", {**base, **patch})
        try:
            load_hardware(path)
            loader_ok = True
        except OnnxMluError:
            loader_ok = False
        assert schema_ok == loader_ok, patch
    for name in profile_names():
        assert errors("hardware", json.loads(invoke("hw", "show", name).stdout)) == []
    assert not re.search(r"\bTODO\b", DOC.read_text())
