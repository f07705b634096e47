"""Issue 13 hardware: B200, GB200 NVL72, H20, MI300X, L40S. Each expected number is the vendor
sheet's figure, with the dense value derived by hand where the sheet gives 'with sparsity'."""

from __future__ import annotations

import pytest

from planner.core.spec import GIB
from planner.io.loading import load_cluster, load_gpu, load_node

TFLOP = 1e12


@pytest.mark.parametrize("name, gpus, fp8_sparse_pf, bf16_sparse_pf, tf32_sparse_pf, fp32_tf", [
    # HGX B200 table (8 GPUs), 'with sparsity': FP8 72 PF, BF16 36 PF, TF32 18 PF; FP32 600 TF
    ("b200", 8, 72, 36, 18, 600),
    # GB200 NVL72 table (72 GPUs), 'with sparsity': FP8 720 PF, BF16 360 PF, TF32 180 PF; FP32 5,760 TF
    ("gb200", 72, 720, 360, 180, 5760),
])
def test_blackwell_dense_is_half_the_sparse_figure_per_gpu(name, gpus, fp8_sparse_pf, bf16_sparse_pf,
                                                           tf32_sparse_pf, fp32_tf):
    gpu = load_gpu(name)
    assert gpu.peak_flops_per_s("fp8") == fp8_sparse_pf * 1000 / gpus / 2 * TFLOP
    assert gpu.peak_flops_per_s("bf16") == bf16_sparse_pf * 1000 / gpus / 2 * TFLOP
    assert gpu.peak_flops_per_s("fp16") == bf16_sparse_pf * 1000 / gpus / 2 * TFLOP
    assert gpu.peak_flops_per_s("tf32") == tf32_sparse_pf * 1000 / gpus / 2 * TFLOP
    assert gpu.peak_flops_per_s("fp32") == fp32_tf / gpus * TFLOP
    assert gpu.hbm_bytes_per_s == 8e12  # 64 TB/s / 8 and 576 TB/s / 72


def test_blackwell_memory():
    assert load_gpu("b200").memory_bytes == 1440 // 8 * GIB  # DGX B200: 1,440 GB for 8 GPUs
    assert load_gpu("gb200").memory_bytes == 186 * GIB  # NVL72: 13.4 TB / 72 = 186 GB


def test_mi300x_per_datasheet_dense_column():
    # AMD MI300X datasheet: dense / sparse BF16 1,307.4 / 2,614.9, FP8 2,614.9 / 5,229.8
    gpu = load_gpu("mi300x")
    assert gpu.peak_flops_per_s("bf16") == 1307.4 * TFLOP
    assert gpu.peak_flops_per_s("fp8") == 2614.9 * TFLOP
    assert gpu.peak_flops_per_s("tf32") == 653.7 * TFLOP
    assert gpu.memory_bytes == 192 * GIB
    assert gpu.hbm_bytes_per_s == 5.3e12
    assert load_node("mi300x-x8").intra_node_gb_per_s == 7 * 128 / 2  # 7 links, 128 GB/s bidir


def test_l40s_per_datasheet_dense_column():
    # NVIDIA L40S datasheet: dense / sparse BF16 362.05 / 733, FP8 733 / 1,466, TF32 183 / 366
    gpu = load_gpu("l40s")
    assert gpu.peak_flops_per_s("bf16") == 362.05 * TFLOP
    assert gpu.peak_flops_per_s("fp8") == 733 * TFLOP
    assert gpu.peak_flops_per_s("tf32") == 183 * TFLOP
    assert gpu.memory_bytes == 48 * GIB
    assert gpu.hbm_bytes_per_s == 864e9


def test_h20_numbers_are_marked_as_assumptions():
    gpu = load_gpu("h20")
    assert gpu.peak_flops_per_s("bf16") == 148 * TFLOP
    assert gpu.peak_flops_per_s("fp8") == 296 * TFLOP
    assert all(text.startswith("assumption") for text in gpu.sources.values())


def test_gb200_nvl72_rack_is_one_nvlink_domain():
    # 72 GPUs share NVLink 5 at 1.8 TB/s per GPU (130 TB/s / 72), so a 72-way collective
    # stays on NVLink: zplan's node is the rack. Between racks: 72 x 400 Gb/s ConnectX-7.
    rack = load_node("gb200-nvl72")
    assert rack.gpus_per_node == 72
    assert rack.intra_node_gb_per_s == 1800 / 2
    cluster = load_cluster("gb200-nvl72x8")
    assert cluster.num_gpus == 576
    assert cluster.inter_node_gb_per_s == 72 * 400 / 8
    b200 = load_cluster("dgx-b200x32")
    assert (b200.num_gpus, b200.node.intra_node_gb_per_s) == (256, 900)
