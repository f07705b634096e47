"""The command line's conventions (issue 14, issue 9): the exit-code contract, output streams,
one definition per option, help that shows defaults, safe writes, pictures, locked appends."""

from __future__ import annotations

import inspect
import json
import multiprocessing
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import COMMAND, PACKAGE_PARENT, run_zplan

FITS = ["fit", "--model", "gpt2", "--cluster", "dgx2", "--tp", "1"]


# --------------------------------------------------------------------------- exit codes


@pytest.mark.cli
def test_internal_error_is_exit_3_one_line_and_debug_gives_the_traceback(tmp_path):
    # A bug is simulated by a sitecustomize that breaks the planner's memory plan at import:
    # the command must not exit 1 (a CI gate reads 1 as "does not fit").
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import planner.memory.plan as p\n"
        "def boom(*a, **k):\n    raise RuntimeError('simulated bug')\n"
        "p.plan_memory = boom\n")
    env = {"PYTHONPATH": f"{hook}{os.pathsep}{PACKAGE_PARENT}"}
    job = Path(__file__).resolve().parents[1] / "examples" / "job.yaml"
    result = run_zplan("check", str(job), env=env)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "internal error" in lines[0] and "--debug" in lines[0]
    assert "simulated bug" in lines[0] and "Traceback" not in result.stderr
    debug = run_zplan("--debug", "check", str(job), env=env)
    assert debug.returncode == 3 and "Traceback" in debug.stderr
    by_env = run_zplan("check", str(job), env={**env, "ZPLAN_DEBUG": "1"})
    assert by_env.returncode == 3 and "Traceback" in by_env.stderr


@pytest.mark.cli
def test_closed_stdout_is_one_line_exit_4():
    proc = subprocess.run([*COMMAND, *FITS], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, env={**os.environ, "PYTHONPATH": str(PACKAGE_PARENT)},
                          close_fds=True, preexec_fn=lambda: os.close(1))
    assert proc.returncode == 4, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "standard output" in proc.stderr


@pytest.mark.cli
@pytest.mark.parametrize("argv", [FITS, [*FITS, "--json"], ["show", "gpt2"],
                                  ["sweep", "--model", "gpt2", "--cluster", "dgx2", "--top", "3"],
                                  ["check", str(Path(__file__).resolve().parents[1] / "examples" / "job.yaml")],
                                  ["--help"], ["fit", "--help"], ["version"]],
                         ids=["fit", "fit-json", "show", "sweep", "check", "help", "fit-help", "version"])
def test_a_reader_gone_before_the_output_is_exit_4_not_1(argv):
    """`zplan fit ... | head` where the reader has gone: the pipe's read end is closed before
    zplan writes. rich's console used to end the process with exit 1 and no word (its
    `on_broken_pipe`), which a CI gate reads as "does not fit"."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([*COMMAND, *argv], stdout=write_end, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(PACKAGE_PARENT)})
    finally:
        os.close(write_end)
    assert proc.returncode == 4, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "standard output" in proc.stderr, proc.stderr


@pytest.mark.cli
@pytest.mark.parametrize("argv, code", [(FITS, 4), (["fit", "--model", "nosuch"], 2),
                                        (["fit", "--no-such-option"], 2), (["--help"], 4)],
                         ids=["fit", "bad-value", "bad-option", "help"])
def test_stdout_and_stderr_both_gone_still_give_the_contract_s_code(argv, code):
    """`zplan ... 2>&1 | head` after the reader has gone: the error line cannot be written
    either. The code still tells: 4 for an answer not delivered, 2 for bad input (the failed
    write of the error line used to end the process with exit 1)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([*COMMAND, *argv], stdout=write_end, stderr=write_end,
                              env={**os.environ, "PYTHONPATH": str(PACKAGE_PARENT)})
    finally:
        os.close(write_end)
    assert proc.returncode == code


@pytest.mark.cli
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_full_disk_on_stdout_is_one_line_exit_4():
    with open("/dev/full", "w") as full:
        proc = subprocess.run([*COMMAND, *FITS, "--json"], stdout=full, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(PACKAGE_PARENT)})
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "no space left on device" in lines[0].lower(), proc.stderr


@pytest.mark.cli
def test_results_on_stdout_diagnostics_on_stderr(tmp_path):
    fit = run_zplan(*FITS)
    assert fit.returncode == 0 and "FITS" in fit.stdout and fit.stderr == ""
    # the export's verdict is a diagnostic: stdout holds only the config
    export = run_zplan("export", "--format", "deepspeed", "--model", "gpt2", "--cluster", "dgx2", "--tp", "1")
    assert export.returncode == 0
    assert json.loads(export.stdout)["train_micro_batch_size_per_gpu"] == 1
    assert export.stderr.startswith("FITS:")


@pytest.mark.cli
def test_tables_fit_100_columns_when_not_a_terminal(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = str(PACKAGE_PARENT)
    for args in (["fit", "--model", "gpt3-175b", "--cluster", "dgx2x32", "--tp", "8", "--pp", "8", "--zero", "1"],
                 ["sweep", "--model", "gpt3-13b", "--gpu", "a100-80gb", "--gpus", "64", "--top", "3"]):
        proc = subprocess.run([*COMMAND, *args], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert proc.returncode in (0, 1), proc.stderr
        assert max(len(line) for line in proc.stdout.splitlines()) <= 100


@pytest.mark.cli
def test_tables_never_cut_a_number_when_not_a_terminal(tmp_path):
    # Off a terminal tables keep to 100 columns by wrapping their text columns; a table whose
    # numbers cannot fit (GPT-3 175B unsharded on V100s: ~2.7 TB per GPU, five-digit GiB cells)
    # is printed as wide as it needs. rich's last resort cut it to '2,679.…' and '909…' before.
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = str(PACKAGE_PARENT)

    def run(*args):
        proc = subprocess.run([*COMMAND, *args], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert proc.returncode in (0, 1), proc.stderr
        return proc.stdout

    huge = ["fit", "--model", "gpt3-175b", "--cluster", "dgx2x32", "--tp", "1", "--pp", "1", "--zero", "0"]
    table = run(*huge)
    stage = json.loads(run(*huge, "--json"))["memory"]["stages"][0]
    assert "…" not in table
    for key in ("optimizer_bytes", "total_bytes", "headroom_bytes"):  # the cells, whole
        assert f"{stage[key] / 2**30:,.2f}" in table
    # the sweep's widest rows (DeepSeek-V3 states like `z2 ep128 off=cpu/- rc=sel sp`): the
    # states column wraps, the numbers stay whole, the lines keep to 100 columns
    ranked = run("sweep", "--model", "deepseek-v3", "--gpu", "a100-80gb", "--gpus", "256", "--top", "4")
    assert "…" not in ranked
    assert max(len(line) for line in ranked.splitlines()) <= 100


@pytest.mark.cli
def test_the_readme_infer_example_says_it_exits_1():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    line = next(line for line in readme.splitlines() if line.startswith("$ zplan infer"))
    args = line.split("#")[0].split()[2:]
    result = run_zplan(*args)
    assert ("exits 1" in line) == (result.returncode == 1), (line, result.returncode)


@pytest.mark.cli
@pytest.mark.parametrize(("document", "folder"), [("README.md", "."), ("docs/io.md", "."),
                                                  ("docs/hardware.md", "examples")])
def test_the_documented_examples_print_the_lines_they_show(document, folder):
    # Each output line a document shows under a `$ zplan ...` command (but elided rows and the
    # `# ...` remarks) is a line the command prints, run from `folder` (docs/hardware.md's
    # `job.yaml` is examples/job.yaml), with the exit code its lines imply (1 after DOES NOT FIT,
    # 2 for an error line, else 0). The README's examples had drifted (peak
    # 20.61 GiB of 32.00 GiB, from before the runtime reserve was counted).
    root = Path(__file__).resolve().parents[1]
    lines = (root / document).read_text(encoding="utf-8").splitlines()
    checked = 0
    for i, line in enumerate(lines):
        if not line.startswith("$ zplan "):
            continue
        shown = []
        for out in lines[i + 1:]:
            if not out.strip() or out.startswith(("$ ", "```")):
                break
            shown.append(out)
        if not shown:
            continue
        result = run_zplan(*line.split("#")[0].split()[2:], cwd=root / folder, env={"COLUMNS": "400"})
        printed = [out.rstrip() for out in (result.stdout + result.stderr).splitlines()]
        for out in shown:
            text = out.split("  # ")[0].rstrip()
            if text.strip() != "...":
                assert text in printed, (line, text)
        expected = (1 if any(out.startswith("DOES NOT FIT") for out in shown)
                    else 2 if shown[0].startswith("zplan: error:") else 0)
        assert result.returncode == expected, line
        checked += 1
    assert checked >= 1


# --------------------------------------------------------------------------- options


def _commands():
    from planner.cli.app import COMMANDS, load_command

    return {name: load_command(name) for name in COMMANDS if name != "calibrate"}


SWEEP_SEARCHES = ("--recompute-num-layers",)
"""Sweep options that search as well as pin (`--recompute-num-layers auto`): one meaning
among the sweep's options, another in the one-layout commands."""


def test_every_option_name_means_the_same_in_every_command():
    # calibrate (engineer C's command) is excluded: its --seq-len / --micro-batch are the
    # scaled-down run's sizes, not the planned job's.
    seen: dict[str, tuple[str, object, object]] = {}
    for name, command in _commands().items():
        for param in command.params:
            for flag in param.opts:
                if not flag.startswith("--") or flag == "--help":
                    continue
                pins = name == "sweep" and ("comma list" in (param.help or "") or flag in SWEEP_SEARCHES)
                key = flag + (" (pins)" if pins else "")
                if flag == "--gpus" and name == "sweep":
                    key = "--gpus (range)"
                meaning = (param.help, param.default, str(param.type_descriptor.annotation), param.min, param.max)
                if key in seen:
                    assert seen[key][1:] == (meaning,), (key, name, seen[key][0])
                else:
                    seen[key] = (name, meaning)


def test_root_help_lists_each_commands_own_first_paragraph():
    from planner.cli.app import COMMANDS

    for name, command in _commands().items():
        doc = inspect.getdoc(command.callback)
        assert " ".join(doc.split("\n\n")[0].split()) == COMMANDS[name].short_help, name


@pytest.mark.cli
def test_help_shows_every_default():
    help_text = " ".join(run_zplan("fit", "--help").stdout.split())
    for needle in ("(default: min(2048, the model's max))", "(default: GPUs/(tp*pp))",
                   "micro-batch x dp x grad-accum"):
        assert needle in help_text, needle


def test_default_global_batch_rule():
    from planner.cli.commands._options import default_global_batch

    assert default_global_batch(512) == 512                      # searching: one per GPU
    assert default_global_batch(512, tp=8, pp=8) == 1 * 8 * 8    # micro 1 x dp 8 x grad_accum pp=8
    assert default_global_batch(512, tp=8, pp=8, micro_batch=2, grad_accum=3) == 2 * 8 * 3


def test_no_command_imports_another():
    commands = Path(__file__).resolve().parents[1] / "planner" / "cli" / "commands"
    for path in commands.glob("*_cmd.py"):
        text = path.read_text(encoding="utf-8")
        others = [p.stem for p in commands.glob("*_cmd.py") if p != path]
        assert not any(f"commands.{other}" in text or f"import {other}" in text for other in others), path


# --------------------------------------------------------------------------- writes


@pytest.mark.cli
def test_export_writes_atomically_and_force_replaces(tmp_path):
    args = ["export", "--format", "deepspeed", "--model", "gpt2", "--cluster", "dgx2", "--tp", "1", "-o", "ds.json"]
    first = run_zplan(*args, cwd=tmp_path)
    assert first.returncode == 0 and first.stdout == ""
    assert json.loads((tmp_path / "ds.json").read_text())["zero_optimization"]["stage"] == 0
    again = run_zplan(*args, cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr
    forced = run_zplan(*args[:-2], "--zero", "1", "-o", "ds.json", "--force", cwd=tmp_path)
    assert forced.returncode == 0
    assert json.loads((tmp_path / "ds.json").read_text())["zero_optimization"]["stage"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.json"]  # no temporary file left


def _append_entry(args: tuple[str, int]) -> None:
    from planner.io.safe_write import append_locked

    path, i = args

    def add(old: str | None) -> str:
        entries = yaml.safe_load(old)["entries"] if old else []
        return yaml.safe_dump({"entries": [*entries, {"run": i}]})

    append_locked(Path(path), add)


def test_concurrent_appends_lose_nothing(tmp_path):
    target = tmp_path / "calibration.yaml"
    with multiprocessing.get_context("fork").Pool(8) as pool:
        pool.map(_append_entry, [(str(target), i) for i in range(40)])
    runs = sorted(entry["run"] for entry in yaml.safe_load(target.read_text())["entries"])
    assert runs == list(range(40))


def test_write_atomic_keeps_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    from planner.io import safe_write

    target = tmp_path / "out.txt"
    target.write_text("old\n")

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safe_write.os, "fsync", broken_fsync)
    with pytest.raises(safe_write.OutputError, match="no space left on device"):
        safe_write.write_atomic(target, "new\n", force=True)
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


# --------------------------------------------------------------------------- pictures


@pytest.mark.cli
@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_fit_and_sweep_draw_pictures(tmp_path, suffix, magic):
    pytest.importorskip("matplotlib")
    fit = run_zplan(*FITS, "--plot", f"fit{suffix}", cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr
    sweep = run_zplan("sweep", "--model", "gpt2", "--cluster", "dgx2", "--top", "20", "--plot", f"sweep{suffix}",
                      cwd=tmp_path)
    assert sweep.returncode == 0, sweep.stderr
    for name in ("fit", "sweep"):
        assert (tmp_path / f"{name}{suffix}").read_bytes().startswith(magic)


def test_pareto_front_by_hand():
    from planner.cli.report.plot import pareto_front

    # (step s, GiB): (1, 50) and (2, 30) and (3, 10) are each best on some trade-off;
    # (2.5, 40) is beaten by (2, 30) on both axes, (4, 10) by (3, 10).
    points = [(2.5, 40.0), (1.0, 50.0), (3.0, 10.0), (2.0, 30.0), (4.0, 10.0)]
    assert pareto_front(points) == [(1.0, 50.0), (2.0, 30.0), (3.0, 10.0)]


def _append_calibration(args: tuple[str, int]) -> None:
    from planner.io.calibration import Calibration, EfficiencyEntry, append_calibration

    path, i = args
    entry = EfficiencyEntry(gpu="cpu", dtype="fp32", achieved_flops_per_s=1e9 + i, peak_flops_per_s=None,
                            efficiency=None, model=f"run{i}", tokens_per_step=128, step_time_s=1.0)
    append_calibration(Calibration(entries=[entry]), Path(path))


def test_concurrent_calibration_appends_lose_nothing(tmp_path):
    # the case: 8 concurrent `calibrate --out` runs kept only 6-7 of 8 entries
    from planner.io.calibration import load_calibration

    target = tmp_path / "calib.yaml"
    with multiprocessing.get_context("fork").Pool(8) as pool:
        pool.map(_append_calibration, [(str(target), i) for i in range(24)])
    models = sorted(entry.model for entry in load_calibration(target).entries)
    assert models == sorted(f"run{i}" for i in range(24))


def test_fit_picture_stacks_every_byte_of_each_stage():
    from planner.cli.report.plot import stage_parts_gib
    from planner.core.spec import GIB
    from planner.io.jobfile import load_job
    from planner.memory.plan import plan_memory

    job = Path(__file__).resolve().parents[1] / "examples" / "job.yaml"
    plan = plan_memory(*load_job(job, ()))
    for stage in plan.stages:
        assert sum(stage_parts_gib(stage).values()) * GIB == pytest.approx(stage.total_bytes, rel=1e-12)
