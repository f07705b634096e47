"""ZeRO model-state bytes, offload parts and engine buffers, against hand arithmetic and the seeds."""

from __future__ import annotations

import pytest

from planner.core.errors import PlanInputError
from planner.memory.model_states import (
    buffer_bytes,
    buffer_components,
    megatron_zero1_bytes,
    model_state_bytes,
    zero_dp_bytes,
)
from planner.core.params import stage_params
from planner.core.recipes import OPTIMIZERS, PRECISIONS
from planner.core.spec import Layout, ModelSpec

ADAM = OPTIMIZERS["adam"]
FP16 = PRECISIONS["zero-fp16"]

# N = 1001 parameters over dp = 8 ranks: each rank holds ceil(1001 / 8) = 126 elements (padding)
N, DP, PART = 1001, 8, 126


def states(precision: str, stage: int, optimizer: str = "adam", **layout):
    return model_state_bytes(N, PRECISIONS[precision], OPTIMIZERS[optimizer],
                             Layout(dp=DP, zero_stage=stage, **layout))


# --------------------------------------------------------------------------- seed closed forms


def test_zero_paper_7_5b_on_64_gpus():
    # ZeRO paper Figure 1 / seed 001 §2: Φ = 7.5B, Nd = 64, K = 12
    gb = 1e9
    assert zero_dp_bytes(7.5e9, 64, 0) / gb == pytest.approx(120, abs=0.05)
    assert zero_dp_bytes(7.5e9, 64, 1) / gb == pytest.approx(31.4, abs=0.05)
    assert zero_dp_bytes(7.5e9, 64, 2) / gb == pytest.approx(16.6, abs=0.05)
    assert zero_dp_bytes(7.5e9, 64, 3) / gb == pytest.approx(1.9, abs=0.05)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_exact_function_agrees_with_seed_form(stage):
    # 7.5e9 / 64 = 117,187,500 exactly, so no padding: the engine form equals the closed form
    exact = model_state_bytes(7_500_000_000, FP16, ADAM, Layout(dp=64, zero_stage=stage))
    assert exact.gpu_total_bytes == zero_dp_bytes(7.5e9, 64, stage)


def test_megatron_zero1_seed_13b_example():
    # seed 004 §3.5.2: 13B x (6/4 + 12/(4·2)) = 13B x 3 = 39 GB; PP=4 alone 13B x 18/4 = 58.5 GB;
    # PP=8 alone 13B x 18/8 = 29.25 GB (63.25 GB with the 34 GB of activations)
    assert megatron_zero1_bytes(13e9, 4, 2) == pytest.approx(39e9)
    assert megatron_zero1_bytes(13e9, 4, 1) == pytest.approx(58.5e9)
    assert megatron_zero1_bytes(13e9, 8, 1) == pytest.approx(29.25e9)
    # the exact function with the megatron-bf16 recipe, one stage's 13e9 / 4 parameters
    exact = model_state_bytes(3_250_000_000, PRECISIONS["megatron-bf16"], ADAM,
                              Layout(pp=4, dp=2, zero_stage=1))
    assert exact.gpu_total_bytes == 2 * 3_250_000_000 + 4 * 3_250_000_000 + 12 * 1_625_000_000
    assert exact.gpu_total_bytes == megatron_zero1_bytes(13e9, 4, 2)


def test_zero_dp_bytes_rejects_unknown_stage():
    with pytest.raises(PlanInputError):
        zero_dp_bytes(1e9, 8, 4)


# --------------------------------------------------------------------------- every recipe


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        # param, grad bytes; K = optimizer bytes/param. Stage 0: all of N; stage 1: K on 126;
        # stage 2: grads too; stage 3: params too.
        ("zero-fp16", [16 * N, 2 * N + 2 * N + 12 * PART, 2 * N + 2 * PART + 12 * PART, 16 * PART]),
        ("bf16-mixed", [16 * N, 4 * N + 12 * PART, 2 * N + 14 * PART, 16 * PART]),
        ("megatron-bf16", [18 * N, 2 * N + 4 * N + 12 * PART, 2 * N + 16 * PART, 18 * PART]),
        ("zero-infinity-fp16", [20 * N, 4 * N + 16 * PART, 2 * N + 18 * PART, 20 * PART]),
        ("fp32", [16 * N, 4 * N + 4 * N + 8 * PART, 4 * N + 12 * PART, 16 * PART]),
    ],
)
def test_zero_stages_every_recipe(precision, expected):
    assert [states(precision, stage).gpu_total_bytes for stage in range(4)] == expected


def test_stage_fields_zero_fp16():
    s2 = states("zero-fp16", 2)
    assert (s2.params_bytes, s2.grads_bytes, s2.optimizer_bytes) == (2 * N, 2 * PART, 12 * PART)
    assert s2.partition_numel == PART and s2.cpu_bytes == 0 and s2.nvme_bytes == 0


def test_8bit_adam_rounds_up_whole_bytes():
    # K = master 4 + 2 states x 1 byte + block absmax 2 x 4 / 2048 per parameter (recipes.py)
    s0 = states("zero-fp16", 0, "adam-8bit")
    assert s0.optimizer_bytes == 4 * N + 2 * N + -(-8 * N // 2048)  # 4004 + 2002 + 4 = 6010
    s1 = states("zero-fp16", 1, "adam-8bit")
    assert s1.optimizer_bytes == 4 * PART + 2 * PART + 1  # 504 + 252 + ceil(0.49) = 757


# --------------------------------------------------------------------------- offload


def test_offload_cpu_stage2_moves_optimizer_and_names_extras():
    plain = states("zero-fp16", 2)
    off = states("zero-fp16", 2, offload_optimizer="cpu")
    # GPU keeps the full fp16 params; grads go straight into the host fp32 partition
    assert (off.params_bytes, off.grads_bytes, off.optimizer_bytes) == (2 * N, 0, 0)
    assert off.cpu_parts == {
        "optimizer_states": 12 * PART,  # fp32 master + m + v, exactly what left the GPU
        "fp32_grad_partition": 4 * PART,  # single_partition_of_fp32_groups[i].grad kept on CPU
        "param_partition_buffer": 2 * PART,  # param_buffer_of_bit16_for_cpu_offload_groups
    }
    assert off.cpu_parts["optimizer_states"] == plain.optimizer_bytes
    assert plain.gpu_total_bytes - off.gpu_total_bytes == plain.optimizer_bytes + plain.grads_bytes
    assert off.cpu_bytes == sum(off.cpu_parts.values()) == 18 * PART


def test_offload_cpu_stage1_keeps_full_grads_and_accumulation_buffer():
    off = states("zero-fp16", 1, offload_optimizer="cpu", grad_accum=4)
    assert off.grads_bytes == 2 * N  # stage 1 does not partition gradients
    assert off.cpu_parts["grad_accumulation_buffer"] == 2 * PART  # accumulated_grads_in_cpu


def test_offload_cpu_stage3_grad_copy_already_in_recipe():
    plain = states("zero-infinity-fp16", 3)
    off = states("zero-infinity-fp16", 3, offload_optimizer="cpu")
    # K = 16 already holds the fp32 gradient copy, so no extra fp32_grad_partition
    assert off.cpu_parts == {"optimizer_states": 16 * PART, "grad_partition_buffer": 2 * PART}
    assert off.gpu_total_bytes == 2 * PART
    # conserved: nothing appears or vanishes, the gradient partition just lives on the host
    assert off.gpu_total_bytes + off.cpu_bytes == plain.gpu_total_bytes


def test_offload_nvme_stage3_everything_off_gpu():
    plain = states("zero-fp16", 3)
    off = states("zero-fp16", 3, offload_optimizer="nvme", offload_params="nvme")
    assert off.gpu_total_bytes == 0
    assert off.nvme_parts == {
        "optimizer_states": 12 * PART,
        "fp32_grad_partition": 4 * PART,
        "param_partition": 2 * PART,
    }
    assert off.cpu_parts == {
        "grad_partition_buffer": 2 * PART,  # "gradients stay in CPU memory"
        # 4 pinned fp32 buffers of the largest sub-group (126 elements), rounded up to 1024-byte
        # aio blocks = 256 fp32 elements
        "optimizer_swap_buffers": 4 * 256 * 4,
        # buffer_count 5 x buffer_size 1e8 fp16 elements rounded up to 512-element blocks:
        # 1e8 = 195,312 x 512 + 256 -> 195,313 x 512 = 100,000,256
        "param_swap_buffers": 5 * 100_000_256 * 2,
    }
    moved = off.nvme_parts["optimizer_states"] + off.nvme_parts["param_partition"]
    moved += off.cpu_parts["grad_partition_buffer"]
    assert moved == plain.gpu_total_bytes  # every GPU byte has a home off the GPU


def test_offload_params_cpu_stage3():
    off = states("bf16-mixed", 3, offload_params="cpu")
    assert off.params_bytes == 0 and off.cpu_parts == {"param_partition": 2 * PART}
    assert off.gpu_total_bytes == 2 * PART + 12 * PART


def test_nvme_optimizer_offload_needs_stage3():
    with pytest.raises(PlanInputError) as err:
        states("zero-fp16", 2, offload_optimizer="nvme")
    assert err.value.field == "offload_optimizer" and "zero_stage=3" in str(err.value)


# --------------------------------------------------------------------------- buffers

LLAMA2_7B = ModelSpec(name="llama2-7b", num_layers=32, hidden_size=4096, num_heads=32,
                      ffn_hidden_size=11008, vocab_size=32000, max_seq_len=4096, mlp="swiglu",
                      norm="rmsnorm", position="rotary", tied_embeddings=False,
                      linear_bias=False)
GPT2 = ModelSpec(name="gpt2", num_layers=12, hidden_size=768, num_heads=12, ffn_hidden_size=3072,
                 vocab_size=50257, max_seq_len=1024)


def _buffers(model, **layout):
    lay = Layout(**layout)
    stage = stage_params(model, lay.tp, lay.pp)[0]
    return buffer_bytes(model, lay, FP16, stage)


def test_ddp_bucket_is_25_mib_capped_by_gradients():
    assert _buffers(GPT2, dp=8) == {"ddp_grad_bucket": 25 * 1024 * 1024}
    tiny = ModelSpec(name="tiny", num_layers=1, hidden_size=8, num_heads=2, ffn_hidden_size=32,
                     vocab_size=10, max_seq_len=4)
    held = 10 * 8 + 4 * 8 + (8 * 24 + 24 + 8 * 8 + 8 + 8 * 32 + 32 + 32 * 8 + 8 + 4 * 8) + 2 * 8
    assert _buffers(tiny, dp=2) == {"ddp_grad_bucket": held * 2}


def test_zero12_reduce_bucket_is_allocated_whole():
    # reduce_bucket_size 5e8 elements x 2 bytes; DeepSpeed allocates torch.empty(reduce_bucket_size)
    # even when the model (GPT-2, 124M) is smaller than the bucket
    assert _buffers(LLAMA2_7B, dp=8, zero_stage=1) == {"zero_reduce_bucket": 500_000_000 * 2}
    assert _buffers(GPT2, dp=8, zero_stage=2) == {"zero_reduce_bucket": 500_000_000 * 2}


def test_zero3_gathered_params_capped_by_stage():
    # GPT-2 holds 124,439,808 parameters, fewer than stage3_max_live_parameters (1e9)
    assert _buffers(GPT2, dp=8, zero_stage=3)["zero3_gathered_params"] == 124_439_808 * 2


def test_zero2_offload_adds_gpu_staging_of_largest_param():
    buffers = _buffers(LLAMA2_7B, dp=8, zero_stage=2, offload_optimizer="cpu")
    assert buffers["offload_grad_staging"] == 32000 * 4096 * 2  # embed_tokens is the largest


def test_zero3_buffers_llama2_7b():
    buffers = _buffers(LLAMA2_7B, dp=8, zero_stage=3)
    assert buffers["zero_reduce_bucket"] == 500_000_000 * 2
    assert buffers["zero3_gathered_params"] == 1_000_000_000 * 2  # stage3_max_live_parameters
    # persistent (< 1e5 elements): 2 RMSNorm weights per block + the final norm
    assert buffers["zero3_persistent_params"] == (32 * 2 * 4096 + 4096) * 2


def test_zero3_persistent_gpt2_counts_biases_and_norms():
    h = 768
    per_block = 3 * h + h + 4 * h + h + 4 * h  # qkv bias, o bias, fc1 bias, fc2 bias, 2 LayerNorms
    assert _buffers(GPT2, dp=8, zero_stage=3)["zero3_persistent_params"] == (12 * per_block + 2 * h) * 2


def test_buffer_components_named_defaults():
    lay = Layout(dp=8, zero_stage=3)
    stage = stage_params(LLAMA2_7B, 1, 1)[0]
    parts = buffer_components(LLAMA2_7B, lay, FP16, stage)
    assert parts == {
        "reduce_bucket_size": 500_000_000 * 2,
        "allgather_bucket_size": 500_000_000 * 2,
        "stage3_prefetch_bucket_size": 50_000_000 * 2,
        "stage3_max_live_parameters": 1_000_000_000 * 2,
        "largest_param": 32000 * 4096 * 2,
    }


def test_aio_alignment_of_swap_buffers():
    from planner.memory.model_states import aio_aligned_numel, optimizer_swap_buffer_bytes
    assert aio_aligned_numel(512, 2) == 512 and aio_aligned_numel(513, 2) == 1024
    assert aio_aligned_numel(256, 4) == 256 and aio_aligned_numel(1, 4) == 256
    # a 3e9-element partition is swapped in sub-groups of at most sub_group_size = 1e9 elements,
    # 1e9 = 3,906,250 x 256 exactly: 4 buffers x 1e9 x 4 bytes
    assert optimizer_swap_buffer_bytes(3_000_000_000) == 4 * 1_000_000_000 * 4


def test_zero3_persistent_bert_embedding_norm_and_pooler_bias():
    h = 1024
    bert = ModelSpec(name="bert-large", arch="encoder", num_layers=24, hidden_size=h,
                     num_heads=16, ffn_hidden_size=4096, vocab_size=30522, max_seq_len=512,
                     type_vocab_size=2, embedding_norm=True, pooler=True, final_norm=False)
    # per block: qkv bias 3h, o bias h, fc1 bias 4h, fc2 bias h, 2 LayerNorms 4h (all < 1e5);
    # + embedding LayerNorm 2h + pooler bias h (its h x h weight is 1,048,576 > 1e5)
    expected = 24 * (3 * h + h + 4 * h + h + 4 * h) + 2 * h + h
    assert _buffers(bert, dp=8, zero_stage=3)["zero3_persistent_params"] == expected * 2


# --------------------------------------------------------------------------- user bucket sizes


def test_zero2_user_reduce_bucket_2e8_fp16():
    # reduce_bucket_size = 2e8 in fp16: DeepSpeed stage_1_and_2.py setup_buckets allocates
    # torch.empty(int(self.reduce_bucket_size), dtype=self._gradient_reduction_buffer_dtype()),
    # which is self.dtype (fp16) unless ZeRO-1 accumulates in an fp32 grad_accum attribute
    # -> 200,000,000 elements x 2 bytes, allocated whole
    got = _buffers(LLAMA2_7B, dp=8, zero_stage=2, buffers={"reduce_bucket_elements": 2e8})
    assert got == {"zero_reduce_bucket": 200_000_000 * 2}


def test_zero3_user_max_live_parameters_1e8_caps_gathered_params():
    # GPT-2 holds 124,439,808 parameters; its largest tensor is wte, 50257 x 768 = 38,597,376.
    # stage3_max_live_parameters = 1e8: max(1e8, prefetch 5e7, 38,597,376) = 1e8 < 124,439,808
    got = _buffers(GPT2, dp=8, zero_stage=3, buffers={"max_live_parameters": 1e8})
    assert got["zero3_gathered_params"] == 100_000_000 * 2
    # Llama-2-7B: embed_tokens (32000 x 4096 = 131,072,000) is larger than 1e8 and must be
    # gathered whole, so the live buffer is at least that tensor
    got = _buffers(LLAMA2_7B, dp=8, zero_stage=3, buffers={"max_live_parameters": 1e8})
    assert got["zero3_gathered_params"] == 32000 * 4096 * 2


def test_zero3_persistence_threshold_is_inclusive():
    # DeepSpeed parameter_offload.py mark_persistent_parameters: `param.ds_numel <= param_threshold`.
    # GPT-2 block tensors under 1e5: qkv bias 3h = 2304, o bias h, fc1 bias 4h = 3072, fc2 bias h,
    # two LayerNorms (weight + bias) 4h; plus the final LayerNorm 2h (h = 768)
    h = 768
    at_3072 = _buffers(GPT2, dp=8, zero_stage=3, buffers={"param_persistence_threshold": 3072})
    assert at_3072["zero3_persistent_params"] == (12 * (3 * h + h + 4 * h + h + 4 * h) + 2 * h) * 2
    below = _buffers(GPT2, dp=8, zero_stage=3, buffers={"param_persistence_threshold": 3071})
    assert below["zero3_persistent_params"] == (12 * (3 * h + h + h + 4 * h) + 2 * h) * 2  # no fc1 bias


def test_ddp_user_bucket():
    # bucket_cap_mb = 10 -> 10 x 1024 x 1024 bytes, below GPT-2's 124,439,808 x 2 gradient bytes
    got = _buffers(GPT2, dp=8, buffers={"ddp_bucket_bytes": 10 * 1024 * 1024})
    assert got == {"ddp_grad_bucket": 10_485_760}


def test_buffer_components_follow_the_layout():
    lay = Layout(dp=8, zero_stage=3, buffers={"reduce_bucket_elements": 2e8,
                                              "allgather_bucket_elements": 3e8,
                                              "prefetch_bucket_elements": 4e7,
                                              "max_live_parameters": 6e8})
    parts = buffer_components(LLAMA2_7B, lay, FP16, stage_params(LLAMA2_7B, 1, 1)[0])
    assert parts == {
        "reduce_bucket_size": 200_000_000 * 2,
        "allgather_bucket_size": 300_000_000 * 2,
        "stage3_prefetch_bucket_size": 40_000_000 * 2,
        "stage3_max_live_parameters": 600_000_000 * 2,
        "largest_param": 32000 * 4096 * 2,
    }


@pytest.mark.parametrize("value", [-1, 1.5, "lots", True])
def test_bad_bucket_sizes_rejected(value):
    with pytest.raises(ValueError, match="max_live_parameters"):
        Layout(zero_stage=3, buffers={"max_live_parameters": value})
    with pytest.raises(ValueError, match="reduce_bucket_elements"):
        Layout(zero_stage=3, buffers={"reduce_bucket_elements": 0})  # DeepSpeed: gt=0
