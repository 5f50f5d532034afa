"""``onnxmlu`` command line: thin wrappers that parse options and call :mod:`onnxmlu.api`.

Exit codes: 0 success, 1 a check or comparison failed, 2 usage or input error. Errors print
one line; ``--debug`` shows the traceback instead. ``--debug``, ``-v/--verbose`` (onnxruntime's
own log lines, hidden otherwise), ``-q/--quiet`` and ``-h`` work before or after the command name.

Streams: tables go to stdout, progress (rich, transient) and errors to stderr. ``--json -``
owns stdout: the report is then the only thing printed there, so it can be piped. Every JSON
report carries ``"schema": "onnxmlu.<command>/1"``; its JSON Schema is
``onnxmlu/schemas/<command>.json`` (docs/json.md for people), and tests/test_schemas.py
validates the outputs against it.
"""

from __future__ import annotations

import functools
import inspect as inspect_module
import json
import math
import os
import re
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Callable, Iterator, List, Optional

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich import box
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from onnxmlu import ortlog
from onnxmlu.errors import OnnxMluError, runtime_message
from onnxmlu.frontend.pins import latency_text, shapes_text
from onnxmlu.optional import optional_import
from onnxmlu.precisions import PRECISIONS
from onnxmlu.progress import Tally
from onnxmlu.rewrite import BN_MODES, REWRITER_NAMES, rewriter_summary
from onnxmlu.version import __version__
from onnxmlu.wording import noun, plural


class _FieldHelp:
    """Help as command-line tools write it: ``Usage: onnxmlu fuse [OPTIONS] MODEL OUTPUT`` (no
    ``{model}``), a flag without a type (no ``<bool>``), a value's placeholder in capitals
    (``--hw HW``), and each paragraph of a docstring one paragraph (its line breaks are the
    source's, not sentences to break in the command list)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for name in ("help", "short_help"):
            text = getattr(self, name, None)
            if text:
                setattr(self, name, re.sub(r"(?<=\S)[ \t]*\n(?=[ \t]*\S)[ \t]*", " ", inspect_module.cleandoc(text)))

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if param.metavar is None:
                option = param.param_type_name == "option"
                param.metavar = "" if option and param.is_flag else param.name.upper()
        return params

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                pieces.append(param.metavar if param.required else f"[{param.metavar}]")
        return pieces


class _Command(_FieldHelp, TyperCommand):
    pass


class _Group(_FieldHelp, TyperGroup):
    def collect_usage_pieces(self, ctx) -> list[str]:
        return TyperGroup.collect_usage_pieces(self, ctx)


app = typer.Typer(
    name="onnxmlu", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]}, cls=_Group,
    help="Compile ONNX models for a simulated multi-core MLU100-class accelerator.",
)
# On a terminal rich fits tables to its width; into a file or pipe it would cut them at 80
# columns ("fc/m…"), so there they keep their natural width.
_PIPED_WIDTH = 100_000


class _Console(Console):
    """rich's console, its width decided each time it is read, not when the module was
    imported: the terminal's, or a width the user set (COLUMNS, read then), else (a file or a
    pipe) :data:`_PIPED_WIDTH`. A width set on it (``console.width = n``) holds."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._width = kwargs.get("width")  # rich fixes COLUMNS here; it is read when printing instead

    @property
    def size(self) -> ConsoleDimensions:
        if self._width is None and not os.environ.get("COLUMNS") and not _isatty(self.file):
            return ConsoleDimensions(_PIPED_WIDTH, super().size.height)
        return super().size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream: not a terminal
        return False


console = _Console()
err_console = Console(stderr=True)
_state = {"debug": False, "quiet": False}

# ---- shared options, declared once ------------------------------------------------------
def _option(*flags: str, help: str):
    """An option whose default is not worth showing (None, or an empty list)."""
    return typer.Option(*flags, help=help, show_default=False)


ModelArg = Annotated[Path, typer.Argument(help="ONNX model file.", show_default=False)]
InputShapeOpt = Annotated[List[str], typer.Option(
    "--input-shape", metavar="NAME:DIMS", show_default=False, help=(
        "The shape to plan for, NAME:D1,D2,... (repeatable, or several in one value: a:1x3x8x8,b:1x16; also "
        "NAME:1x3x224x224 or NAME:[1,3,224,224]); a dim "
        "may be a range MIN..MAX or MIN/OPT/MAX (priced at OPT, default MIN). Pins choose the plan: symbolic dims "
        "stay symbolic in the fused model."))]
MaxMemoryOpt = Annotated[Optional[str], _option("--max-memory", help=(
    "Memory budget of the runs that learn shapes and of the check's runs, e.g. 4G or 512M (default: half the "
    "memory the host has available). A run is bounded before it starts; unpinned dims whose default sizes do "
    "not fit are planned smaller, or the one error line names the inputs to pin."))]
StrategyOpt = Annotated[str, typer.Option("--strategy", "-s", help=(
    "Fusion/MP strategy: none, fixed-mp, dynamic-mp, all-fusion, fusion-fixed-mp, dlfusion, oracle, "
    "optimal, or one registered in Python. oracle/optimal search blocks of at most 256 layers plus whole "
    "segments (profile key search_max_block_layers; 0 = no bound)."))]
HwOpt = Annotated[str, typer.Option("--hw", metavar="HW", help="Hardware profile name or JSON file.")]
MpOpt = Annotated[Optional[int], _option("--mp", help="Force this MP on every block.")]
PlanOpt = Annotated[Optional[Path], _option("--plan", help="Use a JSON plan file instead of a strategy.")]
InputsOpt = Annotated[Optional[Path], _option(
    "--inputs", help="A .npz of arrays by input name, used instead of random values for those inputs.")]
SeedOpt = Annotated[List[int], typer.Option("--seed", help="Seed(s) for random inputs (repeatable).")]
AtolOpt = Annotated[float, typer.Option("--atol", help="Absolute tolerance.")]
RtolOpt = Annotated[float, typer.Option("--rtol", help="Relative tolerance.")]
PrecisionOpt = Annotated[Optional[str], _option("--precision", help=(
    f"Run every block at {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}; the strategy plans at that "
    "precision (default: fp32, or the precisions of the --plan file). auto: blocks, MP and a precision per "
    "block chosen together under the --accuracy budget, measured on the calibration samples."))]
AccuracyOpt = Annotated[Optional[str], _option("--accuracy", help=(
    "Budget of --precision auto: cosine>=X (worst cosine similarity of each output over the samples) or "
    "top1>=X (argmax agreement); default cosine>=0.999."))]
CalibrationOpt = Annotated[Optional[Path], _option("--calibration", help=(
    "Folder of calibration samples for INT8 blocks: NAME.npz files (arrays by input name) or sub-folders of "
    "TensorProto *.pb files (default: seeded random samples, flagged in the report)."))]
ValidationOpt = Annotated[Optional[Path], _option("--validation", help=(
    "Folder of validation samples (same layout as --calibration) that judge --precision auto's budget and "
    "--check (default: every other calibration sample is held out; without --calibration, other seeded "
    "random samples)."))]
KeepFp32Opt = Annotated[Optional[List[str]], _option("--keep-fp32", help=(
    "Keep this layer at FP32 under --precision fp16/int8/auto: a node name or a shell pattern "
    "(layer4.*); repeatable. A lower-precision block is cut around kept layers."))]
MetricOpt = Annotated[Optional[str], _option("--metric", help=(
    "A user metric module:function(reference_outputs, outputs) -> score, called per sample; its mean "
    "judges --accuracy metric>=X under --precision auto."))]
ParetoOpt = Annotated[Optional[Path], _option("--pareto", help=(
    "With --precision auto: simulated latency against measured accuracy of the plans considered (PNG)."))]
CalibratorOpt = Annotated[str, typer.Option("--calibrator", help="INT8 calibrator: minmax, entropy or percentile.")]
CheckOpt = Annotated[bool, typer.Option("--check", help=(
    "Run original and fused model and compare; the output is written only when the check passes."))]
AllowNanOpt = Annotated[bool, typer.Option("--allow-nan", help=(
    "Let the check pass NaN/Inf that the reference has at the same places (NaN or Inf anywhere else always fails)."))]
QtolOpt = Annotated[float, typer.Option("--qtol", help=(
    "Steps of its quantization scale a quantized output may move by: |a-b| <= atol + qtol*scale."))]
PlanBestEffortOpt = Annotated[bool, typer.Option("--best-effort", help=(
    "Under --precision auto, exit 0 when the --accuracy budget is not met (default: exit code 1)."))]
BestEffortOpt = Annotated[bool, typer.Option("--best-effort", help=(
    "Under --precision auto, keep the closest plan and exit 0 when the --accuracy budget is not met "
    "(default: nothing is written and the exit code is 1)."))]
PortableOpt = Annotated[bool, typer.Option("--portable", help=(
    "Write each block as a model-local ONNX function instead of an MLUFusionBlock node: "
    "runs in plain onnxruntime without the custom-op library."))]
JsonOpt = Annotated[Optional[Path], typer.Option("--json", metavar="FILE", show_default=False,
                                                 help="Also write the report as JSON ('-' for stdout).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")]


def _print_version(value: bool) -> None:
    if value:
        console.print(f"onnxmlu {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Let onnxruntime log warnings and errors.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors (any command).")] = False,
    version: Annotated[bool, typer.Option("--version", "-V", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    _state.update(debug=debug, quiet=quiet)
    _quiet_onnxruntime(verbose)


def _quiet_onnxruntime(verbose: bool) -> None:
    """onnxruntime's default logger prints its own coloured lines (a failed session's error, the
    shape probe's warnings) before our one ``error:`` line says the same; only FATAL unless
    --verbose. Inner sessions share the process's env, so the library's blocks follow too."""
    ortlog.set_severity(2 if verbose else 4)


#: Options of the whole program, accepted after the command name too (`onnxmlu fuse ... --debug`).
GLOBAL_FLAGS = ("--debug", "--verbose", "-v", "--quiet", "-q")


def command(fn: Callable) -> Callable:
    """Register ``fn`` as a command whose user errors become one line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "quiet" in kwargs:  # -q before the command name (or moved there: hoist_global_flags)
            kwargs["quiet"] = kwargs["quiet"] or _state["quiet"]
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
            text = runtime_message(exc)  # onnxruntime's framing dropped, cut; --debug has it whole
            _fail(f"{type(exc).__name__}: {text} (rerun with --debug for the traceback)")

    return app.command(cls=_Command)(wrapper)


def _fail(message: str, code: int = 2) -> None:
    if _state["debug"] and sys.exc_info()[0] is not None:
        raise
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _talk(quiet: bool, json_out: Optional[Path]) -> bool:
    """Whether to print human-readable output: not with --quiet, nor when --json - owns stdout."""
    return not quiet and str(json_out) != "-"


def _deliver(command: str, report, json_out: Optional[Path], quiet: bool, show: Callable | None = None) -> None:
    """Print ``report`` with ``show`` (unless quiet or ``--json -``), then write its JSON."""
    if show is not None and _talk(quiet, json_out):
        show(report)
    _emit_json(json_out, report.to_dict() if command is None else _tagged(command, report.to_dict()))


def _tagged(command: str, payload: dict) -> dict:
    return optional_import("onnxmlu.api").tagged(command, payload)


def _emit_json(target: Optional[Path], payload: dict) -> None:
    if target is None:
        return
    text = json.dumps(payload, indent=2, default=float) + "\n"
    if str(target) == "-":
        sys.stdout.write(text)
    else:
        optional_import("onnxmlu.api").write_bytes_atomic(text.encode(), target)  # never half-written


class Steps:
    """A progress display (:class:`onnxmlu.pipeline.Progress`): ``say`` names the step now
    running, ``total`` and ``advance`` count its work. With ``tally`` the count shows after the
    step, ``3/12 · ETA 0:42`` (``total(0)``: a count with no end known, ``3 so far``); without,
    a bar does. Without a display (``--quiet``) they do nothing."""

    def __init__(self, progress=None, task=None, tally: bool = True, clock=time.monotonic) -> None:
        self._progress, self._task, self._tally = progress, task, tally
        self._text, self._count = "", Tally(clock)

    def say(self, text: str) -> None:
        self._text = text
        self._count.stop()  # a new step: its own count, if it has one
        self._show()

    def total(self, units: int) -> None:
        self._count.start(units)
        if self._progress is not None:
            self._progress.update(self._task, total=units or None, completed=0)
        self._show()

    def advance(self, units: int = 1) -> None:
        self._count.add(units)
        if self._progress is not None:
            self._progress.advance(self._task, units)
        self._show()

    def _show(self) -> None:
        if self._progress is not None:  # every step shows
            self._progress.update(self._task, description=escape(self._text + self.count_text()), refresh=True)

    def count_text(self) -> str:
        """`` · 3/12 · ETA 0:42`` (the mean pace so far), `` · 3 so far``, or "" (no count)."""
        return self._count.text() if self._tally else ""


@contextmanager
def _steps(quiet: bool, bar: bool = False) -> Iterator[Steps]:
    """A spinner, the current step and the elapsed time on stderr; with ``bar`` also a bar.

    Transient (gone when done), hidden by --quiet, and drawn only on an interactive terminal
    (on a file or pipe rich would draw nothing but still end with a blank line)."""
    if quiet or not err_console.is_interactive:
        yield Steps()
        return
    live = optional_import("rich.progress")
    columns = [live.BarColumn(), live.MofNCompleteColumn()] if bar else []
    with live.Progress(live.SpinnerColumn(), live.TextColumn("{task.description}"), *columns, live.TimeElapsedColumn(),
                       console=err_console, transient=True, redirect_stdout=False, redirect_stderr=False) as progress:
        yield Steps(progress, progress.add_task("", total=None), tally=not bar)


#: The narrowest a name column is cut to (in the middle: ``/layer2/…/Conv``) before the table
#: goes over the terminal's width instead.
_MIN_NAME = 12


def _fit(table: Table, refit: dict[str, Callable[[int, int], str]] | None = None) -> Table:
    """``table`` fitted to the terminal: numbers (right-aligned columns) are never cut; when the
    cells are wider than the terminal the borders go (one space between columns), headers wrap at
    their words, and the widest text columns are abbreviated in the middle (``/layer2/…/Conv``:
    a torch name's ends tell layers apart, its start alone does not). ``refit``: a text column
    whose cells hold counts (header -> ``(row, width) -> cell``) is written again at its width."""
    cells = [[Text.from_markup(c) if isinstance(c, str) else c for c in col.cells] for col in table.columns]
    widths = [max([len(c.plain) for c in col] or [0]) for col in cells]
    heads = [max([len(w) for w in str(c.header).split()] or [1]) for c in table.columns]
    widths = [max(w, h) for w, h in zip(widths, heads)]
    whole = [max(w, len(str(c.header))) for w, c in zip(widths, table.columns)]  # headers unwrapped, as rich lays them
    if sum(whole) + 3 * len(whole) + 1 <= console.width:
        return table
    fitted = Table(title=table.title, caption=table.caption, box=box.SIMPLE_HEAD, padding=(0, 0), show_edge=False)
    over = sum(widths) + len(widths) - 1 - console.width
    for i in sorted(range(len(widths)), key=lambda i: -widths[i]):
        if over > 0 and table.columns[i].justify != "right" and widths[i] > _MIN_NAME:
            cut = min(over, widths[i] - max(_MIN_NAME, heads[i]))
            widths[i], over = widths[i] - cut, over - cut
    for column, width in zip(table.columns, widths):
        fitted.add_column(column.header, justify=column.justify, width=width, overflow="fold")
    refit = refit or {}
    for k, row in enumerate(zip(*cells)):
        fitted.add_row(*(Text(refit[str(col.header)](k, w)) if str(col.header) in refit else _middle(c, w)
                         for c, w, col in zip(row, widths, table.columns)))
    return fitted


def _middle(text: Text, width: int) -> Text:
    """``text`` cut to ``width`` in the middle, an ellipsis where it was cut; ``first → last``
    each side in its own middle, so the arrow stays."""
    plain = text.plain
    if len(plain) <= width:
        return text
    first, arrow, last = plain.partition(" → ")
    if arrow and width >= 2 * 3 + len(arrow):
        side = (width - len(arrow)) // 2
        return Text(_cut(first, side) + arrow + _cut(last, width - len(arrow) - side), style=text.style)
    return Text(_cut(plain, width), style=text.style)


def _cut(plain: str, width: int) -> str:
    if len(plain) <= width:
        return plain
    head = (width - 1) // 2
    return plain[:head] + "…" + plain[len(plain) - (width - 1 - head):]


def _shapes(specs: Optional[List[str]]):
    return optional_import("onnxmlu.api").parse_input_shapes(specs or [])


def _arrays(path: Path | None) -> dict | None:
    """The arrays of an .npz file by name (--inputs)."""
    return None if path is None else optional_import("onnxmlu.tools.run").load_feeds(path)


def _plain(text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


OutputArg = Annotated[Path, typer.Argument(help="Where to write the result.", show_default=False)]
_BN_HELP = f"BatchNormalization rewrite: {' or '.join(BN_MODES)} (substitute: norm + Mul + Add)"
BnOpt = Annotated[str, typer.Option("--bn", help=f"{_BN_HELP}.")]
FuseBnOpt = Annotated[Optional[str], typer.Option(
    "--bn", help=f"{_BN_HELP} [default: fold under --precision int8/auto, else substitute].", show_default=False)]


# ---- flag groups: each makes one option object ---------------------------------------------
def flag_groups(**groups) -> Callable[[Callable], Callable]:
    """A command whose parameters named in ``groups`` are flag groups. Each group is a function
    whose parameters are its flags (declared there, once) and which returns the option object
    they make; in the signature typer reads, the command's parameter is replaced by the group's
    flags, and the command is called with the object. ``(function, "name", ...)``: the group
    without those flags on this command (they keep the function's defaults). A flag two groups
    of a command declare (``--inputs``) is one flag, given to both."""
    def decorate(fn: Callable) -> Callable:
        params = inspect_module.signature(fn, eval_str=True).parameters.values()
        own = [p.name for p in params if p.name not in groups]
        members, spliced = {}, {}
        for p in params:
            flags = [p] if p.name not in groups else _group_flags(*_group(groups[p.name]))
            members.update({p.name: [q.name for q in flags]} if p.name in groups else {})
            spliced.update({q.name: q for q in flags if q.name not in spliced})

        @functools.wraps(fn)
        def wrapper(**kwargs):
            made = {name: _group(groups[name])[0](**{flag: kwargs[flag] for flag in flags})
                    for name, flags in members.items()}
            return fn(**{name: kwargs[name] for name in own}, **made)

        wrapper.__signature__ = inspect_module.Signature(list(spliced.values()))
        wrapper.__annotations__ = {name: q.annotation for name, q in spliced.items()}
        return wrapper
    return decorate


def _group(spec) -> tuple:
    return spec if isinstance(spec, tuple) else (spec,)


def _group_flags(make: Callable, *without: str) -> list[inspect_module.Parameter]:
    return [q for q in inspect_module.signature(make, eval_str=True).parameters.values() if q.name not in without]


def _api():
    return optional_import("onnxmlu.api")


def plan_flags(strategy: StrategyOpt = "dlfusion", mp: MpOpt = None, plan: PlanOpt = None, hardware: HwOpt = "mlu100"):
    """--strategy, --mp, --plan, --hw: a :class:`~onnxmlu.options.PlanOptions`."""
    return _api().PlanOptions.of(**locals())


def shape_flags(input_shape: InputShapeOpt = None, max_memory: MaxMemoryOpt = None, inputs: InputsOpt = None):
    """--input-shape, --max-memory, --inputs (a .npz: arrays the shape probe runs; a folder is
    --check's samples): a :class:`~onnxmlu.options.ShapeOptions`."""
    arrays = None if inputs is None or inputs.is_dir() else _arrays(inputs)
    return _api().ShapeOptions(_shapes(input_shape), arrays, max_memory)


def rewrite_flags(bn: FuseBnOpt = None):
    """--bn: a :class:`~onnxmlu.options.RewriteOptions`."""
    return _api().RewriteOptions(bn_mode=bn)


def precision_flags(precision: PrecisionOpt = None, calibration: CalibrationOpt = None,
                    validation: ValidationOpt = None, keep_fp32: KeepFp32Opt = None, metric: MetricOpt = None,
                    calibrator: CalibratorOpt = "minmax", accuracy: AccuracyOpt = None):
    """--precision and what it takes: a :class:`~onnxmlu.options.PrecisionOptions` (its keywords
    are these flags' names)."""
    return _api().PrecisionOptions.of(**locals())


def output_flags(check: CheckOpt = False, allow_nan: AllowNanOpt = False, best_effort: BestEffortOpt = False,
                 inputs: InputsOpt = None, portable: PortableOpt = False):
    """--check (its data: --inputs as a folder of samples, or a .npz of fixed arrays; --allow-nan),
    --best-effort, --portable: ``fuse``'s :class:`~onnxmlu.options.OutputOptions`."""
    checked = None
    if check:
        folder = inputs is not None and inputs.is_dir()
        checked = _api().CheckOptions(inputs=None if folder else _arrays(inputs), samples=inputs if folder else None,
                                      allow_nan=allow_nan)
    return _api().OutputOptions(portable, checked, best_effort)


# ---- commands -----------------------------------------------------------------------------
@command
@flag_groups(plan=plan_flags, shapes=shape_flags, rewrite=rewrite_flags, precision=precision_flags,
             written=output_flags)
def fuse(model: ModelArg, output: OutputArg, plan, shapes, rewrite, precision, written, json_out: JsonOpt = None,
         quiet: QuietOpt = False) -> None:
    """Rewrite, plan and collapse MODEL into OUTPUT (one MLUFusionBlock per block).

    Example: onnxmlu fuse resnet18.onnx resnet18.fused.onnx --precision auto --accuracy cosine>=0.999"""
    api = _api()
    options = api.Options(shapes, rewrite, plan, precision)
    with _steps(quiet) as steps:
        result = api.fuse_to_file(model, output, options, written, progress=steps)
    _deliver_fuse(result, json_out, quiet, written)


def _deliver_fuse(result, json_out: Optional[Path], quiet: bool, written) -> None:
    """The report; exit code 1 (nothing written) when the check failed or auto's budget was
    not met without --best-effort."""
    passed = _api().fuse_passed(result, written.best_effort)
    _deliver("fuse", result, json_out, quiet, lambda r: _show_fuse(r, written.portable, passed))
    if not passed:
        why = "the check failed" if result.check is not None and not result.check.ok else \
            f"--precision auto's budget {result.auto.budget} is not met; --best-effort keeps the closest plan"
        _fail(f"{result.output} not written: {why}", code=1)


def _show_fuse(result, portable: bool, passed: bool = True) -> None:
    _show_blocks(result)
    _show_pricing(result.pricing)
    _show_diagnostics(result.diagnostics, result.analysis)
    note = " as ONNX functions, no custom-op library needed" if portable else ""
    _show_branches(result.branches)
    _show_coverage(result.coverage)
    inside = sum(_count_blocks(result.branches))
    inside_note = f" + {inside} inside control flow" if inside else ""
    if passed:
        console.print(f"wrote {result.output} ({plural(len(result.plan.blocks), 'block')}{inside_note}{note}, "
                      f"{sum(result.pass_seconds.values()):.2f} s)")
    if result.calibration is not None and not result.calibration["random"]:  # random: a diagnostic says so
        _plain(f"INT8 blocks calibrated on {result.calibration['description']} ({result.calibration['calibrator']})")
    _show_auto(result.auto)
    _show_profile(result.profile, result.plan.strategy)
    if result.check is not None:
        _show_check(result.check)


def _show_branches(branches, depth: int = 0) -> None:
    """One line per subgraph whose blocks were planned, nested ones indented below it."""
    for b in branches:
        runs = "runs unknown" if b.runs is None else f"runs {b.runs}×"
        _plain(f"{'  ' * depth}inside {b.key} ({b.op_type}, {runs} per run of its graph): "
               f"{plural(len(b.plan.blocks), 'block')}, {b.sim_latency_us:,.1f} µs simulated per run")
        _show_branches(b.branches, depth + 1)


def _count_blocks(branches):
    for b in branches:
        yield len(b.plan.blocks)
        yield from _count_blocks(b.branches)


def _show_profile(profile, strategy: str = "the strategy") -> None:
    """The plan's simulated latency at min, opt and max of the --input-shape ranges; the
    blocks whose best MP moves across them (:meth:`~onnxmlu.plan.profile.BlockAcross.sentence`)."""
    if profile is None:
        return
    _plain(f"over the input ranges: {latency_text(profile.latency_us)}")
    for b in (b for b in profile.blocks if b.mp_moves):
        _plain(f"  {b.sentence(strategy)}")


def _show_coverage(coverage) -> None:
    """One line of shares (:meth:`~onnxmlu.analyze.coverage.Coverage.summary`), then each
    heavy node left on the host with its reason."""
    _plain(f"coverage: {coverage.summary()}")
    for row in coverage.heavy_on_host[:_MAX_HEAVY_SHOWN]:
        where = f" in {row['graph']}" if row["graph"] else ""
        _plain(f"heavy on host: {row['node']} ({row['op_type']}){where}: {row['reason']}")
    if len(coverage.heavy_on_host) > _MAX_HEAVY_SHOWN:
        _plain(f"... and {len(coverage.heavy_on_host) - _MAX_HEAVY_SHOWN} more (--json lists them all)")


_MAX_HEAVY_SHOWN = 10


def _show_auto(auto) -> None:
    """One line: the budget, met or not, measured and estimated; the speed-up it bought."""
    if auto is None:
        return
    metric, evaluator = auto.budget.metric, auto.evaluator
    verdict = "met" if auto.budget.met(auto.chosen.measured) else "NOT met"
    where = "held-out" if evaluator.held_out else "in-sample"
    inside = "" if auto.in_sample is None or not evaluator.held_out else \
        f", in-sample {auto.in_sample.value(metric):.6f} on {plural(len(evaluator.calibration), 'calibration sample')}"
    bound = auto.chosen.measured.top1_bound()
    bound = f" (95 % lower bound {bound:.4f})" if metric == "top1" and not math.isnan(bound) else ""
    guess = auto.chosen.estimated.value(metric)
    guess = "" if math.isnan(guess) else f"; estimated {guess:.6f}"  # a user metric has no estimate
    _plain(f"auto: {auto.budget} {verdict}: {where} {auto.chosen.measured.value(metric):.6f}{bound} on "
           f"{plural(len(evaluator.validation), 'sample')}{inside}{guess}; "
           f"{auto.speedup:.2f}x the FP32 optimum ({auto.chosen.latency_us:,.0f} vs {auto.fp32_latency_us:,.0f} µs "
           f"simulated); {plural(len(auto.candidates), 'plan')} considered, {plural(auto.evaluator.runs, 'run')}, "
           f"{auto.seconds:.1f} s")
    if auto.rule:
        _plain(f"auto: judged on {auto.rule}")
    if auto.evaluator.calibration.random:
        _plain("auto: measured on seeded random samples, not the model's data: give --calibration DIR")


def _op_summary(counts: dict, keep: int = 3, width: int | None = None) -> str:
    """'Conv×8 Relu×8 Add×3 +2' — the most frequent op types of a block. Within ``width``: fewer
    types and a larger ``+N``, then the one type's name cut in the middle; never a count."""
    items = [f"{op}×{n}" if n > 1 else op for op, n in list(counts.items())[:keep]]
    if not items:
        return ""
    for shown in range(len(items), 0, -1):
        text = " ".join(items[:shown]) + (f" +{len(counts) - shown}" if len(counts) > shown else "")
        if width is None or len(text) <= width:
            return text
    (op, n), more = next(iter(counts.items())), f" +{len(counts) - 1}" if len(counts) > 1 else ""
    tail = (f"×{n}" if n > 1 else "") + more
    return _cut(op, max(1, width - len(tail))) + tail


def _show_blocks(result) -> None:
    table = Table(title=f"{plural(len(result.plan.blocks), 'block')} · strategy {result.plan.strategy} · "
                        f"{result.hardware.name}")
    for col in ("block", "mp", "precision", "layers", "first → last", "op types", "GOPs", "sim µs"):
        table.add_column(col, justify="right" if col in ("block", "mp", "layers", "GOPs", "sim µs") else "left")
    rows = result.block_rows()
    for row in rows:
        table.add_row(str(row["block"]), str(row["mp"]), row["precision"], str(row["layers"]),
                      f"{row['first']} → {row['last']}",
                      _op_summary(row["op_types"]), f"{row['gops']:.3f}", f"{row['sim_latency_us']:.1f}")
    console.print(_fit(table, {"op types": lambda k, width: _op_summary(rows[k]["op_types"], width=width)}))
    console.print(f"simulated latency {result.sim_latency_us:.1f} µs · {result.sim_fps:.1f} FPS")


def _show_diagnostics(diagnostics, analysis=None) -> None:
    """What the pipeline did not do: a line per diagnostic of normalize, precision (and any
    other stage; operators left in FP32 inside INT8 blocks: the first HOST_LINES), per rewrite
    left undone, then for the nodes left on the host a summary of the reasons and one line per
    node (the first HOST_LINES; --json has all)."""
    float_ops = 0
    for d in diagnostics:
        float_ops += d.rule == "int8-float-op"
        if d.stage == "rewrite":
            _plain(f"{d.rule}: left {d.node!r} alone: {d.message}")
        elif d.stage != "analyze" and (d.rule != "int8-float-op" or float_ops <= HOST_LINES):
            _plain(f"{d.stage}: {d.node + ': ' if d.node else ''}{d.message}")
    if float_ops > HOST_LINES:
        _plain(f"... and {plural(float_ops - HOST_LINES, 'more operator')} in FP32 inside INT8 blocks (all in --json)")
    host = analysis.host_nodes() if analysis is not None else []
    if not host:
        return
    reasons = Counter(row["reason"] for row in host).most_common(3)
    nodes = plural(len(analysis.model.graph.node), "node")
    _plain(f"{len(host)} of {nodes} {noun(len(host), 'runs', 'run')} on the host; most common: "
           + "; ".join(f"{reason} (×{n})" for reason, n in reasons))
    for row in host[:HOST_LINES]:
        _plain(f"host: {row['node']} ({row['op_type']}): {row['reason']}")
    if len(host) > HOST_LINES:
        _plain(f"... and {plural(len(host) - HOST_LINES, 'more host node')} (all of them in --json's host_nodes)")


HOST_LINES = 12


CheckInputsOpt = Annotated[Optional[Path], _option("--inputs", help=(
    "A .npz of arrays by input name (used with every seed), or a folder of samples in the --calibration "
    "layout, run instead of the seeds."))]
CheckAccuracyOpt = Annotated[Optional[str], _option("--accuracy", help=(
    "Judge by a budget instead of --atol/--rtol: cosine>=X or top1>=X (for FP16/INT8 models)."))]


def check_flags(seed: SeedOpt = [0], atol: AtolOpt = 1e-4, rtol: RtolOpt = 1e-4,  # noqa: B006 - typer reads it
                inputs: CheckInputsOpt = None, accuracy: CheckAccuracyOpt = None, qtol: QtolOpt = 2.0,
                allow_nan: AllowNanOpt = False):
    """``check``'s flags: a :class:`~onnxmlu.options.CheckOptions` (--inputs: a .npz of arrays,
    or a folder of samples)."""
    folder = inputs is not None and inputs.is_dir()
    return _api().CheckOptions(tuple(seed), atol, rtol, None if folder else _arrays(inputs), accuracy,
                               inputs if folder else None, qtol, allow_nan)


@command
@flag_groups(checked=check_flags)
def check(original: ModelArg, fused: Annotated[Path, typer.Argument(help="Fused model to verify.", show_default=False)],
          checked, input_shape: InputShapeOpt = None, max_memory: MaxMemoryOpt = None, json_out: JsonOpt = None,
          quiet: QuietOpt = False) -> None:
    """Run ORIGINAL (reference: onnxruntime, optimizations off) and FUSED on seeded inputs at
    several shapes: the --input-shape pins (default: the shapes FUSED records it was planned
    at), the ends of every range, one other batch and one other size of every dim left free;
    --inputs arrays for the inputs it names. A shape the original refuses is skipped. Float
    outputs pass when |a-b| <= atol + rtol*|ref|, quantized ones within --qtol steps of their
    scale; one off that rule downstream of a MatMulNBits that rounds its activations to int8 at
    run time (accuracy_level 4) passes when it is within the original's own rounding (measured
    against the original with float activations). NaN or Inf fails (--allow-nan: unless the
    reference has it at the same places). A shape whose run would exceed --max-memory is
    skipped, or stops the check if it is the first.

    Example: onnxmlu check resnet18.onnx resnet18.fused.onnx --seed 0 --seed 1
    """
    with _steps(quiet) as steps:
        report = _api().check(original, fused, checked, input_shapes=_shapes(input_shape), progress=steps,
                              max_memory=max_memory)
    _deliver("check", report, json_out, quiet, _show_check)
    if not report.ok:
        raise typer.Exit(1)


def _show_check(report) -> None:
    """The table of outputs, each with the rule that judged it (float: atol + rtol·|ref|;
    quantized: steps of its scale), then the shapes run, the accuracy and the verdict."""
    quantized = any(d.step is not None for d in report.diffs)
    title = f"check · {report.data} · atol={report.atol:g} rtol={report.rtol:g}"
    table = Table(title=title + (f" qtol={plural(report.qtol, 'step', spec='g')}" if quantized else ""))
    # A budget decides the verdict (FP16/INT8): the tolerance column is then information, not a
    # verdict, so it must not read like one ("ok NO" above "check passed").
    judged_by_budget = report.budget is not None
    numbers = ("max abs err", "max rel err", *(("max steps",) if quantized else ()))
    for col in ("output", "shape", *numbers, "rule", "within tol" if judged_by_budget else "ok"):
        table.add_column(col, justify="right" if col in numbers else "left")  # _fit never cuts a number
    for d in report.diffs:
        verdict = ("yes" if d.ok else "no") if judged_by_budget else ("[green]yes[/]" if d.ok else "[red]NO[/]")
        if d.nonfinite:  # the whole sentence is on the shape line below
            verdict = "[red]NO[/] (NaN/Inf)" if report.fails_on_nan(d) else "yes (NaN/Inf)"
        steps = () if not quantized else ("–" if d.max_steps is None else f"{d.max_steps:.3g}",)
        table.add_row(d.name, str(list(d.shape)), f"{d.max_abs:.3g}", f"{d.max_rel:.3g}", *steps,
                      escape(d.rule(report)), verdict)
    console.print(_fit(table))
    for run in report.shapes:  # the shapes as the pricing line and the report write them
        shapes = shapes_text(run.shapes) or "scalars only"
        _plain(f"shape {run.label}: {shapes}: {run.status}" + (f" ({run.note})" if run.note else ""))
    if report.accuracy is not None and not any(d.nonfinite for d in report.diffs):  # NaN: no cosine to speak of
        judged = f" · judged by {report.budget}" if report.budget is not None else ""
        top1 = "–" if math.isnan(report.accuracy.top1) else f"{report.accuracy.top1:.3f}"  # no class scores
        _plain(f"worst cosine {report.accuracy.cosine:.6f} · top-1 agreement {top1}{judged}")
    for note in report.notes:
        _plain(f"note: {note}")
    for d in report.diffs:  # the float twin's figures, where it judged an output
        for line in d.twin_lines():
            _plain(line)
    for d in (d for d in report.diffs if d.nonfinite):
        _plain(f"{d.name}: {d.nonfinite}" + ("" if report.fails_on_nan(d) else " (passed: --allow-nan)"))
    if any(report.fails_on_nan(d) for d in report.diffs):
        _plain("NaN/Inf in an output fails the check; --allow-nan passes NaN/Inf the reference has at the same places")
    console.print("[green]check passed[/]" if report.ok else "[red]check FAILED[/]")


@command
def inspect(
    model: ModelArg,
    input_shape: InputShapeOpt = None,
    max_memory: MaxMemoryOpt = None,
    rewrite: Annotated[bool, typer.Option("--rewrite/--no-rewrite", help=(
        f"Rewrite first, as fuse and plan do, so layer indices are the plan's: {rewriter_summary()}. "
        "--no-rewrite: the model as given; a node a rewrite accelerates says so."))] = True,
    json_out: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Print the layer table fuse and plan plan over (topological order, after the rewrites):
    op, GOPs, channels, bytes; and host nodes with their reasons. For a fused model: its
    blocks (mp, precision, layers, simulated µs, body size), host nodes and its metadata.

    Example: onnxmlu inspect resnet18.onnx; onnxmlu inspect resnet18.fused.onnx
    """
    api = optional_import("onnxmlu.api")

    with _steps(quiet) as steps:
        steps.say(f"loading {model.name}")
        proto = api.load_model(model)
        fused = api.inspect_fused(proto)
        if fused is None:
            analysis = api.inspect(proto, input_shapes=_shapes(input_shape), rewrite=rewrite, progress=steps,
                                   max_memory=max_memory)
    if fused is not None:
        _deliver("inspect-fused", fused, json_out, quiet, _show_fused)
        return
    report = api.inspect_report(analysis, _shapes(input_shape))  # fuse's "priced at" line, for the same sizes
    _deliver("inspect", report, json_out, quiet, lambda r: _show_inspect(r, rewrite))


def _show_inspect(report, rewrite: bool) -> None:
    _show_layers(report.analysis, rewrite)
    _show_pricing(report.pricing)


def _show_fused(summary) -> None:
    report = summary.to_dict()
    total = report["sim_latency_us"]
    table = Table(title=plural(len(report['blocks']), "MLUFusionBlock node")
                        + (f" · simulated {total:.1f} µs" if total is not None else ""))
    for col in ("block", "mp", "precision", "layers", "sim µs", "body KB"):
        table.add_column(col, justify="left" if col in ("block", "precision") else "right")
    for b in report["blocks"]:
        sim = "–" if b["sim_latency_us"] is None else f"{b['sim_latency_us']:.1f}"
        table.add_row(b["block"], str(b["mp"]), b["precision"], str(b["layers"]), sim, f"{b['body_bytes'] / 1024:.0f}")
    console.print(_fit(table))
    for h in report["host_nodes"]:
        reason = f": {h['reason']}" if "reason" in h else ""
        console.print(f"host: {h['node']} ({h['op_type']}){reason}", highlight=False)
    _show_pricing(summary.pricing)
    ranges = None if summary.pricing is None else summary.pricing.ranges_text()
    if ranges:  # the line fuse printed, from the record
        _plain(f"over the input ranges: {ranges}")
    for key, value in report["metadata"].items():
        if key.startswith("onnxmlu.") and key != "onnxmlu.pricing_shape":  # shown above, in words
            console.print(f"{key}: {value}", highlight=False, soft_wrap=True)


def _show_pricing(pricing) -> None:
    """Where the plan was priced (``priced at images:1x3x224x224 (default ...)``) and the
    ranges' min/opt/max shapes; for a fused file written before the record, that it has none."""
    if pricing is None:
        _plain("pricing shape: not recorded in this file")
        return
    _plain(pricing.describe())
    if pricing.profile_text():
        _plain(f"input profile: {pricing.profile_text()}")


def _show_layers(analysis, rewritten: bool = True) -> None:
    report = analysis.to_dict()
    raw = "" if rewritten else " · as given, before the rewrites: fuse and plan number the rewritten layers"
    table = Table(title=f"{plural(len(report['layers']), 'accelerator layer')} · {report['total_gops']:.3f} GOPs{raw}")
    for col in ("#", "name", "op", "GOPs", "C in", "C out", "H×W", "in KB", "out KB", "weights KB", "seg"):
        table.add_column(col, justify="left" if col in ("name", "op") else "right")
    for r in report["layers"]:
        table.add_row(str(r["index"]), r["name"], r["op_type"], f"{r['gops']:.4f}", str(r["in_channels"]),
                      str(r["out_channels"]), "×".join(map(str, r["out_hw"])), f"{r['input_bytes'] / 1024:.0f}",
                      f"{r['output_bytes'] / 1024:.0f}", f"{r['weight_bytes'] / 1024:.0f}", str(r["segment"]))
    console.print(_fit(table))
    for h in report["host_nodes"]:
        console.print(f"host: {h['node']} ({h['op_type']}): {h['reason']}")


ReportOutputOpt = Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")]


@command
@flag_groups(plan=(plan_flags, "mp", "plan"), shapes=(shape_flags, "max_memory", "inputs"),
             precision=(precision_flags, "validation", "keep_fp32", "metric", "calibrator"),
             written=(output_flags, "allow_nan", "best_effort", "inputs", "portable"))
def report(model: Annotated[Path, typer.Argument(help="ONNX model, or a fused model.", show_default=False)],
           plan, shapes, precision, written, output: ReportOutputOpt = Path("report.html"),
           quiet: QuietOpt = False) -> None:
    """Write one self-contained HTML page (no network: styles and charts inline) about a model's
    plan -- timeline of blocks, per-block table, host nodes and reasons, coverage, the plans
    --precision auto considered, the check -- or about what a fused model holds.

    Example: onnxmlu report resnet18.onnx -o report.html --check
    """
    api = _api()
    with _steps(quiet) as steps:
        path = api.report(model, output, api.Options(shapes, plan=plan, precision=precision), written, progress=steps)
    if not quiet:
        console.print(f"wrote {path}", highlight=False)


@command
def zoo(
    name: Annotated[str, typer.Argument(help="resnet18, resnet50, vgg19, alexnet, mobilenetv2, lstm; "
                                             "several comma-separated, or 'all'.")],
    output: Annotated[Path, typer.Argument(help="Where to write the model (a folder for several).",
                                           show_default=False)],
    batch: Annotated[str, typer.Option("--batch", help="Batch size, or a name for a symbolic batch.")] = "1",
    seed: Annotated[int, typer.Option("--seed", help="Weight seed.")] = 0,
    json_out: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Build zoo models (real architecture and size, seeded random weights).

    Example: onnxmlu zoo resnet18 resnet18.onnx --batch N; onnxmlu zoo all models/
    """
    api = optional_import("onnxmlu.api")

    names = optional_import("onnxmlu.tools.zoo").zoo_names(name)
    with _steps(quiet or len(names) == 1, bar=True) as steps:
        report = api.build_zoo(names, output, batch=int(batch) if batch.isdigit() else batch, seed=seed, progress=steps)
    _deliver("zoo", report, json_out, quiet, _show_zoo)


def _show_zoo(report) -> None:
    for w in report.models:
        console.print(f"wrote {w['path']} ({w['name']}, batch {w['batch']}, {w['bytes'] / 2**20:.1f} MiB)")


@command
def rewrite(
    model: ModelArg,
    output: OutputArg,
    bn: BnOpt = "substitute",
    only: Annotated[Optional[str], _option("--only",
                                           help=f"Comma-separated subset of {','.join(REWRITER_NAMES)}.")] = None,
    input_shape: InputShapeOpt = None,
    json_out: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Rewrite what the accelerator cannot run into its primitives (no fusion); --only names the rewriters.

    Example: onnxmlu rewrite lstm.onnx lstm.rewritten.onnx --only rnn,gemm
    """
    api = optional_import("onnxmlu.api")

    with _steps(quiet) as steps:
        report = api.rewrite_to_file(model, output, bn_mode=bn, only=only.split(",") if only else None,
                                     input_shapes=_shapes(input_shape), progress=steps)
    _deliver("rewrite", report, json_out, quiet, lambda r: _show_rewrite(r, output))


def _show_rewrite(report, output: Path) -> None:
    for name, count in report.applied.items():
        console.print(f"{name}: rewrote {plural(count, 'node')}")
    _show_diagnostics(report.skipped)
    console.print(f"wrote {output}")


PlanOutputOpt = Annotated[Optional[Path], _option("-o", "--output", help="Write the plan as JSON.")]
PlotOpt = Annotated[Optional[Path], _option("--plot", help="Timeline of blocks, MP and simulated time (PNG).")]


def plan_file_flags(output: PlanOutputOpt = None, plot: PlotOpt = None, pareto: ParetoOpt = None):
    """-o, --plot, --pareto: what ``plan`` writes, a :class:`~onnxmlu.options.PlanFiles`."""
    return _api().PlanFiles.of(**locals())


@command
@flag_groups(files=plan_file_flags, plan=(plan_flags, "plan"), shapes=(shape_flags, "inputs"),
             precision=(precision_flags, "calibrator"))
def plan(model: ModelArg, files, plan, shapes, precision, best_effort: PlanBestEffortOpt = False,
         json_out: JsonOpt = None, quiet: QuietOpt = False) -> None:
    """Plan blocks and MP without collapsing; edit the JSON and pass it to `fuse --plan`.
    With -q and neither -o nor --json, the plan file's JSON goes to stdout.

    Example: onnxmlu plan resnet18.onnx --strategy optimal -o plan.json --plot plan.png
    """
    api = _api()
    options = api.Options(shapes, plan=plan, precision=precision)
    with _steps(quiet) as steps:
        report = api.plan(model, options, files, progress=steps)
    if quiet and files.output is None and json_out is None:
        sys.stdout.write(report.plan_json())
    _deliver("plan", report, json_out, quiet, _show_plan)
    _exit_if_unmet(report.auto, best_effort)


def _exit_if_unmet(auto, best_effort: bool) -> None:
    """Exit code 1 when --precision auto's budget is not met, unless --best-effort."""
    if not best_effort and auto is not None and not auto.budget.met(auto.chosen.measured):
        _fail(f"--precision auto's budget {auto.budget} is not met; --best-effort accepts the closest plan", code=1)


def _show_plan(report) -> None:
    for r in report.rows():  # one line each, wrapped by the terminal: a figure never parts from its unit
        _plain(f"block {r['block']:3d}  mp={r['mp']:2d}  {r['precision']}  layers {r['start']}..{r['stop'] - 1} "
               f"({r['first']} → {r['last']})  {r['sim_latency_us']:9.1f} µs")
    total = report.sim_latency_us
    console.print(f"{plural(len(report.plan.blocks), 'block')} · simulated {total:.1f} µs · {1e6 / total:.1f} FPS")
    _show_pricing(report.pricing)
    _show_auto(report.auto)
    _show_profile(report.profile, report.plan.strategy)


def compare_flags(
    zoo_all: Annotated[bool, typer.Option("--zoo", help="Compare on every zoo CNN.")] = False,
    hw: HwOpt = "mlu100",
    strategies: Annotated[Optional[str], _option("--strategies", help="Comma-separated (default: all).")] = None,
    input_shape: InputShapeOpt = None,
    precision: Annotated[Optional[str], _option("--precision", help=(
        "Comma-separated fp16,int8,auto: a column per precision, each strategy planned and priced at it; "
        "auto: the joint plan under --accuracy (one per network, measured on seeded random samples)."))] = None,
    accuracy: AccuracyOpt = None,
    plot: Annotated[Optional[Path], _option("--plot", help="Grouped bar chart of speedups (PNG).")] = None,
):
    """compare's flags: a :class:`~onnxmlu.options.CompareOptions`."""
    return _api().CompareOptions(zoo_all, _list(strategies) or None, hw, _shapes(input_shape), _list(precision),
                                 accuracy, plot)


@command
@flag_groups(compared=compare_flags)
def compare(
    model: Annotated[Optional[Path], typer.Argument(help="ONNX model (omit with --zoo).", show_default=False)] = None,
    compared=None,
    json_out: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Simulated latency, FPS and speedup over `none` per strategy ([DLFusion] Fig. 10).

    Example: onnxmlu compare --zoo --plot speedup.png
    """
    with _steps(quiet, bar=True) as steps:
        report = _api().compare(model, compared, progress=steps)
    _deliver("compare", report, json_out, quiet, _show_compare)


def _list(text: Optional[str]) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()] if text else []


def _show_compare(report) -> None:
    """One table per network: FP32 latency, FPS, speed-up over `none`, blocks, planning time,
    then per --precision column its latency and speed-up over the FP32 column."""
    for label in report.networks:
        caption = "(×: speed-up over the strategy's fp32 latency)" if report.precisions else None
        table = Table(title=f"{label} on {report.hardware.name}", caption=caption)
        extra = [f"{p} µs" for p in report.precisions]
        for col in ("strategy", "sim latency µs", "FPS", "speedup", "blocks", "plan s", *extra):
            table.add_column(col, justify="left" if col == "strategy" else "right")
        for r in report.rows(label):
            cells = [f"{c['sim_latency_us']:.1f} ({c['speedup_vs_fp32']:.2f}×)" for c in r["precisions"].values()]
            table.add_row(r["strategy"], f"{r['sim_latency_us']:.1f}", f"{r['fps']:.1f}", f"{r['speedup']:.2f}×",
                          str(r["blocks"]), f"{r['plan_seconds']:.3f}", *cells)
        console.print(_fit(table))


hw_app = typer.Typer(help="Hardware profiles of the simulated accelerator.", no_args_is_help=True, cls=_Group)
app.add_typer(hw_app, name="hw")


@hw_app.command("list", cls=_Command)
def hw_list() -> None:
    """List the built-in hardware profiles. Example: onnxmlu hw list"""
    api = optional_import("onnxmlu.api")

    for hw in api.hardware_profiles():
        console.print(f"{hw.name:10s} {hw.cores:3d} {noun(hw.cores, 'core'):5s}  {hw.description}")


@hw_app.command("show", cls=_Command)
def hw_show(name: Annotated[str, typer.Argument(help="Profile name or JSON file.")] = "mlu100") -> None:
    """Print a hardware profile as JSON. Example: onnxmlu hw show mlu100"""
    try:
        hw = optional_import("onnxmlu.api").load_hardware(name)
    except OnnxMluError as exc:
        _fail(str(exc))
    sys.stdout.write(json.dumps(hw.to_dict(), indent=2) + "\n")


@command
def run(
    model: ModelArg,
    inputs: Annotated[Optional[Path], _option("--inputs", help="Feeds as .npz (default: seeded random).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for random inputs.")] = 0,
    input_shape: InputShapeOpt = None,
    repeat: Annotated[int, typer.Option("--repeat", help="Timed runs (median reported).")] = 10,
    profile: Annotated[bool, typer.Option("--profile", help="Per-block measured CPU time vs simulated time.")] = False,
    save: Annotated[Optional[Path], _option("--save", help="Save outputs as .npz.")] = None,
    json_out: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Run any model (fused or not) in onnxruntime with the custom-op library, at the --input-shape
    pins (default: the shapes a fused model records it was planned at).

    Example: onnxmlu run resnet18.fused.onnx --repeat 20 --profile
    """
    api = optional_import("onnxmlu.api")

    with _steps(quiet) as steps:
        report = api.run(model, inputs=_arrays(inputs), seed=seed, input_shapes=_shapes(input_shape), repeat=repeat,
                         profile=profile, save=save, progress=steps)
    _deliver("run", report, json_out, quiet, _show_run)


def _sim_shape_note(report) -> str:
    """Which shapes the simulated columns are for: ``sim µs`` the pricing shape's; at another
    shape ``sim µs here`` re-priced at this run's, where a block could be (FP32 blocks)."""
    pricing = report.pricing
    if pricing is None:
        return "sim µs: no pricing shape recorded in this model"
    if not report.priced_elsewhere:
        return f"sim µs at this run's shape, the pricing shape {pricing.text()}"
    note = (f"sim µs at the pricing shape {pricing.text()}; sim µs here: re-priced at this run's "
            f"{report.run_shape_text()}")
    blocks = [p for p in report.profile if p.mp is not None]
    if any(p.sim_here_us is None for p in blocks):
        note += " (FP16/INT8 blocks are not re-priced: '–'; fuse with --input-shape to price them there)"
    return note


def _show_run(report) -> None:
    for s in report.outputs:
        stats = "  ".join(f"{k}={s[k]:.4g}" for k in ("mean", "std", "min", "max") if k in s)
        console.print(f"{s['name']}: {s['dtype']}{s['shape']}  {stats}")
    t = report.latency_ms
    console.print(f"latency: median {t.median_ms:.2f} ms (min {t.min_ms:.2f}, max {t.max_ms:.2f}, "
                  f"{plural(t.runs, 'run')})")
    if report.profile is not None:
        console.print(_fit(_profile_table(report)))
        made = [p.name for p in report.profile if p.from_optimizer]
        if made:
            _plain(f"not in the file: {', '.join(made)}: onnxruntime's graph optimizer made "
                   f"{noun(len(made), 'this node', 'these nodes')} in the session; the nodes replaced have no row")
    if report.thread_note:
        _plain(f"threads: {report.thread_note}")  # one line, as the other notes: the terminal wraps it


def _profile_table(report) -> Table:
    """Per node: measured CPU µs, simulated µs at the pricing shape and, at another shape, here."""
    here = report.priced_elsewhere
    table = Table(title="per-node CPU time (onnxruntime profiler) vs simulated accelerator",
                  caption=_sim_shape_note(report))
    for col in ("node", "op", "mp", "precision", "CPU µs", "sim µs", *(("sim µs here",) if here else ())):
        table.add_column(col, justify="left" if col in ("node", "op", "precision") else "right")
    for p in report.profile:
        cells = [_us(p.sim_latency_us, p.mp is not None), *((_us(p.sim_here_us, p.mp is not None),) if here else ())]
        table.add_row(p.name, p.op_type, str(p.mp or ""), p.precision or "", f"{p.measured_us:.1f}", *cells)
    totals = [sum(p.sim_latency_us or 0 for p in report.profile)]
    if here:
        blocks = [p for p in report.profile if p.mp is not None]
        totals.append(None if any(p.sim_here_us is None for p in blocks) else sum(p.sim_here_us for p in blocks))
    table.add_row("total", "", "", "", f"{sum(p.measured_us for p in report.profile):.1f}",
                  *(_us(t, True) for t in totals))
    return table


def _us(value, block: bool = True) -> str:
    """A simulated time cell: the value, '–' for a block not priced, '' for a host node."""
    return f"{value:.1f}" if value is not None else ("–" if block else "")


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
    api = optional_import("onnxmlu.api")

    api.view(model, explode=explode_blocks, port=port, browse=not no_browser,
             announce=lambda: console.print(f"exploded view of {model} (blocks as ONNX functions), served from memory"))


def main() -> None:
    app(args=hoist_global_flags(sys.argv[1:]))


def hoist_global_flags(args: list[str]) -> list[str]:
    """``args`` with the program's own flags (:data:`GLOBAL_FLAGS`) moved before the command
    name, wherever they were given (up to a ``--``), so every command accepts them."""
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if a in GLOBAL_FLAGS]
    return flags + [a for a in args[:end] if a not in GLOBAL_FLAGS] + args[end:]


if __name__ == "__main__":
    main()
