"""Every step that can take seconds counts its work on the progress line (issue 33, item 3):
``check`` its model runs, the ``optimal``/``oracle`` searches the blocks they price, INT8
calibration its samples and blocks, ``--precision auto`` its block pricing and its frontier.

Each test records the lines the CLI's display would draw (:class:`Recorder`, the CLI's own
:class:`~onnxmlu.cli.Steps` with its drawing replaced) under a fake clock that moves
:data:`STEP` seconds each time it is read: a count's ETA is then exact, the mean pace so far
times the units left (:class:`onnxmlu.progress.Tally`).
"""

from __future__ import annotations

import itertools

import onnx

from onnxmlu import api
from onnxmlu.cli import Steps
from onnxmlu.plan.perf.hardware import load_hardware
from onnxmlu.plan.strategies import run_strategy
from onnxmlu.progress import Tally, reporter
from onnxmlu.tools.testing import conv_chain_model

#: Seconds the fake clock moves each time it is read.
STEP = 30.0


class FakeClock:
    """``STEP`` seconds later at every reading."""

    def __init__(self) -> None:
        self.readings = itertools.count()

    def __call__(self) -> float:
        return STEP * next(self.readings)


class Recorder(Steps):
    """The CLI's display, recording each line it would draw, on a fake clock."""

    def __init__(self) -> None:
        super().__init__(tally=True, clock=FakeClock())
        self.lines: list[str] = []

    def _show(self) -> None:
        self.lines.append(self._text + self.count_text())

    def counts(self, prefix: str) -> list[tuple[int, int]]:
        """``(done, total)`` of every line of the step that starts with ``prefix``, in order."""
        found = []
        for line in self.lines:
            parts = line.split(" · ")
            if line.startswith(prefix) and len(parts) > 1 and "/" in parts[1]:
                done, total = parts[1].split("/")
                found.append((int(done), int(total)))
        return found


def test_the_tally_eta_is_the_mean_pace_times_what_is_left():
    tally = Tally(FakeClock())
    tally.start(4)  # read at 0 s
    assert tally.text() == " · 0/4"
    tally.add()
    assert tally.text() == " · 1/4 · ETA 1:30"  # read at 30 s: 30 s a unit, 3 left
    tally.add(3)
    assert tally.text() == " · 4/4 · ETA 0:00"
    tally.start(0)
    tally.add(5)
    assert tally.text() == " · 5 so far"


def _counted_to_the_end(counts: list[tuple[int, int]]) -> int:
    """The total of a count that rose to it without going back; fails otherwise."""
    assert counts, "the step showed no count"
    totals = {total for _, total in counts}
    assert len(totals) == 1, counts
    done = [d for d, _ in counts]
    assert done == sorted(done) and done[-1] == counts[-1][1], counts
    return counts[-1][1]


def test_check_counts_both_models_runs_at_every_shape(tmp_path):
    original = conv_chain_model(batch="N")  # a free batch: check runs at more than one shape
    src, fused = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(original, src)
    api.fuse_to_file(src, fused)
    shown = Recorder()
    report = api.check(src, fused, seeds=(0, 1), progress=shown)
    total = _counted_to_the_end(shown.counts("check: running the reference and the fused model"))
    assert total == 2 * 2 * len(report.shapes) and len(report.shapes) > 1, (total, report.shapes)
    first = next(line for line in shown.lines if line.startswith("check: running") and f" · 1/{total}" in line)
    # the first run read the clock once past the start: 30 s a run, the other runs still to go
    left = STEP * (total - 1)
    assert first.endswith(f"1/{total} · ETA {int(left // 60)}:{int(left % 60):02d}"), shown.lines


def test_a_shape_the_original_refuses_still_counts_its_runs(tmp_path):
    """Runs that never happen (the original refuses the shape) are counted done, so the count
    reaches its total instead of stopping short."""
    from test_conventions import refused_batch_model

    src, fused = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(refused_batch_model(), src)
    api.fuse_to_file(src, fused)
    shown = Recorder()
    report = api.check(src, fused, progress=shown)
    assert any(run.status == "skipped" for run in report.shapes), report.shapes
    _counted_to_the_end(shown.counts("check: running"))


def _counts_of(layers, strategy: str, **kwargs) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []
    run_strategy(layers, load_hardware("mlu100"), strategy, progress=lambda done, total: seen.append((done, total)),
                 **kwargs)
    return seen


def test_the_searches_count_the_blocks_they_price():
    layers = api.inspect(conv_chain_model(convs=12), rewrite=False).layers
    for strategy in ("optimal", "oracle"):
        seen = _counts_of(layers, strategy)
        assert _counted_to_the_end(seen) > len(layers), (strategy, seen)
    # any cost function: the search calls it block by block, counting as it goes
    seen = _counts_of(layers, "optimal", cost=lambda block, mp: len(block) / mp + 1.0)
    assert len(seen) > 2 and _counted_to_the_end(seen) > len(layers), seen


def test_plan_shows_the_optimal_search_count_with_an_eta():
    shown = Recorder()
    api.plan(conv_chain_model(convs=12), strategy="optimal", progress=shown)
    total = _counted_to_the_end(shown.counts("planning: optimal"))
    last = [line for line in shown.lines if line.startswith("planning: optimal")][-1]
    assert last.endswith(f"{total}/{total} · ETA 0:00"), last


def test_a_strategy_without_the_keyword_is_not_handed_one():
    """User strategies keep the three-argument signature: counting is for those that ask."""
    from onnxmlu.plan.plan import plan_from_ranges

    layers = api.inspect(conv_chain_model(), rewrite=False).layers
    plan = run_strategy(layers, load_hardware("mlu100"),
                        lambda ls, hw, cost: plan_from_ranges([(i, i + 1, 1) for i in range(len(ls))]),
                        progress=reporter(Recorder()))
    assert len(plan.blocks) == len(layers)


def test_int8_calibration_counts_its_samples_and_blocks(chain_model):
    shown = Recorder()
    api.fuse(chain_model, precision="int8", progress=shown)
    samples = _counted_to_the_end(shown.counts("INT8 calibration: the model run on"))
    assert samples == 8, shown.lines  # the seeded random fallback's count
    blocks = _counted_to_the_end(shown.counts("INT8 calibration: quantizing"))
    assert blocks >= 1, shown.lines


def test_auto_counts_its_pricing_and_its_frontier(chain_model):
    shown = Recorder()
    api.fuse(chain_model, precision="auto", progress=shown)
    for step in ("auto: pricing blocks at fp32", "auto: pricing blocks at int8", "auto: the latency/accuracy frontier",
                 "auto: calibrating the frontier's plans"):
        _counted_to_the_end(shown.counts(step))
    # auto runs no strategy: its line does not name the default one (``planning: dlfusion at auto``)
    assert "planning: --precision auto (blocks, MPs and precisions)" in shown.lines
    assert not any("dlfusion" in line for line in shown.lines), shown.lines


def test_the_cli_draws_the_count_on_a_terminal_and_nothing_under_quiet(tmp_path, monkeypatch):
    """The count reaches the terminal (stderr, the CLI's rich display) and -q silences it."""
    from rich.console import Console
    from typer.testing import CliRunner

    import onnxmlu.cli as cli

    src, fused = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(conv_chain_model(batch="N"), src)
    api.fuse_to_file(src, fused)
    monkeypatch.setattr(cli, "err_console", Console(stderr=True, force_terminal=True, force_interactive=True, width=160))
    shown = CliRunner().invoke(cli.app, ["check", str(src), str(fused)])
    assert shown.exit_code == 0, shown.output
    assert "check: running the reference and the fused model on 2 inputs at 2 shapes · 4/4" in shown.stderr
    quiet = CliRunner().invoke(cli.app, ["check", str(src), str(fused), "-q"])
    assert quiet.exit_code == 0 and "check: running" not in quiet.stderr, quiet.stderr
