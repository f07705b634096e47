"""Megatron-Core's communication overlaps: `--tp-comm-overlap`, `--overlap-grad-reduce`,
`--overlap-param-gather` (Layout.megatron_overlap; docs/collectives.md §Megatron overlaps).

Sources (read at these commits):
- Transformer Engine d0067d0da6cb01811b8072a7d304f0e00344ce2b,
  transformer_engine/pytorch/module/base.py `initialize_ub`: the default userbuffers method of
  each TP GEMM of a sequence-parallel block and its config (`get_default_config`):
    ring_exchange  qkv_fprop, fc1_fprop (all-gather of the input), proj_dgrad, fc2_dgrad
                   (all-gather of the output gradient): num_splits = tp, num_sm 1 on the copy
                   engine (use_ce), set_sm_margin False;
    pipeline       proj_fprop, fc2_fprop (GEMM then reduce-scatter): num_splits 4, num_sm 16,
                   set_sm_margin True;
    bulk           qkv_dgrad, fc1_dgrad (the all-gather of the saved norm output for the weight
                   gradient, beside the data-gradient GEMM), qkv_wgrad, fc1_wgrad (the
                   reduce-scatter of the data gradient, beside the weight-gradient GEMM): num_sm
                   16, set_sm_margin True.
  transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp
  `CommOverlapBase::split_overlap_rs`: the GEMM runs in num_splits chunks on `_math_sms`
  (the GPU's SMs minus num_sm), chunk i's reduce-scatter starts when chunk i+1's GEMM is
  launched, so the last chunk's reduce-scatter runs after the last GEMM chunk.
  `CommOverlapP2PBase::split_overlap_ag`: the GEMM in tp chunks, chunk 0 on the local shard,
  each next shard arriving by peer-to-peer copy while the current chunk computes.
- Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553: megatron/training/arguments.py
  (`--tp-comm-overlap` needs `--sequence-parallel`; `--overlap-param-gather` needs the
  distributed optimizer and `--overlap-grad-reduce`); megatron/core/distributed/
  distributed_data_parallel.py (bucket_size = max(40,000,000, 1,000,000 x dp) parameters when
  overlapping, one bucket otherwise; gradients reduced only in the last micro-batch's backward,
  `no_sync` on the others; with overlap_param_gather each bucket group's all-gather is
  dispatched by the forward pre-hook of the previous one, the first in the next step's first
  forward).
- Megatron-LM d98e8a64: the interleaved schedule (megatron/core/pipeline_parallel/schedules.py
  `forward_backward_pipelining_with_interleaving`) with the default `align_grad_reduce` /
  `align_param_gather` (megatron/training/training.py sets `config.grad_sync_func` /
  `config.param_sync_func` to each chunk's `start_grad_sync` / `start_param_sync`):
  `backward_step_helper_postprocess` launches a model chunk's whole gradient reduction right
  after that chunk's last micro-batch backward (grad sync is disabled, `no_sync`, during the
  backward itself, so the bucket hooks of `param_and_grad_buffer.register_grad_ready` do not
  fire), the launch delayed by the pipeline rank so all ranks launch together; the backward of
  the last group of pp micro-batches runs chunk v-1 first and chunk 0 last
  (`get_model_chunk_id(..., forward=False)`). `forward_step_helper_preprocess` launches chunk
  c+1's parameter all-gather when chunk c's first micro-batch starts (chunks 0 and 1 at the
  step's start); the forward runs chunk 0's pp micro-batches, then chunk 1's, ...

Named approximations: each of the block's four TP GEMMs at the block's mean matmul efficiency;
a GEMM on fewer SMs takes sm_count / (sm_count - num_sm) as long (no wave quantisation); the
data-gradient and weight-gradient GEMMs each take the forward GEMM's time; the parameter
all-gathers spread over the first micro-batch's forward, the gradient reduce-scatters over the
last micro-batch's backward (the engines' bucket order); with the interleaved schedule, the
rounds of pp chunk micro-batches at compute time only (pipeline waits inside the round not
counted) and the stage's collective split evenly over its v chunks.
"""

from __future__ import annotations

import numpy as np

from planner.core.errors import PlanInputError
from planner.core.spec import MegatronOverlap, megatron_overlap_requires
from planner.timing import interference

__all__ = ["MegatronOverlap", "FLAGS", "tp_layer_exposed_s", "dp_exposed_s",
           "interleaved_grad_exposed_s", "interleaved_param_exposed_s", "sweep_pins"]

FLAGS: dict[str, str] = {"tp_comm": "--tp-comm-overlap", "grad_reduce": "--overlap-grad-reduce",
                         "param_gather": "--overlap-param-gather"}
"""Each overlap's Megatron-LM flag (arguments.py spelling)."""

PIPELINE_SPLITS = 4
"""num_splits of the pipelined GEMM + reduce-scatter (TE base.py get_default_config)."""
COMM_SMS = 16
"""num_sm of the pipeline and bulk methods; ring_exchange uses 1 SM and the copy engine with
no SM margin (TE base.py get_default_config)."""
BUCKET_PARAMS_MIN = 40_000_000
BUCKET_PARAMS_PER_DP = 1_000_000
"""Megatron DDP bucket: max(40,000,000, 1,000,000 x dp) parameters (distributed_data_parallel.py)."""


def margin_factor(sm_count: int | None, comm_sms: int = COMM_SMS) -> float:
    """Extra GEMM time, as a fraction, on sm_count - comm_sms SMs: comm_sms / (sm_count -
    comm_sms); 0 when the profile has no sm_count. H100 SXM (132 SMs): 16/116 = 0.1379."""
    return comm_sms / (sm_count - comm_sms) if sm_count else 0.0


def ring_exchange_exposed_s(ag_s, gemm_s, tp):
    """All-gather + GEMM by ring exchange (num_splits = tp): tp - 1 shard transfers of
    ag_s / (tp - 1) each, overlapping the tp - 1 GEMM chunks of gemm_s / tp before the last;
    exposed = (tp - 1) * max(0, ag_s / (tp - 1) - gemm_s / tp). 0 at tp = 1."""
    steps = np.maximum(tp - 1, 1)
    return np.where(tp > 1, steps * np.maximum(0.0, ag_s / steps - gemm_s / tp), 0.0)


def pipeline_rs_exposed_s(rs_s, gemm_s, margin, splits: int = PIPELINE_SPLITS):
    """GEMM + reduce-scatter in `splits` chunks on the margin-reduced SMs (g = gemm_s x (1 +
    margin)): the GEMM's slowdown gemm_s x margin, chunk i's reduce-scatter behind chunk i+1's
    GEMM, the last one after: exposed = gemm_s x margin + (splits - 1) x max(0, (rs_s - g) /
    splits) + rs_s / splits."""
    slowed = gemm_s * (1 + margin)
    return (gemm_s * margin + (splits - 1) * np.maximum(0.0, (rs_s - slowed) / splits)
            + rs_s / splits)


def bulk_exposed_s(comm_s, gemm_s, margin):
    """One collective beside one GEMM on the margin-reduced SMs: gemm_s x margin + max(0,
    comm_s - gemm_s x (1 + margin))."""
    return gemm_s * margin + np.maximum(0.0, comm_s - gemm_s * (1 + margin))


def tp_layer_exposed_s(one_pass_s, gemm_s, tp, margin, full_recompute):
    """Exposed TP time of one block and one micro-batch with `--tp-comm-overlap`.

    one_pass_s: one all-gather (= reduce-scatter) of the block's b·s·h activation over tp;
    gemm_s: forward seconds of (qkv, proj, fc1, fc2), stacked on the first axis.
    Forward: ring AG·qkv, pipeline proj·RS, ring AG·fc1, pipeline fc2·RS; backward: ring AG·proj
    dgrad and AG·fc2 dgrad, bulk AG beside the qkv / fc1 dgrad GEMM and RS beside their wgrad
    GEMM; full recompute runs the forward twice. 0 when tp = 1 (no userbuffers)."""
    qkv, proj, fc1, fc2 = gemm_s
    c = one_pass_s
    fwd = (ring_exchange_exposed_s(c, qkv, tp) + ring_exchange_exposed_s(c, fc1, tp)
           + pipeline_rs_exposed_s(c, proj, margin) + pipeline_rs_exposed_s(c, fc2, margin))
    bwd = (ring_exchange_exposed_s(c, proj, tp) + ring_exchange_exposed_s(c, fc2, tp)
           + bulk_exposed_s(c, qkv, margin) + bulk_exposed_s(c, qkv, margin)
           + bulk_exposed_s(c, fc1, margin) + bulk_exposed_s(c, fc1, margin))
    total = fwd * np.where(full_recompute, 2, 1) + bwd
    return np.where(tp > 1, total, 0.0)


def block_gemm_flops(hidden, qkv_width, attn_width, ffn, swiglu: bool, tokens, tp):
    """Forward FLOPs of the block's four TP GEMMs per GPU (qkv, proj, fc1, fc2): 2·T·k·n / tp
    each, T tokens of the micro-batch; fc1 doubled for SwiGLU's gate."""
    per = 2.0 * tokens / tp
    return np.stack(np.broadcast_arrays(per * hidden * qkv_width, per * attn_width * hidden,
                                        per * hidden * ffn * (2 if swiglu else 1),
                                        per * ffn * hidden))


def bucket_params(dp):
    """Megatron's DDP bucket in parameters when overlapping: max(40e6, 1e6 x dp)."""
    return np.maximum(BUCKET_PARAMS_MIN, BUCKET_PARAMS_PER_DP * np.asarray(dp))


def interleaved_grad_exposed_s(grad_s, bwd_mb_s, pp, v, k=0.0):
    """Exposed gradient reduction of one step under the interleaved schedule (v > 1) with
    `--overlap-grad-reduce` (module docstring, schedules.py at d98e8a64).

    Chunk c's reduction (grad_s / v) is launched when its last backward ends, c rounds of pp
    chunk micro-batches (pp x bwd_mb_s / v each) before the step's last backward; the launches
    queue on one stream. Chunk c ends at max over j >= c of (launch_j + (j - c + 1)·grad_s / v);
    linear in j, so the whole exposure is that of grad_s behind a window of (v - 1)·pp·bwd_mb_s
    / v, at least chunk 0's grad_s / v (launched after the last backward: nothing left to hide
    it), with interference k on the overlapped rest (`interference.overlapped_exposed_s`)."""
    window = (v - 1) * pp * bwd_mb_s / v
    return interference.overlapped_exposed_s(grad_s, window, k, grad_s / v)


def interleaved_param_exposed_s(param_s, fwd_mb_s, pp, v, bucket_s, k=0.0):
    """Exposed parameter all-gather of one step under the interleaved schedule (v > 1) with
    `--overlap-param-gather`: chunks 0 and 1 launched at the step's start, chunk c + 1 when chunk
    c's first micro-batch starts; chunk c is needed at the start of its round, c·pp·fwd_mb_s / v,
    and hides all but its first bucket behind its own first micro-batch (fwd_mb_s / v). The
    queue's worst chunk is the first or the last (linear in c): chunk 0 behind one chunk
    micro-batch, or all v chunks behind ((v - 1)·pp + 1)·fwd_mb_s / v."""
    first = interference.overlapped_exposed_s(param_s / v, fwd_mb_s / v, k, bucket_s)
    whole = interference.overlapped_exposed_s(param_s, ((v - 1) * pp + 1) * fwd_mb_s / v, k,
                                              bucket_s)
    return np.maximum(first, whole)


def dp_exposed_s(zero_stage, grad_half_s, param_half_s, grad_bucket_s, param_bucket_s,
                 fwd_mb_s, bwd_mb_s, overlap: tuple[str, ...], k=0.0, pp=1, v=1):
    """(total, exposed) data-parallel seconds per step of Megatron's DDP (zero_stage 0:
    all-reduce = 2 passes) or distributed optimizer (1: reduce-scatter + all-gather).

    Gradients are reduced once per step (no_sync on all but the last micro-batch): without
    `grad_reduce` after backward, all exposed; with it, bucket by bucket in the last
    micro-batch's backward, the last bucket exposed (`interference.overlapped_exposed_s`, SM
    share k). The distributed optimizer's parameter all-gather: without `param_gather` after
    the optimizer step, exposed; with it, in the next step's first forward, the first bucket
    exposed. With the interleaved schedule (v > 1) each chunk's collective is launched by the
    schedule (`interleaved_grad_exposed_s`, `interleaved_param_exposed_s`)."""
    ddp, chunked = zero_stage == 0, np.asarray(v) > 1
    grad_s = np.where(ddp, 2 * grad_half_s, grad_half_s)
    grad_floor = np.where(ddp, 2 * grad_bucket_s, grad_bucket_s)
    grad_exposed = (np.where(chunked, interleaved_grad_exposed_s(grad_s, bwd_mb_s, pp, v, k),
                             interference.overlapped_exposed_s(grad_s, bwd_mb_s, k, grad_floor))
                    if "grad_reduce" in overlap else grad_s)
    param_s = np.where(ddp, 0.0, param_half_s)
    param_bucket = np.where(ddp, 0.0, param_bucket_s)
    param_exposed = (np.where(chunked, interleaved_param_exposed_s(param_s, fwd_mb_s, pp, v,
                                                                   param_bucket, k),
                              interference.overlapped_exposed_s(param_s, fwd_mb_s, k,
                                                                param_bucket))
                     if "param_gather" in overlap else param_s)
    return grad_s + param_s, grad_exposed + param_exposed


def sweep_pins(overlap: tuple[str, ...] | None, zero_stage: tuple[int, ...] | None,
               dp_engine: tuple[str, ...] | None, sequence_parallel: tuple[bool, ...] | None
               ) -> tuple:
    """(zero_stage, dp_engine, sequence_parallel) pins of a sweep whose candidates all carry
    `overlap`, narrowed to what Megatron runs it with (`spec.megatron_overlap_requires`, which
    the Layout rule reads too), on Megatron's DDP / distributed optimizer (dp_engine deepspeed).
    A user pin outside them is an input error."""
    if overlap is None:
        return zero_stage, dp_engine, sequence_parallel
    allowed, needs_sp = megatron_overlap_requires(overlap)
    zeros = tuple(z for z in (zero_stage or allowed) if z in allowed)
    engines = tuple(e for e in (dp_engine or ("deepspeed",)) if e == "deepspeed")
    if not zeros or not engines:
        raise PlanInputError("megatron_overlap", f"{','.join(overlap) or 'none'} runs on "
                             f"Megatron's DDP or distributed optimizer (--zero "
                             f"{'/'.join(map(str, allowed))}, --dp-engine deepspeed)")
    if needs_sp:
        if sequence_parallel == (False,):
            raise PlanInputError("megatron_overlap", "tp_comm needs --sequence-parallel")
        sequence_parallel = (True,)
    return zeros, engines, sequence_parallel
