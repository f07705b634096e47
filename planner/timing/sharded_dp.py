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
               interference=0.0) -> DpCommTime:
    """PyTorch FSDP2: forward gathers prefetched one unit ahead (f = 1); backward re-gathers only
    with reshard_after_forward; reduce-scatter (plus the HSDP replica all-reduce) on every
    micro-batch, or only on the last one when gradient sync is deferred."""
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
    return DpCommTime(total_s=total, exposed_s=step - m * compute, step_s=step)
