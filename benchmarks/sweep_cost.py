"""A cold `sweep()` split into the work that grows with the rows and the work that does not, and
what 5 M layouts/s (issue 9's goal) would leave for the second (a benchmark; asserts nothing).

Run from the checkout: `python benchmarks/sweep_cost.py`. One core pinned, CPU time, least of
the repetitions, the planner's caches cleared before each (`sweep_speed.clear_caches`: a cold
sweep, as one `zplan sweep` sees it). For the two spaces of `sweep_speed.py` it prints:
- **whole**: the cold `sweep()` of the space (n layouts, `timed` of them with state terms);
- **one structure**: the cold `sweep()` pinned to the best layout's tp, pp and micro-batch
  (every state, recompute, sequence-parallel, cp and shard-group option of that structure
  left): what a sweep costs with few rows;
- **per row**, from the candidates tiled k = 4 and 16 times (`sweep_speed.py`'s tiling: the
  copies keep their enumeration group key, so the per-key work, tables and groups, is the same
  and the difference is the numpy work that grows with the rows): `memory_all` per candidate,
  and the state terms (`StepTimes.evaluate`) per timed candidate, on a quarter of the rows
  (a sweep times about that share);
- **row work** of the whole sweep: n x memory per row + timed x state terms per row (the
  enumeration's and the ranking's own row work not included: a lower bound), and the rest of
  the sweep, the work that does not grow with the rows (Python per key, per group, per call);
- **5 M/s budget**: n / 5e6 s, and what it leaves for that rest once the row work is paid.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# sweep_speed pins one core, sets the BLAS thread counts to 1 before numpy loads and puts the
# checkout on sys.path
from sweep_speed import CASES, best_of, space  # noqa: E402

import numpy as np  # noqa: E402

from planner.search import heap, sweep  # noqa: E402

GOAL_PER_S = 5e6
"""Issue 9's goal: layouts evaluated per second, whole sweep(), one core."""
REPEATS = 7
"""Cold repetitions of each figure (the least CPU time is kept, `sweep_speed.best_of`)."""


def per_row_s(model, cluster, setup, c, cands, key) -> tuple[float, float]:
    """(memory_all s per candidate, state terms s per timed candidate) from tilings k = 4, 16."""
    n, out = len(cands), {}
    for k in (4, 16):
        tiled, tiled_key = cands.take(np.tile(np.arange(n), k)), np.tile(key, k)
        quarter = np.arange(0, k * n, 4)

        def memory():
            return sweep.memory_all(model, cluster, setup, tiled, c, None, None, tiled_key)

        def memory_and_states():
            memory()[1].evaluate(quarter)

        t_memory = best_of(memory, REPEATS)
        out[k] = (t_memory, best_of(memory_and_states, REPEATS) - t_memory, len(quarter))
    memory_s = (out[16][0] - out[4][0]) / (12 * n)
    states_s = (out[16][1] - out[4][1]) / (out[16][2] - out[4][2])
    return memory_s, states_s


def case(model_name: str, gpus: int, batch: int) -> None:
    model, cluster, setup, c, cands, key = space(model_name, gpus, batch)
    n = len(cands)
    result = sweep.sweep(model, cluster, setup, c)
    whole_s = best_of(lambda: sweep.sweep(model, cluster, setup, c), REPEATS)
    best = result.top[0].layout
    pinned = sweep.Constraints(tp=(best.tp,), pp=(best.pp,), micro_batch=(best.micro_batch,))
    n_pinned = len(sweep.enumerate_product(model, cluster, setup, pinned)[0])
    pinned_s = best_of(lambda: sweep.sweep(model, cluster, setup, pinned), REPEATS)
    memory_s, states_s = per_row_s(model, cluster, setup, c, cands, key)
    rows_s = n * memory_s + result.timed * states_s
    budget_s = n / GOAL_PER_S
    print(f"{model_name} on {gpus} x a100-80gb, global batch {batch}")
    print(f"  whole          {n:8,} layouts ({result.timed:,} timed)  {whole_s * 1e3:7.2f} ms"
          f" = {n / whole_s / 1e6:5.2f} M layouts/s")
    print(f"  one structure  {n_pinned:8,} layouts (tp {best.tp}, pp {best.pp}, micro-batch "
          f"{best.micro_batch})  {pinned_s * 1e3:7.2f} ms")
    print(f"  per row        memory {memory_s * 1e9:5.0f} ns a candidate, state terms "
          f"{states_s * 1e9:5.0f} ns a timed candidate")
    print(f"  row work       {rows_s * 1e3:7.2f} ms   the rest (per key, group, call) "
          f"{(whole_s - rows_s) * 1e3:7.2f} ms")
    print(f"  5 M/s budget   {budget_s * 1e3:7.2f} ms   left for the rest after the row work "
          f"{(budget_s - rows_s) * 1e3:7.2f} ms ({(whole_s - rows_s) / max(budget_s - rows_s, 1e-9):.1f}x"
          f" less than now)")


def main() -> None:
    heap.retain_freed_memory()  # as sweep() does
    for args in CASES:
        case(*args)


if __name__ == "__main__":
    main()
