"""End-to-end latency of the installed `zplan` command (issue 9: goal < 0.2 s for `zplan --help`,
`zplan check JOB` and `zplan fit` with a layout).

Runs the console script next to this interpreter (the venv's `zplan`, as a user types it) several
times per command, output discarded, and prints the minimum and the median wall-clock seconds; the
interpreter's own start-up (`python -c pass`) is printed as the floor. Wall-clock figures depend on
the machine and its load: compare them on one machine, and prefer the minimum.

    python benchmarks/cli_latency.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZPLAN = Path(sys.executable).with_name("zplan")

COMMANDS = {
    "python -c pass (floor)": [sys.executable, "-c", "pass"],
    "zplan --help": [str(ZPLAN), "--help"],
    "zplan check examples/job.yaml": [str(ZPLAN), "check", str(ROOT / "examples" / "job.yaml")],
    "zplan fit (layout given)": [str(ZPLAN), "fit", "--model", "gpt3-175b", "--cluster", "dgx2x32", "--tp", "8",
                                 "--pp", "8", "--zero", "1", "--recompute", "full", "--global-batch", "1536"],
    "zplan fit --help": [str(ZPLAN), "fit", "--help"],
}


def seconds(argv: list[str], runs: int) -> list[float]:
    """Wall-clock seconds of `runs` runs (one untimed warm-up fills the OS file cache)."""
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    if not ZPLAN.is_file():
        sys.exit(f"no installed zplan next to {sys.executable}; pip install -e . first")
    print(f"{'command':36} {'min s':>7} {'median s':>9}   ({args.runs} runs each)")
    for name, argv in COMMANDS.items():
        times = seconds(argv, args.runs)
        print(f"{name:36} {min(times):7.3f} {statistics.median(times):9.3f}")


if __name__ == "__main__":
    main()
