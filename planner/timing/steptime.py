"""Step-time model: compute, communication, pipeline bubble and offload of one optimizer step.

Every term is a small pure function of plain numbers, so the same function serves the scalar
reference (`estimate_step`, one typed layout) and the vectorised sweep (numpy arrays over every
candidate layout at once, `planner.search.sweep`). Times are seconds, sizes bytes, bandwidths bytes/s.

Placement (Megatron-LM's rank order "tp-cp-ep-dp-pp", `parallel_state.py`): tp ranks are
adjacent, then cp, then dp, then pp. Context parallelism (planner/timing/context.py): every
token-wise term at s/cp tokens, gradients reduced over dp x cp ranks, the ring or all-to-all
attention traffic as `cp_comm_s`. So a tp group leaves the node only when tp > GPUs per node, a dp
group holds `min(dp, gpus_per_node // tp)` ranks per node, and pipeline neighbours sit on
different nodes as soon as the job spans more than one node (the slowest boundary sets the pace).
When every GPU of a node talks off-node at once, each gets `inter_node_bw / gpus_per_node`.

Matmuls: each block GEMM at its real shape under tp and micro-batch (`matmul_efficiency`,
planner/timing/gemm.py: the profile's in-training `achieved_efficiency` times the measured
GEMM table's shape factor, capped by the roofline), or the `--efficiency` override as one
constant. Element-wise kernels and the optimizer step run at HBM bandwidth, on top.
Data-parallel collectives: NCCL flat rings per network level (planner/timing/collectives.py);
ZeRO-3 re-gathers every layer in forward and backward on every micro-batch, overlapped as far as
DeepSpeed's prefetch limits allow (planner/timing/sharded_dp.py; docs/collectives.md).

Pipeline stages: the slowest stage sets the step; the output layer and loss sit on the last
stage only, as Megatron-Core places them (planner/timing/stage_placement.py,
`slowest_stage_work`). Named approximations: compute is spread evenly over tp and dp ranks; the
embedding lookup on the first stage is not counted; kernels at the
sheet HBM bandwidth (no achieved-bandwidth factor); element-wise backward traffic is taken as
twice the forward's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from planner.core import flops as flops_mod
from planner.core import params
from planner.core.columns import (RECOMPUTE_MODES, LayoutColumns, as_shape, group_index,
                                  on_distinct, piecewise, representatives, unique_ints)
from planner.core.errors import PlanInputError
from planner.timing import collectives, context, expert, gemm, interference, logits, sharded_dp
from planner.timing import megatron_overlap as mo
from planner.timing.host_overhead import host_overhead_s
from planner.timing import stage_placement as sp
from planner.timing import fp8 as fp8_timing
from planner.memory import experts
from planner.memory.context import local_seq_len
from planner.memory.fp8 import mfu_peak_dtype
from planner.memory.model_states import DEFAULT_BUFFERS, shard_ranks
from planner.core.recipes import optimizer_bytes_per_param
from planner.core.spec import GB, US, Cluster, EngineBuffers, Frozen, Layout, ModelSpec, TrainSetup


class StepEstimate(Frozen):
    """One optimizer step of one layout: every time component, then the derived rates."""

    compute_s: float
    """Forward + backward matmul time per GPU (model FLOPs / achieved FLOP/s)."""
    recompute_s: float
    """Extra forward FLOPs of activation recompute per GPU."""
    memory_bound_s: float
    """Element-wise kernels (norms, softmax, dropout, bias-GeLU, residual adds) at HBM bandwidth."""
    tp_comm_s: float
    """Tensor-parallel all-reduces (or all-gather + reduce-scatter), on the critical path."""
    cp_comm_s: float = 0.0
    """Context-parallel attention communication left exposed: ring KV sends slower than their
    step's attention, or the Ulysses all-to-alls (planner.timing.context); 0 when cp = 1."""
    pp_comm_s: float
    """Pipeline point-to-point sends of activations and their gradients."""
    bubble_s: float
    """Pipeline fill and drain idle time: (p-1)/(m*v) of the ideal time."""
    dp_comm_s: float
    """All data-parallel / ZeRO collectives of the step, hidden or not."""
    dp_comm_exposed_s: float
    """The part of `dp_comm_s` not overlapped with backward or forward compute."""
    offload_s: float
    """PCIe / NVMe traffic of offloaded states not hidden behind compute."""
    cpu_optimizer_s: float
    """Host-side Adam step when the optimizer is offloaded."""
    gpu_optimizer_s: float
    """The optimizer step on the GPU (its shard's states, gradients, parameters at HBM bandwidth)."""
    ep_comm_s: float = 0.0
    """Expert-parallel dispatch/combine all-to-alls of the slowest stage's MoE layers, on the
    critical path (planner.timing.expert); 0 without expert parallelism."""
    host_overhead_s: float = 0.0
    """Per-op dispatch and FSDP2's hooks at a calibrated node profile's `dispatch_per_op_us` /
    `fsdp2_hook_us` (planner.timing.host_overhead); 0 without those keys."""
    step_s: float
    """Sum of the exposed terms: compute + recompute + memory-bound + tp + pp + bubble + dp exposed
    + offload + cpu optimizer + gpu optimizer + ep all-to-all + host overhead."""
    tokens_per_s: float
    mfu: float
    """Model FLOPs utilisation: forward+backward FLOPs / (step time x GPUs x dense peak); FP8
    recipes: against the bf16 peak, as the field reports it (docs/fp8.md)."""
    hfu: float
    """Hardware FLOPs utilisation: includes recompute FLOPs."""
    days: float
    """Training days for setup.train_tokens at this step time."""
    gpu_hours: float
    compute_efficiency: float
    """Fraction of dense peak assumed for the matmuls (profile or calibrated value); FP8 recipes:
    of the bf16 peak, above 1 when the fp8 GEMMs make up for it (planner.timing.fp8)."""


# --------------------------------------------------------------------------- collectives


def ring_collective_s(size_bytes, ranks, bw_bytes_per_s, latency_s, passes):
    """alpha-beta ring collective (seed 004 §3.4.2): each pass moves (N-1)/N of the buffer
    in N-1 steps. passes=1: reduce-scatter or all-gather; passes=2: all-reduce (2(N-1)/N)."""
    steps = ranks - 1  # ring steps per pass
    return passes * (steps / ranks * size_bytes / bw_bytes_per_s + steps * latency_s)


# --------------------------------------------------------------------------- terms


def compute_time_s(flops_per_gpu, peak_flops_per_s, efficiency):
    """Matmul time: FLOPs / (dense peak x achieved fraction) (seed 004 §1, seed 000 §4)."""
    return flops_per_gpu / (peak_flops_per_s * efficiency)


def elementwise_layer_bytes(model: ModelSpec, seq_len, micro_batch, tp, sp, flash, elem_bytes):
    """HBM bytes one block's memory-bound kernels read + write in forward, per GPU, as
    (token-wise, attention-score) parts; each kernel reads its input and writes its output once.

    Megatron's GPT block with its fused kernels (Shoeybi et al. 2019 §3; the tensors are the ones
    Korthikanti et al. 2022 §4.1 counts): 2 LayerNorms (read + write h), 2 bias-dropout-adds
    (read 2h, write h + a 1-byte mask), the MLP activation (bias-GeLU reads and writes f; SwiGLU
    reads 2f, writes f), the fused scale-mask-softmax (read + write a·s per token) and the
    attention dropout (read + write + mask). Norms and residual adds are replicated over tp
    unless sequence parallel splits them; the MLP and the scores are split by tp. Flash
    attention keeps the scores on chip (Dao et al. 2022 §3.1).
    """
    tokens = np.multiply(seq_len, micro_batch, dtype=np.float64)  # no int64 wrap at 10M x 1M
    mask = 1 if model.dropout else 0  # dropout masks: 1 byte per element
    e = elem_bytes
    replicated = tokens * model.hidden_size * (2 * 2 * e + 2 * (3 * e + mask))  # 2 LN + 2 BDA
    width = (model.experts_per_token + model.num_shared_experts) * model.expert_ffn_size \
        if model.is_moe else model.ffn_hidden_size
    act = tokens * width * (3 * e if model.mlp == "swiglu" else 2 * e) / tp  # MLP activation
    token_bytes = replicated / np.where(sp, tp, 1) + act
    scores = micro_batch * model.num_heads / tp * seq_len * seq_len * (4 * e + mask)
    return token_bytes, np.where(flash, 0.0, scores)


def elementwise_step_bytes(token_bytes, score_bytes, recompute_code, forward_share=1.0):
    """Per layer and micro-batch over the step's passes: forward 1, backward 2 (reads the saved
    input and the output gradient, writes the input gradient: a named approximation), full
    recompute 1 more forward (block recompute: `forward_share` of one, its share of the blocks,
    `flops.forward_repeat_share`), selective recompute the attention scores once more
    (Korthikanti §5). recompute_code: 0 none, 1 selective, 2 full (RECOMPUTE_CODE)."""
    forward = token_bytes + score_bytes
    extra = np.where(recompute_code == 2, forward * forward_share,
                     np.where(recompute_code == 1, score_bytes, 0.0))
    return 3 * forward + extra


NONE, FULL, BLOCK = (RECOMPUTE_MODES.index(m) for m in ("none", "full", "block"))
RECOMPUTE_CODE = {"none": 0, "selective": 1, "full": 2, "every_k": 2, "block": 2}
"""Recompute modes as integers (the sweep's order: none, selective, full)."""


def tp_comm_time_s(layers, micro_batches, allreduces_per_layer, act_bytes, tp, bw, lat):
    """Megatron TP: 2 all-reduces of b*s*h per layer forward, 2 backward (Narayanan et al. 2021
    §3.3); sequence parallel swaps each for all-gather + reduce-scatter, the same ring volume
    and steps (Korthikanti et al. 2022 §4.2.2). `allreduces_per_layer` counts them."""
    one = ring_collective_s(act_bytes, tp, bw, lat, 2)
    return micro_batches * layers * allreduces_per_layer * one


def pp_comm_time_s(pp, micro_batches, virtual_stages, send_bytes, bw, lat, gather_s=0.0):
    """Pipeline p2p: per micro-batch each stage sends its output forward and receives the
    gradient back, once per model chunk (interleaving multiplies sends by v; Narayanan et al.
    2021 §2.2); nothing when pp = 1. With Megatron's scatter/gather optimisation (§4.1, on by
    default) each tp rank sends only its 1/tp slice (`send_bytes`) and the receiving tp group
    all-gathers the slices over NVLink (`gather_s`); with sequence parallel the slice is
    already the rank's own, no gather."""
    sends = 2 * micro_batches * virtual_stages  # forward activation + backward gradient
    return np.where(pp > 1, sends * (lat + send_bytes / bw + gather_s), 0.0)


def bubble_time_s(pp, micro_batches, virtual_stages, ideal_s, fill_stages=None):
    """1F1B bubble (p-1)/m of the ideal time, divided by v for the interleaved schedule
    (Narayanan et al. 2021 §2.2.1-2.2.2). The p-1 is the fill and drain through the other
    stages in units of the slowest stage's time; with uneven stages (`fill_stages`) it is
    (num_layers - largest stage's layers) / largest stage's layers (a stage's time taken
    proportional to its layers; embedding and logits not counted)."""
    fill = pp - 1 if fill_stages is None else fill_stages
    return fill / (micro_batches * virtual_stages) * ideal_s


def last_bucket_bytes(zero_stage, grad_bytes, reduce_bucket_elements=DEFAULT_BUFFERS.reduce_bucket_elements,
                      ddp_bucket_bytes=DEFAULT_BUFFERS.ddp_bucket_bytes):
    """The gradient bucket reduced after backward ends, whose time cannot hide: PyTorch DDP's
    bucket_cap_mb=25 for ZeRO-0 (Li et al. 2020 §3.2.3), DeepSpeed's reduce_bucket_size (5e8
    elements) for ZeRO >= 1; the defaults as `model_states` records them."""
    return np.where(zero_stage == 0, ddp_bucket_bytes, reduce_bucket_elements * grad_bytes)


def exposed_s(comm_s, window_s, floor_s=0.0, slowdown=0.0):
    """Communication hidden behind `window_s` of compute; at least `floor_s` stays exposed, and
    the overlapped rest slows compute by `slowdown` x its time (`interference.overlapped_exposed_s`)."""
    return interference.overlapped_exposed_s(comm_s, window_s, slowdown, floor_s)


def dp_comm_times_s(zero_stage, micro_batches, grad_half_s, param_half_s, bucket_half_s,
                    fwd_mb_s, bwd_mb_s, slowdown=0.0):
    """(total, exposed) data-parallel time per step for DDP and ZeRO-1/2 from one-pass (RS or
    AG) collective times (ZeRO-3: `zero3_comm`).

    Volumes (seed 001 §2, seed 002 Summary): DDP all-reduces gradients (2 passes, 2Φ);
    ZeRO-1/2 reduce-scatter gradients + all-gather updated parameters (2Φ).
    Overlap (Li et al. 2020 §3.2.3, bucketed reduction during backward): DDP/ZeRO-1 keep whole
    gradients, so they reduce once per step behind the last micro-batch's backward, except the
    last bucket; ZeRO-2 keeps only its gradient shard, so it reduce-scatters every micro-batch
    (seed 002 §ZeRO-2). The ZeRO-1/2 parameter all-gather after the optimizer step is exposed.
    """
    m, k = micro_batches, slowdown
    ddp_total = 2 * grad_half_s
    ddp_exposed = exposed_s(ddp_total, bwd_mb_s, 2 * bucket_half_s, k)
    z1_total = grad_half_s + param_half_s
    z1_exposed = exposed_s(grad_half_s, bwd_mb_s, bucket_half_s, k) + param_half_s
    z2_total = m * grad_half_s + param_half_s
    z2_exposed = m * exposed_s(grad_half_s, bwd_mb_s, bucket_half_s, k) + param_half_s
    ddp, z1 = zero_stage == 0, zero_stage == 1  # ZeRO-2 (and above) otherwise
    total = np.where(ddp, ddp_total, np.where(z1, z1_total, z2_total))
    exposed = np.where(ddp, ddp_exposed, np.where(z1, z1_exposed, z2_exposed))
    return total, exposed


def dp_collective_s(r: "Rates", collective, size_bytes, dp_local, dp):
    """One collective over the data-parallel group as NCCL runs it: a flat ring over `dp_local`
    GPUs per node on dp / dp_local nodes, the network part on the group's NIC shares
    (`collectives.flat_ring_s`, docs/collectives.md §2-3)."""
    return collectives.flat_ring_s(collective, size_bytes, dp_local, dp / dp_local, r.intra_bw,
                                   r.intra_lat, r.inter_bw_per_gpu, r.inter_lat)


def layer_collectives_s(r: "Rates", layers, stage_params, dp_local, dp, sizes: "ByteSizes"):
    """(all-gather of one layer's parameters, reduce-scatter of its gradients, DeepSpeed's
    prefetch fraction) over the data-parallel group: the per-layer collectives `zero3_comm` and
    `fsdp2_comm` schedule. Named approximation: the stage's parameters spread evenly over its
    layers (embedding included)."""
    layer_params = stage_params / layers
    gather = dp_collective_s(r, "all_gather", layer_params * sizes.param_bytes, dp_local, dp)
    reduce = dp_collective_s(r, "reduce_scatter", layer_params * sizes.grad_bytes, dp_local, dp)
    prefetch = sharded_dp.deepspeed_prefetch_fraction(
        layer_params, sizes.buffers.prefetch_bucket_elements, sizes.buffers.max_live_parameters)
    return gather, reduce, prefetch


def zero3_comm(r: "Rates", layers, stage_params, dp_local, dp, micro_batches, sizes: "ByteSizes",
               fwd_mb_s, bwd_mb_s, layer_comm=None):
    """DeepSpeed ZeRO-3 per step (`sharded_dp.zero3_step`): each layer's parameters
    all-gathered in forward and again in backward on every micro-batch, its gradients
    reduce-scattered in backward, overlapped as far as DeepSpeed's prefetch bucket and
    max-live limit allow (`deepspeed_prefetch_fraction`); the first gather and the last
    reduce-scatter exposed. `layer_comm`: `layer_collectives_s` when already evaluated."""
    if layer_comm is None:
        layer_comm = layer_collectives_s(r, layers, stage_params, dp_local, dp, sizes)
    gather, reduce, prefetch = layer_comm
    return sharded_dp.zero3_step(gather, reduce, fwd_mb_s / layers, bwd_mb_s / layers, layers,
                                 micro_batches, prefetch, r.interference)


def fsdp2_unit_copy_bytes(stage_params, sizes: "ByteSizes", reshard_after_forward):
    """FSDP2's compute-stream copies of a stage's unit (`sharded_dp.fsdp2_copy_bytes`):
    gradients in the parameter dtype, reduced in the recipe's gradient dtype."""
    return sharded_dp.fsdp2_copy_bytes(stage_params, sizes.param_bytes, sizes.param_bytes,
                                       sizes.grad_bytes, reshard_after_forward)


def fsdp2_comm(r: "Rates", layers, stage_params, dp_local, dp, micro_batches, sizes: "ByteSizes",
               fwd_mb_s, bwd_mb_s, reshard_after_forward, replica_layer_s=None,
               layer_comm=None, copy_bytes=None):
    """PyTorch FSDP2 per step (`sharded_dp.fsdp2_step`), one `fully_shard` unit per block:
    all-gathers prefetched one unit ahead in forward and, with reshard_after_forward (ZeRO-3
    rows), again in backward; gradients reduce-scattered per unit on every micro-batch (torch
    2.13 `_fully_shard`; docs/collectives.md §4). Same per-layer collectives as `zero3_comm`
    (over the shard group under HSDP), plus HSDP's replica all-reduce (`replica_layer_s`,
    `hsdp_replica_layer_s`) after each reduce-scatter.
    Plus FSDP2's copies on the compute stream (`fsdp2_unit_copy_bytes`; `copy_bytes` when
    already evaluated). `reshard_after_forward`: one bool or one per row."""
    if layer_comm is None:
        layer_comm = layer_collectives_s(r, layers, stage_params, dp_local, dp, sizes)
    gather, reduce, _ = layer_comm
    replica = {} if replica_layer_s is None else {"replica_all_reduce_layer_s": replica_layer_s}
    copies = (fsdp2_unit_copy_bytes(stage_params, sizes, reshard_after_forward)
              if copy_bytes is None else copy_bytes)
    return sharded_dp.fsdp2_step(gather, reduce, fwd_mb_s / layers, bwd_mb_s / layers, layers,
                                 micro_batches, reshard_after_forward=reshard_after_forward,
                                 interference=r.interference,
                                 copy_s=sharded_dp.fsdp2_copy_s(copies, micro_batches,
                                                                micro_batches, r.hbm_bw),
                                 **replica)


def hsdp_replica_layer_s(r: "Rates", shard, whole, tp, layers, stage_params, grad_bytes):
    """HSDP's replica all-reduce of one layer's reduce-scattered gradient shard
    (`sharded_dp.replica_all_reduce_layer_s` over `sharded_dp.hsdp_groups`): the states sharded
    over `shard` ranks (dp_shard x cp) of the `whole` group (dp x cp), tp ranks per replica.
    `state_terms` evaluates it with the data-parallel collectives, once per distinct key."""
    groups = sharded_dp.hsdp_groups(whole, shard, np.maximum(r.gpus_per_node // tp, 1))
    return sharded_dp.replica_all_reduce_layer_s(stage_params / layers * grad_bytes, shard, groups,
                                                 r.intra_bw, r.intra_lat, r.inter_bw_per_gpu,
                                                 r.inter_lat)


def optimizer_offload_s(offloaded, shard_params, grad_bytes, param_bytes, params_on_gpu,
                        pcie_bw, bwd_mb_s):
    """ZeRO-Offload PCIe traffic per step (Ren et al. 2021 §4): the gradient shard goes down
    behind the last backward, the updated fp16 shard comes back up (exposed; not needed when
    the parameters themselves live off the GPU)."""
    down_s = shard_params * grad_bytes / pcie_bw
    up_s = np.where(params_on_gpu, shard_params * param_bytes / pcie_bw, 0.0)
    return np.where(offloaded, exposed_s(down_s, bwd_mb_s) + up_s, 0.0)


def nvme_optimizer_s(on_nvme, shard_params, optimizer_bytes, gpus_per_node, read_bw, write_bw):
    """ZeRO-Infinity optimizer states on NVMe (seed 000 §5): the node's GPUs' shards of K bytes
    per parameter are read and written back every step over the node's aggregate NVMe
    bandwidth; taken as exposed (no overlap with the CPU step assumed)."""
    node_bytes = shard_params * optimizer_bytes * gpus_per_node
    return np.where(on_nvme, node_bytes / read_bw + node_bytes / write_bw, 0.0)


def param_offload_s(target, micro_batches, shard_params, param_bytes, gpus_per_node,
                    pcie_bw, nvme_read_bw, fwd_mb_s, bwd_mb_s):
    """ZeRO-Infinity parameter offload (seed 000 §5-6): each micro-batch fetches the GPU's
    parameter shard in forward and again in backward over PCIe (from NVMe first: the node's
    shards over its aggregate read bandwidth), prefetched behind that pass's compute.
    target: 0 none, 1 cpu, 2 nvme."""
    fetch_s = shard_params * param_bytes / pcie_bw
    fetch_s = fetch_s + np.where(target == 2, shard_params * param_bytes * gpus_per_node
                                 / nvme_read_bw, 0.0)
    per_mb = exposed_s(fetch_s, fwd_mb_s) + exposed_s(fetch_s, bwd_mb_s)
    return np.where(target > 0, micro_batches * per_mb, 0.0)


def cpu_adam_s(offloaded, shard_params, gpus_per_node, cpu_adam_params_per_s):
    """Host Adam step (ZeRO-Offload, Ren et al. 2021 §4.2): every GPU's shard of the node is
    updated by the node's CPUs at `cpu_adam_params_per_s`."""
    return np.where(offloaded, shard_params * gpus_per_node / cpu_adam_params_per_s, 0.0)


def gpu_optimizer_s(offloaded, shard_params, optimizer_bytes, grad_bytes, param_bytes, hbm_bw):
    """Fused optimizer step on the GPU (e.g. apex FusedAdam), memory-bound: per parameter it
    reads and writes the optimizer's K bytes (master copy + states), reads the gradient and
    writes the 16-bit parameter (Adam, megatron-fp16: 2 x 12 + 4 + 2 = 30 bytes); nothing when
    the optimizer runs on the CPU. Named approximation: a recipe without a master copy also
    reads its parameter, which is not counted."""
    step_bytes = shard_params * (2 * optimizer_bytes + grad_bytes + param_bytes)
    return np.where(offloaded, 0.0, step_bytes / hbm_bw)


# --------------------------------------------------------------------------- assembly


class Rates(Frozen):
    """The cluster's rates in SI, resolved once (shared by the scalar and vectorised paths)."""

    peak_flops_per_s: float
    efficiency: float
    hbm_bw: float
    gpus_per_node: int
    num_gpus: int
    intra_bw: float
    intra_lat: float
    inter_bw_per_gpu: float
    """The node's NIC bandwidth shared by its GPUs, all talking off-node at once."""
    inter_lat: float
    pcie_bw: float
    nvme_read_bw: float
    nvme_write_bw: float
    cpu_adam_params_per_s: float
    interference: float = 0.0
    """k: the SM share an overlapped NCCL collective takes from compute
    (`interference.sm_share_lost`; 0 when the GPU profile has no sm_count)."""
    dispatch_per_op_s: float = 0.0
    """Node `dispatch_per_op_us` (calibrated), 0 when absent (planner.timing.host_overhead)."""
    fsdp2_hook_s: float = 0.0
    """Node `fsdp2_hook_us` (calibrated), 0 when absent (planner.timing.host_overhead)."""


def cluster_rates(cluster: Cluster, setup: TrainSetup, efficiency: float | None = None) -> Rates:
    """Resolve bandwidths, latencies and the dense peak MFU is stated against: the recipe's
    compute dtype's, bf16's for an FP8 recipe (whose fp8 GEMMs run at the fp8 peak inside the
    matmul efficiency, planner.timing.fp8)."""
    dtype = setup.precision.compute_dtype
    for needed in dict.fromkeys((dtype, mfu_peak_dtype(dtype))):
        if needed not in cluster.gpu.peak_tflops:
            raise PlanInputError(
                "precision",
                f"gpu {cluster.gpu.name} has no peak_tflops for {needed} (recipe "
                f"{setup.precision.name}); it has {', '.join(sorted(cluster.gpu.peak_tflops))}",
            )
    if efficiency is not None and not 0 < efficiency <= 1:
        raise PlanInputError("efficiency", f"must be in (0, 1], got {efficiency}")
    node = cluster.node
    return Rates.computed(
        peak_flops_per_s=cluster.gpu.peak_flops_per_s(mfu_peak_dtype(dtype)),
        efficiency=efficiency if efficiency is not None else cluster.gpu.achieved_efficiency,
        hbm_bw=cluster.gpu.hbm_bytes_per_s,
        gpus_per_node=node.gpus_per_node,
        num_gpus=cluster.num_gpus,
        intra_bw=node.intra_node_bytes_per_s,
        intra_lat=node.intra_node_latency_us * US,
        inter_bw_per_gpu=cluster.inter_node_bytes_per_s / node.gpus_per_node,
        inter_lat=cluster.inter_node_latency_us * US,
        pcie_bw=node.pcie_bytes_per_s,
        # 0 means "no NVMe": never used, NVMe layouts are refused then (planner.core.rules)
        nvme_read_bw=node.nvme_read_gb_per_s * GB or math.inf,
        nvme_write_bw=node.nvme_write_gb_per_s * GB or math.inf,
        cpu_adam_params_per_s=node.cpu_adam_params_per_s,
        interference=interference.sm_share_lost(cluster.gpu.sm_count),
        dispatch_per_op_s=(node.dispatch_per_op_us or 0.0) * US,
        fsdp2_hook_s=(node.fsdp2_hook_us or 0.0) * US,
    )


TARGET_CODE = {"none": 0, "cpu": 1, "nvme": 2}
"""Offload targets as integers for the vectorised path."""


def model_parallel_comm_s(r: Rates, tp, pp, vs, m, layers, act_bytes, sp, tp_allreduces,
                          qkv_gather: tuple = (0.0, None), tp_overlap: tuple | None = None):
    """(TP, PP) communication per step. TP rides NVLink unless tp > GPUs per node (NIC share);
    pipeline neighbours share a node only in a one-node job. The pipeline send is one tp slice
    plus an all-gather over the tp link (scatter/gather, `pp_comm_time_s`). `qkv_gather`:
    (QKV output bytes, kv heads) for the QKV all-gather of tp wider than the kv heads
    (`collectives.qkv_gather_s`, one per pair of the layer's TP all-reduces), part of TP.
    `tp_overlap`: (forward GEMM seconds of qkv, proj, fc1, fc2, SM margin) under Megatron's
    `--tp-comm-overlap`: only the exposed part counts (`megatron_overlap.tp_layer_exposed_s`)."""
    tp_in = tp <= r.gpus_per_node  # cross-node tp uses the NIC share
    tp_bw = np.where(tp_in, r.intra_bw, r.inter_bw_per_gpu)
    tp_lat = np.where(tp_in, r.intra_lat, r.inter_lat)
    if tp_overlap is None:
        tp_comm = tp_comm_time_s(layers, m, tp_allreduces, act_bytes, tp, tp_bw, tp_lat)
    else:
        tp_comm = m * layers * mo.tp_layer_exposed_s(
            ring_collective_s(act_bytes, tp, tp_bw, tp_lat, 1), tp_overlap[0], tp, tp_overlap[1],
            np.asarray(tp_allreduces) == tp_allreduces_per_layer("full"))
    if qkv_gather[1] is not None:
        tp_comm = tp_comm + m * layers * collectives.qkv_gather_s(
            qkv_gather[0], tp, qkv_gather[1], np.asarray(tp_allreduces) / 2, tp_bw, tp_lat)
    pp_in = r.num_gpus <= r.gpus_per_node
    gather = np.where(sp, 0.0, ring_collective_s(act_bytes, tp, tp_bw, tp_lat, 1))
    pp_comm = pp_comm_time_s(pp, m, vs, act_bytes / tp,
                             np.where(pp_in, r.intra_bw, r.inter_bw_per_gpu),
                             np.where(pp_in, r.intra_lat, r.inter_lat), gather)
    return tp_comm, pp_comm


@dataclass(frozen=True)
class StageWork:
    """What the slowest pipeline stage's GPU does in one step, per layout row (arrays or scalars).

    Per GPU: `layers` of the largest stage, `stage_params` its parameters (one tp rank),
    `shard_params` the ZeRO shard of them; FLOPs per GPU per step; `act_bytes` = b·s·h·bytes;
    `elementwise_bytes` (all passes) and `elementwise_fwd_bytes` (the forward) per layer and
    micro-batch (`elementwise_layer_bytes`, `elementwise_step_bytes`); `tp_allreduces` per layer
    (`tp_allreduces_per_layer`)."""

    layers: object
    stage_params: object
    shard_params: object
    act_bytes: object
    tp_allreduces: object
    elementwise_bytes: object
    elementwise_fwd_bytes: object
    fwd_flops: object
    bwd_flops: object
    recompute_flops: object
    efficiency: object
    """Matmul efficiency of each row (`matmul_efficiency`)."""
    fill_stages: object
    """(num_layers - layers) / layers: the pipeline fill in slowest-stage units (pp - 1 when
    the stages are even; `bubble_time_s`)."""
    recompute_efficiency: object = None
    """Matmul efficiency of the recompute FLOPs when it differs from `efficiency` (FP8 recipes:
    planner.timing.fp8); None: `efficiency`."""
    ep_comm_s: object = 0.0
    """Expert-parallel all-to-all seconds per step (`expert.ep_comm_s`)."""
    cp_comm_s: object = 0.0
    """Exposed context-parallel communication of the step (`context.cp_comm_s`)."""
    stage_rows: object = None
    """Each row's index among the distinct (layers, stage_params) pairs, when the caller knows
    it (the sweep's (tp, pp) table rows); None: found by `state_terms`."""
    qkv_bytes: object = 0.0
    """One layer's fused QKV output, whole (s/cp·b·(a + 2kv)·head_dim·bytes): the array the
    tp ranks all-gather when tp is wider than the kv heads (`collectives.qkv_gather_s`)."""
    kv_heads: int | None = None
    """The model's kv heads (None: no QKV all-gather, e.g. MLA, whose heads tp divides)."""
    tp_overlap: tuple | None = None
    """Under Megatron's `--tp-comm-overlap`: (forward seconds of the qkv, proj, fc1, fc2 GEMMs
    of one layer and micro-batch, stacked; the SM margin factor) (`model_parallel_comm_s`)."""


@dataclass(frozen=True)
class ByteSizes:
    """Bytes per parameter of the recipe and the engines' bucket sizes (the same for every row)."""

    grad_bytes: int
    param_bytes: int
    optimizer_bytes: float
    """K: fp32 master + grad copy + optimizer states per parameter (recipes)."""
    buffers: EngineBuffers
    """The layout's bucket sizes (`Layout.buffers`; the sweep's `Constraints.buffers`)."""
    megatron_overlap: tuple[str, ...] | None = None
    """`Layout.megatron_overlap`: Megatron's DDP / distributed optimizer schedule when set."""


def compute_terms(r: Rates, cols: LayoutColumns, work: StageWork) -> dict:
    """Matmuls, recompute, memory-bound kernels, TP and PP communication and the bubble of each
    row, and the forward / backward time of one micro-batch (`fwd_mb_s`, `bwd_mb_s`, the
    windows that hide data-parallel and offload traffic). Reads tp, pp, virtual_stages,
    sequence_parallel and grad_accum (and, through `work`, recompute and micro_batch)."""
    m, layers = cols["grad_accum"], work.layers
    eff = work.efficiency
    compute = compute_time_s(work.fwd_flops + work.bwd_flops, r.peak_flops_per_s, eff)
    recompute = compute_time_s(work.recompute_flops, r.peak_flops_per_s,
                               eff if work.recompute_efficiency is None else work.recompute_efficiency)
    memory = m * layers * work.elementwise_bytes / r.hbm_bw  # memory-bound kernels, not overlapped
    memory_fwd = m * layers * work.elementwise_fwd_bytes / r.hbm_bw
    fwd_mb = (compute_time_s(work.fwd_flops, r.peak_flops_per_s, eff) + memory_fwd) / m
    bwd_mb = (compute + recompute + memory) / m - fwd_mb
    tp_comm, pp_comm = model_parallel_comm_s(r, cols["tp"], cols["pp"], cols["virtual_stages"], m,
                                             layers, work.act_bytes, cols["sequence_parallel"],
                                             work.tp_allreduces, (work.qkv_bytes, work.kv_heads),
                                             work.tp_overlap)
    bubble = bubble_time_s(cols["pp"], m, cols["virtual_stages"],
                           compute + recompute + memory + tp_comm + work.ep_comm_s
                           + work.cp_comm_s, work.fill_stages)
    return dict(compute_s=compute, recompute_s=recompute, memory_bound_s=memory,
                tp_comm_s=tp_comm, cp_comm_s=work.cp_comm_s, pp_comm_s=pp_comm, bubble_s=bubble,
                ep_comm_s=work.ep_comm_s,
                fwd_mb_s=fwd_mb, bwd_mb_s=bwd_mb)


def collective_times(r: Rates, layers, stage_params, dp_local, dp, bucket_bytes,
                     sizes: ByteSizes, rows) -> dict:
    """The data-parallel collective times of the rows `rows`, one call each: the gradient and
    parameter halves of `dp_comm_times_s` (one reduce-scatter / all-gather of the stage),
    the last bucket's, and the per-layer ones (`layer_collectives_s`). They depend on
    (layers, stage_params, dp_local, dp, the bucket) only: `state_terms` evaluates them once
    per distinct combination."""
    layers, stage_params, dp_local, dp, bucket_bytes = (
        x[rows] for x in (layers, stage_params, dp_local, dp, bucket_bytes))
    grad = stage_params * sizes.grad_bytes
    # one reduce-scatter (= all-gather time) over the dp group of each size: the gradients,
    # the parameters, the last bucket, as one stacked evaluation (elementwise: the same floats)
    grad_half, param_half, bucket_half = dp_collective_s(
        r, "reduce_scatter", np.stack([grad, stage_params * sizes.param_bytes,
                                       np.minimum(bucket_bytes, grad)]), dp_local, dp)
    gather, reduce, prefetch = layer_collectives_s(r, layers, stage_params, dp_local, dp, sizes)
    return dict(grad_half_s=grad_half, param_half_s=param_half, bucket_half_s=bucket_half,
                layer_gather_s=gather, layer_reduce_s=reduce, prefetch=prefetch)


def _stage_rows(layers, stage_params, stage_rows, shape) -> np.ndarray:
    """Each row's index among the distinct (layers, stage_params) pairs: `stage_rows` when the
    caller has it (the sweep's (tp, pp) table rows), else found here."""
    if stage_rows is not None:
        return as_shape(stage_rows, shape)
    layers, stage_params = (as_shape(x, shape) for x in (layers, stage_params))
    if layers.dtype.kind in "iu" and stage_params.dtype.kind in "iu":
        return group_index(layers, stage_params)[1]
    pairs = np.stack((layers, stage_params), axis=1)
    return np.unique(pairs, axis=0, return_inverse=True)[1].reshape(shape)


def state_terms(r: Rates, cols: LayoutColumns, layers, stage_params, shard_params,
                sizes: ByteSizes, fwd_mb_s, bwd_mb_s, stage_rows=None, activity=None) -> dict:
    """Data-parallel / ZeRO collectives, offload traffic and the optimizer step of each row,
    hidden behind the micro-batch windows of `compute_terms`; `layers`, `stage_params`,
    `shard_params`, `stage_rows` as in `StageWork`. Every DP collective is a flat NCCL ring on
    the group's real bandwidth per level (`dp_collective_s`); ZeRO-3 follows DeepSpeed's
    per-layer, per-micro-batch schedule (`zero3_comm`). `activity` as in `step_terms`: the
    collectives, which read no offload field, are then evaluated once per (group, ZeRO stage,
    HSDP shard group) on DeepSpeed / DDP rows (the offload variants share them) and on every
    FSDP2 row (no offload: each row of an enumeration is its own key; grouping them cost more
    than it saved)."""
    node, m = r.gpus_per_node, cols["grad_accum"]
    tp, dp, zero = cols["tp"], shard_ranks(cols), cols["zero_stage"]  # dp x cp ranks
    opt_target, param_target = cols["offload_optimizer"], cols["offload_params"]
    grad_b, param_b = sizes.grad_bytes, sizes.param_bytes
    dp_local = np.minimum(np.maximum(node // tp, 1), dp)  # dp ranks sharing a node
    megatron = sizes.megatron_overlap
    bucket = (last_bucket_bytes(zero, grad_b, sizes.buffers.reduce_bucket_elements,
                                sizes.buffers.ddp_bucket_bytes) if megatron is None
              else mo.bucket_params(dp) * grad_b)
    shape = zero.shape
    layers, stage_params, shard, dp_local, bucket, m, fwd_mb_s, bwd_mb_s = (
        as_shape(x, shape) for x in (layers, stage_params, shard_params, dp_local, bucket,
                                     m, fwd_mb_s, bwd_mb_s))
    hsdp = "dp_shard" in cols  # the HSDP replica all-reduce (FSDP2 rows) reads tp and the whole
    whole_ranks = cols["dp"] * cols.get("cp", 1)  # dp group too: with dp_shard they join the keys
    shard_rank = None  # the HSDP shard group by its rank, a narrow key (grouped evaluation)
    if activity is None:
        keys = (_stage_rows(layers, stage_params, stage_rows, shape), dp_local, dp, zero) + (
            (tp, whole_ranks) if hsdp else ())
    else:  # (stage, tp, cp, the whole dp group) is the same within an activity group: grouped
        one = activity[0]  # on its rows; the HSDP shard group (a state field) per row, which
        cp = cols["cp"][one] if "cp" in cols else np.ones_like(one)  # with cp and the whole
        whole = whole_ranks[one]  # group gives the ranks dp x cp the states shard over
        stage = _stage_rows(layers[one], stage_params[one],  # the group's stage (an index)
                            None if stage_rows is None else stage_rows[one], one.shape)
        stage_keys = group_index(stage, tp[one], cp,
                                 np.minimum(np.maximum(node // tp[one], 1), whole), whole)[1]
        unit_params = stage_params[one].take(representatives(stage, int(stage.max()) + 1))
        shard_rank = unique_ints(cols["dp_shard"])[1] if hsdp else None
        keys = (stage_keys.take(activity[1]) * 4 + zero,) + ((shard_rank,) if hsdp else ())
    pp_v = [as_shape(cols[c], shape) for c in ("pp", "virtual_stages")]  # interleaving

    def collectives_of(rows):  # the DP collectives, and HSDP's replica all-reduce per layer
        times = collective_times(r, layers, stage_params, dp_local, dp, bucket, sizes, rows)
        if hsdp:
            times["replica_layer_s"] = hsdp_replica_layer_s(
                r, dp[rows], whole_ranks[rows], tp[rows], layers[rows], stage_params[rows], grad_b)
        return times

    coll = on_distinct(collectives_of, *keys)
    layer_comm = (coll["layer_gather_s"], coll["layer_reduce_s"], coll["prefetch"])

    def ddp_zero12(rows):
        if megatron is not None:  # Megatron's bucket order (planner.timing.megatron_overlap)
            return mo.dp_exposed_s(zero[rows], coll["grad_half_s"][rows],
                                   coll["param_half_s"][rows], coll["bucket_half_s"][rows],
                                   # named approximation: the parameter bucket's time scaled
                                   # from the gradient bucket's by bytes (latency too)
                                   coll["bucket_half_s"][rows] * param_b / grad_b,
                                   fwd_mb_s[rows], bwd_mb_s[rows], megatron, r.interference,
                                   pp_v[0][rows], pp_v[1][rows])
        return dp_comm_times_s(zero[rows], m[rows], coll["grad_half_s"][rows],
                               coll["param_half_s"][rows], coll["bucket_half_s"][rows],
                               fwd_mb_s[rows], bwd_mb_s[rows], r.interference)

    def sharded(comm, rows, *extra, **named):  # zero3_comm / fsdp2_comm on the rows
        t = comm(r, layers[rows], stage_params[rows], dp_local[rows], dp[rows], m[rows], sizes,
                 fwd_mb_s[rows], bwd_mb_s[rows], *extra,
                 layer_comm=tuple(c[rows] for c in layer_comm), **named)
        return t.total_s, t.exposed_s

    engine = cols["dp_engine"] if "dp_engine" in cols else np.zeros_like(zero)
    fsdp, z3 = engine == 1, (zero == 3) & (engine != 1)

    def fsdp2(rows):  # ZeRO-3 rows reshard after forward, ZeRO-2 rows keep the gathered units;
        reshard = zero[rows] == 3  # grouped: the copies once per stage; HSDP's term (None: none)
        copies = None
        if activity is not None:  # a few stages for thousands of rows: looked up by index
            k = len(unit_params)  # per stage index, resharding first, then not
            unit = fsdp2_unit_copy_bytes(np.concatenate((unit_params, unit_params)), sizes,
                                         np.arange(2 * k) < k)
            at = stage.take(activity[1].take(rows)) + np.where(reshard, 0, k)
            copies = sharded_dp.Fsdp2CopyBytes(*(np.asarray(x).take(at) for x in unit))
        return sharded(fsdp2_comm, rows, reshard, coll["replica_layer_s"][rows] if hsdp else None,
                       copy_bytes=copies)

    def deepspeed_terms(rows):  # DDP, ZeRO-1/2 and DeepSpeed ZeRO-3 on the rows `rows`
        total, exposed = piecewise(rows.shape, 2, [
            (~z3[rows], lambda i: ddp_zero12(rows[i])),
            (z3[rows], lambda i: sharded(zero3_comm, rows[i]))])
        return {"total": total, "exposed": exposed}

    def deepspeed_grouped(rows):  # once per distinct (activity group, ZeRO stage, shard group):
        if activity is None:  # the offload variants of a row share their collectives
            out = deepspeed_terms(rows)
        else:
            out = on_distinct(lambda j: deepspeed_terms(rows[j]), activity[1][rows], zero[rows],
                              *((shard_rank[rows],) if hsdp else ()))
        return out["total"], out["exposed"]

    dp_total, dp_exposed = piecewise(shape, 2, [  # FSDP2 rows: no offload, each row distinct
        (~fsdp, deepspeed_grouped), (fsdp, fsdp2)])

    def offloading(rows):  # rows with the optimizer or the parameters off the GPU
        opt, par, sh, mb = opt_target[rows], param_target[rows], shard[rows], m[rows]
        return (optimizer_offload_s(opt > 0, sh, grad_b, param_b, par == 0, r.pcie_bw,
                                    bwd_mb_s[rows])
                + nvme_optimizer_s(opt == 2, sh, sizes.optimizer_bytes, node, r.nvme_read_bw,
                                   r.nvme_write_bw)
                + param_offload_s(par, mb, sh, param_b, node, r.pcie_bw, r.nvme_read_bw,
                                  fwd_mb_s[rows], bwd_mb_s[rows]),
                cpu_adam_s(opt > 0, sh, node, r.cpu_adam_params_per_s))

    offload, cpu = piecewise(shape, 2, [((opt_target > 0) | (param_target > 0), offloading)])
    gpu_opt = gpu_optimizer_s(opt_target > 0, shard, sizes.optimizer_bytes, grad_b, param_b,
                              r.hbm_bw)
    host = host_overhead_s(r.dispatch_per_op_s, r.fsdp2_hook_s, layers, m, fsdp)
    return dict(dp_comm_s=dp_total, dp_comm_exposed_s=dp_exposed, offload_s=offload,
                cpu_optimizer_s=cpu, gpu_optimizer_s=gpu_opt, host_overhead_s=host)


EXPOSED = ("compute_s", "recompute_s", "memory_bound_s", "tp_comm_s", "cp_comm_s", "pp_comm_s",
           "bubble_s", "dp_comm_exposed_s", "offload_s", "cpu_optimizer_s", "gpu_optimizer_s",
           "ep_comm_s", "host_overhead_s")
"""The terms whose sum is the step time (`StepEstimate.step_s`)."""


def step_terms(r: Rates, cols: LayoutColumns, work: StageWork, sizes: ByteSizes,
               group_terms: dict, activity: tuple[np.ndarray, np.ndarray] | None = None,
               group: np.ndarray | None = None) -> dict:
    """Every time term of one step, for each row of the layout columns: `group_terms` (the
    `compute_terms` of `work`'s rows), then `state_terms` in their windows, and `step_s` the
    sum of the exposed ones. `activity`: (rows, inverse) when `work` holds only the rows `rows`
    of `cols`, one per group of rows that differ only in the ZeRO / offload / engine fields
    (`step_columns`): the compute terms are gathered to every row, `state_terms` run on every
    row (the ZeRO shard of each row from `zero_shard_params`). `group`: each row's row of
    `work` when it is not `activity`'s inverse (`sweep.StepTimes.evaluate`: `work` then holds
    every group of the sweep, `cols` some of their rows)."""
    at = _rows_of_groups(activity, group)
    terms = {k: gather(v, at) for k, v in group_terms.items()}
    layers, stage_params, stage_rows = (gather(x, at)
                                        for x in (work.layers, work.stage_params, work.stage_rows))
    shard = work.shard_params if activity is None else zero_shard_params(
        stage_params, shard_ranks(cols), cols["zero_stage"])
    return _with_step(terms | state_terms(r, cols, layers, stage_params, shard, sizes,
                                          terms["fwd_mb_s"], terms["bwd_mb_s"], stage_rows,
                                          activity))


def _rows_of_groups(activity, group) -> tuple | None:
    """`gather`'s argument: each row's group row (`group`, else `activity`'s inverse)."""
    return None if activity is None else (None, activity[1] if group is None else group)


def _with_step(terms: dict) -> dict:
    step = terms[EXPOSED[0]]
    for name in EXPOSED[1:]:
        if np.ndim(terms[name]) or terms[name]:  # a scalar 0 (a term not modelled) adds nothing
            step = step + terms[name]
    return {k: v for k, v in terms.items() if k not in ("fwd_mb_s", "bwd_mb_s")} | {"step_s": step}


def rate_terms(r: Rates, step_s, tokens_per_step, model_flops, hardware_flops, train_tokens):
    """Throughput, utilisation and run length from the step time (MFU: PaLM, Chowdhery et al.
    2022 App. B; days: seed 004 §1 training time = total FLOPs / (GPUs x achieved FLOP/s))."""
    tokens_per_s = tokens_per_step / step_s
    peak_all = step_s * r.num_gpus * r.peak_flops_per_s
    seconds = train_tokens / tokens_per_s
    return dict(tokens_per_s=tokens_per_s, mfu=model_flops / peak_all,
                hfu=hardware_flops / peak_all, days=seconds / flops_mod.SECONDS_PER_DAY,
                gpu_hours=seconds / flops_mod.SECONDS_PER_HOUR * r.num_gpus)


def tp_allreduces_per_layer(recompute, forward_share=1.0):
    """2 forward + 2 backward (Narayanan et al. 2021 §3.3); full and every_k recompute repeat the
    forward's 2 (every_k re-runs each segment's whole forward, as `flops.recomputed_blocks`
    counts it), block recompute on its share of the blocks (`flops.forward_repeat_share`)."""
    if recompute == "block":
        return 4 + 2 * forward_share
    return 6 if recompute in ("full", "every_k") else 4


def stage_layers_and_params(model: ModelSpec, tp: int, pp: int, first: int | None = None,
                            last: int | None = None, ep: int = 1) -> tuple[int, int]:
    """Layers and per-GPU parameters of the largest pipeline stage (params.stage_param_counts;
    `first` / `last`: uneven stage sizes; routed experts divided by `ep`, memory.experts)."""
    counts = params.stage_param_counts(model, tp, pp, first=first, last=last)
    routed = experts.stage_routed_params(model, tp, pp, first, last)
    return (max(c[0] for c in counts),
            max(experts.params_per_gpu(sum(c[1:]), x, ep) for c, x in zip(counts, routed)))


def zero_shard_params(stage_params, dp, zero):
    """Parameters whose optimizer step this GPU owns: the stage shard / dp under ZeRO >= 1."""
    return np.where(zero > 0, stage_params / dp, stage_params)


def matmul_efficiency(model: ModelSpec, cluster: Cluster, setup: TrainSetup, level, micro_batch,
                      tp, flash_attention: bool, override: float | None = None, cp=1):
    """Efficiency of each row's matmuls: the `--efficiency` override as one constant, otherwise
    one block's forward and backward GEMMs each at its real shape under tp and micro-batch
    (`gemm.block_efficiency`; `level` = the profile's `achieved_efficiency`). Named
    approximations: the logits GEMM and MoE routing are not in the mix (an MoE block's expert
    GEMMs are taken at all T tokens of the micro-batch)."""
    if override is not None:
        return override
    tp, micro_batch, cp = np.broadcast_arrays(tp, micro_batch, cp)
    if tp.ndim != 1:
        return block_matmul_efficiency(model, cluster, setup, level, micro_batch, tp,
                                       flash_attention, cp)
    # it depends on (tp, micro_batch, cp) only: once per distinct triple, gathered to every row
    return on_distinct(lambda rows: {"eff": block_matmul_efficiency(
        model, cluster, setup, level, micro_batch[rows], tp[rows], flash_attention, cp[rows])},
        tp, micro_batch, cp)["eff"]


def block_matmul_efficiency(model: ModelSpec, cluster: Cluster, setup: TrainSetup, level,
                            micro_batch, tp, flash_attention: bool, cp=1):
    """`matmul_efficiency` without the override, on every element of (tp, micro_batch, cp)."""
    width = model.expert_ffn_size if model.is_moe else model.ffn_hidden_size
    fwd = gemm.forward_gemms(model.hidden_size, width, model.num_heads, model.kv_heads,
                             model.head_size, local_seq_len(setup.seq_len, cp), micro_batch, tp,
                             swiglu=model.mlp == "swiglu", flash_attention=flash_attention)
    dtype = setup.precision.compute_dtype
    return gemm.block_efficiency(cluster.gpu, dtype, level, fwd + gemm.backward_gemms(fwd),
                                 setup.precision.activation_bytes)


def slowest_stage_work(model: ModelSpec, setup: TrainSetup, r: Rates, cols: LayoutColumns,
                       layers, eff, job_flops: tuple, layer_bytes: tuple, loss_bytes: tuple
                       ) -> dict:
    """The StageWork fields of the stage that sets the pace (planner.timing.stage_placement):
    the head (logits GEMM of `flops.logits_flops` and any MTP modules, the loss kernels
    `loss_bytes` = (forward, all passes) per micro-batch) on the last stage only, the blocks'
    FLOPs (`job_flops` = whole-job forward, backward, recompute, head included) and per-layer
    element-wise bytes (`layer_bytes` = forward, all passes) on each stage's blocks. Element-wise
    bytes are returned per block of the largest stage (`compute_terms` multiplies by `layers`)."""
    fwd, bwd, rec = job_flops
    head_fwd = flops_mod.logits_flops(model, setup.global_batch, setup.seq_len) + \
        flops_mod.mtp_forward_flops(model, setup.global_batch, setup.seq_len)
    block = cols["pp"] / model.num_layers / r.num_gpus  # one block's share on one GPU
    head = cols["pp"] / r.num_gpus
    b_fwd, b_bwd, b_rec = (fwd - head_fwd) * block, (bwd - 2 * head_fwd) * block, rec * block
    h_fwd = head_fwd * head
    m, speed = cols["grad_accum"], r.peak_flops_per_s * eff
    lam = sp.head_layer_equivalents(3 * h_fwd / speed + m * loss_bytes[1] / r.hbm_bw,
                                    (b_fwd + b_bwd + b_rec) / speed + m * layer_bytes[1] / r.hbm_bw)
    first, last = (cols[k] if k in cols else 0 for k in ("first_stage_layers", "last_stage_layers"))
    blocks, on_last = sp.slowest_stage(layers, sp.last_stage_layers(model.num_layers, cols["pp"],
                                                                     first, last), lam)
    return dict(fwd_flops=b_fwd * blocks + h_fwd * on_last,
                bwd_flops=b_bwd * blocks + 2 * h_fwd * on_last, recompute_flops=b_rec * blocks,
                elementwise_fwd_bytes=(layer_bytes[0] * blocks + loss_bytes[0] * on_last) / layers,
                elementwise_bytes=(layer_bytes[1] * blocks + loss_bytes[1] * on_last) / layers,
                fill_stages=sp.fill_units(model.num_layers, lam, blocks, on_last))


@dataclass(frozen=True)
class GroupTimes:
    """The step-time work of one row per activity group (rows that differ only in the ZeRO /
    offload / engine fields): everything `compute_terms` and the rates read, none of which
    reads a state field. `step_columns` evaluates the state-dependent terms on top
    (`row_columns`); `step_bounds` gives each group's least possible step time."""

    rates: Rates
    work: StageWork
    terms: dict
    """`compute_terms` of each group row."""
    sizes: ByteSizes
    model_flops: object
    hardware_flops: object
    tokens_per_step: int
    train_tokens: float


def group_times(model: ModelSpec, cluster: Cluster, setup: TrainSetup, cols: LayoutColumns,
                layers, stage_params, *, flash_attention: bool = False,
                buffers: EngineBuffers = DEFAULT_BUFFERS, efficiency: float | None = None,
                stage_rows: np.ndarray | None = None,
                megatron_overlap: tuple[str, ...] | None = None) -> GroupTimes:
    """The `GroupTimes` of the rows `cols` (`step_columns` for the arguments). FLOPs come from
    planner.core.flops once per recompute mode present."""
    r = cluster_rates(cluster, setup, efficiency)
    rec = cols["recompute"]
    codes = np.flatnonzero(np.bincount(rec, minlength=len(RECOMPUTE_MODES)))
    table = {int(k): flops_mod.step_flops(model, setup, Layout.trusted(  # two literal fields:
        recompute=RECOMPUTE_MODES[int(k)], flash_attention=flash_attention))  # nothing to check
        for k in {*codes.tolist(), NONE, FULL} - {BLOCK}}  # block: from none and full
    share = flops_mod.forward_repeat_share(model.num_layers, cols)  # of each (group's) row

    def per_mode(name: str, rec_codes: np.ndarray, part: np.ndarray) -> np.ndarray:
        """FLOPs field of each row's mode; block: none + its share x (full - none)."""
        lookup = np.zeros(len(RECOMPUTE_MODES))
        for k, f in table.items():
            lookup[k] = getattr(f, name)
        return np.where(rec_codes == BLOCK, lookup[NONE] + part * (lookup[FULL] - lookup[NONE]),
                        lookup[rec_codes])

    allreduces = np.where(rec == BLOCK, tp_allreduces_per_layer("block", share), np.array(
        [tp_allreduces_per_layer(mode) for mode in RECOMPUTE_MODES])[rec])
    elementwise_code = np.array([RECOMPUTE_CODE[mode] for mode in RECOMPUTE_MODES])[rec]
    prec, b = setup.precision, cols["micro_batch"]
    cp = cols.get("cp", 1)
    tokens = local_seq_len(setup.seq_len, cp)  # s / cp tokens of each sequence per GPU
    token_b, score_b = elementwise_layer_bytes(model, tokens, b, cols["tp"],
                                               cols["sequence_parallel"], flash_attention,
                                               prec.activation_bytes)
    eff = matmul_efficiency(model, cluster, setup, r.efficiency, b, cols["tp"], flash_attention,
                            efficiency, cp)
    stage = slowest_stage_work(model, setup, r, cols, layers, eff, (
        per_mode("forward_flops", rec, share), per_mode("backward_flops", rec, share),
        per_mode("recompute_flops", rec, share)), (
        token_b + score_b, elementwise_step_bytes(token_b, score_b, elementwise_code, share)),
        logits.loss_kernel_bytes(b * tokens, model.vocab_size, cols["tp"],
                                 prec.activation_bytes))
    work = StageWork(
        layers=layers, stage_params=stage_params,
        shard_params=zero_shard_params(stage_params, shard_ranks(cols), cols["zero_stage"]),
        act_bytes=b * (tokens * float(model.hidden_size * prec.activation_bytes)),
        tp_allreduces=allreduces, **stage,
        efficiency=eff, stage_rows=stage_rows,
        qkv_bytes=b * (tokens * float(params.qkv_width(model) * prec.activation_bytes)),
        kv_heads=None if model.is_mla else model.kv_heads,
        ep_comm_s=expert.ep_comm_s(model, setup, cols, r),
        cp_comm_s=context.cp_comm_s(model, setup.seq_len, cols, layers, r.peak_flops_per_s, eff,
                                    prec.activation_bytes, r.gpus_per_node, r.intra_bw,
                                    r.intra_lat, r.inter_bw_per_gpu, r.inter_lat))
    if prec.fp8_scaling is not None:  # fp8 GEMMs at the fp8 peak, casts (planner.timing.fp8)
        work = fp8_timing.fp8_work(work, model, cluster, setup, cols, r.efficiency,
                                   flash_attention, efficiency, share)
    if megatron_overlap is not None and "tp_comm" in megatron_overlap:
        work = replace(work, tp_overlap=tp_overlap_gemms(model, cluster, cols, b * tokens,
                                                         r.peak_flops_per_s, work.efficiency))
    sizes = ByteSizes(grad_bytes=prec.grad_bytes, param_bytes=prec.param_bytes,
                      optimizer_bytes=optimizer_bytes_per_param(prec, setup.optimizer),
                      buffers=buffers, megatron_overlap=megatron_overlap)
    return GroupTimes(rates=r, work=work, terms=compute_terms(r, cols, work), sizes=sizes,
                      model_flops=per_mode("model_flops", rec, share),
                      hardware_flops=per_mode("hardware_flops", rec, share),
                      tokens_per_step=setup.global_batch * setup.seq_len,
                      train_tokens=setup.train_tokens)


def row_columns(g: GroupTimes, cols: LayoutColumns,
                activity: tuple[np.ndarray, np.ndarray] | None = None,
                group: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every step term and rate of each row of `cols`, float64 columns, from the `GroupTimes`
    of their groups. `activity`, `group`: as in `step_terms` (None: `g` is of `cols`' rows)."""
    terms = step_terms(g.rates, cols, g.work, g.sizes, g.terms, activity, group)
    at = _rows_of_groups(activity, group)
    rates = rate_terms(g.rates, terms["step_s"], g.tokens_per_step, gather(g.model_flops, at),
                       gather(g.hardware_flops, at), g.train_tokens)
    out = {**terms, **rates, "efficiency": gather(g.work.efficiency, at)}
    return {k: _float_column(v, (len(cols),)) for k, v in out.items()}


STATE_TERMS = ("dp_comm_s", "dp_comm_exposed_s", "offload_s", "cpu_optimizer_s",
               "gpu_optimizer_s", "host_overhead_s")
"""The terms `state_terms` gives: the ones that read the ZeRO / offload / engine fields."""
BOUND_MARGIN = 1e-6
"""Relative margin of `step_bounds` below the exact sum: the state terms are >= 0 by their
formulas, but ZeRO-3's and FSDP2's exposed part (step - compute, planner.timing.sharded_dp)
can round a few ulps below 0 where communication is negligible."""


def step_bounds(g: GroupTimes) -> dict[str, np.ndarray]:
    """For each group row of `g`: a step time no row of its group undercuts (the sum of the
    exposed terms with every state term, each >= 0, taken as 0; less `BOUND_MARGIN`) and the
    rates at that step time (`rate_terms`: each is monotonic in the step time, so it bounds
    the rate of every row of the group the same way). Rounding keeps the order: the sum of
    the same terms in the same order with some left out is never larger."""
    step = _with_step(g.terms | dict.fromkeys(STATE_TERMS, 0.0))["step_s"] * (1 - BOUND_MARGIN)
    return {"step_s": step} | rate_terms(g.rates, step, g.tokens_per_step, g.model_flops,
                                         g.hardware_flops, g.train_tokens)


def step_columns(model: ModelSpec, cluster: Cluster, setup: TrainSetup, cols: LayoutColumns,
                 layers, stage_params, *, flash_attention: bool = False,
                 buffers: EngineBuffers = DEFAULT_BUFFERS,
                 efficiency: float | None = None,
                 stage_rows: np.ndarray | None = None,
                 activity: tuple[np.ndarray, np.ndarray] | None = None,
                 megatron_overlap: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """Every step term and rate of each layout row, float64 columns: `estimate_step` is its
    length-1 evaluation, the sweep evaluates all candidates. `layers`, `stage_params`: the
    largest stage's layers and per-GPU parameters of each row (`stage_layers_and_params`);
    `stage_rows` optionally each row's index among the distinct (layers, stage_params) pairs
    (the sweep's (tp, pp) table rows; found by `state_terms` when None).
    `activity`: optionally (rows, inverse), one row of each group of rows that differ only in
    the ZeRO / offload / engine fields and each row's group (`columns.activity_groups`): the
    stage work and `compute_terms`, which read none of those fields, are evaluated on `rows`
    only (`group_times`) and gathered back (`row_columns`); the same values as on every row.
    `megatron_overlap`: `Layout.megatron_overlap`, one value for every row."""
    one, rows = cols, None if activity is None else activity[0]
    if rows is not None:  # the work of one row per group (layers / stage params: its own)
        one = cols.take(rows)
        layers, stage_params = (x if np.ndim(x) == 0 else np.asarray(x)[rows]
                                for x in (layers, stage_params))
        stage_rows = None if stage_rows is None else np.asarray(stage_rows)[rows]
    g = group_times(model, cluster, setup, one, layers, stage_params,
                    flash_attention=flash_attention, buffers=buffers, efficiency=efficiency,
                    stage_rows=stage_rows, megatron_overlap=megatron_overlap)
    return row_columns(g, cols, activity)


def gather(value, activity: tuple[np.ndarray, np.ndarray] | None):
    """A value over one row per group (`step_columns`' `activity`) given to every row of its
    group; scalars and `activity` None pass through."""
    if activity is None or np.ndim(value) == 0:
        return value
    return np.asarray(value).take(activity[1])


def tp_overlap_gemms(model: ModelSpec, cluster: Cluster, cols: LayoutColumns, tokens,
                     peak_flops_per_s, efficiency) -> tuple:
    """`StageWork.tp_overlap` of each row: the block's four TP GEMMs at the row's matmul
    efficiency (named approximation, planner.timing.megatron_overlap) and the GPU's SM margin.
    MoE blocks: fc1 / fc2 taken as one dense GEMM of the expert width over all tokens (named
    approximation; expert GEMMs are not userbuffers-overlapped in Megatron)."""
    width = model.expert_ffn_size if model.is_moe else model.ffn_hidden_size
    flops = mo.block_gemm_flops(model.hidden_size, params.qkv_width(model),
                                model.num_heads * model.head_size, width,
                                model.mlp == "swiglu", tokens, cols["tp"])
    return flops / (peak_flops_per_s * efficiency), mo.margin_factor(cluster.gpu.sm_count)


def _float_column(value, shape: tuple[int, ...]) -> np.ndarray:
    """A float64 column of `shape`: the array itself when it already is one (no copy)."""
    value = np.asarray(value, dtype=np.float64)
    return value if value.shape == shape else np.broadcast_to(value, shape).copy()


def estimate_step(model: ModelSpec, cluster: Cluster, layout: Layout, setup: TrainSetup,
                  efficiency: float | None = None) -> StepEstimate:
    """Step time of one layout: `step_columns` of its length-1 columns."""
    cluster_rates(cluster, setup, efficiency)  # input errors first
    if layout.num_gpus != cluster.num_gpus:
        raise PlanInputError("layout", f"tp*{'cp*' if layout.cp > 1 else ''}pp*dp = {layout.num_gpus} must equal the cluster's "
                                       f"GPUs {cluster.num_gpus}")
    layers, stage_params = stage_layers_and_params(model, layout.tp, layout.pp,
                                                   layout.first_stage_layers,
                                                   layout.last_stage_layers, layout.ep)
    cols = step_columns(model, cluster, setup, LayoutColumns.from_layout(layout),
                        np.array([layers]), np.array([stage_params]),
                        flash_attention=layout.flash_attention, buffers=layout.buffers,
                        efficiency=efficiency, megatron_overlap=layout.megatron_overlap)
    values = {k: float(v[0]) for k, v in cols.items() if k in StepEstimate.model_fields}
    return StepEstimate.computed(**values, compute_efficiency=float(cols["efficiency"][0]))
