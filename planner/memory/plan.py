"""Compose the formula modules into one memory plan per GPU, per pipeline stage, per node.

`validate_layout` applies the layout rule table (planner.core.rules; every factor printed);
`plan_memory` adds up model states and named buffers (planner.memory.model_states, one row of
the same column functions the sweep evaluates), activations and recompute working memory
(planner.memory.activations) for each pipeline stage, and CPU / NVMe bytes of the busiest node
(`node_stage_ranks`, shared with the sweep).
"""

from __future__ import annotations

import numpy as np

from planner.memory import activations, experts, model_states, peak
from planner.memory.model_states import shard_ranks
from planner.core import params
from planner.core import rules
from planner.core.columns import DP_ENGINES, LayoutColumns
from planner.memory.host import accounting_used
from planner.memory.reserve import layout_reserve_bytes, reserve_missing_note, training_communicators
from planner.core.spec import GIB, Cluster, Frozen, Layout, ModelSpec, TrainSetup, ceil_div


class StageMemory(Frozen):
    """Bytes on one GPU of one pipeline stage (the tp rank holding the most)."""

    stage: int
    """Pipeline stage, 1-based."""
    num_layers: int
    num_params: int
    """Parameters held by one GPU of this stage before ZeRO partitioning (its tp/pp shard, the
    routed experts divided by ep)."""
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    """Activations kept for backward: micro-batches in flight x bytes per micro-batch."""
    in_flight_microbatches: int
    buffers: dict[str, int]
    """Named temporary buffers (gradient buckets, ZeRO-3 prefetch / live parameters) and the
    step's transients beyond the resident bytes when non-zero (planner.memory.peak.plan_transients):
    `loss_backward` (the loss's fp32 gradients at the start of backward, last stage, beyond the
    recompute segment) and `optimizer_step` (the optimizer's temporaries beyond the freed
    activations)."""
    working: dict[str, int]
    """Named working memory (recompute of one checkpointed segment during backward)."""
    total_bytes: int
    """The step's peak on this GPU (planner.memory.peak): every part above."""
    capacity_bytes: int
    """Nominal HBM minus the runtime reserve (MemoryPlan.reserve)."""
    headroom_bytes: int
    """capacity - total; negative when the stage overflows."""
    fits: bool


class NodeMemory(Frozen):
    """Host bytes of the busiest node: CPU DRAM and NVMe under offload."""

    cpu_bytes: int
    cpu_capacity_bytes: int
    nvme_bytes: int
    nvme_capacity_bytes: int


class MemoryPlan(Frozen):
    """The whole answer to "does it fit": per stage, per node, and what overflows."""

    stages: list[StageMemory]
    node: NodeMemory
    fits: bool
    overflows: list[str]
    """One phrase per overflowing resource, e.g. `GPU memory on stage 1 by 12.30 GiB`."""
    reserve: dict[str, int] = {}
    """Runtime reserve of every GPU, named parts in bytes (planner.memory.reserve); capacity =
    nominal HBM - their sum. Empty when the GPU profile cannot say (see `reserve_note`)."""
    reserve_note: str = ""
    """Why no reserve was subtracted, when none was."""
    host_accounting_note: str = ""
    """Which host accounting the plan used, when offloading makes the two differ
    (planner.memory.host.accounting_used)."""

    @property
    def peak_stage(self) -> StageMemory:
        """The stage with the least headroom."""
        return min(self.stages, key=lambda s: s.headroom_bytes)


def validate_layout(model: ModelSpec, cluster: Cluster, layout: Layout, setup: TrainSetup) -> None:
    """Cross-field rules of model x cluster x layout x setup (planner.core.rules, the table the
    sweep masks its candidates with); the first broken one raises a one-line PlanInputError
    naming every factor."""
    rules.check_layout(rules.Context(model, cluster, setup), LayoutColumns.from_layout(layout))


def plan_memory(model: ModelSpec, cluster: Cluster, layout: Layout, setup: TrainSetup) -> MemoryPlan:
    """Per-stage GPU bytes and busiest-node host bytes for a validated layout."""
    validate_layout(model, cluster, layout, setup)
    stage_params = params.stage_params(model, layout.tp, layout.pp,
                                       first=layout.first_stage_layers,
                                       last=layout.last_stage_layers)
    stage_acts = activations.stage_activations(
        model, layout, setup, [s.num_layers for s in stage_params]
    )
    reserve = gpu_reserve(cluster, layout, setup)
    capacity = cluster.gpu.memory_bytes - sum(reserve.values())
    routed = experts.stage_routed_params(model, layout.tp, layout.pp, layout.first_stage_layers,
                                         layout.last_stage_layers)
    stages: list[StageMemory] = []
    host: list[tuple[int, int]] = []  # (cpu_bytes, nvme_bytes) per GPU of each stage
    for index, (sp, act) in enumerate(zip(stage_params, stage_acts, strict=True)):
        states = experts.model_state_bytes(sp.total, routed[index], setup.precision,
                                           setup.optimizer, layout, setup.host_accounting)
        sp = sp.model_copy(update={"total": experts.params_per_gpu(sp.total, routed[index], layout.ep)})
        working = {"recompute_segment": act.recompute_working_bytes} if act.recompute_working_bytes else {}
        if act.cp_working_bytes:
            working["cp_attention_buffers"] = act.cp_working_bytes
        kept = act.total_bytes - act.recompute_working_bytes - act.cp_working_bytes
        buffers = model_states.buffer_bytes(model, layout, setup.precision, sp) | stage_transients(
            model, layout, setup, sp.total, kept,
            act.recompute_working_bytes + act.cp_working_bytes,  # the transient working bytes
            last=index == len(stage_params) - 1)
        total = states.gpu_total_bytes + kept + sum(buffers.values()) + sum(working.values())
        stages.append(
            StageMemory.computed(
                stage=index + 1,
                num_layers=sp.num_layers,
                num_params=sp.total,
                params_bytes=states.params_bytes,
                grads_bytes=states.grads_bytes,
                optimizer_bytes=states.optimizer_bytes,
                activations_bytes=kept,
                in_flight_microbatches=act.in_flight_microbatches,
                buffers=buffers,
                working=working,
                total_bytes=total,
                capacity_bytes=capacity,
                headroom_bytes=capacity - total,
                fits=total <= capacity,
            )
        )
        host.append((states.cpu_bytes, states.nvme_bytes))
    node = _busiest_node(cluster, layout, host)
    overflows = _overflows(stages, node)
    note = "" if reserve else reserve_missing_note(cluster.gpu)
    used = accounting_used(setup.host_accounting, layout.zero_stage, layout.offload_optimizer)
    return MemoryPlan.computed(stages=stages, node=node, fits=not overflows, overflows=overflows,
                      reserve=reserve, reserve_note=note, host_accounting_note=used or "")


def stage_loss_column(model: ModelSpec, setup: TrainSetup, cols: LayoutColumns, last):
    """The loss backward's bytes of one stage per layout row where `last` (the stage holds the
    loss), else 0 (planner.memory.peak). It reads only tp, micro_batch and cp: the sweep
    evaluates it once per activity group."""
    return np.where(last, peak.stage_loss_bytes(setup, model.vocab_size, cols["tp"],
                                                cols["micro_batch"], cols.get("cp", 1)), 0)


def stage_temps_column(cols: LayoutColumns, num_params):
    """The optimizer's temporary bytes on one GPU of a stage of `num_params` per layout row
    (planner.memory.peak), over the local shard of the optimizer states: the ranks the states
    are sharded over (`model_states.shard_ranks`, dp x cp, as `state_parts` partitions them)."""
    return peak.gpu_optimizer_temp_bytes(num_params, shard_ranks(cols), cols["zero_stage"],
                                         cols["dp_engine"] == DP_ENGINES.index("fsdp2"),
                                         cols["offload_optimizer"] > 0)


def stage_transient_column(cols: LayoutColumns, num_params, kept_bytes, recompute_bytes,
                           loss_bytes) -> np.ndarray:
    """What the step's transients add to a stage, every row (the sweep and the strategy
    minimums): `peak.plan_transients` summed, of the stage's loss bytes (`stage_loss_column`)
    and its optimizer temporaries (`stage_temps_column`)."""
    temps = stage_temps_column(cols, num_params)
    return sum(peak.plan_transients(kept_bytes, recompute_bytes, loss_bytes, temps).values())


def stage_transients(model: ModelSpec, layout: Layout, setup: TrainSetup, num_params: int,
                     kept_bytes: int, recompute_bytes: int, *, last: bool) -> dict[str, int]:
    """The non-zero named transients of one stage: `stage_loss_column` and
    `stage_temps_column` of one row, in exact Python integers (a plan's activation bytes can
    exceed int64; tests/test_integer_safety.py)."""
    cols = LayoutColumns.from_layout(layout)
    loss, temps = (int(np.asarray(x).reshape(-1)[0]) for x in (
        stage_loss_column(model, setup, cols, last), stage_temps_column(cols, num_params)))
    parts = peak.plan_transients(kept_bytes, recompute_bytes, loss, temps)
    return {name: int(v) for name, v in parts.items() if int(v)}


def gpu_reserve(cluster: Cluster, layout: Layout, setup: TrainSetup) -> dict[str, int]:
    """The runtime reserve of one GPU of this layout: one NCCL communicator per parallel group
    of size > 1 (planner.memory.reserve; the sweep uses the same `layout_reserve_bytes`)."""
    communicators = training_communicators(layout.tp, layout.pp, layout.dp, layout.cp)
    return layout_reserve_bytes(cluster.gpu, communicators, setup.reserve_gib)


def node_stage_ranks(ranks_per_stage: int, pp: int, gpus_per_node: int, num_nodes: int,
                     edges: tuple[int, ...] | None = None) -> list[dict[int, int]]:
    """Ranks of each pipeline stage on every node whose mix of stages can differ, with
    Megatron-LM's rank order: tp fastest, then dp, then pp (`parallel_state.py`, order
    "tp-cp-ep-dp-pp"), so global rank r belongs to stage r // (tp*cp*dp) and node r // g.

    A node either holds a stage boundary (its ranks span stages) or lies inside one stage; the
    nodes holding a boundary and, per stage, the first node inside it show every mix. Each
    entry is {stage (0-based): ranks on that node}. `edges`: only the nodes around these ranks
    (and their neighbours), for a caller to whom some stages are alike (the sweep: every middle
    stage holds the same bytes, so the first/middle and middle/last boundaries and the ends
    show every mix of stage kinds)."""
    g, r_s = gpus_per_node, ranks_per_stage
    if edges is not None:
        nodes = {n + d for r in edges for n in ((r - 1) // g, r // g) for d in (-1, 0, 1)}
    else:
        nodes = set()
        for stage in range(pp):
            first, last = stage * r_s, (stage + 1) * r_s
            nodes |= {first // g, (last - 1) // g}
            inner = -(-first // g)
            if (inner + 1) * g <= last:
                nodes.add(inner)
    out = []
    for node in sorted(n for n in nodes if 0 <= n < num_nodes):
        lo, hi = node * g, (node + 1) * g
        counts: dict[int, int] = {}
        for stage in range(lo // r_s, min((hi - 1) // r_s, pp - 1) + 1):
            counts[stage] = min(hi, (stage + 1) * r_s) - max(lo, stage * r_s)
        out.append(counts)
    return out


def _busiest_node(cluster: Cluster, layout: Layout, host: list[tuple[int, int]]) -> NodeMemory:
    """Host bytes of the node holding the most (`node_stage_ranks`, Megatron's rank order)."""
    nodes = node_stage_ranks(layout.tp * layout.cp * layout.dp, layout.pp, cluster.node.gpus_per_node,
                             cluster.num_nodes)
    cpu = max(sum(n * host[s][0] for s, n in node.items()) for node in nodes)
    nvme = max(sum(n * host[s][1] for s, n in node.items()) for node in nodes)
    return NodeMemory.computed(
        cpu_bytes=cpu,
        cpu_capacity_bytes=cluster.node.cpu_memory_bytes,
        nvme_bytes=nvme,
        nvme_capacity_bytes=cluster.node.nvme_bytes,
    )


def _overflows(stages: list[StageMemory], node: NodeMemory) -> list[str]:
    """One phrase per resource that does not fit, naming where and by how much."""
    out = [
        f"GPU memory on stage {s.stage} by {-s.headroom_bytes / GIB:,.2f} GiB"
        for s in stages
        if not s.fits
    ]
    if node.cpu_bytes > node.cpu_capacity_bytes:
        out.append(f"CPU memory per node by {(node.cpu_bytes - node.cpu_capacity_bytes) / GIB:,.2f} GiB")
    if node.nvme_bytes > node.nvme_capacity_bytes:
        out.append(f"NVMe per node by {(node.nvme_bytes - node.nvme_capacity_bytes) / GIB:,.2f} GiB")
    return out
