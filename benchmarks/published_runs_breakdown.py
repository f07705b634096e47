"""Per-term step-time breakdown of the SEEN published rows (issue 10: why rows miss).

    python benchmarks/published_runs_breakdown.py mcore-h100        # rows whose name starts so
    python benchmarks/published_runs_breakdown.py mcore-h100 --no-overlap

Prints each term of `steptime.estimate_step` as a share of the predicted step, the predicted
and published metric. Rows of a split not yet evaluated (benchmarks/published_runs.py
EVALUATED_SPLITS) are refused: their errors are computed once, by published_runs.py.
`--no-overlap` evaluates the rows without their stated Megatron overlaps (the model before
planner/timing/megatron_overlap.py), for comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.published_runs import (EVALUATED_SPLITS, _compare, data_row_build,  # noqa: E402
                                       published_metric)
from benchmarks.published_runs_data import load_runs  # noqa: E402
from planner.timing.steptime import EXPOSED, estimate_step  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefix")
    parser.add_argument("--no-overlap", action="store_true")
    args = parser.parse_args(argv)
    runs = [r for r in load_runs() if r.name.startswith(args.prefix) and r.category == "dense"]
    short = [n.removesuffix("_s") for n in EXPOSED]
    print(f"{'row':<28} {'pub':>7} {'pred':>7} {'err%':>6}  " + " ".join(f"{s[:9]:>9}" for s in short))
    for run in runs:
        if run.split not in EVALUATED_SPLITS:
            sys.exit(f"{run.name}: split {run.split} is not evaluated yet (held out)")
        model, cluster, layout, setup, note = data_row_build(run)
        if args.no_overlap:
            layout = layout.model_copy(update=dict(megatron_overlap=None))
        est = estimate_step(model, cluster, layout, setup)
        pred, err, _ = _compare(run, setup.global_batch, est, note)
        shares = " ".join(f"{100 * getattr(est, n) / est.step_s:>8.1f}%" for n in EXPOSED)
        print(f"{run.name:<28} {published_metric(run):>7.1f} {pred:>7.1f} {err:>+6.1f}  {shares}")


if __name__ == "__main__":
    main()
