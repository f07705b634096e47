"""Real transformers models (tiny configs, CPU and meta) against hand-calculated saved bytes.

Every expected number below is worked out by hand from the shapes (the derivation of each
tensor is in docs/implementations.md): s = 8 tokens, b = 2 sequences (T = 16 tokens),
h = 16, a = 4 query heads, kv = 2 key/value heads, d = 4, Llama f = 24, GPT-2 f = 4h = 64,
V = 32. s != d so the harness can tell K (d x s) from V (s x d) by shape.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from planner.calibrate import hf_models  # noqa: E402
from planner.core.errors import PlanInputError  # noqa: E402
from planner.core.spec import Layout  # noqa: E402
from planner.io.hf_config import model_from_hf_dict  # noqa: E402
from planner.memory import implementations as impls  # noqa: E402

pytestmark = pytest.mark.torch

S, B = 8, 2
LLAMA = dict(model_type="llama", hidden_size=16, intermediate_size=24, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=2, vocab_size=32, max_position_embeddings=16)
GPT2 = dict(model_type="gpt2", n_embd=16, n_head=4, n_layer=2, vocab_size=32, n_positions=16,
            bos_token_id=0, eos_token_id=0)


def _measure(config, attention, precision, device="cpu", layers=None):
    model = hf_models.build_model(config, attention, precision, num_layers=layers, device=device)
    return hf_models.measure(model, S, B, precision)


def _impl(name, precision, device="cpu", **kw):
    return impls.Implementation(name=name, precision=precision, device=device, **kw)


# --------------------------------------------------------------------------- Llama


def test_llama_eager_fp32_block_by_hand():
    # RMSNorm: fp32 input 16·16·4 = 1024, rstd 16·4 = 64, normalised 16·16·4 = 1024
    norm = {"input": 1024, "stats": 64, "normalized": 1024}
    expected = {f"norm1.{k}": v for k, v in norm.items()} | {f"norm2.{k}": v for k, v in norm.items()}
    expected |= {
        "attn.qkv_input": 16 * 16 * 4,          # one storage feeds q, k, v projections
        "attn.q": 16 * 4 * 4 * 4,               # T·a·d·4 = 1024
        "attn.k": 16 * 4 * 4 * 4,               # repeat_kv to 4 heads: 1024
        "attn.v": 16 * 4 * 4 * 4,
        "attn.softmax_output": 4 * 8 * 8 * 2 * 4,  # a·s²·b fp32 = 2048; .to(fp32) is no copy
        "attn.proj_input": 16 * 16 * 4,
        "mlp.fc1_input": 16 * 16 * 4,
        "mlp.act_input": 16 * 24 * 4, "mlp.act_output": 16 * 24 * 4,
        "mlp.up_output": 16 * 24 * 4, "mlp.fc2_input": 16 * 24 * 4,  # 1536 each
    }
    assert sum(expected.values()) == 18560
    got = _measure(LLAMA, "eager", "fp32")
    assert got.block(0) == expected
    assert got.block(1) == expected
    spec = model_from_hf_dict(LLAMA, name="tiny")
    assert impls.block_saved_bytes(spec, _impl("hf-eager", "fp32"), S, B) == expected


def test_llama_eager_fp32_outside_params_and_flops_by_hand():
    expected = {
        "embedding.token_ids": 16 * 8,           # int64 ids
        "rotary.cos_sin": 2 * 8 * 4 * 4,         # cos and sin (1, 1, s, d) fp32, shared by layers
        "final_norm.input": 1024, "final_norm.stats": 64, "final_norm.normalized": 1024,
        "head.input": 1024,
        "loss.log_softmax": 16 * 32 * 4,         # (b·s, V) fp32
        "loss.targets": 16 * 8,                  # b > 1: shifted labels are a copy
        "loss.total_weight": 4,
    }
    got = _measure(LLAMA, "eager", "fp32")
    assert got.outside == expected
    # embed 32·16 + 2 x (q 256 + k 128 + v 128 + o 256 + gate/up/down 3·16·24 + norms 32) + 16 + head 512
    assert got.parameters == 512 + 2 * (256 + 128 + 128 + 256 + 1152 + 32) + 16 + 512 == 4944
    # per block: qkv 2·T·h·(a + 2kv)·d = 16384, o 8192, QKᵀ + PV 4·b·s²·a·d = 8192, MLP 6·T·h·f = 36864
    assert got.forward_flops == 2 * (16384 + 8192 + 8192 + 36864) + 2 * 16 * 16 * 32 == 155648


def test_llama_sdpa_bf16_block_by_hand():
    expected = {
        "norm1.input": 1024, "norm1.stats": 64, "norm1.normalized": 16 * 16 * 2,  # fp32 copy kept
        "norm2.input": 1024, "norm2.stats": 64, "norm2.normalized": 512,
        "attn.qkv_input": 512,
        "attn.q": 16 * 4 * 4 * 2, "attn.k": 16 * 2 * 4 * 2, "attn.v": 16 * 2 * 4 * 2,  # GQA: kv heads
        "attn.softmax_lse": 4 * 8 * 2 * 4,       # (b, a, s) fp32
        "attn.proj_input": 512,                  # the kernel's out, one storage with o_proj's input
        "mlp.fc1_input": 512,
        "mlp.act_input": 768, "mlp.act_output": 768, "mlp.up_output": 768, "mlp.fc2_input": 768,
    }
    assert sum(expected.values()) == 9088
    assert _measure(LLAMA, "sdpa", "bf16").block(0) == expected
    spec = model_from_hf_dict(LLAMA, name="tiny")
    assert impls.block_saved_bytes(spec, _impl("hf-sdpa", "bf16"), S, B) == expected


def test_llama_eager_autocast_block_by_hand():
    got = _measure(LLAMA, "eager", "autocast-bf16").block(0)
    assert got["attn.qkv_input"] == 3 * 16 * 16 * 2        # q, k, v each cast their input
    assert got["mlp.fc1_input"] == 2 * 16 * 16 * 2         # gate, up
    # bf16 copies of the block's weights: (q 256 + k 128 + v 128 + o 256 + 3·16·24) x 2 bytes
    assert got["autocast.weight_casts"] == (256 + 128 + 128 + 256 + 1152) * 2 == 3840
    assert got["attn.softmax_output"] == 2048 and got["attn.softmax_cast"] == 4 * 64 * 2 * 2
    assert got["norm1.normalized"] == 1024                  # residual stream stays fp32
    assert sum(got.values()) == 18816


def test_meta_full_width_flash_kernel_llama2_7b_block():
    """Llama-2-7B widths (h 4096, 32 heads, f 11008), one block on meta, s = 4096, b = 1, bf16,
    SDPA run as the CUDA flash kernel: hand sum of the sdpa bf16 inventory + 24 B rng state."""
    cfg = dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
               num_key_value_heads=32, num_hidden_layers=32, vocab_size=32000, max_position_embeddings=4096)
    model = hf_models.build_model(cfg, "sdpa", "bf16", num_layers=1, device="meta")
    got = hf_models.measure(model, 4096, 1, "bf16", flops=False).block(0)
    t, h = 4096, 4096
    norm = t * h * 4 + t * 4 + t * h * 2                   # 100,679,680
    attn = 5 * t * h * 2 + 32 * 4096 * 4 + 24              # qkv in, q, k, v, out; lse; rng state
    mlp = t * h * 2 + 4 * t * 11008 * 2
    assert got["attn.rng_state"] == 24 and got["attn.softmax_lse"] == 524288
    assert sum(got.values()) == 2 * norm + attn + mlp == 763920408


# --------------------------------------------------------------------------- GPT-2


def test_gpt2_eager_fp32_cpu_block_by_hand():
    """gelu_new keeps four f-wide tensors; CPU dropout keeps fp32 noise masks (4 B/element)."""
    expected = {
        "norm1.input": 1024, "norm1.stats": 2 * 16 * 4, "norm2.input": 1024, "norm2.stats": 128,
        "attn.qkv_input": 1024, "attn.q": 1024, "attn.k": 1024, "attn.v": 1024,
        "attn.softmax_output": 2048, "attn.softmax_dropout_mask": 2048,
        "attn.softmax_dropout_output": 2048, "attn.proj_input": 1024, "attn.dropout_mask": 1024,
        "mlp.fc1_input": 1024,
        "mlp.act_input": 16 * 64 * 4, "mlp.act_tanh": 4096, "mlp.act_one_plus_tanh": 4096,
        "mlp.act_half_input": 4096, "mlp.fc2_input": 4096, "mlp.dropout_mask": 1024,
    }
    assert sum(expected.values()) == 37120
    assert _measure(GPT2, "eager", "fp32").block(0) == expected
    spec = model_from_hf_dict(GPT2, name="tiny-gpt2")
    assert impls.block_saved_bytes(spec, _impl("hf-eager", "fp32"), S, B) == expected


# --------------------------------------------------------------------------- formula only


def test_numpy_micro_batch_and_bad_input():
    spec = model_from_hf_dict(LLAMA, name="tiny")
    per = impls.block_saved_bytes(spec, _impl("hf-sdpa", "bf16"), S, np.array([1, 2, 4]))
    assert list(sum(per.values())) == [4544, 9088, 18176]   # every term is linear in b
    with pytest.raises(PlanInputError) as err:
        impls.block_saved_bytes(spec, _impl("hf-sdpa", "bf16"), S, B, layout=Layout(tp=2))
    assert err.value.field == "tp"
    with pytest.raises(PlanInputError):
        impls.block_saved_bytes(spec, _impl("megatron", "autocast-bf16"), S, B)


# --------------------------------------------------------------------------- Mixtral


MIXTRAL = dict(model_type="mixtral", hidden_size=16, intermediate_size=24, num_attention_heads=4,
               num_key_value_heads=2, num_hidden_layers=2, vocab_size=32, num_local_experts=4,
               num_experts_per_tok=2, max_position_embeddings=16)


def test_mixtral_sdpa_bf16_moe_by_hand():
    """E = 4 experts, top-2: K = 2·16 = 32 routed copies; grouped_mm experts (the default)."""
    moe = {
        "mlp.fc1_input": 16 * 16 * 2,            # router linear input (the norm output)
        "moe.router_probs": 16 * 4 * 4,          # softmax(logits.float())
        "moe.topk_indices": 16 * 2 * 8,
        "moe.topk_values": 16 * 2 * 4, "moe.topk_sum": 16 * 4,   # in-place renormalisation
        "moe.indices": 3 * 32 * 8,               # perm // k, perm, inverse perm
        "moe.offsets": 4 * 4,                    # int32 group offsets
        "moe.expert_input": 32 * 16 * 2,
        "moe.expert.gate_up_output": 32 * 48 * 2,
        "moe.expert.act_output": 32 * 24 * 2, "moe.expert.fc2_input": 32 * 24 * 2,
        "moe.expert_output": 32 * 16 * 2, "moe.routing_weights": 32 * 4,
    }
    assert sum(moe.values()) == 10320
    got = _measure(MIXTRAL, "sdpa", "bf16").block(0)
    assert {k: v for k, v in got.items() if k.startswith(("moe", "mlp"))} == moe
    # norms 2 x (1024 + 64 + 512) + attention (qkv 512, q 512, k 256, v 256, lse 256, out 512)
    assert sum(got.values()) == 2 * 1600 + 2304 + 10320 == 15824
    spec = model_from_hf_dict(MIXTRAL, name="tiny-mixtral")
    assert sum(impls.block_saved_bytes(spec, _impl("hf-sdpa", "bf16"), S, B).values()) == 15824


# --------------------------------------------------------------------------- command entry


def test_calibrate_hf_entry_rows_and_bad_input(tmp_path):
    import json

    from planner.calibrate.hf_run import calibrate_hf, render

    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    rows = calibrate_hf(tmp_path, seq_len=S, micro_batch=B, precisions=("bf16",), cpu_layers=1)
    assert [r.where for r in rows] == ["cpu, 1 layers", "meta, 2 layers"]
    cpu, meta = rows
    assert cpu.measured_block_bytes == 9088 and cpu.mismatched_classes == ()
    assert meta.measured_block_bytes == 9088 + 24          # CUDA flash kernel: + rng state
    assert meta.measured_params == 4944 and meta.predicted_params == 4944
    assert "9,088" in render(rows)
    with pytest.raises(PlanInputError) as err:
        calibrate_hf(tmp_path / "missing.json")
    assert err.value.field == "hf_config"
    with pytest.raises(PlanInputError) as err:
        calibrate_hf(tmp_path, seq_len=0)
    assert err.value.field == "seq_len"


def test_meta_efficient_and_cudnn_kernels_lse_by_hand():
    """MHA tiny Llama (4 heads of 4), s = 40, b = 2, bf16, on meta with the CUDA kernels' aten ops:
    efficient pads the log-sum-exp to ⌈40/32⌉·32 = 64 queries and keeps int64 seed + offset;
    cuDNN keeps (b, a, s, 1)."""
    cfg = dict(LLAMA, num_key_value_heads=4, num_hidden_layers=1)
    eff = hf_models.measure(hf_models.build_model(cfg, "efficient-meta", "bf16", device="meta"), 40, 2, "bf16",
                            flops=False).block(0)
    assert eff["attn.softmax_lse"] == 4 * 64 * 2 * 4 and eff["attn.rng_state"] == 8 + 8
    cud = hf_models.measure(hf_models.build_model(cfg, "cudnn-meta", "bf16", device="meta"), 40, 2, "bf16",
                            flops=False).block(0)
    assert cud["attn.softmax_lse"] == 4 * 40 * 2 * 4 and cud["attn.rng_state"] == 16
    assert eff["attn.k"] == cud["attn.k"] == 40 * 2 * 4 * 4 * 2      # K at 4 heads of 4, bf16
    with pytest.raises(PlanInputError) as err:  # GQA: efficient has none, SDPA takes math
        impls.block_saved_bytes(model_from_hf_dict(LLAMA, name="t"),
                                impls.Implementation(name="hf-sdpa", sdpa_backend="efficient"), 40, 2)
    assert err.value.field == "sdpa_backend"
