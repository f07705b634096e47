"""End-to-end latency of the installed `zplan` command (issue 9: goal < 0.2 s for `zplan --help`,
`zplan check JOB` and `zplan fit` with a layout).

Runs the console script next to this interpreter (the venv's `zplan`, as a user types it) several
times per command, output discarded, and prints the minimum and the median wall-clock seconds and
the minimum CPU seconds (user + system of the process and its threads: less sensitive to other
jobs on the machine than wall-clock, which depends on the machine and its load; compare figures
on one machine, and prefer the minimum).

Floors printed with them: the interpreter's own start-up (`python -c pass`) and the work the
planner cannot do without: importing numpy (the array model), pydantic (the typed inputs), PyYAML
and typer, and validating one pydantic model (pydantic imports its field and type modules on the
first model); `fit` also imports rich to draw its tables. The floors run under the process
settings `zplan` applies to every numpy-only command (`SETTLED`), so that a command minus its
floor is the planner's own work.

Python's compiled-bytecode cache is on for the runs, as for an installed package (pip writes
it at install time): the children get PYTHONPYCACHEPREFIX, a temporary directory, so the source
tree stays clean, and PYTHONDONTWRITEBYTECODE is removed from their environment if set (with it
every run compiled the planner's ~40 modules again, ~0.1 s). The untimed warm-up run fills the
cache. `--no-bytecode-cache` measures the other case.

`--instructions` adds the instructions each command executes (valgrind's callgrind, when
installed; one run each, ~30x slower): a count that does not depend on the machine's load, so a
change can be measured on a busy machine. Python 3.11.7 and the same installed packages give the
same counts to within ~1 %.

    python benchmarks/cli_latency.py [--runs 7] [--no-bytecode-cache] [--instructions]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZPLAN = Path(sys.executable).with_name("zplan")
PYTHON = sys.executable

SETTLED = ("import gc, os\ngc.disable()\nos.environ.setdefault('OPENBLAS_NUM_THREADS', '1')\n"
           "os.environ.setdefault('PYDANTIC_DISABLE_PLUGINS', '__all__')\n")
"""The process settings `zplan` applies before a numpy-only command (planner.cli.app
`numpy_command_settings`: one BLAS thread, no pydantic plugin look-up, no cyclic garbage
collection, the objects frozen at exit), applied to the floors too, so that a command minus its
floor is the planner's own work."""

FLOOR_CHECK = ("import numpy, yaml, typer; from pydantic import BaseModel, Field\n"
               "class M(BaseModel):\n    x: int = Field(1, gt=0)\nM(x=2)")


def floor(code: str) -> list[str]:
    """A floor: `code` run as `zplan` runs a numpy-only command."""
    return [PYTHON, "-c", SETTLED + code + "\ngc.freeze()"]


COMMANDS = {
    "python -c pass (floor)": [PYTHON, "-c", "pass"],
    "import numpy, pydantic.BaseModel": floor("import numpy; from pydantic import BaseModel"),
    "  + yaml, typer": floor("import numpy, yaml, typer; from pydantic import BaseModel"),
    "  + one model validated (floor of check)": floor(FLOOR_CHECK),
    "  + rich.table (floor of fit)": floor(FLOOR_CHECK + "; import rich.console, rich.table"),
    "zplan --help": [str(ZPLAN), "--help"],
    "zplan check examples/job.yaml": [str(ZPLAN), "check", str(ROOT / "examples" / "job.yaml")],
    "zplan fit (layout given)": [str(ZPLAN), "fit", "--model", "gpt3-175b", "--cluster", "dgx2x32", "--tp", "8",
                                 "--pp", "8", "--zero", "1", "--recompute", "full", "--global-batch", "1536"],
    "zplan fit --help": [str(ZPLAN), "fit", "--help"],
}


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall-clock seconds, CPU seconds) of one run, output discarded."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, _, usage = os.wait4(child.pid, 0)
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def measure(argv: list[str], runs: int, env: dict[str, str]) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU seconds of `runs` runs after one untimed warm-up (file and bytecode caches)."""
    run_once(argv, env)
    pairs = [run_once(argv, env) for _ in range(runs)]
    return [wall for wall, _ in pairs], [cpu for _, cpu in pairs]


def instructions(argv: list[str], env: dict[str, str]) -> int | None:
    """Instructions executed by one run under valgrind's callgrind (None without valgrind)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    run = subprocess.run([valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    found = re.search(r"Collected : (\d+)", run.stderr)
    return int(found.group(1)) if found else None


def child_env(cache_dir: str | None) -> dict[str, str]:
    """The environment of the runs: the bytecode cache in `cache_dir`; when None, none written
    (modules without a `__pycache__` next to them, the planner's in a source checkout, are
    compiled on every run)."""
    env = dict(os.environ)
    if cache_dir is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache_dir
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="every run compiles the modules from source (PYTHONDONTWRITEBYTECODE)")
    parser.add_argument("--instructions", action="store_true",
                        help="also count each command's instructions with valgrind (callgrind)")
    args = parser.parse_args()
    if not ZPLAN.is_file():
        sys.exit(f"no installed zplan next to {sys.executable}; pip install -e . first")
    with tempfile.TemporaryDirectory(prefix="zplan-pycache-") as cache_dir:
        env = child_env(None if args.no_bytecode_cache else cache_dir)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        cache = "off" if args.no_bytecode_cache else "on"
        print(f"{args.runs} runs each, bytecode cache {cache}, load average {load:.1f}, {os.cpu_count()} cores")
        print(f"{'command':42} {'min s':>7} {'median s':>9} {'min CPU s':>10}"
              + (f" {'M instr':>8}" if args.instructions else ""))
        for name, argv in COMMANDS.items():
            walls, cpus = measure(argv, args.runs, env)
            line = f"{name:42} {min(walls):7.3f} {statistics.median(walls):9.3f} {min(cpus):10.3f}"
            if args.instructions:
                count = instructions(argv, env)
                line += f" {count / 1e6:8.0f}" if count is not None else "       -"
            print(line)


if __name__ == "__main__":
    main()
