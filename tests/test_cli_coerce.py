"""The command line converts option values without a pydantic adapter per option
(planner/cli/coerce.py) and gets exactly what typer's own converter gets: the same value, or the
same error message, for every option of every command, on plain and on awkward values."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from planner.cli import coerce

pytestmark = pytest.mark.skipif(coerce.RuntimeParam is None,
                                reason="this typer converts with click types: nothing replaced")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

SAMPLES: dict[str, list[object]] = {
    "int": ["8", "0", "1", "3", "4", "08", "+8", "-1", "1_0", " 8", "8 ", "1e3", "1.0", "1.5", "abc", "",
            "99999999999999999", "999999999999999999999999", "٣", True, False, 7, -2, 2.0],
    "float": ["300e9", "0.5", ".5", "5.", "1E3", "0001.5", "1e999", "1e-400", "inf", "nan", "-1", "+2",
              "1_000", " 1", "abc", "", "0", "1", "1.0000001", "0.0009", 2.5, 3, float("inf"), float("nan"), True],
    "str": ["gpt3-175b", "", " spaced ", "ünï", b"bytes", 3, None],
    "bool": [True, False, "true", "no", "", 1, 0],
    "Path": [str(EXAMPLES / "job.yaml"), str(EXAMPLES), "no/such/file.yaml", "", "a\0b", "~/x",
             Path("already.yaml"), 3],
}
SAMPLES["list[Path]"] = [(str(EXAMPLES),), (str(EXAMPLES), "missing"), (), "single", ("", "x")]
SAMPLES["list[str]"] = [("a", "b"), (), ("a", 3), "single"]


def _params():
    """(command name, typer parameter) for every option and argument of every command."""
    from planner.cli.app import COMMANDS, app, load_command
    import typer

    found = [("zplan", param) for param in typer.main.get_command(app).params]
    for name in COMMANDS:
        command = load_command(name)
        commands = [command, *getattr(command, "commands", {}).values()]
        found += [(f"{name} {sub.name}", param) for sub in commands for param in sub.params]
    return [(label, param) for label, param in found if hasattr(param, "type_descriptor")]


def _kind(annotation: object) -> str:
    return getattr(annotation, "__name__", None) if isinstance(annotation, type) else str(annotation).replace("pathlib.", "")


def _outcome(convert, value, param):
    """The converted value with its type, or the error's class and message."""
    try:
        result = convert(value, param=param, ctx=None)
    except Exception as err:  # noqa: BLE001 - the error itself is what is compared
        return ("error", type(err).__name__, getattr(err, "message", str(err)))
    return ("value", type(result).__name__, [type(x).__name__ for x in result] if isinstance(result, list) else None,
            result)


def test_every_option_kind_is_sampled():
    kinds = {_kind(param.type_descriptor.annotation) for _, param in _params()}
    assert kinds <= set(SAMPLES), kinds - set(SAMPLES)


def test_fast_conversion_equals_typers_on_every_option():
    from typer._coercion import build_runtime_param

    checked = 0
    for label, param in _params():
        descriptor = param.type_descriptor
        typer_param = build_runtime_param(descriptor)
        fast = coerce.FastRuntimeParam(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation)
        for value in SAMPLES[_kind(descriptor.annotation)]:
            want = _outcome(typer_param._coerce_value, value, param)
            got = _outcome(fast._coerce_value, value, param)
            if want[0] == "value" and isinstance(want[3], float) and want[3] != want[3]:
                assert got[:3] == want[:3] and got[3] != got[3], (label, param.name, value)  # nan
            else:
                assert got == want, (label, param.name, value)
            checked += 1
    assert checked > 1000


def test_the_plain_cases_do_not_fall_back():
    """The point of the module: the values users type are converted without building an adapter."""
    from planner.cli.commands import _options as opt  # noqa: F401 - the options' module loads

    class Info:
        parser = None
        min, max = 1, None
        readable = True
        exists = resolve_path = writable = allow_dash = False
        path_type = None
        file_okay = dir_okay = True

    assert coerce.fast_value(int, "8", Info) == 8
    assert coerce.fast_value(int, "1", Info) == 1                  # the bound itself is allowed (ge)
    assert coerce.fast_value(int, "0", Info) is coerce.UNSURE      # below min: typer words the error
    assert coerce.fast_value(float, "300e9", Info) == 300e9
    assert coerce.fast_value(str, "gpt3-175b", Info) == "gpt3-175b"
    assert coerce.fast_value(Path, "job.yaml", Info) == Path("job.yaml")
    assert coerce.fast_value(list[Path], ("a", "b"), Info) == [Path("a"), Path("b")]
    assert coerce.fast_value(int, "+8", Info) is coerce.UNSURE


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_gets_typers_message(tmp_path):
    from typer._coercion import build_runtime_param

    secret = tmp_path / "secret.yaml"
    secret.write_text("x: 1\n")
    secret.chmod(0)
    for _, param in _params():
        if param.type_descriptor.annotation is Path:
            break
    typer_param = build_runtime_param(param.type_descriptor)
    fast = coerce.FastRuntimeParam(parameter_info=param.type_descriptor.parameter_info, annotation=Path)
    want = _outcome(typer_param._coerce_value, str(secret), param)
    assert want[0] == "error"
    assert _outcome(fast._coerce_value, str(secret), param) == want


def test_every_built_command_converts_fast():
    for label, param in _params():
        if param.type_descriptor.file_annotation is None and label != "zplan":
            assert isinstance(param._runtime_param, coerce.FastRuntimeParam), (label, param.name)
