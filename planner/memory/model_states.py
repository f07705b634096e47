"""Model-state bytes per GPU under ZeRO stage 0-3 and offload, and the engines' temporary buffers.

Per-parameter bytes come from the precision recipe (EQUATIONS.md §2): param, grad, and
K = `recipes.optimizer_bytes_per_param` (fp32 master + fp32 grad copy + optimizer states).
ZeRO (seed 001 §2): stage 1 partitions the K part over the dp ranks, stage 2 also the gradients,
stage 3 also the parameters. Each rank holds ceil(num_params / dp) elements of a partitioned part
(DeepSpeed pads the flat buffer so every rank's partition has the same size).

Offload follows DeepSpeed's code (deepspeedai/DeepSpeed, deepspeed/runtime/zero/):
stage_1_and_2.py with `cpu_offload` keeps on the CPU the fp32 master partition, the fp32 gradient
partition (`single_partition_of_fp32_groups[i].grad`, not freed when offloading), the optimizer
states and a 16-bit parameter partition buffer (`param_buffer_of_bit16_for_cpu_offload_groups`);
with gradient accumulation > 1 also a 16-bit copy of the partition's gradients
(`accumulated_grads_in_cpu`, dtype param.dtype). stage3.py with `offload_optimizer` puts the
16-bit gradient partition (`grad_partitions_flat_buffer`) on the CPU and the fp32 gradient with
the fp32 master partition; NVMe (ZeRO-Infinity) swaps master, states and fp32 gradients to NVMe
through pinned CPU buffers (`offload_optimizer.buffer_count` = 4 of the largest sub-group,
`offload_param.buffer_count` x `buffer_size` = 5 x 1e8 elements, offload_config.py).
"""

from __future__ import annotations

import math
from fractions import Fraction

from planner.core.errors import PlanInputError
from planner.core.params import StageParams, largest_param_numel, layer_tensors_per_rank, norm_params
from planner.core.recipes import optimizer_bytes_per_param
from planner.core.spec import (
    EngineBuffers,
    Frozen,
    Layout,
    ModelSpec,
    Optimizer,
    PrecisionRecipe,
    ceil_div,
)

FP32_BYTES = 4

# The engines' bucket sizes and their defaults live in ONE place, spec.EngineBuffers (sources
# there; a layout carries them as layout.buffers).
DEFAULT_BUFFERS = EngineBuffers()
# deepspeed/runtime/zero/config.py (DeepSpeedZeroConfig), in elements
DS_SUB_GROUP_ELEMENTS = 1_000_000_000  # sub_group_size = 1e9
# deepspeed/runtime/zero/offload_config.py
DS_OPTIMIZER_SWAP_BUFFER_COUNT = 4  # DeepSpeedZeroOffloadOptimizerConfig.buffer_count
DS_PARAM_SWAP_BUFFER_COUNT = 5  # DeepSpeedZeroOffloadParamConfig.buffer_count
DS_PARAM_SWAP_BUFFER_ELEMENTS = 100_000_000  # DeepSpeedZeroOffloadParamConfig.buffer_size = 1e8
# swap buffers are rounded up to AIO_ALIGNED_BYTES (1024, runtime/swap_tensor/utils.py) x the aio
# intra_op_parallelism (default 1, swap_tensor/constants.py), counted in elements of their dtype
DS_AIO_ALIGNED_BYTES = 1024


class ModelStateBytes(Frozen):
    """Model states of ONE GPU, for that GPU's parameter shard (bytes, integers)."""

    params_bytes: int
    """Working (16-bit) parameters resident on the GPU."""
    grads_bytes: int
    """Gradients resident on the GPU."""
    optimizer_bytes: int
    """The K part (fp32 master, grad copy, states) resident on the GPU."""
    cpu_bytes: int
    """This GPU's share of host memory (sum of `cpu_parts`)."""
    nvme_bytes: int
    """This GPU's share of NVMe (sum of `nvme_parts`)."""
    gpu_total_bytes: int
    partition_numel: int
    """ceil(num_params / dp): the elements of one partitioned part on this rank."""
    cpu_parts: dict[str, int] = {}
    """Named host-memory parts (DeepSpeed buffers), bytes."""
    nvme_parts: dict[str, int] = {}
    """Named NVMe parts, bytes."""


def partition_numel(num_params: int, dp: int) -> int:
    """Elements of one rank's partition: ceil(num_params / dp), padded as DeepSpeed does."""
    return ceil_div(num_params, dp)


def optimizer_state_bytes(numel: int, precision: PrecisionRecipe, optimizer: Optimizer) -> int:
    """K x numel bytes, rounded up to whole bytes (8-bit Adam's absmax overhead is fractional)."""
    k = Fraction(optimizer_bytes_per_param(precision, optimizer))  # exact for binary floats
    return math.ceil(k * numel)


def check_offload(layout: Layout) -> None:
    """DeepSpeed swaps optimizer state to NVMe only in stage3.py (ZeRO-Infinity); stage_1_and_2.py
    has only `cpu_offload`, so nvme there would silently keep everything on the GPU."""
    if layout.offload_optimizer == "nvme" and layout.zero_stage != 3:
        raise PlanInputError(
            "offload_optimizer",
            f"nvme needs zero_stage=3 (got {layout.zero_stage}); DeepSpeed offloads optimizer "
            "states to NVMe only under ZeRO-3 (ZeRO-Infinity); use cpu for ZeRO-1/2",
        )


def aio_aligned_numel(numel: int, element_bytes: int) -> int:
    """numel rounded up to a whole number of 1024-byte aio blocks (`_io_aligned_numel`)."""
    alignment = DS_AIO_ALIGNED_BYTES // element_bytes
    return ceil_div(numel, alignment) * alignment


def optimizer_swap_buffer_bytes(part: int) -> int:
    """Pinned fp32 buffers of the NVMe optimizer swapper: buffer_count (4) x the largest
    sub-group (at most sub_group_size = 1e9 elements), aligned (stage3.py, optimizer_utils.py)."""
    largest = min(part, DS_SUB_GROUP_ELEMENTS)
    return DS_OPTIMIZER_SWAP_BUFFER_COUNT * aio_aligned_numel(largest, FP32_BYTES) * FP32_BYTES


def param_swap_buffer_bytes(param_bytes: int) -> int:
    """Pinned buffers of the NVMe parameter swapper: buffer_count (5) x aligned buffer_size (1e8)
    elements of the 16-bit dtype (partitioned_param_swapper.py `_configure_aio`)."""
    per_buffer = aio_aligned_numel(DS_PARAM_SWAP_BUFFER_ELEMENTS, param_bytes)
    return DS_PARAM_SWAP_BUFFER_COUNT * per_buffer * param_bytes


def _offload_optimizer_parts(part: int, precision: PrecisionRecipe, optimizer: Optimizer,
                             layout: Layout) -> tuple[dict[str, int], dict[str, int]]:
    """(cpu, nvme) parts when the optimizer step is offloaded, DeepSpeed ZeRO-Offload/Infinity."""
    moved = optimizer_state_bytes(part, precision, optimizer)  # the K part leaves the GPU
    # DeepSpeed always keeps an fp32 gradient partition with the master weights; count it when
    # the recipe's K does not already include one (zero-infinity-fp16 does).
    fp32_grad = max(0, FP32_BYTES - precision.optimizer_grad_copy_bytes) * part
    cpu: dict[str, int] = {}
    nvme: dict[str, int] = {}
    far = nvme if layout.offload_optimizer == "nvme" else cpu
    far["optimizer_states"] = moved
    if fp32_grad:
        far["fp32_grad_partition"] = fp32_grad
    if layout.zero_stage == 3:
        cpu["grad_partition_buffer"] = precision.grad_bytes * part  # grad_partitions_flat_buffer
        if layout.offload_optimizer == "nvme":  # pinned swap buffers of the largest sub-group
            cpu["optimizer_swap_buffers"] = optimizer_swap_buffer_bytes(part)
    else:
        cpu["param_partition_buffer"] = precision.param_bytes * part  # bit16 copy-back buffer
        if layout.grad_accum > 1:
            cpu["grad_accumulation_buffer"] = precision.param_bytes * part  # accumulated_grads_in_cpu
    return cpu, nvme


def model_state_bytes(num_params: int, precision: PrecisionRecipe, optimizer: Optimizer,
                      layout: Layout) -> ModelStateBytes:
    """Per-GPU model states under ZeRO over layout.dp ranks, with offload (seed 001 §2, 000 §3)."""
    if num_params < 0:
        raise PlanInputError("num_params", f"must be >= 0 (got {num_params})")
    check_offload(layout)
    stage, part = layout.zero_stage, partition_numel(num_params, layout.dp)
    params = precision.param_bytes * (part if stage == 3 else num_params)
    grads = precision.grad_bytes * (part if stage >= 2 else num_params)
    optimizer_gpu = optimizer_state_bytes(num_params if stage == 0 else part, precision, optimizer)
    cpu: dict[str, int] = {}
    nvme: dict[str, int] = {}
    if layout.offload_optimizer != "none":
        cpu, nvme = _offload_optimizer_parts(part, precision, optimizer, layout)
        optimizer_gpu = 0
        if stage >= 2:
            grads = 0  # reduced gradients go straight to the host partition
    if layout.offload_params != "none":  # ZeRO-3 only (Layout enforces it)
        far = nvme if layout.offload_params == "nvme" else cpu
        far["param_partition"] = params
        params = 0
        if layout.offload_params == "nvme":
            cpu["param_swap_buffers"] = param_swap_buffer_bytes(precision.param_bytes)
    return ModelStateBytes(
        params_bytes=params, grads_bytes=grads, optimizer_bytes=optimizer_gpu,
        cpu_bytes=sum(cpu.values()), nvme_bytes=sum(nvme.values()),
        gpu_total_bytes=params + grads + optimizer_gpu, partition_numel=part,
        cpu_parts=cpu, nvme_parts=nvme,
    )


# --------------------------------------------------------------------------- buffers


def zero3_persistent_numel(model: ModelSpec, tp: int, stage: StageParams, pp: int,
                           threshold: int = DEFAULT_BUFFERS.param_persistence_threshold) -> int:
    """Elements ZeRO-3 keeps whole on every GPU besides their partition: tensors of at most
    stage3_param_persistence_threshold elements (`param.ds_numel <= param_threshold`,
    parameter_offload.py mark_persistent_parameters; 1e5 by default: norms, most biases) of this
    stage's blocks, plus the embedding norm (first stage), final norm and pooler bias (last)."""
    small = sum(n for _, n in layer_tensors_per_rank(model, tp) if n <= threshold)
    norm = norm_params(model) if model.hidden_size <= threshold else 0  # weight (+ bias) of h each
    extra = norm if stage.stage == 0 and model.embedding_norm else 0
    last = stage.stage == pp - 1
    extra += norm if last and model.final_norm else 0
    extra += model.hidden_size if last and model.pooler and model.hidden_size <= threshold else 0
    return stage.num_layers * small + extra


def buffer_bytes(model: ModelSpec, layout: Layout, precision: PrecisionRecipe,
                 stage: StageParams) -> dict[str, int]:
    """Named temporary GPU buffers of the engines at `layout.buffers`, bytes; the values add up.

    zero 0: PyTorch DDP gradient bucket (ddp_bucket_bytes, bucket_cap_mb, at most the stage's
    gradients). zero 1/2/3: DeepSpeed's contiguous-gradient reduce bucket, allocated whole whatever
    the model size (stage_1_and_2.py setup_buckets: `torch.empty(int(self.reduce_bucket_size),
    dtype=self._gradient_reduction_buffer_dtype())`, the 16-bit dtype; stage 1/2 doubles it only
    with overlap_comm, which defaults off below stage 3, config.py overlap_comm_valid).
    allgather_bucket_size allocates nothing: the all-gather writes into the parameter buffer
    (runtime/utils.py all_gather_into_tensor_dp_groups). zero 3 also: gathered parameters
    (stage3_max_live_parameters, which includes the prefetch bucket, at least the largest tensor,
    capped by what the stage holds) and the persistent small tensors.
    """
    sizes = layout.buffers
    held = stage.total
    largest = largest_param_numel(model, layout.tp, stage.stage, layout.pp)
    pb = precision.param_bytes
    if layout.zero_stage == 0:
        return {"ddp_grad_bucket": min(sizes.ddp_bucket_bytes, held * precision.grad_bytes)}
    buffers = {"zero_reduce_bucket": sizes.reduce_bucket_elements * pb}  # allocated whole
    if layout.offload_optimizer != "none" and layout.zero_stage < 3:
        buffers["offload_grad_staging"] = largest * pb  # temp_grad_buffer_for_gpu_offload
    if layout.zero_stage == 3:
        live = max(sizes.max_live_parameters, sizes.prefetch_bucket_elements, largest)
        buffers["zero3_gathered_params"] = min(live, held) * pb
        persistent = zero3_persistent_numel(model, layout.tp, stage, layout.pp,
                                            sizes.param_persistence_threshold)
        buffers["zero3_persistent_params"] = persistent * pb
    return buffers


def buffer_components(model: ModelSpec, layout: Layout, precision: PrecisionRecipe,
                      stage: StageParams) -> dict[str, int]:
    """The bucket sizes behind `buffer_bytes` (`layout.buffers`), each alone in bytes of the
    16-bit dtype (NOT to be added up; uncapped config values, plus the stage's largest tensor)."""
    pb, sizes = precision.param_bytes, layout.buffers
    return {
        "reduce_bucket_size": sizes.reduce_bucket_elements * pb,
        "allgather_bucket_size": sizes.allgather_bucket_elements * pb,
        "stage3_prefetch_bucket_size": sizes.prefetch_bucket_elements * pb,
        "stage3_max_live_parameters": sizes.max_live_parameters * pb,
        "largest_param": largest_param_numel(model, layout.tp, stage.stage, layout.pp) * pb,
    }


# --------------------------------------------------------------------------- seed closed forms


def zero_dp_bytes(phi: float, nd: int, stage: int, k: float = 12) -> float:
    """ZeRO-DP model states per GPU, fp16 params and grads (seed 001 §2, ZeRO paper Fig. 1)."""
    if stage == 0:
        return (2 + 2 + k) * phi  # DDP: everything replicated
    if stage == 1:
        return 4 * phi + k * phi / nd  # P_os: optimizer states partitioned
    if stage == 2:
        return 2 * phi + (2 + k) * phi / nd  # P_os+g: gradients too
    if stage == 3:
        return (4 + k) * phi / nd  # P_os+g+p: parameters too
    raise PlanInputError("zero_stage", f"must be 0, 1, 2 or 3 (got {stage})")


def megatron_zero1_bytes(phi: float, p: int, nd: int) -> float:
    """Megatron with ZeRO-1 over nd and pipeline p: Φ·(6/p + 12/(p·nd)) (seed 004 §3.5.2):
    bf16 param 2 + fp32 main_grad 4 replicated, fp32 param/m/v 12 partitioned."""
    return phi * (6 / p + 12 / (p * nd))
