"""Saved-activation inventories of the ways people run a model: Megatron's fused kernels and
Hugging Face `transformers`' Python modules (eager and SDPA attention), times the precision mode.

Same shape as `activations.layer_saved_bytes`: ONE block, ONE micro-batch, ONE GPU, named tensor
classes -> exact bytes. `micro_batch` may be an int or a numpy integer array (every formula is a
product with it), so an array model can evaluate many micro-batches at once.

`megatron` is today's inventory (`planner.memory.activations`, unchanged). The `hf-*`
inventories are derived from transformers 5.23.0 (the installed package; file references below
are relative to its `transformers/` folder) and measured with `planner.calibrate.hf_models`;
docs/implementations.md walks through each tensor.

Precision modes: `fp32` (fp32 weights, no autocast), `bf16` / `fp16` (16-bit weights and
activations; an fp32 master copy, if any, is a model state), `autocast-bf16` / `autocast-fp16`
(fp32 weights under `torch.autocast`: what HF Trainer with `bf16=True` and plain AMP run).
`device` matters where CPU and CUDA kernels save different things (dropout masks, LayerNorm
statistics, autocast's fp32 op list); `cuda` is what users train on, `cpu` what the CPU
harness measures.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from pydantic import Field

from planner.core.errors import PlanInputError
from planner.core.spec import Frozen, Layout, ModelSpec, PrecisionRecipe, TrainSetup
from planner.memory import activations

FP32_BYTES = 4
INDEX_BYTES = 8
"""int64 token / target ids."""
EFFICIENT_LSE_BLOCK = 32
"""Memory-efficient attention pads its log-sum-exp to a multiple of 32 queries (torch 2.13
`_meta_registrations.py` `meta__scaled_dot_product_efficient_attention`; measured on meta)."""
SEED_OFFSET_BYTES = 16
"""Efficient and cuDNN kernels keep an int64 philox seed and offset, () each."""
FLASH_RNG_STATE_BYTES = 24
"""CUDA flash kernel: rng_state (2,) uint64 + an unused () uint64 kept for backward
(torch 2.13 torch/_meta_registrations.py `meta__scaled_dot_product_flash_attention`)."""
CUDA_MASK_BYTES = 1
"""aten::native_dropout (CUDA) keeps a torch.bool mask."""

ImplementationName = Literal["megatron", "hf-eager", "hf-sdpa"]
PrecisionMode = Literal["fp32", "bf16", "fp16", "autocast-bf16", "autocast-fp16"]
IMPLEMENTATIONS: tuple[str, ...] = ("megatron", "hf-eager", "hf-sdpa")
PRECISION_MODES: tuple[str, ...] = ("fp32", "bf16", "fp16", "autocast-bf16", "autocast-fp16")


class Implementation(Frozen):
    """How the model is run: which code saves the activations, in which precision mode."""

    name: ImplementationName = "megatron"
    precision: PrecisionMode = "bf16"
    device: Literal["cuda", "cpu"] = "cuda"
    """Kernels differ: CPU dropout keeps a mask in the activation dtype (aten `_dropout_impl`),
    CPU LayerNorm keeps its statistics in the input dtype, CPU autocast runs `pow` in bf16."""
    composite_gelu: bool = True
    """GPT-2's `gelu_new` (activations.py NewGELUActivation: tanh formula in Python ops, four
    saved tensors); False for `gelu` / `gelu_pytorch_tanh` (one aten op, keeps its input)."""
    recompute: Literal["none", "full"] = "none"
    """`full`: HF gradient checkpointing, each block keeps only its input."""
    sdpa_backend: Literal["flash", "efficient", "cudnn"] = "flash"
    """The fused kernel SDPA dispatches to on CUDA (flash needs fp16/bf16; fp32 takes efficient,
    which has no GQA: torch's sdp_utils.cpp `check_batch_size_and_num_heads_dense<false>`). The
    CPU has only its flash kernel."""
    attention_dropout: bool | None = None
    """Dropout on the attention probabilities (GPT-2 `attn_pdrop`, Llama `attention_dropout`);
    None: the model's `dropout` flag (which also covers residual and embedding dropout)."""

    router_groups: int = Field(default=8, gt=0)
    """DeepSeek-V3 router (MLA MoE models): expert groups `n_group` (DeepSeek-V3 config.json: 8)."""
    router_topk_groups: int = Field(default=4, gt=0)
    """DeepSeek-V3 router: groups kept per token `topk_group` (DeepSeek-V3 config.json: 4)."""

    def attn_dropout(self, model: ModelSpec) -> bool:
        return model.dropout if self.attention_dropout is None else self.attention_dropout


def dtype_bytes(impl: Implementation) -> tuple[int, int]:
    """(residual-stream bytes, compute bytes): fp32 4/4, bf16 and fp16 2/2, autocast 4/2 (the
    weights and the residual stream stay fp32, matmuls run in 16 bits)."""
    if impl.precision == "fp32":
        return FP32_BYTES, FP32_BYTES
    if impl.precision.startswith("autocast"):
        return FP32_BYTES, 2
    return 2, 2


def _autocast(impl: Implementation) -> bool:
    return impl.precision.startswith("autocast")


def _mask_bytes(impl: Implementation, elem_bytes: int) -> int:
    """A dropout mask element: torch.bool on CUDA (native_dropout); on CPU ATen's
    `_dropout_impl` multiplies by a noise tensor of the input dtype and keeps that."""
    return CUDA_MASK_BYTES if impl.device == "cuda" else elem_bytes


# --------------------------------------------------------------------------- norms


def rmsnorm_saved_bytes(prefix: str, tokens, hidden: int, impl: Implementation) -> dict[str, int]:
    """LlamaRMSNorm.forward (models/llama/modeling_llama.py): `x.to(float32)` -> `pow(2)` keeps
    the fp32 x, `x * rsqrt(var + eps)` keeps x (same storage) and rstd (fp32, one per token),
    `weight * normed.to(input_dtype)` keeps the normalised tensor in the residual dtype."""
    resid, _ = dtype_bytes(impl)
    return {f"{prefix}.input": tokens * hidden * FP32_BYTES,
            f"{prefix}.stats": tokens * FP32_BYTES,
            f"{prefix}.normalized": tokens * hidden * resid}


def layernorm_saved_bytes(prefix: str, tokens, hidden: int, impl: Implementation) -> dict[str, int]:
    """nn.LayerNorm -> aten::native_layer_norm keeps its input, mean and rstd. CUDA keeps the
    statistics in the accumulate type (fp32); CPU in the input dtype (measured)."""
    resid, _ = dtype_bytes(impl)
    stats = FP32_BYTES if impl.device == "cuda" else resid
    return {f"{prefix}.input": tokens * hidden * resid, f"{prefix}.stats": 2 * tokens * stats}


def _norm(prefix: str, model: ModelSpec, tokens, impl: Implementation) -> dict[str, int]:
    if model.norm == "rmsnorm":
        return rmsnorm_saved_bytes(prefix, tokens, model.hidden_size, impl)
    return layernorm_saved_bytes(prefix, tokens, model.hidden_size, impl)


def _linear_inputs(name: str, tokens, width: int, uses: int, impl: Implementation) -> dict[str, int]:
    """A tensor feeding `uses` separate linears. Without autocast they share one storage; under
    autocast each linear casts its input to 16 bits itself (only leaf weights are cached), so
    each keeps its own copy."""
    _, c = dtype_bytes(impl)
    copies = uses if _autocast(impl) else 1
    return {name: copies * tokens * width * c}


# --------------------------------------------------------------------------- attention


def sdpa_uses_gqa(model: ModelSpec, seq_len: int) -> bool:
    """integrations/sdpa_attention.py `use_gqa_in_sdpa` (CUDA / CPU path): no mask and
    head_dim <= 256; causal training without padding passes no mask (`is_causal=True`).
    Otherwise `repeat_kv` copies K, V to the query heads. A sliding window shorter than the
    sequence needs an explicit mask, which the flash kernel does not take: not modelled."""
    if model.sliding_window is not None and model.sliding_window < seq_len:
        raise PlanInputError("implementation", f"hf-sdpa with a sliding window ({model.sliding_window}) "
                             f"shorter than seq_len ({seq_len}) passes a mask to SDPA; not modelled")
    return model.head_size <= 256


def hf_attention_saved_bytes(model: ModelSpec, impl: Implementation, seq_len: int,
                             micro_batch) -> dict[str, int]:
    """Self-attention of a Llama-family or GPT-2 block in transformers.

    eager (models/llama/modeling_llama.py `eager_attention_forward`, models/gpt2/modeling_gpt2.py
    `eager_attention_forward`): `repeat_kv` copies K, V to the query heads; the two matmuls keep
    Q, K, the probabilities and V; Llama's softmax runs in fp32 then `.to(query.dtype)` (a second
    copy when that is 16-bit); GPT-2's softmax runs in the scores' dtype (fp32 under autocast,
    whose fp32 list has softmax) then `.type(value.dtype)`; attention dropout keeps mask + output.
    sdpa (flash kernel on CUDA and CPU): q, k, v, out and an fp32 log-sum-exp (b, a, s).
    """
    if model.is_mla:
        return hf_mla_attention_saved_bytes(model, impl, seq_len, micro_batch)
    _, c = dtype_bytes(impl)
    b, s, d, a = micro_batch, seq_len, model.head_size, model.num_heads
    rotary = model.position == "rotary"
    out = _linear_inputs("attn.qkv_input", s * b, model.hidden_size, 3 if rotary else 1, impl)
    if impl.name == "hf-sdpa":
        if impl.attn_dropout(model) and impl.device == "cpu":
            raise PlanInputError("implementation", "hf-sdpa with attention dropout on CPU runs "
                                 "the math backend, which is not modelled; set the dropout to 0")
        kv = model.kv_heads if sdpa_uses_gqa(model, s) else a
        out |= {"attn.q": s * b * a * d * c, "attn.k": s * b * kv * d * c,
                "attn.v": s * b * kv * d * c} | _sdpa_kernel_extras(impl, a, kv, s, b)
    else:
        probs = s * s * b * a
        soft = FP32_BYTES if (rotary or _autocast(impl)) else c
        out |= {"attn.q": s * b * a * d * c, "attn.k": s * b * a * d * c,
                "attn.softmax_output": probs * soft}
        if soft != c and not impl.attn_dropout(model):  # with dropout the cast feeds dropout, which keeps only its mask
            out["attn.softmax_cast"] = probs * c
        if impl.attn_dropout(model):
            out["attn.softmax_dropout_mask"] = probs * _mask_bytes(impl, c)
            out["attn.softmax_dropout_output"] = probs * c
        out["attn.v"] = s * b * a * d * c
    out["attn.proj_input"] = s * b * a * d * c
    if model.dropout and not rotary:
        out["attn.dropout_mask"] = s * b * model.hidden_size * _mask_bytes(impl, c)
    return out


def _latent_rmsnorm(prefix: str, tokens, width: int, c: int) -> dict[str, int]:
    """DeepseekV3RMSNorm over a latent that a linear produced (dtype `c`): the fp32 input kept by
    `pow`, fp32 rstd, the normalised tensor cast back to the input dtype `c`."""
    return {f"{prefix}.input": tokens * width * FP32_BYTES, f"{prefix}.stats": tokens * FP32_BYTES,
            f"{prefix}.normalized": tokens * width * c}


def hf_mla_attention_saved_bytes(model: ModelSpec, impl: Implementation, seq_len: int,
                                 micro_batch) -> dict[str, int]:
    """transformers' DeepseekV3Attention (models/deepseek_v3/modeling_deepseek_v3.py, 5.23.0),
    T = s·b tokens, a heads, dq = qk_nope + qk_rope, dv = v_head_dim, c the compute dtype.

    The norm output feeds q_a_proj (or q_proj) and kv_a_proj_with_mqa (two linears: one storage,
    two 16-bit copies under autocast). q path: q_a_layernorm keeps its fp32 input, rstd and the
    normalised latent; q_b_proj its input `weight * normed` (T, r_q). kv path: kv_a_layernorm
    runs on the r_kv split of kv_a_proj_with_mqa's output: in fp32 `.to(float32)` is no copy, so
    `pow` keeps the whole (T, r_kv + qk_rope) output; otherwise an fp32 copy of (T, r_kv);
    kv_b_proj keeps its input (T, r_kv). Rope multiplies views by cos and sin (kept once for the
    model, `hf_outside_saved_bytes`); `torch.cat` builds the query, `expand_kv` a new key, both
    (b, a, s, dq); value is a view of kv_b_proj's output (b, s, a, qk_nope + dv).
    eager: the two matmuls keep q and k, the fp32 softmax (and its cast to c), and v: a
    contiguous copy (b·a, s, dv) when b > 1, the view itself (kv_b's whole output) when b = 1.
    sdpa (CPU flash kernel, dq = dv only): q, k, the value view (its whole
    storage, T·a·(qk_nope + dv)), out and the fp32 log-sum-exp. o_proj keeps (T, a·dv) (under
    sdpa a second copy, measured).
    """
    _, c = dtype_bytes(impl)
    b, s, a = micro_batch, seq_len, model.num_heads
    T, dq, dv = s * b, model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim
    r_kv = model.kv_lora_rank or 0
    out = _linear_inputs("attn.qkv_input", T, model.hidden_size, 2, impl)
    if model.q_lora_rank is not None:
        out |= _latent_rmsnorm("attn.q_norm", T, model.q_lora_rank, c)
        out["attn.q_up_input"] = T * model.q_lora_rank * c
    out |= _latent_rmsnorm("attn.kv_norm", T, r_kv, c)
    if impl.precision == "fp32":  # pow keeps the split view: the whole kv_a_proj output
        out["attn.kv_norm.input"] = T * (r_kv + model.qk_rope_head_dim) * FP32_BYTES
    out["attn.kv_up_input"] = T * r_kv * c
    out |= {"attn.q": T * a * dq * c, "attn.k": T * a * dq * c}
    if impl.name == "hf-sdpa":
        if dq != dv or impl.device != "cpu" or impl.attn_dropout(model):
            raise PlanInputError("implementation", "hf-sdpa with multi-head latent attention is "
                                 "modelled for the CPU flash kernel with qk_nope + qk_rope = "
                                 f"v_head_dim and no dropout (got {dq} and {dv}); use hf-eager")
        out["attn.v"] = T * a * (model.qk_nope_head_dim + dv) * c
        out |= _sdpa_kernel_extras(impl, a, a, s, b)
    else:
        if impl.attn_dropout(model):
            raise PlanInputError("implementation", "hf-eager MLA with attention dropout is not "
                                 "modelled; set attention_dropout to 0")
        out["attn.softmax_output"] = T * a * s * FP32_BYTES
        if c != FP32_BYTES:
            out["attn.softmax_cast"] = T * a * s * c
        # the value view (b, a, s, dv) of kv_b's output folds into bmm's (b·a, s, dv) without a copy
        # only when b = 1 (then bmm keeps the view: kv_b's whole output); b > 1 copies it
        out["attn.v"] = T * a * (dv + (micro_batch == 1) * model.qk_nope_head_dim) * c
    # sdpa: the kernel's output and o_proj's input are two storages here (measured on CPU,
    # tiny DeepSeek-V3, bf16/fp32/autocast; unlike Llama, where they are one); cause not traced
    out["attn.proj_input"] = (2 if impl.name == "hf-sdpa" else 1) * T * a * dv * c
    return out


def _sdpa_kernel_extras(impl: Implementation, heads: int, kv: int, s: int, b) -> dict[str, int]:
    """Log-sum-exp and RNG state of the fused kernel (what autograd keeps besides q, k, v, out;
    torch 2.13 derivatives of `_scaled_dot_product_{flash,efficient,cudnn}_attention`, shapes
    from their meta kernels, measured on meta): flash (b, a, s) + rng 24 B on CUDA; efficient
    (b, a, ⌈s/32⌉·32) + seed/offset 16 B; cuDNN (b, a, s, 1) + seed/offset 16 B."""
    backend = impl.sdpa_backend
    if impl.device == "cpu":
        if backend != "flash":
            raise PlanInputError("sdpa_backend", f"{backend} is a CUDA kernel; the CPU runs flash")
        return {"attn.softmax_lse": heads * s * b * FP32_BYTES}
    if backend == "efficient":
        if kv != heads:
            raise PlanInputError("sdpa_backend", "efficient attention has no grouped-query support; "
                                 "SDPA falls back to the math backend, which is not modelled")
        padded = -(-s // EFFICIENT_LSE_BLOCK) * EFFICIENT_LSE_BLOCK
        return {"attn.softmax_lse": heads * padded * b * FP32_BYTES, "attn.rng_state": SEED_OFFSET_BYTES}
    rng = FLASH_RNG_STATE_BYTES if backend == "flash" else SEED_OFFSET_BYTES
    return {"attn.softmax_lse": heads * s * b * FP32_BYTES, "attn.rng_state": rng}


# --------------------------------------------------------------------------- MLP


def hf_mlp_saved_bytes(model: ModelSpec, impl: Implementation, seq_len: int,
                       micro_batch, moe: bool | None = None) -> dict[str, int]:
    """LlamaMLP `down(act(gate(x)) * up(x))`: SiLU keeps its input, the product both operands,
    down its input. GPT2MLP `c_proj(act(c_fc(x)))` with `gelu_new` = 0.5·x·(1 + tanh(√(2/π)·
    (x + 0.044715·x³))) in Python ops: pow keeps x, tanh its result, the last product both
    operands (0.5·x and 1 + tanh). Under CUDA autocast `pow` is on the fp32 list, so x is kept
    as an fp32 copy and tanh, 1 + tanh run in fp32; CPU autocast leaves them in 16 bits."""
    if model.is_moe if moe is None else moe:
        return hf_moe_saved_bytes(model, impl, seq_len, micro_batch)
    _, c = dtype_bytes(impl)
    n = seq_len * micro_batch * model.ffn_hidden_size
    h = model.hidden_size
    if model.mlp == "swiglu":
        out = _linear_inputs("mlp.fc1_input", seq_len * micro_batch, h, 2, impl)
        return out | {"mlp.act_input": n * c, "mlp.act_output": n * c,
                      "mlp.up_output": n * c, "mlp.fc2_input": n * c}
    out = _linear_inputs("mlp.fc1_input", seq_len * micro_batch, h, 1, impl)
    if not impl.composite_gelu:
        out["mlp.act_input"] = n * c
    else:
        wide = FP32_BYTES if (_autocast(impl) and impl.device == "cuda") else c
        out |= {"mlp.act_input": n * wide, "mlp.act_tanh": n * wide,
                "mlp.act_one_plus_tanh": n * wide, "mlp.act_half_input": n * c}
    out["mlp.fc2_input"] = n * c
    if model.dropout:
        out["mlp.dropout_mask"] = seq_len * micro_batch * h * _mask_bytes(impl, c)
    return out


def hf_moe_saved_bytes(model: ModelSpec, impl: Implementation, seq_len: int,
                       micro_batch) -> dict[str, int]:
    """Mixtral's sparse MoE block with transformers' default experts implementation, `grouped_mm`
    (models/mixtral/modeling_mixtral.py MixtralTopKRouter, MixtralSparseMoeBlock;
    integrations/moe.py `grouped_mm_experts_forward`); K = k·s·b routed token copies.

    Router: the linear keeps its input (the norm output), softmax(logits.float()) its fp32
    output (s·b, E), topk its int64 indices (s·b, k), the in-place renormalisation `/=` the fp32
    top-k values and their sum. Experts: three int64 index vectors of K (`hidden[perm // k]`,
    `weights[perm]`, the inverse permutation), the int32 group offsets (E), the sorted input
    (K, h), the gate_up output (K, 2f: SiLU keeps the gate half, the product the up half), the
    SiLU output and the product (K, f), and `proj_out * weights`: the expert output (K, h) and
    the fp32 weights (K, 1). Under autocast the router casts its input (and weight) to 16 bits;
    `torch._grouped_mm` is on no autocast list (torch 2.13 ATen/autocast_mode.h), so the experts
    run in fp32 (measured on CPU; CUDA autocast is refused, not measured).
    """
    if _autocast(impl) and impl.device == "cuda":
        raise PlanInputError("precision", "the transformers MoE inventory under CUDA autocast is "
                             "not modelled (measured on CPU only); use bf16 or fp16 weights")
    resid, c = dtype_bytes(impl)
    x = resid  # grouped_mm is on no autocast list (ATen/autocast_mode.h): experts run in fp32
    tokens = seq_len * micro_batch
    k, experts, f, h = model.experts_per_token, model.num_experts, model.expert_ffn_size, model.hidden_size
    routed = k * tokens
    if model.is_mla:
        router = deepseek_v3_router_saved_bytes(model, impl, tokens)
    else:
        router = {"mlp.fc1_input": tokens * h * c,
                  "moe.router_probs": tokens * experts * FP32_BYTES,
                  "moe.topk_indices": tokens * k * INDEX_BYTES,
                  "moe.topk_values": tokens * k * FP32_BYTES,
                  "moe.topk_sum": tokens * FP32_BYTES,
                  "moe.routing_weights": routed * FP32_BYTES}
    return router | {
        "moe.indices": 3 * routed * INDEX_BYTES,
        "moe.offsets": experts * 4,
        "moe.expert_input": routed * h * x,
        "moe.expert.gate_up_output": routed * 2 * f * x,
        "moe.expert.act_output": routed * f * x,
        "moe.expert.fc2_input": routed * f * x,
        "moe.expert_output": routed * h * x,
    }


def deepseek_v3_router_saved_bytes(model: ModelSpec, impl: Implementation, tokens) -> dict[str, int]:
    """DeepseekV3TopkRouter and the shared experts of DeepseekV3MoE (models/deepseek_v3/
    modeling_deepseek_v3.py, transformers 5.23.0), T = `tokens`, E experts, G = n_group groups.

    The router computes in `r` = fp32 (`F.linear(x.type(float32), weight.type(float32))`; under
    autocast the linear runs in 16 bits, so r = 16 bits): the linear keeps its fp32 input (no copy
    when the block runs fp32, the one storage the shared experts read too) and, with 16-bit
    weights, the fp32 copy of its weight E x h; sigmoid keeps its output (T, E) (also gather's
    source); topk(2) per group keeps int64 (T, G, 2), the group topk int64 (T, topk_group),
    masked_fill its bool mask (T, E), the final topk / gather int64 (T, k); the in-place `/=`
    the top-k weights (T, k) and their sum (T, 1); `* routed_scaling_factor` makes the routing
    weights (T·k, 1) the experts multiply by. Shared experts: a DeepseekV3MLP of width
    n_shared·f_moe (SiLU input, SiLU output, up output, down input) whose gate and up linears read
    the block input (one more 16-bit storage in bf16, two casts under autocast).
    """
    resid, c = dtype_bytes(impl)
    auto = _autocast(impl)
    r = c if auto else FP32_BYTES
    h, e, k = model.hidden_size, model.num_experts, model.experts_per_token
    g, fs = impl.router_groups, model.num_shared_experts * model.expert_ffn_size
    shared_inputs = 2 if auto else (0 if resid == FP32_BYTES else 1)  # beyond the router's input
    out = {"mlp.fc1_input": tokens * h * (c if auto else FP32_BYTES) + shared_inputs * tokens * h * c}
    if not auto and resid != FP32_BYTES:
        out["moe.router_weight_cast"] = e * h * FP32_BYTES
    out |= {"moe.router_probs": tokens * e * r,
            "moe.group_topk_indices": (g * 2 + impl.router_topk_groups) * tokens * INDEX_BYTES,
            "moe.group_mask": tokens * e,
            "moe.topk_indices": tokens * k * INDEX_BYTES,
            "moe.topk_values": tokens * k * r, "moe.topk_sum": tokens * r,
            "moe.routing_weights": k * tokens * r}
    if fs:
        n = tokens * fs * c
        out |= {"moe.shared.act_input": n, "moe.shared.act_output": n, "moe.shared.up_output": n,
                "moe.shared.fc2_input": n}
    return out


def attention_linear_weights(model: ModelSpec) -> int:
    """Weight-matrix elements of one block's attention linears. MLA (DeepseekV3Attention):
    q_a h x r_q + q_b r_q x a·dq (or q_proj h x a·dq), kv_a h x (r_kv + qk_rope),
    kv_b r_kv x a·(qk_nope + dv), o a·dv x h."""
    h, a = model.hidden_size, model.num_heads
    if not model.is_mla:
        d = model.head_size
        return h * a * d * 2 + h * model.kv_heads * d * 2
    dq, dv, r_kv = model.qk_nope_head_dim + model.qk_rope_head_dim, model.v_head_dim, model.kv_lora_rank or 0
    r_q = model.q_lora_rank
    q = h * a * dq if r_q is None else h * r_q + r_q * a * dq
    return q + h * (r_kv + model.qk_rope_head_dim) + r_kv * a * (model.qk_nope_head_dim + dv) + a * dv * h


def block_linear_weights(model: ModelSpec, moe: bool | None = None) -> int:
    """Weight-matrix elements of one block's linears (what autocast casts to 16 bits); `moe`:
    an MoE or a dense block (None: MoE when the model has experts)."""
    h = model.hidden_size
    attn = attention_linear_weights(model)
    if model.is_moe if moe is None else moe:  # the router linear; the experts' grouped_mm is not autocast
        shared = 3 * h * model.num_shared_experts * model.expert_ffn_size if model.is_mla else 0
        return attn + h * model.num_experts + shared  # DeepSeek-V3: + the shared experts' MLP
    mats = 3 if model.mlp == "swiglu" else 2
    return attn + mats * h * model.ffn_hidden_size


# --------------------------------------------------------------------------- one block


def _check(model: ModelSpec, impl: Implementation, seq_len: int, micro_batch) -> None:
    if seq_len <= 0:
        raise PlanInputError("seq_len", f"must be a positive integer (got {seq_len})")
    if np.any(np.asarray(micro_batch) <= 0):
        raise PlanInputError("micro_batch", f"must be positive integers (got {micro_batch})")
    if impl.name != "megatron" and model.arch != "decoder":
        raise PlanInputError("implementation", f"{impl.name} covers decoders only (got {model.arch})")


def hf_block_saved_bytes(model: ModelSpec, impl: Implementation, seq_len: int,
                         micro_batch, moe: bool | None = None) -> dict[str, int]:
    """One transformers decoder block (LlamaDecoderLayer / GPT2Block / DeepseekV3DecoderLayer),
    before recompute; `moe`: an MoE or a dense block (None: MoE when the model has experts)."""
    _check(model, impl, seq_len, micro_batch)
    tokens = seq_len * micro_batch
    out = (_norm("norm1", model, tokens, impl)
           | hf_attention_saved_bytes(model, impl, seq_len, micro_batch)
           | _norm("norm2", model, tokens, impl)
           | hf_mlp_saved_bytes(model, impl, seq_len, micro_batch, moe))
    if _autocast(impl):
        out["autocast.weight_casts"] = block_linear_weights(model, moe) * dtype_bytes(impl)[1]
    return out


def block_saved_bytes(model: ModelSpec, impl: Implementation, seq_len: int, micro_batch,
                      layout: Layout | None = None, moe: bool | None = None) -> dict[str, int]:
    """What one block keeps for backward under `impl`: megatron -> activations.py's inventory
    (with `layout`: tp, sequence parallel, flash, Tempo, selective recompute); hf-* -> the
    transformers inventory, or the block input alone under HF gradient checkpointing."""
    if impl.name == "megatron":
        if impl.precision.startswith("autocast"):
            raise PlanInputError("precision", "megatron runs 16-bit weights (bf16, fp16) or fp32, not autocast")
        layout = layout or Layout()
        e = dtype_bytes(impl)[1]
        if layout.recompute == "none":
            return activations.layer_saved_bytes(model, layout, seq_len, micro_batch, e)
        return {"block": activations.layer_activation_bytes(model, layout, seq_len, micro_batch, e)}
    if layout is not None and layout.tp != 1:
        raise PlanInputError("tp", f"{impl.name} runs without tensor parallelism (got tp={layout.tp})")
    if impl.recompute == "full":
        return {"checkpoint.block_input": seq_len * micro_batch * model.hidden_size * dtype_bytes(impl)[0]}
    return hf_block_saved_bytes(model, impl, seq_len, micro_batch, moe)


# --------------------------------------------------------------------------- outside the blocks


def hf_outside_saved_bytes(model: ModelSpec, impl: Implementation, seq_len: int,
                           micro_batch) -> dict[str, int]:
    """Saved once per forward outside the blocks (a single-GPU causal LM with its loss).

    Embedding lookup keeps the int64 ids (GPT-2 also its wpe position ids, shape (1, s));
    GPT-2's embedding dropout a mask; Llama's rotary cos and sin (1, 1, s, d) in the residual
    dtype, kept by the first layer's products and shared by all; the final norm; the head's input
    (a 16-bit cast under autocast, plus the cast head weight); `ForCausalLMLoss`
    (loss/loss_utils.py): `logits.float()`, cross_entropy keeps the fp32 log-softmax (b·s, V),
    the int64 targets (`nn.functional.pad(labels, (0, 1))[..., 1:]`: the padded storage of
    s + 1 ids when b = 1, a b·s copy otherwise) and a 0-dim fp32 total weight.
    """
    _check(model, impl, seq_len, micro_batch)
    resid, c = dtype_bytes(impl)
    s, h, tokens = seq_len, model.hidden_size, seq_len * micro_batch
    out = {"embedding.token_ids": tokens * INDEX_BYTES}
    if model.position == "learned":
        out["embedding.position_ids"] = s * INDEX_BYTES
    else:
        rope = model.qk_rope_head_dim if model.is_mla else model.head_size  # MLA: rope part only
        out["rotary.cos_sin"] = 2 * s * rope * resid
    if model.dropout and model.position == "learned":
        out["embedding.dropout_mask"] = tokens * h * _mask_bytes(impl, resid)
    if model.final_norm:
        out |= _norm("final_norm", model, tokens, impl)
    out["head.input"] = tokens * h * c
    if _autocast(impl):
        out["autocast.head_weight_cast"] = model.vocab_size * h * c
    out["loss.log_softmax"] = tokens * model.vocab_size * FP32_BYTES
    # labels padded to s + 1 then `[..., 1:]`: a view (s + 1 ids) when b = 1, a copy when b > 1
    out["loss.targets"] = tokens * INDEX_BYTES + (micro_batch == 1) * INDEX_BYTES
    out["loss.total_weight"] = FP32_BYTES
    return out


def model_saved_bytes(model: ModelSpec, impl: Implementation, seq_len: int, micro_batch,
                      num_layers: int | None = None) -> int:
    """A whole single-GPU transformers forward: num_layers blocks (default the model's) + the
    outside extras. Megatron's stages have their own account (activations.stage_activations)."""
    if impl.name == "megatron":
        raise PlanInputError("implementation", "megatron's per-stage extras live in "
                             "activations.stage_activations; model_saved_bytes covers hf-*")
    n = model.num_layers if num_layers is None else num_layers
    kinds = [model.layer_is_moe(i) for i in range(n)]  # dense / MoE (first_dense_layers, moe_layer_step)
    blocks = {moe: sum(block_saved_bytes(model, impl, seq_len, micro_batch, moe=moe).values())
              for moe in set(kinds)}
    return (sum(blocks[moe] for moe in kinds)
            + sum(hf_outside_saved_bytes(model, impl, seq_len, micro_batch).values()))


# --------------------------------------------------------------------------- the plan's view


def precision_mode(recipe: PrecisionRecipe) -> PrecisionMode:
    """The precision mode a recipe runs: `autocast-*` recipes (fp32 weights under autocast),
    fp32, else the 16-bit compute dtype (bf16 / fp16 weights, fp32 master as a model state)."""
    if recipe.name.startswith("autocast-"):
        return f"autocast-{recipe.compute_dtype}"  # type: ignore[return-value]
    if recipe.compute_dtype in ("fp32", "tf32"):
        return "fp32"
    if recipe.compute_dtype not in ("bf16", "fp16"):
        raise PlanInputError("precision", f"{recipe.name} computes in {recipe.compute_dtype}; "
                             "transformers' inventories cover fp32, bf16, fp16 and autocast")
    return recipe.compute_dtype  # type: ignore[return-value]


def setup_implementation(setup: TrainSetup, recompute: str) -> Implementation:
    """The Implementation a TrainSetup runs (CUDA kernels; HF checkpointing when `recompute`
    is `full`). Only for setup.implementation hf-*; megatron goes through activations.py."""
    if recompute not in ("none", "full"):
        raise PlanInputError("recompute", f"{setup.implementation} has no {recompute} recompute: "
                             "none, or full (gradient checkpointing)")
    return Implementation(name=setup.implementation, precision=precision_mode(setup.precision),
                          recompute=recompute)  # type: ignore[arg-type]


def hf_activation_bytes(model: ModelSpec, setup: TrainSetup, recompute: str,
                        micro_batch) -> tuple[int, int, int]:
    """(one block kept, outside the blocks, recompute working) bytes of a transformers model on
    one GPU (tp = pp = 1): the block under `recompute`, `hf_outside_saved_bytes` (embedding,
    final norm, head, loss) and, under full recompute, one block's whole inventory
    re-materialised during its backward."""
    impl = setup_implementation(setup, recompute)
    s = setup.seq_len
    block = sum(block_saved_bytes(model, impl, s, micro_batch).values())
    outside = sum(hf_outside_saved_bytes(model, impl, s, micro_batch).values())
    working = 0
    if recompute == "full":
        whole = impl.model_copy(update={"recompute": "none"})
        working = sum(hf_block_saved_bytes(model, whole, s, micro_batch).values())
    return block, outside, working
