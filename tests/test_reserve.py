"""The runtime reserve per GPU and the headroom margin, worked by hand.

Every expected figure is arithmetic on the cited sources: NCCL's buffer defaults
(NVIDIA/nccl src/init.cc, src/include/device.h, commit 5067397c), PyTorch's cuBLAS workspace
defaults (aten/src/ATen/cuda/CublasHandlePool.cpp, commit 26a39059), and the CUDA-reported
totals in the GPU profiles' sources.
"""

from __future__ import annotations

import pytest

from planner.core.errors import PlanInputError
from planner.core.spec import GIB, MIB, GpuSpec
from planner.io.loading import load_gpu
from planner.memory.reserve import (
    NCCL_CONNECTION_BYTES,
    headroom_warning,
    nccl_buffer_bytes,
    runtime_reserve_bytes,
    training_communicators,
)


def test_nccl_connection_is_ll_plus_ll128_plus_simple():
    ll = 8 * 512 * 8 * 16  # lines/thread x threads x steps x sizeof(ncclLLFifoLine)
    ll128 = 120 * 640 * 8 * 8  # elements/thread x threads x steps x sizeof(uint64_t)
    simple = 4 * 1024 * 1024  # NCCL_BUFFSIZE default, 4 MiB
    assert (ll, ll128, simple) == (524_288, 4_915_200, 4_194_304)
    assert NCCL_CONNECTION_BYTES == ll + ll128 + simple == 9_633_792


def test_nccl_buffers_scale_with_communicators_and_channels():
    # 3 communicators x 16 channels x 2 connections x 9,633,792 = 924,844,032 bytes (~882 MiB)
    assert nccl_buffer_bytes(3, 16) == 3 * 16 * 2 * 9_633_792 == 924_844_032
    assert nccl_buffer_bytes(0) == 0
    with pytest.raises(PlanInputError):
        nccl_buffer_bytes(-1)


@pytest.mark.parametrize("tp, pp, dp, expected", [
    (1, 1, 1, 0),  # one GPU: no communicator
    (8, 1, 1, 1),
    (8, 4, 16, 3),
    (1, 1, 64, 1),
])
def test_training_communicators(tp, pp, dp, expected):
    assert training_communicators(tp, pp, dp) == expected


def test_h100_reserve_parts():
    # h100-sxm profile: 80 GiB nominal, CUDA total 79.11 GiB, CUDA context 300 MiB,
    # cuBLAS workspace 32,768 KiB (sm90), with tp=8 and dp=2 -> 2 communicators.
    gpu = load_gpu("h100-sxm")
    parts = runtime_reserve_bytes(gpu, communicators=2)
    usable = 84_943_715_697  # round(79.11 x 2^30 = 84,943,715,696.64)
    assert gpu.usable_memory_bytes == usable
    assert parts == {
        "driver_unavailable": 80 * GIB - usable,  # 955,630,223 (0.89 GiB)
        "cuda_context": 300 * MIB,  # 314,572,800
        "nccl_buffers": 2 * 16 * 2 * 9_633_792,  # 616,562,688
        "cublas_workspace": 32 * MIB,  # 33,554,432
        "fragmentation": 4_247_185_785,  # ceil(0.05 x usable = 4,247,185,784.85)
    }
    assert parts["driver_unavailable"] == 955_630_223
    # 6,167,505,928 bytes = 5.74 GiB held back on each H100 of such a job
    assert sum(parts.values()) == 6_167_505_928


def test_a100_uses_the_default_cublas_workspace():
    gpu = load_gpu("a100-80gb")
    parts = runtime_reserve_bytes(gpu, fragmentation_fraction=0)
    assert parts["driver_unavailable"] == 80 * GIB - round(79.25 * GIB)  # 768 MiB
    assert parts["cublas_workspace"] == 4096 * 1024 * 2 + 16 * 1024 * 8 == 8_519_680
    assert parts["nccl_buffers"] == 0  # no communicator by default
    assert parts["fragmentation"] == 0


def test_override_keeps_the_driver_shortfall_only():
    gpu = load_gpu("rtx-4090")  # 24 GiB nominal, CUDA total 23.61 GiB
    parts = runtime_reserve_bytes(gpu, communicators=5, override_bytes=2 * GIB)
    short = 24 * GIB - 25_351_044_465  # round(23.61 x 2^30 = 25,351,044,464.64) -> 418,759,311
    assert parts == {"driver_unavailable": short, "user_reserve": 2 * GIB}
    assert short == 418_759_311
    with pytest.raises(PlanInputError) as err:
        runtime_reserve_bytes(gpu, override_bytes=-1)
    assert err.value.field == "--reserve"


def test_profile_without_reserve_fields_is_an_input_error():
    bare = GpuSpec(name="bare", memory_gib=16, peak_tflops={"fp16": 100.0}, hbm_gb_per_s=900,
                   sources={k: "test" for k in ("memory_gib", "peak_tflops", "hbm_gb_per_s",
                                                "achieved_efficiency")})
    with pytest.raises(PlanInputError) as err:
        runtime_reserve_bytes(bare)
    assert err.value.field == "gpu.usable_memory_gib"
    # an explicit reserve does not help: the usable capacity still needs the driver's figure
    with pytest.raises(PlanInputError):
        runtime_reserve_bytes(bare, override_bytes=GIB)


def test_reserve_field_needs_a_source():
    with pytest.raises(ValueError, match="usable_memory_gib"):
        GpuSpec(name="x", memory_gib=16, peak_tflops={"fp16": 1.0}, hbm_gb_per_s=1,
                usable_memory_gib=15.5,
                sources={k: "s" for k in ("memory_gib", "peak_tflops", "hbm_gb_per_s",
                                          "achieved_efficiency")})


def test_every_shipped_gpu_has_a_reserve():
    for name in ("a100-40gb", "a100-80gb", "h100-sxm", "h200", "rtx-4090", "v100-16gb",
                 "v100-32gb"):
        gpu = load_gpu(name)
        parts = runtime_reserve_bytes(gpu)
        assert gpu.usable_memory_bytes <= gpu.memory_bytes  # the driver never reports more
        assert 0 < parts["cuda_context"] < GIB


# --------------------------------------------------------------------------- headroom margin


def test_headroom_warning_below_five_percent():
    capacity = 80 * GIB  # margin 4 GiB
    assert headroom_warning(5 * GIB, capacity) is None
    assert headroom_warning(4 * GIB, capacity) is None  # at the margin: fine
    line = headroom_warning(GIB, capacity)
    assert line is not None
    assert "1.00 GiB" in line and "5%" in line and "4.00 GiB" in line
    assert headroom_warning(-1, capacity) is None  # does not fit: the verdict says so itself
    assert headroom_warning(0, capacity) is not None
