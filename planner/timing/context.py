"""Context parallelism in the step time: the causal balance and the attention's communication.

Sources (read at the commits named; docs/context_parallel.md says the same in words):
- Megatron-LM (commit d98e8a64): `--context-parallel-size` and `--cp-comm-type` (p2p default,
  a2a, allgather, a2a+p2p) in megatron/training/arguments.py; seq_length must be a multiple of
  2·cp; the rank order "tp-cp-ep-dp-pp" of megatron/core/parallel_state.py puts the cp ranks of
  a group tp ranks apart, so a cp group stays in a node while tp·cp <= GPUs per node.
- Transformer Engine (commit d0067d0d), transformer_engine/pytorch/attention/
  dot_product_attention/context_parallel.py, which Megatron's TEDotProductAttention calls:
  * the load balance: the sequence is cut into 2·cp chunks and rank r keeps chunks r and
    2·cp - 1 - r (`get_batch_on_this_cp_rank`);
  * ring attention (`AttnFuncWithCPAndKVP2P`): cp steps per attention; at step i the rank
    computes its queries against the KV chunk it received i steps ago while it sends that chunk
    on and receives the next (`flash_attn_p2p_communicate` on a second stream), so a step's
    send hides behind the step's attention and only the excess is exposed. Step 0 is the causal
    diagonal of the local chunks, later steps either the whole local query against the first
    KV half ("lower-triangle") or the second query half against all the KV ("upper-triangle"):
    every step is half of a full (s/cp)² block. The backward sends KV and dKV each step;
  * all-to-all (`AttnFuncWithCPAndQKVOA2A`): q, k, v are exchanged from s/cp tokens x a/t heads
    to s tokens x a/(t·cp) heads before the attention and the output back after it, and the
    gradients likewise in backward: 4 all-to-alls each way, not overlapped.
- DeepSpeed Ulysses (commit edaa7221) deepspeed/sequence/layer.py `DistributedAttention`: the
  same four all-to-alls (query, key, value, context) per attention, each in its own
  `_SeqAllToAll`.

Named approximations: the attention core runs at the block's matmul efficiency; a flash backward
is twice the forward's FLOPs (planner.core.flops' convention); every GPU of a node talks off-node
at once when the cp ring crosses nodes (each gets its NIC share, as the other collectives).
"""

from __future__ import annotations

import numpy as np

from planner.core.flops import attention_core_flops
from planner.core.spec import ModelSpec
from planner.memory.context import head_widths, kv_chunk_bytes, local_seq_len
from planner.timing import collectives

A2A_CODE = 1
"""`cp_comm_type` a2a as its column code (planner.core.columns.CP_COMM_TYPES)."""


def chunk_owner(cp: int, reorder: bool = True) -> list[int]:
    """The cp rank holding each of the 2·cp sequence chunks: with Megatron/TE's reordering rank r
    holds chunks r and 2·cp - 1 - r; without it, rank r holds chunks 2r and 2r + 1."""
    if not reorder:
        return [c // 2 for c in range(2 * cp)]
    return [c if c < cp else 2 * cp - 1 - c for c in range(2 * cp)]


def causal_rank_work(cp: int, reorder: bool = True) -> list[float]:
    """Causal attention work of each cp rank in chunk-block units (one chunk of queries against
    one chunk of keys = 1; a diagonal block, half masked, = 1/2): query chunk c attends to
    chunks 0..c, i.e. c full blocks and one half block."""
    work = [0.0] * cp
    for chunk, rank in enumerate(chunk_owner(cp, reorder)):
        work[rank] += chunk + 0.5
    return work


def ring_step_flops(model: ModelSpec, seq_len, micro_batch, tp, cp):
    """Forward attention-core FLOPs of one ring step on one GPU: half of the full
    (s/cp) x (s/cp) block of its a/t heads (module docstring), i.e. the causal work of one rank,
    the full s² core / (2·tp·cp), spread over its cp steps."""
    return attention_core_flops(model, micro_batch, seq_len) / (2.0 * tp * cp * cp)


def cp_link(gpus_per_node, tp, cp, intra_bw, intra_lat, inter_bw, inter_lat):
    """(bytes/s, latency) of the slowest hop of a cp group: NVLink while its tp·cp span of
    consecutive ranks fits in a node, the GPU's NIC share otherwise."""
    inside = np.asarray(tp) * np.asarray(cp) <= gpus_per_node
    return np.where(inside, intra_bw, inter_bw), np.where(inside, intra_lat, inter_lat)


def ring_exposed_s(cp, kv_bytes, step_fwd_s, bw, lat, forward_passes):
    """Exposed ring time of one attention layer, one micro-batch: cp - 1 sends of one KV chunk
    per forward pass, each hidden behind that step's attention, and cp - 1 sends of KV + dKV
    behind the backward steps (twice the forward's work)."""
    fwd = collectives.send_recv_s(kv_bytes, bw, lat)
    bwd = collectives.send_recv_s(2 * kv_bytes, bw, lat)
    per_step = forward_passes * np.maximum(fwd - step_fwd_s, 0.0) \
        + np.maximum(bwd - 2 * step_fwd_s, 0.0)
    return (np.asarray(cp) - 1) * per_step


def ring_total_s(cp, kv_bytes, bw, lat, forward_passes):
    """All ring sends of one attention layer, one micro-batch, hidden or not."""
    fwd = collectives.send_recv_s(kv_bytes, bw, lat)
    bwd = collectives.send_recv_s(2 * kv_bytes, bw, lat)
    return (np.asarray(cp) - 1) * (forward_passes * fwd + bwd)


def a2a_tensor_bytes(model: ModelSpec, tp, local_tokens, micro_batch, activation_bytes):
    """(q, k, v, out) bytes one rank holds before its all-to-alls: s/cp tokens of a/t query
    heads, kv/t key and value heads, a/t output heads (the rule table makes t divide the heads)."""
    q, k, v = head_widths(model, 1)
    out = v if model.is_mla else q  # a heads of the value width
    rows = np.asarray(local_tokens, dtype=float) * micro_batch * activation_bytes / tp
    return rows * q, rows * k, rows * v, rows * out


def a2a_s(model: ModelSpec, tp, cp, local_tokens, micro_batch, activation_bytes, gpus_per_node,
          intra_bw, intra_lat, inter_bw, inter_lat, forward_passes):
    """All-to-all time of one attention layer, one micro-batch (exposed: nothing overlaps it):
    q, k, v, out each exchanged once per forward pass and their gradients once in backward, over
    the cp group (cp_local ranks per node, cp / cp_local nodes) by `collectives.all_to_all_s`
    with nccl-tests' convention (S = the bytes one rank holds)."""
    cp = np.asarray(cp, dtype=float)
    local = np.minimum(np.maximum(gpus_per_node // np.asarray(tp), 1), cp)
    one = sum(collectives.all_to_all_s(size, local, cp / local, intra_bw, intra_lat, inter_bw,
                                       inter_lat)
              for size in a2a_tensor_bytes(model, tp, local_tokens, micro_batch, activation_bytes))
    return (forward_passes + 1) * one


def cp_comm_s(model: ModelSpec, seq_len: int, cols, layers, peak_flops_per_s, efficiency,
              activation_bytes: int, gpus_per_node: int, intra_bw, intra_lat, inter_bw, inter_lat):
    """Exposed context-parallel communication of one step on the slowest stage's GPU:
    grad_accum x layers x one attention layer's (ring: the sends slower than their step's
    attention; a2a: the eight all-to-alls); 0 where cp = 1. Selective and full recompute run
    the attention forward again in backward, with its communication."""
    cp = np.asarray(cols.get("cp", 1))
    if not np.any(cp > 1):
        return np.zeros(np.shape(cols["tp"]))
    a2a = np.asarray(cols.get("cp_comm_type", 0)) == A2A_CODE
    tp, b, m = cols["tp"], cols["micro_batch"], cols["grad_accum"]
    passes = 1 + (np.asarray(cols["recompute"]) > 0)
    tokens = local_seq_len(seq_len, np.maximum(cp, 1))
    bw, lat = cp_link(gpus_per_node, tp, cp, intra_bw, intra_lat, inter_bw, inter_lat)
    kv = kv_bytes_column(model, tp, tokens, b, activation_bytes)
    step_s = ring_step_flops(model, seq_len, b, tp, cp) / (peak_flops_per_s * efficiency)
    ring = ring_exposed_s(cp, kv, step_s, bw, lat, passes)
    ulysses = a2a_s(model, tp, cp, tokens, b, activation_bytes, gpus_per_node, intra_bw,
                    intra_lat, inter_bw, inter_lat, passes)
    per_layer = np.where(cp > 1, np.where(a2a, ulysses, ring), 0.0)
    return m * layers * per_layer


def kv_bytes_column(model: ModelSpec, tp, local_tokens, micro_batch, activation_bytes):
    """`kv_chunk_bytes` over columns (float64; exact per row below 2^53): kv / tp heads per
    rank, one head when tp is wider than the kv heads (params.kv_heads_per_rank)."""
    per_head = kv_chunk_bytes(model, 1, 1, 1, activation_bytes) // model.kv_heads
    heads = np.maximum(model.kv_heads / np.asarray(tp, dtype=float), 1.0)
    return np.asarray(local_tokens, dtype=float) * micro_batch * per_head * heads
