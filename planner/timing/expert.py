"""Expert parallelism in the step time: the dispatch / combine all-to-all of every MoE layer.

With expert parallelism of degree ep, an MoE layer sends each token's hidden state to the ep
ranks holding its top-k experts (dispatch) and brings the k expert outputs back (combine):
Megatron-Core's `MoEAlltoAllTokenDispatcher` (megatron/core/transformer/moe/token_dispatcher.py,
commit d98e8a64: `token_dispatch` and `token_combine` are one `all_to_all` over the ep group
each), DeepSpeed-MoE's `_AllToAll` (deepspeed/moe/sharded_moe.py). Per GPU and per all-to-all:

    send buffer S = tokens_per_gpu x top_k x hidden x element_bytes x f

with f the capacity factor when experts are padded to capacity (Megatron
`--moe-expert-capacity-factor` + `--moe-pad-expert-input-to-capacity`; DeepSpeed's capacity
buffers), else the stated load imbalance (dropless: the busiest rank receives f x the average).
Of S the fraction (ep - 1) / ep leaves the GPU; `collectives.all_to_all_s` (the one all-to-all
formula) splits it over NVLink and the NIC share by where the ep group's ranks sit. The ep
ranks are tp apart in Megatron's rank order (tp-cp-ep-dp-pp, parallel_state.py), so one node
holds min(ep, gpus_per_node / tp) of them.

Per MoE layer and micro-batch: the forward's dispatch and combine, the backward's two
all-to-alls of their gradients (same sizes), and with full recompute the forward's two again.
Tokens per GPU: b·s / tp (the tp ranks dispatch disjoint token slices: with sequence
parallelism the sequence split, without it a named approximation). The all-to-all is counted
on the critical path (Megatron overlaps it with compute only with `--overlap-moe-expert-
parallel-comm`; DeepSeek-V3's DualPipe hides it: docs/moe.md names this as the main error).
"""

from __future__ import annotations

import functools

import numpy as np

from planner.core import flops as flops_mod
from planner.core.columns import on_distinct
from planner.core.spec import ModelSpec, TrainSetup
from planner.memory import experts
from planner.timing import collectives




def routed_token_factor(setup: TrainSetup) -> float:
    """f of the module docstring: the capacity factor when given, else the load imbalance."""
    if setup.moe_capacity_factor is not None:
        return setup.moe_capacity_factor
    return setup.moe_load_imbalance


def dispatch_bytes(tokens_per_gpu, top_k: int, hidden: int, element_bytes: int, factor: float):
    """Send buffer of one all-to-all on one GPU: tokens x top_k x hidden x bytes x f."""
    return tokens_per_gpu * top_k * hidden * element_bytes * factor


def all_to_alls_per_layer(forward_share) -> np.ndarray:
    """Dispatch + combine forward, their gradients backward: 4; full recompute repeats the
    forward's two: 6, block recompute on its share of the blocks (`forward_share`,
    `flops.forward_repeat_share`: 1 full / every_k, 0 none / selective; selective recompute
    keeps the MoE layer's outputs)."""
    return 4 + 2 * np.asarray(forward_share, dtype=np.float64)


def ep_ranks_per_node(ep, tp, gpus_per_node: int):
    """Ranks of one ep group on one node: the group's ranks are tp apart (Megatron rank order
    tp-cp-ep-dp-pp), so a node of g GPUs holds min(ep, max(g // tp, 1)) of them."""
    return np.minimum(ep, np.maximum(gpus_per_node // np.asarray(tp), 1))


@functools.lru_cache(maxsize=1024)
def most_moe_layers(model: ModelSpec, pp: int, first: int = 0, last: int = 0) -> int:
    """MoE blocks of the stage holding the most of them (`experts.moe_layers_per_stage`)."""
    return max(experts.moe_layers_per_stage(model, pp, first or None, last or None))


def moe_layers_column(model: ModelSpec, cols) -> np.ndarray:
    """`most_moe_layers` of every layout row (pp and the uneven-split columns when present)."""
    pp = np.asarray(cols["pp"])
    first = np.asarray(cols["first_stage_layers"]) if "first_stage_layers" in cols else np.zeros_like(pp)
    last = np.asarray(cols["last_stage_layers"]) if "last_stage_layers" in cols else np.zeros_like(pp)
    return on_distinct(lambda rows: {"moe": np.array([
        most_moe_layers(model, int(p), int(f), int(la))
        for p, f, la in zip(pp[rows], first[rows], last[rows])])}, pp, first, last)["moe"]


def ep_comm_s(model: ModelSpec, setup: TrainSetup, cols, rates) -> np.ndarray:
    """All-to-all seconds per step on the slowest stage's GPU, every row (0 where ep = 1).
    `rates`: steptime.Rates (intra / inter bandwidth and latency, GPUs per node)."""
    ep, tp = np.asarray(cols["ep"]) if "ep" in cols else np.ones_like(cols["tp"]), cols["tp"]
    if not model.is_moe or not np.any(ep > 1):
        return np.zeros(len(np.asarray(cols["tp"])))
    tokens = cols["micro_batch"] * setup.seq_len / tp
    size = dispatch_bytes(tokens, model.experts_per_token, model.hidden_size,
                          setup.precision.activation_bytes, routed_token_factor(setup))
    per_node = ep_ranks_per_node(ep, tp, rates.gpus_per_node)
    nodes = np.ceil(ep / per_node)
    one = collectives.all_to_all_s(size, per_node, nodes, rates.intra_bw, rates.intra_lat,
                                   rates.inter_bw_per_gpu, rates.inter_lat)
    count = all_to_alls_per_layer(flops_mod.forward_repeat_share(model.num_layers, cols)) \
        * moe_layers_column(model, cols)
    return np.where(ep > 1, one * count * cols["grad_accum"], 0.0)
