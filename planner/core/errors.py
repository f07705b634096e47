"""Errors the CLI turns into one clear line and exit code 2.

Every user-facing input problem is a `PlanInputError` naming the field and what is allowed.
pydantic's own `ValidationError` is converted by `format_validation_error`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported lazily: `zplan --help` does not load pydantic
    from pydantic import ValidationError


class PlanInputError(ValueError):
    """Bad user input: `field: message`. The CLI prints it on one line and exits 2."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def format_validation_error(error: ValidationError, prefix: str = "") -> str:
    """One line for a pydantic ValidationError: `field.path: message` for the first error.

    Further errors are counted, not listed, so the line stays one line.
    """
    errors = error.errors()
    first = errors[0]
    # "[key]" is pydantic's marker for a bad dict key: the path before it names the field
    loc = ".".join(str(part) for part in first.get("loc", ()) if part != "[key]")
    field = ".".join(p for p in (prefix, loc) if p) or error.title
    message = first.get("msg", "invalid value")
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    if first.get("type") == "extra_forbidden":
        message = "unknown key (not allowed)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{field}: {message}{more}"
