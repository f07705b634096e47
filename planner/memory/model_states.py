"""Model-state bytes per GPU under ZeRO stage 0-3 and offload, and the engines' temporary buffers.

Per-parameter bytes come from the precision recipe (EQUATIONS.md §2): param, grad, and
K = `recipes.optimizer_bytes_per_param` (fp32 master + fp32 grad copy + optimizer states).
ZeRO (seed 001 §2): stage 1 partitions the K part over the dp ranks (dp x cp with context
parallelism, `shard_ranks`), stage 2 also the gradients,
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

import functools
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from planner.core import rules
from planner.core.columns import LayoutColumns, as_shape
from planner.core.errors import PlanInputError
from planner.core.columns import DP_ENGINES
from planner.core.params import (StageParams, block_kinds, largest_param_numel, layer_params_per_rank,
                                 layer_tensors_per_rank, norm_params)
from planner.memory import fsdp2
from planner.core.recipes import optimizer_bytes_per_param
from planner.memory.host import PAPER_MOVES_TO_NVME, check_accounting
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


def shard_ranks(cols: LayoutColumns):
    """Ranks the gradients are reduced over and ZeRO / the distributed optimizer shards over:
    dp x cp. Megatron-Core reduces gradients and shards its distributed optimizer over the
    data-and-context-parallel group (`param_and_grad_buffer.py`: `dp_cp_group =
    get_data_and_context_parallel_group(with_context_parallel=True)`, Megatron-LM commit
    d98e8a64); DeepSpeed partitions ZeRO over its sequence-data-parallel group under Ulysses
    (`runtime/engine.py`: `partition_group = self.seq_data_parallel_group`, commit edaa7221)."""
    return shard_degree(cols) * cols.get("cp", 1)


def shard_degree(cols: LayoutColumns):
    """Data-parallel ranks the sharded states are split over: dp, or the HSDP shard group
    `dp_shard` where given (0 / absent: the whole group). torch 2.13
    `torch/distributed/fsdp/_fully_shard/_fully_shard.py` (`fully_shard(mesh)`: a 2-D mesh
    shards over its last dim and replicates over its first) and FSDP1 `api.py`
    (HYBRID_SHARD: FULL_SHARD within the shard group, replicated across groups): each rank
    holds 1/dp_shard of the states."""
    dp = cols["dp"]
    if "dp_shard" not in cols:
        return dp
    given = np.asarray(cols["dp_shard"])
    return np.where(given > 0, given, dp)


def partition_numel(num_params, dp):
    """Elements of one rank's partition: ceil(num_params / dp), padded as DeepSpeed does
    (integers or integer arrays)."""
    return ceil_div(num_params, dp)


def _ceil_times(numel, k: Fraction):
    """ceil(k x numel), exact for integers and integer arrays (no float). An int64 array whose
    product with k's numerator could pass 2^63 (a user optimizer with a non-binary fractional
    overhead) is computed in Python ints and returned as float64 (exact below 2^53 bytes)."""
    if isinstance(numel, np.ndarray) and numel.dtype.kind in "iu" and numel.size \
            and int(numel.max()) * k.numerator >= 2**63:
        return (-((-numel.astype(object) * k.numerator) // k.denominator)).astype(np.float64)
    return -((-numel * k.numerator) // k.denominator)


def optimizer_state_bytes(numel, precision: PrecisionRecipe, optimizer: Optimizer):
    """K x numel bytes, rounded up to whole bytes (8-bit Adam's absmax overhead is fractional)."""
    return _ceil_times(numel, Fraction(optimizer_bytes_per_param(precision, optimizer)))


def check_offload(layout: Layout) -> None:
    """DeepSpeed swaps optimizer state to NVMe only in stage3.py (ZeRO-Infinity); stage_1_and_2.py
    has only `cpu_offload`, so nvme there would silently keep everything on the GPU. The rule of
    planner.core.rules, for one layout (it reads no model, cluster or setup)."""
    rules.check_rules(None, LayoutColumns.from_layout(layout),  # type: ignore[arg-type]
                      rules.named("offload_optimizer=nvme needs ZeRO-3"))


def aio_aligned_numel(numel, element_bytes: int):
    """numel rounded up to a whole number of 1024-byte aio blocks (`_io_aligned_numel`)."""
    alignment = DS_AIO_ALIGNED_BYTES // element_bytes
    return ceil_div(numel, alignment) * alignment


def optimizer_swap_buffer_bytes(part):
    """Pinned fp32 buffers of the NVMe optimizer swapper: buffer_count (4) x the largest
    sub-group (at most sub_group_size = 1e9 elements), aligned (stage3.py, optimizer_utils.py)."""
    largest = np.minimum(part, DS_SUB_GROUP_ELEMENTS)
    return DS_OPTIMIZER_SWAP_BUFFER_COUNT * aio_aligned_numel(largest, FP32_BYTES) * FP32_BYTES


def param_swap_buffer_bytes(param_bytes: int) -> int:
    """Pinned buffers of the NVMe parameter swapper: buffer_count (5) x aligned buffer_size (1e8)
    elements of the 16-bit dtype (partitioned_param_swapper.py `_configure_aio`)."""
    per_buffer = aio_aligned_numel(DS_PARAM_SWAP_BUFFER_ELEMENTS, param_bytes)
    return DS_PARAM_SWAP_BUFFER_COUNT * per_buffer * param_bytes


Parts = dict[str, tuple[np.ndarray, np.ndarray]]
"""Named parts over layout columns: name -> (applies: bool array, bytes: int array). A part
that does not apply to a row holds 0 bytes there. `parts_total` adds them up per row,
`parts_row` gives one row's applicable parts as plain ints (the named breakdown of fit)."""


def parts_total(parts: Parts, like: np.ndarray):
    """Sum of the parts per row (0 where none applies), in `like`'s dtype."""
    total = np.zeros_like(like)
    for applies, value in parts.values():
        total = total + np.where(applies, value, 0)
    return total


def parts_row(parts: Parts, i: int = 0) -> dict[str, int]:
    """The parts that apply to row i, as exact Python ints."""
    return {name: int(np.broadcast_to(value, applies.shape)[i])
            for name, (applies, value) in parts.items() if bool(applies[i])}


class StateParts(NamedTuple):
    """Model states of one GPU per row, by where they live."""

    gpu: Parts
    """`params`, `grads`, `optimizer` resident on the GPU."""
    cpu: Parts
    """This GPU's share of host memory (DeepSpeed's offload partitions and buffers)."""
    nvme: Parts
    """This GPU's share of NVMe."""
    partition_numel: np.ndarray
    """ceil(num_params / dp) per row."""


def state_parts(num_params, cols: LayoutColumns, precision: PrecisionRecipe,
                optimizer: Optimizer, accounting: str = "deepspeed") -> StateParts:
    """Per-GPU model states under ZeRO over dp ranks, with offload (seed 001 §2, 000 §3), for
    every row of `cols` (reads dp, zero_stage, offload_optimizer, offload_params, grad_accum).
    `num_params`: the GPU's parameters before ZeRO, one per row (or one for all).
    `accounting` (planner.memory.host.HOST_ACCOUNTINGS): `deepspeed` as the engine allocates;
    `zero-infinity-paper` moves host.PAPER_MOVES_TO_NVME to NVMe on rows offloading the
    optimizer to NVMe (the array form of host.apply_host_accounting)."""
    z, opt, par = cols["zero_stage"], cols["offload_optimizer"], cols["offload_params"]
    P = as_shape(num_params, z.shape)
    part = partition_numel(P, shard_ranks(cols))
    pb, gb = precision.param_bytes, precision.grad_bytes
    off, z3 = opt > 0, z == 3
    params = pb * np.where(z3, part, P)
    grads = np.where(off & (z >= 2), 0, gb * np.where(z >= 2, part, P))
    states = optimizer_state_bytes(part, precision, optimizer)
    # DeepSpeed always keeps an fp32 gradient partition with the master weights; counted when
    # the recipe's K does not already include one (zero-infinity-fp16 does).
    fp32_grad = max(0, FP32_BYTES - precision.optimizer_grad_copy_bytes) * part
    gpu: Parts = {
        "params": (par == 0, params),
        "grads": (z >= 0, grads),
        "optimizer": (~off, optimizer_state_bytes(np.where(z == 0, P, part), precision, optimizer)),
    }
    cpu: Parts = {
        "optimizer_states": (opt == 1, states),
        "fp32_grad_partition": ((opt == 1) & (fp32_grad > 0), fp32_grad),
        "grad_partition_buffer": (off & z3, gb * part),  # stage3 grad_partitions_flat_buffer
        "optimizer_swap_buffers": ((opt == 2) & z3, optimizer_swap_buffer_bytes(part)),
        "param_partition_buffer": (off & ~z3, pb * part),  # bit16 copy-back buffer
        "grad_accumulation_buffer": (off & ~z3 & (cols["grad_accum"] > 1), pb * part),
        "param_partition": (par == 1, params),
        "param_swap_buffers": (par == 2, np.full_like(part, param_swap_buffer_bytes(pb))),
    }
    nvme: Parts = {
        "optimizer_states": (opt == 2, states),
        "fp32_grad_partition": ((opt == 2) & (fp32_grad > 0), fp32_grad),
        "param_partition": (par == 2, params),
    }
    check_accounting(accounting)
    if accounting == "zero-infinity-paper":
        for name in PAPER_MOVES_TO_NVME:
            mask, values = cpu[name]
            cpu[name], nvme[name] = (mask & (opt != 2), values), (mask & (opt == 2), values)
    return StateParts(gpu, cpu, nvme, part)


def model_state_bytes(num_params: int, precision: PrecisionRecipe, optimizer: Optimizer,
                      layout: Layout, accounting: str = "deepspeed") -> ModelStateBytes:
    """`state_parts` of one layout (the length-1 evaluation, exact Python ints)."""
    if num_params < 0:
        raise PlanInputError("num_params", f"must be >= 0 (got {num_params})")
    check_offload(layout)
    cols = exact_columns(layout)
    parts = state_parts(np.array([num_params], dtype=object), cols, precision, optimizer, accounting)
    gpu, cpu, nvme = (parts_row(p) for p in parts[:3])
    params, grads, opt = (gpu.get(k, 0) for k in ("params", "grads", "optimizer"))
    return ModelStateBytes.computed(
        params_bytes=params, grads_bytes=grads, optimizer_bytes=opt,
        cpu_bytes=sum(cpu.values()), nvme_bytes=sum(nvme.values()),
        gpu_total_bytes=params + grads + opt, partition_numel=int(parts.partition_numel[0]),
        cpu_parts=cpu, nvme_parts=nvme,
    )


def exact_columns(layout: Layout) -> LayoutColumns:
    """One layout's columns as Python-int (object) arrays: its figures are exact integers at any
    size (the sweep's int64 / float64 columns are checked separately)."""
    cols = LayoutColumns.from_layout(layout)
    return LayoutColumns({k: v.astype(object) if v.dtype != bool else v for k, v in cols.items()})


# --------------------------------------------------------------------------- buffers


def zero3_persistent_numel(model: ModelSpec, tp: int, stage: StageParams, pp: int,
                           threshold: int = DEFAULT_BUFFERS.param_persistence_threshold) -> int:
    """Elements ZeRO-3 keeps whole on every GPU besides their partition: tensors of at most
    stage3_param_persistence_threshold elements (`param.ds_numel <= param_threshold`,
    parameter_offload.py mark_persistent_parameters; 1e5 by default: norms, most biases) of this
    stage's blocks, plus the embedding norm (first stage), final norm and pooler bias (last)."""
    return stage_persistent_numel(model, tp, stage.stage, stage.num_layers, pp, threshold)


def stage_persistent_numel(model: ModelSpec, tp: int, stage: int, num_layers: int, pp: int,
                           threshold: int = DEFAULT_BUFFERS.param_persistence_threshold) -> int:
    """`zero3_persistent_numel` of stage `stage` (0-based) holding `num_layers` blocks, from
    plain ints (the sweep's stage tables build no typed record)."""
    small = small_layer_numel(model, tp, threshold)
    norm = norm_params(model) if model.hidden_size <= threshold else 0  # weight (+ bias) of h each
    extra = norm if stage == 0 and model.embedding_norm else 0
    last = stage == pp - 1
    extra += norm if last and model.final_norm else 0
    extra += model.hidden_size if last and model.pooler and model.hidden_size <= threshold else 0
    return num_layers * small + extra


@functools.lru_cache(maxsize=1024)
def small_layer_numel(model: ModelSpec, tp: int, threshold: int) -> int:
    """Elements of a block's tensors of at most `threshold` elements on one tp rank (the block
    `layer_tensors_per_rank` gives: the MoE one for an MoE model)."""
    return sum(n for _, n in layer_tensors_per_rank(model, tp) if n <= threshold)


def buffer_parts(stage_numel, largest_numel, persistent_numel, cols: LayoutColumns,
                 precision: PrecisionRecipe, sizes: EngineBuffers, block_numel=None,
                 stage_layers=None) -> Parts:
    """Named temporary GPU buffers of the engines at bucket sizes `sizes`, bytes, for every row of
    `cols` (reads zero_stage, offload_optimizer); per row: the stage's parameters on this GPU,
    its largest tensor and its ZeRO-3 persistent elements (`zero3_persistent_numel`).

    zero 0: PyTorch DDP gradient bucket (ddp_bucket_bytes, bucket_cap_mb, at most the stage's
    gradients). zero 1/2/3: DeepSpeed's contiguous-gradient reduce bucket, allocated whole whatever
    the model size (stage_1_and_2.py setup_buckets: `torch.empty(int(self.reduce_bucket_size),
    dtype=self._gradient_reduction_buffer_dtype())`, the 16-bit dtype; stage 1/2 doubles it only
    with overlap_comm, which defaults off below stage 3, config.py overlap_comm_valid).
    allgather_bucket_size allocates nothing: the all-gather writes into the parameter buffer
    (runtime/utils.py all_gather_into_tensor_dp_groups). zero 3 also: gathered parameters
    (stage3_max_live_parameters, which includes the prefetch bucket, at least the largest tensor,
    capped by what the stage holds) and the persistent small tensors.

    dp_engine fsdp2 rows, when `block_numel` (one block's parameters on this GPU) and
    `stage_layers` are given: torch `fully_shard`'s buffers instead of DeepSpeed's
    (planner.memory.fsdp2.unsharded_parts: the root group's unsharded parameters, one block (or
    the next block's all-gather output and one block's fp32 reduce-scatter input, an upper bound
    for a bf16 reduction); parameters in the recipe's 16-bit dtype. ZeRO-2 (reshard_after_forward
    False) keeps every group unsharded from forward to backward: that is the 16-bit replica the
    ZeRO-2 states already count (`params`), so only the reduce-scatter input is added. The model
    states' 16 bytes per parameter of a 16-bit recipe split differently under FSDP2 (fp32 shard,
    fp32 gradient shard, Adam) but add up to the same total.
    """
    z, opt = cols["zero_stage"], cols["offload_optimizer"]
    pb = precision.param_bytes
    held = as_shape(stage_numel, z.shape)
    live = np.maximum(max(sizes.max_live_parameters, sizes.prefetch_bucket_elements), largest_numel)
    parts = {
        "ddp_grad_bucket": (z == 0, np.minimum(sizes.ddp_bucket_bytes, held * precision.grad_bytes)),
        "zero_reduce_bucket": (z > 0, np.full_like(held, sizes.reduce_bucket_elements * pb)),
        "offload_grad_staging": ((z > 0) & (z < 3) & (opt > 0), largest_numel * pb),
        "zero3_gathered_params": (z == 3, np.minimum(live, held) * pb),
        "zero3_persistent_params": (z == 3, persistent_numel * pb),
    }
    if block_numel is None or "dp_engine" not in cols:
        return parts
    fsdp = np.asarray(cols["dp_engine"] == DP_ENGINES.index("fsdp2"), dtype=bool)
    parts = {name: (np.asarray(mask, dtype=bool) & ~fsdp, value) for name, (mask, value) in parts.items()}
    root = np.maximum(held - stage_layers * block_numel, 0)
    fsdp_parts = fsdp2.unsharded_parts(root, block_numel, stage_layers, np.asarray(z == 3, dtype=bool),
                                       param_bytes=pb)
    resharded = fsdp & np.asarray(z == 3, dtype=bool)  # ZeRO-2: the replica is in the states
    return parts | {name: (fsdp if name == "fsdp2_reduce_scatter_input" else resharded, value)
                    for name, value in fsdp_parts.items()}


def buffer_bytes(model: ModelSpec, layout: Layout, precision: PrecisionRecipe,
                 stage: StageParams) -> dict[str, int]:
    """`buffer_parts` of one layout's stage at `layout.buffers` (exact ints); the values add up."""
    largest = largest_param_numel(model, layout.tp, stage.stage, layout.pp)
    persistent = zero3_persistent_numel(model, layout.tp, stage, layout.pp,
                                        layout.buffers.param_persistence_threshold)
    parts = buffer_parts(np.array([stage.total], dtype=object), largest, persistent,
                         exact_columns(layout), precision, layout.buffers,
                         block_numel=block_numel(model, layout.tp), stage_layers=stage.num_layers)
    return parts_row(parts)


def block_numel(model: ModelSpec, tp: int) -> int:
    """One block's parameters on one tp rank, the larger block kind (dense or MoE): an FSDP2
    group (`fully_shard` per transformer block)."""
    return max(layer_params_per_rank(model, tp, moe) for moe in block_kinds(model))


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
