"""The `zplan` command line: a thin typer layer over the planner library.

Exit codes (the contract `zplan check` in CI relies on; `EXIT_*` in `commands/_common.py`):
0 fits / success, 1 does not fit, 2 bad input (one line on stderr, nothing written),
3 internal error (a bug: one line, `--debug` or ZPLAN_DEBUG=1 for the traceback),
4 output could not be written (full disk, closed stdout, no permission). Nothing else exits 1.

Results go to stdout (tables for people, `--json`/`--csv` for machines); progress and diagnostics
to stderr. Commands are imported only when invoked (`COMMANDS`), so `zplan check` does not pay
for importing the sweep or the calibration harness, and `zplan --help` imports none of them.
"""

from __future__ import annotations

import errno
import gc
import importlib
import os
import sys
from typing import Any, NamedTuple

import typer
from typer.core import TyperCommand, TyperGroup

try:  # typer >= 0.2x vendors click as typer._click; older typer uses click itself
    from typer import _click as click
except ImportError:  # pragma: no cover - depends on the installed typer
    import click

click_exceptions = click.exceptions

from planner.cli.coerce import fast_params
from planner.cli.commands._common import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_OUTPUT,
    ISSUES,
    say,
)


class Command(NamedTuple):
    module: str
    short_help: str
    """The first paragraph of the command's docstring (tests/test_cli_conventions.py checks it)."""


COMMANDS: dict[str, Command] = {
    "fit": Command("planner.cli.commands.fit_cmd",
                   "Does MODEL fit on CLUSTER? Per-stage GPU memory, CPU/NVMe per node, and the verdict."),
    "presets": Command("planner.cli.commands.fit_cmd",
                       "List the shipped (and your --profiles) models, GPUs, nodes and clusters."),
    "show": Command("planner.cli.commands.fit_cmd",
                    "A model's exact parameter breakdown and its FLOPs per token."),
    "check": Command("planner.cli.commands.check_cmd",
                     "Does this job fit? `zplan check JOB.yaml`, `--deepspeed ds.json --model M "
                     "--cluster C`, or `--megatron-args FILE --cluster C`. Prints one verdict line."),
    "sweep": Command("planner.cli.commands.sweep_cmd",
                     "Rank every parallel layout (tp, pp, dp, ZeRO, offload, recompute, micro-batch) "
                     "by estimated step time; show why the attractive ones that do not fit are rejected."),
    "calibrate": Command("planner.cli.commands.calibrate_cmd",
                         "Train a (scaled-down) model for a few steps with real PyTorch and report "
                         "predicted vs measured: parameters, model-state bytes, saved activations, "
                         "FLOPs, step time."),
    "export": Command("planner.cli.commands.export_cmd",
                      "Write a layout as a DeepSpeed config, a Megatron-LM launch line, an accelerate "
                      "FSDP2 config or a torchrun line. The layout comes from --job, from layout "
                      "flags, or is the best one the search finds. The verdict line goes to stderr; "
                      "exit 0 fits, 1 does not, 2 bad input."),
    "infer": Command("planner.cli.commands.infer_cmd",
                     "Inference memory per GPU (weights, KV cache, activation peak, runtime reserve), "
                     "the largest batch and context that fit, the smallest tp, and roofline bounds on "
                     "time-to-first-token and tokens/s."),
    "budget": Command("planner.cli.commands.infer_cmd", "Compute budget and Chinchilla scaling law."),
}


def load_command(name: str) -> Any:
    """The click command `name`, importing only its module."""
    module = importlib.import_module(COMMANDS[name].module)
    holder = typer.Typer(rich_markup_mode=None)
    module.register(holder)
    built = typer.main.get_command(holder)
    command = built.commands[name] if isinstance(built, TyperGroup) else built
    command.short_help = COMMANDS[name].short_help
    return fast_params(command)


class _LazyGroup(TyperGroup):
    """Commands imported on first use; the command list in `--help` comes from `COMMANDS`."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*COMMANDS, *super().list_commands(ctx)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in COMMANDS:
            if getattr(self, "_listing", False):  # help listing: name and short help only
                return TyperCommand(name=cmd_name, short_help=COMMANDS[cmd_name].short_help)
            return load_command(cmd_name)
        return super().get_command(ctx, cmd_name)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        fast_params(self)  # the root options (--debug, completion) convert without pydantic too
        return super().parse_args(ctx, args)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="zplan",
    cls=_LazyGroup,
    help="Plan memory, compute and bandwidth for training large transformers.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: every `[default: ...]` shows, no rich import
)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="On an internal error, print the traceback "
                                                      "(also: environment ZPLAN_DEBUG=1)."),
) -> None:
    """Plan memory, compute and bandwidth for training large transformers.

    Exit codes: 0 fits / success, 1 does not fit, 2 bad input, 3 internal error (a bug),
    4 output could not be written.
    """


@app.command()
def version() -> None:
    """Print zplan's version."""
    from planner import __version__

    print(__version__)


def _debug(argv: list[str]) -> bool:
    """`zplan --debug ...` (before the command name) or ZPLAN_DEBUG=1."""
    if os.environ.get("ZPLAN_DEBUG", "") not in ("", "0"):
        return True
    for arg in argv:
        if not arg.startswith("-"):
            return False
        if arg == "--debug":
            return True
    return False


def _quiet_stdout() -> None:
    """Point fd 1 at /dev/null so Python's exit-time flush cannot print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, AttributeError, ValueError):
        pass


def _run(argv: list[str]) -> int:
    """Run the app; usage errors become one line and exit 2."""
    try:
        code = app(args=argv, standalone_mode=False)
    except SystemExit as stop:
        if stop.code == 1 and isinstance(sys.stdout, click.utils.PacifyFlushWrapper):
            # typer's answer to a closed pipe (EPIPE) while a command or the help wrote: it wraps
            # stdout so nothing more is flushed and exits 1 (typer/core.py `_main`, as click
            # does), which a CI gate reads as "does not fit"; `main` makes it exit 4
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE)) from None
        raise
    except typer.Abort:
        say("zplan: aborted")
        return EXIT_BAD_INPUT
    except click_exceptions.NoArgsIsHelpError as err:
        say(err.format_message())  # the help text: a usage error, exit 2
        return EXIT_BAD_INPUT
    except click_exceptions.UsageError as err:
        hint = f" ({err.ctx.command_path})" if err.ctx is not None else ""
        say(f"zplan: error: {err.format_message()}{hint}")
        return EXIT_BAD_INPUT
    except click_exceptions.ClickException as err:
        say(f"zplan: error: {err.format_message()}")
        return EXIT_BAD_INPUT
    sys.stdout.flush()  # a full disk or a closed pipe shows here, inside the handlers of main
    return code if isinstance(code, int) else 0


def _os_message(err: OSError) -> str:
    """One line for an OS refusal; `OutputError`s already name the file."""
    from planner.io.safe_write import OutputError, describe_os_error

    if isinstance(err, OutputError):
        return str(err.strerror)
    where = f"{err.filename}: " if err.filename else ""
    return f"cannot write output: {where}{describe_os_error(err)}"


TORCH_COMMANDS = frozenset({"calibrate"})
"""The commands that run torch (planner.calibrate); every other command runs numpy only."""


def runs_torch(argv: list[str]) -> bool:
    """True when the command of `argv` (its first word that is not an option) runs torch."""
    return next((arg for arg in argv if not arg.startswith("-")), None) in TORCH_COMMANDS


def numpy_command_settings(argv: list[str]) -> bool:
    """Settle the process for a command that runs numpy only (every command but `calibrate`);
    True if it did. docs/cli_latency.md gives the measurements.

    - OPENBLAS_NUM_THREADS=1, before numpy is imported. The planner calls no BLAS routine (no
      matmul, no linalg outside planner.calibrate), but OpenBLAS starts a worker thread per core
      when it loads, and the workers spin while the main thread imports: `import numpy` took
      0.10 s CPU with them and 0.05-0.06 s without on the 2-core machine of the benchmark.
      Set only when the user has not set it.
    - No cyclic garbage collection (`gc.disable()`; reference counting still frees every object
      not in a cycle, and the planner's work makes few cycles: the largest sweep's peak memory
      is the same either way). Importing creates many container objects and the collector's
      passes over them cost `fit` some 10 ms; at exit the objects are frozen (`gc.freeze()`,
      in `main`) so that the interpreter's shutdown does not traverse them all again (some
      30 ms).

    - PYDANTIC_DISABLE_PLUGINS=__all__: pydantic looks for plugins (observability hooks such as
      logfire's) in the entry points of every installed distribution when it builds its first
      validator, some 2.6 ms in the development environment of the benchmark; zplan's own
      input models are not meant to be reported to them. Set only when the user has not set it.

    Not for `calibrate`: the thread count would reach every BLAS the process and its rank
    processes load (OpenBLAS-based torch builds would time their CPU GEMMs on one thread), and
    its torch training steps make reference cycles that hold tensors (FSDP2 among them)."""
    if runs_torch(argv):
        return False
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    gc.disable()
    return True


def main(argv: list[str] | None = None) -> None:
    """Run one command: the exit-code contract above, never a bare traceback; ends with
    SystemExit (the console script is `console`)."""
    args = sys.argv[1:] if argv is None else argv
    numpy_only = numpy_command_settings(args)
    try:
        _main(args)
    finally:
        if numpy_only:  # shutdown need not traverse every object; a caller of main() that
            gc.freeze()  # catches SystemExit gets its collector back
            gc.enable()


def console() -> None:
    """The `zplan` console script and `python -m planner`: `main`; then a numpy-only command's
    process ends with `os._exit` once stdout and stderr are flushed, without the interpreter's
    teardown of every module and object it loaded (some 5 ms of `zplan fit`'s 0.2 s;
    docs/cli_latency.md). Nothing is skipped that matters: these commands register no exit
    handler and leave no thread running (tests/test_cli_lazy.py checks both), and every file
    they write is complete and renamed into place before `main` returns. `calibrate` exits the
    ordinary way (torch's exit handlers run). `main` itself never ends the process: tests and
    other callers catch its SystemExit."""
    args = sys.argv[1:]
    try:
        main(args)
    except SystemExit as done:
        if runs_torch(args) or not isinstance(done.code, int):
            raise
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):  # closed or None: already reported
                pass
        os._exit(done.code)


def _main(args: list[str]) -> None:
    """Run the command; every way out is `sys.exit` with a code of the contract above."""
    if sys.stdout is None:  # started with fd 1 closed (`zplan ... >&-`)
        say("zplan: error: standard output is closed; redirect it (e.g. > /dev/null)")
        sys.exit(EXIT_OUTPUT)
    try:
        sys.exit(_run(args))
    except SystemExit:
        raise
    except KeyboardInterrupt:
        say("zplan: interrupted")
        sys.exit(130)
    except BrokenPipeError:
        _quiet_stdout()
        say("zplan: error: standard output was closed before the result was written")
        sys.exit(EXIT_OUTPUT)
    except OSError as err:  # writing stdout or a file: full disk, permissions
        _quiet_stdout()
        say(f"zplan: error: {_os_message(err)}")
        sys.exit(EXIT_OUTPUT)
    except Exception as err:  # noqa: BLE001 - the contract: a bug is exit 3, not "does not fit"
        if _debug(args):
            import traceback

            say(traceback.format_exc().rstrip("\n"))
        else:
            say(f"zplan: internal error (a bug in zplan, not in your input): "
                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''} -- "
                f"rerun with --debug (or ZPLAN_DEBUG=1) for the traceback and report it at {ISSUES}")
        sys.exit(EXIT_INTERNAL)
