"""Layout search: enumerate every valid parallel layout, evaluate all at once, rank them.

Enumeration (one GPU count, `enumerate_layouts`): tp divides the GPUs and stays in a node unless
`allow_cross_node_tp`; pp divides num_layers (uneven splits are not enumerated: they only add
idle layers to a stage; `zplan fit` still accepts them); dp = GPUs / (tp*pp); virtual stages v
divide num_layers / pp; ZeRO 0-3 with optimizer and parameter offload; recompute none /
selective / full; sequence parallel on/off; micro-batches 1, 2, 4, ... and grad_accum =
global_batch / (micro_batch*dp). Every combination is masked with the layout rule table
(planner.core.rules: the GPU count, tp divides heads and widths, batch arithmetic, interleaving
needs m divisible by pp, offload needs ZeRO, NVMe needs ZeRO-3 and a node with NVMe capacity and
bandwidth, ...), the table whose one-line errors fit and check print; `SweepResult.excluded`
names the rules that removed combinations. One search rule on top: with dp = 1, ZeRO >= 1 is
kept only with offload (otherwise it equals ZeRO-0); ZeRO shards over dp x cp ranks, so this
reads dp·cp = 1. Context parallelism: cp divides GPUs / (tp·pp), 2·cp divides seq_len, both
comm types (p2p ring, a2a) where the rule table allows them; a cp layout whose micro-batch is a
multiple of cp is dominated by its cp = 1 twin and not enumerated (`cp_dominated`). HSDP: every
FSDP2 ZeRO-2/3 layout is also enumerated with each whole-node shard group smaller than its dp
(`dp_shard_options`, `dp_shard_rows`; `Constraints.dp_shard` pins or turns it off).

Evaluation (`evaluate`) runs the one model over the candidate columns (`LayoutColumns`): model
states and buffers (`model_states.state_parts` / `buffer_parts`), activations
(`activations`, at b = 1 per (tp, recompute, sp), linear in b; in flight by `in_flight_1f1b` /
`interleaved_fronts`), the busiest node (`plan.node_stage_ranks`) and every step term
(`steptime.step_columns`); `plan_memory` / `estimate_step` are the same functions on one row.
Quantities that depend on a few dimensions are computed once per combination and gathered back
(stage tables per (tp, pp); states, buffers and host bytes per (tp, pp, ZeRO/offload, m > 1)).
Memory columns are float64 (exact below 2^53 bytes, never wrapped). What stays specific to the
sweep is enumeration, ranking and rejection reasons.

Ranking (`sweep`): every candidate's memory is evaluated (`memory_columns`: the fit verdicts and
counts are exact); the step terms that read the ZeRO / offload / engine fields (data-parallel
collectives, offload traffic, the optimizer step: `steptime.state_terms`, all >= 0) only where a
candidate can rank: its activity group's other terms bound its step time and rates
(`steptime.step_bounds`), and `StepTimes.rank` times the candidates whose bound reaches the
ranked rows' (`SweepResult.timed` counts them). The answer is the one of timing every
candidate (tests/test_sweep_bounds.py).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Literal, NamedTuple

import numpy as np
from pydantic import Field

from planner.memory import activations, experts, implementations, model_states, peak, plan
from planner.memory.reserve import reserve_column
from planner.search import heap
from planner.core import params
from planner.timing import steptime
from planner.core.errors import PlanInputError
from planner.core import rules
from planner.core import columns
from planner.core.columns import (CP_COMM_TYPES, DP_ENGINES, OFFLOAD_TARGETS, LayoutColumns,
                                  activity_groups, group_index, group_rows, piecewise, unique_ints,
                                  representatives)
from planner.memory.context import cp_working_bytes, local_seq_len

from planner.core.spec import (
    GIB, Cluster, EngineBuffers, Frozen, Layout, ModelSpec, OffloadTarget, TrainSetup)

SEARCHED_RECOMPUTE = ("none", "selective", "full")
"""Recompute modes the sweep enumerates (codes 0, 1, 2 of columns.RECOMPUTE_MODES)."""
PINNED_RECOMPUTE = ("block",)
"""Recompute modes the sweep runs only when pinned (`Constraints.recompute_num_layers`)."""
PINNABLE_RECOMPUTE = SEARCHED_RECOMPUTE + PINNED_RECOMPUTE
AUTO_DEPTH = "auto"
"""`Constraints.recompute_num_layers` that searches the block depth (`--recompute-num-layers auto`)."""
RECOMPUTE_MODES = columns.RECOMPUTE_MODES
TARGETS: tuple[OffloadTarget, ...] = OFFLOAD_TARGETS


class Constraints(Frozen):
    """Pins on the search space; None leaves a dimension free."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    dp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    """Expert-parallel degrees to search (MoE models); None: every divisor of the routed
    experts that divides dp. Dense models search ep = 1 only."""
    virtual_stages: tuple[int, ...] | None = None
    zero_stage: tuple[int, ...] | None = None
    offload_optimizer: tuple[OffloadTarget, ...] | None = None
    offload_params: tuple[OffloadTarget, ...] | None = None
    dp_engine: tuple[str, ...] | None = None
    """`Layout.dp_engine` values to search (deepspeed, fsdp2); None: both."""
    cp: tuple[int, ...] | None = None
    """Context-parallel degrees to search; None: every cp dividing GPUs / (tp·pp) that the rule
    table allows (2·cp divides seq_len; flash attention; implementation megatron)."""
    cp_comm_type: tuple[str, ...] | None = None
    """`Layout.cp_comm_type` values to search for cp > 1 (p2p, a2a); None: both."""
    recompute: tuple[str, ...] | None = None
    recompute_num_layers: Annotated[int, Field(ge=1)] | Literal["auto"] | None = None
    """`Layout.recompute_num_layers` of the `block` candidates (block runs only when pinned in
    `recompute`, and needs this): one pinned n, or "auto" (`AUTO_DEPTH`): every n from 1 to the
    candidate's largest model chunk (`block_depths`), of which the ranking keeps each layout's
    least n that fits (`least_fitting_depths`)."""
    sequence_parallel: tuple[bool, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    max_tp: int | None = None
    max_pp: int | None = None
    max_virtual_stages: int | None = None
    allow_cross_node_tp: bool = False
    flash_attention: bool = True
    """Fixed for every candidate (not a searched dimension)."""
    buffers: EngineBuffers = EngineBuffers()
    """The engines' bucket sizes of every candidate (e.g. a DeepSpeed config's), as
    `Layout.buffers`: they reach the memory (buffers) and the step time (exposed last bucket)."""
    dp_shard: tuple[Annotated[int, Field(ge=0)], ...] | None = None
    """`Layout.dp_shard` (HSDP shard group). None (`--dp-shard auto`): searched, every FSDP2
    ZeRO-2/3 candidate also with each shard group of `dp_shard_options`; (0,) (`none`): no
    HSDP, every row shards over its whole dp group (no column); (N, ...): every candidate once
    per pinned value (0: the whole group), rows the dp_shard rule refuses removed."""
    megatron_overlap: tuple[str, ...] | None = None
    """`Layout.megatron_overlap` of every candidate, as the user pins it (never searched; the
    pins it needs: `megatron_overlap.sweep_pins`)."""
    engine: Literal["megatron-lm", "deepspeed", "fsdp2", "accelerate"] | None = None
    """Keep only the layouts this engine can run (planner/io/engines.py; `engine_mask`), their
    ZeRO-2/3 rows under the engine's own sharding model; None: every layout the rule table
    allows, whichever engine runs it (`zplan sweep --engine`, the export search)."""


def _allowed(value, pinned) -> bool:
    return pinned is None or value in pinned


def _divisors(n: int) -> list[int]:
    """Divisors of n in increasing order (trial division up to sqrt(n))."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _ints(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _tp_ok(model: ModelSpec, cluster: Cluster, setup: TrainSetup, tps: list[int]) -> np.ndarray:
    """The rule table's tp rule over a list of tp values."""
    ok, _ = rules.mask(rules.Context(model, cluster, setup), LayoutColumns({"tp": _ints(tps)}))
    return ok


def uneven_split(num_layers: int, pp: int) -> tuple[int, int] | None:
    """(first, last) stage layers when pp does not divide the layers, as Megatron runs it
    (`--decoder-first/last-pipeline-num-layers`; Dubey et al. 2024 §3.3.2 for Llama 3 405B:
    126 layers on 16 stages = 7, 14 x 8, 7): every middle stage holds k = ceil(L / pp) layers
    and the first and last share the rest, the first the smaller half. None when pp divides
    the layers, or when the rest leaves the first or last stage empty."""
    if pp < 2 or num_layers % pp == 0:
        return None
    if pp == 2:
        return num_layers // 2, num_layers - num_layers // 2
    k = -(-num_layers // pp)
    rest = num_layers - (pp - 2) * k
    return (rest // 2, rest - rest // 2) if rest >= 2 else None


def ep_options(model: ModelSpec, dp: int, c: Constraints) -> list[int]:
    """Expert-parallel degrees for one dp: divisors of the routed experts that divide dp
    (Megatron's group arithmetic, planner.core.rules), or the pinned ones; [1] for dense models."""
    if not model.is_moe:
        return [1] if _allowed(1, c.ep) else []
    return [e for e in _divisors(model.num_experts) if dp % e == 0 and _allowed(e, c.ep)]



LONG_CONTEXT_TOKENS = 16384
"""Shortest sequence at which the sweep searches cp > 1 unless `--cp` pins it. NVIDIA's published
long-context measurements find no gain from context parallelism below 32k tokens: NeMo's "Long
Sequence Performance" table (Llama 3 8B FP8 on DGX-B200, NeMo 25.04) runs 8k and 16k fastest
with cp = 1 and first gains 5 % at 32k with cp = 2, and NeMo's long-context recipes start at 16k
(docs/context_parallel.md). Below it, cp rows only multiply the search (GPT-3 at 2048 tokens:
22,896 -> 336,624 candidates) with choices no published run makes."""


def cp_options(setup: TrainSetup, c: Constraints, ranks: int) -> list[tuple[int, int]]:
    """(cp, cp_comm_type code) pairs for `ranks` = GPUs / (tp·pp): cp = 1 (p2p), and every cp > 1
    dividing `ranks` whose 2·cp divides seq_len, with each allowed comm type, when the
    candidates run fused attention (Layout: cp needs flash attention). Search rule: unpinned,
    cp > 1 is searched only from LONG_CONTEXT_TOKENS tokens on."""
    out = [(1, 0)] if _allowed(1, c.cp) else []
    if not c.flash_attention or (c.cp is None and setup.seq_len < LONG_CONTEXT_TOKENS):
        return out
    for cp in _divisors(ranks)[1:]:
        if _allowed(cp, c.cp) and setup.seq_len % (2 * cp) == 0:
            out += [(cp, code) for code, name in enumerate(CP_COMM_TYPES)
                    if _allowed(name, c.cp_comm_type)]
    return out



def structures(model: ModelSpec, cluster: Cluster, setup: TrainSetup,
               c: Constraints) -> list[tuple[int, ...]]:
    """Every (tp, pp, dp, v, first, last, ep, cp, cp_comm_type) the constraints allow, tp
    dividing the GPUs and the rule table's tp rule; pp dividing the layers (even stages,
    first = last = 0) or Megatron's uneven split (`uneven_split`); cp from `cp_options`;
    dp = GPUs / (tp·cp·pp) dividing the global batch; v dividing every stage's layers; ep from
    `ep_options`. The rule table checks them again (`enumerate`)."""
    n, node = cluster.num_gpus, cluster.node.gpus_per_node
    tps = [t for t in _divisors(n) if _allowed(t, c.tp) and t <= (c.max_tp or n)
           and (t <= node or c.allow_cross_node_tp)]
    out = []
    for tp in (t for t, ok in zip(tps, _tp_ok(model, cluster, setup, tps)) if ok):
        for pp in _divisors(n // tp):
            split = uneven_split(model.num_layers, pp)
            if (model.num_layers % pp and split is None) or not _allowed(pp, c.pp) \
                    or pp > (c.max_pp or n):
                continue
            first, last = split or (0, 0)
            stage = math.gcd(first, last, -(-model.num_layers // pp)) if split \
                else model.num_layers // pp
            for cp, comm in cp_options(setup, c, n // (tp * pp)):
                dp = n // (tp * pp * cp)
                if setup.global_batch % dp or not _allowed(dp, c.dp):
                    continue
                for v in _divisors(stage) if pp > 1 else [1]:
                    if _allowed(v, c.virtual_stages) and v <= (c.max_virtual_stages or v):
                        out.extend((tp, pp, dp, v, first, last, ep, cp, comm)
                                   for ep in ep_options(model, dp, c))
    return out


def state_options(model: ModelSpec, cluster: Cluster, setup: TrainSetup,
                  c: Constraints) -> tuple[np.ndarray, dict[str, int]]:
    """(zero stage, optimizer target, param target, dp engine) rows as codes, allowed by the
    constraints and the rule table (offload needs ZeRO, NVMe needs ZeRO-3 and a node with NVMe
    capacity and bandwidth, FSDP2 is ZeRO-2/3 without offload), and {rule: combinations it
    removed}."""
    grid = [(z, o, p, e) for z in (0, 1, 2, 3) for o in range(3) for p in range(3)
            for e in range(len(DP_ENGINES))
            if _allowed(z, c.zero_stage) and _allowed(TARGETS[o], c.offload_optimizer)
            and _allowed(TARGETS[p], c.offload_params) and _allowed(DP_ENGINES[e], c.dp_engine)]
    rows = _ints(grid).reshape(-1, 4)
    cols = LayoutColumns(dict(zero_stage=rows[:, 0], offload_optimizer=rows[:, 1],
                              offload_params=rows[:, 2], dp_engine=rows[:, 3]))
    ok, rejected = rules.mask(rules.Context(model, cluster, setup), cols)
    return rows[ok], rejected


# --------------------------------------------------------------------------- candidates


def micro_batch_options(setup: TrainSetup, c: Constraints) -> list[int]:
    """1, 2, 4, ... up to the global batch, or the pinned values."""
    if c.micro_batch is not None:
        return sorted(set(c.micro_batch))
    return [2**k for k in range(setup.global_batch.bit_length()) if 2**k <= setup.global_batch]


def cp_dominated(pairs: LayoutColumns, c: Constraints) -> np.ndarray:
    """Search rule: a cp > 1 layout whose micro-batch b is a multiple of cp does the same work as
    the layout with cp = 1, dp x cp data-parallel ranks and b / cp sequences per micro-batch
    (the same tokens per GPU per micro-batch, GEMM shapes, gradient group and step FLOPs) without
    the cp traffic and buffers, which the search also enumerates; it is not enumerated. Kept
    when cp, dp or the micro-batch is pinned (that twin may be excluded)."""
    if c.cp is not None or c.dp is not None or c.micro_batch is not None:
        return np.zeros(len(pairs), dtype=bool)
    return (pairs["cp"] > 1) & (pairs["micro_batch"] % pairs["cp"] == 0)


def enumerate_layouts(model: ModelSpec, cluster: Cluster, setup: TrainSetup,
                      c: Constraints) -> tuple[LayoutColumns, dict[str, int]]:
    """Every valid layout as `LayoutColumns`, and {rule: combinations it removed}
    (`enumerate_product` without the group key)."""
    cols, rejected, _ = enumerate_product(model, cluster, setup, c)
    return cols, rejected


def enumerate_product(model: ModelSpec, cluster: Cluster, setup: TrainSetup, c: Constraints
                      ) -> tuple[LayoutColumns, dict[str, int], np.ndarray]:
    """Every valid layout as `LayoutColumns`, {rule: combinations it removed}, and each layout's
    index in the product without the ZeRO / offload options (equal for layouts that differ only
    in columns.STATE_FIELDS: `evaluate`'s `activity_key`).

    First the (tp, pp, dp, v, micro-batch) combinations, masked by the rule table (batch
    arithmetic, interleaving needs m divisible by pp, ...), then their product with the
    ZeRO/offload, recompute and sequence-parallel options, masked again (sequence parallel
    needs tp > 1 dividing seq_len). One search rule on top: ZeRO over one dp rank is DDP unless
    it offloads, so it is not enumerated twice."""
    ctx = rules.Context(model, cluster, setup)
    struct = _ints(structures(model, cluster, setup, c)).reshape(-1, 9)
    micro = _ints(micro_batch_options(setup, c))
    s_idx, b_idx = (a.ravel() for a in np.indices((len(struct), len(micro)), dtype=np.int64))
    dp_s, b_s = struct[s_idx, 2], micro[b_idx]
    pairs = LayoutColumns(dict(tp=struct[s_idx, 0], pp=struct[s_idx, 1], dp=dp_s,
                               virtual_stages=struct[s_idx, 3], micro_batch=b_s,
                               grad_accum=setup.global_batch // dp_s // b_s,  # = G // (dp·b),
                               # without the product, which can pass int64 before the batch rule
                               # drops the row (2^36 GPUs x micro-batch 2^30)
                               first_stage_layers=struct[s_idx, 4],
                               last_stage_layers=struct[s_idx, 5], ep=struct[s_idx, 6],
                               cp=struct[s_idx, 7], cp_comm_type=struct[s_idx, 8]))
    ok, rejected = rules.mask(ctx, pairs)
    pairs = pairs.take(ok & ~cp_dominated(pairs, c))
    states, state_rejected = state_options(model, cluster, setup, c)
    rejected |= state_rejected
    recompute = _ints([RECOMPUTE_MODES.index(r) for r in PINNABLE_RECOMPUTE
                       if _allowed(r, c.recompute) and (r in SEARCHED_RECOMPUTE or c.recompute)])
    rec_ok, _ = rules.mask(ctx, LayoutColumns(dict(recompute=recompute)))  # implementation's modes
    recompute = recompute[rec_ok]
    seq_par = np.array([s for s in (False, True) if _allowed(s, c.sequence_parallel)], dtype=bool)
    # the product (pairs x states x recompute x sp, in this nesting order); the rules that read
    # sequence_parallel and the DDP-equivalence pruning are marked on it before any column
    sp_cols = LayoutColumns(dict(tp=np.repeat(pairs["tp"], len(seq_par)),
                                 cp=np.repeat(pairs["cp"], len(seq_par)),
                                 sequence_parallel=np.tile(seq_par, len(pairs))))
    sp_ok, sp_rejected = rules.mask(ctx, sp_cols)
    rejected |= sp_rejected
    sp_ok = sp_ok.reshape(len(pairs), len(seq_par))
    zero_ok = (pairs["dp"] * pairs["cp"] > 1)[:, None] | (states[:, 0] == 0) | (states[:, 1] > 0) | (states[:, 2] > 0)
    ep_cols = LayoutColumns(dict(ep=np.repeat(pairs["ep"], len(states)),
                                 zero_stage=np.tile(states[:, 0], len(pairs)),
                                 dp_engine=np.tile(states[:, 3], len(pairs))))
    ep_ok, ep_rejected = rules.mask(ctx, ep_cols, rules.RULES)  # ep x ZeRO stage / engine
    rejected |= ep_rejected
    zero_ok = zero_ok & ep_ok.reshape(len(pairs), len(states))
    shape = (len(pairs), len(states), len(recompute), len(seq_par))
    keep = np.broadcast_to(zero_ok[:, :, None, None] & sp_ok[:, None, None, :], shape)
    pair, state, r, s = np.nonzero(keep)  # in C order: the enumeration order
    cols = (pairs.take(pair)  # each column gathered from its factor when first read
            .with_gathered(state, zero_stage=states[:, 0], offload_optimizer=states[:, 1],
                           offload_params=states[:, 2], dp_engine=states[:, 3])
            .with_gathered(r, recompute=recompute).with_gathered(s, sequence_parallel=seq_par)
            .with_columns(recompute_every_k=np.ones(len(pair), dtype=np.int64)))
    key = (pair * len(recompute) + r) * len(seq_par) + s
    if c.recompute and "block" in c.recompute and c.recompute_num_layers == AUTO_DEPTH:
        src, depth = block_depths(model, cols, "full" in recompute_names(recompute))
        cols = cols.take(src).with_columns(recompute_num_layers=depth)
        key = key[src] * (model.num_layers + 1) + depth  # the activations read n
        pair, state = pair[src], state[src]
    elif c.recompute and "block" in c.recompute:  # the pinned n (a column only then), its rule
        cols = cols.with_columns(recompute_num_layers=np.where(
            recompute[r] == RECOMPUTE_MODES.index("block"), c.recompute_num_layers or 0, 0))
        block_ok, block_rejected = rules.mask(ctx, cols, rules.named(rules.BLOCK_RULE))
        rejected |= block_rejected
        cols, key, pair, state = cols.take(block_ok), key[block_ok], pair[block_ok], state[block_ok]
    shard = dp_shard_rows(cluster, pairs, states, pair, state, c)
    if shard is not None:  # the HSDP shard group: a column, masked by its rule (evaluated once
        src, values, fields, at = shard  # per combination of its fields, `dp_shard_rows`)
        hsdp_ok, hsdp_rejected = rules.mask(ctx, fields, rules.named(rules.DP_SHARD_RULE), at)
        rejected |= hsdp_rejected
        if not hsdp_ok.all():
            src, values = src[hsdp_ok], values[hsdp_ok]
        cols, key = cols.take(src).with_columns(dp_shard=values), key[src]
    return cols, rejected, key


def recompute_names(codes: np.ndarray) -> tuple[str, ...]:
    """The recompute modes of `codes` (columns.RECOMPUTE_MODES indices)."""
    return tuple(RECOMPUTE_MODES[int(code)] for code in codes)


def block_depths(model: ModelSpec, cols: LayoutColumns, full_searched: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """`--recompute-num-layers auto`: each block candidate once per depth n = 1 .. the blocks of
    its largest model chunk (`rules.largest_chunk_layers`, so the block rule holds by
    construction), less that last depth when `full` is searched too (n = the whole chunk
    recomputes every block: the full row); a chunk of one block has no depth left. Other
    candidates keep n = 0. Returns (source row, n) of each expanded candidate."""
    is_block = cols["recompute"] == RECOMPUTE_MODES.index("block")
    largest = rules.largest_chunk_layers(model.num_layers, cols) - int(full_searched)
    count = np.where(is_block, np.maximum(largest, 0), 1)
    src = np.repeat(np.arange(len(cols)), count)
    depth = np.arange(len(src)) - np.repeat(np.cumsum(count) - count, count) + 1
    return src, np.where(is_block[src], depth, 0)


def least_fitting_depths(cands: LayoutColumns, fits: np.ndarray) -> np.ndarray:
    """The rows a depth-searched sweep ranks (`--recompute-num-layers auto`): of each block
    layout's depths, the least n that fits (every memory term is non-increasing in n and,
    without CPU offload, the step time non-decreasing, tests/test_block_depth_search.py, so it is
    then the layout's fastest fitting block row; with CPU offload a deeper n can be slightly
    faster in the model: 0.02 % in the test's example), and only when the same layout without
    recompute does not fit (it is then at least as fast); for a layout none of whose depths
    fits, its largest n (the closest miss). Every other row passes."""
    depth, rec = cands["recompute_num_layers"], cands["recompute"]
    block = depth > 0
    _, layout = group_index(*(cands[k] for k in cands if k != "recompute_num_layers"))
    _, same = group_index(*(cands[k] for k in cands if k not in ("recompute", "recompute_num_layers")))
    no_fit = np.iinfo(np.int64).max
    least = np.full(int(layout.max(initial=-1)) + 1, no_fit, dtype=np.int64)
    np.minimum.at(least, layout[fits & block], depth[fits & block])
    most = np.zeros_like(least)
    np.maximum.at(most, layout[block], depth[block])
    pick = np.where(least[layout] < no_fit, least[layout], most[layout])
    plain_fits = np.zeros(int(same.max(initial=-1)) + 1, dtype=bool)
    plain_fits[same[fits & (rec == RECOMPUTE_MODES.index("none"))]] = True
    return ~block | ((depth == pick) & ~plain_fits[same])


def dp_shard_options(dp: int, dp_per_node: int) -> list[int]:
    """HSDP shard groups the sweep searches for one dp (`--dp-shard auto`): whole nodes, the
    node's dp ranks times each divisor k < dp / dp_per_node of the nodes the dp group spans
    (k = dp / dp_per_node is dp itself, plain FSDP, row dp_shard = 0). The engines' practice:
    FSDP1 HYBRID_SHARD shards over exactly one node (torch 2.13 `_init_utils.py`
    `_init_intra_and_inter_node_groups`), fms-fsdp runs it so (`sharding_strategy: hsdp`);
    torchtitan's `data_parallel_shard_degree` and accelerate's `parallelism_config_dp_shard_size`
    take any divisor, of which whole nodes keep the shard collectives on NVLink (one node) or
    split them over the fewest nodes. Groups inside a node (dp_shard < dp_per_node) are not
    searched (`--dp-shard N` pins them): they replicate states within the node to save only
    NVLink traffic. A shard group of one rank (tp·cp filling the node) is DDP with FSDP's
    overheads, not searched. [] when the dp group fits in one node or is not whole nodes."""
    if dp <= dp_per_node or dp % dp_per_node:
        return []
    nodes = dp // dp_per_node
    return [dp_per_node * k for k in _divisors(nodes) if k < nodes and dp_per_node * k > 1]


def dp_shard_rows(cluster: Cluster, pairs: LayoutColumns, states: np.ndarray, pair: np.ndarray,
                  state: np.ndarray, c: Constraints
                  ) -> tuple[np.ndarray, np.ndarray, LayoutColumns, np.ndarray] | None:
    """(source row, dp_shard) of each candidate after the HSDP dimension, the table of the
    HSDP rule's fields (dp, dp_shard, dp_engine, ZeRO stage: each combination of the factors
    once) and each candidate's row of it; or None for no dp_shard column. `pair`, `state`:
    each candidate's row of the enumeration's factors `pairs` (tp, cp, dp: the shard groups)
    and `states` (ZeRO stage, engine: whether it has HSDP).
    Pinned values: every row once per value. `none` ((0,)): None. `auto` (None): every row
    once with 0 (its whole dp group) and every FSDP2 ZeRO-2/3 row (the engines that have HSDP,
    `rules.DP_SHARD_RULE`) once more per shard group of `dp_shard_options`, right after it;
    None when no row has one (a dp group within a node, DeepSpeed-only searches)."""
    n = len(pair)
    if c.dp_shard is not None:
        pins = _ints(sorted(set(c.dp_shard)))
        if not pins.any():
            return None
        keys, inv = group_rows(pairs["dp"])  # of each pair
        options = np.tile(pins, (len(keys), 1))  # the same values for every dp
        count = np.full(n, len(pins), dtype=np.int64)
    else:
        hybrid = (states[:, 3] == DP_ENGINES.index("fsdp2")) & (states[:, 0] >= 2)  # of each state
        per_node = np.maximum(cluster.node.gpus_per_node // (pairs["tp"] * pairs["cp"]), 1)
        keys, inv = group_rows(pairs["dp"], per_node)  # of each pair
        table = [dp_shard_options(dp, node) for dp, node in keys.tolist()]
        width = max(map(len, table), default=0)
        options = np.zeros((len(table), width + 1), dtype=np.int64)  # column 0: the whole group
        for g, values in enumerate(table):
            options[g, 1:1 + len(values)] = values
        extra = np.array([len(t) for t in table], dtype=np.int64).take(inv)  # shard groups of a pair
        count = 1 + extra.take(pair) * hybrid.take(state)
        if width == 0 or not (count > 1).any():
            return None
    src = np.repeat(np.arange(n, dtype=np.int64), count)
    nth = np.arange(len(src), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    at = inv.take(pair.take(src)) * options.shape[1] + nth  # each candidate's entry of `options`
    group, option, kind = np.indices((len(keys), options.shape[1], len(states))).reshape(3, -1)
    fields = LayoutColumns(dict(dp=keys[:, 0].take(group), dp_shard=options[group, option],
                                dp_engine=states[kind, 3], zero_stage=states[kind, 0]))
    return src, options.ravel().take(at), fields, at * len(states) + state.take(src)


def enumerate_candidates(model: ModelSpec, cluster: Cluster, setup: TrainSetup,
                         c: Constraints) -> LayoutColumns:
    """`enumerate_layouts` without the rejection counts."""
    return enumerate_layouts(model, cluster, setup, c)[0]


def layout_at(cands: LayoutColumns, i: int, c: Constraints | None = None) -> Layout:
    """The typed Layout of candidate i."""
    c = c or Constraints()
    return cands.to_layout(i, flash_attention=c.flash_attention, buffers=c.buffers,
                           megatron_overlap=c.megatron_overlap)


_group = group_rows
_representatives = representatives


# --------------------------------------------------------------------------- per-combination tables


@functools.lru_cache(maxsize=4096)
def stage_table(model: ModelSpec, tp: int, pp: int,
                threshold: int = model_states.DEFAULT_BUFFERS.param_persistence_threshold,
                first: int = 0, last: int = 0, ep: int = 1) -> dict[str, tuple[int, int, int]]:
    """Scalar facts of the first, stage 2, the heaviest middle (`middle_kinds`) and the last stage:
    parameters per tp rank at ep = 1 and the routed experts among them (memory.experts), largest
    tensor, ZeRO-3 persistent elements, layers; `max_params` per GPU with the routed experts /
    ep. A middle stage exists when pp >= 3. `first` / `last`: uneven stage layers (0 = the even
    split)."""
    counts = params.stage_param_counts(model, tp, pp, first=first or None, last=last or None)
    routed = experts.stage_routed_params(model, tp, pp, first or None, last or None)
    moe_blocks = experts.moe_layers_per_stage(model, pp, first or None, last or None)
    kinds = (0, *middle_kinds(list(range(pp)), moe_blocks), pp - 1)  # stage indices
    largest = {i: params.largest_param_numel(model, tp, i, pp) for i in set(kinds)}
    persistent = {i: model_states.stage_persistent_numel(model, tp, i, counts[i][0], pp, threshold)
                  for i in set(kinds)}
    distinct = set(zip(counts, routed))  # each stage make-up once (a few of up to pp stages)
    per_gpu = [experts.params_per_gpu(sum(c[1:]), x, ep) for c, x in distinct]
    return {
        "params": tuple(sum(counts[i][1:]) for i in kinds),  # layers + embedding + head
        "routed": tuple(routed[i] for i in kinds),
        "largest": tuple(largest[i] for i in kinds),
        "persistent": tuple(persistent[i] for i in kinds),
        "max_layers": (max(c[0] for c, _ in distinct),) * 4,
        "max_params": (max(per_gpu),) * 4,
        "block": (model_states.block_numel(model, tp),) * 4,
        "layers": tuple(counts[i][0] for i in kinds),
        "stage": tuple(i + 1 for i in kinds),
    }


def middle_kinds(stages: list, moe_blocks: list[int]) -> tuple:
    """The two middle stages that can hold a pipeline's peak (the first stage again when
    pp < 3): stage 2, which keeps the most micro-batches in flight of the middle stages, and the
    first middle stage with the most MoE blocks (`moe_blocks` per stage,
    `experts.moe_layers_per_stage`; models mixing dense and MoE blocks, e.g. DeepSeek-V3's dense
    first blocks: a later all-MoE stage can outweigh stage 2 although it keeps one micro-batch
    fewer). Middle stages of equal make-up are dominated by the first of them (the same bytes,
    more in flight). Stages of mixed make-up between the two are approximated by them."""
    if len(stages) < 3:
        return stages[0], stages[0]
    middle = moe_blocks[1:-1]
    return stages[1], stages[1 + middle.index(max(middle))]


def node_stage_counts(tp: int, dp: int, pp: int, gpus_per_node: int,
                      num_nodes: int) -> list[tuple[int, int, int]]:
    """Distinct (ranks in the first stage, in middle stages, in the last stage) per node:
    `plan.node_stage_ranks` with the stages folded into the three kinds (pp divides the layers in
    the search, so every middle stage holds the same bytes). They depend on tp and dp only
    through the ranks of a stage, tp·dp (the tp degrees of one pp share them)."""
    return _stage_kind_counts(tp * dp, pp, gpus_per_node, num_nodes)


@functools.lru_cache(maxsize=4096)
def _stage_kind_counts(per_stage: int, pp: int, gpus_per_node: int,
                       num_nodes: int) -> list[tuple[int, int, int]]:
    rows = set()
    edges = (0, per_stage, (pp - 1) * per_stage, num_nodes * gpus_per_node)
    for node in plan.node_stage_ranks(per_stage, pp, gpus_per_node, num_nodes, edges):
        first = node.get(0, 0)
        last = node.get(pp - 1, 0) if pp > 1 else 0
        rows.add((first, sum(node.values()) - first - last, last))
    return sorted(rows)


def hf_activation_column(model: ModelSpec, setup: TrainSetup, rec, b) -> tuple[np.ndarray, np.ndarray]:
    """(kept, recompute working) activation bytes of every hf-* candidate (tp = pp = 1: one
    stage of all layers), exact: transformers' inventories hold parts that do not grow with the
    micro-batch (rotary cos/sin, autocast's weight casts, the b = 1 targets view), so each
    distinct (recompute, micro_batch) pair is evaluated once with `hf_activation_bytes`."""
    keys, inv = _group(rec, b)
    out = []
    for r, mb in keys.tolist():
        if RECOMPUTE_MODES[r] not in ("none", "full"):
            out.append((0, 0))  # masked by the rule table
            continue
        block, outside, working = implementations.hf_activation_bytes(model, setup, RECOMPUTE_MODES[r], mb)
        out.append((model.num_layers * block + outside, working))
    table = np.array(out, dtype=np.int64).reshape(-1, 2)[inv]
    return table[:, 0], table[:, 1]


def activation_table(model: ModelSpec, setup: TrainSetup, tp: int, rec: int, sp: bool,
                     flash: bool, micro_batch: int = 1, cp: int = 1,
                     cp_comm: int = 0) -> tuple[int, int, int, int, int]:
    """(one block kept, one dense block kept, first extras, last extras, recompute working,
    what one block-recomputed block saves: `activations.block_recompute_saved_bytes`)
    bytes at micro_batch = 1 from the activations module (the dense block differs from the
    first for models mixing dense and MoE blocks; `chunk_bytes` combines them); context
    parallelism: at s/cp tokens, the transient cp buffers with the working bytes. Every entry is
    linear in the micro-batch (b multiplies each
    product) and a chunk of n blocks keeps n x one block (`layers_kept_bytes` without every_k;
    block: less min(recompute_num_layers, n) x the saving, in `evaluate`).
    hf-* (transformers' modules, not linear in b): `hf_activation_column` replaces this table's
    figures in `evaluate`; the b = 1 figures here serve the step-time side only. FP8 recipes:
    a saved fp8 input's scales do not grow with b, so `evaluate` asks for each micro-batch."""
    if setup.implementation != "megatron":  # tp = pp = 1 (rule table); per micro-batch at b = 1
        if tp != 1 or RECOMPUTE_MODES[rec] not in ("none", "full"):
            return (0, 0, 0, 0, 0, 0)  # masked by the rule table
        block, outside, working = implementations.hf_activation_bytes(
            model, setup, RECOMPUTE_MODES[rec], 1)
        return block, block, outside, 0, working, 0
    block_n = 1 if RECOMPUTE_MODES[rec] == "block" else None  # what one recomputed block saves
    # the values of candidates the rule table passed: built without validation (as
    # `engine_mask`'s layouts), ~22 us of a validated Layout's ~35 us table saved
    lay = Layout.trusted(tp=tp, recompute=RECOMPUTE_MODES[rec], sequence_parallel=sp,
                         flash_attention=flash, cp=cp, cp_comm_type=CP_COMM_TYPES[cp_comm],
                         recompute_num_layers=block_n)
    s, b, e = local_seq_len(setup.seq_len, cp), micro_batch, setup.precision.activation_bytes
    f8 = setup.precision.fp8_scaling
    mixed = len(params.block_kinds(model)) == 2
    block = activations.layer_activation_bytes(model, lay, s, b, e, f8)
    return (
        block,
        activations.layer_activation_bytes(model, lay, s, b, e, f8, moe=False) if mixed else block,
        sum(activations.first_stage_extra_bytes(model, lay, s, b, e).values()),
        sum(activations.last_stage_extra_bytes(model, lay, s, b, e).values()),
        activations.recompute_working_bytes(model, lay, s, b, e, 1, f8)
        + cp_working_bytes(model, lay, setup.seq_len, b, e),
        activations.block_recompute_saved_bytes(model, lay, s, b, e, 1, f8),
    )


_forwards_of = activations.forwards_of
interleaved_front = activations.interleaved_front
interleaved_fronts = activations.interleaved_fronts


# --------------------------------------------------------------------------- memory, vectorised


def state_bytes(P, dp, zero, opt, par, m, setup: TrainSetup):
    """(gpu, cpu, nvme) model-state bytes per GPU of each row: `model_states.state_parts`
    summed (the only formula; kept for callers that hold bare arrays)."""
    cols = LayoutColumns(dict(dp=dp, zero_stage=zero, offload_optimizer=opt, offload_params=par,
                              grad_accum=m))
    parts = model_states.state_parts(P, cols, setup.precision, setup.optimizer,
                                       setup.host_accounting)
    like = np.asarray(P) * 0 + cols["dp"] * 0
    return tuple(model_states.parts_total(p, like) for p in parts[:3])


@functools.lru_cache(maxsize=4096)
def chunk_moe_range(model: ModelSpec, pp: int, v: int, first: int, last: int,
                    stages: tuple[int, ...]) -> tuple[int, ...]:
    """(fewest, most) MoE blocks in a model chunk of each of `stages` (1-based;
    `activations.chunk_moe_layers`; `first` / `last`: uneven stage layers, 0 = even)."""
    layers = params.layers_per_stage(model.num_layers, pp, first or None, last or None)
    counts = activations.chunk_moe_layers(model, layers, v)
    return tuple(x for k in stages for x in (min(counts[k - 1]), max(counts[k - 1])))


def chunk_bytes(model: ModelSpec, pp, vs, first_l, last_l, layers, stage, block, dense):
    """Kept bytes of the heaviest model chunk of each stage kind (`stage_table`'s first, two
    middle, last) at b = 1 (`activations.stage_activations`): n = stage layers / v blocks, k of
    them MoE blocks (`block`), the others dense (`dense`); the heaviest chunk has the fewest or
    the most MoE blocks. `layers`, `stage`: each row's stage kinds' layers and stage numbers."""
    kinds = layers.shape[1]
    n = [layers[:, k] // vs for k in range(kinds)]  # blocks per model chunk of each stage kind
    if len(params.block_kinds(model)) == 1:
        return tuple(block * n_k for n_k in n)
    keys, inv = _group(pp, vs, first_l, last_l, *(stage[:, k] for k in range(kinds)))
    ranges = np.array([chunk_moe_range(model, p, v, f, la, tuple(st))
                       for p, v, f, la, *st in keys.tolist()],
                      dtype=np.float64).reshape(-1, 2 * kinds)[inv]
    extra = block - dense  # one MoE block instead of a dense one
    return tuple(n[k] * dense + np.maximum(ranges[:, 2 * k] * extra, ranges[:, 2 * k + 1] * extra)
                 for k in range(kinds))


def kept_activation_bytes_b1(cands: dict[str, np.ndarray], chunk, first, last, chunk_last=None):
    """Peak kept activations of the first and last stage at micro_batch 1
    (`activations.stage_activations`): 1F1B holds min(p, m) micro-batches on stage 1 and one on
    stage p; interleaved stages take the replay's largest chunk-weighted state. `chunk`: one
    model chunk's bytes on the first stage; `chunk_last` on the last (None: the same)."""
    pp, vs, m = cands["pp"], cands["virtual_stages"], cands["grad_accum"]
    chunk_last = chunk if chunk_last is None else chunk_last
    single = pp == 1  # one stage carries the embedding and the head
    f = activations.in_flight_1f1b(pp, 1, m) * (chunk + first + np.where(single, last, 0))
    lst = np.where(single, f, activations.in_flight_1f1b(pp, pp, m) * (chunk_last + last))
    inter = np.nonzero(vs > 1)[0]
    if inter.size:
        p_i, v_i = pp[inter], vs[inter]
        # beyond this m the replay no longer depends on m (warmup and the 2pv window both fit)
        cap = (2 * (p_i - 1) + (v_i - 1) * p_i + 2 * p_i * v_i) // v_i + 2
        keys, inv = _group(p_i, v_i, np.minimum(m[inter], cap))  # one replay per (p, v, m)
        p, v, m_eff = keys.T
        zero = np.zeros_like(p)  # rank, its chunk with extras: embedding 0, head v - 1
        both = interleaved_fronts(*(np.concatenate(x) for x in (  # both sides' replays at once
            (p, p), (zero, p - 1), (v, v), (m_eff, m_eff), (zero, v - 1))))
        sides = ((f, chunk[inter], first[inter], both[:len(p)]),
                 (lst, chunk_last[inter], last[inter], both[len(p):]))
        for out, c, extra, fronts in sides:  # fronts: (replays, 2 pairs, 2)
            out[inter] = np.maximum(c * fronts[inv, 0, 0] + extra * fronts[inv, 0, 1],
                                    c * fronts[inv, 1, 0] + extra * fronts[inv, 1, 1])
    return f, lst


def kept_middle_bytes_b1(cands: dict[str, np.ndarray], chunk, stage) -> np.ndarray:
    """Peak kept activations of a middle stage (no extras; `stage` per row, 1-based) at
    micro_batch 1: under uneven stages stage 2 holds more layers than stage 1 with one
    micro-batch fewer in flight, and a later all-MoE stage can outweigh both, so either can be
    the peak (`activations.stage_activations`); 0 where pp < 3."""
    pp, vs, m = cands["pp"], cands["virtual_stages"], cands["grad_accum"]
    out = np.where(pp >= 3, activations.in_flight_1f1b(pp, stage, m) * chunk, 0.0)
    inter = np.nonzero((vs > 1) & (pp >= 3))[0]
    if inter.size:
        p_i, v_i = pp[inter], vs[inter]
        cap = (2 * (p_i - 1) + (v_i - 1) * p_i + 2 * p_i * v_i) // v_i + 2
        keys, inv = _group(p_i, v_i, np.minimum(m[inter], cap), stage[inter])
        p, v, m_eff, st = keys.T
        fronts = interleaved_fronts(p, st - 1, v, m_eff, 0)
        out[inter] = chunk[inter] * np.maximum(fronts[inv, 0, 0], fronts[inv, 1, 0])
    return out


def node_counts(cluster: Cluster, keys: np.ndarray) -> np.ndarray:
    """`node_stage_counts` of each (tp, pp) row as one (rows, width, 3) array, padded with
    all-zero rows (host bytes are >= 0, so padding never raises a node's maximum)."""
    rows = [node_stage_counts(t, cluster.num_gpus // (t * p), p, cluster.node.gpus_per_node,
                              cluster.num_nodes) for t, p in keys[:, :2].tolist()]
    counts = np.zeros((len(rows), max(map(len, rows), default=1), 3), dtype=np.int64)
    for i, r in enumerate(rows):
        counts[i, :len(r)] = r
    return counts


def model_state_columns(cluster: Cluster, setup: TrainSetup, cands: LayoutColumns,
                        tp_pp: np.ndarray, tp_pp_inv: np.ndarray, tables: dict[str, np.ndarray],
                        buffers: EngineBuffers = model_states.DEFAULT_BUFFERS,
                        activity: tuple[np.ndarray, np.ndarray] | None = None):
    """Model states and buffers of each stage kind (first, stage 2, the heaviest middle, last:
    4 x combinations), the optimizer's temporaries of each kind (`plan.stage_temps_column`),
    and the busiest node's CPU and NVMe bytes, per combination (below), with each candidate's
    combination.

    These depend only on (tp, pp) (which fix dp·cp = GPUs / (tp·pp) and the stage tables), the
    ZeRO / offload state, the ranks the states are sharded over (`model_states.shard_ranks`:
    under HSDP dp_shard·cp, which differs between the cp degrees of one (tp, pp)), and whether
    m > 1 (the only use `state_bytes` makes of m): a few
    hundred combinations for tens of thousands of candidates. Each combination is evaluated
    once, at one of its candidates (the caller gathers the values back). `activity`: the
    candidates' activity groups (`evaluate`), within which (tp, pp) and m are the same."""
    names = ("zero_stage", "offload_optimizer", "offload_params", "dp_engine")
    # the ranks the states are sharded over (dp x cp, or dp_shard x cp under HSDP: cp varies
    # within a (tp, pp) row), by rank; without a dp_shard column it is GPUs / (tp·pp)
    shard = [unique_ints(model_states.shard_ranks(cands))[1]] if "dp_shard" in cands else []
    if activity is None:
        keys, inv = _group(tp_pp_inv, *(cands[k] for k in names), *shard, cands["grad_accum"] > 1)
    else:  # one integer key: ((tp, pp) row, m > 1) of the group, then the state codes
        one = activity[0]
        widths = (4, len(OFFLOAD_TARGETS), len(OFFLOAD_TARGETS), len(DP_ENGINES))
        key = ((tp_pp_inv[one] * 2 + (cands["grad_accum"][one] > 1)).take(activity[1])
               * math.prod(widths) + cands.codes(names, widths))
        for code in shard:
            key = key * (int(code.max()) + 1) + code
        keys, inv = unique_ints(key)
    rep = _representatives(inv, len(keys))
    row = tp_pp_inv[rep]  # the (tp, pp) row of each combination
    # the four stage kinds (first, stage 2, the heaviest middle, last stage) stacked kind by
    # kind into one evaluation of 4 x combinations rows (every formula is row-wise)
    sub = cands.take(np.tile(rep, 4))
    P, routed, largest, persistent, block, layers = (
        tables[name][row].T.ravel()
        for name in ("params", "routed", "largest", "persistent", "block", "layers"))
    temps = plan.stage_temps_column(sub, P).reshape(4, -1)  # of the stage's parameters (ep 1)
    states = experts.ep_state_parts(P, routed, sub, setup.precision, setup.optimizer,
                                    setup.host_accounting)
    P = experts.params_per_gpu(P, routed, sub["ep"]) if "ep" in sub else P
    buffers_parts = model_states.buffer_parts(P, largest, persistent, sub, setup.precision,
                                              buffers, block, layers)
    gpu = (model_states.parts_total(states.gpu, P)
           + model_states.parts_total(buffers_parts, P)).reshape(4, -1)
    cpu, nvme = (model_states.parts_total(part, P).reshape(4, -1)
                 for part in (states.cpu, states.nvme))
    host = list(zip(cpu, nvme))  # (cpu, nvme) of each kind
    counts = node_counts(cluster, tp_pp[:, :2])[row]  # (combinations, node rows, 3 stage kinds)
    host = [host[0], tuple(np.maximum(a, b) for a, b in zip(host[1], host[2])), host[3]]
    node_cpu = np.max(sum(counts[:, :, k] * host[k][0][:, None] for k in range(3)), axis=1)
    node_nvme = np.max(sum(counts[:, :, k] * host[k][1][:, None] for k in range(3)), axis=1)
    return gpu, temps, node_cpu, node_nvme, inv


STAGE_FIELDS = ("params", "routed", "largest", "persistent", "max_layers", "max_params", "block",
                "layers", "stage")


def evaluate(model: ModelSpec, cluster: Cluster, setup: TrainSetup, cands: dict[str, np.ndarray],
             c: Constraints | None = None, efficiency: float | None = None,
             activity_key: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Memory (worst stage, busiest node) and step time of every candidate, as columns.

    Activations and the compute terms read no ZeRO / offload / engine field: they are evaluated
    on one candidate of each group of candidates that differ only in those fields
    (`columns.activity_groups`; `activity_key` names the groups when the caller knows them, as
    the enumeration does) and gathered back; states, transients and the data-parallel terms on
    every candidate."""
    c = c or Constraints()
    out, grouped = memory_columns(model, cluster, setup, cands, c, efficiency, activity_key)
    return out | steptime.row_columns(grouped.g, cands, (grouped.rows, grouped.group))


class GroupedTimes(NamedTuple):
    """The step-time work of a chunk of candidates' activity groups (`steptime.GroupTimes`),
    with each group's row (`rows`) and each candidate's group (`group`)."""

    g: steptime.GroupTimes
    rows: np.ndarray
    group: np.ndarray


def memory_columns(model: ModelSpec, cluster: Cluster, setup: TrainSetup,
                   cands: dict[str, np.ndarray], c: Constraints, efficiency: float | None,
                   activity_key: np.ndarray | None) -> tuple[dict[str, np.ndarray], GroupedTimes]:
    """`evaluate`'s memory columns of every candidate, and the step-time work of its activity
    groups (`steptime.group_times`), from which `steptime.row_columns` gives the step columns
    of any candidates (`evaluate`: all; `sweep`: those the ranking needs, `StepTimes`)."""
    rows, group = activity_groups(cands, activity_key)
    one = cands.take(rows)  # one candidate per group: what does not read the states
    tp, pp, vs, rec, sp, b = (one[k] for k in ("tp", "pp", "virtual_stages", "recompute", "sequence_parallel", "micro_batch"))
    first_l, last_l = (one[k] if k in one else np.zeros_like(tp)
                       for k in ("first_stage_layers", "last_stage_layers"))
    ep = one["ep"] if "ep" in one else np.ones_like(tp)
    keys, inv_one = _group(tp, pp, first_l, last_l, ep)
    inv = inv_one.take(group)
    threshold = c.buffers.param_persistence_threshold
    stage = [stage_table(model, t, p, threshold, f, la, e) for t, p, f, la, e in keys.tolist()]
    tables = {name: np.array([s[name] for s in stage], dtype=np.int64).reshape(-1, 4)
              for name in STAGE_FIELDS}  # rows x (first, stage 2, heaviest middle, last stage)

    fp8 = setup.precision.fp8_scaling is not None  # fp8 scales: not linear in b, table per b
    per_b = np.where(fp8, 1, b)
    cp = one["cp"] if "cp" in one else np.ones_like(tp)
    comm = one["cp_comm_type"] if "cp_comm_type" in one else np.zeros_like(tp)
    akeys, ainv = _group(tp, rec, sp, b // per_b, cp, comm)
    act = np.array([activation_table(model, setup, t, r, bool(s), c.flash_attention, mb, k, cc)
                    for t, r, s, mb, k, cc in akeys.tolist()], dtype=np.float64).reshape(-1, 6)
    block, dense, first_x, last_x, working, saved = (act[:, k][ainv] for k in range(6))
    stage_no = tables["stage"][inv_one]
    chunks = chunk_bytes(model, pp, vs, first_l, last_l, tables["layers"][inv_one], stage_no,
                         block, dense)
    n_rec = one["recompute_num_layers"] if "recompute_num_layers" in one else np.ones_like(tp)
    chunk_f, chunk_m, chunk_h, chunk_l = (  # block recompute: its first n blocks keep the input
        x - np.minimum(n_rec, tables["layers"][inv_one][:, k] // vs) * saved
        for k, x in enumerate(chunks))
    kept_f, kept_l = kept_activation_bytes_b1(one, chunk_f, first_x, last_x, chunk_l)
    kept_f, kept_l, working = per_b * kept_f, per_b * kept_l, per_b * working
    mixed = len(params.block_kinds(model)) == 2
    middle = ((first_l > 0) | mixed) & (pp >= 3)  # a middle stage can then outgrow stage 1
    def kept_middle(at):  # both middle kinds of the groups `at`, stacked into one call
        both = kept_middle_bytes_b1(one.take(np.concatenate((at, at))),
                                    np.concatenate((chunk_m[at], chunk_h[at])),
                                    np.concatenate((stage_no[at, 1], stage_no[at, 2])))
        return per_b[at] * both[:len(at)], per_b[at] * both[len(at):]

    kept_m, kept_h = piecewise(pp.shape, 2, [(middle, kept_middle)])  # 0 where no middle peaks
    if setup.implementation != "megatron":  # not linear in b: exact per (recompute, b)
        kept_f, working = hf_activation_column(model, setup, rec, b)
        kept_l = kept_f
    # a stage's peak (planner.memory.peak): its resident states and buffers plus the larger of
    # the backward's moment (kept activations + the backward's transient: per activity group)
    # and the optimizer's (its temporaries: per state combination, `model_state_columns`)
    loss = np.broadcast_to(plan.stage_loss_column(model, setup, one, True), tp.shape)  # of a
    # stage holding the loss (a scalar 0 where the recipe's logits need no cast: fp32)
    moment = [peak.backward_moment_bytes(kept, working, loss_bytes) for kept, loss_bytes in
              ((kept_f, np.where(pp == 1, loss, 0)), (kept_m, 0), (kept_h, 0), (kept_l, loss))]
    middle = middle.take(group)
    states, temps, node_cpu, node_nvme, state_inv = model_state_columns(
        cluster, setup, cands, keys, inv, tables, c.buffers, (rows, group))
    node_cpu, node_nvme = node_cpu.take(state_inv), node_nvme.take(state_inv)
    pp = cands["pp"]

    def stage_bytes(kind, at=None):  # the stage kind's peak on the candidates `at` (None: all)
        state_at, group_at = (state_inv, group) if at is None else (state_inv[at], group[at])
        return states[kind].take(state_at) + peak.above_resident_bytes(
            moment[kind].take(group_at), temps[kind].take(state_at))

    gpu_first = stage_bytes(0)
    gpu_mid, gpu_heavy = piecewise(pp.shape, 2, [(middle, lambda at: (stage_bytes(1, at),
                                                                      stage_bytes(2, at)))])
    gpu_last = stage_bytes(3)
    gpu_peak = gpu_first.astype(np.result_type(gpu_first, gpu_mid, gpu_heavy, gpu_last), copy=False)
    peak_kind = np.zeros(len(pp), dtype=np.int64)
    kinds = ((1, gpu_mid), (2, gpu_heavy), (3, gpu_last)) if middle.any() else ((3, gpu_last),)
    for kind, gpu in kinds:  # the first maximum wins ties (without a middle stage that can peak,
        higher = gpu > gpu_peak  # its columns are 0, never above the first stage's peak, >= 0)
        gpu_peak, peak_kind = np.maximum(gpu, gpu_peak), np.where(higher, kind, peak_kind)
    capacity = (cluster.gpu.memory_bytes - reserve_column(
        cluster.gpu, setup.reserve_gib, tp, one["pp"], one["dp"], cp)).take(group)
    kind_stage = np.stack([np.ones_like(tp), stage_no[:, 1], stage_no[:, 2], one["pp"]], axis=1)
    peak_stage = kind_stage.ravel().take(group * 4 + peak_kind)  # each one's peak kind's stage
    out = dict(gpu_peak_bytes=gpu_peak, peak_stage=peak_stage,
               headroom_bytes=capacity - gpu_peak, node_cpu_bytes=node_cpu, node_nvme_bytes=node_nvme)
    g = steptime.group_times(model, cluster, setup, one, tables["max_layers"][:, 0].take(inv_one),
                             tables["max_params"][:, 0].take(inv_one),
                             flash_attention=c.flash_attention, buffers=c.buffers,
                             efficiency=efficiency, stage_rows=inv_one,
                             megatron_overlap=c.megatron_overlap)
    return out, GroupedTimes(g, rows, group)


# --------------------------------------------------------------------------- ranking

CHUNK = 200_000
"""Candidates evaluated per numpy pass (bounds memory; progress is reported per chunk)."""

_SORT_COLUMN = {  # key -> (column, descending)
    "step-time": ("step_s", False),
    "tokens-per-s": ("tokens_per_s", True),
    "mfu": ("mfu", True),
    "memory-headroom": ("headroom_bytes", True),
    "gpu-hours": ("gpu_hours", False),
}
SORT_KEYS = tuple(_SORT_COLUMN)


class SweepRow(Frozen):
    """One evaluated layout: the layout, its step estimate and its memory."""

    layout: Layout
    estimate: steptime.StepEstimate
    gpu_peak_bytes: int
    """Bytes on one GPU of the fullest pipeline stage."""
    peak_stage: int
    headroom_bytes: int
    """GPU capacity minus `gpu_peak_bytes` (negative: overflows)."""
    node_cpu_bytes: int
    node_nvme_bytes: int
    fits: bool
    reason: str = ""
    """For a rejected layout: every resource it overflows and by how much."""
    engines: list[str] = []
    """For a ranked (fitting) row: the engines that can run its layout, as `zplan fit` lists them
    (planner/io/engines.py `supported_engines`; the step time is the one of the row's own
    `dp_engine` sharding model); empty for a rejected row."""
    variants: list[str] = []
    """Near-identical layouts folded into this row (`collapse_variants`): the same layout with
    another offload placement or HSDP shard group whose step time is within SAME_STEP_REL, as
    `optimizer/params` offload targets, e.g. `cpu/none`, or `dp_shard=N` (`variant_label`)."""


class SweepResult(Frozen):
    """The ranked answer for one GPU count."""

    model: str
    cluster: str
    num_gpus: int
    sort: str
    evaluated: int
    """Candidate layouts enumerated and evaluated: the memory of each, the step time of each
    that can rank (below)."""
    timed: int = 0
    """Of the evaluated layouts, those whose data-parallel, offload and optimizer terms were
    evaluated; each other's step time is bounded by its terms that read no ZeRO / offload /
    engine field, and the bound already ranks it behind those shown (`StepTimes`): the same
    answer as timing every layout."""
    fitting: int
    """Candidates that fit (with `Constraints.engine`: that fit and the engine runs)."""
    rejected_gpu: int
    """Candidates over GPU memory (a candidate may be counted under several resources)."""
    rejected_cpu: int
    rejected_nvme: int
    top: list[SweepRow]
    rejected: list[SweepRow]
    """The best-ranked layouts that do not fit, with the reason."""
    excluded: dict[str, int] = {}
    """Layout rules (planner.core.rules) that removed combinations from the enumeration, with the
    number of combinations each removed (counted where the rule was applied, before the
    product with the other dimensions)."""
    empty_reason: str = ""
    """Why nothing fits, or why nothing was enumerated; empty when `top` is not."""
    best_without_cp: SweepRow | None = None
    """When the first ranked layout splits sequences (cp > 1): the best-ranked fitting layout
    with cp = 1, what context parallelism is compared against (recompute, offload, tp); None
    otherwise or when no cp = 1 layout fits."""
    seconds: float = 0.0


def memory_all(model, cluster, setup, cands, c, efficiency=None,
               progress: Callable[[int, int], None] | None = None,
               activity_key: np.ndarray | None = None) -> tuple[dict[str, np.ndarray], "StepTimes"]:
    """`memory_columns` in chunks of CHUNK candidates, calling progress(done, total) after each;
    the step columns to be evaluated where the ranking needs them (`StepTimes`)."""
    total = len(cands["tp"])
    parts, times = [], StepTimes(cands)
    for start in range(0, max(total, 1), CHUNK):
        part = slice(start, start + CHUNK)
        key = None if activity_key is None else activity_key[part]
        cols, grouped = memory_columns(model, cluster, setup, cands.take(part), c, efficiency, key)
        parts.append(cols)
        times.add(start, grouped)
        if progress:
            progress(min(start + CHUNK, total), total)
    if len(parts) == 1:
        return parts[0], times
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, times


FIRST_MARGIN = 0.1
"""`StepTimes.rank` first times every candidate whose bound is within this share of the
limit-th best bound (a guess at the cut; the answer does not depend on it): when the limit-th
best exact key among them is within that margin too, no other candidate can rank and one
evaluation suffices; else a second times the candidates between the margin and that key.
Chosen on nine spaces (docs/sweep.md "Session 26"): 0.1 needed one evaluation or timed fewer
candidates than the 256 best bounds it replaced on each of them."""


class StepTimes:
    """The step columns of a sweep's candidates, evaluated on the candidates the ranking needs.

    Every candidate's step time is at least its activity group's bound (`steptime.step_bounds`:
    the terms that read no ZeRO / offload / engine field, which the groups share; the others
    are >= 0), and so are the sort keys derived from it. `rank` evaluates the state terms
    (`steptime.row_columns`) of the candidates whose bounds are within FIRST_MARGIN of the
    limit-th best bound, then of every other candidate whose bound reaches the limit-th best
    of those exact keys: no other candidate can be among the first `limit`, so `rank_order`
    over those gives the order it gives over fully evaluated columns
    (tests/test_sweep_bounds.py). `cols` reads the step columns of the
    candidates ranked so far (`kept`), stored compactly: each candidate's `slot` in the
    evaluated batches (scattering ~20 full-length columns cost more than the ranking).
    `timed`: the candidates whose state terms were evaluated; `kept`: those `cols` can read."""

    def __init__(self, cands: LayoutColumns):
        self.cands, self.parts = cands, []
        self.slot = np.empty(len(cands), dtype=np.int64)
        self.timed = np.zeros(len(cands), dtype=bool)
        self.kept = np.zeros(len(cands), dtype=bool)
        self._batches: list[dict[str, np.ndarray]] = []
        self._joined: dict[str, np.ndarray] = {}
        self._bounds: dict[str, np.ndarray] = {}

    def add(self, start: int, grouped: GroupedTimes) -> None:
        """The chunk of candidates from `start` on (`memory_all`)."""
        self.parts.append((start, grouped))

    def bound(self, name: str) -> np.ndarray:
        """Per candidate: the bound of step column `name` (the least step time; the rates at
        it: greater or equal where the rate falls with the step time)."""
        if name not in self._bounds:
            self._bounds[name] = np.concatenate(
                [steptime.step_bounds(grouped.g)[name].take(grouped.group)
                 for _, grouped in self.parts])
        return self._bounds[name]

    def evaluate(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """The step columns of the candidates `idx`, in that order."""
        self.timed[idx] = True
        pieces = []
        for start, (g, _, group) in self.parts:
            at = None if len(self.parts) == 1 else np.flatnonzero(
                (idx >= start) & (idx < start + len(group)))
            rows = idx if at is None else idx[at]
            if len(rows):
                groups = group.take(rows - start)
                distinct, local = unique_ints(groups)
                pieces.append((at, steptime.row_columns(
                    g, self.cands.take(rows), (representatives(local, len(distinct)), local),
                    groups)))
        if len(pieces) == 1 and pieces[0][0] is None:
            return pieces[0][1]
        out = {name: np.empty(len(idx)) for name in pieces[0][1]} if pieces else {}
        for at, values in pieces:
            for name, column in values.items():
                out[name][at] = column
        return out

    def _keep(self, idx: np.ndarray, values: dict[str, np.ndarray]) -> None:
        """Make the step columns of the candidates `idx` readable through `cols`."""
        self.slot[idx] = sum(len(b["step_s"]) for b in self._batches) + np.arange(len(idx))
        self.kept[idx] = True
        self._batches.append(values)
        self._joined.clear()

    def column(self, name: str) -> np.ndarray:
        """Step column `name` of the evaluated batches, one after another (`slot` indexes it)."""
        if len(self._batches) == 1:
            return self._batches[0][name]
        if name not in self._joined:
            self._joined[name] = np.concatenate([b[name] for b in self._batches])
        return self._joined[name]

    @property
    def cols(self) -> dict[str, "_TimedColumn"]:
        """Each step column, indexable by the `kept` candidates (a candidate index or an array
        of them)."""
        return {name: _TimedColumn(self, name) for name in (self._batches[0] if self._batches else ())}

    def rank(self, cols: dict[str, np.ndarray],
             queries: list[tuple[np.ndarray, str, int]]) -> list[np.ndarray]:
        """`rank_order(cols + the step columns, idx, sort, limit)` of each query (idx, sort,
        limit), the step columns evaluated on the candidates that can be among the first
        `limit` only: every candidate whose bound is within FIRST_MARGIN of the limit-th best
        bound, then, where the limit-th best of their exact keys lies beyond that, every
        candidate whose bound reaches it (the queries together: one evaluation, a second only
        for the queries that need it; a call's fixed cost outweighs hundreds of rows')."""
        needs, cuts = [], []
        for idx, sort, limit in queries:
            name, descending = _SORT_COLUMN[check_sort(sort)]
            if limit >= len(idx) or limit == 0:
                needs.append(idx[:limit])  # all of them, or none
            elif name not in steptime.StepEstimate.model_fields:  # a memory key: rank_order's
                within = _within_limit(_preference(cols[name][idx], descending), limit)  # cut
                needs.append(idx if within is None else idx[within])
            else:  # the step time's (or a rate's): bounded
                bound = _preference(self.bound(name)[idx], descending)
                best = np.partition(bound, limit - 1)[limit - 1]
                guess = best + FIRST_MARGIN * abs(best)  # a worse key (the preference is smaller)
                first = np.ones(len(idx), dtype=bool) if np.isnan(guess) else bound <= guess
                cuts.append((len(needs), idx, bound, first, descending, name, limit))
                needs.append(idx[first])
        every = np.concatenate(needs) if needs else np.zeros(0, dtype=np.int64)
        if len(every):
            exact = self.evaluate(every)
            self._keep(every, exact)
            starts, more = np.cumsum([0, *map(len, needs)]), []
            for at, idx, bound, first, descending, name, limit in cuts:  # a bounded query: its
                keys = _preference(exact[name][starts[at]:starts[at + 1]], descending)  # limit-th
                cut = np.partition(keys, limit - 1)[limit - 1]  # best exact key >= that of all
                rest = idx[~first] if np.isnan(cut) else idx[~first & (bound <= cut)]
                more.append(rest)
                needs[at] = np.concatenate((needs[at], rest))
            rest = np.concatenate(more) if more else every[:0]
            if len(rest):
                self._keep(rest, self.evaluate(rest))
        merged = cols | self.cols
        return [rank_order(merged, need, sort, limit) if len(need) else need
                for need, (_, sort, limit) in zip(needs, queries)]


class _TimedColumn:
    """One step column of `StepTimes`, read at candidates it has evaluated."""

    __slots__ = ("times", "name")

    def __init__(self, times: StepTimes, name: str):
        self.times, self.name = times, name

    def __getitem__(self, idx):
        return self.times.column(self.name)[self.times.slot[idx]]


def check_sort(sort: str) -> str:
    """`sort` when `rank_order` knows the key, else PlanInputError."""
    if sort not in _SORT_COLUMN:
        raise PlanInputError("sort", f"unknown key {sort!r}; allowed: {', '.join(SORT_KEYS)}")
    return sort


def _preference(values, descending: bool) -> np.ndarray:
    """Sort keys, smallest first preferred: the values as float64, negated when larger is better."""
    key = np.asarray(values, dtype=np.float64)
    return -key if descending else key


def _within_limit(key: np.ndarray, limit: int | None) -> np.ndarray | None:
    """Mask of the keys at most the limit-th smallest: only those can be among the first
    `limit` (np.partition is linear). None: all can (no limit, too few keys, or a NaN
    threshold: NaN sorts last, the cut would select nothing)."""
    if limit is None or limit >= len(key):
        return None
    cut = np.partition(key, limit - 1)[limit - 1]
    return None if np.isnan(cut) else key <= cut


def rank_order(cols: dict[str, np.ndarray], idx: np.ndarray, sort: str,
               limit: int | None = None) -> np.ndarray:
    """`idx` ordered by the sort key; ties by step time, then less offloading (none < cpu <
    nvme, for optimizer and parameters), then more GPU headroom, then enumeration order.
    With `limit`, only the first `limit` of that order (the same ones)."""
    name, descending = _SORT_COLUMN[check_sort(sort)]
    if limit == 0:
        return idx[:0]
    key = _preference(cols[name][idx], descending)
    within = _within_limit(key, limit)  # sort those few instead of all
    if within is not None:
        idx, key = idx[within], key[within]
    offload = cols["opt"][idx] + cols["par"][idx]
    order = np.lexsort((idx, -cols["headroom_bytes"][idx], offload, cols["step_s"][idx], key))
    return idx[order][:limit]


SAME_STEP_REL = 0.005
"""Step times closer than 0.5 % count as the same answer (a choice of this planner, not a
measured figure: below the model's own error, docs/accuracy.md)."""
_VARIANT_FIELDS = ("offload_optimizer", "offload_params", "dp_shard")
"""Fields a near-identical variant may differ in: the offload placement, or the HSDP shard
group (`dp_shard_options` puts up to log2(nodes) shard groups of one FSDP2 layout in the
ranking; those within SAME_STEP_REL of the fastest are one answer, listed as variants)."""


def collapse_variants(cands: LayoutColumns, cols: dict[str, np.ndarray], order: np.ndarray, top: int
                      ) -> list[tuple[int, list[int]]]:
    """Walk the ranked `order` and fold each layout into the first earlier kept one that differs
    only in the offload placement or the HSDP shard group (`_VARIANT_FIELDS`; FSDP2, the only
    engine with HSDP, has no offload: a variant differs in one of the two) and whose step time
    is within SAME_STEP_REL of it (both fit:
    the caller passes fitting rows only). Returns up to `top` (kept row, folded rows)."""
    names = [name for name in cands if name not in _VARIANT_FIELDS]
    ranked = cands.take(order)  # the ranked rows' columns only
    rows = np.stack([ranked[name] for name in names], axis=1).astype(np.int64).tolist() \
        if len(order) else []
    kept: list[tuple[int, list[int]]] = []
    by_key: dict[tuple, list[int]] = {}  # kept rows (indices into `kept`) of each key
    for i, row in zip((int(j) for j in order), rows):
        key = tuple(row)
        head = next((k for k in by_key.get(key, ())
                     if abs(cols["step_s"][i] / cols["step_s"][kept[k][0]] - 1) <= SAME_STEP_REL),
                    None)
        if head is not None:
            kept[head][1].append(i)
            continue
        if len(kept) == top:
            continue
        by_key.setdefault(key, []).append(len(kept))
        kept.append((i, []))
    return kept


def overflow_reason(row: Mapping[str, int], cluster: Cluster) -> str:
    """Every resource a candidate overflows (`row`: its memory columns, `_row_values`), in the
    words of `plan._overflows`."""
    out = []
    if row["headroom_bytes"] < 0:
        out.append(f"GPU memory on stage {row['peak_stage']} by "
                   f"{-row['headroom_bytes'] / GIB:,.2f} GiB")
    cpu_over = row["node_cpu_bytes"] - cluster.node.cpu_memory_bytes
    if cpu_over > 0:
        out.append(f"CPU memory per node by {cpu_over / GIB:,.2f} GiB")
    nvme_over = row["node_nvme_bytes"] - cluster.node.nvme_bytes
    if nvme_over > 0:
        out.append(f"NVMe per node by {nvme_over / GIB:,.2f} GiB")
    return "; ".join(out)


_MEMORY_FIELDS = ("gpu_peak_bytes", "peak_stage", "headroom_bytes", "node_cpu_bytes",
                  "node_nvme_bytes")


def _row_values(cols, at: Sequence[int]) -> dict[int, dict[str, object]]:
    """The result columns (the step estimate's, the efficiency, the memory) of the candidates
    `at` as Python numbers, {candidate: {name: value}}: one gather per column for all the rows
    a sweep shows."""
    if not len(at):
        return {}
    names = [k for k in (*steptime.StepEstimate.model_fields, "efficiency", *_MEMORY_FIELDS)
             if k in cols]
    idx = np.asarray(at, dtype=np.int64)
    columns = [np.asarray(cols[name][idx]).tolist() for name in names]
    return {int(i): dict(zip(names, values)) for i, values in zip(at, zip(*columns))}


def _row(cands, i: int, values: Mapping[str, object], c: Constraints, cluster: Cluster,
         fits: bool, variants: list[str] | None = None,
         engines: Callable[[Layout], list[str]] | None = None) -> SweepRow:
    """The result row of candidate i (`values`: its `_row_values`). Its Layout is validated; the
    estimate and the row hold the evaluation's own floats and ints (`Frozen.computed`: no user
    input to check). `engines`: the engines that run a layout (planner/io/engines.py
    `supported_engines`), for a ranked row."""
    est = {k: float(values[k]) for k in steptime.StepEstimate.model_fields if k in values}
    layout = layout_at(cands, i, c)
    return SweepRow.computed(
        layout=layout,
        estimate=steptime.StepEstimate.computed(
            **est, compute_efficiency=float(values["efficiency"])),
        **{name: int(values[name]) for name in _MEMORY_FIELDS}, fits=fits,
        reason="" if fits else overflow_reason(values, cluster), variants=variants or [],
        engines=engines(layout) if engines else [],
    )


def variant_label(cands, j: int, head: int) -> str:
    """What folded variant j changes against its ranked row `head`: `dp_shard=N` (the HSDP
    shard group; N = dp for the whole group) or the offload targets (`offload_label`)."""
    if "dp_shard" in cands and cands["dp_shard"][j] != cands["dp_shard"][head]:
        return f"dp_shard={int(cands['dp_shard'][j]) or int(cands['dp'][j])}"
    return offload_label(cands, j)


def offload_label(cands, j: int) -> str:
    """`optimizer/params` offload targets of candidate j (a folded variant), e.g. `cpu/none`."""
    return (f"{OFFLOAD_TARGETS[int(cands['offload_optimizer'][j])]}/"
            f"{OFFLOAD_TARGETS[int(cands['offload_params'][j])]}")


def engine_mask(model: ModelSpec, setup: TrainSetup, cands: LayoutColumns, c: Constraints) -> np.ndarray:
    """Per candidate: True where `c.engine` can run the layout (no rule of planner.io.engines
    refuses it) and the layout is timed with that engine's sharding model (`engines.timed_as`).
    Those read only `engines.FIELDS_READ` and `dp_engine`, so they run once per distinct
    combination of these columns (5,978 `Layout`s for the 157,630 rows of docs/sweep.md's
    Llama 3 405B example), each built without validation (the rule table passed it already)."""
    from planner.io.engines import FIELDS_READ, refusals, timed_as

    _, group = group_index(*(cands[name] for name in (*FIELDS_READ, "dp_engine") if name in cands))
    first = representatives(group, int(group.max()) + 1)
    layouts = (cands.to_layout(int(i), flash_attention=c.flash_attention, buffers=c.buffers,
                               megatron_overlap=c.megatron_overlap, validate=False) for i in first)
    return np.array([timed_as(c.engine, layout) and not refusals(c.engine, model, layout, setup.precision)
                     for layout in layouts])[group]


def fit_masks(cols: dict[str, np.ndarray], cluster: Cluster) -> tuple[np.ndarray, ...]:
    """(gpu ok, cpu ok, nvme ok) per candidate."""
    return (cols["headroom_bytes"] >= 0,
            cols["node_cpu_bytes"] <= cluster.node.cpu_memory_bytes,
            cols["node_nvme_bytes"] <= cluster.node.nvme_bytes)


def explain_empty(model: ModelSpec, cluster: Cluster, setup: TrainSetup, c: Constraints) -> str:
    """Why no layout was enumerated: the pinned constraint whose release gives some, or the
    divisibility rule that leaves none."""
    pins = {k: v for k, v in c.model_dump().items()
            if v is not None and k not in ("allow_cross_node_tp", "flash_attention")}
    for name in pins:
        relaxed = c.model_copy(update={name: None})
        count = len(enumerate_candidates(model, cluster, setup, relaxed))
        if count:
            return (f"the constraint {name}={pins[name]} rules out every layout "
                    f"({count} layouts without it)")
    n = cluster.num_gpus
    if not c.allow_cross_node_tp and not any(
            _tp_ok(model, cluster, setup, [t for t in _divisors(n) if t <= cluster.node.gpus_per_node])):
        return "no tp within a node divides the heads, kv heads and MLP width (try --allow-cross-node-tp)"
    return (f"no tp*pp*dp = {n} with tp | heads ({model.num_heads}), pp | layers "
            f"({model.num_layers}) and dp | global_batch ({setup.global_batch}), "
            f"given {', '.join(f'{k}={v}' for k, v in pins.items()) or 'no constraints'}")


def _why_nothing_fits(cols, ok, cluster: Cluster, engine: str | None = None) -> str:
    """All candidates rejected: how many each resource rules out, and the closest miss; or, when
    layouts fit but none that `engine` runs, that."""
    gpu_ok, cpu_ok, nvme_ok = ok
    total = len(gpu_ok)
    fitting = int((gpu_ok & cpu_ok & nvme_ok).sum())
    if engine is not None and fitting:
        from planner.io.engines import ENGINE_NAMES

        return (f"{fitting} of the {total} layouts fit, none that {ENGINE_NAMES[engine]} runs "
                f"(docs/engines.md; drop --engine to see them)")
    closest = int(np.argmax(cols["headroom_bytes"]))
    return (f"none of the {total} layouts fits: GPU memory rules out {int((~gpu_ok).sum())}, "
            f"CPU memory {int((~cpu_ok).sum())}, NVMe {int((~nvme_ok).sum())}; the most GPU "
            f"headroom is {cols['headroom_bytes'][closest] / GIB:,.2f} GiB")


def sweep(model: ModelSpec, cluster: Cluster, setup: TrainSetup, constraints: Constraints | None = None,
          *, sort: str = "step-time", top: int = 10, rejected: int = 5,
          efficiency: float | None = None,
          progress: Callable[[int, int], None] | None = None) -> SweepResult:
    """Enumerate, evaluate and rank every layout of `cluster`'s GPU count."""
    start = time.perf_counter()
    heap.retain_freed_memory()  # once per process: the columns' memory reused, not re-faulted
    c = constraints or Constraints()
    rules.check_setup(model, setup)
    steptime.cluster_rates(cluster, setup, efficiency)  # input errors before any work
    check_sort(sort)
    cands, excluded, activity_key = enumerate_product(model, cluster, setup, c)
    n = len(cands)
    base = dict(model=model.name, cluster=cluster.name, num_gpus=cluster.num_gpus, sort=sort,
                evaluated=n, excluded=excluded)
    if n == 0:
        return SweepResult.computed(**base, fitting=0, rejected_gpu=0, rejected_cpu=0, rejected_nvme=0,
                           top=[], rejected=[], empty_reason=explain_empty(model, cluster, setup, c),
                           seconds=time.perf_counter() - start)
    cols, times = memory_all(model, cluster, setup, cands, c, efficiency, progress, activity_key)
    cols |= {"opt": cands["offload_optimizer"], "par": cands["offload_params"]}  # offload codes for tie-breaking
    ok = fit_masks(cols, cluster)
    fits = ok[0] & ok[1] & ok[2]
    shown = (least_fitting_depths(cands, fits) if c.recompute_num_layers == AUTO_DEPTH
             else np.ones(n, dtype=bool))
    if c.engine is not None:  # the engine's layouts only, shown and counted
        runs = engine_mask(model, setup, cands, c)
        fits, shown = fits & runs, shown & runs
    # every offload combination of a layout may be a near-identical variant (3 x 3 targets)
    ranked, bad = times.rank(cols, [(np.nonzero(fits & shown)[0], sort, top * 9),
                                    (np.nonzero(~fits & shown)[0], "step-time", rejected)])
    cols |= times.cols  # views of the step columns of the rows ranked (`StepTimes`), here on
    good = collapse_variants(cands, cols, ranked, top)
    plain = times.rank(cols, [(np.nonzero(fits & shown & (cands["cp"] == 1))[0], sort, 1)])[0] \
        if good and int(cands["cp"][good[0][0]]) > 1 else []
    from planner.io.engines import supported_engines  # the engine tables: only for rows shown

    shown_rows = [i for i, _ in good] + [int(i) for i in bad] + [int(i) for i in plain[:1]]
    values = _row_values(cols, shown_rows)  # each result column gathered once
    without_cp = (_row(cands, int(plain[0]), values[int(plain[0])], c, cluster, True)
                  if len(plain) else None)
    return SweepResult.computed(
        **base, fitting=int(fits.sum()), rejected_gpu=int((~ok[0]).sum()),
        rejected_cpu=int((~ok[1]).sum()), rejected_nvme=int((~ok[2]).sum()),
        top=[_row(cands, i, values[i], c, cluster, True, [variant_label(cands, j, i) for j in folded],
                  lambda layout: supported_engines(model, layout, setup.precision))
             for i, folded in good],
        rejected=[_row(cands, int(i), values[int(i)], c, cluster, False) for i in bad],
        timed=int(np.count_nonzero(times.timed)),
        empty_reason="" if fits.any() else _why_nothing_fits(cols, ok, cluster, c.engine),
        best_without_cp=without_cp, seconds=time.perf_counter() - start,
    )


def best_layout(model: ModelSpec, cluster: Cluster, setup: TrainSetup,
                constraints: Constraints | None = None,
                efficiency: float | None = None) -> tuple[Layout, steptime.StepEstimate] | None:
    """The fastest fitting layout and its scalar step estimate, or None when nothing fits
    (`zplan fit` without a layout)."""
    result = sweep(model, cluster, setup, constraints, top=1, rejected=0, efficiency=efficiency)
    if not result.top:
        return None
    layout = result.top[0].layout
    return layout, steptime.estimate_step(model, cluster, layout, setup, efficiency)


def with_gpus(cluster: Cluster, num_gpus: int) -> Cluster:
    """The same hardware with `num_gpus` GPUs (whole nodes; one partial node below one node)."""
    per_node = cluster.node.gpus_per_node
    if num_gpus < per_node:
        node = cluster.node.model_copy(update={"gpus_per_node": num_gpus})
        return cluster.model_copy(update={"node": node, "num_nodes": 1,
                                          "name": f"{cluster.name}[{num_gpus} GPUs]"})
    if num_gpus % per_node:
        raise PlanInputError("gpus", f"{num_gpus} GPUs is not a whole number of "
                                     f"{per_node}-GPU nodes of {cluster.name}")
    return cluster.model_copy(update={"num_nodes": num_gpus // per_node,
                                      "name": f"{cluster.name}[{num_gpus} GPUs]"})


def parse_gpu_counts(text: str) -> list[int]:
    """`64,128,256` (a list) or `64-1024` (a range, doubling from the low end)."""
    try:
        if "-" in text and "," not in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            if lo < 1 or hi < lo:
                raise ValueError
            counts, n = [], lo
            while n <= hi:
                counts.append(n)
                n *= 2
            return counts
        counts = [int(x) for x in text.split(",") if x.strip()]
        if not counts or min(counts) < 1:
            raise ValueError
        return sorted(set(counts))
    except ValueError:
        raise PlanInputError("gpus", f"expected a count, a list like 64,128,256 or a range like "
                                     f"64-1024, got {text!r}") from None
