"""FLOPs: the seed's per-layer forms, generalisations worked by hand, whole-run figures."""

from __future__ import annotations

import math

import pytest

from planner.core import flops
from planner.core.errors import PlanInputError
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout, ModelSpec, TrainSetup

GPT3 = ModelSpec(  # Brown et al. 2020 Table 2.1
    name="gpt3-175b", num_layers=96, hidden_size=12288, num_heads=96, ffn_hidden_size=49152,
    vocab_size=50257, max_seq_len=2048,
)
LLAMA2_7B = ModelSpec(  # meta-llama/Llama-2-7b-hf config.json
    name="llama2-7b", num_layers=32, hidden_size=4096, num_heads=32, ffn_hidden_size=11008,
    vocab_size=32000, max_seq_len=4096, mlp="swiglu", norm="rmsnorm", position="rotary",
    tied_embeddings=False, linear_bias=False, dropout=False,
)
LLAMA3_8B = LLAMA2_7B.model_copy(update={"name": "llama3-8b", "num_kv_heads": 8,
                                         "ffn_hidden_size": 14336, "vocab_size": 128256})
MIXTRAL = ModelSpec(  # mistralai/Mixtral-8x7B-v0.1 config.json
    name="mixtral-8x7b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
    ffn_hidden_size=14336, vocab_size=32000, max_seq_len=32768, mlp="swiglu", norm="rmsnorm",
    position="rotary", tied_embeddings=False, linear_bias=False, dropout=False,
    num_experts=8, experts_per_token=2,
)


def test_gpt_layer_seed_004():
    # seed 004 §1.2.3: 24·B·s·h² + 4·B·s²·h
    B, s, h = 4, 2048, 12288
    assert flops.layer_forward_flops(GPT3, B, s) == 24 * B * s * h**2 + 4 * B * s**2 * h


def test_logits_seed_004():
    # seed 004 §1.2.4: 2·B·s·h·V
    assert flops.logits_flops(GPT3, 2, 2048) == 2 * 2 * 2048 * 12288 * 50257


def test_narayanan_eq3_with_full_recompute():
    # Narayanan et al. 2021 eq. (3), FLOPs per iteration with activation recompute:
    # 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))
    B, s, l, h, V = 1536, 2048, 96, 12288, 50257
    setup = TrainSetup(seq_len=s, global_batch=B, train_tokens=300e9,
                       precision=get_precision("zero-fp16"), optimizer=get_optimizer("adam"))
    step = flops.step_flops(GPT3, setup, Layout(recompute="full", flash_attention=False))
    expected = 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    assert math.isclose(step.hardware_flops, expected, rel_tol=1e-12)
    # without recompute the same model FLOPs: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))
    no_rc = 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))
    assert math.isclose(step.model_flops, no_rc, rel_tol=1e-12)
    assert step.tokens == B * s == 3_145_728
    assert step.backward_flops == 2 * step.forward_flops


def test_swiglu_llama2_layer():
    # MHA attention 8·s·h² + 4·s²·h, SwiGLU three matrices 6·s·h·f
    s, h, f = 4096, 4096, 11008
    assert flops.layer_forward_flops(LLAMA2_7B, 1, s) == 8 * s * h**2 + 4 * s**2 * h + 6 * s * h * f


def test_gqa_smaller_kv_projections():
    # Llama-3-8B: Q h x 4096, K and V h x 1024 each, O 4096 x h
    s, h = 8192, 4096
    linear = 2 * s * h * (4096 + 1024 + 1024) + 2 * s * 4096 * h
    assert flops.attention_linear_flops(LLAMA3_8B, s) == linear
    assert flops.layer_forward_flops(LLAMA3_8B, 1, s) == linear + 4 * s**2 * h + 6 * s * h * 14336


def test_moe_top2_plus_router():
    # Mixtral: router 2·s·h·8, two experts of 6·s·h·f each
    s, h, f = 4096, 4096, 14336
    attn = 2 * s * h * (4096 + 2 * 1024) + 2 * s * 4096 * h + 4 * s**2 * h
    assert flops.layer_forward_flops(MIXTRAL, 1, s) == attn + 2 * s * h * 8 + 2 * 6 * s * h * f


def _setup(B=8, s=2048):
    return TrainSetup(seq_len=s, global_batch=B, train_tokens=1e9,
                      precision=get_precision("zero-fp16"), optimizer=get_optimizer("adam"))


def test_recompute_modes():
    B, s, h, L = 8, 2048, 12288, 96
    core = 4 * B * s**2 * h  # QKᵀ and scores·V per layer
    none = flops.step_flops(GPT3, _setup(), Layout(flash_attention=False))
    assert none.recompute_flops == 0 and none.hardware_flops == none.model_flops
    selective = flops.step_flops(GPT3, _setup(), Layout(recompute="selective", flash_attention=False))
    assert selective.recompute_flops == L * core
    full = flops.step_flops(GPT3, _setup(), Layout(recompute="full", flash_attention=False))
    assert full.recompute_flops == L * (24 * B * s * h**2 + core)
    every = flops.step_flops(GPT3, _setup(), Layout(recompute="every_k", recompute_every_k=4, flash_attention=False))
    assert every.recompute_flops == full.recompute_flops  # each segment re-runs once
    flash = flops.step_flops(GPT3, _setup(), Layout(flash_attention=True))
    assert flash.recompute_flops == L * 2 * B * s**2 * h  # backward recomputes QKᵀ
    assert flash.model_flops == none.model_flops


def test_gpt3_training_flops_seed_004():
    # seed 004 §1.3: 6 x 174.6e9 x 300e9 = 3.1428e23
    assert math.isclose(flops.training_flops(174.6e9, 300e9), 3.1428e23, rel_tol=1e-12)
    assert math.isclose(flops.training_flops(174.6e9, 300e9, k=8), 4.1904e23, rel_tol=1e-12)


def test_gpt3_training_days_seed_004():
    # seed 004 §1.4: 8 x 300e9 x 174.6e9 / (1024 x 312e12 x 0.45) = 2.9146e6 s = 33.7 days ≈ 34
    days = flops.training_days(flops.training_flops(174.6e9, 300e9, k=8), 1024, 312e12, 0.45)
    assert math.isclose(days, 4.1904e23 / (1024 * 312e12 * 0.45) / 86400, rel_tol=1e-12)
    assert round(days) == 34


def test_gpu_hours_and_utilisation():
    # 1e18 FLOPs at 1e15 FLOP/s x 0.5 -> 2000 s = 0.5556 GPU-hours
    assert math.isclose(flops.gpu_hours(1e18, 1e15, 0.5), 2000 / 3600)
    # 1.2e17 model FLOPs in 2 s on 400 GPUs of 312e12 -> 1.2e17 / 2.496e17 = 0.4808
    assert math.isclose(flops.mfu(1.2e17, 2.0, 400, 312e12), 1.2e17 / 2.496e17)
    assert math.isclose(flops.hfu(1.6e17, 2.0, 400, 312e12), 1.6e17 / 2.496e17)


def test_bad_inputs_name_the_field():
    with pytest.raises(PlanInputError, match="step_time_s"):
        flops.mfu(1e17, 0, 8, 312e12)
    with pytest.raises(PlanInputError, match="utilisation"):
        flops.training_days(1e23, 8, 312e12, 0)
