"""Saved activations: the named tensor inventory of one block, recompute, pipeline stages.

The inventory lists what autograd keeps for backward in ONE transformer block, for ONE
micro-batch, on ONE GPU (one tensor-parallel rank), in bytes (exact integers). Each entry is a
named class of saved tensors so `zplan calibrate` can compare it with real torch saved tensors
(the names are listed in docs/activations.md and must stay stable).

Sources: seed 004 §2.2.3 (the `34sbh + 5as²b` GPT block, fp16) = Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models" §4.1 (block), §4.2 (tensor and
sequence parallel), §4.3 (embedding / output extras), §5 (selective recompute); seed 000 §3
eq.3-4 (checkpoints, AWM, MSWM); seed 003 (Tempo); seed 004 §3.5.1-3.5.2 (40·s·h·L, 1F1B).

Element sizes: `activation_bytes` per activation element (2 for fp16/bf16, 4 for fp32);
dropout masks 1 byte per element (torch.bool, aten::native_dropout); norm statistics, flash
attention's log-sum-exp, router probabilities and the loss logits fp32 (4 bytes).
"""

from __future__ import annotations

import functools

import numpy as np

from planner.core import params, rules
from planner.core.errors import PlanInputError
from planner.core.spec import Frozen, Layout, ModelSpec, TrainSetup, ceil_div
from planner.memory import fp8
from planner.memory.context import cp_working_bytes, local_seq_len

MASK_BYTES = 1
"""A dropout mask element: torch.bool (aten::native_dropout returns a bool mask)."""
FP32_BYTES = 4
"""Norm mean/rstd, flash-attention log-sum-exp, router probabilities, loss logits."""
TOKEN_ID_BYTES = 8
"""int64 token ids kept by the embedding lookup for its backward."""

ATTENTION_CORE = (
    "attn.softmax_output", "attn.softmax_dropout_mask", "attn.softmax_dropout_output",
    "attn.softmax_lse", fp8.CORE_OUTPUT,
)
"""Entries of the attention core (QKᵀ, softmax, dropout, ·V): what selective recompute drops."""
NEGLECTED_BY_SEED = ("norm1.stats", "norm2.stats")
"""Entries the seed and Korthikanti leave out (LayerNorm mean and rstd, 8 bytes per token)."""


# --------------------------------------------------------------------------- helpers


TP_RULES = (rules.TP_RULE_NAME, "sequence parallel needs tp to divide seq_len")


def check_tp(model: ModelSpec, layout: Layout, seq_len: int) -> None:
    """Megatron splits heads, kv groups and MLP widths evenly (the expert width for MoE
    models); SP splits the sequence evenly: those rules of planner.core.rules, for one layout."""
    _check_tp(model, layout.tp, layout.sequence_parallel, seq_len)


@functools.lru_cache(maxsize=1024)
def _check_tp(model: ModelSpec, tp: int, sequence_parallel: bool, seq_len: int) -> None:
    rules.check_row(rules.Context(model, seq_len_tokens=seq_len),
                    {"tp": int(tp), "sequence_parallel": int(bool(sequence_parallel))},
                    rules.named(*TP_RULES))


def replicated_tokens(layout: Layout, seq_len: int) -> int:
    """Tokens per sequence of the tensors outside the tensor-parallel regions (norm inputs,
    residual dropout masks, first-linear inputs): all s without SP, s/t with SP (Korthikanti §4.2.2)."""
    return seq_len // layout.tp if layout.sequence_parallel else seq_len


def _norm(prefix: str, model: ModelSpec, tokens: int, e: int) -> dict[str, int]:
    """A norm keeps its input and fp32 statistics per token: LayerNorm mean + rstd
    (aten::native_layer_norm), RMSNorm rstd only (fused RMSNorm, Apex/TE)."""
    stats = 2 if model.norm == "layernorm" else 1
    return {f"{prefix}.input": tokens * model.hidden_size * e,
            f"{prefix}.stats": tokens * stats * FP32_BYTES}


def attention_saved_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                          activation_bytes: int) -> dict[str, int]:
    """Self-attention sub-layer, one tp rank (Korthikanti §4.1 "Attention block": 11sbh + 5as²b).

    QKV input 2sbh (not split by t without SP); Q, K 4sbh and V 2sbh; softmax output 2as²b;
    its dropout mask as²b and output 2as²b; projection input 2sbh; residual dropout mask sbh.
    GQA without flash: Megatron's unfused DotProductAttention repeat_interleaves K and V to the
    query heads before the matmuls, so the saved K, V have a heads (megatron/core/transformer/
    dot_product_attention.py). Flash attention saves q, k, v (kv heads), out and the fp32 softmax
    log-sum-exp (b, a, s) and no s² tensor (FlashAttention-2 flash_attn_interface.py:
    `ctx.save_for_backward(q, k, v, out_padded, softmax_lse, rng_state)`); `out` is the same
    storage as the projection input, counted once.
    """
    if model.is_mla:
        return mla_attention_saved_bytes(model, layout, seq_len, micro_batch, activation_bytes)
    e, b, s, d = activation_bytes, micro_batch, seq_len, model.head_size
    heads = model.num_heads // layout.tp           # query heads on this rank
    kv = model.kv_heads // layout.tp if layout.flash_attention else heads  # K/V heads as saved
    rep = replicated_tokens(layout, s) * b         # tokens of the unsplit tensors
    out = {
        "attn.qkv_input": rep * model.hidden_size * e,
        "attn.q": s * b * heads * d * e,
        "attn.k": s * b * kv * d * e,
        "attn.v": s * b * kv * d * e,
    }
    return out | core_and_projection_saved_bytes(model, layout, s, b, e, heads, d, rep)


def core_and_projection_saved_bytes(model: ModelSpec, layout: Layout, s: int, b: int, e: int,
                                    heads: int, value_width: int, rep: int) -> dict[str, int]:
    """What the core attention and the output projection save on one tp rank, for `heads` query
    heads whose values are `value_width` wide (standard attention: the head size; MLA:
    v_head_dim): flash keeps the fp32 log-sum-exp, the unfused path the s^2 softmax (and its
    dropout mask and output); the projection keeps its input; `rep` tokens for the block's
    dropout mask (sequence parallelism splits them)."""
    out: dict[str, int] = {}
    if layout.flash_attention:
        out["attn.softmax_lse"] = heads * s * b * FP32_BYTES
    else:
        out["attn.softmax_output"] = heads * s * s * b * e
        if model.dropout:
            out["attn.softmax_dropout_mask"] = heads * s * s * b * MASK_BYTES
            out["attn.softmax_dropout_output"] = heads * s * s * b * e
    out["attn.proj_input"] = s * b * heads * value_width * e
    if model.dropout:
        out["attn.dropout_mask"] = rep * model.hidden_size * MASK_BYTES
    return out


def replicated_kv_saved_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                              activation_bytes: int) -> dict[str, int]:
    """K and V as the core attention saves them when tp is wider than the kv heads: ONE kv
    head per rank (empty otherwise; these entries replace `attention_saved_bytes`' attn.k /
    attn.v, whose kv / tp would be 0).

    Megatron-LM attention.py `get_query_key_value_tensors` (commit d98e8a64): the QKV output
    is all-gathered over tp (`all_gather_last_dim_from_tensor_parallel_region`, whose autograd
    node saves nothing: backward is a reduce-scatter, tensor_parallel/mappings.py), the rank's
    group slice "q.. k v" is cut out by views and the core attention is built with
    num_query_groups = tp, so it receives a / tp query heads and one K and one V head. The
    gathered buffer is not kept: K leaves the rotary embedding as a new tensor and V, a
    strided view, does not match K's strides, so Transformer Engine's `get_qkv_layout`
    answers "not_supported" and makes q, k, v contiguous copies before saving them
    (transformer_engine/pytorch/attention/dot_product_attention/utils.py, TransformerEngine
    commit d0067d0d). Without flash attention K and V are already at the query heads (the
    unfused path repeats them), so nothing changes there."""
    if model.is_mla or not layout.flash_attention or layout.tp <= model.kv_heads:
        return {}
    one_head = seq_len * micro_batch * params.kv_heads_per_rank(model, layout.tp) \
        * model.head_size * activation_bytes
    return {"attn.k": one_head, "attn.v": one_head}


def mla_widths(model: ModelSpec) -> tuple[int, int]:
    """(query / key width, value width) of one MLA head: qk_nope + qk_rope, v_head_dim."""
    return model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim


def mla_attention_saved_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                              activation_bytes: int) -> dict[str, int]:
    """Megatron-Core's multi-head latent attention (MLASelfAttention with the Transformer Engine
    spec), one tp rank. Megatron-LM megatron/core/transformer/multi_latent_attention.py and
    models/gpt/gpt_layer_specs.py at commit d98e8a64:

    - the down projections linear_q_down_proj (h -> q_lora_rank) and linear_kv_down_proj
      (h -> kv_lora_rank + qk_rope) are TELinear with parallel_mode='duplicated': replicated on
      every tp rank, fed by the separate input norm; both keep that one norm output
      (`attn.qkv_input`, s/t tokens with sequence parallelism);
    - linear_q_up_proj and linear_kv_up_proj are TELayerNormColumnParallelLinear: the fused
      q_layernorm / kv_layernorm keeps its input and fp32 rstd and the linear its norm output,
      all at the replicated (s, or s/t with SP) tokens, like the block's first norm-linear;
      the up projections are column-parallel, so everything after them has a/t heads;
    - without a q_lora_rank, linear_q_proj reads the norm output already counted;
    - rope is applied to views of the up-projection outputs (the freqs, not per token, are
      saved), `torch.cat` builds query and key, `.contiguous()` copies value: the core attention
      gets a/t heads of (qk_nope + qk_rope) for q and k and of v_head_dim for v (one key and value
      per query head: no grouping). The up-projection outputs themselves are not kept;
    - the core attention and the output projection are as in `attention_saved_bytes` with those
      widths (flash: q, k, v, out, fp32 log-sum-exp; unfused: the s^2 softmax tensors).
    The latent tensors are small (r_q + r_kv per token); their norms' inputs are approximated as
    contiguous r_q and r_kv rows (the split view of kv_down's output is r_kv + qk_rope wide).
    """
    e, b, s = activation_bytes, micro_batch, seq_len
    heads = model.num_heads // layout.tp
    dq, dv = mla_widths(model)
    rep = replicated_tokens(layout, s) * b
    out = {"attn.qkv_input": rep * model.hidden_size * e}
    if model.q_lora_rank is not None:
        out |= _latent_norm("attn.q_norm", model.q_lora_rank, rep, e)
    out |= _latent_norm("attn.kv_norm", model.kv_lora_rank or 0, rep, e)
    out |= {"attn.q": s * b * heads * dq * e, "attn.k": s * b * heads * dq * e,
            "attn.v": s * b * heads * dv * e}
    return out | core_and_projection_saved_bytes(model, layout, s, b, e, heads, dv, rep)


def _latent_norm(prefix: str, width: int, tokens: int, e: int) -> dict[str, int]:
    """A TE LayerNormColumnParallelLinear over a latent of `width`: the RMSNorm input, its fp32
    rstd, and the norm output the linear keeps (`prefix`.input / .stats / .output)."""
    return {f"{prefix}.input": tokens * width * e, f"{prefix}.stats": tokens * FP32_BYTES,
            f"{prefix}.output": tokens * width * e}



def _mlp_inner(prefix: str, model: ModelSpec, tokens: int, width: int, e: int) -> dict[str, int]:
    """Inside one MLP (or expert), `tokens` rows of `width` (f/t) columns.

    GELU (seed 004 §2.2.3): the GELU input 2sbf and the fc2 input (= GELU output) 2sbf.
    SwiGLU down(silu(gate(x)) * up(x)) under autograd: SiLU keeps its input (the gate output),
    the product keeps both operands (SiLU output and up output), down keeps its input (the product).
    """
    n = tokens * width * e
    if model.mlp == "gelu":
        return {f"{prefix}.act_input": n, f"{prefix}.fc2_input": n}
    return {f"{prefix}.act_input": n, f"{prefix}.act_output": n,
            f"{prefix}.up_output": n, f"{prefix}.fc2_input": n}


def mlp_saved_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                    activation_bytes: int, moe: bool | None = None) -> dict[str, int]:
    """MLP sub-layer, one tp rank (Korthikanti §4.1 "MLP": 19sbh at f = 4h with GELU).

    fc1 input 2sbh (not split without SP), the inner tensors split by t, residual dropout mask sbh.
    MoE block (`moe`; None: every block of an MoE model; a dense block of an MoE model keeps
    the MLP of `ffn_hidden_size`): the router keeps the fc1 input and its fp32 softmax output (s·b·E);
    each token is dispatched to k experts (k·s·b copies, no capacity drop), each expert keeps its
    inner tensors, and the weighted sum keeps the k expert outputs and the k routing weights.
    """
    e, b, s, t = activation_bytes, micro_batch, seq_len, layout.tp
    h = model.hidden_size
    rep = replicated_tokens(layout, s) * b
    out = {"mlp.fc1_input": rep * h * e}
    if not (model.is_moe if moe is None else moe):
        out |= _mlp_inner("mlp", model, s * b, model.ffn_hidden_size // t, e)
    else:
        k = model.experts_per_token
        out["moe.router_probs"] = rep * model.num_experts * FP32_BYTES
        out["moe.expert_input"] = k * rep * h * e
        out |= _mlp_inner("moe.expert", model, k * s * b, model.expert_ffn_size // t, e)
        out["moe.expert_output"] = k * rep * h * e
        out["moe.routing_weights"] = k * rep * e
        if model.num_shared_experts:
            shared = _mlp_inner("moe.shared", model, s * b, model.expert_ffn_size // t, e)
            out |= {name: model.num_shared_experts * n for name, n in shared.items()}
    if model.dropout:
        out["mlp.dropout_mask"] = rep * h * MASK_BYTES
    return out


# --------------------------------------------------------------------------- Tempo (seed 003)


def _tempo_gelu(inventory: dict[str, int], e: int) -> dict[str, int]:
    """In-place GELU (seed 003 §3.2): drop the GELU input; the output is already kept as the fc2
    input; keep one bit per element saying on which side of the minimum (x ≈ -0.75179) the
    input was, packed 8 per byte (EQUATIONS.md §3: "one bit per element")."""
    out: dict[str, int] = {}
    for name, n in inventory.items():
        if name.endswith(".act_input"):
            out[name.removesuffix(".act_input") + ".act_sign_bits"] = ceil_div(n // e, 8)
        else:
            out[name] = n
    return out


def _tempo_layernorm(inventory: dict[str, int]) -> dict[str, int]:
    """In-place LayerNorm (seed 003 §3.3): the gradient is computed from the output (already kept
    as the next linear's input) and the mean/variance; the norm input is dropped."""
    return {name: n for name, n in inventory.items() if name not in ("norm1.input", "norm2.input")}


def _tempo_dropout(inventory: dict[str, int]) -> dict[str, int]:
    """Sub-layer dropout recomputation (seed 003 §3.4): keep the boolean mask, drop the O(s²)
    attention dropout output; backward recomputes it as softmax output x mask / (1 - p)."""
    return {name: n for name, n in inventory.items() if name != "attn.softmax_dropout_output"}


def _check_tempo(model: ModelSpec, layout: Layout) -> None:
    if "gelu" in layout.tempo and model.mlp != "gelu":
        raise PlanInputError("tempo", f"in-place gelu needs a GELU MLP; model {model.name} uses {model.mlp}")
    if "dropout" in layout.tempo and not model.dropout:
        raise PlanInputError("tempo", f"dropout recomputation needs dropout; model {model.name} has none")


def apply_tempo(model: ModelSpec, layout: Layout, inventory: dict[str, int],
                activation_bytes: int) -> dict[str, int]:
    """Edit the inventory by the Tempo techniques listed in `layout.tempo` (no fudge factor)."""
    _check_tempo(model, layout)
    if "gelu" in layout.tempo:
        inventory = _tempo_gelu(inventory, activation_bytes)
    if "layernorm" in layout.tempo:
        inventory = _tempo_layernorm(inventory)
    if "dropout" in layout.tempo:
        inventory = _tempo_dropout(inventory)
    return inventory


# --------------------------------------------------------------------------- one block


def layer_saved_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                      activation_bytes: int, fp8_scaling: fp8.Fp8Scaling | None = None,
                      moe: bool | None = None) -> dict[str, int]:
    """What one block saves for backward: one micro-batch, one GPU, before recompute.

    GPT block at f = 4h, fp16, t = 1: 34sbh + 5as²b + the norm statistics (seed 004 §2.2.3;
    Korthikanti §4.1). Tensor parallel t without SP: 10sbh stay whole, the rest is split by t;
    with SP everything is split by t (Korthikanti §4.2). Tempo edits applied (seed 003).
    `fp8_scaling` (an FP8 recipe's): the linears' saved inputs in fp8 (`fp8.fp8_inventory`).
    `moe`: the MoE or the dense block of a model with both (None: MoE when it has experts).
    """
    for field, value in (("seq_len", seq_len), ("micro_batch", micro_batch),
                         ("activation_bytes", activation_bytes)):
        if value <= 0:
            raise PlanInputError(field, f"must be a positive integer (got {value})")
    check_tp(model, layout, seq_len)
    e = activation_bytes
    rep = replicated_tokens(layout, seq_len) * micro_batch
    inventory = (
        _norm("norm1", model, rep, e)
        | attention_saved_bytes(model, layout, seq_len, micro_batch, e)
        | replicated_kv_saved_bytes(model, layout, seq_len, micro_batch, e)
        | _norm("norm2", model, rep, e)
        | mlp_saved_bytes(model, layout, seq_len, micro_batch, e, moe)
    )
    if fp8_scaling is not None:
        inventory = fp8.fp8_inventory(model, layout, inventory, e, fp8_scaling)
    return apply_tempo(model, layout, inventory, e)


def layer_input_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                      activation_bytes: int) -> int:
    """One block's input, the full-recompute checkpoint: 2sbh in fp16 (Korthikanti §5,
    seed 004 "重新计算所有 2·sbhL"); Megatron keeps the sequence-parallel shard with SP (÷t)."""
    return replicated_tokens(layout, seq_len) * micro_batch * model.hidden_size * activation_bytes


def layer_activation_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                           activation_bytes: int, fp8_scaling: fp8.Fp8Scaling | None = None,
                           moe: bool | None = None) -> int:
    """What one block keeps for backward under `layout.recompute`, one micro-batch, one GPU.

    none: the inventory. selective: the inventory without the attention core (Korthikanti §5:
    sbh(10 + 24/t) without SP, 34sbh/t with SP). full: the block input. every_k: a block that
    starts a segment keeps its input, the others nothing; this returns the former
    (`layers_kept_bytes` counts a stack of blocks). block: a block outside the recomputed
    first n of its chunk, which keeps the inventory (`block_recompute_saved_bytes` takes the
    recomputed ones off a stack).
    """
    if layout.recompute in ("full", "every_k"):
        return layer_input_bytes(model, layout, seq_len, micro_batch, activation_bytes)
    inventory = layer_saved_bytes(model, layout, seq_len, micro_batch, activation_bytes, fp8_scaling,
                                  moe)
    if layout.recompute == "selective":
        return sum(selective_kept_bytes(model, layout, seq_len, micro_batch, activation_bytes,
                                        inventory).values())
    return sum(inventory.values())


def selective_kept_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                         activation_bytes: int, inventory: dict[str, int]) -> dict[str, int]:
    """The inventory under selective recompute: without the attention core, and with K and V at
    kv heads. Megatron checkpoints `core_attention(query, key, value)` (attention.py
    `_checkpointed_attention_forward`) and repeats K, V to the query heads inside it
    (dot_product_attention.py), so the kept K, V have kv heads; measured by `zplan calibrate`
    (tiny Llama, 4 heads, 2 kv heads: attn.k 32,768 B, not 65,536 B; docs/calibrate.md finding 1).
    MLA: Megatron's default `--recompute-modules` is ["core_attn"] (transformer_config.py
    `recompute_modules`, commit d98e8a64), so the same core is dropped and its inputs q, k, v
    (a/t heads of the MLA widths) are kept; `mla_up_proj` (the up projections and rope, the
    DeepSeek-V3 report's §3.2.3 choice) is not the default and is not modelled.
    """
    kept = {name: n for name, n in inventory.items() if name not in ATTENTION_CORE}
    if model.is_mla:  # q, k, v are already per query head (mla_attention_saved_bytes)
        return kept
    kv_bytes = seq_len * micro_batch * params.kv_heads_per_rank(model, layout.tp) \
        * model.head_size * activation_bytes
    kept["attn.k"] = kept["attn.v"] = kv_bytes
    return kept


def layers_kept_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                      activation_bytes: int, num_layers: int,
                      fp8_scaling: fp8.Fp8Scaling | None = None) -> int:
    """A stack of `num_layers` blocks under `layout.recompute`: every_k keeps
    ceil(n / k) checkpoints (seed 000 eq.3 with ci = k), block keeps n x the inventory less
    the recomputed blocks' saving (`block_recompute_saved_bytes`), the other modes n x one
    block."""
    one = layer_activation_bytes(model, layout, seq_len, micro_batch, activation_bytes, fp8_scaling)
    if layout.recompute == "every_k":
        return ceil_div(num_layers, layout.recompute_every_k) * one
    return num_layers * one - block_recompute_saved_bytes(
        model, layout, seq_len, micro_batch, activation_bytes, num_layers, fp8_scaling)


def block_recompute_saved_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                                activation_bytes: int, num_layers: int,
                                fp8_scaling: fp8.Fp8Scaling | None = None) -> int:
    """What `block` recompute saves on a chunk of `num_layers` blocks: its first
    r = min(recompute_num_layers, num_layers) blocks keep their input (full recompute's
    `layer_input_bytes`) instead of the inventory (`layer_saved_bytes`), r x (inventory - input)
    (Megatron-LM megatron/core/recompute.py `checkpointed_forward`, method "block", commit
    d98e8a64). 0 for the other modes. Models mixing dense and MoE blocks: the recomputed blocks
    are taken as the lighter kind (a named approximation, an upper bound on what is kept)."""
    if layout.recompute != "block":
        return 0
    recomputed = min(layout.recompute_num_layers or 0, num_layers)
    lightest = min(sum(layer_saved_bytes(model, layout, seq_len, micro_batch, activation_bytes,
                                         fp8_scaling, kind).values())
                   for kind in params.block_kinds(model))
    return recomputed * (lightest - layer_input_bytes(model, layout, seq_len, micro_batch,
                                                      activation_bytes))


def mixed_chunk_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                      activation_bytes: int, num_layers: int, moe_layers: int,
                      fp8_scaling: fp8.Fp8Scaling | None = None) -> int:
    """`layers_kept_bytes` of a chunk of `num_layers` blocks of which `moe_layers` are MoE
    blocks (DeepSeek-V3's dense first blocks, Llama 4 / Qwen2-MoE alternation): each block
    keeps its own kind's activations. every_k and models of one kind: `layers_kept_bytes`."""
    if layout.recompute == "every_k" or len(params.block_kinds(model)) == 1:
        return layers_kept_bytes(model, layout, seq_len, micro_batch, activation_bytes, num_layers,
                                 fp8_scaling)
    args = (model, layout, seq_len, micro_batch, activation_bytes, fp8_scaling)
    return (moe_layers * layer_activation_bytes(*args, moe=True)
            + (num_layers - moe_layers) * layer_activation_bytes(*args, moe=False)
            - block_recompute_saved_bytes(*args[:5], num_layers, fp8_scaling))


def largest_inventory(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                      activation_bytes: int, fp8_scaling: fp8.Fp8Scaling | None = None
                      ) -> dict[str, int]:
    """The larger block inventory of the kinds the model has (dense and / or MoE blocks)."""
    kinds = sorted(params.block_kinds(model), reverse=True)  # MoE first on ties
    inventories = [layer_saved_bytes(model, layout, seq_len, micro_batch, activation_bytes,
                                     fp8_scaling, kind)
                   for kind in kinds]
    return max(inventories, key=lambda inv: sum(inv.values()))


def recompute_working_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                            activation_bytes: int, num_layers: int,
                            fp8_scaling: fp8.Fp8Scaling | None = None) -> int:
    """Re-materialised during backward on top of what is kept (ZeRO-Infinity's AWM, seed 000
    eq.4): full and block = one block's whole inventory, every_k = one segment of min(k, n) blocks,
    selective = one block's attention core plus K, V repeated to the query heads, none = 0.
    A model with dense and MoE blocks: the larger block (an upper bound for a stage of only
    the smaller kind)."""
    if layout.recompute == "none" or num_layers == 0:
        return 0
    inventory = largest_inventory(model, layout, seq_len, micro_batch, activation_bytes, fp8_scaling)
    if layout.recompute == "selective":  # the core, plus K and V repeated to the query heads
        kept = selective_kept_bytes(model, layout, seq_len, micro_batch, activation_bytes, inventory)
        return sum(inventory.values()) - sum(kept.values())
    segment = min(layout.recompute_every_k, num_layers) if layout.recompute == "every_k" else 1
    return segment * sum(inventory.values())


# --------------------------------------------------------------------------- pipeline stages


def first_stage_extra_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                            activation_bytes: int) -> dict[str, int]:
    """Embedding extras on the first stage, one micro-batch (Korthikanti §4.3: the embedding
    dropout mask sbh, ÷t with SP), the int64 token ids the lookup keeps, BERT's embedding norm."""
    rep = replicated_tokens(layout, seq_len) * micro_batch
    out = {"embedding.token_ids": seq_len * micro_batch * TOKEN_ID_BYTES}
    if model.embedding_norm:
        out |= _norm("embedding.norm", model, rep, activation_bytes)
    if model.dropout:
        out["embedding.dropout_mask"] = rep * model.hidden_size * MASK_BYTES
    return out


def last_stage_extra_bytes(model: ModelSpec, layout: Layout, seq_len: int, micro_batch: int,
                           activation_bytes: int) -> dict[str, int]:
    """Output extras on the last stage, one micro-batch (Korthikanti §4.3): final norm input,
    output-layer input 2sbh (÷t with SP), and the fp32 logits the vocab-parallel cross entropy
    keeps, 4·s·b·V/t (the largest rank has ceil(V/t) rows)."""
    e = activation_bytes
    rep = replicated_tokens(layout, seq_len) * micro_batch
    out: dict[str, int] = {}
    if model.final_norm:
        out |= _norm("final_norm", model, rep, e)
        if "layernorm" in layout.tempo:
            del out["final_norm.input"]  # in-place norm: the head input is its output (seed 003 §3.3)
    out["head.input"] = rep * model.hidden_size * e
    out["head.logits_fp32"] = seq_len * micro_batch * ceil_div(model.vocab_size, layout.tp) * FP32_BYTES
    return out


class StageActivations(Frozen):
    """Activation bytes of ONE GPU of one pipeline stage at its peak (1F1B)."""

    stage: int
    """1-based pipeline stage."""
    num_layers: int
    in_flight_microbatches: int
    """Micro-batches whose activations the stage holds at its peak: min(p - i + 1, m) for 1F1B
    (seed 004 §3.5.2); interleaved: ceil(in_flight_chunks / virtual_stages)."""
    in_flight_chunks: int
    """Model-chunk forward passes held at the peak (= in_flight_microbatches when not interleaved)."""
    per_microbatch_bytes: int
    """The stage's blocks under the recompute policy + embedding/head extras, one micro-batch."""
    extras: dict[str, int]
    """Embedding (first stage) and output-layer (last stage) extras of one micro-batch, by name."""
    recompute_working_bytes: int
    """One segment re-materialised during backward (AWM, seed 000 eq.4); 0 without recompute."""
    cp_working_bytes: int = 0
    """Context parallelism's transient attention buffers of one layer (planner.memory.context);
    0 when cp = 1."""
    total_bytes: int
    """Peak kept activations + recompute_working_bytes + cp_working_bytes."""


def in_flight_1f1b(pp, stage, micro_batches):
    """Micro-batches whose activations 1-based pipeline `stage` holds at its peak under 1F1B:
    min(p - i + 1, m) (seed 004 §3.5.2; Narayanan et al. 2021 §2.2.1: stage i runs p - i + 1
    warm-up forwards before its first backward). Integers or integer arrays."""
    return np.minimum(pp - stage + 1, micro_batches)


def interleaved_in_flight(p: int, rank: int, v: int, m: int,
                          chunk_bytes: list[int] | None = None) -> list[int]:
    """Per-chunk forward passes held at the peak on a 0-based pipeline `rank`, interleaved 1F1B.

    Replays Megatron-LM's order (megatron/core/pipeline_parallel/schedules.py,
    forward_backward_pipelining_with_interleaving): warmup = min(2(p - rank - 1) + (v - 1)p, m·v)
    forwards (all m·v when m = p), then one forward + one backward each step; forward k runs
    chunk (k mod pv) // p, backward k the chunks counted down. The peak is the largest
    sum of counts x `chunk_bytes` (default 1 each); the schedule is periodic after warmup, so
    warmup + 2pv steps suffice.
    """
    weights = chunk_bytes or [1] * v
    total = m * v
    warmup = total if m == p else min(2 * (p - rank - 1) + (v - 1) * p, total)
    counts, best = [0] * v, [0] * v

    def chunk(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    def size(cs: list[int]) -> int:
        return sum(c * w for c, w in zip(cs, weights, strict=True))

    for k in range(min(total, warmup + 2 * p * v)):  # forward k, then backward k - warmup
        counts[chunk(k, True)] += 1
        if size(counts) > size(best):
            best = list(counts)
        if k >= warmup:
            counts[chunk(k - warmup, False)] -= 1
    return best


def forwards_of(chunk: int, n, p: int, v: int):
    """Forwards of model chunk `chunk` among the first n steps of the interleaved schedule
    (forward k runs chunk (k mod pv) // p): p per whole period of pv steps, plus the part of
    the last period that falls in [chunk·p, chunk·p + p). Backward k runs chunk
    v - 1 - (k mod pv) // p, so backwards of c among the first n = `forwards_of(v - 1 - c, n)`."""
    return n // (p * v) * p + np.minimum(np.maximum(n % (p * v) - chunk * p, 0), p)


def interleaved_front(p: int, rank: int, v: int, m: int, chunk: int) -> np.ndarray:
    """Peak candidates of Megatron's interleaved 1F1B on `rank`, for chunk weights that are equal
    except chunk `chunk` (0: embedding extras, v-1: head extras): two pairs (chunks held, of
    which `chunk`), whose best for weights w >= 0 is the replay's peak, max of
    held·w + extra·(that chunk's extra weight).

    The replay is `interleaved_in_flight`'s: warmup = min(2(p - rank - 1) +
    (v - 1)p, m·v) forwards (all m·v when m = p), then one forward + one backward per step;
    forward k runs chunk (k mod pv) // p, backward k the chunks counted down; warmup + 2pv
    steps suffice. During warmup both counts only grow, so its last state bounds the earlier
    ones; afterwards warmup + 1 chunks are held at every step, so the steady state with the most
    of `chunk` bounds the others. Without a steady state (m = p) the two pairs are equal."""
    return interleaved_fronts(p, rank, v, m, chunk)[0]


def interleaved_fronts(p, rank, v, m, chunk) -> np.ndarray:
    """`interleaved_front` of every element of the argument arrays at once: (replays, 2, 2).
    The steady steps of all replays are laid end to end in one array (replay r's steps are
    warmup_r + j for j < steady_r) and each replay's maximum is taken over its segment."""
    p, rank, v, m, chunk = np.broadcast_arrays(
        *(np.atleast_1d(np.asarray(x, dtype=np.int64)) for x in (p, rank, v, m, chunk)))
    total = m * v
    warmup = np.where(m == p, total, np.minimum(2 * (p - rank - 1) + (v - 1) * p, total))
    steady = np.minimum(total, warmup + 2 * p * v) - warmup  # steps after warmup (>= 0)
    start = np.cumsum(steady) - steady  # each replay's first steady step in the flat array
    r = np.repeat(np.arange(len(p)), steady)  # the replay of each flat step
    k = warmup[r] + np.arange(len(r)) - start[r]  # step k: forward k, after k - warmup backwards
    extra = (forwards_of(chunk[r], k + 1, p[r], v[r])
             - forwards_of(v[r] - 1 - chunk[r], k - warmup[r], p[r], v[r]))
    last_warmup = forwards_of(chunk, warmup, p, v)
    best, held = last_warmup.copy(), warmup.copy()  # no steady state: the same pair twice
    has = steady > 0
    if has.any():
        best[has] = np.maximum.reduceat(extra, start[has])
        held[has] += 1
    return np.stack([np.stack([warmup, last_warmup], axis=-1), np.stack([held, best], axis=-1)],
                    axis=1)


def _stage_extras(model: ModelSpec, layout: Layout, setup: TrainSetup, stage: int) -> tuple[
        dict[str, int], dict[str, int]]:
    s, b, e = local_seq_len(setup.seq_len, layout.cp), layout.micro_batch, setup.precision.activation_bytes
    first = first_stage_extra_bytes(model, layout, s, b, e) if stage == 1 else {}
    last = last_stage_extra_bytes(model, layout, s, b, e) if stage == layout.pp else {}
    return first, last


def stage_activations(model: ModelSpec, layout: Layout, setup: TrainSetup,
                      layers_per_stage: list[int]) -> list[StageActivations]:
    """Peak activation bytes of one GPU of each pipeline stage.

    1F1B: stage i of p holds min(p - i + 1, m) micro-batches (seed 004 §3.5.2, m = grad_accum).
    Context parallelism: every tensor at s/cp tokens, plus one layer's transient cp buffers
    (planner.memory.context).
    Interleaved (virtual_stages v > 1, each stage's layers split into v equal chunks): the
    in-flight chunks come from Megatron's schedule; the first stage holds
    (pv + p - 1) chunks = L/p·(1 + (p - 1)/(pv)) layers of micro-batches, Korthikanti §4.2.3's
    factor (Narayanan et al. 2021 §2.2.2). Embedding extras ride with chunk 0 of stage 1, head
    extras with chunk v-1 of stage p. Models mixing dense and MoE blocks: every chunk of a stage
    is charged as the stage's heaviest chunk (`chunk_moe_layers`; exact for v = 1).
    """
    p, v, m = layout.pp, layout.virtual_stages, layout.grad_accum
    if setup.implementation != "megatron":
        return [hf_stage_activations(model, layout, setup, layers_per_stage)]
    if len(layers_per_stage) != p:
        raise PlanInputError("layers_per_stage", f"{len(layers_per_stage)} stages given for pp={p}")
    s, b, e = local_seq_len(setup.seq_len, layout.cp), layout.micro_batch, setup.precision.activation_bytes
    moe_chunks = chunk_moe_layers(model, layers_per_stage, v)
    cp_working = cp_working_bytes(model, layout, setup.seq_len, b, e)
    result = []
    for stage, n in enumerate(layers_per_stage, start=1):
        if n % v:
            raise PlanInputError("virtual_stages", f"virtual_stages={v} must divide the {n} "
                                 f"layers of pipeline stage {stage}")
        first, last = _stage_extras(model, layout, setup, stage)
        chunk = max(mixed_chunk_bytes(model, layout, s, b, e, n // v, k, setup.precision.fp8_scaling)
                    for k in moe_chunks[stage - 1])
        chunk_bytes = [chunk] * v
        chunk_bytes[0] += sum(first.values())
        chunk_bytes[-1] += sum(last.values())
        if v == 1:
            counts = [int(in_flight_1f1b(p, stage, m))]
        else:
            counts = interleaved_in_flight(p, stage - 1, v, m, chunk_bytes)
        kept = sum(c * w for c, w in zip(counts, chunk_bytes, strict=True))
        working = recompute_working_bytes(model, layout, s, b, e, n // v,
                                          setup.precision.fp8_scaling)
        result.append(StageActivations.computed(
            stage=stage, num_layers=n, in_flight_microbatches=ceil_div(sum(counts), v),
            in_flight_chunks=sum(counts), per_microbatch_bytes=sum(chunk_bytes),
            extras=first | last, recompute_working_bytes=working, cp_working_bytes=cp_working,
            total_bytes=kept + working + cp_working,
        ))
    return result


def chunk_moe_layers(model: ModelSpec, layers_per_stage: list[int], v: int) -> list[list[int]]:
    """MoE blocks in each model chunk of each pipeline stage. v = 1: the stage's contiguous
    blocks. Interleaved with even stages: Megatron's assignment, chunk c of rank i holds blocks
    [(c·p + i)·n, (c·p + i + 1)·n) with n = L / (p·v) (megatron/core/transformer/
    transformer_layer.py get_transformer_layer_offset, commit d98e8a64); uneven stages with
    v > 1: the stage's blocks cut into v contiguous runs (an approximation)."""
    p, out, start = len(layers_per_stage), [], 0
    even = len(set(layers_per_stage)) == 1
    for i, n in enumerate(layers_per_stage):
        size = n // v
        starts = ([(c * p + i) * size for c in range(v)] if even and v > 1
                  else [start + c * size for c in range(v)])
        out.append([sum(model.layer_is_moe(j) for j in range(a, a + size)) for a in starts])
        start += n
    return out


def hf_stage_activations(model: ModelSpec, layout: Layout, setup: TrainSetup,
                         layers_per_stage: list[int]) -> StageActivations:
    """A transformers model on one GPU of a data-parallel job (tp = pp = 1, the rule table):
    one micro-batch in flight (accumulation runs them one after another), its blocks'
    inventory and the outside extras (planner.memory.implementations.hf_activation_bytes)."""
    from planner.memory.implementations import hf_activation_bytes

    if layout.tp != 1 or len(layers_per_stage) != 1:
        raise PlanInputError("implementation", f"{setup.implementation} runs tp=1, pp=1 "
                             f"(got tp={layout.tp}, pp={len(layers_per_stage)})")
    n = layers_per_stage[0]
    block, outside, working = hf_activation_bytes(model, setup, layout.recompute, layout.micro_batch)
    per_microbatch = n * block + outside
    return StageActivations.computed(
        stage=1, num_layers=n, in_flight_microbatches=1, in_flight_chunks=1,
        per_microbatch_bytes=per_microbatch, extras={"outside_blocks": outside},
        recompute_working_bytes=working, total_bytes=per_microbatch + working)


# --------------------------------------------------------------------------- seed closed forms


def seed_layer_bytes_34sbh(s: int, b: int, h: int, a: int, bytes_per: int = 2) -> int:
    """Named approximation, one GPT block (seed 004 §2.2.3): 34·s·b·h + 5·a·s²·b bytes in fp16
    (norm statistics and small buffers neglected); scaled by bytes_per / 2 for other dtypes."""
    return (34 * s * b * h + 5 * a * s * s * b) * bytes_per // 2


def korthikanti_bytes(s: int, b: int, h: int, L: int, a: int, t: int, mode: str,
                      sequence_parallel: bool = False) -> float:
    """Named approximation, L blocks on one tp rank, fp16 (Korthikanti et al. 2022, Table 2;
    seed 004 §2.2.2): none sbhL(10 + 24/t + 5as/(ht)); selective sbhL(10 + 24/t);
    full 2sbhL; with sequence parallelism the 10 becomes 10/t and full becomes 2sbhL/t."""
    replicated = 10 / t if sequence_parallel else 10  # norms, dropout masks, first-linear inputs
    if mode == "none":
        per = replicated + 24 / t + 5 * a * s / (h * t)
    elif mode == "selective":
        per = replicated + 24 / t
    elif mode == "full":
        per = 2 / t if sequence_parallel else 2
    else:
        raise PlanInputError("mode", f"unknown recompute mode {mode!r}; allowed: none, selective, full")
    return s * b * h * L * per


def megatron_40shl_bytes(s: int, h: int, L: int) -> int:
    """Named approximation, Megatron's rule of thumb for activations with its default recompute
    (seed 004 §3.5.1): 40·s·h·L bytes (13B, s=4096, h=5120, L=40 -> 33,554,432,000 ≈ 34 GB)."""
    return 40 * s * h * L


def checkpoint_bytes(bsz: int, seq: int, hidden: int, num_layers: int, ci: int) -> float:
    """Named approximation, ZeRO-Infinity activation checkpoints (seed 000 §3 eq.3):
    2·bsz·seq·hd·nl/ci bytes, one fp16 block input per ci blocks."""
    return 2 * bsz * seq * hidden * num_layers / ci


def awm_bytes(bsz: int, seq: int, ci: int, hidden: int, heads: int) -> int:
    """Named approximation, activation working memory (seed 000 §3 eq.4):
    bsz·seq·ci·(16·hd + 2·heads·seq) bytes, one segment of ci blocks re-materialised."""
    return bsz * seq * ci * (16 * hidden + 2 * heads * seq)


def mswm_bytes(hidden: int) -> int:
    """Named approximation, model-state working memory (seed 000 §3 eq.4): fp16 parameter and
    gradient of the largest operator, the hd x 4hd linear: 4·hd·4hd bytes."""
    return 4 * hidden * 4 * hidden
