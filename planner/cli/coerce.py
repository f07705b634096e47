"""Option values converted without building a pydantic adapter per option (command latency, issue 9).

typer 0.29 converts every option's value with a pydantic `TypeAdapter` built for that option
(typer/_coercion.py `build_runtime_param`, typer/_adapters.py `build_leaf_adapter`), and builds
it even for options not given: some 4 ms each, 0.16 s for `zplan fit`'s 38 options. `fast_params`
gives each option of a built command a runtime converter that

- returns None / () for an option not given, as typer does, without building anything;
- converts the plain cases itself, with the result typer's adapter gives: a str as itself, a
  decimal integer or float within the option's bounds (`min`/`max`, pydantic's ge/le), a path
  that does not exist or is readable as `Path(value)`, lists of those;
- hands anything else (a sign, an underscore, "inf", a value out of bounds, an unreadable file,
  an option kind not listed) to typer's own converter, built then: every error message and
  every unusual value is typer's.

tests/test_cli_coerce.py checks, option by option over every command, that the two agree on
valid and invalid values. With a typer that converts through click types (before 0.2x) the
commands are left as they are.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, get_args, get_origin

try:  # typer's runtime-conversion layer (0.2x); absent before, then nothing is replaced
    from typer._coercion import RuntimeParam, build_runtime_param
except ImportError:  # pragma: no cover - depends on the installed typer
    RuntimeParam = None  # type: ignore[assignment,misc]

UNSURE = object()
"""A value `fast_value` leaves to typer's converter."""

_INT = re.compile(r"0|[1-9][0-9]{0,17}")
_FLOAT = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,3})?")
_PLAIN_PATH = dict(exists=False, resolve_path=False, path_type=None, file_okay=True, dir_okay=True,
                   writable=False, allow_dash=False)
"""typer's default path settings, the only ones converted here (every zplan path option)."""


def _bounded(number: Any, info: Any) -> Any:
    """The number when within the option's min/max, else UNSURE (typer words the error)."""
    if (info.min is not None and number < info.min) or (info.max is not None and number > info.max):
        return UNSURE
    return number


def _number(annotation: Any, value: Any, info: Any) -> Any:
    """int / float from a decimal string (or the same type), as pydantic's lax mode reads it."""
    if annotation is int:
        if type(value) is int:
            return _bounded(value, info)
        if type(value) is str and _INT.fullmatch(value):
            return _bounded(int(value), info)
        return UNSURE
    if type(value) is float and math.isfinite(value):
        return _bounded(value, info)
    if type(value) is str and _FLOAT.fullmatch(value):
        number = float(value)
        return _bounded(number, info) if math.isfinite(number) else UNSURE
    return UNSURE


def _path(value: Any, info: Any) -> Any:
    """Path(value) for a path that does not exist or is readable (typer/_param_types.py
    `coerce_cli_path` with the default settings)."""
    if type(value) is not str or not value or "\0" in value:
        return UNSURE
    if any(getattr(info, key, None) != want for key, want in _PLAIN_PATH.items()):
        return UNSURE
    path = Path(value)
    if info.readable and os.path.exists(path) and not os.access(path, os.R_OK):
        return UNSURE
    return path


def fast_value(annotation: Any, value: Any, info: Any) -> Any:
    """The converted value, or UNSURE. `info` is typer's ParameterInfo of the option."""
    if info.parser is not None:
        return UNSURE
    if get_origin(annotation) is list:
        (item_type,) = get_args(annotation)
        if not isinstance(value, (list, tuple)):
            return UNSURE
        items = [fast_value(item_type, item, info) for item in value]
        return UNSURE if any(item is UNSURE for item in items) else items
    if annotation is str:
        return value if type(value) is str else UNSURE
    if annotation is bool:
        return value if type(value) is bool else UNSURE
    if annotation is int or annotation is float:
        return _number(annotation, value, info)
    if annotation is Path:
        return _path(value, info)
    return UNSURE


if RuntimeParam is not None:

    class FastRuntimeParam(RuntimeParam):  # type: ignore[misc,valid-type]
        """typer's runtime converter contract, converting plain values without pydantic."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            converted = fast_value(self.annotation, value, self.parameter_info)
            if converted is not UNSURE:
                return converted
            typer_param = build_runtime_param(param.type_descriptor)
            return typer_param._coerce_value(value, param=param, ctx=ctx)


def _install(param: Any) -> None:
    """Give one typer parameter the converter above (other parameters are left alone)."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None and descriptor.file_annotation is None and hasattr(param, "_runtime_param"):
        param._runtime_param = FastRuntimeParam(parameter_info=descriptor.parameter_info,
                                                annotation=descriptor.annotation)


def fast_params(command: Any) -> Any:
    """`command` (and its subcommands) with each typer parameter converting as above; `--help`,
    which click adds when a command first parses, too."""
    if RuntimeParam is None:  # pragma: no cover - older typer converts with click types
        return command
    for param in getattr(command, "params", ()):
        _install(param)
    help_option = getattr(command, "get_help_option", None)
    if help_option is not None and not hasattr(help_option, "fast"):

        def get_help_option(ctx: Any) -> Any:
            option = help_option(ctx)
            if option is not None:
                _install(option)
            return option

        get_help_option.fast = True  # type: ignore[attr-defined]
        command.get_help_option = get_help_option
    for sub in getattr(command, "commands", {}).values():
        fast_params(sub)
    return command
