"""Context parallelism in activation memory: the sequence split and the attention's transient buffers.

With context parallelism of degree cp (Megatron-LM `--context-parallel-size`), every rank of a
cp group holds s/cp tokens of each sequence: two of the 2·cp chunks, chunk r and chunk
2·cp - 1 - r, so the causal mask's work is the same on every rank (Transformer Engine
`get_batch_on_this_cp_rank`; planner/timing/context.py). Every tensor a block saves for
backward is token-wise outside the attention core, so the saved inventory is the one of
planner/memory/activations.py at s/cp tokens (`local_seq_len`): the caller evaluates the
inventory at that length. What context parallelism adds is transient, one layer at a time:

- ring attention (`cp_comm_type p2p`, TE `AttnFuncWithCPAndKVP2P`, transformer_engine/pytorch/
  attention/dot_product_attention/context_parallel.py at commit d0067d0d): the forward keeps
  every KV chunk it receives in `p2p_comm_buffers` (cp of them, its own included) and one
  output and one fp32 log-sum-exp per step (`out_per_step`, `softmax_lse_per_step`; cp of each
  on the last rank, whose steps all use its whole query) until the layer's output is combined;
  it saves for backward only q, one KV chunk, out and the log-sum-exp (`save_for_backward`), the
  same tensors as flash attention without cp. The backward runs the ring again with two
  double-buffered (KV, dKV) pairs, `p2p_comm_buffers = [torch.empty((2, *kv.shape)), ...]`,
  4 KV chunks, and a dq buffer of q's size (`dq_buffer = torch.empty_like(q)`).
- all-to-all (`cp_comm_type a2a`, TE `AttnFuncWithCPAndQKVOA2A`; DeepSpeed Ulysses
  deepspeed/sequence/layer.py `DistributedAttention` at commit edaa7221): q, k, v are
  exchanged to the whole sequence on heads/cp before the attention and the output back after
  it; each all-to-all holds its input and its output at once, so the layer briefly holds one
  more copy of q, k and v (named approximation: the output's exchange, later, is smaller).

Sizes per tp rank: K and V of `kv_heads / tp` heads (MLA: `num_heads / tp` heads of
qk_nope + qk_rope and v_head_dim), Q and the output of `num_heads / tp` heads.
"""

from __future__ import annotations

from planner.core import params
from planner.core.spec import Layout, ModelSpec

FP32_BYTES = 4
"""The log-sum-exp per step is fp32 (flash attention's softmax_lse)."""


def local_seq_len(seq_len: int, cp: int) -> int:
    """Tokens of each sequence on one cp rank: s / cp (the rule table makes 2·cp divide s)."""
    return seq_len // cp


def head_widths(model: ModelSpec, tp: int) -> tuple[int, int, int]:
    """(query + output width, key width, value width) of one tp rank, elements per token.
    Standard attention: a/t heads of d for q and out, kv/t heads of d for k and v (one head
    when tp is wider than the kv heads, params.kv_heads_per_rank); MLA: one key
    and value per query head, keys of qk_nope + qk_rope, values of v_head_dim."""
    if model.is_mla:
        heads = model.num_heads // tp
        return (heads * (model.qk_nope_head_dim + model.qk_rope_head_dim),
                heads * (model.qk_nope_head_dim + model.qk_rope_head_dim),
                heads * model.v_head_dim)
    d = model.head_size
    kv = params.kv_heads_per_rank(model, tp)
    return model.num_heads // tp * d, kv * d, kv * d


def kv_chunk_bytes(model: ModelSpec, tp: int, local_tokens: int, micro_batch: int,
                   activation_bytes: int) -> int:
    """One rank's K and V for its s/cp tokens: what ring attention sends to the next rank at
    each step (TE concatenates k and v into one buffer, `torch.cat((k.view(-1), v.view(-1)))`)."""
    _, k, v = head_widths(model, tp)
    return local_tokens * micro_batch * (k + v) * activation_bytes


def ring_buffer_bytes(model: ModelSpec, tp: int, cp: int, local_tokens: int, micro_batch: int,
                      activation_bytes: int) -> dict[str, int]:
    """Transient bytes of one ring-attention layer on the busiest rank, forward and backward
    apart (module docstring): forward cp KV chunks + cp step outputs + cp fp32 log-sum-exps;
    backward 4 KV chunks (KV and dKV, double-buffered) + the dq buffer."""
    q, _, v = head_widths(model, tp)
    kv = kv_chunk_bytes(model, tp, local_tokens, micro_batch, activation_bytes)
    rows = local_tokens * micro_batch
    heads = model.num_heads // tp
    out = rows * (v if model.is_mla else q) * activation_bytes  # a/t heads of the value width
    return {"cp_ring_forward": cp * (kv + out + rows * heads * FP32_BYTES),
            "cp_ring_backward": 4 * kv + rows * q * activation_bytes}


def a2a_buffer_bytes(model: ModelSpec, tp: int, local_tokens: int, micro_batch: int,
                     activation_bytes: int) -> int:
    """One extra copy of q, k and v while the all-to-alls run (module docstring)."""
    q, k, v = head_widths(model, tp)
    return local_tokens * micro_batch * (q + k + v) * activation_bytes


def cp_working_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                     activation_bytes: int) -> int:
    """The context-parallel attention's transient peak of one layer, one micro-batch, one GPU
    (0 without cp): ring attention the larger of its forward and backward buffers, all-to-all
    one copy of q, k, v. `seq_len` is the whole sequence."""
    if layout.cp == 1:
        return 0
    tokens = local_seq_len(seq_len, layout.cp)
    if layout.cp_comm_type == "a2a":
        return a2a_buffer_bytes(model, layout.tp, tokens, micro_batch, activation_bytes)
    return max(ring_buffer_bytes(model, layout.tp, layout.cp, tokens, micro_batch,
                                 activation_bytes).values())
