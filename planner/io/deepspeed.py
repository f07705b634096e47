"""DeepSpeed JSON config <-> Layout: read a user's ds_config.json, write one for a layout.

Key names are DeepSpeed's own: deepspeed/runtime/zero/config.py (DeepSpeedZeroConfig, with the
`stage3_*` aliases), zero/offload_config.py (offload_param / offload_optimizer: device,
nvme_path, pin_memory), precision_config.py (bf16 / fp16 sections), runtime/config.py (batch
keys, `data_types.grad_accum_dtype`). Batch arithmetic follows runtime/config.py
`_set_batch_related_parameters` and `_batch_assertion`:
train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size,
where world_size is the data-parallel size. The Hugging Face Trainer writes "auto" for values
it fills from its TrainingArguments (transformers integrations/deepspeed.py); here they are
filled from the job's numbers on the command line, or the missing flag is named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.memory import model_states as ms
from planner.core.errors import PlanInputError, format_validation_error
from planner.io.engine import EngineJob
from planner.io.hf_config import read_json
from planner.core.spec import EngineBuffers, Layout, ModelSpec, TrainSetup, ceil_div

AUTO = "auto"
BATCH_KEYS = {  # DeepSpeed key -> the zplan flag that fills an "auto"
    "train_batch_size": "--global-batch",
    "train_micro_batch_size_per_gpu": "--micro-batch",
    "gradient_accumulation_steps": "--grad-accum",
}
DEFAULT_NVME_PATH = "/local_nvme"


def read_deepspeed_config(path: str | Path) -> dict[str, Any]:
    """The JSON object of a DeepSpeed config file (one-line error when malformed)."""
    return read_json(Path(path), "deepspeed")


# --------------------------------------------------------------------------- read


def resolve_batch(config: dict[str, Any], dp: int, cli: dict[str, int | None]) -> tuple[int, int, int]:
    """(train_batch, micro, grad_accum) as DeepSpeed resolves them for world_size = dp.

    "auto" takes the command-line value of the same quantity; a number in the file must agree
    with the command line when both are given. Then DeepSpeed's own inference runs
    (runtime/config.py `_set_batch_related_parameters`) and its assertion is checked.
    """
    values: dict[str, int | None] = {}
    autos = []
    for key, flag in BATCH_KEYS.items():
        raw, given = config.get(key), cli.get(key)
        if raw == AUTO:
            autos.append(f"{key} (give {flag})")
            raw = given
        elif raw is not None and (not isinstance(raw, int) or isinstance(raw, bool) or raw <= 0):
            raise PlanInputError(key, f"must be a positive integer or \"auto\", got {raw!r}")
        elif raw is not None and given is not None and raw != given:
            raise PlanInputError(key, f"the file says {raw} but {flag} says {given}")
        values[key] = raw if raw is not None else given
    train, micro, gas = (values[k] for k in BATCH_KEYS)
    if train is not None and micro is not None and gas is None:
        gas = train // micro // dp
    elif train is not None and gas is not None and micro is None:
        micro = train // dp // gas
    elif micro is not None and gas is not None and train is None:
        train = micro * gas * dp
    elif train is not None and micro is None and gas is None:
        gas, micro = 1, train // dp
    elif micro is not None and train is None and gas is None:
        gas, train = 1, micro * dp
    if train is None or micro is None or gas is None:  # DeepSpeed: "Either train_batch_size or
        missing = "; ".join(autos) or "neither key is in the file"  # ...micro... needs to be provided"
        raise PlanInputError(
            "train_batch_size",
            f"either train_batch_size or train_micro_batch_size_per_gpu is needed: {missing}",
        )
    if micro <= 0 or gas <= 0 or train != micro * gas * dp:
        raise PlanInputError(
            "train_batch_size",
            f"train_batch_size {train} != train_micro_batch_size_per_gpu {micro} x "
            f"gradient_accumulation_steps {gas} x data-parallel size {dp} (DeepSpeed _batch_assertion)",
        )
    return train, micro, gas


def precision_from_deepspeed(config: dict[str, Any], cli_precision: str | None) -> str:
    """The recipe name the bf16 / fp16 sections select; "auto" needs --precision.

    bf16 -> bf16-mixed (16 B/param), or megatron-bf16 (18) with data_types.grad_accum_dtype fp32;
    fp16 -> zero-fp16 (16); neither -> fp32. --precision may name another recipe of the same
    compute dtype (e.g. zero-infinity-fp16 for an fp16 config).
    """
    from planner.core.recipes import get_precision

    enabled = {}
    for section in ("bf16", "fp16"):
        value = config.get(section, {})
        if not isinstance(value, dict):
            raise PlanInputError(section, f"must be an object, got {value!r}")
        enabled[section] = value.get("enabled", False)
    if AUTO in enabled.values():
        if cli_precision is None:
            raise PlanInputError("bf16", "bf16/fp16 \"enabled\" is \"auto\": give --precision")
        return get_precision(cli_precision).name
    if enabled["bf16"] and enabled["fp16"]:
        raise PlanInputError("bf16", "bf16 and fp16 are both enabled; DeepSpeed allows one")
    grad_accum_dtype = (config.get("data_types") or {}).get("grad_accum_dtype")
    if enabled["bf16"]:
        dtype, name = "bf16", "megatron-bf16" if grad_accum_dtype == "fp32" else "bf16-mixed"
    elif enabled["fp16"]:
        dtype, name = "fp16", "zero-fp16"
    else:
        dtype, name = "fp32", "fp32"
    if cli_precision is not None:
        recipe = get_precision(cli_precision)
        if recipe.compute_dtype != dtype:
            raise PlanInputError(
                "--precision", f"{recipe.name} computes in {recipe.compute_dtype}, the file in {dtype}"
            )
        return recipe.name
    return name


def _offload_device(zero: dict[str, Any], key: str) -> str:
    """offload_optimizer / offload_param device: none, cpu or nvme."""
    section = zero.get(key) or {}
    if not isinstance(section, dict):
        raise PlanInputError(f"zero_optimization.{key}", f"must be an object, got {section!r}")
    device = section.get("device", "none")
    if device not in ("none", "cpu", "nvme"):
        raise PlanInputError(f"zero_optimization.{key}.device", f"{device!r}; allowed: none, cpu, nvme")
    return device


def _ulysses_degree(config: dict[str, Any]) -> int:
    """DeepSpeed-Ulysses' `sequence_parallel_size` (1 when absent): the sequence is split over
    that many ranks and the batch counts world / sequence_parallel_size data-parallel ranks
    (deepspeed/runtime/config.py at commit edaa7221: `self.world_size = dist.get_world_size() /
    config["sequence_parallel_size"]`); the layout's cp with cp_comm_type a2a."""
    value = config.get("sequence_parallel_size", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanInputError("sequence_parallel_size", f"must be a positive integer, got {value!r}")
    return value


def layout_from_deepspeed(
    config: dict[str, Any],
    *,
    num_gpus: int,
    tp: int = 1,
    pp: int = 1,
    global_batch: int | None = None,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    precision: str | None = None,
    hidden_size: int | None = None,
    **layout_extra: Any,
) -> EngineJob:
    """The layout a DeepSpeed config describes on num_gpus GPUs with tp x pp model parallelism.

    tp and pp are not DeepSpeed config keys (they live in the training script), so they come
    from the command line; dp = num_gpus / (tp x pp x cp), cp being DeepSpeed-Ulysses'
    `sequence_parallel_size` (cp_comm_type a2a). `layout_extra` passes the Layout fields
    the JSON cannot say (recompute mode, sequence_parallel, flash_attention, tempo).
    hidden_size (the model's) fills the bucket keys the HF Trainer writes as "auto".
    """
    cp = _ulysses_degree(config)
    if num_gpus % (tp * pp * cp):
        names, values = ("tp*pp*cp", f"{tp}*{pp}*{cp}") if cp > 1 else ("tp*pp", f"{tp}*{pp}")
        raise PlanInputError("--gpus", f"{num_gpus} GPUs are not divisible by {names} = {values}")
    dp = num_gpus // (tp * pp * cp)
    zero = config.get("zero_optimization", {})
    cli = {"train_batch_size": global_batch, "train_micro_batch_size_per_gpu": micro_batch,
           "gradient_accumulation_steps": grad_accum}
    train, micro, gas = resolve_batch(config, dp, cli)
    notes = []
    extra = {k: v for k, v in layout_extra.items() if v is not None}
    if "activation_checkpointing" in config and "recompute" not in extra:
        extra["recompute"] = "full"
        notes.append("activation_checkpointing section present: recompute=full assumed")
    zero_fields = _zero_fields(zero)
    if _autoep_size(config) is not None:
        extra.setdefault("ep", _autoep_size(config))
    buffers, buffer_notes = buffers_from_deepspeed(zero, zero_fields["zero_stage"], hidden_size)
    notes += buffer_notes
    try:
        if cp > 1:  # Ulysses: all-to-alls of heads (deepspeed/sequence/layer.py)
            extra |= {"cp": cp, "cp_comm_type": "a2a"}
        layout = Layout(tp=tp, pp=pp, dp=dp, micro_batch=micro, grad_accum=gas, buffers=buffers,
                        **zero_fields, **extra)
    except ValidationError as err:
        raise PlanInputError("deepspeed", format_validation_error(err)) from None
    return EngineJob(layout=layout, global_batch=train, precision=precision_from_deepspeed(config, precision),
                     notes=tuple(notes))


def _autoep_size(config: dict[str, Any]) -> int | None:
    """AutoEP's `expert_parallel.autoep_size` when enabled (DeepSpeed 0.19.8
    module_inject/auto_ep_config.py parse_autoep_config: enabled default false, autoep_size 1)."""
    section = config.get("expert_parallel", {})
    if not isinstance(section, dict):
        raise PlanInputError("expert_parallel", f"must be an object, got {section!r}")
    if not section.get("enabled", False):
        return None
    return section.get("autoep_size", 1)


def config_buffers(config: dict[str, Any], hidden_size: int | None) -> tuple[EngineBuffers, list[str]]:
    """A whole config's bucket sizes (`buffers_from_deepspeed` of its zero_optimization section,
    "auto" resolved at the section's ZeRO stage), and notes: what `zplan sweep --deepspeed` uses."""
    zero = config.get("zero_optimization", {})
    return buffers_from_deepspeed(zero, _zero_fields(zero)["zero_stage"], hidden_size)


REMOVED_MICS_KEYS = ("mics_shard_size", "mics_hierarchical_params_gather")
"""MiCS (DeepSpeed's hierarchical ZeRO-3, HSDP): deepspeed 0.19.8 rejects both keys
(runtime/config.py `_REMOVED_ZERO_CONFIG_KEYS`, `_reject_removed_config_keys`: "MiCS ZeRO-3
sharding has been removed", deepspeedai/DeepSpeed issue 8489), so a config carrying them does
not run; refused here rather than planned as plain ZeRO-3 (docs/collectives.md "MiCS")."""


def _zero_fields(zero: Any) -> dict[str, Any]:
    """zero_stage, offload_optimizer and offload_params from the zero_optimization section."""
    if not isinstance(zero, dict):
        raise PlanInputError("zero_optimization", f"must be an object, got {zero!r}")
    for key in REMOVED_MICS_KEYS:
        if key in zero:
            raise PlanInputError(f"zero_optimization.{key}", "MiCS was removed in deepspeed "
                                 "0.19.8, which rejects this key (runtime/config.py); remove it "
                                 "(ZeRO-3 over the whole dp group), or plan HSDP with "
                                 "--dp-engine fsdp2 --dp-shard N")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise PlanInputError("zero_optimization.stage", f"{stage!r}; allowed: 0, 1, 2, 3")
    offload_optimizer = _offload_device(zero, "offload_optimizer")
    if zero.get("cpu_offload") is True and offload_optimizer == "none":
        offload_optimizer = "cpu"  # deprecated spelling of offload_optimizer.device = cpu
    return {"zero_stage": stage, "offload_optimizer": offload_optimizer,
            "offload_params": _offload_device(zero, "offload_param")}


# DeepSpeed zero_optimization key -> spec.EngineBuffers field. DeepSpeedZeroConfig parses all five
# whatever the stage (zero/config.py; the stage3_ names are aliases of prefetch_bucket_size, ...).
BUFFER_KEYS = {
    "reduce_bucket_size": "reduce_bucket_elements",
    "allgather_bucket_size": "allgather_bucket_elements",
    "stage3_prefetch_bucket_size": "prefetch_bucket_elements",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
}


def hf_auto_buffers(hidden_size: int, zero_stage: int) -> dict[str, int]:
    """The bucket sizes the HF Trainer fills for "auto" (transformers integrations/deepspeed.py,
    HfTrainerDeepSpeedConfig.trainer_config_finalize): reduce_bucket_size = h x h at any stage;
    under ZeRO-3 also stage3_prefetch_bucket_size = int(0.9 x h x h) and
    stage3_param_persistence_threshold = 10 x h. Below ZeRO-3 those two stay unfilled."""
    filled = {"reduce_bucket_size": hidden_size * hidden_size}
    if zero_stage == 3:
        filled["stage3_prefetch_bucket_size"] = int(0.9 * hidden_size * hidden_size)
        filled["stage3_param_persistence_threshold"] = 10 * hidden_size
    return filled


def _buffer_value(key: str, raw: Any) -> int:
    """A bucket size as DeepSpeed's pydantic int field takes it: 5e8 (JSON float) -> 500000000,
    "500000000" (a digit string) too; "5e8" as a string is refused, as DeepSpeed refuses it."""
    if isinstance(raw, str) and raw.isdigit():
        raw = int(raw)
    whole = isinstance(raw, int) or (isinstance(raw, float) and raw.is_integer())
    if isinstance(raw, bool) or not whole or raw < 0 or (raw == 0 and key == "reduce_bucket_size"):
        allowed = "> 0" if key == "reduce_bucket_size" else ">= 0"
        raise PlanInputError(f"zero_optimization.{key}",
                             f"must be a whole number {allowed} (e.g. 5e8) or \"auto\", got {raw!r}")
    return int(raw)


def buffers_from_deepspeed(zero: dict[str, Any], zero_stage: int,
                           hidden_size: int | None) -> tuple[EngineBuffers, list[str]]:
    """The config's bucket sizes as EngineBuffers (absent keys: DeepSpeed's defaults), and notes.

    "auto" is resolved as the HF Trainer does (`hf_auto_buffers`, needs the model's hidden size);
    an "auto" the Trainer leaves unfilled below ZeRO-3 keeps the default (unused below stage 3).
    """
    values: dict[str, int] = {}
    notes: list[str] = []
    for key, field in BUFFER_KEYS.items():
        raw = zero.get(key)
        if raw is None:
            continue
        if raw == AUTO:
            if hidden_size is None:
                raise PlanInputError(f"zero_optimization.{key}", "\"auto\" needs the model's hidden size")
            filled = hf_auto_buffers(hidden_size, zero_stage)
            if key in filled:
                values[field] = filled[key]
                notes.append(f"{key} \"auto\" = {filled[key]} (HF Trainer rule, hidden size {hidden_size})")
            elif zero_stage == 3 or key not in ("stage3_prefetch_bucket_size",
                                                "stage3_param_persistence_threshold"):
                raise PlanInputError(f"zero_optimization.{key}",
                                     "the HF Trainer fills no \"auto\" here; give a number")
            continue
        values[field] = _buffer_value(key, raw)
    return EngineBuffers(**values), notes


# --------------------------------------------------------------------------- write


def _zero_buckets(layout: Layout) -> dict[str, int]:
    """The layout's bucket sizes (elements) under DeepSpeed's keys, so the written config allocates
    the buffers the plan counts; all five whatever the stage (DeepSpeed parses them all), so the
    file reads back to the same layout. sub_group_size is the default the plan assumes."""
    if layout.zero_stage == 0:
        return {}
    sizes = layout.buffers.model_dump()
    buckets = {key: sizes[field] for key, field in BUFFER_KEYS.items()}
    if layout.zero_stage == 3:
        buckets["sub_group_size"] = ms.DS_SUB_GROUP_ELEMENTS
    return buckets


def _offload_section(device: str, nvme_path: str) -> dict[str, Any]:
    """offload_optimizer / offload_param: device, pinned host buffers, nvme_path for NVMe."""
    section: dict[str, Any] = {"device": device, "pin_memory": True}
    if device == "nvme":
        section["nvme_path"] = nvme_path
    return section


def _precision_sections(precision_name: str) -> dict[str, Any]:
    """bf16 / fp16 sections (precision_config.py) for a recipe; unsupported recipes raise."""
    if precision_name == "bf16-mixed":
        return {"bf16": {"enabled": True}}
    if precision_name == "megatron-bf16":  # bf16 params, fp32 gradient accumulation
        return {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}
    if precision_name in ("zero-fp16", "zero-infinity-fp16"):
        return {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                         "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}}
    if precision_name == "fp32":
        return {}
    raise PlanInputError("precision", f"{precision_name} has no DeepSpeed equivalent")


def deepspeed_config(model: ModelSpec, layout: Layout, setup: TrainSetup,
                     nvme_path: str = DEFAULT_NVME_PATH) -> dict[str, Any]:
    """A ds_config.json for the layout: batch keys, precision, zero_optimization, checkpointing.

    train_batch_size = micro x grad_accum x dp (runtime/config.py _batch_assertion). tp and pp
    are not DeepSpeed keys: give them to the training script (and to `zplan check`).
    """
    if layout.recompute in ("selective", "every_k", "block"):
        raise PlanInputError(
            "recompute", f"{layout.recompute} has no DeepSpeed config key; use none or full (or --format megatron)"
        )
    if layout.tempo:
        raise PlanInputError("tempo", "Tempo techniques have no DeepSpeed config key")
    if layout.sequence_parallel and layout.tp > 1:
        raise PlanInputError("sequence_parallel", "Megatron sequence parallelism has no DeepSpeed "
                             "config key; use --no-sequence-parallel or --format megatron")
    if layout.virtual_stages > 1:
        raise PlanInputError("virtual_stages", f"{layout.virtual_stages}: interleaved virtual stages "
                             "have no DeepSpeed config key; use --virtual-stages 1 or --format megatron")
    config: dict[str, Any] = {
        "train_batch_size": layout.micro_batch * layout.grad_accum * layout.dp,
        "train_micro_batch_size_per_gpu": layout.micro_batch,
        "gradient_accumulation_steps": layout.grad_accum,
        **_precision_sections(setup.precision.name),
    }
    zero: dict[str, Any] = {"stage": layout.zero_stage}
    if layout.zero_stage:
        zero["overlap_comm"] = layout.zero_stage == 3  # DeepSpeed's default per stage
        zero["contiguous_gradients"] = True
        zero.update(_zero_buckets(layout))
    if layout.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload_section(layout.offload_optimizer, nvme_path)
    if layout.offload_params != "none":
        zero["offload_param"] = _offload_section(layout.offload_params, nvme_path)
    config["zero_optimization"] = zero
    if layout.ep > 1:  # AutoEP (runtime/config.py EXPERT_PARALLEL, module_inject/auto_ep_config.py)
        config["expert_parallel"] = {"enabled": True, "autoep_size": layout.ep}
    if layout.cp > 1:  # Ulysses (a2a); the engine table refuses the ring for DeepSpeed
        config["sequence_parallel_size"] = layout.cp
    if layout.recompute == "full":
        config["activation_checkpointing"] = {
            "partition_activations": False, "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
            "number_checkpoints": ceil_div(model.num_layers, layout.pp),  # one per layer
        }
    return config
