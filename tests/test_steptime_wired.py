"""The wired step model (issue 10 phase 2): data-parallel collectives per network level and
message size, DeepSpeed ZeRO-3's per-layer, per-micro-batch schedule, the communication floor,
and matmuls at their shapes. Every expected figure is worked out by hand below."""

from __future__ import annotations

import math

import pytest

from planner.core.params import count_params
from planner.core.spec import Layout
from planner.io import loading
from planner.timing import gemm
from planner.timing.steptime import estimate_step
from test_sweep_steptime_cases import MODEL, NCCL_BASE, SETUP, cluster


def test_zero1_rings_per_level_by_hand():
    # dp = 4 on 2 nodes of 2 GPUs: a flat NCCL ring of n = 4 with g = 2 GPUs of the group per
    # node. Bus bandwidth = min(NVLink 100 GB/s, g x NIC share) = min(100, 2 x 40/2) = 40 GB/s.
    # Latency per collective (tuning.cc): 8.4 us base + (n-1 - (N-1)) = 2 steps at the NVLink
    # latency + (N-1) = 1 step at the network latency, both 1 us here.
    # ZeRO-1: reduce-scatter of the 2-byte gradients + all-gather of the 2-byte parameters,
    # each (n-1)/n = 3/4 of 2·Φ bytes per GPU.
    phi = count_params(MODEL).total
    c = cluster(2, nodes=2, intra_gb=100.0, lat_us=1.0, inter_gb=40.0)
    est = estimate_step(MODEL, c, Layout(dp=4, zero_stage=1, micro_batch=1), SETUP)
    one = NCCL_BASE + 3e-6 + 0.75 * 2 * phi / 40e9
    assert est.dp_comm_s == pytest.approx(2 * one, rel=1e-12)
    # the same group inside one node of 4: bus bandwidth is NVLink's 100 GB/s, 3 NVLink steps
    inside = estimate_step(MODEL, cluster(4, intra_gb=100.0, lat_us=1.0),
                           Layout(dp=4, zero_stage=1, micro_batch=1), SETUP)
    assert inside.dp_comm_s == pytest.approx(2 * (NCCL_BASE + 3e-6 + 0.75 * 2 * phi / 100e9),
                                             rel=1e-12)


def test_zero3_gathers_every_layer_in_forward_and_backward_on_every_micro_batch():
    # ZeRO-3, dp = 2 in one node at 100 GB/s, latency 0: per layer (Φ/2 parameters, the tiny
    # model has 2 layers) an all-gather of 2-byte parameters and a reduce-scatter of 2-byte
    # gradients, each 8.4 us + 1/2 x 2·Φ/2 B / 100e9; per micro-batch forward AG, backward AG +
    # RS (DeepSpeed partitioned_param_coordinator.py / stage3.py, docs/collectives.md §4).
    # 2 micro-batches: total = 2 x 2 layers x (2·AG + RS) = 12 collectives of one layer.
    phi = count_params(MODEL).total
    est = estimate_step(MODEL, cluster(2), Layout(dp=2, zero_stage=3, micro_batch=1,
                                                  grad_accum=2), SETUP)
    per_layer = NCCL_BASE + 0.5 * 2 * (phi / 2) / 100e9
    assert est.dp_comm_s == pytest.approx(12 * per_layer, rel=1e-12)
    # message size: the per-collective latency is paid 12 times, against 2 for ZeRO-1
    z1 = estimate_step(MODEL, cluster(2), Layout(dp=2, zero_stage=1, micro_batch=1,
                                                 grad_accum=2), SETUP)
    assert z1.dp_comm_s == pytest.approx(2 * (NCCL_BASE + 0.5 * 2 * phi / 100e9), rel=1e-12)


def test_zero3_communication_floor_through_estimate_step():
    # GPT-3 175B, ZeRO-3 without model parallelism on DGX A100 at a fixed global batch of 1536
    # sequences, one micro-batch per step: 768 GPUs run b = 2, 1536 GPUs b = 1. Each GPU gathers
    # every layer's full 16-bit parameters (Φ/96 per layer) twice and reduce-scatters them once,
    # whatever the GPU count: the flat ring of n GPUs on n/8 nodes moves (n-1)/n of it at
    # min(NVLink 300, 8 x 25) = 200 GB/s with latency 8.4 + (n-1-(N-1)) x 3.4 + (N-1) x 9.6 us
    # (tests/test_collectives.py works the same ring). DeepSpeed's default max live 1e9 elements
    # < one layer's 1.81e9: no prefetch, every gather exposed.
    model = loading.load_model("gpt3-175b")
    phi = count_params(model).total
    layer_bytes = phi / model.num_layers * 2
    setup = SETUP.model_copy(update=dict(seq_len=2048, global_batch=1536))
    steps = {}
    for n, b in ((768, 2), (1536, 1)):
        nodes = n // 8
        a = (n - 1) / n * layer_bytes / 200e9 + (8.4 + (n - nodes) * 3.4 + (nodes - 1) * 9.6) * 1e-6
        est = estimate_step(model, loading.cluster_for_gpus("a100-80gb", n),
                            Layout(dp=n, zero_stage=3, micro_batch=b, recompute="full"), setup)
        assert est.dp_comm_s == pytest.approx(96 * 3 * a, rel=1e-9)  # 2 gathers + 1 RS, m = 1
        steps[n] = est.step_s
    # gathers: 96 x 3 x 21.3 ms = 6.1 s at 768 and 96 x 3 x 24.5 ms = 7.1 s at 1536 GPUs, while
    # compute halves: the step cannot halve
    assert steps[1536] / steps[768] > 0.6


def test_the_old_default_sweep_winner_no_longer_hides_its_gathers():
    # Issue 10: ZeRO-3 at tp 4 for GPT-3 175B on 1024 A100 was predicted at 56 % MFU with every
    # gather hidden. dp = 256 spans 128 nodes, 2 dp ranks per node (tp = 4): bus bandwidth
    # min(300, 2 x 25) = 50 GB/s for the per-layer 16-bit gathers of Φ/4/96 parameters.
    model = loading.load_model("gpt3-175b")
    setup = SETUP.model_copy(update=dict(seq_len=2048, global_batch=1536))
    est = estimate_step(model, loading.cluster_for_gpus("a100-80gb", 1024),
                        Layout(tp=4, dp=256, zero_stage=3, micro_batch=1, grad_accum=6,
                               recompute="selective", sequence_parallel=True), setup)
    assert est.dp_comm_exposed_s > 0.1 * est.step_s
    assert est.mfu < 0.45


def test_matmul_efficiency_is_the_block_gemms_at_their_shapes():
    # A100 80 GB, GPT-3 175B block, tp 8, b 1, s 2048, flash attention: 4 forward GEMMs and
    # their 8 backward ones, each at achieved_efficiency x (table at its intensity / 0.869),
    # capped by the roofline 2039e9 x ai / 312e12 (= 6.5 x ai: never binding at these sizes).
    # Table points: 1024x10240x5120 -> ai = 107,374,182,400 / 136,314,880 = 787.69 at 0.869;
    # 6912x2048x16384 -> 463,856,467,968 / 321,912,832 = 1440.94 at 0.859.
    gpu = loading.load_gpu("a100-80gb")
    fwd = gemm.forward_gemms(12288, 4 * 12288, 96, 96, 128, 2048, 1, 8)
    # qkv [2048, 4608, 12288]: ai = 231,928,233,984 / 182,452,224 = 1271.17, between the
    # points: linear in log10(ai)
    m, n, k = 2048, 4608, 12288
    ai = 2 * m * n * k / (2 * (m * k + k * n + m * n))
    assert ai == pytest.approx(1271.17, rel=1e-5)
    t = (math.log10(ai) - math.log10(787.69)) / (math.log10(1440.94) - math.log10(787.69))
    table = 0.869 + t * (0.859 - 0.869)
    eff = gemm.in_training_efficiency(gpu, "bf16", 0.628, m, n, k)
    assert float(eff) == pytest.approx(0.628 * table / 0.869, rel=1e-5)
    est = estimate_step(loading.load_model("gpt3-175b"), loading.cluster_for_gpus("a100-80gb", 8),
                        Layout(tp=8, micro_batch=1, flash_attention=True),
                        SETUP.model_copy(update=dict(seq_len=2048, global_batch=1)))
    # the profile's level: 0.641 since session 12's refit on the same calibration row
    block = gemm.block_efficiency(gpu, "fp16", 0.641, fwd + gemm.backward_gemms(fwd))
    assert est.compute_efficiency == pytest.approx(float(block), rel=1e-12)
    assert 0.641 * 0.859 / 0.869 <= est.compute_efficiency <= 0.641
    # the --efficiency override stays one constant
    over = estimate_step(loading.load_model("gpt3-175b"), loading.cluster_for_gpus("a100-80gb", 8),
                         Layout(tp=8, micro_batch=1, flash_attention=True),
                         SETUP.model_copy(update=dict(seq_len=2048, global_batch=1)), 0.5)
    assert over.compute_efficiency == 0.5
