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

import math

from planner.core import rules
from planner.core.errors import PlanInputError
from planner.memory.plan import plan_memory
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
        node = cluster.node.model_copy(update={"gpus_per_node": num_gpus})
        return cluster.model_copy(update={"node": node, "num_nodes": 1})
    if num_gpus % per_node:
        raise PlanInputError(
            "gpus", f"{num_gpus} GPUs is not a whole number of {per_node}-GPU nodes"
        )
    return cluster.model_copy(update={"num_nodes": num_gpus // per_node})


def _fits(model: ModelSpec, cluster: Cluster, layout: Layout, setup: TrainSetup) -> bool:
    batch = layout.micro_batch * layout.grad_accum * layout.dp
    setup = setup.model_copy(update={"global_batch": batch})
    try:
        return plan_memory(model, cluster_with_gpus(cluster, layout.num_gpus), layout, setup).fits
    except PlanInputError:
        return False


def _min_dp(model: ModelSpec, cluster: Cluster, base: Layout, setup: TrainSetup) -> int | None:
    """Smallest data-parallel degree at which `base` (tp, pp fixed) fits.

    Per-GPU memory never grows with dp for a fixed micro-batch (ZeRO divides by dp), so below one
    node the counts are tried in turn and above it the node count is bisected.
    """
    model_parallel = base.tp * base.pp
    per_node = cluster.node.gpus_per_node

    def fits(dp: int) -> bool:
        return _fits(model, cluster, base.model_copy(update={"dp": dp}), setup)

    count = 1
    while count < per_node:  # 1, 2, 4, ... GPUs: a power-of-two share of one node
        if count % model_parallel == 0 and fits(count // model_parallel):
            return count // model_parallel
        count *= 2
    step = model_parallel // math.gcd(per_node, model_parallel)  # nodes per valid dp step
    low, high = 1, MAX_NODES // step
    if not fits(high * step * per_node // model_parallel):
        return None
    while low < high:
        mid = (low + high) // 2
        if fits(mid * step * per_node // model_parallel):
            high = mid
        else:
            low = mid + 1
    return low * step * per_node // model_parallel


def _zero_minimum(
    name: str, model: ModelSpec, cluster: Cluster, setup: TrainSetup, **layout_fields: object
) -> StrategyMinimum:
    base = Layout(micro_batch=1, grad_accum=1, recompute="full", **layout_fields)  # type: ignore[arg-type]
    dp = _min_dp(model, cluster, base, setup)
    layout = None if dp is None else base.model_copy(update={"dp": dp})
    return StrategyMinimum(strategy=name, min_gpus=dp, layout=layout)


def _ddp_minimum(model: ModelSpec, cluster: Cluster, setup: TrainSetup) -> StrategyMinimum:
    """DDP replicates everything: it fits on one GPU or on none (seed 001 §1)."""
    layout = Layout(micro_batch=1, recompute="full")
    fits = _fits(model, cluster, layout, setup)
    return StrategyMinimum(strategy="DDP", min_gpus=1 if fits else None, layout=layout if fits else None)


def _megatron_minimum(model: ModelSpec, cluster: Cluster, setup: TrainSetup) -> StrategyMinimum:
    """Fewest GPUs over tp (within a node, dividing heads) x pp x dp with ZeRO-1 (004 §3.5.2)."""
    best: Layout | None = None
    per_node = cluster.node.gpus_per_node
    tps = [t for t in range(1, per_node + 1) if model.num_heads % t == 0 and model.kv_heads % t == 0]
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
    return StrategyMinimum(
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
