"""Sharded data parallelism: what the engines overlap, and what stays exposed (docs/collectives.md).

Two engines, two schedules, each from the engine's code:
- DeepSpeed ZeRO-3 (deepspeed 0.19.8, `runtime/zero/partitioned_param_coordinator.py`,
  `runtime/zero/stage3.py`): parameters are all-gathered per sub-module before use and released
  after it, in forward AND again in backward, on every micro-batch (the coordinator's trace is
  replayed each forward; nothing but persistent small parameters stays gathered). Prefetch
  fetches at most `min(max_live_parameters - available, prefetch_bucket_size)` elements ahead
  (`fetch_sub_module`). Gradients are reduce-scattered in backward on every micro-batch
  (`__add_grad_to_ipg_bucket` → `reduce_scatter_coalesced`; `micro_step_id` only decides
  accumulate vs overwrite of the partition), on the same network as the backward gathers.
- PyTorch FSDP2 (torch 2.13, `torch/distributed/fsdp/_fully_shard/`): one all-gather per
  `fully_shard` unit, prefetched one unit ahead in forward and backward; with
  `reshard_after_forward=False` the backward gathers disappear; gradients are reduce-scattered
  per unit in backward unless `set_requires_gradient_sync(False)` defers them to the last
  micro-batch; HSDP adds an all-reduce of the reduce-scattered shard across replicas.

The overlap model is a two-stream flow: the communication stream issues the per-layer
collectives back to back, layer i's compute starts when its gather and layer i-1's compute are
done. With per-layer comm a (the overlappable part f·a of it) and compute c over L layers:
    T = a + c + (L-1) · ((1-f)·a + max(c, f·a))
the first gather and, in backward, the last reduce-scatter are exposed. f = 1 is full
prefetch (T = a + c + (L-1)·max(a, c), exact for uniform layers); f = 0 no prefetch
(T = L·(a + c)). With interference k (an overlapped NCCL kernel holds k of the SMs,
planner/timing/interference.py) the overlapped term is max(c + k·f·a, f·a).
All functions accept scalars or numpy arrays.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from planner.timing import collectives


class DpCommTime(NamedTuple):
    """Data-parallel communication of one optimizer step (arrays broadcast)."""

    total_s: object
    """Sum of every DP collective's time in the step (what an unoverlapped engine would pay)."""
    exposed_s: object
    """The part not hidden behind compute: step_s - compute_s."""
    step_s: object
    """Compute + exposed communication of the forward/backward passes of the step."""


def pipelined_s(comm_per_layer_s, compute_per_layer_s, num_layers, overlap_fraction=1.0,
                interference=0.0):
    """Two-stream time of L layers: T = a + c + (L-1)·((1-f)·a + max(c + k·f·a, f·a)); k the
    compute slowdown while a collective runs (planner/timing/interference.py; 0 = none)."""
    a = np.asarray(comm_per_layer_s, dtype=float)
    c = np.asarray(compute_per_layer_s, dtype=float)
    f = np.clip(np.asarray(overlap_fraction, dtype=float), 0.0, 1.0)
    hidden = f * a
    overlapped = np.maximum(c + np.asarray(interference) * hidden, hidden)
    return a + c + (np.asarray(num_layers) - 1) * ((1 - f) * a + overlapped)


def deepspeed_prefetch_fraction(layer_elements, prefetch_bucket_elements, max_live_parameters):
    """Fraction of the next layer's gather DeepSpeed can issue ahead: the coordinator prefetches
    min(max_live_parameters - available, prefetch_bucket_size) elements, and the current layer's
    parameters are available (partitioned_param_coordinator.py `fetch_sub_module`)."""
    layer = np.asarray(layer_elements, dtype=float)
    room = np.maximum(np.asarray(max_live_parameters, dtype=float) - layer, 0.0)
    ahead = np.minimum(room, np.asarray(prefetch_bucket_elements, dtype=float))
    return np.clip(ahead / layer, 0.0, 1.0)


def zero3_step(gather_layer_s, reduce_scatter_layer_s, forward_layer_s, backward_layer_s,
               num_layers, micro_batches, prefetch_fraction, interference=0.0) -> DpCommTime:
    """DeepSpeed ZeRO-3, per step of m micro-batches (all per-layer times per micro-batch):
    forward: gathers pipelined with compute; backward: re-gather + reduce-scatter share the
    network, the last reduce-scatter is exposed; repeated on every micro-batch."""
    a, r = np.asarray(gather_layer_s, dtype=float), np.asarray(reduce_scatter_layer_s, dtype=float)
    m, n_layers = np.asarray(micro_batches), np.asarray(num_layers)
    fwd = pipelined_s(a, forward_layer_s, n_layers, prefetch_fraction, interference)
    bwd = pipelined_s(a + r, backward_layer_s, n_layers, prefetch_fraction, interference)
    compute = n_layers * (np.asarray(forward_layer_s) + np.asarray(backward_layer_s))
    step = m * (fwd + bwd)
    return DpCommTime(total_s=m * n_layers * (2 * a + r), exposed_s=step - m * compute, step_s=step)


def fsdp2_step(gather_layer_s, reduce_scatter_layer_s, forward_layer_s, backward_layer_s,
               num_layers, micro_batches, reshard_after_forward: bool = True,
               reduce_every_micro_batch: bool = True, replica_all_reduce_layer_s=0.0,
               interference=0.0, copy_s=0.0) -> DpCommTime:
    """PyTorch FSDP2: forward gathers prefetched one unit ahead (f = 1); backward re-gathers only
    with reshard_after_forward; reduce-scatter (plus the HSDP replica all-reduce) on every
    micro-batch, or only on the last one when gradient sync is deferred. `copy_s`: the step's
    copies on the compute stream (`fsdp2_copy_s`), exposed: added to the step.
    `reshard_after_forward`: one bool, or one per row (arrays broadcast)."""
    a = np.asarray(gather_layer_s, dtype=float)
    red = np.asarray(reduce_scatter_layer_s, dtype=float) + np.asarray(replica_all_reduce_layer_s, dtype=float)
    m, n_layers = np.asarray(micro_batches), np.asarray(num_layers)
    bwd_gather = np.where(np.asarray(reshard_after_forward, dtype=bool), a, 0.0 * a)
    k = interference
    fwd = pipelined_s(a, forward_layer_s, n_layers, 1.0, k)
    bwd_reduce = pipelined_s(bwd_gather + red, backward_layer_s, n_layers, 1.0, k)
    bwd_plain = pipelined_s(bwd_gather, backward_layer_s, n_layers, 1.0, k)
    reducing = m if reduce_every_micro_batch else np.ones_like(m)
    step = m * fwd + reducing * bwd_reduce + (m - reducing) * bwd_plain
    compute = n_layers * (np.asarray(forward_layer_s) + np.asarray(backward_layer_s))
    total = m * n_layers * (a + bwd_gather) + reducing * n_layers * red
    step = step + np.asarray(copy_s, dtype=float)
    return DpCommTime(total_s=total, exposed_s=step - m * compute, step_s=step)


class Fsdp2GroupCopyBytes(NamedTuple):
    """HBM bytes (read + written) of each copy FSDP2 makes for one `fully_shard` group, per
    occurrence (torch 2.13.0 `torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`), with S
    the group's padded shard elements per rank, n ranks, U its unsharded elements."""

    param_cast_bytes: object
    """`_get_param_all_gather_inputs`: the shards cast into the mixed-precision param dtype
    (S·(b_orig + b_param); 0 when they match). On the all-gather copy-in stream."""
    all_gather_copy_in_bytes: object
    """`all_gather_copy_in` (`_foreach_copy_` into the rank's slice): 2·S·b_param. On the
    all-gather copy-in stream (`foreach_all_gather`), not the compute stream."""
    all_gather_copy_out_bytes: object
    """`foreach_all_gather_copy_out` (`split_with_sizes_copy` of the n·S output into each padded
    unsharded parameter): 2·n·S·b_param. On the compute stream (`wait_for_unshard`)."""
    reduce_scatter_copy_in_bytes: object
    """`foreach_reduce_scatter_copy_in` (`chunk_cat` of the U unsharded gradients, b_grad each,
    into the padded n·S input in reduce dtype): U·b_grad + n·S·b_reduce. On the compute stream
    (before `reduce_scatter_stream.wait_stream(current_stream)`)."""
    grad_cast_bytes: object
    """`_to_dtype_if_needed` of the S-element output back to the parameters' dtype:
    S·(b_reduce + b_orig); 0 when they match. On the post-reduce stream."""


def padded_shard_elements(shape, world):
    """Elements of one rank's shard of a parameter of `shape` (`_fsdp_common._get_dim0_padded_size`:
    dim 0 padded to a multiple of the world size): ceil(dim0 / n) rows of the other dimensions.
    Integers stay integers; arrays broadcast."""
    rows = -(-shape[0] // world) if len(shape) else 1
    return rows * math.prod(shape[1:])


def fsdp2_group_copy_bytes(shapes, world, orig_bytes=4, param_bytes=None, reduce_bytes=None,
                           grad_bytes=None) -> Fsdp2GroupCopyBytes:
    """Exact copy bytes of one group of parameters of `shapes` on `world` ranks (element sizes:
    the parameters' own, the mixed-precision param and reduce dtypes (None: the parameters'),
    the unsharded gradients' (None: the param dtype, as torch computes them)). The one
    definition: the step model (`fsdp2_copy_bytes`) and the calibration harness
    (`planner.calibrate.fsdp2_overhead.group_copy_bytes`) both read it."""
    param_bytes = param_bytes or orig_bytes
    reduce_bytes = reduce_bytes or param_bytes
    grad_bytes = grad_bytes or param_bytes
    shard = sum(padded_shard_elements(s, world) for s in shapes)
    unsharded = sum(math.prod(s) for s in shapes)
    return Fsdp2GroupCopyBytes(
        param_cast_bytes=shard * (orig_bytes + param_bytes) if param_bytes != orig_bytes else 0,
        all_gather_copy_in_bytes=2 * shard * param_bytes,
        all_gather_copy_out_bytes=2 * world * shard * param_bytes,
        reduce_scatter_copy_in_bytes=unsharded * grad_bytes + world * shard * reduce_bytes,
        grad_cast_bytes=shard * (reduce_bytes + orig_bytes) if reduce_bytes != orig_bytes else 0)


class Fsdp2CopyBytes(NamedTuple):
    """HBM bytes FSDP2 copies on the COMPUTE stream per micro-batch for one unit (the step
    model's exposed copies; `Fsdp2GroupCopyBytes` for what each is)."""

    gather_copy_out_bytes: object
    """All-gather copy-out, once per gather: forward, and again in backward with
    reshard_after_forward."""
    reduce_copy_in_bytes: object
    """Reduce-scatter copy-in, on micro-batches that reduce."""


def fsdp2_copy_bytes(unit_params, param_bytes, grad_bytes, reduce_bytes,
                     reshard_after_forward=True, world=1) -> Fsdp2CopyBytes:
    """Per micro-batch compute-stream copy traffic of a unit of P parameters on `world` ranks,
    from `fsdp2_group_copy_bytes` (arrays broadcast). The copy-in and the casts run on FSDP2's
    other streams (overlapped, not counted here). Named approximation of the step model: the
    unit's parameters as one tensor of P elements (per-tensor shapes are not known per layout
    column); with world = 1 nothing is padded."""
    g = fsdp2_group_copy_bytes([(np.asarray(unit_params, dtype=float),)], world,
                               orig_bytes=param_bytes, reduce_bytes=reduce_bytes,
                               grad_bytes=grad_bytes)
    gathers = np.where(np.asarray(reshard_after_forward, dtype=bool), 2, 1)
    return Fsdp2CopyBytes(gather_copy_out_bytes=gathers * g.all_gather_copy_out_bytes,
                          reduce_copy_in_bytes=g.reduce_scatter_copy_in_bytes)


def fsdp2_copy_s(copy: Fsdp2CopyBytes, micro_batches, reducing_micro_batches, hbm_bytes_per_s):
    """Time of the FSDP2 copies of one step: exposed, they run on the compute stream (memory-bound
    at the profile's HBM bandwidth); copy-out on every micro-batch, reduce copy-in on those that
    reduce (all of them unless gradient sync is deferred)."""
    out = np.asarray(micro_batches) * copy.gather_copy_out_bytes
    red = np.asarray(reducing_micro_batches) * copy.reduce_copy_in_bytes
    return (out + red) / np.asarray(hbm_bytes_per_s, dtype=float)


class HsdpGroups(NamedTuple):
    """Where the two groups of an HSDP mesh (replicate, shard) sit: ranks per node and nodes."""

    shard_per_node: object
    """Ranks of one shard group on a node (its all-gather / reduce-scatter: NVLink part)."""
    shard_nodes: object
    """Nodes one shard group spans (1: the shard collectives stay inside the node)."""
    replicas_per_node: object
    """Ranks of one replica group (same shard index, different replicas) on a node."""
    replica_nodes: object
    """Nodes one replica group spans (its all-reduce crosses the network when > 1)."""


def hsdp_groups(dp, dp_shard, dp_per_node) -> HsdpGroups:
    """Placement of the 2-D mesh (dp / dp_shard, dp_shard), shard dim innermost: torch 2.13
    `init_device_mesh` lays ranks out row-major, so consecutive ranks form a shard group
    (`_fsdp_init.py`: a 2-D mesh is `HSDPMeshInfo(mesh, shard_mesh_dim=1,
    replicate_mesh_dim=0)`), and rank i's replica group is {i + k·dp_shard}; FSDP1
    HYBRID_SHARD builds the same groups with the node as shard group (`_init_utils.py`
    `_init_intra_and_inter_node_groups`: `new_subgroups(num_devices_per_node)`). `dp_per_node`: the
    data-parallel ranks one node holds (GPUs per node / tp). Arrays broadcast."""
    dp, shard = np.asarray(dp), np.asarray(dp_shard)
    per_node = np.asarray(dp_per_node)
    shard_local = np.minimum(shard, per_node)
    replicas = dp // shard
    replica_local = np.minimum(np.maximum(per_node // shard, 1), replicas)
    return HsdpGroups(shard_per_node=shard_local, shard_nodes=shard // shard_local,
                      replicas_per_node=replica_local, replica_nodes=replicas // replica_local)


def replica_all_reduce_bytes(layer_grad_bytes, dp_shard):
    """Bytes of one unit's HSDP all-reduce input: the reduce-scattered shard, 1/dp_shard of the
    unit's gradient bytes in the reduce dtype (torch 2.13 `_fsdp_collectives.py`
    `foreach_reduce`: `dist.all_reduce(reduce_output, group=all_reduce_group)` after the
    reduce-scatter over the shard group). Named approximation: the per-parameter dim-0
    padding (`padded_shard_elements`) left out."""
    return np.asarray(layer_grad_bytes, dtype=float) / np.asarray(dp_shard, dtype=float)


def replica_all_reduce_layer_s(layer_grad_bytes, dp_shard, groups: HsdpGroups, intra_bytes_per_s,
                               intra_latency_s, nic_bytes_per_s, inter_latency_s):
    """Time of one unit's HSDP replica all-reduce (`replica_all_reduce_bytes`) over its
    replica group, as NCCL runs an all-reduce (ring or tree, the faster:
    `collectives.nccl_all_reduce_s`): 2(R-1)/R of the shard's bytes per GPU, over the NIC
    share of each GPU when the replicas sit on different nodes. 0 with one replica. Issued
    per unit on FSDP2's all_reduce_stream right after that unit's reduce-scatter, on every
    micro-batch that reduces (`set_requires_gradient_sync(False)` skips both;
    `set_requires_all_reduce(False)` the all-reduce alone; `_fully_shard.py`)."""
    size = replica_all_reduce_bytes(layer_grad_bytes, dp_shard)
    return collectives.nccl_all_reduce_s(size, groups.replicas_per_node, groups.replica_nodes,
                                         intra_bytes_per_s, intra_latency_s, nic_bytes_per_s,
                                         inter_latency_s)
