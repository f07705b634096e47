"""The command line imports a command's module only when that command runs (issue 9, command
latency): `zplan --help` lists every command from the static table `planner.cli.app.COMMANDS`,
which must name exactly the commands the modules register; and what a command does not need is not
imported (checked on `sys.modules` after the run: a module list, not a clock)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from conftest import PACKAGE_PARENT

JOB = Path(__file__).resolve().parents[1] / "examples" / "job.yaml"
COMMANDS_DIR = Path(__file__).resolve().parents[1] / "planner" / "cli" / "commands"


def test_the_static_command_table_names_exactly_the_registered_commands():
    import importlib

    from planner.cli.app import COMMANDS

    registered: dict[str, str] = {}
    for path in sorted(COMMANDS_DIR.glob("*_cmd.py")):
        module_name = f"planner.cli.commands.{path.stem}"
        holder = typer.Typer()
        importlib.import_module(module_name).register(holder)
        group = typer.main.get_group(holder)
        registered.update({name: module_name for name in group.commands})
    assert registered == {name: command.module for name, command in COMMANDS.items()}


def _after_main(argv: list[str], report: str, imports: str = "sys", env: dict[str, str] | None = None):
    """Run `main(argv)` in a fresh interpreter and return the value of the Python expression
    `report`, evaluated after the command (`status` holds its exit code; `imports` are imported
    first). The value is written on a line of its own on stderr (after any progress bar)."""
    code = (f"import {imports}\n"
            "from planner.cli.app import main\n"
            "status = None\n"
            "try:\n"
            f"    main({argv!r})\n"
            "except SystemExit as exit:\n"
            "    status = exit.code\n"
            f"sys.__stderr__.write('\\n' + repr({report}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=PACKAGE_PARENT, env={"PATH": "", "COLUMNS": "100",
                                                   "PYTHONPATH": str(PACKAGE_PARENT), **(env or {})})
    return ast.literal_eval(proc.stderr.strip().splitlines()[-1])


def _modules_after(argv: list[str]) -> tuple[int, set[str]]:
    """Exit code and the top-level modules imported by `zplan ARGV`, run in a fresh interpreter."""
    status, modules = _after_main(argv, "(status, sorted({m.split('.')[0] for m in sys.modules}))")
    return status, set(modules)


@pytest.mark.cli
@pytest.mark.parametrize("argv, absent", [
    (["--help"], {"numpy", "pydantic", "rich", "yaml", "torch", "matplotlib"}),
    (["fit", "--help"], {"numpy", "pydantic", "rich", "yaml", "torch", "matplotlib"}),
    (["check", str(JOB)], {"rich", "torch", "matplotlib", "transformers"}),
    (["fit", "--model", "gpt2", "--cluster", "dgx2", "--tp", "1"], {"torch", "matplotlib", "transformers"}),
], ids=["help", "fit-help", "check", "fit"])
def test_a_command_imports_only_what_it_needs(argv, absent):
    status, modules = _modules_after(argv)
    assert status in (0, 1)
    assert not modules & absent, modules & absent


def _blas_after(argv: list[str], env: dict[str, str]) -> tuple[str | None, int]:
    """OPENBLAS_NUM_THREADS and the process's thread count (Linux /proc) after `zplan ARGV`."""
    threads = "int([l for l in open('/proc/self/status') if l.startswith('Threads:')][0].split()[1])"
    return _after_main(argv, f"(os.environ.get('OPENBLAS_NUM_THREADS'), {threads})", "os, sys", env)


@pytest.mark.cli
@pytest.mark.skipif(not Path("/proc/self/status").exists() or (len(os.sched_getaffinity(0)) < 2),
                    reason="needs Linux /proc and at least two cores (OpenBLAS starts no worker on one)")
def test_numpy_commands_start_no_blas_worker_threads():
    """OpenBLAS starts a worker per core when numpy loads (they spin while the command imports);
    the planner calls no BLAS routine, so `check` asks for one thread: the process then has one
    thread. A user's own setting wins (with 2 threads OpenBLAS starts its worker: 2 threads)."""
    assert _blas_after(["check", str(JOB)], {}) == ("1", 1)
    assert _blas_after(["check", str(JOB)], {"OPENBLAS_NUM_THREADS": "2"}) == ("2", 2)


def test_calibrate_keeps_the_blas_thread_count_and_its_collector(monkeypatch):
    """`calibrate` runs torch, whose CPU GEMMs may go through OpenBLAS and whose training steps
    make reference cycles holding tensors: no thread count is set, pydantic's plugins are left
    alone and the cyclic collector stays on. A numpy-only command gets one BLAS thread, no
    pydantic plugin look-up and no collector (restored here: this test runs inside pytest's
    process)."""
    import gc

    from planner.cli.app import numpy_command_settings

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delenv("PYDANTIC_DISABLE_PLUGINS", raising=False)
    assert gc.isenabled()
    try:
        assert numpy_command_settings(["--debug", "calibrate", "hardware", "--nproc", "2"]) is False
        assert "OPENBLAS_NUM_THREADS" not in os.environ and gc.isenabled()
        assert "PYDANTIC_DISABLE_PLUGINS" not in os.environ
        assert numpy_command_settings(["--debug", "sweep", "--model", "gpt2"]) is True
        assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
        assert os.environ["PYDANTIC_DISABLE_PLUGINS"] == "__all__"
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.cli
def test_a_numpy_command_leaves_its_objects_frozen_and_the_collector_on():
    """After a numpy-only command the objects are frozen (the interpreter's shutdown does not
    traverse them) and a caller that catches SystemExit has its collector back; `calibrate`
    (here its help: no torch run) freezes nothing."""
    def after(argv: list[str]) -> tuple[bool, bool]:
        return _after_main(argv, "(gc.isenabled(), gc.get_freeze_count() > 0)", "gc, sys")

    assert after(["check", str(JOB)]) == (True, True)
    assert after(["calibrate", "--help"]) == (True, False)


@pytest.mark.cli
def test_numpy_commands_leave_nothing_for_the_interpreter_s_teardown(tmp_path):
    """`console` ends a numpy-only command with `os._exit` (no interpreter teardown). That is
    safe only if nothing waits for the teardown: no exit handler registered and no thread left
    running. Checked after the commands that write files or draw a progress bar (its refresh
    thread) as well as the plain ones."""
    def left_over(argv: list[str]) -> tuple[int, int, int]:
        return _after_main(argv, "(status, atexit._ncallbacks(), threading.active_count())",
                           "atexit, sys, threading")

    gpt2 = ["--model", "gpt2", "--cluster", "dgx2"]
    assert left_over(["check", str(JOB)]) == (0, 0, 1)
    assert left_over(["fit", *gpt2, "--tp", "1"]) == (0, 0, 1)
    assert left_over(["sweep", *gpt2, "--gpus", "8-16", "--progress", "--top", "2",
                      "--csv", str(tmp_path / "rows.csv")]) == (0, 0, 1)
    assert left_over(["export", *gpt2, "--format", "deepspeed", "-o", str(tmp_path / "ds.json")]) == (0, 0, 1)
    assert (tmp_path / "rows.csv").stat().st_size > 0 and (tmp_path / "ds.json").stat().st_size > 0


@pytest.mark.cli
def test_the_console_script_keeps_every_exit_code(tmp_path):
    """`console` (the installed `zplan`, `python -m planner`) exits with `main`'s code: 0 fits,
    1 does not fit, 2 bad input; and the output written before `os._exit` is all there."""
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "planner", *argv], capture_output=True, text=True,
                              timeout=300, cwd=PACKAGE_PARENT,
                              env={"PATH": "", "COLUMNS": "100", "PYTHONPATH": str(PACKAGE_PARENT)})

    fits = run("fit", "--model", "gpt2", "--cluster", "dgx2", "--tp", "1", "--json")
    assert fits.returncode == 0 and json.loads(fits.stdout)["fits"] is True
    # GPT-3 175B replicated on every V100 32 GB (no sharding): 16 x 175e9 bytes cannot fit
    does_not = run("fit", "--model", "gpt3-175b", "--cluster", "dgx2x32", "--tp", "1", "--pp", "1",
                   "--zero", "0")
    assert does_not.returncode == 1 and does_not.stdout.rstrip().splitlines()[-1].startswith("DOES NOT FIT")
    bad = run("fit", "--model", "gpt2", "--cluster", "dgx2", "--micro-batch", "0")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and bad.stdout == ""
