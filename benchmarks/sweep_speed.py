"""Sweep speed: layouts evaluated per second on one core, and the end-to-end `zplan sweep` time.

Run from the checkout: `python benchmarks/sweep_speed.py`. Prints figures; asserts nothing.
Cases (full search space, no constraints):
- GPT-3 175B on 1024 A100 80 GB, global batch 1536 (Brown et al. 2020 Table 2.1: 3.2M tokens
  of 2048), sequence 2048;
- the 1T dense GPT (`gpt-1t`, Narayanan et al. 2021 Table 1) on 3072 A100 80 GB, global batch
  3072 (same table), sequence 2048.
`sweep()` evaluates every layout's memory and times the data-parallel, offload and optimizer
terms only of the layouts that can rank (`sweep.StepTimes`: the others' bound rules them out;
the same answer), so its rate is printed with how many it timed, next to the rate of
enumerating and evaluating every column of every layout (`evaluate`, as `sweep()` did before).
In-process figures are the least CPU time over the repetitions; every repetition is a cold
sweep(): the planner's functools caches are cleared before it (`clear_caches`), so no
repetition reuses work of an earlier one that a single CLI invocation would not have.
The 40x tiled evaluation repeats every candidate 40 times with its enumeration group key
(`sweep.enumerate_product`): the copies share their activity groups, so it measures the
per-candidate numpy cost of the state-dependent part plus the grouped part once.
Also printed: `zplan fit` without a layout in process (`strategies.strategy_minimums` and
`sweep.best_layout`, the two searches `fitting.fit_search` runs), cold, CPU time.
The glibc malloc settings of `planner.search.heap` are applied first, as `sweep()` applies them;
ZPLAN_NO_MALLOPT=1 measures without them.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core, inherited below

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from planner.io import loading  # noqa: E402
from planner.search import heap, strategies, sweep  # noqa: E402
from planner.io.jobfile import make_setup  # noqa: E402

CASES = [("gpt3-175b", 1024, 1536), ("gpt-1t", 3072, 3072)]
REPEATS = 10
SCALING = ("gpt3-175b", (256, 512, 1024, 2048, 4096, 8192), (512, 1024, 1536, 2048, 3072, 4096))
"""A scaling sweep: every layout of GPT-3 175B at each GPU count x each global batch."""


def clear_caches() -> None:
    """Empty every functools cache of every loaded planner module, and the models' memoized
    hashes (`planner.core.spec._MODEL_HASHES`), so that each repetition is a cold sweep() as
    one CLI invocation sees it (no help from an earlier repetition).
    `planner.io.loading` keeps its file cache: the model and cluster are loaded before timing.
    (Until session 27 only seven modules' caches were cleared: the rule table's applicable
    rules per column set, `timing.expert`'s MoE block counts and the model hashes stayed warm.)"""
    from planner.core import spec

    for name, module in list(sys.modules.items()):
        if name.startswith("planner") and name != "planner.io.loading":
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()
    spec._MODEL_HASHES.clear()


def best_of(fn, repeats=REPEATS) -> float:
    """Least CPU time (time.process_time) over the repeats: on a shared machine the wall clock
    also counts other jobs' time slices; one core is pinned, so CPU time is this job's cost.
    Caches are cleared before every repetition (`clear_caches`)."""
    times = []
    for _ in range(repeats):
        clear_caches()
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def space(model_name: str, gpus: int, batch: int):
    """(model, cluster, setup, constraints, candidates, their group key) of a case: the full
    space on `gpus` A100 80 GB, sequence 2048, no constraints."""
    model = loading.load_model(model_name)
    cluster = loading.cluster_for_gpus("a100-80gb", gpus)
    setup = make_setup(2048, batch, 300e9)
    c = sweep.Constraints()
    cands, _, key = sweep.enumerate_product(model, cluster, setup, c)
    return model, cluster, setup, c, cands, key


def in_process(model_name: str, gpus: int, batch: int) -> None:
    model, cluster, setup, c, cands, key = space(model_name, gpus, batch)
    n = len(cands)
    t_enum = best_of(lambda: sweep.enumerate_product(model, cluster, setup, c))
    t_eval = best_of(lambda: sweep.evaluate(model, cluster, setup, cands, c, activity_key=key))
    t_sweep = best_of(lambda: sweep.sweep(model, cluster, setup, c))
    tiled = cands.take(np.tile(np.arange(n), 40))  # per-candidate (numpy) cost
    key40 = np.tile(key, 40)
    t_tiled = best_of(lambda: sweep.evaluate(model, cluster, setup, tiled, c,
                                             activity_key=key40), 3)
    print(f"{model_name} on {gpus} x a100-80gb, global batch {batch}: {n:,} layouts")
    print(f"  enumerate {t_enum * 1e3:7.1f} ms   evaluate {t_eval * 1e3:7.1f} ms   "
          f"sweep() (enumerate + evaluate + rank) {t_sweep * 1e3:7.1f} ms")
    timed = sweep.sweep(model, cluster, setup, c).timed
    print(f"  layouts/s, whole sweep() on one core (CPU time): {n / t_sweep:12,.0f}   "
          f"(state terms timed on {timed:,} of them: `SweepResult.timed`)")
    print(f"  layouts/s, enumerate + evaluate() of every column of every layout: "
          f"{n / (t_enum + t_eval):12,.0f}")
    print(f"  layouts/s, evaluation of {40 * n:,} candidates (CPU time): {40 * n / t_tiled:12,.0f}")
    t_strat = best_of(lambda: strategies.strategy_minimums(model, cluster, setup), 5)
    t_best = best_of(lambda: sweep.best_layout(model, cluster, setup), 5)
    print(f"  zplan fit without a layout, in process: strategy minimums {t_strat * 1e3:6.1f} ms, "
          f"best layout {t_best * 1e3:6.1f} ms")


def cli(model_name: str, gpus: int, batch: int) -> None:
    args = [sys.executable, "-m", "planner", "sweep", "--model", model_name, "--gpu", "a100-80gb",
            "--gpus", str(gpus), "--global-batch", str(batch), "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        proc = subprocess.run(args, capture_output=True, env=env, check=False)
        times.append(time.perf_counter() - start)
        if proc.returncode not in (0, 1):
            raise SystemExit(proc.stderr.decode())
    print(f"  zplan sweep end to end, wall clock (process start included): median {statistics.median(times):.2f} s "
          f"(min {min(times):.2f}, max {max(times):.2f})")


def scaling() -> None:
    """Distinct layouts over a range of GPU counts and global batches, one core, CPU time,
    with a progress line on stderr (sweep's progress callback)."""
    name, gpu_counts, batches = SCALING
    model = loading.load_model(name)
    clear_caches()
    total = 0
    start = time.process_time()
    for gpus in gpu_counts:
        cluster = loading.cluster_for_gpus("a100-80gb", gpus)
        for batch in batches:
            setup = make_setup(2048, batch, 300e9)
            result = sweep.sweep(model, cluster, setup, sweep.Constraints(), top=1, rejected=0)
            total += result.evaluated
            print(f"\r  {gpus} GPUs, batch {batch}: {total:,} layouts so far", end="",
                  file=sys.stderr)
    seconds = time.process_time() - start
    print(file=sys.stderr)
    print(f"scaling sweep {name}: GPUs {gpu_counts[0]}-{gpu_counts[-1]} x global batch "
          f"{batches[0]}-{batches[-1]} ({len(gpu_counts) * len(batches)} sweeps): {total:,} layouts "
          f"in {seconds:.2f} s CPU = {total / seconds:,.0f} layouts/s")


def main() -> None:
    applied = heap.retain_freed_memory()  # as sweep() does; before the first timed evaluate()
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, "
          f"cores used: {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'}, "
          f"malloc settings (planner.search.heap): {'applied' if applied else 'not applied'}")
    for case in CASES:
        in_process(*case)
        if "--no-cli" not in sys.argv:
            cli(*case)
    scaling()


if __name__ == "__main__":
    main()
