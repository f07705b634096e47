"""FLOPs of training: per block, per step, whole runs, and utilisation (MFU / HFU).

A matmul of (B x N) by (N x M) costs 2·B·N·M FLOPs forward and twice that backward (seed 004
§1.1): training ≈ 6 FLOPs per parameter per token. One GPT block forward on B sequences of s
tokens: 24·B·s·h² + 4·B·s²·h (seed 004 §1.2.3); logits 2·B·s·h·V (seed 004 §1.2.4).
Causal attention is counted over the full s x s scores, as the seed, Megatron (Narayanan et al.
2021 eq. 3) and PaLM's MFU (Chowdhery et al. 2022, appendix B) do; sliding windows likewise.
Element-wise work (softmax, norms, activations) is neglected, as in the seed.
Seed and paper citations: docs/references.md
"""

from __future__ import annotations

import numpy as np

from planner.core.errors import PlanInputError
from planner.core.params import layers_per_stage
from planner.core.spec import Frozen, Layout, ModelSpec, TrainSetup

SECONDS_PER_DAY = 86_400
SECONDS_PER_HOUR = 3_600


def attention_linear_flops(model: ModelSpec, tokens: float) -> float:
    """Q, K, V and output projections: 2·tokens·h·(a·d + 2·kv·d) + 2·tokens·(a·d)·h.
    MHA with a·d = h: 8·tokens·h² (seed 004 §1.2.1 ① and ③); GQA shrinks K and V.
    MLA: 2·tokens per weight of its five projections (`mla_linear_flops`)."""
    if model.is_mla:
        return mla_linear_flops(model, tokens)
    h, d = model.hidden_size, model.head_size
    qkv = 2 * tokens * h * (model.num_heads + 2 * model.kv_heads) * d
    out = 2 * tokens * model.num_heads * d * h
    return qkv + out


def mla_linear_flops(model: ModelSpec, tokens: float) -> float:
    """MLA projections as trained (no weight absorption): 2·tokens·(h·r_q + r_q·a·(nope+rope)
    + h·(r_kv+rope) + r_kv·a·(nope+v) + a·v·h); without q_lora_rank the query is h·a·(nope+rope)
    (DeepSeek-V2 paper §2.1.2-2.1.3, eqs. 9-19)."""
    h, a = model.hidden_size, model.num_heads
    r_kv, rope, nope, v = model.kv_lora_rank or 0, model.qk_rope_head_dim, model.qk_nope_head_dim, model.v_head_dim
    if model.q_lora_rank is None:
        query = h * a * (nope + rope)
    else:
        query = h * model.q_lora_rank + model.q_lora_rank * a * (nope + rope)
    weights = query + h * (r_kv + rope) + r_kv * a * (nope + v) + a * v * h
    return 2 * tokens * weights


def attention_core_flops(model: ModelSpec, batch: float, seq_len: int) -> float:
    """QKᵀ and scores·V: 2·B·s²·(a·d) each -> 4·B·s²·h for MHA (seed 004 §1.2.1 ②), full s².
    MLA: QKᵀ over a·(nope + rope), scores·V over a·v: 2·B·s²·a·(nope + rope + v)."""
    if model.is_mla:
        width = model.num_heads * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim)
    else:
        width = 2 * model.num_heads * model.head_size
    return 2 * batch * seq_len * seq_len * width


def mlp_flops(model: ModelSpec, tokens: float, width: int) -> float:
    """One MLP of inner width f: GELU 2 matrices 4·tokens·h·f (16·tokens·h² at f = 4h, seed 004
    §1.2.2); SwiGLU 3 matrices (gate, up, down) 6·tokens·h·f."""
    matrices = 3 if model.mlp == "swiglu" else 2
    return 2 * matrices * tokens * model.hidden_size * width


def moe_flops(model: ModelSpec, tokens: float) -> float:
    """MoE layer: router 2·tokens·h·E + top-k routed experts + shared experts per token
    (+ Qwen2-MoE's shared-expert gate 2·tokens·h)."""
    gate = 2 * tokens * model.hidden_size if model.shared_expert_gate else 0
    router = 2 * tokens * model.hidden_size * model.num_experts + gate
    experts = (model.experts_per_token + model.num_shared_experts) * mlp_flops(
        model, tokens, model.expert_ffn_size)
    return router + experts


def layer_forward_flops(model: ModelSpec, batch: float, seq_len: int,
                        moe: bool | None = None) -> float:
    """One block forward on `batch` sequences: GPT 24·B·s·h² + 4·B·s²·h (seed 004 §1.2.3).
    `moe` picks the MoE or the dense block; None: MoE when the model has experts."""
    tokens = batch * seq_len
    moe = model.is_moe if moe is None else moe
    mlp = moe_flops(model, tokens) if moe else mlp_flops(model, tokens, model.ffn_hidden_size)
    return attention_linear_flops(model, tokens) + attention_core_flops(model, batch, seq_len) + mlp


def blocks_forward_flops(model: ModelSpec, batch: float, seq_len: int) -> float:
    """Every block forward: MoE blocks and dense blocks (first_dense_layers, moe_layer_step)."""
    num_moe = model.num_moe_layers
    dense = (model.num_layers - num_moe) * layer_forward_flops(model, batch, seq_len, moe=False)
    return dense + (num_moe * layer_forward_flops(model, batch, seq_len, moe=True) if num_moe else 0)


def mtp_forward_flops(model: ModelSpec, batch: float, seq_len: int) -> float:
    """DeepSeek-V3 multi-token prediction, per module: the 2h -> h projection 4·B·s·h², one MoE
    block and its logits 2·B·s·h·V (report §2.2; the depth-k module sees the same s tokens)."""
    if not model.mtp_modules:
        return 0.0
    projection = 2 * batch * seq_len * 2 * model.hidden_size * model.hidden_size
    block = layer_forward_flops(model, batch, seq_len, moe=True)
    return model.mtp_modules * (projection + block + logits_flops(model, batch, seq_len))


def logits_flops(model: ModelSpec, batch: float, seq_len: int) -> float:
    """Output projection to the vocabulary: 2·B·s·h·V (seed 004 §1.2.4)."""
    return 2 * batch * seq_len * model.hidden_size * model.vocab_size


def forward_flops(model: ModelSpec, batch: float, seq_len: int) -> float:
    """Whole model forward: L·(24·B·s·h² + 4·B·s²·h) + 2·B·s·h·V (seed 004 §1.3), plus the
    multi-token-prediction modules a DeepSeek-V3 run trains with."""
    return (blocks_forward_flops(model, batch, seq_len) + logits_flops(model, batch, seq_len)
            + mtp_forward_flops(model, batch, seq_len))


def recompute_flops(model: ModelSpec, layout: Layout, batch: float, seq_len: int) -> float:
    """Extra forward work of activation recompute and of flash attention's backward.

    full / every_k: one more forward of every block (each segment re-runs once; seed 004 §1.4,
    the 8PD rule). block: one more forward of the `recomputed_blocks` (their share of the
    blocks' forward; a named approximation for models mixing dense and MoE blocks). selective:
    the attention core, QKᵀ and scores·V, 4·B·s²·(a·d) per block (Korthikanti §5). Flash
    attention's backward recomputes S = QKᵀ (Dao 2023, FlashAttention-2 §3.1.2 / Algorithm 2):
    2·B·s²·(a·d) per block, on top of any recompute.
    """
    layers = model.num_layers
    if layout.recompute in ("full", "every_k", "block"):
        extra = blocks_forward_flops(model, batch, seq_len) * recomputed_blocks(
            layers, layout.recompute, layout.recompute_num_layers or 0, layout.pp,
            layout.virtual_stages, layout.first_stage_layers or 0,
            layout.last_stage_layers or 0) / layers
    elif layout.recompute == "selective":
        extra = layers * attention_core_flops(model, batch, seq_len)
    else:
        extra = 0.0
    if layout.flash_attention:
        extra += layers * attention_core_flops(model, batch, seq_len) / 2
    return extra


def recomputed_blocks(num_layers: int, recompute: str, recompute_num_layers: int, pp: int,
                      virtual_stages: int, first: int = 0, last: int = 0) -> int:
    """Blocks whose forward runs again in backward: all of them under full / every_k; under
    block, min(n, chunk) of each of the v model chunks of each stage (Megatron-LM
    megatron/core/recompute.py, method "block", commit d98e8a64; stages as
    `params.layers_per_stage`, first / last 0 = the even split); none otherwise."""
    if recompute in ("full", "every_k"):
        return num_layers
    if recompute != "block":
        return 0
    stages = layers_per_stage(num_layers, pp, first or None, last or None)
    return sum(virtual_stages * min(recompute_num_layers, n // virtual_stages) for n in stages)


def forward_repeat_share(num_layers: int, cols) -> np.ndarray:
    """Per layout row (`LayoutColumns`), the share of the blocks whose forward runs again in
    backward: `recomputed_blocks` / num_layers (1 full / every_k, 0 none / selective), once per
    distinct (recompute, n, pp, v, first, last). The step model charges the pacing stage
    with this share of its blocks (exact for an even split; the model-wide share under uneven
    first / last stages, a named approximation)."""
    from planner.core.columns import RECOMPUTE_MODES, on_distinct

    codes = np.asarray(cols["recompute"])
    block = codes == RECOMPUTE_MODES.index("block")
    if not block.any():  # 1 for full / every_k, 0 otherwise: no grouping needed
        return np.isin(codes, [RECOMPUTE_MODES.index("full"),
                               RECOMPUTE_MODES.index("every_k")]).astype(np.float64)
    keys = [cols[k] if k in cols else np.full(len(cols), d, dtype=np.int64) for k, d in (
        ("recompute", 0), ("recompute_num_layers", 0), ("pp", 1), ("virtual_stages", 1),
        ("first_stage_layers", 0), ("last_stage_layers", 0))]

    def share(rows: np.ndarray) -> dict[str, np.ndarray]:
        return {"share": np.array([recomputed_blocks(num_layers, RECOMPUTE_MODES[r], *rest) / num_layers
                                   for r, *rest in np.stack([k[rows] for k in keys], 1).tolist()])}

    return on_distinct(share, *keys)["share"]


class FlopsBreakdown(Frozen):
    """FLOPs of one optimizer step of the whole job (all GPUs)."""

    forward_flops: float
    backward_flops: float
    """2 x forward (seed 004 §1.1.2: two matmuls per forward matmul)."""
    recompute_flops: float
    """Extra forward work of activation recompute and flash attention's backward."""
    model_flops: float
    """forward + backward: what MFU counts (PaLM appendix B)."""
    hardware_flops: float
    """model_flops + recompute_flops: what HFU counts."""
    tokens: int
    """Tokens of the step: global_batch x seq_len."""


def step_flops(model: ModelSpec, setup: TrainSetup, layout: Layout) -> FlopsBreakdown:
    """One optimizer step: global_batch sequences of seq_len tokens through the model."""
    batch, s = setup.global_batch, setup.seq_len
    forward = forward_flops(model, batch, s)
    backward = 2 * forward
    extra = recompute_flops(model, layout, batch, s)
    return FlopsBreakdown.computed(
        forward_flops=forward, backward_flops=backward, recompute_flops=extra,
        model_flops=forward + backward, hardware_flops=forward + backward + extra,
        tokens=batch * s,
    )


# --------------------------------------------------------------------------- whole runs


def _positive(**values: float) -> None:
    for field, value in values.items():
        if not value > 0:
            raise PlanInputError(field, f"must be positive (got {value})")


def training_flops(params: float, tokens: float, k: int = 6) -> float:
    """Named approximation C ≈ k·P·D (seed 004 §1.3, §1.5): k = 6 (forward 2 + backward 4),
    8 with full recompute (one more forward). GPT-3: 6 x 174.6e9 x 300e9 = 3.14e23."""
    return k * params * tokens


def training_seconds(total_flops: float, num_gpus: int, peak_flops_per_s: float,
                     utilisation: float) -> float:
    """Wall time = FLOPs / (GPUs x peak FLOP/s x utilisation) (seed 004 §1.4)."""
    _positive(num_gpus=num_gpus, peak_flops_per_s=peak_flops_per_s, utilisation=utilisation)
    return total_flops / (num_gpus * peak_flops_per_s * utilisation)


def training_days(total_flops: float, num_gpus: int, peak_flops_per_s: float,
                  utilisation: float) -> float:
    """Seed 004 §1.4: GPT-3 175B, 300B tokens, 1024 A100 at 312 TFLOP/s, 0.45, k = 8 -> ≈34 days."""
    return training_seconds(total_flops, num_gpus, peak_flops_per_s, utilisation) / SECONDS_PER_DAY


def gpu_hours(total_flops: float, peak_flops_per_s: float, utilisation: float) -> float:
    """GPU-hours: FLOPs / (peak FLOP/s x utilisation) / 3600, independent of the GPU count."""
    _positive(peak_flops_per_s=peak_flops_per_s, utilisation=utilisation)
    return total_flops / (peak_flops_per_s * utilisation) / SECONDS_PER_HOUR


def mfu(model_flops: float, step_time_s: float, num_gpus: int, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation (PaLM, Chowdhery et al. 2022, appendix B): model FLOPs of a step
    (no recompute) over what the GPUs could do at dense peak in that time."""
    _positive(step_time_s=step_time_s, num_gpus=num_gpus, peak_flops_per_s=peak_flops_per_s)
    return model_flops / (step_time_s * num_gpus * peak_flops_per_s)


def hfu(hardware_flops: float, step_time_s: float, num_gpus: int, peak_flops_per_s: float) -> float:
    """Hardware FLOPs utilisation: as MFU but counting recompute (Korthikanti §6, PaLM app. B)."""
    return mfu(hardware_flops, step_time_s, num_gpus, peak_flops_per_s)
