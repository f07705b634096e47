"""Which training engine can run a layout: the support matrix (issue 13).

One rule table: each rule names an engine, a condition on (model, layout, precision) the engine
cannot run, a one-line reason, and the engine code or documentation it comes from, at the
version read. An engine runs a layout when none of its rules fires. The exporters
(planner/io/megatron.py, deepspeed.py, fsdp.py) additionally check what their file format can
express; this table is about the engines themselves.

Versions read: Megatron-LM NVIDIA/Megatron-LM@d98e8a64 (megatron/training/arguments.py);
DeepSpeed 0.19.8 (the installed package: deepspeed/runtime/pipe/engine.py, pipe/schedule.py) and
its AutoTP training tutorial (deepspeed.ai/tutorials/autotp-training), module_inject/tp_shard.py;
torchtitan / FSDP2 (torch 2.13 torch/distributed/fsdp/_fully_shard, CPUOffloadPolicy;
pytorch/torchtitan@b5bcd76c models/common/decoder.py); transformers 5.23.0; accelerate 1.15.0
(accelerate/parallelism_config.py, utils/dataclasses.py FullyShardedDataParallelPlugin).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, get_args

from planner.core.errors import PlanInputError
from planner.core.spec import Layout, ModelSpec, PrecisionRecipe

Engine = Literal["megatron-lm", "deepspeed", "fsdp2", "accelerate"]
ENGINES: tuple[str, ...] = get_args(Engine)
ENGINE_NAMES: dict[str, str] = {
    "megatron-lm": "Megatron-LM", "deepspeed": "DeepSpeed (HF model, AutoTP)",
    "fsdp2": "FSDP2 / torchtitan", "accelerate": "HF accelerate (FSDP2)",
}
EXPORT_ENGINE: dict[str, str | None] = {
    "megatron": "megatron-lm", "deepspeed": "deepspeed", "accelerate-fsdp": "accelerate",
    "torchrun": None,  # a launch line for any script: no engine to check
}
"""The engine each `zplan export --format` runs."""

Condition = Callable[[ModelSpec, Layout, PrecisionRecipe], bool]

SHARDED_DP_MODEL: dict[str, str] = {
    "deepspeed": "deepspeed", "megatron-lm": "fsdp2", "fsdp2": "fsdp2", "accelerate": "fsdp2",
}
"""The planner's model (`Layout.dp_engine`) of each engine's ZeRO-2/3 sharding: DeepSpeed's own
ZeRO stages; torch's `fully_shard` for torchtitan, accelerate and Megatron-LM (whose ZeRO-2/3 is
`--use-torch-fsdp2`, the rule below). `zplan sweep --engine E` and the export search keep E's
ZeRO-2/3 rows under this model only (`sweep.engine_mask`)."""

FIELDS_READ: tuple[str, ...] = (
    "tp", "pp", "dp", "dp_shard", "ep", "cp", "cp_comm_type", "zero_stage", "offload_params",
    "offload_optimizer", "virtual_stages", "sequence_parallel", "recompute", "tempo",
)
"""Every `Layout` field a rule of RULES reads (tests/test_sweep_engine.py reads the rules' code
and checks it): the sweep evaluates the rules once per distinct combination of these fields and
`dp_engine` (`timed_as`)."""


@dataclass(frozen=True)
class EngineRule:
    """`engine` cannot run a layout for which `refuses` holds, because `why` (per `source`)."""

    engine: Engine
    refuses: Condition
    why: str
    source: str


_MEGATRON = "NVIDIA/Megatron-LM@d98e8a64 megatron/training/arguments.py"
_DS = "DeepSpeed 0.19.8"
_FSDP2 = "torch 2.13 torch/distributed/fsdp/_fully_shard/_fully_shard.py (fully_shard, CPUOffloadPolicy)"
_ACCEL = "accelerate 1.15.0"


def _hsdp(l: Layout) -> bool:
    """States sharded over a dp_shard group smaller than dp (FSDP2 / FSDP1 hybrid only)."""
    return l.dp_shard is not None and l.dp_shard < l.dp


def _tp_wider_than_kv(m: ModelSpec, l: Layout, p: PrecisionRecipe) -> bool:
    """tp > num_kv_heads (standard attention): Megatron replicates the kv heads
    (params.kv_heads_per_rank); the engines below do not."""
    return not m.is_mla and l.tp > m.kv_heads


RULES: tuple[EngineRule, ...] = (
    # ---------------------------------------------------------------- Megatron-LM
    EngineRule("megatron-lm", lambda m, l, p: l.offload_params != "none",
               "keeps parameters on the GPU (it has --optimizer-cpu-offload, no parameter offload)",
               f"{_MEGATRON}: --optimizer-cpu-offload is the only offload flag"),
    EngineRule("megatron-lm", lambda m, l, p: l.offload_optimizer == "nvme",
               "offloads optimizer states to CPU only, not to NVMe",
               f"{_MEGATRON}: --optimizer-cpu-offload 'Offload optimizer state to CPU'"),
    EngineRule("megatron-lm", lambda m, l, p: l.zero_stage >= 2 and l.pp > 1,
               "shards gradients/parameters with --use-torch-fsdp2, which refuses pipeline parallelism",
               f"{_MEGATRON} L1035: '--use-torch-fsdp2 is not supported with pipeline parallelism'"),
    EngineRule("megatron-lm", lambda m, l, p: bool(l.tempo),
               "has no Tempo (in-place GELU/LayerNorm) kernels", f"{_MEGATRON}: no such flag"),
    EngineRule("megatron-lm", lambda m, l, p: _hsdp(l),
               "shards over the whole data-parallel group (no HSDP shard group for its "
               "distributed optimizer)",
               f"{_MEGATRON}: --use-distributed-optimizer shards over the dp x cp group"),
    # ---------------------------------------------------------------- DeepSpeed
    EngineRule("deepspeed", lambda m, l, p: _hsdp(l),
               "HSDP (dp_shard < dp) would be MiCS (mics_shard_size), which it no longer has",
               f"{_DS} deepspeed/runtime/config.py _REMOVED_ZERO_CONFIG_KEYS: 'MiCS ZeRO-3 "
               "sharding has been removed' (docs/collectives.md \"MiCS\")"),
    EngineRule("deepspeed", lambda m, l, p: l.pp > 1 and l.zero_stage >= 2,
               "pipeline parallelism runs with ZeRO-0/1 only",
               f"{_DS} deepspeed/runtime/pipe/engine.py PipelineEngine.__init__: assert "
               "'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'"),
    EngineRule("deepspeed", lambda m, l, p: l.virtual_stages > 1,
               "has no interleaved pipeline schedule",
               f"{_DS} deepspeed/runtime/pipe/schedule.py: TrainSchedule is 1F1B, no virtual stages"),
    EngineRule("deepspeed", lambda m, l, p: l.sequence_parallel,
               "AutoTP has no Megatron-style sequence parallelism of norms and dropout",
               "deepspeed.ai/tutorials/autotp-training: TP over linear layers only"),
    EngineRule("deepspeed", lambda m, l, p: l.cp > 1 and l.cp_comm_type == "p2p",
               "splits sequences with Ulysses all-to-alls only (cp_comm_type a2a), no ring attention",
               "DeepSpeed@edaa7221 deepspeed/sequence/layer.py DistributedAttention, "
               "deepspeed/runtime/sequence_parallel/ulysses_sp.py"),
    EngineRule("deepspeed", lambda m, l, p: l.recompute == "selective",
               "checkpoints whole layers (HF gradient checkpointing / deepspeed.checkpointing), "
               "not Megatron's selective attention recompute",
               f"{_DS} deepspeed/runtime/activation_checkpointing/checkpointing.py"),
    EngineRule("deepspeed", lambda m, l, p: l.recompute == "block",
               "checkpoints every layer or every segment of k layers, never only the first n "
               "layers of a stage (Megatron's --recompute-method block)",
               f"{_DS} deepspeed/runtime/pipe/module.py PipelineModule activation_checkpoint_interval "
               "(segments of k layers over all layers); HF transformers gradient_checkpointing_enable "
               "(every decoder layer)"),
    EngineRule("deepspeed", _tp_wider_than_kv,
               "AutoTP splits attention by whole kv heads, so with tp wider than num_kv_heads the "
               "ranks past the kv heads get no attention heads (no replication)",
               f"{_DS} deepspeed/module_inject/tp_shard.py get_shard_size: my_slices = "
               "num_kv_heads // mp_size + (1 if rank < num_kv_heads % mp_size)"),
    # ---------------------------------------------------------------- FSDP2 / torchtitan
    EngineRule("fsdp2", _tp_wider_than_kv,
               "torchtitan's tensor parallelism needs tp to divide num_kv_heads",
               "pytorch/torchtitan@b5bcd76c torchtitan/models/common/decoder.py: "
               "'tensor_parallel_degree ({tp}) must divide n_kv_heads'"),
    EngineRule("fsdp2", lambda m, l, p: l.zero_stage == 1,
               "shards parameters, gradients and optimizer states together; no optimizer-only ZeRO-1",
               f"{_FSDP2}: reshard_after_forward True (ZeRO-3) or False (ZeRO-2); "
               "DDP (replicate) is ZeRO-0"),
    EngineRule("fsdp2", lambda m, l, p: "nvme" in (l.offload_params, l.offload_optimizer),
               "offloads to CPU memory only", f"{_FSDP2}: CPUOffloadPolicy"),
    EngineRule("fsdp2", lambda m, l, p: (l.offload_params == "cpu") != (l.offload_optimizer == "cpu"),
               "offloads parameters, gradients and the optimizer step to the CPU together",
               f"{_FSDP2}: CPUOffloadPolicy moves the sharded parameters; the optimizer steps on CPU"),
    EngineRule("fsdp2", lambda m, l, p: l.cp > 1 and l.cp_comm_type == "a2a",
               "context parallelism is torch's ring attention (KV rotated between ranks), not "
               "Ulysses all-to-all heads",
               "torch 2.13 torch/distributed/tensor/experimental/_context_parallel/_attention.py "
               "(_RotateMethod: rotate KV by all-gather or all-to-all)"),
    EngineRule("fsdp2", lambda m, l, p: bool(l.tempo),
               "has no Tempo kernels", "torchtitan: no such option"),
    # ---------------------------------------------------------------- HF accelerate (FSDP2)
    EngineRule("accelerate", _tp_wider_than_kv,
               "transformers' tensor parallelism shards k_proj/v_proj colwise and needs tp to "
               "divide num_kv_heads (no kv-head replication)",
               "transformers 5.23.0 distributed/tensor_parallel.py get_kv_heads_per_rank: "
               "None when heads % tp_size"),
    EngineRule("accelerate", lambda m, l, p: l.pp > 1,
               "has no pipeline parallelism with FSDP (ParallelismConfig: dp_replicate, dp_shard, "
               "tp, cp only)",
               f"{_ACCEL} accelerate/parallelism_config.py ParallelismConfig fields"),
    EngineRule("accelerate", lambda m, l, p: l.zero_stage < 2,
               "FSDP shards like ZeRO-2 or ZeRO-3 (use DDP or DeepSpeed for ZeRO-0/1)",
               f"{_ACCEL} utils/dataclasses.py FullyShardedDataParallelPlugin reshard_after_forward"),
    EngineRule("accelerate", lambda m, l, p: "nvme" in (l.offload_params, l.offload_optimizer)
               or (l.offload_params == "cpu") != (l.offload_optimizer == "cpu"),
               "FSDP offloads parameters and optimizer together, to CPU only",
               f"{_ACCEL} FullyShardedDataParallelPlugin cpu_offload (FSDP2 CPUOffloadPolicy)"),
    EngineRule("accelerate", lambda m, l, p: l.ep > 1,
               "has no expert parallelism (ParallelismConfig: dp_replicate, dp_shard, tp, cp only)",
               f"{_ACCEL} accelerate/parallelism_config.py ParallelismConfig fields"),
    EngineRule("accelerate", lambda m, l, p: l.cp > 1 and l.cp_comm_type == "a2a",
               "with FSDP, context parallelism is cp_size (torch ring attention); Ulysses (sp_size) "
               "needs its DeepSpeed backend",
               f"{_ACCEL} accelerate/parallelism_config.py cp_backend 'torch', sp_backend 'deepspeed'"),
    EngineRule("accelerate", lambda m, l, p: l.recompute not in ("none", "full") or bool(l.tempo)
               or l.sequence_parallel,
               "checkpoints whole layers (fsdp_activation_checkpointing); no selective recompute, "
               "Tempo or Megatron sequence parallelism",
               f"{_ACCEL} FullyShardedDataParallelPlugin activation_checkpointing"),
)


def refusals(engine: str, model: ModelSpec, layout: Layout, precision: PrecisionRecipe) -> list[EngineRule]:
    """The rules of `engine` that the layout breaks (empty: the engine can run it)."""
    if engine not in ENGINES:
        raise PlanInputError("engine", f"unknown engine {engine!r}; allowed: {', '.join(ENGINES)}")
    return [rule for rule in RULES if rule.engine == engine and rule.refuses(model, layout, precision)]


def supported_engines(model: ModelSpec, layout: Layout, precision: PrecisionRecipe) -> list[str]:
    """The engines that can run the layout, in ENGINES order."""
    return [engine for engine in ENGINES if not refusals(engine, model, layout, precision)]


def timed_as(engine: str, layout: Layout) -> bool:
    """True when the layout is timed with `engine`'s own sharding model: ZeRO-0/1, or ZeRO-2/3
    with `dp_engine` = SHARDED_DP_MODEL[engine]."""
    return layout.zero_stage < 2 or layout.dp_engine == SHARDED_DP_MODEL[engine]


def check_engine(engine: str, model: ModelSpec, layout: Layout, precision: PrecisionRecipe,
                 field: str = "--format", timed: bool = False) -> None:
    """Raise a one-line PlanInputError naming `field`, the engine and the first reason it cannot
    run the layout (with its source). `timed`: also when the layout's ZeRO-2/3 is timed with
    another sharding model than the engine's (`SHARDED_DP_MODEL`; `zplan fit --engine`)."""
    broken = refusals(engine, model, layout, precision)
    if broken:
        rule = broken[0]
        raise PlanInputError(field, f"{ENGINE_NAMES[engine]} cannot run this layout: {rule.why} "
                                    f"({rule.source})")
    sharding = SHARDED_DP_MODEL[engine]
    if timed and not timed_as(engine, layout):
        raise PlanInputError(field, f"{ENGINE_NAMES[engine]} shards ZeRO-{layout.zero_stage} as "
                                    f"dp_engine={sharding}, this layout is timed as dp_engine="
                                    f"{layout.dp_engine} (pass --dp-engine {sharding})")
