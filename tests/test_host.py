"""Host memory per GPU: a share of a node gets its share of RAM and NVMe; --cpu-mem-gib; the two
ZeRO-Infinity accountings. Expected numbers are the node profiles' figures divided by hand."""

from __future__ import annotations

import pytest

from planner.core.errors import PlanInputError
from planner.core.spec import GIB, TB
from planner.io.loading import cluster_for_gpus, load_cluster, load_node
from planner.memory.host import (
    accounting_used,
    apply_host_accounting,
    node_share_bytes,
    partial_node,
    with_cpu_memory,
)
from planner.search.strategies import cluster_with_gpus


def test_node_share_bytes():
    assert node_share_bytes(512 * GIB, 8, 1) == 64 * GIB
    assert node_share_bytes(10, 3, 2) == 6  # floor(20 / 3)
    assert node_share_bytes(7, 4, 4) == 7
    with pytest.raises(PlanInputError):
        node_share_bytes(1, 8, 9)


def test_one_rtx4090_of_the_8gpu_box_gets_an_eighth():
    # rtx4090-x8: 512 GiB RAM and 8 TB NVMe for 8 GPUs -> 64 GiB and 1 TB for one GPU
    # (issue 11: it used to get all 512 GiB).
    cluster = cluster_for_gpus("rtx-4090", 1)
    assert cluster.node.gpus_per_node == 1
    assert cluster.node.cpu_memory_bytes == 64 * GIB
    assert cluster.node.nvme_bytes == 1 * TB
    assert "share 1/8" in cluster.node.sources["cpu_memory_gib"]


def test_one_dgx2_gpu_gets_a_sixteenth():
    # DGX-2: 16 V100, 1.5 TB RAM (node profile) -> one GPU: cpu_memory_gib / 16
    node = load_node("dgx-2")
    part = partial_node(node, 1)
    assert part.cpu_memory_bytes == node.cpu_memory_bytes // 16
    assert part.nvme_bytes == node.nvme_bytes // 16
    assert partial_node(node, 16) is node  # a whole node is unchanged


def test_cluster_with_gpus_shares_host_memory_too():
    # strategies.cluster_with_gpus: a dgx-h100 (2048 GiB, 8 GPUs) cut to 2 GPUs holds 512 GiB
    cluster = cluster_with_gpus(load_cluster("dgx-h100"), 2)
    assert cluster.node.cpu_memory_bytes == 512 * GIB
    # cutting the cut again keeps shares consistent: 2 -> 1 GPU is 256 GiB
    assert cluster_with_gpus(cluster, 1).node.cpu_memory_bytes == 256 * GIB
    # whole nodes keep the node's figure
    assert cluster_with_gpus(load_cluster("dgx-h100"), 16).node.cpu_memory_bytes == 2048 * GIB


def test_workstation_profile_and_cpu_mem_override():
    ws = load_cluster("workstation-rtx4090")
    assert ws.num_gpus == 1 and ws.gpu.name == "rtx-4090"
    assert ws.node.cpu_memory_bytes == 64 * GIB
    # the 8-GPU box stays the default node for --gpu rtx-4090 (sorted after it by name)
    assert cluster_for_gpus("rtx-4090", 8).node.name == "rtx4090-x8"
    mine = with_cpu_memory(ws, 32)
    assert mine.node.cpu_memory_bytes == 32 * GIB
    assert mine.node.sources["cpu_memory_gib"] == "user input --cpu-mem-gib"
    with pytest.raises(PlanInputError) as err:
        with_cpu_memory(ws, 0)
    assert err.value.field == "--cpu-mem-gib"


# --------------------------------------------------------------------------- accountings


CPU = {"grad_partition_buffer": 2_000, "optimizer_swap_buffers": 16}
NVME = {"optimizer_states": 12_000, "fp32_grad_partition": 4_000}


def test_deepspeed_accounting_keeps_the_16bit_grads_on_the_host():
    cpu, nvme = apply_host_accounting(CPU, NVME, "nvme", "deepspeed")
    assert cpu == CPU and nvme == NVME


def test_paper_accounting_moves_them_to_nvme():
    cpu, nvme = apply_host_accounting(CPU, NVME, "nvme", "zero-infinity-paper")
    assert cpu == {"optimizer_swap_buffers": 16}
    assert nvme == {**NVME, "grad_partition_buffer": 2_000}
    # CPU offload: the paper and the engine agree, nothing moves
    assert apply_host_accounting(CPU, {}, "cpu", "zero-infinity-paper") == (CPU, {})


def test_one_trillion_parameters_on_a_dgx2_only_in_the_paper():
    # ZeRO-Infinity's headline: 1T parameters on one DGX-2 (16 GPUs, 1.5 TB RAM). DeepSpeed keeps
    # 2 bytes per parameter of 16-bit gradients in CPU memory: 2e12 bytes = 1,862.6 GiB > 1,536 GiB.
    node = load_node("dgx-2")
    grads_bytes = 2 * 10**12
    assert grads_bytes > node.cpu_memory_bytes
    per_gpu = {"grad_partition_buffer": grads_bytes // 16}
    cpu_ds, _ = apply_host_accounting(per_gpu, {}, "nvme", "deepspeed")
    cpu_paper, _ = apply_host_accounting(per_gpu, {}, "nvme", "zero-infinity-paper")
    assert 16 * sum(cpu_ds.values()) > node.cpu_memory_bytes
    assert 16 * sum(cpu_paper.values()) == 0


def test_accounting_used_names_the_recipe():
    assert accounting_used("deepspeed", 2, "cpu") is None  # no ZeRO-3 host gradient buffer
    assert accounting_used("deepspeed", 3, "none") is None
    assert "stage3.py" in accounting_used("deepspeed", 3, "nvme")
    assert "paper" in accounting_used("zero-infinity-paper", 3, "nvme")
    assert "agrees" in accounting_used("zero-infinity-paper", 3, "cpu")
    with pytest.raises(PlanInputError) as err:
        accounting_used("paper", 3, "nvme")  # type: ignore[arg-type]
    assert err.value.field == "host_accounting"
