"""The `zplan` command line: a thin typer layer over the planner library.

Exit codes: 0 success / fits, 1 does not fit, 2 bad input (one line on stderr, no traceback).
Human output goes to stderr, `--json` to stdout.
"""

from __future__ import annotations

import inspect
import sys

import typer

try:  # typer >= 0.2x vendors click as typer._click; older typer uses click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as click_exceptions

from planner.cli.commands import (
    calibrate_cmd,
    check_cmd,
    export_cmd,
    fit_cmd,
    infer_cmd,
    sweep_cmd,
)
from planner.cli.commands._common import EXIT_BAD_INPUT

app = typer.Typer(
    name="zplan",
    help="Plan memory, compute and bandwidth for training large transformers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Plan memory, compute and bandwidth for training large transformers.

    Exit codes: 0 fits / success, 1 does not fit, 2 bad input.
    """


for module in (fit_cmd, check_cmd, sweep_cmd, calibrate_cmd, export_cmd, infer_cmd):
    module.register(app)

for info in app.registered_commands:
    # The command list shows the first paragraph of each docstring as one line.
    if info.short_help is None and info.callback is not None:
        first_paragraph = inspect.getdoc(info.callback).split("\n\n")[0]  # type: ignore[union-attr]
        info.short_help = " ".join(first_paragraph.split())


@app.command()
def version() -> None:
    """Print zplan's version."""
    from planner import __version__

    print(__version__)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point; usage errors become one line and exit code 2."""
    try:
        code = app(args=argv, standalone_mode=False)
    except typer.Abort:
        print("zplan: aborted", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except click_exceptions.NoArgsIsHelpError:
        sys.exit(EXIT_BAD_INPUT)
    except click_exceptions.UsageError as err:
        hint = f" ({err.ctx.command_path})" if err.ctx is not None else ""
        print(f"zplan: error: {err.format_message()}{hint}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except click_exceptions.ClickException as err:
        print(f"zplan: error: {err.format_message()}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    sys.exit(code if isinstance(code, int) else 0)
