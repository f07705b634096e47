"""Explain a "does not fit": the smallest changes to a layout that make it fit (issue 11).

The neighbours of a layout are the layouts one named change away: more recompute, a higher ZeRO
stage, the optimizer (then the parameters) offloaded to CPU, a smaller micro-batch (the global
batch kept by more accumulation), and twice the GPUs (twice dp, or twice pp). The neighbours on
the same cluster are masked by the rule table and evaluated in one array evaluation of the
memory model (`sweep.evaluate`, the function the sweep ranks with); twice the GPUs is one more
evaluation on the doubled cluster. Every neighbour the arrays say fits is confirmed with
`plan_memory` (the same model, row by row) before it is offered, so a suggestion, applied, fits.
For the search (no layout of the cluster fits): the strategy table's GPU counts
(`search_suggestions`).

Order: the cheapest kind of change first (`CHANGE_COST`: recompute and a smaller micro-batch
cost compute time, ZeRO costs communication, offload costs PCIe time, more GPUs cost GPUs),
then the largest headroom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from planner.core import rules
from planner.core.columns import LayoutColumns
from planner.core.errors import PlanInputError
from planner.core.spec import Cluster, Frozen, Layout, ModelSpec, TrainSetup
from planner.memory.plan import plan_memory

if TYPE_CHECKING:  # only a signature's annotation: `zplan check` does not import the strategies
    from planner.search.strategies import StrategyMinimum

CHANGE_COST = {"recompute": 0, "micro_batch": 1, "zero": 2, "offload": 3, "gpus": 4}
"""Rank of each kind of change (lower: offered first). A judgement, not a measurement: the
step-time cost of each depends on the model and the hardware (see `zplan fit` on the result)."""


class Suggestion(Frozen):
    """One change that makes the layout fit."""

    change: str
    """What to change, as the CLI flags say it, e.g. `--recompute full`."""
    kind: str
    """A key of CHANGE_COST."""
    layout: Layout
    """The layout with the change applied."""
    num_gpus: int
    """GPUs the changed layout runs on (more than the original for kind `gpus`)."""
    headroom_bytes: int
    """Headroom of the changed layout's fullest GPU (plan_memory)."""


def _neighbours(layout: Layout) -> list[tuple[str, str, Layout]]:
    """(change, kind, layout) one named change away on the same GPUs."""
    out: list[tuple[str, str, Layout]] = []
    update = layout.model_copy
    order = ("none", "selective", "full")
    for mode in order[order.index(layout.recompute) + 1:] if layout.recompute in order else ():
        out.append((f"--recompute {mode}", "recompute", update(update={"recompute": mode})))
    if layout.micro_batch > 1 and layout.micro_batch % 2 == 0:
        out.append((f"--micro-batch {layout.micro_batch // 2} --grad-accum {layout.grad_accum * 2}",
                    "micro_batch", update(update={"micro_batch": layout.micro_batch // 2,
                                                  "grad_accum": layout.grad_accum * 2})))
    for stage in range(layout.zero_stage + 1, 4):
        out.append((f"--zero {stage}", "zero", update(update={"zero_stage": stage})))
    if layout.offload_optimizer == "none":
        zero = max(layout.zero_stage, 1)
        out.append((f"--zero {zero} --offload-optimizer cpu" if zero != layout.zero_stage
                    else "--offload-optimizer cpu", "offload",
                    update(update={"zero_stage": zero, "offload_optimizer": "cpu"})))
    if layout.offload_params == "none":
        out.append(("--zero 3 --offload-optimizer cpu --offload-params cpu", "offload",
                    update(update={"zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu"})))
    return out


def _doubled(layout: Layout) -> list[tuple[str, str, Layout]]:
    """(change, kind, layout) on twice the GPUs: dp x 2 (accumulation halved when it can be,
    so the global batch stays), or pp x 2."""
    out = []
    if layout.grad_accum % 2 == 0:
        out.append((f"--gpus {2 * layout.num_gpus} (dp {2 * layout.dp}, grad-accum {layout.grad_accum // 2})",
                    "gpus", layout.model_copy(update={"dp": 2 * layout.dp, "grad_accum": layout.grad_accum // 2})))
    out.append((f"--gpus {2 * layout.num_gpus} (pp {2 * layout.pp})", "gpus",
                layout.model_copy(update={"pp": 2 * layout.pp})))
    return out


def _fitting(model: ModelSpec, cluster: Cluster, setup: TrainSetup,
             options: list[tuple[str, str, Layout]]) -> list[Suggestion]:
    """The options that fit: rule mask + one array evaluation, confirmed by plan_memory."""
    from planner.search import sweep

    if not options:
        return []
    cols = LayoutColumns.from_layouts([lay for _, _, lay in options])
    valid, _ = rules.mask(rules.Context(model, cluster, setup), cols)
    if not valid.any():
        return []
    keep = np.nonzero(valid)[0]
    first = options[int(keep[0])][2]
    c = sweep.Constraints(flash_attention=first.flash_attention, buffers=first.buffers)
    mem = sweep.evaluate(model, cluster, setup, cols.take(keep), c)
    ok = np.logical_and.reduce(sweep.fit_masks(mem, cluster))
    out = []
    for i in keep[ok]:
        change, kind, lay = options[int(i)]
        try:
            plan = plan_memory(model, cluster, lay, setup)
        except PlanInputError:
            continue
        if plan.fits:
            out.append(Suggestion.computed(change=change, kind=kind, layout=lay, num_gpus=lay.num_gpus,
                                  headroom_bytes=plan.peak_stage.headroom_bytes))
    return out


def suggest_changes(model: ModelSpec, cluster: Cluster, layout: Layout, setup: TrainSetup,
                    limit: int = 5) -> list[Suggestion]:
    """Up to `limit` one-step changes of `layout` that fit, cheapest kind first (CHANGE_COST),
    then the most headroom; [] when none does (or the layout fits already)."""
    from planner.search.strategies import cluster_with_gpus

    if plan_memory(model, cluster, layout, setup).fits:
        return []
    found = _fitting(model, cluster, setup, _neighbours(layout))
    try:
        bigger = cluster_with_gpus(cluster, 2 * cluster.num_gpus)
    except PlanInputError:
        bigger = None
    if bigger is not None and cluster.num_gpus == layout.num_gpus:
        found += _fitting(model, bigger, setup, _doubled(layout))
    found.sort(key=lambda s: (CHANGE_COST[s.kind], -s.headroom_bytes))
    return found[:limit]


def search_suggestions(model: ModelSpec, cluster: Cluster, setup: TrainSetup,
                       strategies: list[StrategyMinimum], limit: int = 5) -> list[Suggestion]:
    """When no layout of the cluster fits (the search already tried every recompute mode, ZeRO
    stage, offload and micro-batch): the GPU counts at which each strategy fits, from the
    strategy table, each confirmed with plan_memory; fewest GPUs first."""
    from planner.search.strategies import cluster_with_gpus

    out = []
    for row in strategies:
        if row.min_gpus is None or row.layout is None or row.min_gpus <= cluster.num_gpus:
            continue
        try:
            bigger = cluster_with_gpus(cluster, row.min_gpus)
            plan = plan_memory(model, bigger, row.layout, setup)
        except PlanInputError:
            continue
        if plan.fits:
            out.append(Suggestion.computed(change=f"--gpus {row.min_gpus} ({row.strategy})", kind="gpus",
                                  layout=row.layout, num_gpus=row.min_gpus,
                                  headroom_bytes=plan.peak_stage.headroom_bytes))
    out.sort(key=lambda s: (s.num_gpus, -s.headroom_bytes))
    return out[:limit]
