"""Options are passed, not re-spelled: the API takes the option objects, its keywords are the
records' fields (onnxmlu/options.py, ``Keywords``), and the CLI makes each object from one flag
group (onnxmlu/cli.py, ``flag_groups``)."""

from __future__ import annotations

import inspect
from dataclasses import fields

import pytest
import typer

from onnxmlu import api, cli
from onnxmlu.errors import OnnxMluError
from onnxmlu.options import (CheckOptions, CompareOptions, Options, OutputOptions, PlanFiles, PlanOptions,
                             PrecisionOptions, RewriteOptions, ShapeOptions)

RECORDS = (ShapeOptions, RewriteOptions, PlanOptions, PrecisionOptions, CheckOptions, OutputOptions, PlanFiles,
           CompareOptions)


def test_the_api_verbs_take_the_option_objects_not_one_parameter_per_option():
    verbs = (api.fuse, api.fuse_to_file, api.plan, api.report, api.compare)
    counts = {fn.__name__: len(inspect.signature(fn).parameters) for fn in verbs}
    assert counts == {"fuse": 4, "fuse_to_file": 6, "plan": 5, "report": 6, "compare": 4}, counts
    assert len(inspect.signature(cli.fuse.__wrapped__.__wrapped__).parameters) <= 9


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_every_field_of_a_record_is_one_keyword(record):
    assert len(record.keywords()) == len(fields(record))
    assert {f.name for f in record.keywords().values()} == {f.name for f in fields(record)}


def test_the_keywords_of_options_make_the_same_objects_as_the_records():
    made = Options.of(strategy="optimal", plan=None, mp=2, hardware="mlu100", precision="fp16", keep_fp32=["a.*"],
                      rewrite=False, bn_mode="fold", input_shapes={"x": [1]}, max_memory="1G", calibrator="entropy")
    assert made.plan == PlanOptions("optimal", None, 2, "mlu100")
    assert made.rewrite == RewriteOptions(False, "fold", None)
    assert made.shapes == ShapeOptions({"x": [1]}, None, 2**30)
    assert (made.precision.name, made.precision.keep_fp32, made.precision.int8.method) == ("fp16", ("a.*",), "entropy")
    assert Options.of(max_memory=1) == Options(ShapeOptions(max_memory=1))


def test_an_unknown_keyword_or_an_object_with_its_keywords_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'stratgy'"):
        api.fuse_to_file("never-read.onnx", tmp_path / "f.onnx", stratgy="none")
    with pytest.raises(TypeError, match="Options or its keywords \\(strategy\\), not both"):
        api.fuse("never-read.onnx", Options(), strategy="none")
    with pytest.raises(TypeError, match="OutputOptions or its keywords \\(portable\\)"):
        api.fuse_to_file("never-read.onnx", tmp_path / "f.onnx", None, OutputOptions(), portable=True)


def test_the_keyword_and_the_object_fuse_to_the_same_file(tmp_path, chain_model):
    by_keywords = api.fuse_to_file(chain_model, tmp_path / "k.onnx", strategy="all-fusion", precision="fp16",
                                   portable=True)
    by_objects = api.fuse_to_file(chain_model, tmp_path / "o.onnx",
                                  Options(plan=PlanOptions("all-fusion"), precision=PrecisionOptions("fp16")),
                                  OutputOptions(portable=True))
    assert by_keywords.plan == by_objects.plan
    assert (tmp_path / "k.onnx").read_bytes() == (tmp_path / "o.onnx").read_bytes()


def test_a_flag_group_is_its_functions_flags_in_the_command_and_one_object_in_the_call():
    seen = {}

    def group(alpha: int = 1, beta: int = 2):
        return alpha * 10 + beta

    def other(beta: int = 2, gamma: int = 3):  # --beta is declared twice: one flag, given to both
        return beta * 100 + gamma

    @cli.flag_groups(first=group, second=(other, "gamma"))
    def command(model: str, first, second, quiet: bool = False):
        seen.update(model=model, first=first, second=second, quiet=quiet)

    assert list(inspect.signature(command).parameters) == ["model", "alpha", "beta", "quiet"]
    command(model="m", alpha=4, beta=5, quiet=True)
    assert seen == {"model": "m", "first": 45, "second": 503, "quiet": True}


def test_typer_reads_the_flags_of_the_groups():
    app = typer.Typer()
    got = {}

    @app.command()
    @cli.flag_groups(plan=cli.plan_flags)
    def command(plan):
        got["plan"] = plan

    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["-s", "optimal", "--mp", "3", "--hw", "mlu100"])
    assert result.exit_code == 0, result.output
    assert got["plan"] == PlanOptions("optimal", None, 3, "mlu100")


def test_report_and_compare_make_their_objects_from_the_flags_and_the_keywords(monkeypatch, tmp_path):
    """``report`` and ``compare`` as ``fuse`` does: the CLI hands the objects its flag groups
    make, and the API's old keywords (``check=True`` among them) make the same objects."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    calls = {}
    monkeypatch.setattr(api, "report", lambda model, output, options, written, progress: calls.update(
        report=(options, written)) or output)
    empty = SimpleNamespace(networks={}, to_dict=dict)
    monkeypatch.setattr(api, "compare", lambda model, options, progress: calls.update(compare=options) or empty)
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    argv = ["report", str(model), "-o", str(tmp_path / "r.html"), "-s", "none", "--precision", "fp16", "--check"]
    assert CliRunner().invoke(cli.app, argv).exit_code == 0
    options, written = calls["report"]
    assert (options.plan.strategy, options.precision.name, written.check) == ("none", "fp16", CheckOptions())
    argv = ["compare", "--zoo", "--strategies", "none,dlfusion", "--precision", "fp16,auto", "--accuracy", "top1>=0.9",
            "-q"]
    assert CliRunner().invoke(cli.app, argv).exit_code == 0
    assert calls["compare"] == CompareOptions(zoo=True, strategies=("none", "dlfusion"), precisions=("fp16", "auto"),
                                              accuracy="top1>=0.9", input_shapes={})
    assert OutputOptions.of(check=True) == OutputOptions(check=CheckOptions())
    assert CompareOptions.of(strategies=["none"], precisions=["int8"]).strategies == ("none",)
    with pytest.raises(OnnxMluError, match="add auto to --precision"):
        CompareOptions.of(precisions=["fp16"], accuracy="cosine>=0.99")
