"""Exact parameter counts, hand-derived from the configs (arithmetic written out here)."""

from __future__ import annotations

import pytest

from planner.core.errors import PlanInputError
from planner.core.params import (
    approx_params_blocks,
    approx_params_with_embeddings,
    count_params,
    largest_param_numel,
    layers_per_stage,
    stage_params,
)
from planner.core.spec import ModelSpec


def gpt2_small(**overrides) -> ModelSpec:
    """GPT-2 124M (HF openai-community/gpt2 config.json)."""
    dims = dict(name="gpt2", num_layers=12, hidden_size=768, num_heads=12, ffn_hidden_size=3072,
                vocab_size=50257, max_seq_len=1024)
    return ModelSpec(**(dims | overrides))


def llama2_7b(**overrides) -> ModelSpec:
    dims = dict(name="llama2-7b", num_layers=32, hidden_size=4096, num_heads=32,
                ffn_hidden_size=11008, vocab_size=32000, max_seq_len=4096, mlp="swiglu",
                norm="rmsnorm", position="rotary", tied_embeddings=False, linear_bias=False,
                dropout=False)
    return ModelSpec(**(dims | overrides))


# --------------------------------------------------------------------------- whole counts


def test_gpt2_exact_count_matches_model_card():
    h, V, s, L = 768, 50257, 1024, 12
    embedding = V * h + s * h  # wte 38,597,376 + wpe 786,432
    attention = (h * 3 * h + 3 * h) + (h * h + h)  # c_attn 1,771,776 + c_proj 590,592
    mlp = (h * 4 * h + 4 * h) + (4 * h * h + h)  # c_fc 2,362,368 + c_proj 2,360,064
    norms = 2 * (2 * h)  # ln_1, ln_2 weight + bias
    per_layer = attention + mlp + norms
    assert per_layer == 7_087_872
    expected = embedding + L * per_layer + 2 * h  # + ln_f; lm_head tied
    assert expected == 124_439_808  # HF safetensors total for openai-community/gpt2
    count = count_params(gpt2_small())
    assert count.total == expected
    assert count.layer.total == per_layer
    assert count.layer.attention == attention and count.layer.mlp == mlp
    assert count.embedding == embedding and count.lm_head == 0 and count.final_norm == 2 * h
    assert count.active == count.total  # dense


def test_llama2_7b_swiglu_rmsnorm_untied():
    h, f, V, L = 4096, 11008, 32000, 32
    per_layer = 4 * h * h + 3 * h * f + 2 * h  # q,k,v,o + gate,up,down + 2 RMSNorm weights
    assert per_layer == 67_108_864 + 135_266_304 + 8_192
    expected = V * h + L * per_layer + h + V * h  # embed + blocks + norm + lm_head
    assert expected == 6_738_415_616  # Llama-2-7b-hf safetensors total
    assert count_params(llama2_7b()).total == expected


def test_gqa_llama3_8b():
    h, f, V, L, a, kv, d = 4096, 14336, 128256, 32, 32, 8, 128
    attention = h * a * d + 2 * h * kv * d + a * d * h  # K, V: 4096 x 1024 each
    assert attention == 16_777_216 + 8_388_608 + 16_777_216
    per_layer = attention + 3 * h * f + 2 * h
    expected = 2 * V * h + L * per_layer + h
    assert expected == 8_030_261_248  # Meta-Llama-3-8B safetensors total
    model = llama2_7b(name="llama3-8b", num_kv_heads=8, ffn_hidden_size=14336, vocab_size=128256)
    count = count_params(model)
    assert count.layer.attention == attention
    assert count.total == expected


def test_moe_mixtral_total_and_active():
    h, f, V, L, E, k = 4096, 14336, 32000, 32, 8, 2
    attention = 2 * h * h + 2 * h * 1024  # q, o 4096x4096; k, v 4096x1024 (8 kv heads x 128)
    expert = 3 * h * f  # w1, w2, w3
    router = h * E  # gate, no bias
    per_layer_total = attention + E * expert + router + 2 * h
    per_layer_active = attention + k * expert + router + 2 * h
    outside = 2 * V * h + h  # embed, lm_head, final norm
    expected_total = outside + L * per_layer_total
    assert expected_total == 46_702_792_704  # Mixtral-8x7B safetensors total
    expected_active = outside + L * per_layer_active
    assert expected_active == 12_879_925_248  # "12.9B active" (Mixtral of Experts, Jiang et al. 2024)
    model = llama2_7b(name="mixtral", num_kv_heads=8, ffn_hidden_size=f, num_experts=E,
                      experts_per_token=k)
    count = count_params(model)
    assert count.total == expected_total and count.active == expected_active
    assert count.layer.router == router


def test_moe_shared_experts_and_expert_width():
    # 2 layers, h=64, 4 routed experts of width 32, top-1, 1 shared expert, swiglu, no bias
    model = ModelSpec(name="tiny-moe", num_layers=2, hidden_size=64, num_heads=4,
                      ffn_hidden_size=256, expert_ffn_hidden_size=32, vocab_size=100,
                      max_seq_len=16, mlp="swiglu", norm="rmsnorm", position="rotary",
                      tied_embeddings=True, linear_bias=False, num_experts=4,
                      experts_per_token=1, num_shared_experts=1)
    expert = 3 * 64 * 32  # 6,144
    per_layer = 4 * 64 * 64 + (4 + 1) * expert + 64 * 4 + 2 * 64
    active_layer = 4 * 64 * 64 + (1 + 1) * expert + 64 * 4 + 2 * 64
    count = count_params(model)
    assert count.total == 100 * 64 + 2 * per_layer + 64
    assert count.active == 100 * 64 + 2 * active_layer + 64


def test_tied_vs_untied_differs_by_one_vocab_matrix():
    tied = count_params(gpt2_small()).total
    untied = count_params(gpt2_small(tied_embeddings=False)).total
    assert untied - tied == 50257 * 768
    with_bias = count_params(gpt2_small(tied_embeddings=False, lm_head_bias=True)).total
    assert with_bias - untied == 50257


def test_biases_linear_and_qkv_only():
    h, L = 768, 12
    with_bias = count_params(gpt2_small()).total
    no_bias = count_params(gpt2_small(linear_bias=False)).total
    per_layer_biases = 3 * h + h + 4 * h + h  # qkv, o, fc1, fc2
    assert with_bias - no_bias == L * per_layer_biases
    qkv_only = count_params(gpt2_small(linear_bias=False, qkv_bias=True)).total
    assert qkv_only - no_bias == L * 3 * h


def test_gqa_head_dim_override():
    # head_dim given explicitly and different from h / a: Q is h x (a*d), O is (a*d) x h
    model = llama2_7b(num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=32,
                      ffn_hidden_size=128, vocab_size=10)
    count = count_params(model)
    assert count.layer.attention == 64 * 128 + 2 * 64 * 64 + 128 * 64


def test_bert_large_encoder():
    h, f, V, s, L = 1024, 4096, 30522, 512, 24
    embedding = V * h + s * h + 2 * h + 2 * h  # word, position, token type, LayerNorm
    per_layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * (2 * h)
    pooler = h * h + h
    expected = embedding + L * per_layer + pooler  # no final norm, no MLM head
    assert expected == 335_141_888  # bert-large-uncased BertModel safetensors total
    model = ModelSpec(name="bert-large", arch="encoder", num_layers=L, hidden_size=h,
                      num_heads=16, ffn_hidden_size=f, vocab_size=V, max_seq_len=s,
                      type_vocab_size=2, embedding_norm=True, pooler=True, final_norm=False)
    count = count_params(model)
    assert count.total == expected
    assert count.embedding == embedding and count.pooler == pooler and count.final_norm == 0


# --------------------------------------------------------------------------- seed forms


def test_seed_gpt3_approximation():
    # EQUATIONS.md §1: 12·96·12288² + 2·50257·12288 = 175,181,291,520
    assert approx_params_blocks(96, 12288) == 12 * 96 * 12288**2 == 173_946_175_488
    assert approx_params_with_embeddings(96, 12288, 50257) == 175_181_291_520


def test_gpt3_175b_exact_vs_megatron_formula():
    h, L, V, s = 12288, 96, 50257, 2048
    # per block 12h² + 13h (weights, biases, two LayerNorms); embeddings (V + s)·h; ln_f 2h
    expected = L * (12 * h * h + 13 * h) + (V + s) * h + 2 * h
    model = gpt2_small(name="gpt3-175b", num_layers=L, hidden_size=h, num_heads=96,
                       ffn_hidden_size=4 * h, max_seq_len=s)
    assert count_params(model).total == expected == 174_604_259_328


# --------------------------------------------------------------------------- pipeline split


def test_layers_per_stage_extra_layers_go_last():
    assert layers_per_stage(10, 4) == [2, 2, 3, 3]
    assert layers_per_stage(96, 8) == [12] * 8
    assert layers_per_stage(5, 5) == [1] * 5
    assert layers_per_stage(7, 1) == [7]


def test_layers_per_stage_rejects_more_stages_than_layers():
    with pytest.raises(PlanInputError) as err:
        layers_per_stage(4, 5)
    assert err.value.field == "pp"
    assert "pp=5" in str(err.value) and "num_layers=4" in str(err.value)


def test_stage_params_gpt2_tp2_pp2_tied_copy_and_odd_vocab():
    h, V, s = 768, 50257, 1024
    # one block on one of 2 tp ranks: split column-parallel weights and biases, row-parallel
    # weights; replicate row-parallel biases (o, fc2) and the two LayerNorms
    per_rank = (
        h * 3 * h // 2 + 3 * h // 2  # linear_qkv weight + bias
        + h * h // 2 + h  # linear_proj weight, bias whole
        + h * 4 * h // 2 + 4 * h // 2  # fc1 weight + bias
        + 4 * h * h // 2 + h  # fc2 weight, bias whole
        + 2 * 2 * h  # two LayerNorms
    )
    assert per_rank == 3_546_240
    vocab_rows = (V + 1) // 2  # ceil(50257 / 2) = 25129
    stages = stage_params(gpt2_small(), tp=2, pp=2)
    assert [st.num_layers for st in stages] == [6, 6]
    assert stages[0].embedding_params == vocab_rows * h + s * h  # positions replicated
    assert stages[0].head_params == 0
    # tied and pp > 1: the last stage keeps its own copy of the word embedding (+ ln_f)
    assert stages[1].head_params == vocab_rows * h + 2 * h
    assert stages[0].total == 6 * per_rank + vocab_rows * h + s * h == 41_362_944
    assert stages[1].total == 6 * per_rank + vocab_rows * h + 2 * h == 40_578_048


def test_stage_params_single_stage_equals_count_and_tied_not_duplicated():
    model = gpt2_small()
    (only,) = stage_params(model, tp=1, pp=1)
    assert only.total == count_params(model).total


def test_stage_params_untied_pipeline_sums_to_total():
    model = llama2_7b()
    stages = stage_params(model, tp=1, pp=4)
    assert sum(st.total for st in stages) == count_params(model).total
    assert stages[-1].head_params == 32000 * 4096 + 4096  # lm_head + final RMSNorm


def test_stage_params_gqa_tp8_llama2_70b_layer():
    h, f, a, kv, d = 8192, 28672, 64, 8, 128
    per_rank = (h * (a + 2 * kv) * d) // 8 + (a * d * h) // 8 + (h * 2 * f) // 8 + (f * h) // 8 + 2 * h
    model = llama2_7b(num_layers=80, hidden_size=h, num_heads=a, num_kv_heads=kv,
                      ffn_hidden_size=f)
    stages = stage_params(model, tp=8, pp=8)
    assert stages[3].total == 10 * per_rank


def test_stage_params_moe_experts_split_router_replicated():
    model = llama2_7b(num_layers=2, num_kv_heads=8, ffn_hidden_size=14336, num_experts=8,
                      experts_per_token=2)
    h, f = 4096, 14336
    attention = (h * (32 + 16) * 128) // 2 + (32 * 128 * h) // 2
    experts = 8 * ((h * 2 * f) // 2 + (f * h) // 2)
    per_rank = attention + experts + h * 8 + 2 * h
    stages = stage_params(model, tp=2, pp=2)
    assert stages[0].layer_params == per_rank


def test_stage_params_rejects_tp_not_dividing_heads():
    with pytest.raises(PlanInputError) as err:
        stage_params(gpt2_small(), tp=5, pp=1)
    assert err.value.field == "tp" and "num_heads (12)" in str(err.value)


def test_largest_param_is_vocab_shard_on_embedding_stages():
    model = gpt2_small()
    assert largest_param_numel(model, 2, 0, 2) == 25129 * 768
    # a middle stage of a 3-stage pipeline: the largest block tensor (fc1 = fc2 = 768 x 3072 / 2)
    assert largest_param_numel(model, 2, 1, 3) == 768 * 3072 // 2


def test_stage_params_bert_pipeline_has_no_output_copy():
    # BertModel has no output projection: with pp = 2 the last stage holds only its blocks and
    # the pooler (a plain replicated Linear h x h + h); the first stage the embeddings + norm
    h, V, s = 1024, 30522, 512
    model = ModelSpec(name="bert-large", arch="encoder", num_layers=24, hidden_size=h,
                      num_heads=16, ffn_hidden_size=4096, vocab_size=V, max_seq_len=s,
                      type_vocab_size=2, embedding_norm=True, pooler=True, final_norm=False)
    first, last = stage_params(model, tp=2, pp=2)
    assert first.embedding_params == (V // 2) * h + s * h + 2 * h + 2 * h
    assert last.head_params == h * h + h


def test_moe_layer_count_closed_form_matches_the_layer_rule():
    """num_moe_layers / block_kinds are closed forms of layer_is_moe; hand counts: DeepSeek-V3
    (61 blocks, first 3 dense, every later one MoE) 61 - 3 = 58; Llama 4 Maverick (48 blocks,
    interleave_moe_layer_step 2: blocks 1, 3, ..., 47) 24; first_dense 5, step 3 over 10 blocks:
    (i + 1) in {6, 9} -> 2; first_dense beyond the layers -> 0; a dense model -> 0."""
    from planner.core.params import block_kinds
    from planner.io.loading import load_model

    base = load_model("gpt3-175b")
    cases = [(61, 3, 1, 256, 58), (48, 0, 2, 128, 24), (10, 5, 3, 8, 2), (4, 9, 1, 8, 0),
             (96, 0, 1, 0, 0)]
    for layers, first, step, experts, expected in cases:
        m = base.model_copy(update=dict(num_layers=layers, first_dense_layers=first,
                                        moe_layer_step=step, num_experts=experts))
        assert m.num_moe_layers == expected == sum(m.layer_is_moe(i) for i in range(layers))
        assert block_kinds(m) == {m.layer_is_moe(i) for i in range(layers)}
