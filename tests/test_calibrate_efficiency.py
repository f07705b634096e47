"""The calibration file's efficiency means what the step-time model means by it.

`zplan calibrate` measures a whole training step; `planner.timing.steptime.estimate_step` wants the
matmul-level fraction of peak and adds memory-bound kernels and the optimizer step on top. The
builder therefore inverts the step-time model on the measured one-GPU run. Checked here:
- the inversion against a hand calculation (tiny GPT-2, a made-up round-number GPU);
- the flagged fallbacks (measured step shorter than the non-matmul terms; no GPU profile);
- schema-1 files (whole-step `efficiency`) still load and are refused for fit/sweep;
- end to end: `zplan fit --calibration FILE` on the same tiny model and layout reproduces the
  measured step time (the property that makes a calibration file mean something).
Hand-calculated FLOPs follow seed 004 §1.2 (24Bsh² + 4Bs²h per block forward at f = 4h, logits
2BshV, backward = 2 x forward); element-wise bytes follow `planner.timing.steptime.elementwise_layer_bytes`'
kernel list (Shoeybi et al. 2019 §3, Korthikanti et al. 2022 §4.1); Adam bytes per parameter are
the fp32 recipe's 4 + 4 + 8 (seed 004 note).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import (
    run_zplan,  # tests/ is on sys.path (rootdir conftest), also for plain `pytest`
)

from planner.calibrate.compare import Row
from planner.calibrate.config import RunSpec, scaled_model
from planner.calibrate.results import (
    ConfigResult,
    Measured,
    StateBytes,
    build_calibration,
)
from planner.io.calibration import (
    efficiency_for,
    end_to_end_utilisation_for,
    load_calibration,
    write_calibration,
)
from planner.core.errors import PlanInputError
from planner.io.loading import load_model
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Cluster, GpuSpec, Layout, NodeSpec, TrainSetup

L, H, A, F, V, P = 2, 64, 4, 256, 100, 1024   # layers, hidden, heads, ffn, vocab, GPT-2 positions
S, B = 16, 2                                  # sequence length, micro-batch
PEAK = 10e12                                  # made-up GPU: 10 TFLOP/s fp32 dense peak
HBM = 1000e9                                  # and 1000 GB/s of HBM

# --- the hand calculation for tiny GPT-2, fp32 Adam, no recompute, one GPU -------------------
# FLOPs (seed 004 §1.2): per block forward 24·B·s·h² + 4·B·s²·h = 3,145,728 + 131,072 = 3,276,800;
# 2 blocks 6,553,600; logits 2·B·s·h·V = 409,600; forward 6,963,200; backward 13,926,400
FLOPS = 3 * (L * (24 * B * S * H**2 + 4 * B * S**2 * H) + 2 * B * S * H * V)
assert FLOPS == 20_889_600
MATMUL_AT_PEAK_S = FLOPS / PEAK                              # 2.08896e-6 s
# Element-wise HBM bytes per block forward, e = 4 bytes, 1-byte dropout masks, T = s·b = 32 tokens:
#   2 LayerNorms 2·2e·T·h + 2 bias-dropout-adds 2·(3e+1)·T·h = 2048·(16 + 26)      = 86,016
#   bias-GeLU reads and writes f: 2e·T·f = 8·32·256                               = 65,536
#   softmax + attention dropout (4e+1)·B·a·s² = 17·2·4·256                        = 34,816
# forward 186,368 B; the step reads/writes 3x (forward 1 + backward 2): 559,104 B per block
ELEMENTWISE_BYTES = L * 3 * ((2 * 2 * 4 + 2 * (3 * 4 + 1)) * S * B * H + 2 * 4 * S * B * F
                             + (4 * 4 + 1) * B * A * S * S)
assert ELEMENTWISE_BYTES == 1_118_208
# GPT-2 parameters: embeddings V·h + P·h, per block 12h² + 13h, final LayerNorm 2h
PHI = V * H + P * H + L * (12 * H**2 + 13 * H) + 2 * H
assert PHI == 172_032
# fused Adam step per parameter: read + write 8 B of states, read the 4 B gradient, write the 4 B param
OPTIMIZER_BYTES = PHI * (2 * 8 + 4 + 4)                       # 4,128,768 B
# the loss over the T x V = 32 x 100 fp32 logits (planner/timing/logits.py, no casts in fp32):
# log_softmax 2 x 4, nll_loss backward 4, log_softmax backward 3 x 4 = 24 B each -> 76,800 B
LOSS_BYTES = S * B * V * 24
assert LOSS_BYTES == 76_800
# 1.118208e-6 + 0.0768e-6 + 4.128768e-6 = 5.323776e-6 s
NON_MATMUL_S = (ELEMENTWISE_BYTES + LOSS_BYTES + OPTIMIZER_BYTES) / HBM


def tiny_gpt2():
    return scaled_model(load_model("gpt2"), layers=L, hidden=H, heads=A, ffn=F, vocab=V)


def fp32_setup() -> TrainSetup:
    return TrainSetup(seq_len=S, global_batch=B, train_tokens=S * B,
                      precision=get_precision("fp32"), optimizer=get_optimizer("adam"))


def round_number_cluster() -> Cluster:
    """One GPU of a made-up profile with round numbers (the hand calculation's hardware)."""
    src = "test value"
    gpu = GpuSpec(name="test-gpu", memory_gib=80, peak_tflops={"fp32": PEAK / 1e12},
                  hbm_gb_per_s=HBM / 1e9, achieved_efficiency=0.5,
                  sources=dict.fromkeys(("memory_gib", "peak_tflops", "hbm_gb_per_s",
                                         "achieved_efficiency"), src))
    node = NodeSpec(name="test-node", gpu="test-gpu", gpus_per_node=1, intra_node_gb_per_s=100,
                    intra_node_latency_us=1, pcie_gb_per_s=10, cpu_memory_gib=64,
                    sources=dict.fromkeys(("gpus_per_node", "intra_node_gb_per_s",
                                           "intra_node_latency_us", "pcie_gb_per_s",
                                           "cpu_memory_gib"), src))
    return Cluster(name="test", gpu=gpu, node=node, num_nodes=1, inter_node_gb_per_s=100,
                   inter_node_latency_us=1)


def run_record(step_time_s: float) -> ConfigResult:
    """A measured run of tiny GPT-2 on the CPU with a chosen step time (FLOPs as counted by hand)."""
    measured = Measured(
        device="cpu",
        states=StateBytes(num_params=PHI, params_bytes=4 * PHI, grads_bytes=4 * PHI,
                          optimizer_bytes=8 * PHI, step_counter_bytes=0, num_tensors=1),
        saved_per_layer=[{}, {}], saved_outside_layers={},
        forward_flops=FLOPS // 3, backward_flops=2 * FLOPS // 3, step_time_s=step_time_s,
        achieved_flops_per_s=FLOPS / step_time_s, peak_memory_bytes=None)
    run = RunSpec(model=tiny_gpt2(), setup=fp32_setup(), layout=Layout(micro_batch=B, flash_attention=False))
    rows = [Row(quantity=f"saved activations, all {L} blocks", unit="bytes", predicted=1.0, measured=1.0)]
    return ConfigResult(label="tiny", run=run, measured=measured, rows=rows, classes=[])


def test_inversion_by_hand() -> None:
    measured_s = 10e-6   # 10 µs
    cal = build_calibration([run_record(measured_s)], "test-gpu", PEAK, "now", "none",
                            round_number_cluster())
    entry = cal.entries[0]
    # step = matmul_at_peak / e + non_matmul  =>  e = 2.08896e-6 / (10e-6 - 5.323776e-6)
    #                                              = 2.08896e-6 / 4.676224e-6 = 0.44672...
    assert entry.matmul_s_at_peak == pytest.approx(2.08896e-6, rel=1e-12)
    assert entry.non_matmul_s == pytest.approx(5.323776e-6, rel=1e-12)
    assert entry.efficiency == pytest.approx(2.08896e-6 / 4.676224e-6, rel=1e-12)
    assert entry.efficiency == pytest.approx(0.446719, abs=1e-6)
    assert entry.efficiency_source == "step_model"
    # the whole-step figure is kept apart: 20,889,600 FLOPs / 10 µs / 10 TFLOP/s = 0.2088960
    assert entry.end_to_end_utilisation == pytest.approx(0.208896, rel=1e-12)
    assert "inverted" in entry.note
    assert efficiency_for(cal, "test-gpu", "fp32") == entry.efficiency
    assert end_to_end_utilisation_for(cal, "test-gpu", "fp32") == entry.end_to_end_utilisation


def test_fallback_when_the_step_is_shorter_than_the_non_matmul_terms() -> None:
    measured_s = 5e-6    # below the 5.323776 µs of element-wise kernels, loss + Adam at 1000 GB/s
    cal = build_calibration([run_record(measured_s)], "test-gpu", PEAK, "now", "none",
                            round_number_cluster())
    entry = cal.entries[0]
    # whole-step figure: 20,889,600 FLOPs / 5 µs = 4.17792e12 FLOP/s over 10e12 = 0.417792
    assert entry.efficiency_source == "end_to_end_fallback"
    assert entry.efficiency == pytest.approx(0.417792, rel=1e-12)
    assert entry.end_to_end_utilisation == entry.efficiency
    assert "FALLBACK" in entry.note and "not longer than the non-matmul terms" in entry.note
    assert efficiency_for(cal, "test-gpu", "fp32") == pytest.approx(0.417792, rel=1e-12)


def test_inverted_entries_win_over_fallbacks() -> None:
    inverted = build_calibration([run_record(10e-6)], "test-gpu", PEAK, "now", "none",
                                 round_number_cluster())
    # a fallback entry with more FLOPs per step (the usual tie-break) is still passed over
    fallback = build_calibration([run_record(5e-6)], "test-gpu", PEAK, "now", "none", None)
    bigger = fallback.entries[0].model_copy(update={"achieved_flops_per_s": 1e20})
    cal = inverted.model_copy(update={"entries": [bigger, *inverted.entries]})
    assert efficiency_for(cal, "test-gpu", "fp32") == inverted.entries[0].efficiency


def test_fallback_without_a_gpu_profile() -> None:
    # CPU run with --peak-tflops only: no HBM bandwidth to price the non-matmul terms
    cal = build_calibration([run_record(10e-6)], "cpu", PEAK, "now", "none", None)
    entry = cal.entries[0]
    assert entry.efficiency_source == "end_to_end_fallback"
    assert entry.efficiency == pytest.approx(0.208896, rel=1e-12)   # 20,889,600 / 10 µs / 10e12
    assert entry.non_matmul_s is None and "FALLBACK" in entry.note
    # and nothing at all without a peak
    cal = build_calibration([run_record(10e-6)], "cpu", None, "now", "none", None)
    assert cal.entries[0].efficiency is None and cal.entries[0].end_to_end_utilisation is None


def test_schema_1_file_loads_and_is_refused_for_the_step_model(tmp_path: Path) -> None:
    old = {"schema_version": 1, "created": "2026-11-22T00:35:49+00:00", "torch_version": "2.13.0",
           "entries": [{"gpu": "a100-80gb", "dtype": "bf16", "achieved_flops_per_s": 1.4e14,
                        "peak_flops_per_s": 3.12e14, "efficiency": 0.45, "model": "m",
                        "recompute": "none", "tokens_per_step": 8192, "step_time_s": 0.06,
                        "device": "NVIDIA A100-SXM4-80GB"}],
           "overheads": {"optimizer_step_counter_bytes_per_tensor": 4.0}}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(old))
    cal = load_calibration(path)
    assert cal.schema_version == 2
    assert cal.entries[0].end_to_end_utilisation == 0.45 and cal.entries[0].efficiency is None
    assert end_to_end_utilisation_for(cal, "a100-80gb", "bf16") == 0.45
    with pytest.raises(PlanInputError, match="re-run `zplan calibrate"):
        efficiency_for(cal, "a100-80gb", "bf16")
    assert efficiency_for(cal, "h100-sxm", "bf16") is None


@pytest.mark.torch
@pytest.mark.cli
def test_fit_with_the_calibration_reproduces_the_measured_step(tmp_path: Path) -> None:
    """Real CPU run of tiny GPT-2 (fp32 Adam, b = 2, s = 16), inverted against one A100 80 GB
    (the shipped profile, 19.5 TFLOP/s fp32, 2039 GB/s); `zplan fit` on the same model and layout
    with that file must predict the measured step. Tolerance: relative 1e-9 (the inversion is in
    closed form, so only float rounding and the YAML round trip separate the two)."""
    pytest.importorskip("torch")
    from planner.calibrate.run import run_all
    from planner.io.loading import cluster_for_gpus

    model, setup, layout = tiny_gpt2(), fp32_setup(), Layout(micro_batch=B, flash_attention=False)
    [result] = run_all([RunSpec(model=model, setup=setup, layout=layout)], steps=1, warmup=1,
                       device="cpu")
    cal = build_calibration([result], "a100-80gb", 19.5e12, "now", "none",
                            cluster_for_gpus("a100-80gb", 1))
    assert cal.entries[0].efficiency_source == "step_model"
    cal_path, model_path = tmp_path / "calib.yaml", tmp_path / "tiny.yaml"
    write_calibration(cal, cal_path)
    model_path.write_text(yaml.safe_dump(model.model_dump(mode="json")))
    proc = run_zplan("fit", "--model", str(model_path), "--gpu", "a100-80gb", "--gpus", "1",
                     "--precision", "fp32", "--optimizer", "adam", "--seq-len", str(S),
                     "--global-batch", str(B), "--micro-batch", str(B), "--recompute", "none",
                     "--no-flash-attention",  # the calibrated run was planned unfused (run_specs)
                     "--calibration", str(cal_path), "--json")
    assert proc.returncode == 0, proc.stderr
    step = json.loads(proc.stdout)["step"]
    assert step["compute_efficiency"] == pytest.approx(cal.entries[0].efficiency, rel=1e-12)
    assert step["step_s"] == pytest.approx(result.measured.step_time_s, rel=1e-9)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_a_step_generated_at_the_a100_default_inverts_back_to_it(recompute: str) -> None:
    """Round trip: the step-time model's own one-GPU step at efficiency 0.628 (the A100 profile's
    default) read back by the builder gives 0.628 again; the old whole-step reading gave
    0.628 x (matmul share of the step), which fit then slowed down by the non-matmul time again."""
    from planner.calibrate.results import invert_step_model
    from planner.io.loading import cluster_for_gpus
    from planner.timing.steptime import estimate_step

    model = load_model("gpt2")
    setup = TrainSetup(seq_len=1024, global_batch=8, train_tokens=8192,
                       precision=get_precision("megatron-bf16"), optimizer=get_optimizer("adam"))
    layout = Layout(micro_batch=8, recompute=recompute, flash_attention=True)
    cluster = cluster_for_gpus("a100-80gb", 1)
    step = estimate_step(model, cluster, layout, setup, efficiency=0.628)
    inv = invert_step_model(model, cluster, layout, setup, step.step_s, end_to_end=None)
    assert inv.source == "step_model"
    assert inv.efficiency == pytest.approx(0.628, rel=1e-12)
    # on one GPU the non-matmul terms are the element-wise kernels and the optimizer step only
    # (no tp / pp / dp communication, no bubble, no offload)
    assert inv.non_matmul_s == pytest.approx(step.memory_bound_s + step.gpu_optimizer_s, rel=1e-12)
