"""The layout rules, written once: a mask over candidate columns and the one-line error.

A layout is a row of `LayoutColumns` (planner.core.columns): numpy arrays named like `Layout`'s
fields, one element per candidate; one typed `Layout` is a length-1 instance. Each `Rule`
names the fields it reads, says which rows are allowed (`ok`, a boolean array) and, for one
row that is not, the error line naming every factor (`message`). So

- `zplan fit` / `check` / `export` call `check_layout` (length 1): the first broken rule raises
  `PlanInputError(rule.field, rule.message(...))`, exit 2;
- `zplan sweep` calls `mask` on its candidate columns: the rows every rule allows, and per rule
  the rows it removed, with the rule's reason.

Expert parallelism (ep): Megatron-LM at commit d98e8a64 `megatron/training/arguments.py`
(num_experts % expert_model_parallel_size == 0) and `megatron/core/parallel_state.py`
(initialize_model_parallel: expert_tensor_parallel_size defaults to tp, world_size must be
divisible by etp·ep·pp, expert dp = world / (etp·ep·pp)); DeepSpeed 0.19.8 runtime/engine.py
(`_validate_zero3_moe_compatibility`: native MoE refused under ZeRO-3; only AutoEP layers pass,
whose ZeRO-3 partitioning zplan does not model, so ep > 1 needs ZeRO <= 2).

Sources of the rules: Megatron-LM `megatron/training/arguments.py` (validate_args: world size
= tp·pp·dp, interleaved schedule needs num_layers divisible by pp·v and the number of
micro-batches divisible by pp; `megatron/core/utils.py` divide for the heads / widths split by
tp), DeepSpeed `deepspeed/runtime/zero/config.py` and `offload_config.py` (offload_param needs
stage 3; NVMe optimizer swapping exists only in stage3.py), Korthikanti et al. 2022 §4.2.2
(sequence parallel splits the sequence over tp).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.core.columns import (DP_ENGINES, OFFLOAD_TARGETS, RECOMPUTE_MODES, LayoutColumns,
                                  as_shape)
from planner.core.errors import PlanInputError
from planner.core.spec import Cluster, ModelSpec, TrainSetup, ceil_div

NVME = OFFLOAD_TARGETS.index("nvme")
FSDP2 = DP_ENGINES.index("fsdp2")
EVERY_K = RECOMPUTE_MODES.index("every_k")
BLOCK = RECOMPUTE_MODES.index("block")
HF_RECOMPUTE = (RECOMPUTE_MODES.index("none"), RECOMPUTE_MODES.index("full"))
"""transformers' models recompute nothing or whole blocks (gradient checkpointing)."""


def _megatron(x: Context) -> bool:
    return x.setup.implementation == "megatron"


def _hf_parallel_ok(x: Context, c: LayoutColumns) -> np.ndarray:
    """megatron runs any tp, pp; hf-eager / hf-sdpa (transformers' modules) tp = pp = 1."""
    return np.asarray(_megatron(x) | ((c["tp"] == 1) & (c["pp"] == 1)))


def _hf_recompute_ok(x: Context, c: LayoutColumns) -> np.ndarray:
    """hf-eager / hf-sdpa recompute nothing or whole blocks (gradient checkpointing)."""
    return np.asarray(_megatron(x) | np.isin(c["recompute"], HF_RECOMPUTE))


@dataclass(frozen=True)
class Context:
    """What the rules read besides the layout columns. A caller that checks only some rules
    may leave out what they do not read (e.g. `activations.check_tp`: the model and seq_len)."""

    model: ModelSpec
    cluster: Cluster | None = None
    setup: TrainSetup | None = None
    seq_len_tokens: int | None = None
    """seq_len when there is no setup."""

    @property
    def seq_len(self) -> int:
        return self.seq_len_tokens if self.seq_len_tokens is not None else self.setup.seq_len


@dataclass(frozen=True)
class Rule:
    """One layout rule: the fields it reads, the allowed rows, the error for one row."""

    name: str
    """Short reason shown by the sweep, e.g. `interleaved schedule needs m divisible by pp`."""
    field: str
    """The `PlanInputError` field of the one-line error."""
    reads: tuple[str, ...]
    """Layout columns the rule reads (a rule is applied only when all are present)."""
    ok: Callable[[Context, LayoutColumns], np.ndarray]
    message: Callable[[Context, dict[str, int]], str]
    """The error for one row (its values as plain Python ints), every factor printed."""


def _tp_widths(model: ModelSpec) -> list[tuple[str, int]]:
    """Widths tp must divide (megatron/core/utils.py divide): heads, the fused QKV output
    (ColumnParallelLinear over (a + 2 kv) x head_dim, also when tp is wider than the kv heads),
    the MLP width (the expert width for MoE models, whose blocks are all MoE:
    planner.core.params.check_tp). The kv heads themselves: `_kv_heads_ok`."""
    mlp = ("expert_ffn_hidden_size", model.expert_ffn_size) if model.is_moe else \
        ("ffn_hidden_size", model.ffn_hidden_size)
    qkv = ("fused QKV width (num_heads + 2 num_kv_heads) x head_dim",
           (model.num_heads + 2 * model.kv_heads) * model.head_size)
    return [("num_heads", model.num_heads), mlp] + ([] if model.is_mla else [qkv])


def _kv_heads_ok(model: ModelSpec, tp) -> np.ndarray:
    """num_kv_heads a multiple or a divisor of tp (Megatron-LM transformer_config.py
    `__post_init__`, commit d98e8a64: "num_query_groups must be a multiple or divisor of
    tensor_model_parallel_size"); wider tp replicates each kv head tp / kv times
    (attention.py `get_query_key_value_tensors`, params.kv_heads_per_rank). MLA: no kv groups."""
    kv = model.kv_heads
    return np.asarray(model.is_mla | (kv % tp == 0) | (tp % kv == 0))


def _tp_divides(ctx: Context, c: LayoutColumns) -> np.ndarray:
    ok = np.ones(np.shape(c["tp"]), dtype=bool)  # a column, or one layout's numpy scalar
    for _, width in _tp_widths(ctx.model):
        ok &= width % c["tp"] == 0
    return ok & _kv_heads_ok(ctx.model, c["tp"])


def _tp_message(ctx: Context, r: dict[str, int]) -> str:
    tp, model = r["tp"], ctx.model
    broken = [(f, w) for f, w in _tp_widths(model) if w % tp]
    if broken:
        field, width = broken[0]
        return f"tp={tp} must divide {field}={width} of model {model.name}"
    return (f"tp={tp} and num_kv_heads={model.kv_heads} of model {model.name}: one must be a "
            "multiple of the other (kv heads split over tp, or replicated when tp is wider; "
            "Megatron-LM transformer_config.py)")


def _most_layers(ctx: Context, pp):
    """Layers of the largest pipeline stage: ceil(num_layers / pp) (params.layers_per_stage)."""
    return -(-ctx.model.num_layers // pp)


def _split(c: LayoutColumns):
    """(first, last, uneven) stage-size columns; 0 = not given, absent columns = the even split."""
    first = c["first_stage_layers"] if "first_stage_layers" in c else 0
    last = c["last_stage_layers"] if "last_stage_layers" in c else 0
    return first, last, (np.asarray(first) > 0) | (np.asarray(last) > 0)


def _uneven_ok(ctx: Context, c: LayoutColumns):
    """Megatron-LM's uneven-pipeline checks (transformer_config.py `__post_init__`, "Uneven
    PP", commit d98e8a64): the layers left after the first / last stage divide evenly over the
    middle stages (none left iff no middle stage); under interleaving the first, last and
    each middle stage's layer counts are multiples of virtual_stages; pp > 1."""
    first, last, uneven = _split(c)
    pp, v = c["pp"], c["virtual_stages"]
    given = (np.asarray(first) > 0).astype(int) + (np.asarray(last) > 0).astype(int)
    mid_stages = pp - given
    mid_layers = ctx.model.num_layers - first - last
    per = np.where(mid_stages > 0, mid_layers // np.maximum(mid_stages, 1), 0)
    ok = (pp > 1) & (mid_layers >= 0) & ((mid_layers == 0) == (mid_stages == 0))
    ok &= (mid_stages == 0) | (mid_layers % np.maximum(mid_stages, 1) == 0)
    ok &= (first % v == 0) & (last % v == 0) & (per % v == 0)
    return ~uneven | ok


def largest_chunk_layers(num_layers: int, c: LayoutColumns):
    """Blocks of the largest model chunk: the largest stage (`params.layers_per_stage`: the
    first / last / middle counts under an uneven split, else ceil(L / pp)) / virtual_stages."""
    first, last, uneven = _split(c)
    pp, v = c["pp"], c["virtual_stages"]
    given = (np.asarray(first) > 0).astype(int) + (np.asarray(last) > 0).astype(int)
    mid_stages = np.maximum(pp - given, 1)
    per = (num_layers - first - last) // mid_stages
    stage = np.where(uneven, np.maximum(np.maximum(first, last), per), -(-num_layers // pp))
    return stage // v


def _block_ok(ctx: Context, c: LayoutColumns):
    return (c["recompute"] != BLOCK) | (
        c["recompute_num_layers"] <= largest_chunk_layers(ctx.model.num_layers, c))


def _block_message(ctx: Context, r: dict[str, int]) -> str:
    cols = LayoutColumns({k: np.array([v]) for k, v in r.items()})
    largest = int(largest_chunk_layers(ctx.model.num_layers, cols)[0])
    first, last = r.get("first_stage_layers") or None, r.get("last_stage_layers") or None
    return (f"recompute_num_layers={r['recompute_num_layers']} exceeds the {largest} blocks of the "
            f"largest model chunk (num_layers={ctx.model.num_layers}, pp={r['pp']}, "
            f"virtual_stages={r['virtual_stages']}, first_stage_layers={first}, "
            f"last_stage_layers={last}); allowed: 1 to {largest} (Megatron-LM recompute.py, "
            "method block: the first n blocks of each chunk)")


def _uneven_message(ctx: Context, r: dict[str, int]) -> str:
    first, last = r.get("first_stage_layers") or None, r.get("last_stage_layers") or None
    return (f"first_stage_layers={first}, last_stage_layers={last} with pp={r['pp']}, "
            f"virtual_stages={r['virtual_stages']}: the other {ctx.model.num_layers} - "
            f"{(first or 0) + (last or 0)} layers must divide evenly over the middle stages, and "
            "every stage's count by virtual_stages (Megatron-LM transformer_config.py)")


def _ep_experts_message(ctx: Context, r: dict[str, int]) -> str:
    if not ctx.model.is_moe:
        return f"ep={r['ep']} needs a mixture-of-experts model; {ctx.model.name} is dense (ep=1)"
    return (f"ep={r['ep']} must divide num_experts={ctx.model.num_experts} of model "
            f"{ctx.model.name} (Megatron-LM arguments.py: num_experts % "
            "expert_model_parallel_size == 0)")


def nvme_ready(ctx: Context) -> bool:
    """The node has NVMe capacity AND read and write bandwidth figures. Without the bandwidth
    the offload time cannot be computed (a zero bandwidth would be infinite speed), so NVMe
    offload is refused rather than timed at 0 s."""
    node = ctx.cluster.node
    return node.nvme_bytes > 0 and node.nvme_read_gb_per_s > 0 and node.nvme_write_gb_per_s > 0


def _nvme_message(ctx: Context, r: dict[str, int]) -> str:
    node = ctx.cluster.node
    missing = " bandwidth" if node.nvme_bytes > 0 else ""
    return (f"NVMe offload asked but node {node.name} has no NVMe{missing}: nvme_capacity_tb="
            f"{node.nvme_capacity_tb:g}, nvme_read_gb_per_s={node.nvme_read_gb_per_s:g}, "
            f"nvme_write_gb_per_s={node.nvme_write_gb_per_s:g}; NVMe offload needs all three > 0")


def _uses_nvme(c: LayoutColumns) -> np.ndarray:
    return (c["offload_optimizer"] == NVME) | (c["offload_params"] == NVME)


def _dp_shard_ok(x: Context, c: LayoutColumns) -> np.ndarray:
    """dp_shard (0 = the whole group) divides dp; below dp (HSDP) only with an engine that has
    it: FSDP2 (`fully_shard(mesh=(replicate, shard))`, torch 2.13) or FSDP1 HYBRID_SHARD /
    _HYBRID_SHARD_ZERO2 (torch/distributed/fsdp/api.py), both run as dp_engine fsdp2 at
    zero_stage 3 / 2. DeepSpeed's MiCS (its HSDP) is refused: deepspeed 0.19.8 removed it and
    rejects `mics_shard_size` (runtime/config.py `_REMOVED_ZERO_CONFIG_KEYS`; docs/collectives.md
    "MiCS")."""
    shard, dp = c["dp_shard"], c["dp"]
    whole = (shard == 0) | (shard == dp)
    hybrid = (dp % np.maximum(shard, 1) == 0) & (shard < dp) & (c["dp_engine"] == FSDP2) \
        & (c["zero_stage"] >= 2)
    return whole | hybrid


def _dp_shard_message(x: Context, r: dict[str, int]) -> str:
    shard, dp, zero = r["dp_shard"], r["dp"], r["zero_stage"]
    engine = "fsdp2" if r["dp_engine"] == FSDP2 else "deepspeed"
    if shard > dp or dp % shard:
        return (f"dp_shard={shard} must divide dp={dp} (HSDP: dp / dp_shard replicas of a "
                f"dp_shard-rank shard group)")
    return (f"dp_shard={shard} < dp={dp} (HSDP) needs dp_engine=fsdp2 with zero_stage 3 "
            f"(HYBRID_SHARD) or 2 (_HYBRID_SHARD_ZERO2), got dp_engine={engine}, zero_stage="
            f"{zero}; DeepSpeed's MiCS (mics_shard_size) was removed in deepspeed 0.19.8")


def _world_message(x: Context, r: dict[str, int]) -> str:
    cp = r.get("cp", 1)
    names, values = ("tp*cp*pp*dp", [r["tp"], cp, r["pp"], r["dp"]]) if cp > 1 else \
        ("tp*pp*dp", [r["tp"], r["pp"], r["dp"]])
    product = 1
    for v in values:
        product *= v
    return (f"{names} = {'*'.join(map(str, values))} = {product} must equal the cluster's GPUs "
            f"{x.cluster.num_gpus} ({x.cluster.num_nodes} nodes x {x.cluster.node.gpus_per_node})")


DP_SHARD_RULE = "dp_shard must divide dp; HSDP needs FSDP2 at ZeRO-2/3"
"""Name of the HSDP rule (the sweep applies it to its dp_shard column)."""
BLOCK_RULE = "recompute_num_layers must not exceed the largest model chunk"
"""Name of the block-recompute rule (the sweep applies it to its pinned recompute_num_layers)."""

TP_RULE_NAME = "tp must divide heads and the MLP width, and divide or be a multiple of the kv heads"
"""Name of the tp rule (the sweep prints it; activations.check_tp checks it by name)."""

A2A = 1
"""Code of cp_comm_type a2a (planner.core.columns.CP_COMM_TYPES)."""

CP_RULES: tuple[Rule, ...] = (
    Rule("context parallel needs seq_len divisible by 2*cp", "cp", ("cp",),
         lambda x, c: (c["cp"] == 1) | (x.seq_len % (2 * c["cp"]) == 0),
         lambda x, r: (f"cp={r['cp']} needs seq_len ({x.seq_len}) divisible by 2*cp = "
                       f"{2 * r['cp']}: each rank holds two of 2*cp chunks for the causal load "
                       "balance (Megatron-LM arguments.py)")),
    Rule("a2a context parallel needs cp to divide the heads per tp rank", "cp_comm_type",
         ("tp", "cp", "cp_comm_type"),
         lambda x, c: (c["cp"] == 1) | (c["cp_comm_type"] != A2A)
         | ((x.model.num_heads % (c["tp"] * c["cp"]) == 0)
            & (x.model.kv_heads % (c["tp"] * c["cp"]) == 0)),
         lambda x, r: (f"cp_comm_type=a2a scatters heads over cp: tp*cp = {r['tp']}*{r['cp']} "
                       f"must divide num_heads={x.model.num_heads} and num_kv_heads="
                       f"{x.model.kv_heads} of model {x.model.name} (Transformer Engine "
                       "AttnFuncWithCPAndQKVOA2A); use cp_comm_type=p2p")),
)
"""Context parallelism (planner/timing/context.py; docs/context_parallel.md): Megatron-LM
arguments.py asserts seq_length % (2 * context_parallel_size) == 0; Transformer Engine's a2a
path asserts num_heads % cp_size == 0 for Q and for K/V (heads per tp rank)."""

LAYOUT_RULES: tuple[Rule, ...] = (
    Rule("offload_params needs ZeRO-3", "offload_params", ("offload_params", "zero_stage"),
         lambda x, c: (c["offload_params"] == 0) | (c["zero_stage"] == 3),
         lambda x, r: (f"offload_params={OFFLOAD_TARGETS[r['offload_params']]} needs zero_stage=3 "
                       f"(got {r['zero_stage']})")),
    Rule("offload_optimizer needs ZeRO >= 1", "offload_optimizer",
         ("offload_optimizer", "zero_stage"),
         lambda x, c: (c["offload_optimizer"] == 0) | (c["zero_stage"] >= 1),
         lambda x, r: (f"offload_optimizer={OFFLOAD_TARGETS[r['offload_optimizer']]} needs "
                       f"zero_stage >= 1 (got 0)")),
    Rule("FSDP2 shards like ZeRO-2 or ZeRO-3", "dp_engine", ("dp_engine", "zero_stage"),
         lambda x, c: (c["dp_engine"] == 0) | (c["zero_stage"] >= 2),
         lambda x, r: (f"dp_engine=fsdp2 needs zero_stage 3 (reshard_after_forward=True) or 2 "
                       f"(reshard_after_forward=False), got {r['zero_stage']}")),
    Rule("FSDP2 offload is not modelled", "dp_engine",
         ("dp_engine", "offload_optimizer", "offload_params"),
         lambda x, c: (c["dp_engine"] == 0) | ((c["offload_optimizer"] == 0)
                                              & (c["offload_params"] == 0)),
         lambda x, r: ("dp_engine=fsdp2 with offload is not modelled (FSDP2's CPUOffloadPolicy "
                       "moves parameters, gradients and the optimizer step together); use "
                       "dp_engine=deepspeed for offload")),
    Rule("sequence parallel needs tp > 1", "sequence_parallel", ("tp", "sequence_parallel"),
         lambda x, c: ~c["sequence_parallel"].astype(bool) | (c["tp"] > 1),
         lambda x, r: "sequence_parallel needs tp > 1 (got tp=1)"),
    Rule("virtual stages need pp > 1", "virtual_stages", ("pp", "virtual_stages"),
         lambda x, c: (c["virtual_stages"] == 1) | (c["pp"] > 1),
         lambda x, r: f"virtual_stages={r['virtual_stages']} needs pp > 1 (got pp=1)"),
    Rule("expert parallelism needs ZeRO <= 2", "ep", ("ep", "zero_stage"),
         lambda x, c: (c["ep"] == 1) | (c["zero_stage"] <= 2),
         lambda x, r: (f"ep={r['ep']} needs zero_stage 0, 1 or 2 (got 3): expert parallelism "
                       "under ZeRO-3 is not modelled (DeepSpeed's native MoE refuses it, "
                       "runtime/engine.py _validate_zero3_moe_compatibility; Megatron's "
                       "distributed optimizer shards like ZeRO-1)")),
)
"""Rules on one Layout alone (no model, cluster or setup): `Layout`'s own validator raises
them as ValueError when the layout is built; the sweep masks its candidates with them."""

RULES: tuple[Rule, ...] = LAYOUT_RULES + (
    Rule("tp*pp*dp must equal the GPUs", "layout", ("tp", "pp", "dp"),
         lambda x, c: c["tp"] * c.get("cp", 1) * c["pp"] * c["dp"] == x.cluster.num_gpus,
         _world_message),
    Rule(TP_RULE_NAME, "tp", ("tp",),
         _tp_divides, _tp_message),
    Rule(DP_SHARD_RULE, "dp_shard",
         ("dp", "dp_shard", "dp_engine", "zero_stage"), _dp_shard_ok, _dp_shard_message),
    Rule("pp*virtual_stages must not exceed the layers", "pp", ("pp", "virtual_stages"),
         lambda x, c: c["pp"] * c["virtual_stages"] <= x.model.num_layers,
         lambda x, r: (f"pp*virtual_stages = {r['pp']}*{r['virtual_stages']} must not exceed "
                       f"num_layers={x.model.num_layers}")),
    Rule("uneven stages must divide as Megatron's", "first_stage_layers",
         ("pp", "virtual_stages", "first_stage_layers", "last_stage_layers"),
         _uneven_ok, _uneven_message),
    Rule("interleaving needs layers divisible by pp*virtual_stages", "virtual_stages",
         ("pp", "virtual_stages"),
         lambda x, c: (c["virtual_stages"] == 1) | _split(c)[2]
         | (x.model.num_layers % (c["pp"] * c["virtual_stages"]) == 0),
         lambda x, r: (f"num_layers={x.model.num_layers} must be divisible by pp*virtual_stages = "
                       f"{r['pp']}*{r['virtual_stages']} for the interleaved schedule")),
    Rule("micro_batch*grad_accum*dp must equal the global batch", "global_batch",
         ("micro_batch", "grad_accum", "dp"),
         lambda x, c: c["micro_batch"] * c["grad_accum"] * c["dp"] == x.setup.global_batch,
         lambda x, r: (f"micro_batch*grad_accum*dp = {r['micro_batch']}*{r['grad_accum']}*{r['dp']}"
                       f" = {r['micro_batch'] * r['grad_accum'] * r['dp']} must equal "
                       f"global_batch={x.setup.global_batch}")),
    Rule("interleaving needs grad_accum divisible by pp", "grad_accum",
         ("pp", "virtual_stages", "grad_accum"),
         lambda x, c: (c["virtual_stages"] == 1) | (c["grad_accum"] % c["pp"] == 0),
         lambda x, r: (f"the interleaved schedule (virtual_stages={r['virtual_stages']}) needs "
                       f"grad_accum={r['grad_accum']} (micro-batches per step) divisible by "
                       f"pp={r['pp']} (Megatron-LM arguments.py)")),
    Rule("recompute_every_k must not exceed the layers per stage", "recompute_every_k",
         ("pp", "recompute", "recompute_every_k"),
         lambda x, c: (c["recompute"] != EVERY_K) | (c["recompute_every_k"] <= _most_layers(x, c["pp"])),
         lambda x, r: (f"recompute_every_k={r['recompute_every_k']} exceeds the layers per stage "
                       f"{ceil_div(x.model.num_layers, r['pp'])} (num_layers={x.model.num_layers}, "
                       f"pp={r['pp']})")),
    Rule(BLOCK_RULE, "recompute_num_layers",
         ("pp", "virtual_stages", "recompute", "recompute_num_layers"), _block_ok, _block_message),
    Rule("sequence parallel needs tp to divide seq_len", "seq_len", ("tp", "sequence_parallel"),
         lambda x, c: ~c["sequence_parallel"].astype(bool)
         | (x.seq_len % (c["tp"] * c.get("cp", 1)) == 0),
         lambda x, r: (f"sequence_parallel needs tp={r['tp']} to divide seq_len ({x.seq_len})"
                       + (f" / cp={r['cp']}" if r.get("cp", 1) > 1 else ""))),
) + CP_RULES + (
    Rule("offload_optimizer=nvme needs ZeRO-3", "offload_optimizer",
         ("offload_optimizer", "zero_stage"),
         lambda x, c: (c["offload_optimizer"] != NVME) | (c["zero_stage"] == 3),
         lambda x, r: (f"nvme needs zero_stage=3 (got {r['zero_stage']}); DeepSpeed offloads "
                       "optimizer states to NVMe only under ZeRO-3 (ZeRO-Infinity); use cpu for "
                       "ZeRO-1/2")),
    Rule("transformers implementations run tp = pp = 1", "implementation", ("tp", "pp"),
         _hf_parallel_ok,
         lambda x, r: (f"implementation={x.setup.implementation} runs transformers' modules: "
                       f"tp=1, pp=1 (got tp={r['tp']}, pp={r['pp']}); use implementation=megatron")),
    Rule("transformers implementations recompute none or full", "implementation", ("recompute",),
         _hf_recompute_ok,
         lambda x, r: (f"implementation={x.setup.implementation} runs transformers' modules: "
                       f"recompute none or full (got {RECOMPUTE_MODES[r['recompute']]}); use "
                       "implementation=megatron")),
    Rule("ep needs an MoE model and must divide its routed experts", "ep", ("ep",),
         lambda x, c: (c["ep"] == 1) | (x.model.is_moe & (x.model.num_experts % c["ep"] == 0)),
         _ep_experts_message),
    Rule("ep must divide dp", "ep", ("ep", "dp"),
         lambda x, c: c["dp"] % c["ep"] == 0,
         lambda x, r: (f"ep={r['ep']} must divide dp={r['dp']}: Megatron-Core carves the expert "
                       f"groups out of the data-parallel ranks, world_size % (etp*ep*pp) == 0 "
                       f"with etp = tp (parallel_state.py initialize_model_parallel)")),
    Rule("expert parallelism is modelled on DeepSpeed/Megatron data parallelism", "ep",
         ("ep", "dp_engine"),
         lambda x, c: (c["ep"] == 1) | (c["dp_engine"] == 0),
         lambda x, r: (f"ep={r['ep']} with dp_engine=fsdp2 is not modelled (FSDP2 shards "
                       "expert and dense weights by its own mesh); use dp_engine=deepspeed")),
    Rule("expert and context parallelism together are not modelled", "ep", ("ep", "cp"),
         lambda x, c: (c["ep"] == 1) | (c["cp"] == 1),
         lambda x, r: (f"ep={r['ep']} with cp={r['cp']} is not modelled (the expert groups' rank "
                       "placement and all-to-all volume assume cp = 1, docs/moe.md); use ep=1 "
                       "or cp=1")),
    Rule("transformers implementations run ep = 1", "implementation", ("ep",),
         lambda x, c: np.asarray(_megatron(x) | (c["ep"] == 1)),
         lambda x, r: (f"implementation={x.setup.implementation} runs transformers' modules "
                       f"without expert parallelism (got ep={r['ep']}); use implementation=megatron")),
    Rule("NVMe offload needs a node with NVMe capacity and bandwidth", "offload",
         ("offload_optimizer", "offload_params"),
         lambda x, c: ~_uses_nvme(c) | nvme_ready(x), _nvme_message),
    Rule("transformers implementations run cp = 1", "implementation", ("cp",),
         lambda x, c: np.asarray(_megatron(x) | (c["cp"] == 1)),
         lambda x, r: (f"implementation={x.setup.implementation} runs transformers' modules: "
                       f"cp=1 (got cp={r['cp']}); use implementation=megatron")),
)
"""Every layout rule, in the order `check_layout` reports them. The setup-only rule
(seq_len <= max_seq_len) is `check_setup`."""


def check_setup(model: ModelSpec, setup: TrainSetup) -> None:
    """seq_len <= the model's max_seq_len; an FP8 recipe runs Transformer Engine's modules
    (implementation=megatron: the hf-* inventories are transformers' bf16 tensors, docs/fp8.md)
    (no layout involved)."""
    if setup.seq_len > model.max_seq_len:
        raise PlanInputError(
            "seq_len", f"seq_len={setup.seq_len} exceeds the model's max_seq_len={model.max_seq_len}"
        )
    if setup.precision.fp8_scaling is not None and setup.implementation != "megatron":
        raise PlanInputError(
            "precision", f"{setup.precision.name} runs Transformer Engine's fp8 linears: "
            f"implementation=megatron (got {setup.implementation})")


def applicable(cols: LayoutColumns, rules: tuple[Rule, ...] = RULES) -> tuple[Rule, ...]:
    """The rules whose fields are all columns of `cols`."""
    if rules is RULES:  # remembered by the column names: a search masks a few shapes many times
        return _applicable_rules(frozenset(cols))
    return _reading(cols, rules)


@functools.lru_cache(maxsize=256)
def _applicable_rules(names: frozenset[str]) -> tuple[Rule, ...]:
    return _reading(names, RULES)


def _reading(names, rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
    return tuple(rule for rule in rules if all(name in names for name in rule.reads))


def mask(ctx: Context, cols: LayoutColumns, rules: tuple[Rule, ...] = RULES,
         rows: np.ndarray | None = None) -> tuple[np.ndarray, dict[str, int]]:
    """Rows every applicable rule allows, and {rule name: rows it rejected} (a row broken by
    several rules is counted under the first). `rows`: `cols` is a table of distinct
    combinations and these are the rows, each an index into it: the rules run once per
    combination, and the verdicts and counts are those of the rows."""
    ok = np.ones(len(cols), dtype=bool)
    first = None if rows is None else np.full(len(cols), -1, dtype=np.int64)  # first rule broken
    rejected: dict[str, int] = {}
    applied = applicable(cols, rules)
    for k, rule in enumerate(applied):
        allowed = as_shape(np.asarray(rule.ok(ctx, cols), dtype=bool), ok.shape)
        if first is not None:
            first[ok & ~allowed] = k
        else:
            newly = int((ok & ~allowed).sum())
            if newly:
                rejected[rule.name] = newly
        ok &= allowed
    if first is None:
        return ok, rejected
    ok_rows = ok.take(rows)
    if not ok_rows.all():
        counts = np.bincount(first.take(rows)[~ok_rows], minlength=len(applied))
        rejected = {rule.name: int(n) for rule, n in zip(applied, counts.tolist()) if n}
    return ok_rows, rejected


def check_layout(ctx: Context, cols: LayoutColumns, row: int = 0) -> None:
    """Raise the first broken rule of one row as a one-line PlanInputError."""
    check_setup(ctx.model, ctx.setup)
    check_rules(ctx, cols, RULES, row)


def named(*names: str) -> tuple[Rule, ...]:
    """The rules of RULES with these names (for a caller that checks only a few)."""
    rules = tuple(rule for rule in RULES if rule.name in names)
    if len(rules) != len(names):
        raise KeyError(f"unknown rule among {names}")
    return rules


def check_rules(ctx: Context, cols: LayoutColumns, rules: tuple[Rule, ...], row: int = 0) -> None:
    """Raise the first of `rules` that row `row` breaks, as a one-line PlanInputError."""
    check_row(ctx, cols.row(row), rules)


def check_row(ctx: Context, row: dict[str, int], rules: tuple[Rule, ...]) -> None:
    """Raise the first of `rules` that one layout's coded fields break (`first_broken`), as a
    one-line PlanInputError."""
    rule = first_broken(ctx, row, rules)
    if rule is not None:
        raise PlanInputError(rule.field, rule.message(ctx, row))


def layout_error(layout_fields: dict[str, int]) -> str | None:
    """The first broken `LAYOUT_RULES` rule of one layout's coded fields, or None
    (`Layout`'s validator; no model, cluster or setup needed)."""
    return _layout_error(tuple(sorted(layout_fields.items())))


@functools.lru_cache(maxsize=4096)
def _layout_error(items: tuple[tuple[str, int], ...]) -> str | None:
    layout_fields = dict(items)
    rule = first_broken(None, layout_fields, LAYOUT_RULES)  # type: ignore[arg-type]
    return None if rule is None else rule.message(None, layout_fields)  # type: ignore[arg-type]


def first_broken(ctx: Context, row: dict[str, int], rules: tuple[Rule, ...]) -> Rule | None:
    """The first of `rules` (those whose fields `row` has) that one layout's coded fields
    break, or None. Evaluated on numpy scalars, not length-1 columns: the rules' operators
    and `astype` read both alike, a scalar's at a tenth of the cost (a sweep validates each
    result row's Layout and checks each tp degree's activation inventory; `zplan fit` checks
    its layout)."""
    scalars = {k: np.int64(v) for k, v in row.items()}
    for rule in _reading(scalars, rules):
        if not rule.ok(ctx, scalars):  # type: ignore[arg-type]  # a numpy bool
            return rule
    return None
