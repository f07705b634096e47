"""The minimum number of GPUs each memory strategy needs (the `zplan fit` summary).

Strategies of the seeds: DDP, ZeRO-1/2/3 (seed 001 §2), ZeRO-3 with CPU offload (ZeRO-Offload)
and with NVMe offload (ZeRO-Infinity, seed 000), and Megatron's TP x PP x DP with ZeRO-1 (seed 004
§3.5.2). Counts are whole nodes, or a power-of-two share of one node, because that is how GPUs are
booked. Each count is found with `plan.plan_memory` itself at its most frugal settings: micro-batch
1, full activation recompute (activation checkpointing, which both DeepSpeed and Megatron users
turn on for large models), sequence parallelism with tp > 1, and enough micro-batches (m = pp) to
fill the 1F1B pipeline; so it is exactly as strict as `zplan fit` for that layout.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from planner.core import rules
from planner.core.errors import PlanInputError
from planner.memory.host import partial_node
from planner.memory.reserve import reserve_column
from planner.core import params
from planner.core.columns import LayoutColumns
from planner.memory import activations, model_states
from planner.memory.plan import plan_memory, stage_loss_column, stage_transient_column
from planner.core.spec import Cluster, Frozen, Layout, ModelSpec, TrainSetup

MAX_NODES = 1 << 16
"""Search ceiling: 65,536 nodes. A strategy that does not fit there is reported as never."""


class StrategyMinimum(Frozen):
    """The fewest GPUs with which a strategy fits, and the layout that achieves it."""

    strategy: str
    min_gpus: int | None
    """None when it never fits (e.g. DDP with a model larger than one GPU)."""
    layout: Layout | None


def cluster_with_gpus(cluster: Cluster, num_gpus: int) -> Cluster:
    """The same hardware with `num_gpus` GPUs: a share of one node, or whole nodes."""
    per_node = cluster.node.gpus_per_node
    if num_gpus < per_node:
        node = partial_node(cluster.node, num_gpus)  # its share of the node's RAM and NVMe
        return cluster.model_copy(update={"node": node, "num_nodes": 1})
    if num_gpus % per_node:
        raise PlanInputError(
            "gpus", f"{num_gpus} GPUs is not a whole number of {per_node}-GPU nodes"
        )
    return cluster.model_copy(update={"num_nodes": num_gpus // per_node})


def _fits(model: ModelSpec, cluster: Cluster, layout: Layout, setup: TrainSetup) -> bool:
    """`plan_memory(...).fits` of one layout at its own GPU count (the exact reference)."""
    batch = layout.micro_batch * layout.grad_accum * layout.dp
    setup = setup.model_copy(update={"global_batch": batch})
    try:
        return plan_memory(model, cluster_with_gpus(cluster, layout.num_gpus), layout, setup).fits
    except PlanInputError:
        return False


def _allowed(model: ModelSpec, cluster: Cluster, base: Layout, setup: TrainSetup) -> bool:
    """The rule table accepts `base` (its rules other than the GPU count and batch do not
    depend on dp), checked at dp = 1 on tp*pp GPUs' worth of cluster."""
    count = base.tp * base.pp
    ctx = rules.Context(model, cluster.model_copy(update={"num_nodes": 1, "node": cluster.node.model_copy(
        update={"gpus_per_node": count})}), setup.model_copy(update={
            "global_batch": base.micro_batch * base.grad_accum}))
    try:
        rules.check_layout(ctx, LayoutColumns.from_layout(base.model_copy(update={"dp": 1})))
    except PlanInputError:
        return False
    return True


def _fits_many(model: ModelSpec, cluster: Cluster, base: Layout, setup: TrainSetup,
               dps: np.ndarray) -> np.ndarray:
    """Does `base` fit at each data-parallel degree of `dps`? One array evaluation of the model
    (`model_states.state_parts` / `buffer_parts` over a dp column; activations do not depend on
    dp at a fixed micro-batch and m), every pipeline stage, and the node's CPU / NVMe with
    min(GPUs, GPUs per node) GPUs on it. Layouts whose host bytes differ between stages (pp > 1
    with offload) go through `plan_memory` one by one."""
    counts = base.tp * base.pp * dps
    per_node = np.minimum(counts, cluster.node.gpus_per_node)
    cols = LayoutColumns.from_layout(base).take(np.zeros(len(dps), dtype=np.int64))
    cols = cols.with_columns(dp=dps)
    prec, opt, node = setup.precision, setup.optimizer, cluster.node
    fits = np.ones(len(dps), dtype=bool)
    capacity = cluster.gpu.memory_bytes - reserve_column(
        cluster.gpu, setup.reserve_gib, cols["tp"], cols["pp"], cols["dp"])
    host = []
    seen: dict[tuple[int, int, int], tuple] = {}  # equal stages (the middle ones) once
    transient: dict[tuple, np.ndarray] = {}  # and their equal transients
    for sp, act, largest, persistent in _stage_facts(model, base, setup):
        key = (sp.total, largest, persistent)
        if key not in seen:
            P = np.full(len(dps), sp.total, dtype=np.int64)
            states = model_states.state_parts(P, cols, prec, opt, setup.host_accounting)
            buffers = model_states.buffer_parts(P, largest, persistent, cols, prec, base.buffers)
            seen[key] = (model_states.parts_total(states.gpu, P) + model_states.parts_total(buffers, P),
                         (model_states.parts_total(states.cpu, P),
                          model_states.parts_total(states.nvme, P)))
        gpu, stage_host = seen[key]
        kept = act.total_bytes - act.recompute_working_bytes - act.cp_working_bytes
        working, last = act.recompute_working_bytes + act.cp_working_bytes, sp.stage == base.pp - 1
        if (sp.total, kept, working, last) not in transient:
            transient[sp.total, kept, working, last] = stage_transient_column(  # memory.peak
                cols, sp.total, kept, working, stage_loss_column(model, setup, cols, last))
        transients = transient[sp.total, kept, working, last]
        fits &= gpu + act.total_bytes + transients <= capacity
        host.append(stage_host)
    if base.pp > 1 and any(np.any(c) or np.any(n) for c, n in host):
        return np.array([_fits(model, cluster, base.model_copy(update={"dp": int(d)}), setup)
                         for d in dps], dtype=bool)
    cpu, nvme = host[0]
    cpu_cap, nvme_cap = _host_capacity(cluster, counts)
    return fits & (per_node * cpu <= cpu_cap) & (per_node * nvme <= nvme_cap)


@functools.lru_cache(maxsize=256)
def _stage_facts(model: ModelSpec, base: Layout, setup: TrainSetup) -> tuple[tuple, ...]:
    """(parameters, activations, largest tensor, ZeRO-3 persistent elements) of each pipeline
    stage of `base`: none depends on dp, and `_min_dp` asks `_fits_many` about several dp lists
    of one base."""
    stages = params.stage_params(model, base.tp, base.pp)
    acts = activations.stage_activations(model, base, setup, [s.num_layers for s in stages])
    return tuple(
        (sp, act, params.largest_param_numel(model, base.tp, sp.stage, base.pp),
         model_states.zero3_persistent_numel(model, base.tp, sp, base.pp,
                                             base.buffers.param_persistence_threshold))
        for sp, act in zip(stages, acts, strict=True))


def _host_capacity(cluster: Cluster, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CPU and NVMe bytes of the node a job on `counts` GPUs sees: on a slice of a node its
    share (`cluster_with_gpus` -> `partial_node`, what fit and check plan with), else the node."""
    shares = {int(n): cluster_with_gpus(cluster, int(n)).node for n in np.unique(counts)
              if n < cluster.node.gpus_per_node}
    node = cluster.node
    cpu = np.array([shares[int(n)].cpu_memory_bytes if int(n) in shares else node.cpu_memory_bytes
                    for n in counts], dtype=np.int64)
    nvme = np.array([shares[int(n)].nvme_bytes if int(n) in shares else node.nvme_bytes
                     for n in counts], dtype=np.int64)
    return cpu, nvme


def _min_dp(model: ModelSpec, cluster: Cluster, base: Layout, setup: TrainSetup) -> int | None:
    """Smallest data-parallel degree at which `base` (tp, pp fixed) fits.

    Per-GPU memory never grows with dp for a fixed micro-batch (ZeRO divides by dp;
    tests/test_properties.py), so: the power-of-two shares of one node, then whole nodes on a
    doubling grid, then every count between the last miss and the first fit; each in one array
    evaluation (`_fits_many`)."""
    if not _allowed(model, cluster, base, setup):
        return None
    model_parallel = base.tp * base.pp
    per_node = cluster.node.gpus_per_node
    shares = [c // model_parallel for c in (1 << k for k in range(per_node.bit_length()))
              if c < per_node and c % model_parallel == 0]
    if shares:
        ok = _fits_many(model, cluster, base, setup, np.array(shares, dtype=np.int64))
        if ok.any():
            return shares[int(np.argmax(ok))]
    step = model_parallel // math.gcd(per_node, model_parallel)  # nodes per valid dp step
    top = MAX_NODES // step
    grid = [1 << k for k in range(top.bit_length()) if 1 << k <= top]
    unit = step * per_node // model_parallel  # dp per step
    ok = _fits_many(model, cluster, base, setup, np.array(grid, dtype=np.int64) * unit)
    if not ok.any():
        return None
    first = int(np.argmax(ok))
    low, high = (grid[first - 1] + 1 if first else 1), grid[first]
    while high - low > 4096:  # narrow a wide bracket by bisection before the last evaluation
        mid = (low + high) // 2
        if _fits_many(model, cluster, base, setup, np.array([mid * unit]))[0]:
            high = mid
        else:
            low = mid + 1
    span = np.arange(low, high + 1, dtype=np.int64)
    ok = _fits_many(model, cluster, base, setup, span * unit)
    return int(span[int(np.argmax(ok))]) * unit


def _zero_minimum(
    name: str, model: ModelSpec, cluster: Cluster, setup: TrainSetup, **layout_fields: object
) -> StrategyMinimum:
    base = Layout(micro_batch=1, grad_accum=1, recompute="full", **layout_fields)  # type: ignore[arg-type]
    dp = _min_dp(model, cluster, base, setup)
    layout = None if dp is None else base.model_copy(update={"dp": dp})
    return StrategyMinimum.computed(strategy=name, min_gpus=dp, layout=layout)


def _ddp_minimum(model: ModelSpec, cluster: Cluster, setup: TrainSetup) -> StrategyMinimum:
    """DDP replicates everything: it fits on one GPU or on none (seed 001 §1)."""
    layout = Layout(micro_batch=1, recompute="full")
    fits = _fits(model, cluster, layout, setup)
    return StrategyMinimum.computed(strategy="DDP", min_gpus=1 if fits else None, layout=layout if fits else None)


def _megatron_minimum(model: ModelSpec, cluster: Cluster, setup: TrainSetup) -> StrategyMinimum:
    """Fewest GPUs over tp (within a node, the rule table's tp rule) x pp x dp with ZeRO-1
    (004 §3.5.2)."""
    from planner.search import sweep  # here, not at the top: `zplan fit` with a layout needs no sweep

    best: Layout | None = None
    candidates = list(range(1, cluster.node.gpus_per_node + 1))
    tps = [t for t, ok in zip(candidates, sweep._tp_ok(model, cluster, setup, candidates)) if ok]
    pps = [p for p in range(1, model.num_layers + 1) if model.num_layers % p == 0]
    for tp in tps:
        for pp in pps:
            if best is not None and tp * pp >= best.num_gpus:
                continue
            base = Layout(tp=tp, pp=pp, zero_stage=1, micro_batch=1, grad_accum=pp,
                          recompute="full", sequence_parallel=tp > 1)
            dp = _min_dp(model, cluster, base, setup)
            if dp is not None and (best is None or tp * pp * dp < best.num_gpus):
                best = base.model_copy(update={"dp": dp})
    return StrategyMinimum.computed(
        strategy="TPxPPxDP (ZeRO-1)", min_gpus=best.num_gpus if best else None, layout=best
    )


def strategy_minimums(model: ModelSpec, cluster: Cluster, setup: TrainSetup) -> list[StrategyMinimum]:
    """The minimum GPU count of every strategy, in the order the seeds introduce them."""
    has_nvme = rules.nvme_ready(rules.Context(model, cluster, setup))  # the fit/sweep rule
    rows = [
        _ddp_minimum(model, cluster, setup),
        _zero_minimum("ZeRO-1", model, cluster, setup, zero_stage=1),
        _zero_minimum("ZeRO-2", model, cluster, setup, zero_stage=2),
        _zero_minimum("ZeRO-3", model, cluster, setup, zero_stage=3),
        _zero_minimum(
            "ZeRO-3 + CPU offload", model, cluster, setup,
            zero_stage=3, offload_optimizer="cpu", offload_params="cpu",
        ),
    ]
    if has_nvme:
        rows.append(
            _zero_minimum(
                "ZeRO-Infinity (NVMe)", model, cluster, setup,
                zero_stage=3, offload_optimizer="nvme", offload_params="nvme",
            )
        )
    rows.append(_megatron_minimum(model, cluster, setup))
    return rows
