"""What one token leaves in the key/value cache, per block: the model-side arithmetic the
inference and activation models build on (planner.memory adds batch, context, tp and dtype).

Standard attention caches K and V: 2 x kv_heads x head_dim elements per token per block (seed 004
§2.3.2). Multi-head latent attention caches the compressed latent c_KV (kv_lora_rank) and the
rope key k_R shared by all heads (qk_rope_head_dim): (d_c + d_R) elements per token per block,
DeepSeek-V2 paper (arXiv 2405.04434) §2.1.2 and Table 1; vLLM and SGLang keep exactly this
(the "absorbed" MLA cache). Local blocks (sliding window, chunked attention) keep at most
`local_window` tokens of context.
"""

from __future__ import annotations

from planner.core.spec import ModelSpec


def kv_elements_per_token(model: ModelSpec) -> int:
    """Cached elements per token in ONE block, all heads (not split by tp)."""
    if model.is_mla:
        return (model.kv_lora_rank or 0) + model.qk_rope_head_dim  # latent + shared rope key
    return 2 * model.kv_heads * model.head_size  # K and V


def cached_tokens(model: ModelSpec, layer: int, context: int) -> int:
    """Tokens block `layer` keeps for a sequence of `context` tokens: all of them on global
    blocks, at most `local_window` on local ones (interleaved), at most `sliding_window` when
    every block slides (Mistral)."""
    if model.layer_is_local(layer):
        return min(context, model.local_window or context)
    if model.sliding_window is not None:
        return min(context, model.sliding_window)
    return context


def kv_cache_elements(model: ModelSpec, context: int) -> int:
    """Cached elements of one sequence of `context` tokens over every block (whole model)."""
    per_token = kv_elements_per_token(model)
    return sum(per_token * cached_tokens(model, i, context) for i in range(model.num_layers))


def kv_bytes_per_token(model: ModelSpec, bytes_per_element: int) -> int:
    """Bytes one token adds to the cache over every block, with no window reached:
    L x kv_elements_per_token x bytes (DeepSeek-V3 bf16: 61 x 576 x 2 = 70,272)."""
    return model.num_layers * kv_elements_per_token(model) * bytes_per_element
