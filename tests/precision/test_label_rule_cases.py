"""The label rule on its shared cases: tests/data/label_rule_cases.json lists bodies and the labels
each bears out; onnxmlu.schema.label_mismatch must answer every case as the file says, and the C++
rule (custom_ops/label_rule.cc) is held to the same file by tests/cpp/test_label_rule.cc."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import helper

from onnxmlu.precisions import PRECISIONS, RECORDS
from onnxmlu.schema import label_mismatch

CASES_FILE = Path(__file__).resolve().parents[1] / "data" / "label_rule_cases.json"
CASES = json.loads(CASES_FILE.read_text())
TYPES = {"float": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16,
         "double": onnx.TensorProto.DOUBLE, "int8": onnx.TensorProto.INT8, "uint8": onnx.TensorProto.UINT8,
         "int64": onnx.TensorProto.INT64}


def _graph(spec: dict, name: str) -> onnx.GraphProto:
    """A graph from a case's description (see the file's "about")."""
    nodes = []
    for k, node in enumerate(spec.get("nodes", [])):
        attributes = {"to": TYPES[node["to"]]} if "to" in node else {}
        if "then_branch" in node:
            attributes["then_branch"] = _graph(node["then_branch"], f"{name}_then")
        nodes.append(helper.make_node(node["op"], node["inputs"], [f"o{k}"], **attributes))
    initializers = [helper.make_tensor(t["name"], TYPES[t["type"]], [1], [0]) for t in spec.get("initializers", [])]
    values = {role: [helper.make_tensor_value_info(v["name"], TYPES[v["type"]], [1])
                     for v in spec.get("values", []) if v["role"] == role] for role in ("input", "output", "value_info")}
    return helper.make_graph(nodes, name, values["input"], values["output"], initializers,
                             value_info=values["value_info"])


def test_the_case_file_lists_the_precision_records():
    """The file's labels are the records' (the C++ library's table is held to the same list), and
    it has a message for each label whose body must hold something: the record's words."""
    assert CASES["labels"] == list(PRECISIONS)
    assert CASES["messages"] == {p.name: f"labelled {p.name} but its body holds no {p.body_holds}"
                                 for p in RECORDS.values() if p.body_holds}


def test_the_case_file_covers_each_label_both_ways():
    bears_out = [set(case["bears_out"]) for case in CASES["cases"]]
    for label in CASES["messages"]:
        assert any(label in labels for labels in bears_out) and any(label not in labels for labels in bears_out)


@pytest.mark.parametrize("case", CASES["cases"], ids=[case["name"] for case in CASES["cases"]])
def test_label_mismatch_answers_each_shared_case(case):
    body = helper.make_model(_graph(case["body"], "body"))
    assert label_mismatch("fp32", body) is None
    for label in CASES["messages"]:
        expected = None if label in case["bears_out"] else CASES["messages"][label]
        assert label_mismatch(label, body) == expected, (case["name"], label)
