"""Hugging Face config.json -> ModelSpec: each family's published config, counted by hand.

Every expected total is derived below term by term from the module structure transformers
builds for that config (the `*ForCausalLM` / `BertModel` printout), and matches the model card
or the checkpoint's safetensors total where one is published (cited per test).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.core.errors import PlanInputError
from planner.io.hf_config import model_from_hf_config
from planner.core.params import count_params


def write_config(tmp_path: Path, config: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


GPT2_SMALL = {  # huggingface.co/openai-community/gpt2 config.json
    "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
    "n_positions": 1024, "n_ctx": 1024, "vocab_size": 50257, "activation_function": "gelu_new",
    "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
}


def test_gpt2_small_n_inner_null(tmp_path):
    model = model_from_hf_config(write_config(tmp_path, GPT2_SMALL))
    assert model.ffn_hidden_size == 4 * 768  # n_inner null -> 4 * n_embd
    assert model.tied_embeddings and model.position == "learned" and model.linear_bias
    h, V, L, f = 768, 50257, 12, 3072
    embed = V * h + 1024 * h  # wte + wpe
    layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    expected = embed + L * layer + 2 * h  # + ln_f; lm_head tied to wte
    assert expected == 124_439_808  # GPT-2 small: 124,439,808 (HF safetensors total)
    assert count_params(model).total == expected


def test_gpt2_xl_from_directory(tmp_path):
    config = dict(GPT2_SMALL, n_embd=1600, n_layer=48, n_head=25)
    (tmp_path / "gpt2-xl").mkdir()
    write_config(tmp_path / "gpt2-xl", config)
    model = model_from_hf_config(tmp_path / "gpt2-xl")  # a directory holding config.json
    h, V, L = 1600, 50257, 48
    layer = 12 * h * h + 13 * h  # four linears with biases (9h + 4h) + two LayerNorms (4h)
    expected = V * h + 1024 * h + L * layer + 2 * h
    assert expected == 1_557_611_200  # GPT-2 XL, "1.5B" (HF safetensors total 1,557,611,200)
    assert count_params(model).total == expected
    assert model.name == "gpt2-xl"


NEOX_20B = {  # huggingface.co/EleutherAI/gpt-neox-20b config.json
    "model_type": "gpt_neox", "hidden_size": 6144, "num_hidden_layers": 44,
    "num_attention_heads": 64, "intermediate_size": 24576, "vocab_size": 50432,
    "max_position_embeddings": 2048, "rotary_pct": 0.25, "use_parallel_residual": True,
    "tie_word_embeddings": False, "attention_probs_dropout_prob": 0, "hidden_dropout_prob": 0,
}


def test_name_from_name_or_path_or_folder(tmp_path):
    assert model_from_hf_config(write_config(tmp_path, dict(GPT2_SMALL, _name_or_path="openai-community/gpt2"))).name == "gpt2"
    (tmp_path / "my-gpt").mkdir()
    assert model_from_hf_config(write_config(tmp_path / "my-gpt", GPT2_SMALL)).name == "my-gpt"


def test_gpt_neox_20b(tmp_path):
    config = {k: v for k, v in NEOX_20B.items() if k != "tie_word_embeddings"}  # default False
    model = model_from_hf_config(write_config(tmp_path, config))
    assert model.position == "rotary" and not model.tied_embeddings
    h, V, L, f = 6144, 50432, 44, 24576
    layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h
    expected = 2 * V * h + L * layer + 2 * h  # embed_in + embed_out (untied) + final LayerNorm
    assert expected == 20_554_567_680  # EleutherAI/gpt-neox-20b model card: "Number of parameters 20554567680"
    assert count_params(model).total == expected


OPT_125M = {  # huggingface.co/facebook/opt-125m config.json
    "model_type": "opt", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "ffn_dim": 3072, "vocab_size": 50272, "max_position_embeddings": 2048,
    "word_embed_proj_dim": 768, "do_layer_norm_before": True, "dropout": 0.1,
    "activation_function": "relu",
}


def test_opt_125m_position_offset(tmp_path):
    model = model_from_hf_config(write_config(tmp_path, OPT_125M))
    assert model.max_seq_len == 2048 + 2  # OPTLearnedPositionalEmbedding offset 2
    h, V, L, f = 768, 50272, 12, 3072
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    expected = V * h + (2048 + 2) * h + L * layer + 2 * h  # tied lm_head, final_layer_norm
    assert expected == 125_239_296  # facebook/opt-125m safetensors total
    assert count_params(model).total == expected


def test_opt_350m_projection_is_rejected(tmp_path):
    config = dict(OPT_125M, hidden_size=1024, word_embed_proj_dim=512, do_layer_norm_before=False)
    with pytest.raises(PlanInputError, match="word_embed_proj_dim"):
        model_from_hf_config(write_config(tmp_path, config))


LLAMA2_7B = {  # huggingface.co/meta-llama/Llama-2-7b-hf config.json (no num_key_value_heads key
    # in the original release; no head_dim key)
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}


def test_llama2_7b_missing_kv_heads_and_head_dim(tmp_path):
    model = model_from_hf_config(write_config(tmp_path, LLAMA2_7B))
    assert model.kv_heads == 32 and model.head_size == 128  # defaults: heads, hidden / heads
    h, V, L, f = 4096, 32000, 32, 11008
    layer = 4 * h * h + 3 * h * f + 2 * h  # q k v o, gate up down, two RMSNorm weights
    expected = 2 * V * h + L * layer + h
    assert expected == 6_738_415_616  # Llama-2-7b-hf safetensors total
    assert count_params(model).total == expected


LLAMA3_8B = {  # huggingface.co/meta-llama/Meta-Llama-3-8B config.json
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "attention_bias": False,
}


def test_llama3_8b_gqa(tmp_path):
    model = model_from_hf_config(write_config(tmp_path, LLAMA3_8B))
    h, V, L, f, kv = 4096, 128256, 32, 14336, 8 * 128
    layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h  # q o, k v (GQA), SwiGLU, norms
    expected = 2 * V * h + L * layer + h
    assert expected == 8_030_261_248  # Meta-Llama-3-8B safetensors total
    assert count_params(model).total == expected


def test_llama2_70b_gqa(tmp_path):
    config = dict(LLAMA2_7B, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                  num_attention_heads=64, num_key_value_heads=8)  # Llama-2-70b-hf config.json
    model = model_from_hf_config(write_config(tmp_path, config))
    h, V, L, f, kv = 8192, 32000, 80, 28672, 8 * 128
    expected = 2 * V * h + L * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + h
    assert expected == 68_976_648_192  # Llama-2-70b-hf safetensors total
    assert count_params(model).total == expected


def test_mistral_nemo_explicit_head_dim(tmp_path):
    config = {  # huggingface.co/mistralai/Mistral-Nemo-Base-2407 config.json
        "model_type": "mistral", "hidden_size": 5120, "intermediate_size": 14336,
        "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 131072, "max_position_embeddings": 1024000, "sliding_window": None,
    }
    model = model_from_hf_config(write_config(tmp_path, config))
    assert model.head_size == 128 != 5120 // 32  # head_dim given, not hidden / heads (160)
    h, V, L, f, q, kv = 5120, 131072, 40, 14336, 32 * 128, 8 * 128
    attention = h * q + 2 * h * kv + q * h  # q, k, v, o with 4096-wide heads
    expected = 2 * V * h + L * (attention + 3 * h * f + 2 * h) + h
    assert expected == 12_247_782_400  # Mistral-Nemo-Base-2407 safetensors total ("12B")
    assert count_params(model).total == expected


MISTRAL_7B = {  # huggingface.co/mistralai/Mistral-7B-v0.1 config.json
    "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": 4096,
}


def test_mistral_7b_sliding_window_untied_by_default(tmp_path):
    model = model_from_hf_config(write_config(tmp_path, MISTRAL_7B))
    assert model.sliding_window == 4096 and not model.tied_embeddings  # MistralConfig: False
    h, V, L, f, kv = 4096, 32000, 32, 14336, 1024
    expected = 2 * V * h + L * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + h
    assert expected == 7_241_732_096  # Mistral-7B-v0.1 safetensors total
    assert count_params(model).total == expected


QWEN2_05B = {  # huggingface.co/Qwen/Qwen2-0.5B config.json
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "vocab_size": 151936, "max_position_embeddings": 131072, "tie_word_embeddings": True,
    "use_sliding_window": False, "sliding_window": 131072,
}


def test_qwen2_qkv_bias_implied(tmp_path):
    model = model_from_hf_config(write_config(tmp_path, QWEN2_05B))
    assert model.qkv_bias and not model.linear_bias and model.sliding_window is None
    h, V, L, f, kv = 896, 151936, 24, 4864, 2 * 64
    attention = (h * h + h) + 2 * (h * kv + kv) + h * h  # q, k, v with bias; o without
    expected = V * h + L * (attention + 3 * h * f + 2 * h) + h  # tied embeddings
    assert expected == 494_032_768  # Qwen2-0.5B safetensors total
    assert count_params(model).total == expected


MIXTRAL_8X7B = {  # huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 32000, "max_position_embeddings": 32768, "num_local_experts": 8,
    "num_experts_per_tok": 2, "sliding_window": None, "tie_word_embeddings": False,
}


def test_mixtral_8x7b_total_and_active(tmp_path):
    model = model_from_hf_config(write_config(tmp_path, MIXTRAL_8X7B))
    h, V, L, f, kv, E = 4096, 32000, 32, 14336, 1024, 8
    shared = 2 * h * h + 2 * h * kv + h * E + 2 * h  # attention, router gate h x E, norms
    expected = 2 * V * h + L * (shared + E * 3 * h * f) + h
    assert expected == 46_702_792_704  # Mixtral-8x7B-v0.1 safetensors total
    counts = count_params(model)
    assert counts.total == expected
    assert counts.active == 2 * V * h + L * (shared + 2 * 3 * h * f) + h  # top-2 experts


QWEN15_MOE = {  # huggingface.co/Qwen/Qwen1.5-MoE-A2.7B config.json
    "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
    "vocab_size": 151936, "max_position_embeddings": 8192, "num_experts": 60,
    "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1,
    "tie_word_embeddings": False,
}


def test_qwen_moe_shared_expert_gate_counted(tmp_path):
    # Issue 13 lifted the named approximation: the shared-expert gate now has a spec field, so
    # the count is the published total exactly (it was published - L*h before).
    model = model_from_hf_config(write_config(tmp_path, QWEN15_MOE))
    assert model.num_shared_experts == 4  # 5632 / 1408: same 3*h*5632 parameters
    assert model.shared_expert_gate
    h, V, L, e, E = 2048, 151936, 24, 1408, 60
    attention = 3 * (h * h + h) + h * h  # q, k, v with bias, o without
    layer = attention + E * 3 * h * e + 3 * h * 5632 + h * 1 + h * E + 2 * h  # + shared gate h x 1
    published = 2 * V * h + L * layer + h
    assert published == 14_315_784_192  # Qwen1.5-MoE-A2.7B safetensors total ("14.3B")
    assert count_params(model).total == published


def test_deepseek_dense_first_layers(tmp_path):
    # Issue 13: first_k_dense_replace is representable now (it was refused before); block 0 is a
    # dense SwiGLU of intermediate_size, blocks 1..27 MoE (DeepseekDecoderLayer).
    config = {  # huggingface.co/deepseek-ai/deepseek-moe-16b-base config.json (abridged)
        "model_type": "deepseek", "hidden_size": 2048, "intermediate_size": 10944,
        "moe_intermediate_size": 1408, "num_hidden_layers": 28, "num_attention_heads": 16,
        "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "vocab_size": 102400,
        "max_position_embeddings": 4096,
    }
    model = model_from_hf_config(write_config(tmp_path, config))
    assert (model.num_experts, model.num_shared_experts, model.expert_ffn_size) == (64, 2, 1408)
    assert model.first_dense_layers == 1 and model.num_moe_layers == 27
    h, V, f, e = 2048, 102400, 10944, 1408
    attention = 4 * h * h  # MHA, no biases
    dense = attention + 3 * h * f + 2 * h
    moe = attention + (64 + 2) * 3 * h * e + h * 64 + 2 * h  # routed + shared experts, router
    expected = 2 * V * h + dense + 27 * moe + h  # untied embeddings, final norm
    assert expected == 16_375_728_128  # DeepSeekMoE 16B: "16.4B" total (Dai et al. 2024)
    assert count_params(model).total == expected
    with pytest.raises(PlanInputError, match="moe_layer_freq"):
        model_from_hf_config(write_config(tmp_path, dict(config, moe_layer_freq=2)))


BERT_BASE = {  # huggingface.co/google-bert/bert-base-uncased config.json
    "model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512,
    "type_vocab_size": 2, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
}


def test_bert_base(tmp_path):
    model = model_from_hf_config(write_config(tmp_path, BERT_BASE))
    assert model.arch == "encoder"
    h, V, L, f = 768, 30522, 12, 3072
    embed = V * h + 512 * h + 2 * h + 2 * h  # word, position, token type, LayerNorm
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    expected = embed + L * layer + (h * h + h)  # + pooler dense
    assert expected == 109_482_240  # BertModel(bert-base-uncased), 110M in the BERT paper
    assert count_params(model).total == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "malformed JSON at line 1"),
        ("[1, 2]", "expected a JSON object"),
        ('{"model_type": "t5"}', "model_type: 't5' is not supported"),
        ('{"model_type": "llama", "hidden_size": 4096}', "num_attention_heads: missing"),
        ('{"model_type": "deepseek_v3", "kv_lora_rank": 512}', "multi-head latent attention"),
    ],
)
def test_malformed_or_unsupported(tmp_path, text, match):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(PlanInputError, match=match):
        model_from_hf_config(path)


def test_missing_file(tmp_path):
    with pytest.raises(PlanInputError, match="no such file"):
        model_from_hf_config(tmp_path / "nope.json")
