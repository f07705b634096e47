"""Multi-head latent attention (DeepSeek-V2/V3) in training: saved bytes by hand.

transformers side: a tiny DeepSeek-V3 built from a config dict (transformers 5.23.0
DeepseekV3ForCausalLM, no download), measured on CPU under saved-tensor hooks, against hand
calculations. Megatron side: the DeepSeek-V3 preset against hand calculations from
Megatron-LM multi_latent_attention.py (commit d98e8a64; derivation in docs/activations.md).

Tiny model: h = 16, a = 4 heads, q_lora_rank r_q = 12, kv_lora_rank r_kv = 10, qk_nope = 4,
qk_rope = 2 (dq = 6), v_head_dim dv = 5, dense f = 24, s = 8, b = 2 (T = 16 tokens);
layer 0 dense (first_k_dense_replace = 1), layer 1 MoE. s differs from dq so the harness tells
K (dq x s) from V (s x dv) and Q (s x dq) from the probabilities (s x s).
"""

from __future__ import annotations

import pytest

from planner.core.errors import PlanInputError
from planner.core.spec import Layout
from planner.io.loading import load_model
from planner.memory import activations
from planner.memory import implementations as impls

S, B, T = 8, 2, 16
MLA = dict(model_type="deepseek_v3", hidden_size=16, intermediate_size=24, moe_intermediate_size=8,
           num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2, vocab_size=32,
           q_lora_rank=12, kv_lora_rank=10, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=5,
           n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
           first_k_dense_replace=1, max_position_embeddings=16, rope_interleave=True)
MLA_EQUAL = MLA | {"v_head_dim": 6}  # dq = dv = 6: the CPU flash kernel takes it


def _spec(config):
    from planner.io.hf_config import model_from_hf_dict
    return model_from_hf_dict(config, name="tiny-deepseek-v3")


def _measure(config, attention, precision, recompute="none"):
    pytest.importorskip("transformers")
    from planner.calibrate import hf_models
    model = hf_models.build_model(config, attention, precision)
    if recompute == "full":
        model.gradient_checkpointing_enable()  # what HF Trainer calls
    return hf_models.measure(model, S, B, precision, flops=False)


def _impl(name, precision, recompute="none"):
    return impls.Implementation(name=name, precision=precision, device="cpu", recompute=recompute)


def _fp32_attention_by_hand():
    return {
        "attn.qkv_input": T * 16 * 4,                  # 1024: feeds q_a_proj and kv_a_proj_with_mqa
        "attn.q_norm.input": T * 12 * 4,               # 768: q_a_proj output, kept by pow
        "attn.q_norm.stats": T * 4,                    # 64
        "attn.q_norm.normalized": T * 12 * 4,          # 768
        "attn.q_up_input": T * 12 * 4,                 # 768: weight * normalized
        "attn.kv_norm.input": T * (10 + 2) * 4,        # 768: the split view keeps kv_a's whole output
        "attn.kv_norm.stats": T * 4,
        "attn.kv_norm.normalized": T * 10 * 4,         # 640
        "attn.kv_up_input": T * 10 * 4,                # 640
        "attn.q": T * 4 * 6 * 4, "attn.k": T * 4 * 6 * 4,  # 1536 each: cat / expand_kv, a heads of dq
        "attn.softmax_output": T * 4 * 8 * 4,          # 2048: fp32 softmax (b, a, s, s)
        "attn.v": T * 4 * 5 * 4,                       # 1280: contiguous copy of the value view
        "attn.proj_input": T * 4 * 5 * 4,              # 1280: o_proj input (T, a·dv)
    }


def test_hf_eager_fp32_dense_block_by_hand():
    norm = {"input": T * 16 * 4, "stats": T * 4, "normalized": T * 16 * 4}
    expected = {f"norm1.{k}": v for k, v in norm.items()} | {f"norm2.{k}": v for k, v in norm.items()}
    expected |= _fp32_attention_by_hand()
    expected |= {"mlp.fc1_input": T * 16 * 4, "mlp.act_input": T * 24 * 4, "mlp.act_output": T * 24 * 4,
                 "mlp.up_output": T * 24 * 4, "mlp.fc2_input": T * 24 * 4}
    assert sum(_fp32_attention_by_hand().values()) == 13184
    assert sum(expected.values()) == 2112 + 13184 + 2112 + 1024 + 4 * 1536 == 24576
    got = _measure(MLA, "eager", "fp32")
    assert got.block(0) == expected
    assert impls.block_saved_bytes(_spec(MLA), _impl("hf-eager", "fp32"), S, B, moe=False) == expected
    # the MoE block's attention is the same
    assert {k: v for k, v in got.block(1).items() if k.startswith("attn")} == _fp32_attention_by_hand()
    # outside: rotary cos and sin (1, s, qk_rope) fp32 = 2·8·2·4 = 128, the rest as Llama
    assert got.outside["rotary.cos_sin"] == 128
    assert impls.hf_outside_saved_bytes(_spec(MLA), _impl("hf-eager", "fp32"), S, B) == got.outside


def test_hf_eager_bf16_and_autocast_attention_by_hand():
    bf16 = {
        "attn.qkv_input": T * 16 * 2,                                    # 512
        "attn.q_norm.input": T * 12 * 4, "attn.q_norm.stats": T * 4,     # fp32 copy by .to(float32)
        "attn.q_norm.normalized": T * 12 * 2, "attn.q_up_input": T * 12 * 2,
        "attn.kv_norm.input": T * 10 * 4,                                # 640: a copy of the r_kv part only
        "attn.kv_norm.stats": T * 4, "attn.kv_norm.normalized": T * 10 * 2, "attn.kv_up_input": T * 10 * 2,
        "attn.q": T * 4 * 6 * 2, "attn.k": T * 4 * 6 * 2,
        "attn.softmax_output": T * 4 * 8 * 4, "attn.softmax_cast": T * 4 * 8 * 2,  # fp32, then .to(bf16)
        "attn.v": T * 4 * 5 * 2, "attn.proj_input": T * 4 * 5 * 2,
    }
    assert sum(bf16.values()) == 2112 + 1344 + 1536 + 3072 + 1280 == 9344
    got = _measure(MLA, "eager", "bf16")
    assert {k: v for k, v in got.block(0).items() if k.startswith("attn")} == bf16
    # autocast: two 16-bit casts of the norm output (q_a and kv_a each cast their input),
    # and the weight casts of q_a 16x12, q_b 12x24, kv_a 16x12, kv_b 10x36, o 20x16 + dense MLP 3x16x24
    auto = bf16 | {"attn.qkv_input": 2 * T * 16 * 2}
    got = _measure(MLA, "eager", "autocast-bf16").block(0)
    assert {k: v for k, v in got.items() if k.startswith("attn")} == auto
    assert got["autocast.weight_casts"] == (16 * 12 + 12 * 24 + 16 * 12 + 10 * 36 + 20 * 16 + 3 * 16 * 24) * 2
    pred = impls.block_saved_bytes(_spec(MLA), _impl("hf-eager", "autocast-bf16"), S, B, moe=False)
    assert pred == got


def test_hf_sdpa_cpu_flash_when_widths_match_by_hand():
    """dq = dv = 6: q, k (b, a, s, 6), the value view keeps kv_b_proj's whole output
    T·a·(qk_nope + dv), the fp32 log-sum-exp (b, a, s), and two copies of (T, a·dv) (kernel
    output and o_proj input, measured as separate storages)."""
    got = _measure(MLA_EQUAL, "sdpa", "bf16").block(0)
    expected = {"attn.q": T * 4 * 6 * 2, "attn.k": T * 4 * 6 * 2, "attn.v": T * 4 * (4 + 6) * 2,
                "attn.softmax_lse": 2 * 4 * 8 * 4, "attn.proj_input": 2 * T * 4 * 6 * 2}
    assert {k: got[k] for k in expected} == expected == {"attn.q": 768, "attn.k": 768, "attn.v": 1280,
                                                         "attn.softmax_lse": 256, "attn.proj_input": 1536}
    assert impls.block_saved_bytes(_spec(MLA_EQUAL), _impl("hf-sdpa", "bf16"), S, B, moe=False) == got
    with pytest.raises(PlanInputError, match="v_head_dim"):
        impls.block_saved_bytes(_spec(MLA), _impl("hf-sdpa", "bf16"), S, B)


@pytest.mark.parametrize("precision,elem", [("fp32", 4), ("bf16", 2)])
def test_hf_full_recompute_keeps_block_inputs(precision, elem):
    got = _measure(MLA, "eager", precision, recompute="full")
    for layer in (0, 1):  # each block keeps its input (T, h) in the residual dtype
        assert sum(got.block(layer).values()) == T * 16 * elem
    pred = impls.block_saved_bytes(_spec(MLA), _impl("hf-eager", precision, "full"), S, B)
    assert pred == {"checkpoint.block_input": T * 16 * elem}


def test_megatron_mla_deepseek_v3_by_hand():
    """DeepSeek-V3 (h 7168, a 128, r_q 1536, r_kv 512, dq 128 + 64, dv 128), s = 4096, b = 1, bf16,
    flash attention, tp = 1: the attention entries from multi_latent_attention.py."""
    m = load_model("deepseek-v3")
    s = 4096
    got = activations.attention_saved_bytes(m, Layout(), s, 1, 2)
    expected = {
        "attn.qkv_input": s * 7168 * 2,                      # 58,720,256: input norm output
        "attn.q_norm.input": s * 1536 * 2, "attn.q_norm.stats": s * 4, "attn.q_norm.output": s * 1536 * 2,
        "attn.kv_norm.input": s * 512 * 2, "attn.kv_norm.stats": s * 4, "attn.kv_norm.output": s * 512 * 2,
        "attn.q": s * 128 * 192 * 2, "attn.k": s * 128 * 192 * 2,   # 201,326,592 each
        "attn.v": s * 128 * 128 * 2,                         # 134,217,728
        "attn.softmax_lse": 128 * s * 4,
        "attn.proj_input": s * 128 * 128 * 2,
    }
    assert got == expected
    # 58,720,256 + 2·12,582,912 + 2·16,384 + 2·4,194,304 + 2·201,326,592 + 2·134,217,728 + 2,097,152
    assert sum(expected.values()) == 765_493_248
    # the old h/a head width (56) would have given q = 4096·128·56·2 = 58,720,256
    assert got["attn.q"] == 201_326_592
    # tp = 8 with sequence parallelism: the replicated tensors (norm, latents) at s/8 tokens,
    # the heads split 16 per rank
    tp = activations.attention_saved_bytes(m, Layout(tp=8, sequence_parallel=True), s, 1, 2)
    assert tp["attn.qkv_input"] == 512 * 7168 * 2 and tp["attn.kv_norm.input"] == 512 * 512 * 2
    assert tp["attn.q"] == s * 16 * 192 * 2 and tp["attn.v"] == s * 16 * 128 * 2


def test_megatron_mla_selective_drops_only_the_core():
    """Default --recompute-modules ["core_attn"]: the lse goes, q, k, v stay at a/t heads of the
    MLA widths (no kv-head reduction: MLA has one key and value per query head)."""
    m = load_model("deepseek-v3")
    s, lay = 4096, Layout(tp=8, sequence_parallel=True, recompute="selective")
    inv = activations.layer_saved_bytes(m, lay, s, 1, 2, moe=False)
    kept = activations.selective_kept_bytes(m, lay, s, 1, 2, inv)
    assert "attn.softmax_lse" not in kept
    assert kept["attn.k"] == s * 16 * 192 * 2 and kept["attn.v"] == s * 16 * 128 * 2
    assert sum(inv.values()) - sum(kept.values()) == 16 * s * 4


def test_hf_deepseek_v3_moe_block_fp32_by_hand():
    """Layer 1: DeepseekV3MoE, E = 4 experts, top-2 (K = 32 routed copies), n_group = topk_group
    = 1, expert width 8, one shared expert of width 8; the block runs in fp32."""
    moe = {
        "mlp.fc1_input": T * 16 * 4,              # router input (no fp32 copy in fp32), shared by the shared expert
        "moe.router_probs": T * 4 * 4,            # sigmoid output (T, E)
        "moe.group_topk_indices": T * 1 * 2 * 8 + T * 1 * 8,  # topk(2) per group, then topk_group
        "moe.group_mask": T * 4,                  # bool (T, E) of masked_fill
        "moe.topk_indices": T * 2 * 8,            # final topk = gather index
        "moe.topk_values": T * 2 * 4, "moe.topk_sum": T * 4,   # in-place renormalisation
        "moe.routing_weights": 32 * 4,            # (K, 1) after routed_scaling_factor
        "moe.indices": 3 * 32 * 8, "moe.offsets": 4 * 4,
        "moe.expert_input": 32 * 16 * 4, "moe.expert.gate_up_output": 32 * 16 * 4,
        "moe.expert.act_output": 32 * 8 * 4, "moe.expert.fc2_input": 32 * 8 * 4,
        "moe.expert_output": 32 * 16 * 4,
        "moe.shared.act_input": T * 8 * 4, "moe.shared.act_output": T * 8 * 4,
        "moe.shared.up_output": T * 8 * 4, "moe.shared.fc2_input": T * 8 * 4,
    }
    assert sum(moe.values()) == 2304 + 784 + 8192 + 2048 == 13328
    got = _measure(MLA, "eager", "fp32")
    assert {k: v for k, v in got.block(1).items() if k.startswith(("moe", "mlp"))} == moe
    assert sum(got.block(1).values()) == 2 * 2112 + 13184 + 13328 == 30736
    impl = _impl("hf-eager", "fp32").model_copy(update={"router_groups": 1, "router_topk_groups": 1})
    assert impls.block_saved_bytes(_spec(MLA), impl, S, B, moe=True) == got.block(1)
    # the whole forward: dense block + MoE block + outside, to the byte
    assert impls.model_saved_bytes(_spec(MLA), impl, S, B) == got.total_bytes() == 24576 + 30736 + 5572


def test_hf_deepseek_v3_moe_block_bf16_router_copies_by_hand():
    """bf16 weights: the router casts its input (T, h) and its weight (E, h) to fp32; the shared
    expert reads the bf16 input (one more storage); the router tensors stay fp32."""
    got = _measure(MLA, "eager", "bf16").block(1)
    assert got["mlp.fc1_input"] == T * 16 * 4 + T * 16 * 2 == 1536
    assert got["moe.router_weight_cast"] == 4 * 16 * 4 == 256
    assert got["moe.router_probs"] == T * 4 * 4 and got["moe.routing_weights"] == 32 * 4
    assert got["moe.expert_input"] == 32 * 16 * 2
    impl = _impl("hf-eager", "bf16").model_copy(update={"router_groups": 1, "router_topk_groups": 1})
    assert impls.block_saved_bytes(_spec(MLA), impl, S, B, moe=True) == got


def test_hf_eager_micro_batch_one_keeps_the_value_view_by_hand():
    """b = 1: the value view (1, a, s, dv) of kv_b's output folds into bmm's (a, s, dv) without a
    copy, so the matmul keeps kv_b's whole output T·a·(qk_nope + dv)·4 = 8·4·9·4 = 1152 B
    (with b = 2 it copied T·a·dv·4)."""
    pytest.importorskip("transformers")
    from planner.calibrate import hf_models
    model = hf_models.build_model(MLA, "eager", "fp32")
    got = hf_models.measure(model, S, 1, "fp32", flops=False).block(0)
    assert got["attn.v"] == 8 * 4 * (4 + 5) * 4 == 1152
    assert got["attn.proj_input"] == 8 * 4 * 5 * 4
    assert impls.block_saved_bytes(_spec(MLA), _impl("hf-eager", "fp32"), S, 1, moe=False) == got


def test_megatron_mla_fp8_linear_inputs_by_hand():
    """te-fp8 per-tensor (1 byte per element + one 4-byte fp32 scale per saved input), DeepSeek-V3,
    s = 4096, b = 1, tp = 1: the two down projections each keep an fp8 copy of the norm output
    (h = 7168 columns), the up projections their latent norm outputs (r_q 1536, r_kv 512 columns),
    linear_proj its input a·dv = 16,384 columns; q, k, v stay bf16 (flash)."""
    m = load_model("deepseek-v3")
    s = 4096
    inv = activations.layer_saved_bytes(m, Layout(), s, 1, 2, fp8_scaling="per-tensor", moe=False)
    assert inv["attn.qkv_input"] == 2 * (s * 7168 + 4)
    assert inv["attn.q_norm.output"] == s * 1536 + 4 and inv["attn.kv_norm.output"] == s * 512 + 4
    assert inv["attn.proj_input"] == s * 128 * 128 + 4
    assert inv["attn.core_output"] == s * 128 * 128 * 2       # the flash output, bf16
    assert inv["attn.q"] == s * 128 * 192 * 2 and inv["attn.q_norm.input"] == s * 1536 * 2
