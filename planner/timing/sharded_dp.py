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

from typing import NamedTuple

import numpy as np


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
    copies on the compute stream (`fsdp2_copy_s`), exposed: added to the step."""
    a = np.asarray(gather_layer_s, dtype=float)
    red = np.asarray(reduce_scatter_layer_s, dtype=float) + np.asarray(replica_all_reduce_layer_s, dtype=float)
    m, n_layers = np.asarray(micro_batches), np.asarray(num_layers)
    bwd_gather = a if reshard_after_forward else 0.0 * a
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


class Fsdp2CopyBytes(NamedTuple):
    """HBM bytes FSDP2 copies on the compute stream per micro-batch (torch 2.13
    `torch/distributed/fsdp/_fully_shard/`), each read + written once."""

    gather_copy_out_bytes: object
    """`foreach_all_gather_copy_out` (`split_with_sizes_copy`, called from
    `FSDPParamGroup.wait_for_unshard` on the current stream): the all-gather output is copied into
    each parameter's unsharded tensor; per gather read P·b_p + write P·b_p. Forward, and again
    in backward with reshard_after_forward."""
    reduce_copy_in_bytes: object
    """`foreach_reduce` → `foreach_reduce_scatter_copy_in` (`torch._chunk_cat`, before the
    switch to the reduce-scatter stream): the unsharded gradients (b_g bytes, the param dtype) are
    read and written into the reduce-scatter input in reduce_dtype (b_r bytes): P·(b_g + b_r).
    Only on micro-batches that reduce."""


def fsdp2_copy_bytes(unit_params, param_bytes, grad_bytes, reduce_bytes,
                     reshard_after_forward=True) -> Fsdp2CopyBytes:
    """Per micro-batch copy traffic of one `fully_shard` unit of P parameters (arrays broadcast).
    Named approximation: the all-gather copy-in (`all_gather_copy_in`, on its own stream, P/dp
    elements) and the post-reduce division / cast of the P/dp output shard are left out (a 1/dp
    fraction of the terms kept)."""
    p = np.asarray(unit_params, dtype=float)
    gathers = np.where(np.asarray(reshard_after_forward, dtype=bool), 2, 1)
    return Fsdp2CopyBytes(gather_copy_out_bytes=gathers * 2 * p * param_bytes,
                          reduce_copy_in_bytes=p * (grad_bytes + reduce_bytes))


def fsdp2_copy_s(copy: Fsdp2CopyBytes, micro_batches, reducing_micro_batches, hbm_bytes_per_s):
    """Time of the FSDP2 copies of one step: exposed, they run on the compute stream (memory-bound
    at the profile's HBM bandwidth); copy-out on every micro-batch, reduce copy-in on those that
    reduce (all of them unless gradient sync is deferred)."""
    out = np.asarray(micro_batches) * copy.gather_copy_out_bytes
    red = np.asarray(reducing_micro_batches) * copy.reduce_copy_in_bytes
    return (out + red) / np.asarray(hbm_bytes_per_s, dtype=float)
