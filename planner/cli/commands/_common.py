"""Shared command plumbing: the exit codes and turning input errors into one line."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from planner.core.errors import PlanInputError, format_validation_error

EXIT_FITS = 0
"""Success, or the plan fits."""
EXIT_DOES_NOT_FIT = 1
"""The plan was computed and does not fit: an answer, not an error."""
EXIT_BAD_INPUT = 2
"""Bad input: one line `field: message` on stderr, nothing written to stdout or to a file."""
EXIT_INTERNAL = 3
"""A bug in zplan (an unexpected exception): one line on stderr; `--debug` for the traceback."""
EXIT_OUTPUT = 4
"""The result could not be written: full disk, closed stdout, no permission."""

ISSUES = "the zplan issue tracker (include the command line and the input files)"
"""Where the internal-error line tells users to report."""

F = TypeVar("F", bound=Callable[..., Any])


def say(line: str) -> None:
    """One diagnostic line on stderr. When stderr's reader has gone too (`zplan ... 2>&1 | head`)
    nothing more can be said, and the line is dropped: the exit code still tells (before this,
    the failed write itself ended the process with exit 1)."""
    if sys.stderr is None:  # print(file=None) would write to stdout
        return
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def fail(message: str) -> typer.Exit:
    """Print one error line to stderr and return the Exit to raise (code 2)."""
    say(f"zplan: error: {message}")
    return typer.Exit(EXIT_BAD_INPUT)


def input_errors_exit_2(func: F) -> F:
    """Decorator for commands: any input error becomes one stderr line and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except PlanInputError as err:
            raise fail(str(err)) from None
        except (FileNotFoundError, IsADirectoryError, PermissionError) as err:
            if err.filename is None:
                raise
            raise fail(f"{err.filename}: {err.strerror}") from None
        except UnicodeDecodeError as err:
            raise fail(f"input is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start})") from None
        except Exception as err:
            message = _library_input_error(err)
            if message is None:
                raise
            raise fail(message) from None

    return wrapper  # type: ignore[return-value]


def _library_input_error(err: Exception) -> str | None:
    """One line for pydantic's and PyYAML's input errors, else None (a bug: re-raised).

    The two libraries are looked up in sys.modules, not imported: an error of theirs can only
    occur once they are loaded, and `zplan --help` should not pay for importing them."""
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(err, pydantic.ValidationError):
        return format_validation_error(err)
    yaml = sys.modules.get("yaml")
    if yaml is not None and isinstance(err, yaml.YAMLError):
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        return f"malformed YAML{where}: {getattr(err, 'problem', None) or err}"
    return None
