"""FP8 training wired into the activations and the step time (issue 13), worked out by hand.

What TE saves (NVIDIA/TransformerEngine@d0067d0d, docs/fp8.md): each linear's input as ONE fp8
copy (1 byte/element + one 4-byte fp32 scale per tensor, or the padded E8M0 grid with MXFP8);
the flash/fused attention kernel its bf16 q, k, v and output O; everything else bf16/fp32.
Timing: the linears' GEMMs at the fp8 peak, the rest at bf16, MFU against the bf16 peak.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_zplan

from planner.core.spec import Layout
from planner.io.jobfile import make_setup
from planner.io.loading import cluster_for_gpus, load_model
from planner.memory import activations as acts
from planner.memory import plan
from planner.search import sweep
from planner.timing import fp8 as fp8_timing
from planner.timing import steptime

LLAMA2_7B = load_model("llama2-7b")  # h 4096, a 32 (kv 32), d 128, f 11008, SwiGLU, RMSNorm
S, H, F = 4096, 4096, 11008


def _inventory(model, layout, scaling=None, s=S, b=1):
    return acts.layer_saved_bytes(model, layout, s, b, 2, scaling)


def test_llama_layer_bf16_vs_te_fp8_by_hand():
    """Llama-2-7B block, s = 4096, b = 1, tp = 1, flash attention."""
    lay = Layout(tp=1, flash_attention=True)
    bf16, fp8 = _inventory(LLAMA2_7B, lay), _inventory(LLAMA2_7B, lay, "per-tensor")
    sh, sf = S * H, S * F
    # bf16: norm inputs 2 x 2sh, qkv input, q, k, v, proj input 5 x 2sh, fc1 input 2sh,
    # SwiGLU act input/output, up output, fc2 input 4 x 2sf; fp32 RMSNorm rstd 2 x 4s;
    # flash log-sum-exp 4·a·s
    assert sum(bf16.values()) == 8 * 2 * sh + 4 * 2 * sf + 2 * 4 * S + 4 * 32 * S == 629_702_656
    # te-fp8: qkv, proj, fc1 inputs sh + 4 each; fc2 input sf + 4; the rest unchanged; plus the
    # attention kernel's bf16 output O (2sh), no longer the same storage as the proj input
    assert fp8["attn.qkv_input"] == fp8["attn.proj_input"] == fp8["mlp.fc1_input"] == sh + 4
    assert fp8["mlp.fc2_input"] == sf + 4 == 45_088_772
    assert fp8["attn.core_output"] == 2 * sh
    for name in ("norm1.input", "attn.q", "attn.k", "attn.v", "norm2.input", "mlp.act_input",
                 "mlp.act_output", "mlp.up_output", "norm1.stats", "attn.softmax_lse"):
        assert fp8[name] == bf16[name], name
    expected = 629_702_656 - 3 * (2 * sh - (sh + 4)) - (2 * sf - (sf + 4)) + 2 * sh
    assert sum(fp8.values()) == expected == 567_836_688


def test_unfused_attention_saves_no_extra_output():
    """Without flash attention softmax·V saves P and V, not O: no attn.core_output."""
    fp8 = _inventory(LLAMA2_7B, Layout(tp=1, flash_attention=False), "per-tensor")
    assert "attn.core_output" not in fp8
    assert fp8["attn.proj_input"] == S * H + 4


def test_selective_recompute_drops_the_attention_output():
    """Megatron checkpoints core_attention, so O is recomputed, the proj's fp8 input is kept:
    kept = fp8 inventory - lse (4·a·s) - O (2sh)."""
    lay = Layout(tp=1, flash_attention=True, recompute="selective")
    full = _inventory(LLAMA2_7B, lay, "per-tensor")
    kept = acts.layer_activation_bytes(LLAMA2_7B, lay, S, 1, 2, "per-tensor")
    assert kept == sum(full.values()) - 4 * 32 * S - 2 * S * H
    assert acts.recompute_working_bytes(LLAMA2_7B, lay, S, 1, 2, 1, "per-tensor") == \
        4 * 32 * S + 2 * S * H


def test_tensor_and_sequence_parallel_shapes():
    """tp = 2 with SP: the column-parallel inputs are the local s/2 shard of h columns (TE keeps
    the row-wise copy to all-gather it), the row-parallel inputs s rows of h/2 and f/2."""
    fp8 = _inventory(LLAMA2_7B, Layout(tp=2, sequence_parallel=True, flash_attention=True),
                     "per-tensor")
    assert fp8["attn.qkv_input"] == fp8["mlp.fc1_input"] == (S // 2) * H + 4
    assert fp8["attn.proj_input"] == S * (H // 2) + 4
    assert fp8["mlp.fc2_input"] == S * (F // 2) + 4


def test_mxfp8_scales_of_a_saved_input():
    """MXFP8 column-wise grid: one E8M0 byte per 32 rows of a column, padded to [4, 128]:
    fc2 input 4096 x 11008 -> (4096/32 = 128 rows) x (11008 rounded up to 11008 = 86·128)."""
    fp8 = _inventory(LLAMA2_7B, Layout(tp=1, flash_attention=True), "mxfp8")
    assert fp8["mlp.fc2_input"] == S * F + 128 * 11008
    # b = 3, s = 100: 300 rows -> 300 // 32 = 9 -> padded to 12; 4096 columns
    fp8 = _inventory(LLAMA2_7B, Layout(tp=1, flash_attention=True), "mxfp8", s=100, b=3)
    assert fp8["attn.qkv_input"] == 300 * H + 12 * 4096


def test_gelu_block_keeps_the_activation_input_in_bf16():
    """GPT-3 13B (GELU, h 5120, f 20480), s 2048: the GELU input stays bf16 (GELU saves it), the
    GELU output is the fc2 input, saved in fp8."""
    gpt = load_model("gpt3-13b")
    fp8 = _inventory(gpt, Layout(tp=1, flash_attention=True), "per-tensor", s=2048)
    assert fp8["mlp.act_input"] == 2 * 2048 * 20480
    assert fp8["mlp.fc2_input"] == 2048 * 20480 + 4


def test_moe_router_input_stays_bf16_expert_inputs_fp8():
    """Mixtral (E 8, k 2, expert f 14336), s 4096: the router (torch linear) keeps the bf16 norm
    output; the k = 2 dispatched copies go to TE grouped linears in fp8 (one tensor, named
    approximation)."""
    mixtral = load_model("mixtral-8x7b")
    bf16 = _inventory(mixtral, Layout(tp=1, flash_attention=True))
    fp8 = _inventory(mixtral, Layout(tp=1, flash_attention=True), "per-tensor")
    assert fp8["mlp.fc1_input"] == bf16["mlp.fc1_input"] == 2 * S * 4096
    assert fp8["moe.expert_input"] == 2 * S * 4096 + 4
    assert fp8["moe.expert.fc2_input"] == 2 * S * 14336 + 4
    assert fp8["moe.expert_output"] == bf16["moe.expert_output"]


def test_stage_activations_follow_the_recipe():
    """A stage under te-fp8 holds, per block and micro-batch in flight, exactly the inventory
    difference less (1F1B, one stage: min(p, m) = 1 micro-batch)."""
    lay = Layout(tp=1, pp=1, dp=8, micro_batch=1, grad_accum=2, flash_attention=True)
    layers = [LLAMA2_7B.num_layers]
    bf16 = acts.stage_activations(LLAMA2_7B, lay, make_setup(S, 16, 1e12, "megatron-bf16"), layers)
    fp8 = acts.stage_activations(LLAMA2_7B, lay, make_setup(S, 16, 1e12, "te-fp8"), layers)
    per_block = 629_702_656 - 567_836_688  # the two hand totals above
    assert bf16[0].in_flight_microbatches == fp8[0].in_flight_microbatches == 1
    assert bf16[0].total_bytes - fp8[0].total_bytes == LLAMA2_7B.num_layers * per_block
    assert fp8[0].extras == bf16[0].extras  # head input and logits: not TE modules


def test_hf_implementations_refuse_fp8_recipes():
    result = run_zplan("fit", "--model", "llama2-7b", "--gpu", "h100-sxm", "--gpus", "8",
                       "--precision", "te-fp8", "--implementation", "hf-sdpa")
    assert result.returncode == 2, result.stderr
    assert "implementation=megatron" in result.stderr and "Traceback" not in result.stderr


def test_sweep_matches_plan_memory_under_fp8_at_every_micro_batch():
    """The fp8 scales do not grow with b: the sweep evaluates each micro-batch, to the byte."""
    model, cluster = load_model("llama3-8b"), cluster_for_gpus("h100-sxm", 8)
    setup = make_setup(8192, 64, 1e12, "te-mxfp8")
    c = sweep.Constraints(flash_attention=True)
    cands = sweep.enumerate_candidates(model, cluster, setup, c)
    cols = sweep.evaluate(model, cluster, setup, cands, c)
    rows = [i for i in range(len(cands["tp"])) if cands["micro_batch"][i] > 1][:40]
    assert rows
    for i in rows:
        layout = sweep.layout_at(cands, int(i), c)
        mem = plan.plan_memory(model, cluster, layout, setup)
        assert int(cols["gpu_peak_bytes"][i]) == max(s.total_bytes for s in mem.stages), layout


# --------------------------------------------------------------------------- step time


def test_mixed_efficiency_by_hand():
    """90 % of the FLOPs at the fp8 peak (2x bf16) at 50 %, 10 % at bf16 at 60 %: time per bf16
    peak-second = 0.9 / (2 x 0.5) + 0.1 / 0.6 = 1.0667, efficiency vs bf16 = 0.9375."""
    eff = fp8_timing.Fp8Efficiencies(fp8=0.5, bf16=0.6, peak_ratio=2.0)
    assert fp8_timing.mixed_efficiency(eff, 0.9) == pytest.approx(1 / (0.9 + 0.1 / 0.6))
    assert fp8_timing.mixed_efficiency(eff, 0.0) == pytest.approx(0.6)


def test_fp8_level_transfers_the_bf16_in_training_ratio():
    """H100 SXM profile: bf16 level 0.58; best isolated GEMMs bf16 0.803, fp8 0.709 (stas00
    table, hardware_profiles/gpus/h100-sxm.yaml) -> 0.58 x 0.709 / 0.803."""
    gpu = cluster_for_gpus("h100-sxm", 8).gpu
    assert fp8_timing.fp8_level(gpu, 0.58) == pytest.approx(0.58 * 0.709 / 0.803)
    b200 = cluster_for_gpus("b200", 8).gpu  # no GEMM points: the stated assumption
    assert fp8_timing.fp8_level(b200, 0.4) == 0.4


def test_fp8_linear_flops_by_hand():
    """Llama-2-7B forward, one sequence of 4096: per layer and token 2·(h·(a + 2kv)·d + a·d·h)
    + 6·h·f = 2·(4096·12288 + 4096·4096) + 6·4096·11008; 32 layers. Attention core and logits
    are not fp8."""
    per_token = 2 * (4096 * 12288 + 4096 * 4096) + 6 * 4096 * 11008
    assert fp8_timing.fp8_linear_forward_flops(LLAMA2_7B, 1, S) == 32 * S * per_token


def test_cast_bytes_by_hand():
    """Llama-2-7B, tp 1, b 1, s 4096, te-fp8: inputs T·(h + a·d + h + f), output gradients
    T·((a + 2kv)·d + h + 2f + h), each read in bf16 (2) and written as two fp8 copies (2)."""
    setup = make_setup(S, 8, 1e12, "te-fp8")
    forward, backward = fp8_timing.cast_bytes(LLAMA2_7B, setup, 1, 1)
    assert forward == S * (H + H + H + F) * 4
    assert backward == S * (3 * H + H + 2 * F + H) * 4


def test_fp8_step_time_components_and_mfu_against_bf16():
    """With one efficiency override e for every GEMM: matmul time = fp8 FLOPs / (fp8 peak · e) +
    the rest / (bf16 peak · e); MFU = model FLOPs / (step · GPUs · bf16 peak)."""
    model, cluster = load_model("llama3-8b"), cluster_for_gpus("h100-sxm", 8)
    setup = make_setup(8192, 64, 1e12, "te-fp8")
    lay = Layout(tp=1, pp=1, dp=8, micro_batch=1, grad_accum=8, zero_stage=1,
                 flash_attention=True)
    e = 0.5
    step = steptime.estimate_step(model, cluster, lay, setup, efficiency=e)
    from planner.core import flops
    forward = flops.forward_flops(model, 64, 8192)
    linear = fp8_timing.fp8_linear_forward_flops(model, 64, 8192)
    p16, p8 = 989.5e12, 1979.0e12  # h100-sxm.yaml peak_tflops bf16, fp8
    expected = 3 * linear / (8 * p8 * e) + 3 * (forward - linear) / (8 * p16 * e)
    assert step.compute_s == pytest.approx(expected, rel=1e-12)
    assert step.mfu == pytest.approx(3 * forward / (step.step_s * 8 * p16), rel=1e-12)
    bf16 = steptime.estimate_step(model, cluster, lay, make_setup(8192, 64, 1e12, "megatron-bf16"),
                                  efficiency=e)
    assert step.compute_s < bf16.compute_s
    assert step.memory_bound_s > bf16.memory_bound_s  # the casts


def test_sweep_step_columns_equal_estimate_step_under_fp8():
    model, cluster = load_model("llama3-8b"), cluster_for_gpus("h100-sxm", 16)
    setup = make_setup(8192, 64, 1e12, "te-fp8")
    c = sweep.Constraints(flash_attention=True)
    cands = sweep.enumerate_candidates(model, cluster, setup, c)
    cols = sweep.evaluate(model, cluster, setup, cands, c)
    for i in np.random.default_rng(3).choice(len(cands["tp"]), 25, replace=False):
        layout = sweep.layout_at(cands, int(i), c)
        est = steptime.estimate_step(model, cluster, layout, setup)
        assert cols["step_s"][i] == pytest.approx(est.step_s, rel=1e-9), layout
        assert cols["mfu"][i] == pytest.approx(est.mfu, rel=1e-9), layout
