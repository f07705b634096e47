"""accelerate FSDP2 config (the YAML `accelerate config` writes) for a layout.

Keys as accelerate's FSDP2 config file spells them (`fsdp_version: 2`,
`fsdp_reshard_after_forward`, `fsdp_offload_params`, `fsdp_activation_checkpointing`, ...).
Mapping (FSDP2 = torch.distributed.fsdp.fully_shard):
- ZeRO-3 <-> reshard_after_forward true (parameters re-sharded after forward, FULL_SHARD);
  ZeRO-2 <-> false (kept unsharded until backward, SHARD_GRAD_OP). FSDP has no ZeRO-1, and
  ZeRO-0 is plain DDP, so those are rejected.
- fsdp_offload_params (CPUOffloadPolicy) moves parameters, gradients and the optimizer step to
  the CPU together: the layout must offload both optimizer and parameters to cpu.
- fsdp_activation_checkpointing wraps every transformer layer: recompute=full.
- mixed_precision bf16 / fp16 / no. accelerate runs FSDP2 with fp32 sharded parameters and
  compute under torch.autocast: exactly the autocast-bf16 / autocast-fp16 / fp32 recipes, which
  is how `check --accelerate-config` reads the file back (planner/io/accelerate_config.py). The
  16-bit-model recipes bf16-mixed / zero-fp16 are written as bf16 / fp16 too: the same 16
  bytes/param of model states split differently (2 + 2 + 12 against 4 + 4 + 8), an
  approximation, so a round trip of such a plan comes back as the autocast recipe.
- More than one machine: `accelerate launch` (accelerate 1.15.0 `commands/launch.py`
  `_validate_launch_command`) copies a top-level config value into its arguments only when the
  command-line default is None. `--rdzv_backend` defaults to "static" and `--same_network` to
  False, so those two config keys never take effect and are not written; the rendezvous is
  static at `main_process_ip:main_process_port` (`utils/launch.py` `prepare_multi_gpu_env`).
  The address of machine 0 is not known when planning: give it, and each machine's rank, at
  launch (`launch_hint`).
"""

from __future__ import annotations

from typing import Any

from planner.core.errors import PlanInputError
from planner.io.torchrun import nodes_and_procs
from planner.core.spec import Cluster, Layout, TrainSetup

_MIXED_PRECISION = {"autocast-bf16": "bf16", "autocast-fp16": "fp16", "fp32": "no",
                    "bf16-mixed": "bf16", "zero-fp16": "fp16"}
MAIN_PROCESS_PORT = 29500  # accelerate's default when main_process_port is unset (prepare_multi_gpu_env)


def _check(layout: Layout, setup: TrainSetup) -> None:
    """Raise for a layout accelerate's FSDP config cannot express."""
    problems = [
        (layout.tp > 1 or layout.pp > 1, "layout", f"tp={layout.tp} pp={layout.pp}: FSDP is data parallel only"),
        (layout.zero_stage < 2, "zero_stage", f"{layout.zero_stage}: FSDP shards like ZeRO-2 or ZeRO-3"),
        (layout.recompute not in ("none", "full"), "recompute", f"{layout.recompute}: FSDP checkpoints whole layers"),
        ("nvme" in (layout.offload_params, layout.offload_optimizer), "offload", "FSDP offloads to cpu only"),
        ((layout.offload_params == "cpu") != (layout.offload_optimizer == "cpu"), "offload",
         "FSDP's CPU offload moves parameters and optimizer together; offload both or neither"),
        (bool(layout.tempo) or layout.sequence_parallel, "layout", "Tempo / sequence parallel have no FSDP key"),
        (setup.precision.name not in _MIXED_PRECISION, "precision",
         f"{setup.precision.name}; allowed: {', '.join(_MIXED_PRECISION)}"),
    ]
    for bad, field, why in problems:
        if bad:
            raise PlanInputError(field, f"not expressible as an accelerate FSDP config: {why}")


def accelerate_fsdp_config(cluster: Cluster, layout: Layout, setup: TrainSetup) -> dict[str, Any]:
    """The accelerate config mapping (dump it with yaml.safe_dump)."""
    _check(layout, setup)
    nnodes, _ = nodes_and_procs(cluster, layout)
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",  # the model's _no_split_modules
            "fsdp_reshard_after_forward": layout.zero_stage == 3,
            "fsdp_offload_params": layout.offload_params == "cpu",
            "fsdp_activation_checkpointing": layout.recompute == "full",
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        },
        **_hsdp_mesh(layout),
        "mixed_precision": _MIXED_PRECISION[setup.precision.name],
        "machine_rank": 0,  # machine k of several overrides it with --machine_rank k
        "num_machines": nnodes,
        "num_processes": layout.num_gpus,  # accelerate counts processes over all machines
        "main_process_port": MAIN_PROCESS_PORT,
        "use_cpu": False,
    }


def _hsdp_mesh(layout: Layout) -> dict[str, Any]:
    """HSDP (dp_shard < dp): accelerate 1.15.0's `parallelism_config` with the 2-D mesh
    (dp / dp_shard replicas, dp_shard shards; launch.py `--parallelism_config_dp_replicate_size`
    / `_dp_shard_size`, copied from the config file as-is), which accelerate hands to
    `fully_shard(mesh=...)`. Nothing for the whole-group sharding."""
    if layout.dp_shard is None or layout.dp_shard == layout.dp:
        return {}
    return {"parallelism_config": {"parallelism_config_dp_replicate_size": layout.dp // layout.dp_shard,
                                   "parallelism_config_dp_shard_size": layout.dp_shard}}


def launch_hint(cluster: Cluster, layout: Layout, config_file: str = "<this file>",
                script: str = "train.py") -> str:
    """The `accelerate launch` line for the config (a comment line above the YAML)."""
    nnodes, _ = nodes_and_procs(cluster, layout)
    if nnodes == 1:
        return f"accelerate launch --config_file {config_file} {script}"
    return (f"on machine k of {nnodes}: accelerate launch --config_file {config_file} --machine_rank k "
            f"--main_process_ip <address of machine 0> {script}")
