"""Issue 13 phase 2, inference for today's models: MLA's compressed cache, interleaved
local/global and chunked attention, mixed dense/MoE decode reads, tp wider than the kv heads.
Every expected number is worked out by hand here from the published config.json values
(tests/data/hf_configs/), never read from the code's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.core.errors import PlanInputError
from planner.core.params import count_params
from planner.io.hf_config import model_from_hf_config
from planner.memory.infer import (
    InferConfig,
    attention_flops,
    check_config,
    decode_weight_params,
    kv_cache_bytes,
    replicated_weight_params,
    sum_visible_keys_chunked,
    tp_candidates,
    weights_bytes,
)

CONFIGS = Path(__file__).parent / "data" / "hf_configs"
V3 = model_from_hf_config(CONFIGS / "deepseek-v3.json")
GEMMA3 = model_from_hf_config(CONFIGS / "gemma-3-27b.json")
SCOUT = model_from_hf_config(CONFIGS / "llama4-scout-17b-16e.json")


# --------------------------------------------------------------------------- DeepSeek-V3 (MLA)


def test_deepseek_v3_mla_kv_bytes_per_token():
    # config.json: kv_lora_rank 512, qk_rope_head_dim 64, 61 layers. MLA caches the latent c_KV
    # (512) and the shared rope key k_R (64) per token per layer (DeepSeek-V2 §2.1.2): 576
    # elements, 1152 bytes in bf16, x 61 = 70,272 bytes per token (vs 2 x 128 x 128 x 61 x 2 =
    # 3,997,696 for the same heads without compression).
    assert kv_cache_bytes(V3, batch=1, context=1, kv_bytes=2) == 576 * 2 * 61 == 70_272
    assert kv_cache_bytes(V3, batch=1, context=4096, kv_bytes=2) == 70_272 * 4096
    assert kv_cache_bytes(V3, batch=3, context=4096, kv_bytes=1) == 576 * 61 * 4096 * 3  # fp8


def test_deepseek_v3_mla_cache_is_whole_on_every_tp_rank():
    # vLLM caches MLA with one "kv head" of width 576 whatever tp is: tp=8 does not divide it.
    assert kv_cache_bytes(V3, 1, 4096, 2, tp=8) == 576 * 2 * 61 * 4096
    assert tp_candidates(V3) == [1, 2, 4, 8, 16, 32, 64, 128]  # divisors of 128 heads


def test_deepseek_v3_mla_down_projections_replicated_over_tp():
    # q_a_proj 7168 x 1536 + q_a_layernorm 1536 + kv_a_proj_with_mqa 7168 x 576 +
    # kv_a_layernorm 512 per layer, whole on each of the tp ranks: tp - 1 extra copies x 61.
    per_layer = 7168 * 1536 + 1536 + 7168 * 576 + 512
    assert per_layer == 15_140_864
    assert replicated_weight_params(V3, 1) == 0
    assert replicated_weight_params(V3, 8) == 7 * 61 * 15_140_864


def test_deepseek_v3_decode_reads_dense_blocks_whole_and_moe_blocks_by_routing():
    # first_k_dense_replace 3: 58 MoE blocks. One sequence routes to 8 of 256 experts, so
    # 248 experts x 3 x 7168 x 2048 stay unread in each MoE block, none in the 3 dense ones.
    count = count_params(V3)
    unread = 58 * 248 * (3 * 7168 * 2048)
    read = decode_weight_params(V3, count.total, count.layer.total, count.layer.active, batch=1)
    assert read == count.total - unread
    # 32 sequences x top-8 can touch all 256 experts: everything is read
    assert decode_weight_params(V3, count.total, count.layer.total, count.layer.active, 32) == count.total


def test_mla_attention_flops_per_pair():
    # scores: 2 x 128 heads x (128 nope + 64 rope); values: 2 x 128 x 128 v_head_dim
    per_pair = 2 * 128 * 192 + 2 * 128 * 128
    assert per_pair == 81_920
    # one decode query after 4095 cached tokens sees 4096 keys in each of 61 blocks
    assert attention_flops(V3, batch=1, new_tokens=1, past_tokens=4095) == 81_920 * 61 * 4096


# --------------------------------------------------------------------------- Gemma 3 local/global


def test_gemma3_local_global_cache_at_32k():
    # config.json: 62 layers, sliding_window 1024, sliding_window_pattern 6 -> blocks 6, 12, ...,
    # 60 (1-based) are global: 62 // 6 = 10 global, 52 local. 16 kv heads x head_dim 128:
    # K + V = 4096 elements = 8192 bytes per token per block in bf16.
    per_token_block = 2 * 16 * 128 * 2
    expected = 10 * 32768 * per_token_block + 52 * 1024 * per_token_block
    assert expected == 3_120_562_176  # 2.91 GiB per 32k sequence
    assert kv_cache_bytes(GEMMA3, batch=1, context=32768, kv_bytes=2) == expected
    # a short context under the window: every block keeps all 1000 tokens
    assert kv_cache_bytes(GEMMA3, 1, 1000, 2) == 62 * 1000 * per_token_block
    # tp=2 halves the kv heads (16 / 2 = 8 per rank)
    assert kv_cache_bytes(GEMMA3, 1, 32768, 2, tp=2) == expected // 2


def test_gemma3_decode_attention_flops_at_32k():
    # one query at position 32768: 32768 keys on 10 global blocks, 1024 on 52 local ones;
    # 4 x 32 heads x 128 = 16384 FLOPs per (query, key) pair
    assert attention_flops(GEMMA3, 1, 1, 32767) == 16384 * (10 * 32768 + 52 * 1024)


# --------------------------------------------------------------------------- Llama 4 chunked


def test_chunked_visible_keys_by_hand():
    # chunk 4: positions 1..10 see 1,2,3,4 | 1,2,3,4 | 1,2 keys
    assert sum_visible_keys_chunked(0, 10, 4) == 1 + 2 + 3 + 4 + 1 + 2 + 3 + 4 + 1 + 2 == 23
    assert sum_visible_keys_chunked(5, 10, 4) == 2 + 3 + 4 + 1 + 2  # positions 6..10
    assert sum_visible_keys_chunked(8192, 8193, 8192) == 1  # first token of a new chunk


def test_llama4_scout_chunked_cache_and_flops_at_32k():
    # config.json: 48 layers, attention_chunk_size 8192, no_rope_layers every 4th -> 12 global
    # blocks, 36 chunked. 8 kv heads x 128: K + V = 2048 elements = 4096 bytes in bf16.
    per_token_block = 2 * 8 * 128 * 2
    expected = 12 * 32768 * per_token_block + 36 * 8192 * per_token_block
    assert expected == 2_818_572_288
    assert kv_cache_bytes(SCOUT, 1, 32768, 2) == expected
    # prefill of 32768 tokens: global blocks 32768 x 32769 / 2 pairs; chunked blocks 4 whole
    # chunks of 8192 x 8193 / 2; 4 x 40 heads x 128 = 20480 FLOPs per pair
    pairs = 12 * (32768 * 32769 // 2) + 36 * 4 * (8192 * 8193 // 2)
    assert attention_flops(SCOUT, 1, 32768, 0) == 20480 * pairs


# --------------------------------------------------------------------------- tp wider than kv heads


def test_tp_wider_than_kv_heads_replicates_cache_and_kv_weights():
    # Llama 4 Scout: 40 heads, 8 kv heads. tp=40 divides the heads and is 5 x 8: each rank
    # keeps 1 kv head (5 replicas of each). Its cache per rank is one head's K and V.
    assert 40 in tp_candidates(SCOUT) and 10 not in tp_candidates(SCOUT)  # 10: neither | 8 nor 8 |
    check_config(SCOUT, InferConfig(batch=1, context=4096, tp=40))
    with pytest.raises(PlanInputError, match="num_kv_heads"):
        check_config(SCOUT, InferConfig(batch=1, context=4096, tp=10))
    assert kv_cache_bytes(SCOUT, 1, 4096, 2, tp=40) == 2 * 1 * 128 * 2 * 48 * 4096
    # 40 - 8 = 32 extra copies of a kv head's K and V weights (5120 x 128 each, no bias), 48 blocks
    assert replicated_weight_params(SCOUT, 40) == 32 * 48 * 2 * 5120 * 128
    assert replicated_weight_params(SCOUT, 8) == 0
    total = count_params(SCOUT).total
    extra = 32 * 48 * 2 * 5120 * 128
    assert weights_bytes(total + extra, "bf16", 40) == -(-(2 * (total + extra)) // 40)
