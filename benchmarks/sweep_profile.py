"""Where a cold `sweep()` spends its time, statement by statement (a benchmark, asserts nothing).

Run from the checkout: `python benchmarks/sweep_profile.py [MODEL GPUS GLOBAL_BATCH]`
(default: GPT-3 175B on 1024 A100 80 GB, global batch 1536; `gpt-1t 3072 3072` for the 1T case).

cProfile inflates Python-heavy code several times over (every call pays the profiler), so this
script times statements instead: each top-level statement of `sweep`, `enumerate_product`,
`memory_columns`, `model_state_columns`, `steptime.group_times`, `row_columns`, `step_terms` and
`state_terms` gets a
CPU-time mark (time.process_time) after it, by rewriting those functions' syntax trees in a
copy of their module namespace. One clock runs through the whole call: a statement's figure is
the CPU time since the previous mark, so it excludes the marked statements of the functions it
calls and the figures add up to the whole sweep (a callee's first statement also carries its
caller's argument evaluation). The marks cost ~1 us each. One core pinned, caches cleared before every repetition (a cold sweep(), as
`benchmarks/sweep_speed.py` measures it); mean over the repetitions.
"""

from __future__ import annotations

import ast
import collections
import inspect
import os
import sys
import textwrap
import time
from pathlib import Path

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sweep_speed import clear_caches  # noqa: E402

from planner.io import loading  # noqa: E402
from planner.io.jobfile import make_setup  # noqa: E402
from planner.search import heap, sweep  # noqa: E402
from planner.timing import steptime  # noqa: E402

REPEATS = 30
TIMED = {sweep: ("sweep", "enumerate_product", "memory_columns", "model_state_columns"),
         steptime: ("group_times", "row_columns", "step_terms", "state_terms")}
_spent: dict[str, float] = collections.defaultdict(float)
_last = [0.0]


def _mark(label: str) -> None:
    now = time.process_time()
    _spent[label] += now - _last[0]
    _last[0] = time.process_time()


def _call(name: str, *args) -> ast.Expr:
    return ast.Expr(ast.Call(ast.Name(name, ast.Load()), [ast.Constant(a) for a in args], []))


def instrument(module, name: str) -> None:
    """Replace module.name by a copy with a `_mark` after each top-level statement (a nested
    function counts where it is called)."""
    fn = getattr(module, name)
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    node = tree.body[0]
    node.decorator_list = []
    body: list[ast.stmt] = []
    for st in node.body:
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
            continue  # the docstring
        line = st.lineno + fn.__code__.co_firstlineno - 1
        label = f"{name}:{line} {ast.unparse(st).splitlines()[0][:72]}"
        if isinstance(st, ast.Return):
            body += [ast.Assign([ast.Name("_value", ast.Store())], st.value), _call("_mark", label),
                     ast.Return(ast.Name("_value", ast.Load()))]
        elif isinstance(st, ast.FunctionDef):
            body.append(st)
        else:
            body += [st, _call("_mark", label)]
    node.body = body
    ast.fix_missing_locations(tree)
    module.__dict__.update(_mark=_mark)
    exec(compile(tree, module.__file__, "exec"), module.__dict__)


def main() -> None:
    name, gpus, batch = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 \
        else ("gpt3-175b", 1024, 1536)
    heap.retain_freed_memory()
    model = loading.load_model(name)
    cluster = loading.cluster_for_gpus("a100-80gb", gpus)
    setup = make_setup(2048, batch, 300e9)
    c = sweep.Constraints()
    plain = []
    for _ in range(REPEATS):
        clear_caches()
        start = time.process_time()
        sweep.sweep(model, cluster, setup, c)
        plain.append(time.process_time() - start)
    for module, names in TIMED.items():
        for fn_name in names:
            instrument(module, fn_name)
    for _ in range(3):  # warm-up of the instrumented copies
        clear_caches()
        sweep.sweep(model, cluster, setup, c)
    _spent.clear()
    for _ in range(REPEATS):
        clear_caches()
        _last[0] = time.process_time()
        sweep.sweep(model, cluster, setup, c)
    print(f"{name} on {gpus} x a100-80gb, global batch {batch}: cold sweep() without marks "
          f"{sum(plain) / REPEATS * 1e3:.1f} ms mean, {min(plain) * 1e3:.1f} ms least of {REPEATS}")
    print(f"with marks: {sum(_spent.values()) / REPEATS * 1e3:.1f} ms mean; CPU ms per cold "
          f"sweep() (mean) of each statement (function:line), without its marked callees:")
    for label, seconds in sorted(_spent.items(), key=lambda kv: -kv[1])[:int(os.environ.get("TOP", 40))]:
        print(f"{seconds / REPEATS * 1e3:8.3f}  {label}")


if __name__ == "__main__":
    main()
