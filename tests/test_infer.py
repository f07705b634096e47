"""zplan infer: KV cache, weights, workspace, limits and roofline bounds, worked by hand.

Model dimensions are those of the models' config.json files (Hugging Face), written inline so
these tests do not depend on the preset loader; every expected number is the arithmetic shown.
"""

from __future__ import annotations

import pytest

from planner.core.errors import PlanInputError
from planner.memory.infer import (
    InferConfig,
    check_config,
    decode_roofline,
    decode_weight_params,
    inference_memory,
    kv_cache_bytes,
    max_batch,
    max_context,
    memory_budget_bytes,
    min_tp,
    plan_inference,
    prefill_roofline,
    roofline,
    runtime_overhead_bytes,
    step_activation_bytes,
    sum_visible_keys,
    weights_bytes,
    workspace_bytes,
)
from planner.core.spec import GIB, GpuSpec, ModelSpec

# meta-llama/Llama-2-7b-hf config.json: MHA, 32 layers, 32 heads of 128
LLAMA2_7B = ModelSpec(name="llama2-7b", num_layers=32, hidden_size=4096, num_heads=32,
                      ffn_hidden_size=11008, vocab_size=32000, max_seq_len=4096, mlp="swiglu",
                      norm="rmsnorm", position="rotary", tied_embeddings=False, linear_bias=False)
LLAMA2_7B_PARAMS = 6_738_415_616  # safetensors total of meta-llama/Llama-2-7b-hf
# meta-llama/Llama-2-70b-hf config.json: GQA, 80 layers, 64 heads, 8 kv heads, head_dim 128
LLAMA2_70B = ModelSpec(name="llama2-70b", num_layers=80, hidden_size=8192, num_heads=64,
                       num_kv_heads=8, ffn_hidden_size=28672, vocab_size=32000, max_seq_len=4096,
                       mlp="swiglu", norm="rmsnorm", position="rotary", tied_embeddings=False,
                       linear_bias=False)
LLAMA2_70B_PARAMS = 68_976_648_192  # safetensors total of meta-llama/Llama-2-70b-hf
# mistralai/Mistral-7B-v0.1 config.json: 8 kv heads, sliding window 4096
MISTRAL_7B = ModelSpec(name="mistral-7b", num_layers=32, hidden_size=4096, num_heads=32,
                       num_kv_heads=8, ffn_hidden_size=14336, vocab_size=32000, max_seq_len=32768,
                       mlp="swiglu", norm="rmsnorm", position="rotary", tied_embeddings=False,
                       linear_bias=False, sliding_window=4096)
# GPT-3 175B (Brown et al. 2020 Table 2.1): 96 layers, h 12288, 96 heads, context 2048
GPT3 = ModelSpec(name="gpt3-175b", num_layers=96, hidden_size=12288, num_heads=96,
                 ffn_hidden_size=4 * 12288, vocab_size=50257, max_seq_len=2048)
# A toy model small enough to work every byte by hand.
TOY = ModelSpec(name="toy", num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=256,
                vocab_size=1000, max_seq_len=4096)
A100_80GB = GpuSpec(  # NVIDIA A100 datasheet, SXM 80GB column (dense)
    name="a100-80gb", memory_gib=80, peak_tflops={"fp16": 312.0, "bf16": 312.0},
    hbm_gb_per_s=2039, achieved_efficiency=0.5,
    sources={k: "NVIDIA A100 datasheet" for k in
             ("memory_gib", "peak_tflops", "hbm_gb_per_s", "achieved_efficiency")})


# --------------------------------------------------------------------------- KV cache


def test_kv_cache_seed_formula_gpt3():
    # seed 004 §2.3.2: 2·b·s·L·h_kv·2 bytes in fp16; GPT-3 is MHA so h_kv = h = 12288.
    assert kv_cache_bytes(GPT3, batch=1, context=2048, kv_bytes=2) == 2 * 1 * 2048 * 96 * 12288 * 2
    assert 2 * 1 * 2048 * 96 * 12288 * 2 == 9_663_676_416


def test_kv_cache_mha_llama2_7b_is_2_gib_at_4096():
    # 2 (K,V) · 32 layers · 32 kv heads · 128 · 2 bytes = 524,288 bytes per token; × 4096 = 2 GiB
    assert kv_cache_bytes(LLAMA2_7B, batch=1, context=4096, kv_bytes=2) == 2 * GIB
    assert kv_cache_bytes(LLAMA2_7B, batch=8, context=4096, kv_bytes=2) == 16 * GIB


def test_kv_cache_gqa_llama2_70b():
    # 2 · 80 layers · 8 kv heads · 128 · 2 bytes = 327,680 bytes per token (8× less than MHA's 64 heads)
    per_token = 2 * 80 * 8 * 128 * 2
    assert per_token == 327_680
    assert kv_cache_bytes(LLAMA2_70B, 1, 4096, 2) == per_token * 4096 == 1_342_177_280
    # tp=8: one kv head per rank
    assert kv_cache_bytes(LLAMA2_70B, 1, 4096, 2, tp=8) == 2 * 80 * 1 * 128 * 2 * 4096
    # fp8 cache: one byte per element
    assert kv_cache_bytes(LLAMA2_70B, 1, 4096, 1) == per_token // 2 * 4096


def test_kv_cache_sliding_window_caps_mistral():
    # rolling buffer of 4096 positions: a 16k context caches as much as a 4k one
    at_window = 2 * 32 * 8 * 128 * 2 * 4096
    assert at_window == 536_870_912
    assert kv_cache_bytes(MISTRAL_7B, 1, 16384, 2) == at_window
    assert kv_cache_bytes(MISTRAL_7B, 1, 1000, 2) == 2 * 32 * 8 * 128 * 2 * 1000


# --------------------------------------------------------------------------- weights, overhead


@pytest.mark.parametrize("dtype, expected", [
    ("fp32", 4 * 6_738_415_616),       # 26,953,662,464
    ("fp16", 2 * 6_738_415_616),       # 13,476,831,232 (seed 004 §2.3.2: 2 bytes per parameter)
    ("bf16", 2 * 6_738_415_616),
    ("int8", 6_738_415_616),
    ("int4", 6_738_415_616 // 2),      # two weights per byte: 3,369,207,808
])
def test_weights_bytes_per_dtype(dtype, expected):
    assert weights_bytes(LLAMA2_7B_PARAMS, dtype) == expected


def test_weights_bytes_rounds_up():
    assert weights_bytes(3, "int4") == 2  # 1.5 bytes → 2
    assert weights_bytes(LLAMA2_70B_PARAMS, "fp16", tp=8) == 2 * 68_976_648_192 // 8
    assert weights_bytes(10, "fp16", tp=3) == 7  # 20 bytes over 3 ranks: the largest holds 7


def test_runtime_overhead_is_the_seeds_20_percent():
    # seed 004 §2.3.2: total ≈ 1.2 × model memory → 0.2 × 13,476,831,232 = 2,695,366,246.4 → up
    assert runtime_overhead_bytes(13_476_831_232) == 2_695_366_247


# --------------------------------------------------------------------------- workspace


def test_workspace_toy_flash():
    # b=1, s=128, fp16. Elements per token row: residual+norm 2·64 = 128; Q,K,V (4+2·4)·16 = 192;
    # max(attention output 4·16 = 64, GELU MLP 2·256 = 512) = 512 → 832 per token.
    # 128 tokens · 832 · 2 bytes = 212,992; logits of the last position: 1000 · 4 = 4,000.
    assert workspace_bytes(TOY, 1, 128, 128, 2) == 128 * 832 * 2 + 1000 * 4 == 216_992


def test_workspace_toy_without_flash_keeps_scores():
    # scores + probabilities 2 · 4 heads · 4096 keys = 32,768 per query row > MLP 512
    per_row = 128 + 192 + 2 * 4 * 4096
    assert workspace_bytes(TOY, 1, 4096, 4096, 2, flash_attention=False) == 4096 * per_row * 2 + 4000


def test_workspace_llama2_70b_tp2():
    # s=4096: 2·8192 + (32 + 2·4)·128 + 3·28672/2 (SwiGLU gate, up, product) = 16384+5120+43008
    rows = 4096 * (16384 + 5120 + 43008)
    assert workspace_bytes(LLAMA2_70B, 1, 4096, 4096, 2, tp=2) == rows * 2 + 16000 * 4


# --------------------------------------------------------------------------- limits


TOY_GPU = GpuSpec(name="toy", memory_gib=0.01, peak_tflops={"fp16": 100.0}, hbm_gb_per_s=1000,
                  sources={k: "test" for k in ("memory_gib", "peak_tflops", "hbm_gb_per_s",
                                               "achieved_efficiency")})
TOY_PARAMS = 1_000_000
# capacity round(0.01 · 2^30) = 10,737,418; weights 2,000,000 + overhead 400,000 → 8,337,418 free
TOY_FREE = 10_737_418 - 2_000_000 - 400_000


def test_max_batch_toy():
    # per sequence at s=128: KV 2·2·4·16·2·128 = 65,536 + workspace 216,992 = 282,528
    assert TOY_GPU.memory_bytes == 10_737_418
    cfg = InferConfig(batch=1, context=128, account="seed")
    assert max_batch(TOY, TOY_PARAMS, cfg, TOY_GPU.memory_bytes) == TOY_FREE // 282_528 == 29
    assert inference_memory(TOY, TOY_PARAMS, cfg.model_copy(update={"batch": 29}),
                            TOY_GPU.memory_bytes).fits
    assert not inference_memory(TOY, TOY_PARAMS, cfg.model_copy(update={"batch": 30}),
                                TOY_GPU.memory_bytes).fits


def test_max_context_toy():
    # per token at b=1: KV 2·2·4·16·2 = 512 + workspace 832·2 = 1,664 → 2,176; logits 4,000 fixed
    cfg = InferConfig(batch=1, context=128, account="seed")
    assert max_context(TOY, TOY_PARAMS, cfg, TOY_GPU.memory_bytes) == (TOY_FREE - 4000) // 2176 == 3829


def test_max_batch_zero_when_weights_do_not_fit():
    assert max_batch(TOY, 10**9, InferConfig(batch=1, context=128, account="seed"),
                     TOY_GPU.memory_bytes) == 0


def test_min_tp_llama2_70b_on_a100_80gb():
    # tp=1: 2·68,976,648,192 bytes of weights alone exceed 80 GiB = 85,899,345,920.
    # tp=2: weights 68,976,648,192 + overhead 13,795,329,639 (20 %, rounded up)
    #       + KV 1,342,177,280 / 2 + workspace 4096·64512·2 + 64,000 = 83,971,612,775 ≤ 80 GiB.
    cfg = InferConfig(batch=1, context=4096, account="seed")
    total_tp2 = 68_976_648_192 + 13_795_329_639 + 671_088_640 + 4096 * 64512 * 2 + 64_000
    assert total_tp2 == 83_971_612_775 < 80 * GIB
    mem = inference_memory(LLAMA2_70B, LLAMA2_70B_PARAMS, cfg.model_copy(update={"tp": 2}), 80 * GIB)
    assert mem.total_bytes == total_tp2
    assert min_tp(LLAMA2_70B, LLAMA2_70B_PARAMS, cfg, 80 * GIB) == 2


# --------------------------------------------------------------------------- speed


def test_roofline_hand_case():
    # 1e12 FLOPs and 1e9 bytes on 1e14 FLOP/s and 1e12 B/s: 10 ms compute vs 1 ms memory
    r = roofline(1e12, 10**9, 1e14, 1e12)
    assert r.time_s == pytest.approx(0.01)
    assert r.bound == "compute"
    assert r.intensity_flops_per_byte == pytest.approx(1000)
    assert r.ridge_flops_per_byte == pytest.approx(100)


def test_sum_visible_keys():
    assert sum_visible_keys(0, 4, None) == 1 + 2 + 3 + 4
    assert sum_visible_keys(0, 5, 3) == 1 + 2 + 3 + 3 + 3  # sliding window of 3
    assert sum_visible_keys(4095, 4096, None) == 4096  # one decode query sees every position


def test_decode_llama2_7b_is_memory_bound_on_a100():
    # b=1 at s=4096: FLOPs 2·P + 4·(32·128)·32 layers·4096 keys = 13,476,831,232 + 2,147,483,648;
    # bytes: fp16 weights 2·P + KV cache 2 GiB. Intensity 1 FLOP/byte, far below the ridge
    # 312e12·0.5 / 2039e9 = 76.5, so memory-bound: 15,624,314,880 B / 2.039e12 B/s = 7.66 ms.
    cfg = InferConfig(batch=1, context=4096)
    compute = 312e12 * 0.5
    r = decode_roofline(LLAMA2_7B, LLAMA2_7B_PARAMS, 2 * LLAMA2_7B_PARAMS, cfg, compute, 2039e9)
    assert r.flops == 2 * 6_738_415_616 + 4 * 32 * 128 * 32 * 4096
    assert r.hbm_bytes == 2 * 6_738_415_616 + 2 * GIB
    assert r.bound == "memory"
    assert r.time_s == pytest.approx(15_624_314_880 / 2039e9)
    assert 1 / r.time_s == pytest.approx(130.5, abs=0.1)  # tokens/s bound for one sequence


def test_prefill_llama2_7b_is_compute_bound_on_a100():
    # 4096 prompt tokens: 2·P·4096 + causal attention 4·4096·32 layers·(4096·4097/2) pairs
    cfg = InferConfig(batch=1, context=4096)
    # = 55,201,100,726,272 + 524,288 · 8,390,656 (= 4,399,120,252,928)
    flops = 2 * 6_738_415_616 * 4096 + 4 * 4096 * 32 * (4096 * 4097 // 2)
    assert flops == 59_600_220_979_200
    r = prefill_roofline(LLAMA2_7B, LLAMA2_7B_PARAMS, 2 * LLAMA2_7B_PARAMS, cfg, 156e12, 2039e9)
    assert r.flops == flops
    assert r.bound == "compute"
    assert r.time_s == pytest.approx(flops / 156e12)  # ≈ 0.382 s to the first token


def test_prefill_flops_split_over_tp():
    cfg = InferConfig(batch=2, context=512, tp=4)
    r = prefill_roofline(LLAMA2_7B, 1000, 0, cfg, 1e12, 1e12)
    assert r.flops == (2 * 1000 * 2 * 512 + 4 * 4096 * 32 * 2 * (512 * 513 // 2)) / 4


def test_moe_decode_reads_only_touched_experts():
    # 32 layers, 8 experts, top-2; per expert 10 params, shared part of a layer 30:
    # layer active 30 + 2·10 = 50, layer total 30 + 8·10 = 110; + 7 outside the layers.
    moe = ModelSpec(name="moe", num_layers=32, hidden_size=64, num_heads=4, ffn_hidden_size=256,
                    vocab_size=100, max_seq_len=64, num_experts=8, experts_per_token=2)
    total = 32 * 110 + 7
    assert decode_weight_params(moe, total, 110, 50, batch=1) == 32 * 50 + 7  # only top-2
    assert decode_weight_params(moe, total, 110, 50, batch=2) == total - 32 * 4 * 10
    assert decode_weight_params(moe, total, 110, 50, batch=4) == total  # 4·2 = 8 = every expert
    assert decode_weight_params(LLAMA2_7B, 123, 0, 0, batch=1) == 123


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("cfg, field", [
    (InferConfig(batch=0, context=128), "batch"),
    (InferConfig(batch=1, context=0), "context"),
    (InferConfig(batch=1, context=8192), "context"),  # > max_seq_len 4096
    (InferConfig(batch=1, context=128, tp=3), "tp"),   # 3 does not divide 32 heads
])
def test_bad_inputs(cfg, field):
    with pytest.raises(PlanInputError) as err:
        check_config(LLAMA2_7B, cfg)
    assert err.value.field == field


def test_tp_must_divide_or_be_a_multiple_of_the_kv_heads():
    # issue 13: tp=16 over 8 kv heads is no longer refused; each kv head is replicated on 2
    # ranks (vLLM QKVParallelLinear num_kv_head_replicas = 16 / 8), see test_infer_modern.py
    check_config(LLAMA2_70B, InferConfig(batch=1, context=128, tp=16))
    six_kv = LLAMA2_70B.model_copy(update={"num_heads": 48, "num_kv_heads": 6})
    with pytest.raises(PlanInputError, match="num_kv_heads"):  # 4 | 48, but 4 ∤ 6 and 6 ∤ 4
        check_config(six_kv, InferConfig(batch=1, context=128, tp=4))


def test_long_context_allowed_with_override():
    check_config(LLAMA2_7B, InferConfig(batch=1, context=8192, allow_long_context=True))


def test_chunked_prefill_bounds_the_workspace():
    # 512-token chunks of a 4096 prompt: 512 rows of 832 elements, flash attention over 4096 keys
    cfg = InferConfig(batch=1, context=4096, prefill_chunk=512, account="seed")
    mem = inference_memory(TOY, TOY_PARAMS, cfg, TOY_GPU.memory_bytes)
    assert mem.workspace_bytes == 512 * 832 * 2 + 4000


# --------------------------------------------------------------------------- CLI


@pytest.mark.cli
def test_cli_llama2_7b_fits_json(zplan):
    import json

    result = zplan("infer", "--model", "llama2-7b", "--gpu", "a100-80gb", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["kind"] == "infer"
    assert doc["config"]["context"] == 4096  # default: the model's max_seq_len
    assert doc["memory"]["kv_cache_bytes"] == 2 * GIB  # 2·32·32·128·2·4096, as above
    assert doc["memory"]["weights_bytes"] == 2 * LLAMA2_7B_PARAMS  # published count, fp16
    assert doc["decode"]["bound"] == "memory" and doc["prefill"]["bound"] == "compute"


@pytest.mark.cli
def test_cli_llama2_70b_does_not_fit_one_a100_exit_1(zplan):
    result = zplan("infer", "--model", "llama2-70b", "--gpu", "a100-80gb")
    assert result.returncode == 1, result.stderr
    assert "does not fit" in result.stdout
    assert "smallest tp that fits: 2" in result.stdout  # see test_min_tp_llama2_70b_on_a100_80gb


@pytest.mark.cli
@pytest.mark.parametrize("args, field", [
    (("--batch", "0"), "batch"),
    (("--context", "9000"), "context"),   # llama2-7b max_seq_len 4096
    (("--tp", "3"), "tp"),                # 3 does not divide 32 heads
    (("--weights", "int3"), "--weights"),
    (("--kv-dtype", "fp4"), "--kv-dtype"),
])
def test_cli_bad_input_exit_2(zplan, args, field):
    result = zplan("infer", "--model", "llama2-7b", "--gpu", "a100-80gb", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{field}:" in lines[0]


@pytest.mark.cli
def test_cli_long_context_override(zplan):
    result = zplan("infer", "--model", "llama2-7b", "--gpu", "a100-80gb", "--context", "8192",
                   "--allow-long-context", "--json")
    assert result.returncode == 0, result.stderr


def test_encoder_rejected():
    bert = ModelSpec(name="bert", arch="encoder", num_layers=2, hidden_size=64, num_heads=4,
                     ffn_hidden_size=256, vocab_size=100, max_seq_len=512)
    with pytest.raises(PlanInputError) as err:
        check_config(bert, InferConfig(batch=1, context=128))
    assert err.value.field == "model"


# --------------------------------------------------------------------------- serving account

# meta-llama/Meta-Llama-3-70B config.json: 80 layers, 64 heads, 8 kv heads of 128, d_ff 28672,
# vocab 128256, max 8192 positions; safetensors total 70,553,706,496 parameters.
LLAMA3_70B = ModelSpec(name="llama3-70b", num_layers=80, hidden_size=8192, num_heads=64,
                       num_kv_heads=8, ffn_hidden_size=28672, vocab_size=128256, max_seq_len=8192,
                       mlp="swiglu", norm="rmsnorm", position="rotary", tied_embeddings=False,
                       linear_bias=False)
LLAMA3_70B_PARAMS = 70_553_706_496


def _h100():
    from planner.io.loading import load_gpu

    return load_gpu("h100-sxm")


def test_memory_budget_is_exact_for_the_decimal():
    # 0.9 x 84,943,715,697 = 76,449,344,127.3 -> 76,449,344,127 (no binary-float drift)
    assert memory_budget_bytes(84_943_715_697, 0.9) == 76_449_344_127
    assert memory_budget_bytes(10, 0.25) == 2


def test_serving_reserve_of_h100():
    from planner.memory.infer import serving_reserve

    reserve = serving_reserve(_h100(), InferConfig(batch=1, context=8, tp=2))
    # outside vLLM's budget (held before its memory snapshot): CUDA context 300 MiB and, with a
    # tp group, one communicator's NCCL buffers, 16 channels x 2 connections x 9,633,792 =
    # 308,281,344; inside: the cuBLAS workspace, 32 MiB on sm90. No fragmentation part.
    assert reserve.outside_budget(1) == {"cuda_context": 314_572_800}
    assert reserve.outside_budget(2) == {"cuda_context": 314_572_800, "nccl_buffers": 308_281_344}
    assert reserve.in_budget_parts == {"cublas_workspace": 33_554_432}
    user = serving_reserve(_h100(), InferConfig(batch=1, context=8, tp=2,
                                                reserve_override_bytes=GIB))
    assert user.parts(2) == {"user_reserve": GIB} and user.outside_budget(2) == {}


def test_llama3_70b_tp2_on_two_h100_serves_three_8k_sequences():
    # Issue 11: serving engines run Llama-3-70B at TP=2 on two 80 GB H100s with several 8k
    # sequences. Per GPU (one tp rank), by hand:
    #   capacity  = round(79.11 GiB) = 84,943,715,697 (CUDA-reported total, h100-sxm profile)
    #   budget    = floor(0.9 x capacity) = 76,449,344,127 (vLLM gpu_memory_utilization 0.9)
    #   weights   = 2 bytes x 70,553,706,496 / 2 ranks = 70,553,706,496
    #   activation peak of an 8,192-token step: rows of 2·8192 + (32 + 2·4)·128 + 3·28672/2
    #             = 16,384 + 5,120 + 43,008 = 64,512 elements x 2 bytes x 8,192 = 1,056,964,608,
    #             + fp32 logits 3 sequences x 64,128 x 4 = 769,536
    #   in the budget: cuBLAS workspace 33,554,432
    #   KV cache  = 2 · 80 · (8/2) · 128 · 2 bytes = 163,840 per token x 8,192 x 3 = 4,026,531,840
    #   outside the budget (in its 10 % margin of 8,494,371,570): CUDA context 314,572,800 +
    #             NCCL 308,281,344 = 622,854,144
    weights, peak, cublas, kv = 70_553_706_496, 1_056_964_608 + 769_536, 33_554_432, 4_026_531_840
    in_budget = weights + peak + cublas + kv
    assert in_budget == 75_671_526_912
    budget, outside = 76_449_344_127, 622_854_144
    cfg = InferConfig(batch=3, context=8192, tp=2, weights="bf16", kv_dtype="bf16")
    from planner.memory.infer import serving_reserve

    h100 = _h100()
    mem = inference_memory(LLAMA3_70B, LLAMA3_70B_PARAMS, cfg, h100.usable_memory_bytes,
                           serving_reserve(h100, cfg))
    assert (mem.weights_bytes, mem.workspace_bytes, mem.kv_cache_bytes) == (weights, peak, kv)
    assert mem.overhead_bytes == cublas + outside == 656_408_576
    assert mem.budget_bytes == budget and mem.outside_budget_bytes == outside
    assert outside <= h100.usable_memory_bytes - budget == 8_494_371_570
    assert mem.total_bytes == in_budget + outside == 76_294_381_056
    assert mem.fits and mem.headroom_bytes == budget - in_budget == 777_817_215
    assert mem.kv_budget_bytes == budget - (weights + peak + cublas) == 4_804_349_055
    # a fourth 8k sequence needs 1,342,177,280 more than the room left (777,817,215 - 256,512)
    four = cfg.model_copy(update={"batch": 4})
    assert not inference_memory(LLAMA3_70B, LLAMA3_70B_PARAMS, four, h100.usable_memory_bytes,
                                serving_reserve(h100, four)).fits
    plan = plan_inference(LLAMA3_70B, h100, cfg)
    assert plan.memory == mem and plan.max_batch == 3


def test_fp8_kv_cache_doubles_the_sequences():
    # fp8 KV: 81,920 bytes per token per rank, 671,088,640 per 8k sequence. Room at batch b:
    # 76,449,344,127 - (70,553,706,496 + 1,056,964,608 + 33,554,432) - 256,512·b
    # = 4,805,118,591 - 256,512·b; 7 sequences need 4,697,620,480 <= 4,803,323,007,
    # 8 need 5,368,709,120 > 4,803,066,495.
    cfg = InferConfig(batch=1, context=8192, tp=2, weights="bf16", kv_dtype="fp8")
    plan = plan_inference(LLAMA3_70B, _h100(), cfg)
    assert plan.max_batch == 7


def test_context_and_nccl_must_fit_the_margin():
    # at utilisation 0.999 the margin, capacity - floor(0.999 x capacity) = 84,943,716 bytes, is
    # smaller than the CUDA context (314,572,800): vLLM refuses to start ("Free memory on device
    # ... is less than desired GPU memory utilization"), and so does the plan.
    cfg = InferConfig(batch=1, context=128, tp=2, weights="bf16", memory_utilisation=0.999)
    plan = plan_inference(LLAMA3_70B, _h100(), cfg)
    assert plan.memory.headroom_bytes > 0 and not plan.memory.fits


def test_the_seed_account_says_it_does_not_fit():
    # seed 004 §2.3.2 on the same GPU, one 8k sequence: weights 70,553,706,496 + 20 % overhead
    # 14,110,741,300 (ceil of ...299.2) + KV 1,342,177,280 + workspace 8,192 x 64,512 x 2
    # + 256,512 = 1,057,221,120 -> 87,063,846,196 > 80 GiB = 85,899,345,920.
    cfg = InferConfig(batch=1, context=8192, tp=2, weights="bf16", account="seed")
    plan = plan_inference(LLAMA3_70B, _h100(), cfg)
    assert plan.memory.total_bytes == 87_063_846_196 > 80 * GIB
    assert not plan.memory.fits


def test_fp8_weights():
    from planner.memory.infer import default_compute_dtype
    from planner.io.loading import load_gpu

    assert weights_bytes(LLAMA3_70B_PARAMS, "fp8", tp=2) == LLAMA3_70B_PARAMS // 2
    assert default_compute_dtype("fp8", _h100()) == "fp8"  # Hopper has an fp8 peak
    assert default_compute_dtype("fp8", load_gpu("a100-80gb")) == "fp16"  # weight-only on A100
    plan = plan_inference(LLAMA3_70B, _h100(), InferConfig(batch=1, context=8192, tp=2,
                                                           weights="fp8", kv_dtype="fp8"))
    assert plan.compute_dtype == "fp8"
    assert plan.memory.weights_bytes == 35_276_853_248


def test_step_activation_matches_the_workspace_of_a_whole_prompt():
    # workspace_bytes(b, t) is the step of b·t rows from b sequences (TOY: 832 elements a row)
    assert step_activation_bytes(TOY, 256, 2, 128, 2) == 256 * 832 * 2 + 2 * 4000
    assert workspace_bytes(TOY, 2, 128, 128, 2) == step_activation_bytes(TOY, 256, 2, 128, 2)


def test_tokens_per_second_per_gpu_is_the_group_rate_over_tp():
    plan = plan_inference(LLAMA3_70B, _h100(), InferConfig(batch=3, context=8192, tp=2,
                                                           weights="bf16"))
    assert plan.decode_tokens_per_s_per_gpu == pytest.approx(plan.decode_tokens_per_s / 2)


@pytest.mark.cli
def test_cli_llama3_70b_tp2_serving(zplan):
    import json

    ok = zplan("infer", "--model", "llama3-70b", "--gpu", "h100-sxm", "--tp", "2", "--batch", "3",
               "--context", "8192", "--weights", "bf16", "--json")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["memory"]["account"] == "serving"
    assert doc["memory"]["total_bytes"] == 76_294_381_056  # as worked above
    over = zplan("infer", "--model", "llama3-70b", "--gpu", "h100-sxm", "--tp", "2", "--batch", "4",
                 "--context", "8192", "--weights", "bf16")
    assert over.returncode == 1
    table = zplan("infer", "--model", "llama3-70b", "--gpu", "h100-sxm", "--tp", "2", "--batch",
                  "3", "--context", "8192", "--weights", "bf16")
    assert "GiB" in table.stdout and "bytes" not in table.stdout
    assert "per tp group" in table.stdout and "per GPU" in table.stdout


@pytest.mark.cli
@pytest.mark.parametrize("args, field", [
    (("--account", "vllm"), "--account"),
    (("--gpu-memory-utilization", "1.5"), "--gpu-memory-utilization"),
    (("--max-batched-tokens", "0"), "--max-batched-tokens"),
    (("--reserve", "-1"), "--reserve"),
])
def test_cli_serving_bad_input_exit_2(zplan, args, field):
    result = zplan("infer", "--model", "llama2-7b", "--gpu", "a100-80gb", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{field}:" in lines[0]


@pytest.mark.cli
def test_cli_gpu_file_without_usable_memory(zplan, tmp_path):
    # A user's GPU file without usable_memory_gib: the serving account cannot size the budget,
    # so it is an input error naming the key (exit 2, one line); the seed account still runs.
    gpu = tmp_path / "mygpu.yaml"
    gpu.write_text(
        "name: mygpu\nmemory_gib: 80\npeak_tflops: {fp16: 312.0, bf16: 312.0}\nhbm_gb_per_s: 2039\n"
        "sources: {memory_gib: s, peak_tflops: s, hbm_gb_per_s: s, achieved_efficiency: s}\n")
    bad = zplan("infer", "--model", "llama2-7b", "--gpu", str(gpu))
    assert bad.returncode == 2 and bad.stdout == ""
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "usable_memory_gib" in lines[0]
    assert zplan("infer", "--model", "llama2-7b", "--gpu", str(gpu), "--account", "seed").returncode == 0
