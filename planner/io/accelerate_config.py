"""An accelerate config (the YAML `accelerate config` writes) as a zplan layout (issue 11).

Keys as accelerate 1.15.0 spells them: the top level is `ClusterConfig`'s fields
(accelerate/commands/config/config_args.py, `from_yaml_file` refuses any other key);
`fsdp_config` and `deepspeed_config` hold the arguments of the "FSDP Arguments" and "DeepSpeed
Arguments" groups of `accelerate launch` (accelerate/commands/launch.py `launch_command_parser`;
`_validate_launch_command` copies `fsdp_config.x` to `args.fsdp_x`, so the `fsdp_` prefix may be
left out). accelerate itself ignores a misspelt sub-key silently; here every unknown key is a
one-line error (exit 2), as the file would not do what its author meant.

Mapping (the planner's fields; `num_processes` counts processes over all machines):
- distributed_type NO: one process; MULTI_GPU: DDP, dp = num_processes, ZeRO-0;
  FSDP: `fsdp_version` 2 (torch `fully_shard`, dp_engine fsdp2): `fsdp_reshard_after_forward`
  true (accelerate's default) = ZeRO-3, false = ZeRO-2. `fsdp_version` 1 (accelerate's default
  when absent, utils/launch.py `prepare_multi_gpu_env`): FULL_SHARD = ZeRO-3, SHARD_GRAD_OP =
  ZeRO-2, NO_SHARD = ZeRO-0, planned with ZeRO's accounting (said in a note: zplan has no FSDP1
  model); HYBRID_SHARD / HYBRID_SHARD_ZERO2 = dp_engine fsdp2 (HSDP) at ZeRO-3 / ZeRO-2 with
  dp_shard = num_processes / num_machines (the node's GPUs). FSDP2 HSDP: `parallelism_config`
  `parallelism_config_dp_shard_size` (x `_dp_replicate_size` = num_processes) is dp_shard. `fsdp_offload_params` moves parameters, gradients and the
  optimizer step to the CPU: offload both. `fsdp_activation_checkpointing`: recompute=full.
  DEEPSPEED: `deepspeed_config_file` is read as a DeepSpeed config (planner.io.deepspeed), else
  `zero_stage`, `offload_*_device` and `gradient_accumulation_steps` make one.
- mixed_precision (no / bf16 / fp16): DDP and FSDP keep fp32 weights and compute under
  torch.autocast (accelerate's `Accelerator` native AMP; FSDP2 shards fp32 parameters):
  recipes fp32 / autocast-bf16 / autocast-fp16. DeepSpeed's bf16 / fp16 sections keep a 16-bit
  model and fp32 master: bf16-mixed / zero-fp16.
- The batch is not in the file (the training script's dataloader): --micro-batch with
  --grad-accum or --global-batch (DeepSpeed: its gradient_accumulation_steps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.core.errors import PlanInputError, format_validation_error
from planner.core.spec import Layout
from planner.io.engine import EngineJob
from planner.io.strict import read_yaml

FIELD = "accelerate-config"
CLUSTER_CONFIG_KEYS = frozenset((
    "compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug",
    "num_processes", "machine_rank", "num_machines", "gpu_ids", "main_process_ip",
    "main_process_port", "rdzv_backend", "same_network", "main_training_function",
    "enable_cpu_affinity", "fp8_config", "deepspeed_config", "fsdp_config", "parallelism_config",
    "megatron_lm_config", "mpirun_config", "downcast_bf16", "tpu_name", "tpu_zone",
    "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands", "tpu_vm", "tpu_env",
    "dynamo_config"))
"""accelerate 1.15.0 `ClusterConfig`'s dataclass fields (config_args.py)."""
FSDP_KEYS = frozenset((
    "fsdp_version", "fsdp_offload_params", "fsdp_min_num_params", "fsdp_sharding_strategy",
    "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_backward_prefetch", "fsdp_state_dict_type", "fsdp_forward_prefetch",
    "fsdp_use_orig_params", "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states",
    "fsdp_activation_checkpointing", "fsdp_activation_checkpointing_offload"))
"""`accelerate launch`'s "FSDP Arguments" (launch.py, accelerate 1.15.0)."""
DEEPSPEED_KEYS = frozenset((
    "deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
    "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_accumulation_steps",
    "gradient_clipping", "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_hostfile",
    "deepspeed_exclusion_filter", "deepspeed_inclusion_filter", "deepspeed_multinode_launcher",
    "deepspeed_moe_layer_cls_names"))
"""`accelerate launch`'s "DeepSpeed Arguments" (launch.py, accelerate 1.15.0)."""
DISTRIBUTED_TYPES = ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED")
AUTOCAST_RECIPES = {"no": "fp32", "bf16": "autocast-bf16", "fp16": "autocast-fp16"}
DEEPSPEED_RECIPES = {"no": "fp32", "bf16": "bf16-mixed", "fp16": "zero-fp16"}
FSDP1_ZERO = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0, "HYBRID_SHARD": 3,
              "HYBRID_SHARD_ZERO2": 2, 1: 3, 2: 2, 3: 0, 4: 3, 5: 2}
"""FSDP1 sharding strategies (by name or accelerate's 1-based number, utils/constants.py
FSDP_SHARDING_STRATEGY) as ZeRO stages."""
FSDP1_HYBRID = ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2", 4, 5)
"""torch/distributed/fsdp/api.py ShardingStrategy.HYBRID_SHARD / _HYBRID_SHARD_ZERO2: FULL_SHARD
resp. SHARD_GRAD_OP within a node, replicated across nodes (`_init_utils.py`
`_init_intra_and_inter_node_groups`: the shard group is the node's GPUs)."""
PARALLELISM_KEYS = ("parallelism_config_dp_replicate_size", "parallelism_config_dp_shard_size")
"""The `parallelism_config` keys read (accelerate 1.15.0 launch.py: copied as-is to the launch
arguments; utils/launch.py sets PARALLELISM_CONFIG_DP_REPLICATE_SIZE / _DP_SHARD_SIZE): FSDP2's
2-D mesh (replicate, shard), HSDP."""


def read_accelerate_config(path: Path) -> dict[str, Any]:
    """The file's mapping, every key checked against accelerate's (module docstring)."""
    config = read_yaml(Path(path), FIELD)
    if not isinstance(config, dict):
        raise PlanInputError(FIELD, f"{path}: expected a mapping of accelerate config keys")
    _known(config, CLUSTER_CONFIG_KEYS, FIELD)
    for name, keys, prefix in (("fsdp_config", FSDP_KEYS, "fsdp_"), ("deepspeed_config", DEEPSPEED_KEYS, "")):
        section = config.get(name) or {}
        if not isinstance(section, dict):
            raise PlanInputError(f"{FIELD}.{name}", f"must be a mapping, got {section!r}")
        section = {(k if k.startswith(prefix) else prefix + k): v for k, v in section.items()}
        _known(section, keys, f"{FIELD}.{name}")
        config[name] = section
    return config


def _known(mapping: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(str(k) for k in mapping if k not in allowed)
    if unknown:
        raise PlanInputError(f"{where}.{unknown[0]}", f"unknown key; allowed: {', '.join(sorted(allowed))}")


def _choice(config: dict[str, Any], key: str, allowed, default, where: str = FIELD):
    value = config.get(key, default)
    value = value.value if hasattr(value, "value") else value
    if value not in allowed:
        raise PlanInputError(f"{where}.{key}", f"{value!r}; allowed: {', '.join(map(str, allowed))}")
    return value


def _flag(section: dict[str, Any], key: str, default: bool) -> bool:
    """A boolean sub-key; accelerate writes them as YAML booleans (or "true" / "false")."""
    value = section.get(key, default)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise PlanInputError(f"{FIELD}.fsdp_config.{key}", f"{value!r}; allowed: true, false")
    return value


def num_processes(config: dict[str, Any], gpus: int | None) -> int:
    """Processes over all machines: the file's `num_processes`, or --gpus when the file leaves it
    unset (-1, accelerate's default for launchers that pass it); both given must agree."""
    if config.get("distributed_type") == "NO":
        value = 1
    else:
        value = config.get("num_processes", -1)
    if not isinstance(value, int) or isinstance(value, bool) or (value < 1 and value != -1):
        raise PlanInputError(f"{FIELD}.num_processes", f"must be a positive integer, got {value!r}")
    if value == -1:
        if gpus is None:
            raise PlanInputError(f"{FIELD}.num_processes", "not set in the file: give --gpus")
        return gpus
    if gpus is not None and gpus != value:
        raise PlanInputError("--gpus", f"{gpus}, but the accelerate config runs num_processes={value}")
    return value


def fsdp_fields(section: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Layout fields of an `fsdp_config` section, and notes (module docstring)."""
    version = _choice(section, "fsdp_version", (1, 2), 1, f"{FIELD}.fsdp_config")
    offload = _flag(section, "fsdp_offload_params", False)
    fields: dict[str, Any] = {"recompute": "full" if _flag(section, "fsdp_activation_checkpointing", False) else "none"}
    notes = []
    if version == 2:
        fields |= {"dp_engine": "fsdp2",
                   "zero_stage": 3 if _flag(section, "fsdp_reshard_after_forward", True) else 2}
    else:
        strategy = _choice(section, "fsdp_sharding_strategy", tuple(FSDP1_ZERO), "FULL_SHARD",
                           f"{FIELD}.fsdp_config")
        fields["zero_stage"] = FSDP1_ZERO[strategy]
        if strategy in FSDP1_HYBRID:  # dp_shard (the node's GPUs) set by job_from_accelerate
            fields |= {"dp_engine": "fsdp2", "dp_shard": "node"}
            notes.append(f"fsdp_sharding_strategy {strategy} (FSDP1 HSDP) planned with FSDP2's "
                         "HSDP schedule over the same groups: shard within a node, all-reduce "
                         "across nodes")
            return fields | _offload(offload), notes
        notes.append(f"fsdp_version 1 (FlatParameter FSDP) planned with ZeRO-{fields['zero_stage']}'s "
                     "accounting: zplan models FSDP2 (fsdp_version: 2) and DeepSpeed, not FSDP1")
    return fields | _offload(offload), notes


def _offload(offload: bool) -> dict[str, Any]:
    return {"offload_optimizer": "cpu", "offload_params": "cpu"} if offload else {}


def hsdp_shard(config: dict[str, Any], fields: dict[str, Any], processes: int) -> int | None:
    """dp_shard of an FSDP config: FSDP1 HYBRID_SHARD shards over one machine's processes
    (num_processes / num_machines); FSDP2 over `parallelism_config_dp_shard_size`, whose product
    with the replicate size must be num_processes. None: the whole group."""
    section = config.get("parallelism_config") or {}
    where = f"{FIELD}.parallelism_config"
    if fields.get("dp_shard") == "node":
        machines = config.get("num_machines", 1)
        if not isinstance(machines, int) or machines < 1 or processes % machines:
            raise PlanInputError(f"{FIELD}.num_machines", f"{machines!r} must be a positive "
                                 f"divisor of num_processes={processes} for HYBRID_SHARD")
        return processes // machines
    if not section:
        return None
    if not isinstance(section, dict) or set(section) - set(PARALLELISM_KEYS):
        raise PlanInputError(where, f"only {', '.join(PARALLELISM_KEYS)} are read (accelerate's "
                             "tp / cp / sp sizes are not); plan those with a job file")
    if fields.get("dp_engine") != "fsdp2":
        raise PlanInputError(where, "needs distributed_type FSDP with fsdp_version 2")
    replicate, shard = (section.get(k, 1) for k in PARALLELISM_KEYS)
    if not all(isinstance(v, int) and v >= 1 for v in (replicate, shard)) \
            or replicate * shard != processes:
        raise PlanInputError(where, f"dp_replicate_size={replicate!r} x dp_shard_size={shard!r} "
                             f"must be positive integers whose product is num_processes={processes}")
    return shard


def deepspeed_job(config: dict[str, Any], path: Path, dp: int, batch: dict[str, Any],
                  hidden_size: int) -> EngineJob:
    """A DEEPSPEED config: its `deepspeed_config_file` (relative to the YAML's folder), else the
    DeepSpeed config accelerate builds from the section's keys (utils/dataclasses.py
    `DeepSpeedPlugin.__post_init__`: zero stage, offload devices, gradient accumulation; the
    micro-batch "auto", filled from the dataloader)."""
    from planner.io.deepspeed import layout_from_deepspeed, read_deepspeed_config

    section = config["deepspeed_config"]
    mixed = _choice(config, "mixed_precision", tuple(DEEPSPEED_RECIPES), "no")
    if section.get("deepspeed_config_file"):
        ds_path = Path(path).parent / str(section["deepspeed_config_file"])
        ds = read_deepspeed_config(ds_path)
    else:
        devices = ("none", "cpu", "nvme")
        ds = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
              "gradient_accumulation_steps": section.get("gradient_accumulation_steps", "auto"),
              "zero_optimization": {
                  "stage": _choice(section, "zero_stage", (0, 1, 2, 3), 2, f"{FIELD}.deepspeed_config"),
                  "offload_optimizer": {"device": _choice(section, "offload_optimizer_device", devices,
                                                          "none", f"{FIELD}.deepspeed_config")},
                  "offload_param": {"device": _choice(section, "offload_param_device", devices,
                                                      "none", f"{FIELD}.deepspeed_config")}},
              "bf16": {"enabled": mixed == "bf16"}, "fp16": {"enabled": mixed == "fp16"}}
    return layout_from_deepspeed(ds, num_gpus=dp, hidden_size=hidden_size, **batch)


def resolve_batch(dp: int, micro_batch: int | None, grad_accum: int | None,
                  global_batch: int | None) -> tuple[int, int, int]:
    """(micro, grad_accum, global) from the command line: micro required, grad_accum from
    --grad-accum or --global-batch / (micro x dp), default 1; all three must agree."""
    if micro_batch is None:
        raise PlanInputError("--micro-batch", "an accelerate config has no batch size (the "
                             "training script's dataloader sets it): give --micro-batch")
    if grad_accum is None:
        if global_batch is not None and global_batch % (micro_batch * dp):
            raise PlanInputError("--global-batch", f"{global_batch} is not a multiple of "
                                 f"micro-batch x processes = {micro_batch} x {dp}")
        grad_accum = global_batch // (micro_batch * dp) if global_batch is not None else 1
    if global_batch is not None and global_batch != micro_batch * grad_accum * dp:
        raise PlanInputError("--global-batch", f"{global_batch} != micro-batch x grad-accum x "
                             f"processes = {micro_batch} x {grad_accum} x {dp}")
    return micro_batch, grad_accum, micro_batch * grad_accum * dp


def job_from_accelerate(config: dict[str, Any], path: Path, *, num_gpus: int, hidden_size: int,
                        micro_batch: int | None = None, grad_accum: int | None = None,
                        global_batch: int | None = None, recompute: str | None = None) -> EngineJob:
    """The layout, batch and precision an accelerate config describes on `num_gpus` processes
    (`num_processes`) with the command line's batch numbers."""
    _choice(config, "compute_environment", ("LOCAL_MACHINE",), "LOCAL_MACHINE")
    if config.get("use_cpu"):
        raise PlanInputError(f"{FIELD}.use_cpu", "true runs on CPUs; zplan plans GPU training")
    kind = _choice(config, "distributed_type", DISTRIBUTED_TYPES, "NO")
    if config.get("parallelism_config") and kind != "FSDP":
        raise PlanInputError(f"{FIELD}.parallelism_config", "accelerate's ND parallelism needs "
                             "distributed_type FSDP (fsdp_version 2); only its dp sizes are read")
    notes = []
    backend = (config.get("dynamo_config") or {}).get("dynamo_backend", "NO")
    if str(backend).upper() != "NO":
        notes.append(f"dynamo_backend {backend}: torch.compile saves 19-69 % fewer activation bytes "
                     "than the hf-sdpa inventory counts (measured, docs/implementations.md §10): "
                     "the plan is an upper bound")
    if kind == "DEEPSPEED":
        batch = {"micro_batch": micro_batch, "grad_accum": grad_accum, "global_batch": global_batch,
                 "recompute": recompute}
        job = deepspeed_job(config, path, num_gpus, batch, hidden_size)
        return job.model_copy(update={"notes": (*job.notes, *notes)})
    fields: dict[str, Any] = {}
    if kind == "FSDP":
        fields, notes = fsdp_fields(config["fsdp_config"])
        fields["dp_shard"] = hsdp_shard(config, fields, num_gpus)
    if recompute is not None:
        fields["recompute"] = recompute
    mixed = _choice(config, "mixed_precision", tuple(AUTOCAST_RECIPES), "no")
    micro, gas, total = resolve_batch(num_gpus, micro_batch, grad_accum, global_batch)
    try:
        layout = Layout(dp=num_gpus, micro_batch=micro, grad_accum=gas, **fields)
    except ValidationError as err:
        raise PlanInputError(FIELD, format_validation_error(err)) from None
    return EngineJob(layout=layout, global_batch=total, precision=AUTOCAST_RECIPES[mixed],
                     notes=tuple(notes))
