"""Saved-activation inventory: hand-derived byte counts and the seed / Korthikanti closed forms.

Symbols: s sequence, b micro-batch, h hidden, a heads, f MLP width, t tensor parallel.
Korthikanti = Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", §4 (Table 2). Seed 004 §2.2.3 gives 34sbh + 5as²b per GPT block in fp16.
"""

from __future__ import annotations

import math

import pytest

from planner.memory import activations as act
from planner.core.errors import PlanInputError
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout, ModelSpec, TrainSetup

GPT3 = ModelSpec(  # Brown et al. 2020 Table 2.1: 96 layers, d_model 12288, 96 heads, f = 4h
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
TINY_MOE = ModelSpec(  # small enough to count every tensor by hand
    name="tiny-moe", num_layers=2, hidden_size=8, num_heads=2, ffn_hidden_size=16,
    vocab_size=10, max_seq_len=4, mlp="swiglu", norm="rmsnorm", position="rotary",
    linear_bias=False, dropout=False, num_experts=4, experts_per_token=2,
)

S, SBH = 2048, 2048 * 12288  # GPT-3 sequence and s·b·h at b = 1
LN_STATS = 2 * 2 * 4  # two LayerNorms x (mean + rstd) x fp32, per token


def inventory(model, s=S, b=1, e=2, **layout):
    return act.layer_saved_bytes(model, Layout(**{"flash_attention": False, **layout}), s, b, e)


def seed_part(inv):
    """The inventory without the terms the seed and Korthikanti neglect (norm statistics)."""
    return sum(n for name, n in inv.items() if name not in act.NEGLECTED_BY_SEED)


# --------------------------------------------------------------------------- GPT block, t = 1


def test_gpt_block_itemised_seed_004():
    inv = inventory(GPT3)
    a, f = 96, 49152  # GPT-3: 96 heads, f = 4h = 49152
    assert inv == {
        "norm1.input": 2 * SBH, "norm1.stats": 8 * S,
        "attn.qkv_input": 2 * SBH, "attn.q": 2 * SBH, "attn.k": 2 * SBH, "attn.v": 2 * SBH,
        "attn.softmax_output": 2 * a * S * S, "attn.softmax_dropout_mask": a * S * S,
        "attn.softmax_dropout_output": 2 * a * S * S, "attn.proj_input": 2 * SBH,
        "attn.dropout_mask": SBH,
        "norm2.input": 2 * SBH, "norm2.stats": 8 * S,
        "mlp.fc1_input": 2 * SBH, "mlp.act_input": 2 * S * f, "mlp.fc2_input": 2 * S * f,
        "mlp.dropout_mask": SBH,
    }
    assert 2 * S * f == 8 * SBH  # f = 4h: GELU input and fc2 input are 8sbh each (seed 004)


def test_gpt3_seed_total_275_gb():
    # seed 004 §2.2.4: (34sbh + 5as²b) x 96 layers, b = 1, s = 2048 -> 275,414,777,856 bytes
    per_layer = seed_part(inventory(GPT3))
    assert per_layer * 96 == 275_414_777_856
    assert act.seed_layer_bytes_34sbh(S, 1, 12288, 96) * 96 == 275_414_777_856
    # the statistics the seed neglects: 2 norms x 8 bytes x 2048 tokens = 32,768 bytes per layer
    assert sum(inventory(GPT3).values()) - per_layer == 32_768


def test_gpt3_seed_total_b64_17_6_tb():
    # seed 004 §2.2.4: b = 64 -> 17,626,545,782,784 bytes ≈ 17.6 TB
    assert seed_part(inventory(GPT3, b=64)) * 96 == 17_626_545_782_784
    assert act.seed_layer_bytes_34sbh(S, 64, 12288, 96) * 96 == 17_626_545_782_784


def test_fp32_activations_keep_one_byte_masks():
    # e = 4: 16 fp16-sized sbh elements become 64sbh, the two sbh masks stay 2sbh;
    # attention core: 2 x 2as²b elements at 4 bytes = 8as²b, mask as²b
    a = 96
    assert seed_part(inventory(GPT3, e=4)) == 66 * SBH + 9 * a * S * S


# --------------------------------------------------------------------------- tensor / sequence parallel


def test_tp8_without_sp_korthikanti():
    # sbh(10 + 24/t + 5as/(ht)), t = 8: 10sbh + 3sbh + 5·96·2048²/8
    #   = 251,658,240 + 75,497,472 + 251,658,240 = 578,813,952
    inv = inventory(GPT3, tp=8)
    assert seed_part(inv) == 578_813_952
    assert seed_part(inv) == act.korthikanti_bytes(S, 1, 12288, 1, 96, 8, "none")
    assert inv["norm1.stats"] == 8 * S  # norms are replicated without SP


def test_tp8_with_sp_korthikanti():
    # sbh(34/t + 5as/(ht)): 34 x 25,165,824 / 8 + 251,658,240 = 106,954,752 + 251,658,240
    inv = inventory(GPT3, tp=8, sequence_parallel=True)
    assert seed_part(inv) == 358_612_992
    assert seed_part(inv) == act.korthikanti_bytes(S, 1, 12288, 1, 96, 8, "none", sequence_parallel=True)
    assert inv["norm1.stats"] == 8 * S // 8


def test_tp1_korthikanti_is_seed_form():
    # sbh(34 + 5as/h) at t = 1 is the seed's 34sbh + 5as²b
    assert act.korthikanti_bytes(S, 1, 12288, 1, 96, 1, "none") == 34 * SBH + 5 * 96 * S * S


def test_tp_must_divide_heads():
    with pytest.raises(PlanInputError, match="tp"):
        inventory(GPT3, tp=5)


def test_sp_must_divide_sequence():
    with pytest.raises(PlanInputError, match="seq_len"):
        inventory(GPT3, s=2050, tp=8, sequence_parallel=True)


# --------------------------------------------------------------------------- recompute


def kept(model, s=S, b=1, e=2, **layout):
    return act.layer_activation_bytes(model, Layout(**{"flash_attention": False, **layout}), s, b, e)


def test_selective_recompute_korthikanti():
    # without SP: sbh(10 + 24/t) = 13sbh at t = 8; with SP: 34sbh/8; norm stats on top
    assert kept(GPT3, tp=8, recompute="selective") == 13 * SBH + 2 * 8 * S
    assert kept(GPT3, tp=8, recompute="selective") - 2 * 8 * S == act.korthikanti_bytes(
        S, 1, 12288, 1, 96, 8, "selective")
    with_sp = kept(GPT3, tp=8, sequence_parallel=True, recompute="selective")
    assert with_sp == 34 * SBH // 8 + 2 * 8 * S // 8


def test_full_recompute_keeps_layer_input():
    # 2sbh per layer (Korthikanti, seed 004 "2·sbhL"); ÷t with SP (the SP shard)
    assert kept(GPT3, recompute="full") == 2 * SBH == act.korthikanti_bytes(S, 1, 12288, 1, 96, 1, "full")
    assert kept(GPT3, tp=8, sequence_parallel=True, recompute="full") == 2 * SBH // 8


def test_every_k_counts_checkpoints():
    layout = Layout(flash_attention=False, recompute="every_k", recompute_every_k=4)
    # 10 layers in segments of 4 -> ceil(10/4) = 3 checkpoints of 2sbh
    assert act.layers_kept_bytes(GPT3, layout, S, 1, 2, 10) == 3 * 2 * SBH
    # ZeRO-Infinity eq.3 with ci = 4 over 12 layers: 2·bsz·seq·hd·nl/ci = 6sbh
    assert act.layers_kept_bytes(GPT3, layout, S, 1, 2, 12) == act.checkpoint_bytes(1, S, 12288, 12, 4)


def test_recompute_working_memory():
    full_inventory = sum(inventory(GPT3).values())
    core = 5 * 96 * S * S  # softmax output 2as²b + mask as²b + dropout output 2as²b
    assert act.recompute_working_bytes(GPT3, Layout(flash_attention=False), S, 1, 2, 10) == 0
    assert act.recompute_working_bytes(GPT3, Layout(flash_attention=False, recompute="full"), S, 1, 2, 10) == full_inventory
    every_3 = Layout(flash_attention=False, recompute="every_k", recompute_every_k=3)
    assert act.recompute_working_bytes(GPT3, every_3, S, 1, 2, 10) == 3 * full_inventory
    assert act.recompute_working_bytes(GPT3, Layout(flash_attention=False, recompute="selective"), S, 1, 2, 10) == core


# --------------------------------------------------------------------------- Llama, GQA, flash, MoE


def test_llama2_block_swiglu_rmsnorm_no_dropout():
    s, h, a, f = 4096, 4096, 32, 11008
    sbh = s * h
    inv = inventory(LLAMA2_7B, s=s)
    assert inv == {
        "norm1.input": 2 * sbh, "norm1.stats": 4 * s,  # RMSNorm: fp32 rstd only
        "attn.qkv_input": 2 * sbh, "attn.q": 2 * sbh, "attn.k": 2 * sbh, "attn.v": 2 * sbh,
        "attn.softmax_output": 2 * a * s * s, "attn.proj_input": 2 * sbh,
        "norm2.input": 2 * sbh, "norm2.stats": 4 * s,
        "mlp.fc1_input": 2 * sbh,
        # SiLU input (gate out), SiLU output, up output, down input: 2·s·f each
        "mlp.act_input": 2 * s * f, "mlp.act_output": 2 * s * f,
        "mlp.up_output": 2 * s * f, "mlp.fc2_input": 2 * s * f,
    }
    # 16sbh + 8sf + 2as² + 8s = 268,435,456 + 360,710,144 + 1,073,741,824 + 32,768
    assert sum(inv.values()) == 1_702_920_192


def test_gqa_unfused_attention_saves_repeated_kv():
    # Megatron's unfused attention repeat_interleaves K and V to the 32 query heads
    inv = inventory(LLAMA3_8B, s=4096)
    assert inv["attn.k"] == inv["attn.v"] == inv["attn.q"] == 2 * 4096 * 32 * 128


def test_gqa_flash_attention_saves_kv_heads_and_lse():
    s = 4096
    inv = inventory(LLAMA3_8B, s=s, flash_attention=True)
    assert inv["attn.q"] == 2 * s * 32 * 128           # 33,554,432
    assert inv["attn.k"] == inv["attn.v"] == 2 * s * 8 * 128  # 8,388,608: 8 kv heads
    assert inv["attn.softmax_lse"] == 32 * s * 4       # fp32 (b, a, s): 524,288
    assert not any(name.startswith("attn.softmax_") and name != "attn.softmax_lse" for name in inv)
    # tp = 4: 8 query heads, 2 kv heads per rank
    inv4 = inventory(LLAMA3_8B, s=s, flash_attention=True, tp=4)
    assert inv4["attn.k"] == 2 * s * 2 * 128 and inv4["attn.softmax_lse"] == 8 * s * 4


def test_flash_attention_gpt_block():
    # GPT-3 with flash: 34sbh - (no s² terms) + lse a·s·b·4, masks of the residual dropouts stay
    inv = inventory(GPT3, flash_attention=True)
    assert seed_part(inv) == 34 * SBH + 96 * S * 4


def test_moe_block_by_hand():
    # s = 4, b = 1, h = 8, a = 2 (d = 4), E = 4, top-2, expert f = 16, SwiGLU, RMSNorm, bf16
    inv = inventory(TINY_MOE, s=4)
    assert inv == {
        "norm1.input": 4 * 8 * 2, "norm1.stats": 4 * 4,                       # 64, 16
        "attn.qkv_input": 64, "attn.q": 64, "attn.k": 64, "attn.v": 64,
        "attn.softmax_output": 2 * 4 * 4 * 2,                                # a·s²·2 = 64
        "attn.proj_input": 64,
        "norm2.input": 64, "norm2.stats": 16,
        "mlp.fc1_input": 64,
        "moe.router_probs": 4 * 4 * 4,                                       # s·E fp32 = 64
        "moe.expert_input": 2 * 4 * 8 * 2,                                   # k·s·h·2 = 128
        "moe.expert.act_input": 2 * 4 * 16 * 2, "moe.expert.act_output": 256,  # k·s·f·2 = 256
        "moe.expert.up_output": 256, "moe.expert.fc2_input": 256,
        "moe.expert_output": 128,                                            # k·s·h·2
        "moe.routing_weights": 2 * 4 * 2,                                    # k·s·2 = 16
    }


# --------------------------------------------------------------------------- Tempo (seed 003)


GPT_SMALL = ModelSpec(  # GPT-2-small-like: h = 768, a = 12, f = 3072
    name="gpt-small", num_layers=12, hidden_size=768, num_heads=12, ffn_hidden_size=3072,
    vocab_size=50257, max_seq_len=1024,
)


def test_tempo_gelu_keeps_one_bit():
    s = 512
    base, tempo = inventory(GPT_SMALL, s=s), inventory(GPT_SMALL, s=s, tempo=("gelu",))
    assert "mlp.act_input" not in tempo
    assert tempo["mlp.act_sign_bits"] == s * 3072 // 8  # 196,608 bytes instead of 2·s·f = 3,145,728
    assert sum(base.values()) - sum(tempo.values()) == 2 * s * 3072 - s * 3072 // 8


def test_tempo_layernorm_drops_norm_inputs_keeps_stats():
    s = 512
    tempo = inventory(GPT_SMALL, s=s, tempo=("layernorm",))
    assert "norm1.input" not in tempo and "norm2.input" not in tempo
    assert tempo["norm1.stats"] == 8 * s
    assert sum(inventory(GPT_SMALL, s=s).values()) - sum(tempo.values()) == 2 * 2 * s * 768


def test_tempo_dropout_drops_attention_dropout_output():
    s = 512
    tempo = inventory(GPT_SMALL, s=s, tempo=("dropout",))
    assert "attn.softmax_dropout_output" not in tempo
    assert tempo["attn.softmax_dropout_mask"] == 12 * s * s
    assert sum(inventory(GPT_SMALL, s=s).values()) - sum(tempo.values()) == 2 * 12 * s * s


def test_tempo_all_three():
    s = 512
    dropped = 2 * s * 3072 - s * 3072 // 8 + 2 * 2 * s * 768 + 2 * 12 * s * s
    all3 = inventory(GPT_SMALL, s=s, tempo=("gelu", "layernorm", "dropout"))
    assert sum(inventory(GPT_SMALL, s=s).values()) - sum(all3.values()) == dropped


def test_tempo_rejects_models_without_the_layer():
    with pytest.raises(PlanInputError, match="tempo"):
        inventory(LLAMA2_7B, s=128, tempo=("gelu",))
    with pytest.raises(PlanInputError, match="tempo"):
        inventory(LLAMA2_7B, s=128, tempo=("dropout",))


# --------------------------------------------------------------------------- pipeline stages


def setup(seq_len=S, global_batch=8):
    return TrainSetup(seq_len=seq_len, global_batch=global_batch, train_tokens=1e9,
                      precision=get_precision("zero-fp16"), optimizer=get_optimizer("adam"))


def test_1f1b_in_flight_counts_seed_004():
    # seed 004 §3.5.2: stage i of p = 4 holds p - i + 1 = 4, 3, 2, 1 micro-batches
    stages = act.stage_activations(GPT3, Layout(flash_attention=False, pp=4, grad_accum=8), setup(), [24] * 4)
    assert [st.in_flight_microbatches for st in stages] == [4, 3, 2, 1]
    # fewer micro-batches than stages: min(p - i + 1, m)
    stages = act.stage_activations(GPT3, Layout(flash_attention=False, pp=4, grad_accum=2), setup(), [24] * 4)
    assert [st.in_flight_microbatches for st in stages] == [2, 2, 2, 1]


def test_13b_seed_example_stage_activations():
    # seed 004 §3.5.1-3.5.2: 40·s·h·L = 33,554,432,000 ≈ 34 GB for 13B (s 4096, h 5120, L 40);
    # pp = 4: 8.5 GB per micro-batch per stage, the first stage holds 4 -> 34 GB
    whole = act.megatron_40shl_bytes(4096, 5120, 40)
    assert whole == 33_554_432_000
    assert whole // 4 == 8_388_608_000  # per stage per micro-batch; the seed's 34 GB / 4 = 8.5 GB
    gpt13b = ModelSpec(name="gpt3-13b", num_layers=40, hidden_size=5120, num_heads=40,
                       ffn_hidden_size=20480, vocab_size=50257, max_seq_len=4096)
    stages = act.stage_activations(gpt13b, Layout(flash_attention=False, pp=4, grad_accum=16, recompute="selective"),
                                   setup(4096), [10] * 4)
    layer = act.layer_activation_bytes(gpt13b, Layout(flash_attention=False, recompute="selective"), 4096, 1, 2)
    assert layer == 34 * 4096 * 5120 + 2 * 8 * 4096  # selective at t = 1: 34sbh + norm stats
    middle = stages[1]
    assert middle.extras == {} and middle.per_microbatch_bytes == 10 * layer
    core = 5 * 40 * 4096 * 4096  # one block's attention core re-materialised: 5as²b = 3,355,443,200
    assert middle.recompute_working_bytes == core
    assert middle.total_bytes == 3 * 10 * layer + core
    first = stages[0]
    assert first.total_bytes == 4 * (10 * layer + sum(first.extras.values())) + core


def test_stage_extras_named():
    s, b, V = S, 1, 50257
    stages = act.stage_activations(GPT3, Layout(flash_attention=False, pp=2, grad_accum=4), setup(), [48, 48])
    assert stages[0].extras == {"embedding.token_ids": 8 * s, "embedding.dropout_mask": SBH}
    assert stages[1].extras == {"final_norm.input": 2 * SBH, "final_norm.stats": 8 * s,
                                "head.input": 2 * SBH, "head.logits_fp32": 4 * s * b * V}
    # tp = 8: vocab-parallel logits on the largest rank, ceil(50257 / 8) = 6283 rows
    stages = act.stage_activations(GPT3, Layout(flash_attention=False, pp=2, tp=8, grad_accum=4), setup(), [48, 48])
    assert stages[1].extras["head.logits_fp32"] == 4 * s * 6283


def test_full_recompute_stage_has_working_memory():
    stages = act.stage_activations(GPT3, Layout(flash_attention=False, pp=2, grad_accum=4, recompute="full"), setup(), [48, 48])
    one_block = sum(inventory(GPT3).values())
    st = stages[1]
    assert st.recompute_working_bytes == one_block
    assert st.total_bytes == 1 * (48 * 2 * SBH + sum(st.extras.values())) + one_block


def test_interleaved_first_stage_factor():
    # Korthikanti §4.2.3: first stage keeps L/p·(1 + (p-1)/(pv)) layers' worth of p micro-batches;
    # Megatron warmup on rank 0 = 2(p-1) + (v-1)p chunks, +1 in steady state: p=4, v=2 -> 11
    # chunks of 24/2 = 12 layers = 132 layer-micro-batches = 96·(1 + 3/8)
    p, v, L = 4, 2, 96
    assert act.interleaved_in_flight(p, 0, v, 8) == [7, 4]  # 4 + 3 chunk-0, 4 chunk-1 passes
    # one step later (forward 11 on chunk 0, backward 0 on chunk 1) the split is [8, 3]: the
    # heavier mix when chunk 0 also carries the embedding extras
    assert act.interleaved_in_flight(p, 0, v, 8, [2, 1]) == [8, 3]
    assert sum(act.interleaved_in_flight(p, 0, v, 8)) * (L // p // v) == L * (1 + (p - 1) / (p * v))
    # last rank: warmup (v-1)p = 4, +1 -> 5 chunks
    assert sum(act.interleaved_in_flight(p, 3, v, 8)) == 5
    full = Layout(flash_attention=False, pp=p, virtual_stages=v, grad_accum=8, recompute="full")
    stages = act.stage_activations(GPT3, full, setup(), [24] * 4)
    assert stages[0].in_flight_chunks == 11 and stages[0].in_flight_microbatches == 6
    chunk0 = 12 * 2 * SBH + sum(stages[0].extras.values())
    assert stages[0].total_bytes - stages[0].recompute_working_bytes == 8 * chunk0 + 3 * 12 * 2 * SBH


def test_interleaved_needs_divisible_chunks():
    with pytest.raises(PlanInputError, match="virtual_stages"):
        act.stage_activations(GPT3, Layout(flash_attention=False, pp=4, virtual_stages=5, grad_accum=8), setup(), [24] * 4)


# --------------------------------------------------------------------------- ZeRO-Infinity forms


def test_zero_infinity_forms():
    # eq.3: 2·bsz·seq·hd·nl/ci, bsz 32, seq 1024, hd 12288, nl 96, ci 1 = 77,309,411,328 bytes
    assert act.checkpoint_bytes(32, 1024, 12288, 96, 1) == 77_309_411_328
    # eq.4 AWM: bsz·seq·ci·(16·hd + 2·heads·seq) = 32·1024·(196,608 + 196,608) = 12,884,901,888
    assert act.awm_bytes(32, 1024, 1, 12288, 96) == 12_884_901_888
    # eq.4 MSWM: 4·hd·4hd = 16 x 12288² = 2,415,919,104 bytes
    assert act.mswm_bytes(12288) == 2_415_919_104


def test_korthikanti_unknown_mode():
    with pytest.raises(PlanInputError, match="mode"):
        act.korthikanti_bytes(S, 1, 12288, 1, 96, 1, "sometimes")


def test_seed_form_scaling_is_exact_for_fp32():
    assert act.seed_layer_bytes_34sbh(S, 1, 12288, 96, bytes_per=4) == 2 * (34 * SBH + 5 * 96 * S * S)
    assert math.isclose(act.korthikanti_bytes(S, 1, 12288, 96, 96, 1, "none"), 275_414_777_856)


def test_flash_inventory_matches_torch_sdpa_saved_tensors():
    """Measured: PyTorch's CPU flash SDPA (ScaledDotProductFlashAttentionForCpuBackward0) saves
    q, k, v (kv heads with enable_gqa), the fp32 log-sum-exp (b, a, s) and the output."""
    torch = pytest.importorskip("torch")
    s, a, kv, d = 64, 4, 2, 16
    model = ModelSpec(name="tiny-gqa", num_layers=1, hidden_size=a * d, num_heads=a, num_kv_heads=kv,
                      ffn_hidden_size=128, vocab_size=10, max_seq_len=s, dropout=False)
    q = torch.randn(1, a, s, d, requires_grad=True)
    k = torch.randn(1, kv, s, d, requires_grad=True)
    v = torch.randn(1, kv, s, d, requires_grad=True)
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    inv = inventory(model, s=s, e=4, flash_attention=True)
    expected = sum(inv[name] for name in ("attn.q", "attn.k", "attn.v", "attn.softmax_lse",
                                          "attn.proj_input"))
    # q 16,384 + k 8,192 + v 8,192 + lse 1,024 + out 16,384 bytes (fp32)
    assert sum(storages.values()) == expected == 50_176


def test_non_positive_sizes_name_the_field():
    with pytest.raises(PlanInputError, match="micro_batch"):
        inventory(GPT3, b=0)


def test_selective_recompute_keeps_gqa_k_v_at_kv_heads():
    """Selective recompute with GQA (no flash): Megatron repeats K, V to the query heads inside
    the checkpointed core_attention, so what is kept has kv heads (measured by `zplan calibrate`,
    docs/calibrate.md finding 1). Llama-3-8B: a = 32, kv = 8, d = 128; s = 4096, b = 1, t = 1, bf16."""
    s, b, e, d = 4096, 1, 2, 128
    layout = Layout(flash_attention=False, recompute="selective")
    kept = act.selective_kept_bytes(LLAMA3_8B, layout, s, b, e,
                                    act.layer_saved_bytes(LLAMA3_8B, layout, s, b, e))
    assert kept["attn.k"] == kept["attn.v"] == 4096 * 1 * 8 * 128 * 2  # 8,388,608 bytes
    full = act.layer_saved_bytes(LLAMA3_8B, Layout(flash_attention=False), s, b, e)
    repeated_kv = 2 * s * b * 32 * d * e  # K and V at the 32 query heads, as saved without recompute
    core = sum(n for name, n in full.items() if name in act.ATTENTION_CORE)
    kept_total = sum(full.values()) - core - repeated_kv + 2 * s * b * 8 * d * e
    assert act.layer_activation_bytes(LLAMA3_8B, layout, s, b, e) == kept_total
    # what is re-materialised in backward: the core plus the repeated K, V beyond the kv heads
    working = act.recompute_working_bytes(LLAMA3_8B, layout, s, b, e, num_layers=1)
    assert working == core + repeated_kv - 2 * s * b * 8 * d * e
