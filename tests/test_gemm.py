"""GEMM efficiency by shape and block GEMM shapes, worked by hand (planner.timing.gemm).

Table points are the shipped A100 80 GB ones (hardware_profiles/gpus/a100-80gb.yaml, from the
ml-engineering MAMF table): 0.869 at 1024x10240x5120 and 0.859 at 6912x2048x16384;
A100 dense 16-bit peak 312 TFLOP/s, HBM 2039 GB/s (datasheet, same file).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.core.spec import GemmPoint
from planner.io.loading import load_gpu
from planner.timing import gemm as G

A100 = load_gpu("a100-80gb")


def test_arithmetic_intensity_square():
    # 2·4096^3 FLOPs / (2 B x 3 x 4096^2) = 4096 / 3 = 1365.33 FLOP/B
    assert G.arithmetic_intensity(4096, 4096, 4096, 2) == pytest.approx(4096 / 3)


def test_point_intensities_by_hand():
    # 1024x10240x5120: 1024·10240·5120 / (1024·5120 + 5120·10240 + 1024·10240)
    #   = 53,687,091,200 / 68,157,440 = 787.69
    # 6912x2048x16384: 231,928,233,984 / 160,956,416 = 1440.94
    assert G.arithmetic_intensity(1024, 10240, 5120, 2) == pytest.approx(53_687_091_200 / 68_157_440)
    assert G.arithmetic_intensity(6912, 2048, 16384, 2) == pytest.approx(231_928_233_984 / 160_956_416)


def test_interpolation_between_the_two_a100_points():
    # query 4096^3 (ai 1365.33): fraction (log10 1365.33 - log10 787.69) / (log10 1440.94 -
    # log10 787.69) = 0.23888 / 0.26229 = 0.9108 -> 0.869 - 0.9108 x 0.010 = 0.85989
    a1, a2, q = 53_687_091_200 / 68_157_440, 231_928_233_984 / 160_956_416, 4096 / 3
    frac = (math.log10(q) - math.log10(a1)) / (math.log10(a2) - math.log10(a1))
    expected = 0.869 + frac * (0.859 - 0.869)
    assert expected == pytest.approx(0.85989, abs=1e-5)
    assert G.gemm_efficiency(A100, "bf16", 4096, 4096, 4096) == pytest.approx(expected, rel=1e-12)


def test_constant_beyond_the_points_and_fp16_falls_back_to_bf16():
    # 16384^3: ai 5461 > 1440.94 -> the last point's 0.859; roofline 5461 x 2039e9 / 312e12 > 1.
    assert G.gemm_efficiency(A100, "bf16", 16384, 16384, 16384) == pytest.approx(0.859)
    assert G.gemm_efficiency(A100, "fp16", 16384, 16384, 16384) == pytest.approx(0.859)


def test_roofline_caps_a_skinny_gemm():
    # 16 x 4096 x 4096: ai = 2·16·4096·4096 / (2·(16·4096 + 4096·4096 + 16·4096))
    #   = 536,870,912 / 33,816,576 = 15.876 FLOP/B; x 2039e9 / 312e12 = 0.10375 < table.
    ai = 536_870_912 / 33_816_576
    assert G.gemm_efficiency(A100, "bf16", 16, 4096, 4096) == pytest.approx(ai * 2039e9 / 312e12)
    assert ai * 2039e9 / 312e12 == pytest.approx(0.10375, abs=1e-5)


def test_no_points_falls_back_to_achieved_efficiency():
    # L40S has no public GEMM table shipped: its achieved_efficiency, still roofline-capped.
    gpu = load_gpu("l40s")
    assert gpu.gemm_efficiency == ()
    assert G.gemm_efficiency(gpu, "bf16", 8192, 8192, 8192) == pytest.approx(gpu.achieved_efficiency)


def test_wave_quantisation_by_hand():
    # A100 108 SMs, 256x128 tiles, 4096x4096 output: 16 x 32 = 512 tiles, ceil(512/108) = 5 waves,
    # 4096^2 / (5 x 108 x 256 x 128) = 16,777,216 / 17,694,720 = 0.94815.
    assert G.wave_quantisation(4096, 4096, 256, 128, 108) == pytest.approx(16_777_216 / 17_694_720)
    # exactly one full wave: 108 tiles of 256x128 in a 256 x 13824 output -> 1.0
    assert G.wave_quantisation(256, 13824, 256, 128, 108) == pytest.approx(1.0)


def test_gpt3_block_forward_shapes_and_flops_tp8():
    # h 12288, f 49152, 96 heads of 128, s 2048, b 1, tp 8:
    # qkv [2048, 3·12288/8 = 4608, 12288], attn out [2048, 12288, 1536],
    # up [2048, 6144, 12288], down [2048, 12288, 6144];
    # sum 2·2048·12288·(4608 + 1536 + 6144 + 6144) = 927,712,935,936 = 24·h²·s·b / t
    # (Korthikanti et al. 2022 §6.3's 24·b·s·h² per layer forward, split over tp).
    gemms = G.forward_gemms(12288, 49152, 96, 96, 128, 2048, 1, 8)
    shapes = {g.name: (float(g.m), float(g.n), float(g.k)) for g in gemms}
    assert shapes == {"qkv": (2048, 4608, 12288), "attn_out": (2048, 12288, 1536),
                      "mlp_up": (2048, 6144, 12288), "mlp_down": (2048, 12288, 6144)}
    total = sum(g.count * G.gemm_flops(g.m, g.n, g.k) for g in gemms)
    assert total == pytest.approx(927_712_935_936)
    assert total == pytest.approx(24 * 12288**2 * 2048 / 8)


def test_attention_core_without_flash_and_backward_doubles():
    # scores and context: b·a/t = 12 batched GEMMs each of 2·2048·2048·128 FLOPs:
    # 2 x 12 x 1,073,741,824 = 25,769,803,776 = 4·b·s²·h / t.
    gemms = G.forward_gemms(12288, 49152, 96, 96, 128, 2048, 1, 8, flash_attention=False)
    core = [g for g in gemms if g.name in ("scores", "context")]
    assert sum(g.count * G.gemm_flops(g.m, g.n, g.k) for g in core) == pytest.approx(
        4 * 2048**2 * 12288 / 8)
    fwd = sum(g.count * G.gemm_flops(g.m, g.n, g.k) for g in gemms)
    bwd = sum(g.count * G.gemm_flops(g.m, g.n, g.k) for g in G.backward_gemms(gemms))
    assert bwd == pytest.approx(2 * fwd)


def test_gqa_swiglu_and_logits_shapes():
    # Llama-3-8B-like: h 4096, 32 heads, 8 kv heads of 128, f 14336, tp 1, s 8192, b 1:
    # qkv n = (32 + 2 x 8) x 128 = 6144; SwiGLU up n = 2 x 14336 = 28672; logits [8192, 128256, 4096].
    gemms = {g.name: g for g in G.forward_gemms(4096, 14336, 32, 8, 128, 8192, 1, 1, swiglu=True)}
    assert float(gemms["qkv"].n) == 6144 and float(gemms["mlp_up"].n) == 28672
    lg = G.logits_gemm(4096, 128256, 8192, 1, 1)
    assert (float(lg.m), float(lg.n), lg.k) == (8192, 128256, 4096)


def test_gemm_time_by_hand():
    # GPT-3 qkv at tp 8: ai = 115,964,116,992 / 91,226,112 = 1271.17 -> efficiency
    # 0.869 - 0.010 x (log10 1271.17 - log10 787.69) / (log10 1440.94 - log10 787.69) = 0.86108;
    # time = 2 x 115,964,116,992 / (312e12 x 0.86108) = 0.8633 ms.
    a1, a2 = 53_687_091_200 / 68_157_440, 231_928_233_984 / 160_956_416
    ai = 115_964_116_992 / 91_226_112
    eff = 0.869 - 0.010 * (math.log10(ai) - math.log10(a1)) / (math.log10(a2) - math.log10(a1))
    qkv = G.forward_gemms(12288, 49152, 96, 96, 128, 2048, 1, 8)[0]
    assert G.gemm_time_s(qkv, A100, "bf16") == pytest.approx(2 * 115_964_116_992 / (312e12 * eff))
    assert eff == pytest.approx(0.86108, abs=1e-5)


def test_arrays_broadcast():
    m = np.array([16, 4096, 16384])
    eff = G.gemm_efficiency(A100, "bf16", m, 4096, 4096)
    assert eff.shape == (3,) and eff[0] < eff[1]


def test_gemm_point_is_frozen_and_strict():
    p = GemmPoint(dtype="bf16", m=1, n=1, k=1, efficiency=0.5, source="x")
    with pytest.raises(Exception):
        GemmPoint(dtype="bf16", m=1, n=1, k=1, efficiency=0.5, source="x", extra=1)
    with pytest.raises(Exception):
        p.m = 2
