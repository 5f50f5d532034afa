"""``onnxmlu`` command line: thin wrappers that parse options and call :mod:`onnxmlu.api`.

Exit codes: 0 success, 1 a check or comparison failed, 2 usage or input error. Errors print
one line; ``--debug`` (before the command) shows the traceback instead.

Streams: tables go to stdout, progress (rich, transient) and errors to stderr. ``--json -``
owns stdout: the report is then the only thing printed there, so it can be piped. Every JSON
report carries ``"schema": "onnxmlu.<command>/1"``; its JSON Schema is
``onnxmlu/schemas/<command>.json`` (docs/json.md for people), and tests/test_schemas.py
validates the outputs against it.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Callable, Iterator, List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from onnxmlu.errors import OnnxMluError

app = typer.Typer(
    name="onnxmlu", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Compile ONNX models for a simulated multi-core MLU100-class accelerator.",
)
console = Console()
err_console = Console(stderr=True)
_state = {"debug": False}

# ---- shared options, declared once ------------------------------------------------------
ModelArg = Annotated[Path, typer.Argument(help="ONNX model file.", show_default=False)]
InputShapeOpt = Annotated[List[str], typer.Option(
    "--input-shape", help="Pin an input's shape, NAME:D1,D2,... (repeatable).", show_default=False)]
StrategyOpt = Annotated[str, typer.Option("--strategy", "-s", help=(
    "Fusion/MP strategy: none, fixed-mp, dynamic-mp, all-fusion, fusion-fixed-mp, dlfusion, oracle, "
    "optimal, or one registered in Python. oracle/optimal search blocks of at most 256 layers plus whole "
    "segments (profile key search_max_block_layers; 0 = no bound)."))]
HwOpt = Annotated[str, typer.Option("--hw", help="Hardware profile name or JSON file.")]
MpOpt = Annotated[Optional[int], typer.Option("--mp", help="Force this MP on every block.", show_default=False)]
PlanOpt = Annotated[Optional[Path], typer.Option("--plan", help="Use a JSON plan file instead of a strategy.", show_default=False)]
InputsOpt = Annotated[Optional[Path], typer.Option(
    "--inputs", help="A .npz of arrays by input name, used instead of random values for those inputs.",
    show_default=False)]
SeedOpt = Annotated[List[int], typer.Option("--seed", help="Seed(s) for random inputs (repeatable).")]
AtolOpt = Annotated[float, typer.Option("--atol", help="Absolute tolerance.")]
RtolOpt = Annotated[float, typer.Option("--rtol", help="Relative tolerance.")]
JsonOpt = Annotated[Optional[Path], typer.Option("--json", help="Also write the report as JSON ('-' for stdout).", show_default=False)]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")]


def _print_version(value: bool) -> None:
    if value:
        from onnxmlu import __version__

        console.print(f"onnxmlu {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    _state["debug"] = debug


def command(fn: Callable) -> Callable:
    """Register ``fn`` as a command whose user errors become one line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except OnnxMluError as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            _fail("interrupted", code=130)
        except Exception as exc:  # onnxruntime / onnx errors on bad input end up here
            if _state["debug"]:
                raise
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            _fail(f"{type(exc).__name__}: {text} (rerun with --debug for the traceback)")

    return app.command()(wrapper)


def _fail(message: str, code: int = 2) -> None:
    if _state["debug"] and sys.exc_info()[0] is not None:
        raise
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


#: Version of every JSON report's layout; bump it when a key changes meaning or goes away.
SCHEMA_VERSION = 1


def _report(command: str, payload: dict) -> dict:
    """``payload`` with its ``schema`` tag first, e.g. ``"onnxmlu.fuse/1"`` (docs/json.md)."""
    return {"schema": f"onnxmlu.{command}/{SCHEMA_VERSION}", **payload}


def _talk(quiet: bool, json_out: Optional[Path]) -> bool:
    """Whether to print human-readable output: not with --quiet, nor when --json - owns stdout."""
    return not quiet and str(json_out) != "-"


def _emit_json(target: Optional[Path], payload: dict) -> None:
    if target is None:
        return
    text = json.dumps(payload, indent=2, default=float) + "\n"
    if str(target) == "-":
        sys.stdout.write(text)
    else:
        from onnxmlu.atomic import write_bytes_atomic

        write_bytes_atomic(text.encode(), target)  # a report is never half-written


class Steps:
    """Handle on a progress display: ``say`` names the step now running, ``advance`` counts
    one done. Without a display (``--quiet``) both do nothing."""

    def __init__(self, progress=None, task=None) -> None:
        self._progress, self._task = progress, task

    def say(self, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=escape(text))

    def advance(self) -> None:
        if self._progress is not None:
            self._progress.advance(self._task)


@contextmanager
def _steps(quiet: bool, total: Optional[int] = None) -> Iterator[Steps]:
    """A spinner, the current step and the elapsed time on stderr; with ``total`` also a bar.

    Transient (gone when done), hidden by --quiet, and drawn only on an interactive terminal
    (on a file or pipe rich would draw nothing but still end with a blank line)."""
    if quiet or not err_console.is_interactive:
        yield Steps()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bar = [BarColumn(), MofNCompleteColumn()] if total else []
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), *bar, TimeElapsedColumn(),
                  console=err_console, transient=True, redirect_stdout=False, redirect_stderr=False) as progress:
        yield Steps(progress, progress.add_task("", total=total))


def _shapes(specs: Optional[List[str]]):
    from onnxmlu.graph import parse_input_shapes

    return parse_input_shapes(specs or [])


# ---- commands -----------------------------------------------------------------------------
@command
def fuse(
    model: ModelArg,
    output: Annotated[Path, typer.Argument(help="Where to write the fused model.", show_default=False)],
    strategy: StrategyOpt = "dlfusion",
    mp: MpOpt = None,
    plan: PlanOpt = None,
    hw: HwOpt = "mlu100",
    input_shape: InputShapeOpt = None,
    bn: Annotated[str, typer.Option("--bn", help="BatchNormalization rewrite: substitute or fold.")] = "substitute",
    check: Annotated[bool, typer.Option("--check", help="Run original and fused model and compare.")] = False,
    inputs: InputsOpt = None,
    portable: Annotated[bool, typer.Option("--portable", help=(
        "Write each block as a model-local ONNX function instead of an MLUFusionBlock node: "
        "runs in plain onnxruntime without the custom-op library."))] = False,
    json_out: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Rewrite, plan and collapse MODEL into OUTPUT (one MLUFusionBlock per block).

    Example: onnxmlu fuse resnet18.onnx resnet18.fused.onnx --strategy dlfusion --check
    """
    from onnxmlu import api

    started = time.perf_counter()
    options = dict(strategy=strategy, plan=plan, mp=mp, hardware=hw, input_shapes=_shapes(input_shape), bn_mode=bn)
    with _steps(quiet) as steps:
        if check or portable:  # the comparison (or exploding) needs the models in memory
            steps.say(f"loading {model.name}")
            original = api.as_model(model)
            steps.say(f"fusing: rewrite, plan ({'--plan' if plan else strategy}), collapse")
            result = api.fuse(original, **options)
            written = _portable(result.model) if portable else result.model
            steps.say(f"saving {output.name}")
            api.save_model(written, output, input_path=model)
        else:  # streamed: the model once plus one block body in memory (DESIGN §2, issue 6)
            result = api.fuse_to_file(model, output, progress=steps.say, **options)
    elapsed = time.perf_counter() - started
    talk = _talk(quiet, json_out)
    if talk:
        _print_blocks(result)
        _print_host_nodes(result)
        console.print(f"wrote {output} ({len(result.plan.blocks)} blocks{_PORTABLE_NOTE if portable else ''}, "
                      f"{elapsed:.2f} s)")
    payload = _report("fuse", {
        "output": str(output), "strategy": result.plan.strategy, "hardware": result.hardware.name,
        "sim_latency_us": result.sim_latency_us, "sim_fps": result.sim_fps, "blocks": result.block_rows(),
        "host_nodes": result.analysis.host_nodes(), "diagnostics": [d.to_dict() for d in result.all_diagnostics()]})
    fixed = (options["input_shapes"], _arrays(inputs))
    report = _run_check(original, written, [0], 1e-4, 1e-4, quiet, talk, *fixed) if check else None
    if report is not None:
        payload["check"] = _check_payload(report)
    _emit_json(json_out, payload)
    if report is not None and not report.ok:
        raise typer.Exit(1)


_PORTABLE_NOTE = " as ONNX functions, no custom-op library needed"


def _portable(fused):
    """``fuse --portable``: the fused model with each block as a model-local ONNX function."""
    from onnxmlu.view import explode

    return explode(fused)


def _op_summary(counts: dict, keep: int = 3) -> str:
    """'Conv×8 Relu×8 Add×3 +2' — the most frequent op types of a block."""
    items = [f"{op}×{n}" if n > 1 else op for op, n in list(counts.items())[:keep]]
    return " ".join(items) + (f" +{len(counts) - keep}" if len(counts) > keep else "")


def _print_blocks(result) -> None:
    table = Table(title=f"{len(result.plan.blocks)} blocks · strategy {result.plan.strategy} · {result.hardware.name}")
    for col in ("block", "mp", "layers", "first → last", "op types", "GOPs", "sim µs"):
        table.add_column(col, justify="right" if col in ("block", "mp", "layers", "GOPs", "sim µs") else "left")
    for row in result.block_rows():
        table.add_row(str(row["block"]), str(row["mp"]), str(row["layers"]), f"{row['first']} → {row['last']}",
                      _op_summary(row["op_types"]), f"{row['gops']:.3f}", f"{row['sim_latency_us']:.1f}")
    console.print(table)
    console.print(f"simulated latency {result.sim_latency_us:.1f} µs · {result.sim_fps:.1f} FPS")


def _print_host_nodes(result) -> None:
    """What normalize could not do, each rewrite left undone, and why nodes stay on the host:
    a summary of the reasons, then one line per node (the first HOST_LINES; --json has all)."""
    for d in result.diagnostics:
        _plain(f"normalize: {d.node + ': ' if d.node else ''}{d.message}")
    skipped = getattr(result.rewrite_report, "skipped", None) or []
    for rewriter, node, reason in skipped:
        _plain(f"{rewriter}: left {node!r} alone: {reason}")
    host = result.analysis.host_nodes()
    if not host:
        return
    total = len(result.analysis.model.graph.node)
    reasons = Counter(row["reason"] for row in host).most_common(3)
    _plain(f"{len(host)} of {total} nodes run on the host; most common: "
           + "; ".join(f"{reason} (×{n})" for reason, n in reasons))
    for row in host[:HOST_LINES]:
        _plain(f"host: {row['node']} ({row['op_type']}): {row['reason']}")
    if len(host) > HOST_LINES:
        _plain(f"... and {len(host) - HOST_LINES} more host nodes (all of them in --json's host_nodes)")


HOST_LINES = 12


def _plain(text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


@command
def check(
    original: ModelArg,
    fused: Annotated[Path, typer.Argument(help="Fused model to verify.", show_default=False)],
    seed: SeedOpt = [0],  # noqa: B006 - typer reads the default
    atol: AtolOpt = 1e-4,
    rtol: RtolOpt = 1e-4,
    input_shape: InputShapeOpt = None,
    inputs: InputsOpt = None,
    json_out: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Run ORIGINAL (reference: onnxruntime, optimizations off) and FUSED on seeded inputs of
    the shapes --input-shape pins (the same pins as `fuse`; other symbolic dims are 1), with
    the arrays of --inputs for the inputs it names.

    Example: onnxmlu check resnet18.onnx resnet18.fused.onnx --seed 0 --seed 1
    """
    from onnxmlu.graph import load_model

    with _steps(quiet) as steps:
        steps.say(f"loading {original.name} and {fused.name}")
        models = load_model(original), load_model(fused)
    report = _run_check(*models, seed, atol, rtol, quiet, _talk(quiet, json_out), _shapes(input_shape), _arrays(inputs))
    _emit_json(json_out, _check_payload(report))
    if not report.ok:
        raise typer.Exit(1)


def _check_payload(report) -> dict:
    """The ``check`` report: on its own from `check`, and under ``"check"`` in `fuse --check`."""
    return _report("check", report.to_dict())


def _arrays(path: Path | None) -> dict | None:
    """The arrays of an .npz file by name (--inputs)."""
    if path is None:
        return None
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise OnnxMluError(f"cannot read --inputs {path} as a .npz of arrays: {exc}") from None


def _run_check(original, fused, seeds, atol, rtol, quiet: bool, talk: bool, pins=None, inputs=None):
    """Compare the models (a spinner per stage unless --quiet); print the table if ``talk``."""
    from onnxmlu.verify import check_models

    with _steps(quiet) as steps:
        report = check_models(original, fused, seeds=seeds, atol=atol, rtol=rtol, input_shapes=pins, inputs=inputs,
                              progress=lambda stage: steps.say(f"check: {stage}"))
    if talk:
        table = Table(title=f"check · seeds {list(seeds)} · atol={atol:g} rtol={rtol:g}")
        for col in ("output", "shape", "max abs err", "max rel err", "ok"):
            table.add_column(col)
        for d in report.diffs:
            table.add_row(d.name, str(list(d.shape)), f"{d.max_abs:.3g}", f"{d.max_rel:.3g}",
                          "[green]yes[/]" if d.ok else "[red]NO[/]")
        console.print(table)
        console.print("[green]check passed[/]" if report.ok else "[red]check FAILED[/]")
    return report


@command
def inspect(
    model: ModelArg,
    input_shape: InputShapeOpt = None,
    rewrite: Annotated[bool, typer.Option("--rewrite/--no-rewrite", help="Rewrite BN/Gemm/RNN first.")] = False,
    json_out: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Print the layer table (topological order): op, GOPs, channels, bytes; and host nodes.

    Example: onnxmlu inspect resnet18.onnx --rewrite
    """
    from onnxmlu import api

    with _steps(quiet) as steps:
        steps.say(f"analysing {model.name}" + (" (rewritten)" if rewrite else ""))
        analysis = api.inspect(model, input_shapes=_shapes(input_shape), rewrite=rewrite)
    rows = [layer_row(l) for l in analysis.layers]
    host = [{"node": analysis.model.graph.node[i].name or analysis.model.graph.node[i].op_type,
             "op_type": analysis.model.graph.node[i].op_type, "reason": r}
            for i, r in sorted(analysis.host_reasons.items())]
    if _talk(quiet, json_out):
        _print_layers(rows, host, analysis.total_gops)
    _emit_json(json_out, _report("inspect", {"layers": rows, "host_nodes": host, "total_gops": analysis.total_gops}))


def layer_row(layer) -> dict:
    return {"index": layer.index, "name": layer.name, "op_type": layer.op_type, "kind": layer.kind,
            "gops": layer.gops, "in_channels": layer.in_channels, "out_channels": layer.out_channels,
            "out_hw": [layer.out_height, layer.out_width], "input_bytes": layer.input_bytes,
            "output_bytes": layer.output_bytes, "weight_bytes": layer.weight_bytes, "segment": layer.segment}


def _print_layers(rows, host, total_gops) -> None:
    table = Table(title=f"{len(rows)} accelerator layers · {total_gops:.3f} GOPs")
    for col in ("#", "name", "op", "GOPs", "C in", "C out", "H×W", "in KB", "out KB", "weights KB", "seg"):
        table.add_column(col, justify="left" if col in ("name", "op") else "right")
    for r in rows:
        table.add_row(str(r["index"]), r["name"], r["op_type"], f"{r['gops']:.4f}", str(r["in_channels"]),
                      str(r["out_channels"]), "×".join(map(str, r["out_hw"])), f"{r['input_bytes'] / 1024:.0f}",
                      f"{r['output_bytes'] / 1024:.0f}", f"{r['weight_bytes'] / 1024:.0f}", str(r["segment"]))
    console.print(table)
    for h in host:
        console.print(f"host: {h['node']} ({h['op_type']}): {h['reason']}")


@command
def zoo(
    name: Annotated[str, typer.Argument(help="resnet18, resnet50, vgg19, alexnet, mobilenetv2, lstm; "
                                             "several comma-separated, or 'all'.")],
    output: Annotated[Path, typer.Argument(help="Where to write the model (a folder for several).", show_default=False)],
    batch: Annotated[str, typer.Option("--batch", help="Batch size, or a name for a symbolic batch.")] = "1",
    seed: Annotated[int, typer.Option("--seed", help="Weight seed.")] = 0,
    json_out: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Build zoo models (real architecture and size, seeded random weights).

    Example: onnxmlu zoo resnet18 resnet18.onnx --batch N; onnxmlu zoo all models/
    """
    from onnxmlu import api
    from onnxmlu.zoo import ZOO_NAMES, build_model

    names = list(ZOO_NAMES) if name == "all" else name.split(",")
    targets = _zoo_targets(names, output)
    size = int(batch) if batch.isdigit() else batch
    written = []
    with _steps(quiet or len(names) == 1, total=len(names)) as steps:
        for net, path in targets:
            steps.say(f"building {net}")
            api.save_model(build_model(net, batch=size, seed=seed), path)
            written.append({"name": net, "path": str(path), "batch": size, "seed": seed, "bytes": path.stat().st_size})
            steps.advance()
    for w in written if _talk(quiet, json_out) else []:
        console.print(f"wrote {w['path']} ({w['name']}, batch {batch}, {w['bytes'] / 2**20:.1f} MiB)")
    _emit_json(json_out, _report("zoo", {"models": written}))


def _zoo_targets(names: list[str], output: Path) -> list[tuple[str, Path]]:
    """``(name, path)`` per model: OUTPUT itself for one model, OUTPUT/NAME.onnx for several."""
    from onnxmlu.zoo import ZOO_NAMES

    unknown = [n for n in names if n not in ZOO_NAMES]
    if unknown:
        raise OnnxMluError(f"unknown zoo model {unknown[0]!r} (known: {', '.join(ZOO_NAMES)}, or all)")
    if len(names) == 1:
        return [(names[0], output)]
    if output.suffix == ".onnx" or (output.exists() and not output.is_dir()):
        raise OnnxMluError(f"{len(names)} models need a folder as OUTPUT, not {output}")
    if not output.parent.is_dir():
        raise OnnxMluError(f"folder {output.parent} does not exist")
    output.mkdir(exist_ok=True)
    return [(n, output / f"{n}.onnx") for n in names]


@command
def rewrite(
    model: ModelArg,
    output: Annotated[Path, typer.Argument(help="Where to write the rewritten model.", show_default=False)],
    bn: Annotated[str, typer.Option("--bn", help="BatchNormalization: substitute (norm + Mul + Add) or fold.")] = "substitute",
    only: Annotated[Optional[str], typer.Option("--only", help="Comma-separated subset of bn,gemm,rnn.", show_default=False)] = None,
    input_shape: InputShapeOpt = None,
    json_out: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Rewrite weighted BN, Gemm and LSTM/GRU/RNN into accelerator primitives (no fusion).

    Example: onnxmlu rewrite lstm.onnx lstm.rewritten.onnx --only rnn,gemm
    """
    from onnxmlu import api

    with _steps(quiet) as steps:
        steps.say(f"rewriting {model.name}")
        rewritten, report = api.rewrite(model, bn_mode=bn, only=only.split(",") if only else None,
                                        input_shapes=_shapes(input_shape))
        steps.say(f"saving {output.name}")
        api.save_model(rewritten, output, input_path=model)
    if _talk(quiet, json_out):
        for name, count in report.applied.items():
            console.print(f"{name}: rewrote {count} node(s)")
        for rewriter, node, reason in report.skipped:
            console.print(f"{rewriter}: left {node!r} alone: {reason}")
        console.print(f"wrote {output}")
    _emit_json(json_out, _report("rewrite", report.to_dict()))


@command
def plan(
    model: ModelArg,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the plan as JSON.", show_default=False)] = None,
    strategy: StrategyOpt = "dlfusion",
    mp: MpOpt = None,
    hw: HwOpt = "mlu100",
    input_shape: InputShapeOpt = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Timeline of blocks with MP and simulated time (PNG).", show_default=False)] = None,
    json_out: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Plan blocks and MP without collapsing; edit the JSON and pass it to `fuse --plan`.

    With -q and neither -o nor --json, the plan file's JSON goes to stdout.

    Example: onnxmlu plan resnet18.onnx --strategy optimal -o plan.json --plot plan.png
    """
    from onnxmlu import api
    from onnxmlu.perf.hardware import load_hardware

    hardware = load_hardware(hw)
    with _steps(quiet) as steps:
        steps.say(f"analysing {model.name}")
        analysis = api.inspect(model, input_shapes=_shapes(input_shape), rewrite=True)
        steps.say(f"planning: {strategy} search" if strategy in ("oracle", "optimal") else f"planning: {strategy}")
        chosen = api.make_plan(analysis, hardware, strategy=strategy, mp=mp)
    text = chosen.to_json(analysis.layers)
    if output is not None:
        from onnxmlu.atomic import write_bytes_atomic

        write_bytes_atomic(text.encode(), output)
    latencies = api.block_latencies(analysis.layers, chosen, api.cost_function(hardware))
    rows = [{"block": b, "mp": block.mp, "sim_latency_us": latency,
             "first": analysis.layers[block.start].name, "last": analysis.layers[block.stop - 1].name,
             "start": block.start, "stop": block.stop}
            for b, (block, latency) in enumerate(zip(chosen.blocks, latencies))]
    total = sum(r["sim_latency_us"] for r in rows)
    if plot is not None:
        from onnxmlu.plots import plan_chart

        plan_chart(rows, plot, title=f"{model.stem}: {chosen.strategy}, {len(rows)} blocks, {total:.0f} µs simulated on {hardware.name}",
                   max_mp=hardware.cores)
    if _talk(quiet, json_out):
        for r in rows:
            console.print(f"block {r['block']:3d}  mp={r['mp']:2d}  layers {r['start']}..{r['stop'] - 1} "
                          f"({r['first']} → {r['last']})  {r['sim_latency_us']:9.1f} µs")
        console.print(f"{len(rows)} blocks · simulated {total:.1f} µs · {1e6 / total:.1f} FPS")
    elif output is None and json_out is None:
        sys.stdout.write(text)
    _emit_json(json_out, _report("plan", {
        "strategy": chosen.strategy, "hardware": hardware.name, "layers": len(analysis.layers),
        "sim_latency_us": total, "sim_fps": 1e6 / total if total > 0 else None, "blocks": rows}))


@command
def compare(
    model: Annotated[Optional[Path], typer.Argument(help="ONNX model (omit with --zoo).", show_default=False)] = None,
    zoo_all: Annotated[bool, typer.Option("--zoo", help="Compare on every zoo CNN.")] = False,
    strategies: Annotated[Optional[str], typer.Option("--strategies", help="Comma-separated strategies (default: all).", show_default=False)] = None,
    hw: HwOpt = "mlu100",
    input_shape: InputShapeOpt = None,
    json_out: JsonOpt = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Grouped bar chart of speedups (PNG).", show_default=False)] = None,
    quiet: QuietOpt = False,
) -> None:
    """Simulated latency, FPS and speedup over `none` per strategy (DLFusion Fig. 10).

    Example: onnxmlu compare --zoo --plot speedup.png
    """
    from onnxmlu import api
    from onnxmlu.perf.hardware import load_hardware
    from onnxmlu.strategies import strategy_names

    if (model is None) == (not zoo_all):
        raise OnnxMluError("give either a MODEL or --zoo")
    hardware = load_hardware(hw)
    names = strategies.split(",") if strategies else strategy_names()
    if "none" not in names:
        names = ["none", *names]
    networks = _compare_inputs(model)
    report = {}
    with _steps(quiet, total=len(networks) * (len(names) + 1)) as steps:
        for label, source in networks:
            report[label] = _compare_one(label, source, hardware, names, _shapes(input_shape), steps)
    for label, rows in report.items() if _talk(quiet, json_out) else ():
        _print_compare(label, rows, hardware.name)
    _emit_json(json_out, _report("compare", {"hardware": hardware.name, "strategies": names, "networks": report}))
    if plot is not None:
        from onnxmlu.plots import speedup_chart

        speedup_chart(report, plot)


def _compare_inputs(model: Optional[Path]) -> list[tuple[str, object]]:
    """``(label, model path or zoo name)`` per network; zoo models are built when their turn
    comes, under the progress bar (building all five takes most of `compare --zoo`'s time)."""
    if model is not None:
        return [(model.stem, model)]
    from onnxmlu.zoo import CNN_NAMES

    return [(name, name) for name in CNN_NAMES]


def _compare_one(label: str, source, hardware, names: list[str], shapes, steps: Steps) -> list[dict]:
    """One network's rows: each strategy's plan priced by the model, speedup over the first."""
    from onnxmlu import api

    steps.say(f"{label}: building and analysing")
    if isinstance(source, str):
        from onnxmlu.zoo import build_model

        source = build_model(source)
    analysis = api.inspect(source, input_shapes=shapes, rewrite=True)
    steps.advance()
    results = []
    for name in names:
        steps.say(f"{label}: {name}")
        results.extend(api.compare(analysis, hardware, [name]))
        steps.advance()
    base = results[0].sim_latency_us
    return [{"strategy": r.strategy, "sim_latency_us": r.sim_latency_us, "fps": r.fps,
             "speedup": base / r.sim_latency_us, "blocks": len(r.plan.blocks),
             "plan_seconds": r.plan_seconds} for r in results]


def _print_compare(label: str, rows: list[dict], hw_name: str) -> None:
    table = Table(title=f"{label} on {hw_name}")
    for col in ("strategy", "sim latency µs", "FPS", "speedup", "blocks", "plan s"):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for r in rows:
        table.add_row(r["strategy"], f"{r['sim_latency_us']:.1f}", f"{r['fps']:.1f}", f"{r['speedup']:.2f}×",
                      str(r["blocks"]), f"{r['plan_seconds']:.3f}")
    console.print(table)


hw_app = typer.Typer(help="Hardware profiles of the simulated accelerator.", no_args_is_help=True)
app.add_typer(hw_app, name="hw")


@hw_app.command("list")
def hw_list() -> None:
    """List the built-in hardware profiles. Example: onnxmlu hw list"""
    from onnxmlu.perf.hardware import load_hardware, profile_names

    for name in profile_names():
        hw = load_hardware(name)
        console.print(f"{name:10s} {hw.cores:3d} cores  {hw.description}")


@hw_app.command("show")
def hw_show(name: Annotated[str, typer.Argument(help="Profile name or JSON file.")] = "mlu100") -> None:
    """Print a hardware profile as JSON. Example: onnxmlu hw show mlu100"""
    import dataclasses

    from onnxmlu.perf.hardware import load_hardware

    try:
        hw = load_hardware(name)
    except OnnxMluError as exc:
        _fail(str(exc))
    sys.stdout.write(json.dumps(dataclasses.asdict(hw), indent=2) + "\n")


@command
def run(
    model: ModelArg,
    inputs: Annotated[Optional[Path], typer.Option("--inputs", help="Feeds as .npz (default: seeded random).", show_default=False)] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for random inputs.")] = 0,
    input_shape: InputShapeOpt = None,
    repeat: Annotated[int, typer.Option("--repeat", help="Timed runs (median reported).")] = 10,
    profile: Annotated[bool, typer.Option("--profile", help="Per-block measured CPU time vs simulated time.")] = False,
    save: Annotated[Optional[Path], typer.Option("--save", help="Save outputs as .npz.", show_default=False)] = None,
    json_out: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Run any model (fused or not) in onnxruntime with the custom-op library.

    Example: onnxmlu run resnet18.fused.onnx --repeat 20 --profile
    """
    import numpy as np

    from onnxmlu.graph import load_model
    from onnxmlu.runtime import InferenceSession
    from onnxmlu.timing import time_interleaved
    from onnxmlu.verify import random_inputs

    with _steps(quiet) as steps:
        steps.say(f"loading {model.name}")
        proto = load_model(model)
        feeds = _load_feeds(inputs) if inputs else random_inputs(proto, seed, shapes=_shapes(input_shape))
        steps.say("creating the session")
        session = InferenceSession(proto)
        names = [o.name for o in session.get_outputs()]
        outputs = session.run(names, feeds)
        steps.say(f"timing {max(1, repeat)} runs")
        timing = time_interleaved({"model": session}, feeds, runs=max(1, repeat), warmup=1)["model"]
        summary = [_output_summary(n, o) for n, o in zip(names, outputs)]
        payload = _report("run", {"outputs": summary, "latency_ms": timing.__dict__})
        if profile:
            from onnxmlu.profiling import profile_nodes

            steps.say(f"profiling {max(1, repeat)} runs")
            payload["profile"] = [p.__dict__ for p in profile_nodes(proto, feeds, repeat=max(1, repeat))]
    if _talk(quiet, json_out):
        _print_run(summary, timing, payload.get("profile"))
    if save is not None:
        np.savez(save, **dict(zip(names, outputs)))
    _emit_json(json_out, payload)


def _load_feeds(path: Path) -> dict:
    import numpy as np

    try:
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise OnnxMluError(f"cannot read inputs from {path}: {exc}") from None


def _output_summary(name: str, value) -> dict:
    import numpy as np

    arr = np.asarray(value)
    numeric = arr.dtype.kind in "biuf" and arr.size
    stats = {k: float(getattr(arr.astype(np.float64), k)()) for k in ("mean", "std", "min", "max")} if numeric else {}
    return {"name": name, "shape": list(arr.shape), "dtype": str(arr.dtype), **stats}


def _print_run(summary, timing, profile) -> None:
    for s in summary:
        stats = "  ".join(f"{k}={s[k]:.4g}" for k in ("mean", "std", "min", "max") if k in s)
        console.print(f"{s['name']}: {s['dtype']}{s['shape']}  {stats}")
    console.print(f"latency: median {timing.median_ms:.2f} ms (min {timing.min_ms:.2f}, max {timing.max_ms:.2f}, "
                  f"{timing.runs} runs)")
    if not profile:
        return
    table = Table(title="per-node CPU time (onnxruntime profiler) vs simulated accelerator")
    for col in ("node", "op", "mp", "CPU µs", "sim µs"):
        table.add_column(col, justify="left" if col in ("node", "op") else "right")
    for p in profile:
        table.add_row(p["name"], p["op_type"], str(p["mp"] or ""), f"{p['measured_us']:.1f}",
                      "" if p["sim_latency_us"] is None else f"{p['sim_latency_us']:.1f}")
    table.add_row("total", "", "", f"{sum(p['measured_us'] for p in profile):.1f}",
                  f"{sum(p['sim_latency_us'] or 0 for p in profile):.1f}")
    console.print(table)


@command
def view(
    model: ModelArg,
    explode_blocks: Annotated[bool, typer.Option("--explode", help="Show each block's body as a function.")] = False,
    port: Annotated[int, typer.Option("--port", help="Local port for Netron.")] = 8080,
    no_browser: Annotated[bool, typer.Option("--no-browser", help="Serve only; do not open a browser.")] = False,
) -> None:
    """Open a (fused) model in Netron on 127.0.0.1 (needs the `view` extra).

    Example: onnxmlu view resnet18.fused.onnx --explode
    """
    from onnxmlu.graph import load_model
    from onnxmlu.view import explode, serve

    if not model.is_file():  # Netron would serve an error page instead of failing here
        raise OnnxMluError(f"model file {model} does not exist" if not model.exists() else f"{model} is not a file")
    if explode_blocks:  # served from memory: nothing is written beside the user's model
        data = explode(load_model(model)).SerializeToString()
        console.print(f"exploded view of {model} (blocks as ONNX functions), served from memory")
        serve(model.with_name(model.stem + ".exploded.onnx"), port=port, browse=not no_browser, data=data)
    else:
        serve(model, port=port, browse=not no_browser)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
