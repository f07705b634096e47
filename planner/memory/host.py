"""Host memory per GPU: a node's CPU RAM and NVMe are shared by its GPUs.

A job on part of a node (`--gpu rtx-4090 --gpus 1` on an 8-GPU profile) gets its share of the
node's host memory and NVMe, not the whole node's; `--cpu-mem-gib` states the RAM a machine
really has. Model-state-independent formulas only; the offload parts themselves are in
`model_states` (docs/host.md).

Two accountings of ZeRO-Infinity's host memory (docs/host.md):
- `deepspeed` (the engine, default): under ZeRO-3 with the optimizer offloaded to `cpu` or
  `nvme`, DeepSpeed keeps a 16-bit gradient partition of the whole model in (pinned) CPU memory:
  deepspeed/runtime/zero/stage3.py (deepspeedai/DeepSpeed, commit edaa7221, lines 737-746)
  allocates `grad_partitions_flat_buffer` of sum(partition_numel) elements in
  `gradient_accumulation_dtype` on `self.device`, which is `cpu` whenever the optimizer is
  offloaded (line 328), pinned when `offload_optimizer.pin_memory`; NVMe offload
  (`swap_optimizer`) does not change that. Across the dp ranks of a node this is 2 bytes per
  parameter of the node's share of the model.
- `zero-infinity-paper` (Rajbhandari et al. 2021, seed 000): with NVMe offload every model state
  lives on NVMe and the CPU holds only working buffers, which is how the paper's headline (1T
  parameters on one DGX-2, 32T on 512 GPUs) is reached; current DeepSpeed cannot reproduce it
  (2 TB of 16-bit gradients for 1T parameters exceed a DGX-2's 1.5 TB of RAM).
"""

from __future__ import annotations

from typing import Literal

from planner.core.errors import PlanInputError
from planner.core.spec import GIB, TB, Cluster, NodeSpec

HostAccounting = Literal["deepspeed", "zero-infinity-paper"]

HOST_ACCOUNTINGS: dict[str, str] = {
    "deepspeed": (
        "DeepSpeed's accounting: ZeRO-3 with the optimizer offloaded keeps a 16-bit gradient "
        "partition buffer in pinned CPU memory even under NVMe offload (deepspeed/runtime/zero/"
        "stage3.py, deepspeedai/DeepSpeed@edaa7221, grad_partitions_flat_buffer)"),
    "zero-infinity-paper": (
        "the ZeRO-Infinity paper's accounting (Rajbhandari et al. 2021, seed 000): under NVMe "
        "offload all model states, gradients included, live on NVMe; current DeepSpeed does not "
        "do this"),
}
"""The named host-memory accountings and what each assumes."""

PAPER_MOVES_TO_NVME = ("grad_partition_buffer",)
"""Host parts the paper's accounting puts on NVMe when the optimizer is offloaded to NVMe
(model_states names the DeepSpeed buffer `grad_partition_buffer`)."""


def node_share_bytes(node_bytes: int, node_gpus: int, used_gpus: int) -> int:
    """Bytes of a node's host resource a job on `used_gpus` of its `node_gpus` GPUs gets:
    floor(node_bytes x used / node_gpus); the whole node when it uses every GPU."""
    if not 0 < used_gpus <= node_gpus:
        raise PlanInputError("gpus", f"must be between 1 and {node_gpus} GPUs of one node, got {used_gpus}")
    return node_bytes * used_gpus // node_gpus


def partial_node(node: NodeSpec, num_gpus: int) -> NodeSpec:
    """The node as a job on `num_gpus` of its GPUs sees it: that many GPUs and their share of the
    CPU RAM and NVMe capacity (`node_share_bytes`, in the profile's units). Links per GPU are
    unchanged; NVMe bandwidth and CPU-Adam throughput are left whole (not shared here)."""
    if num_gpus == node.gpus_per_node:
        return node
    cpu_bytes = node_share_bytes(node.cpu_memory_bytes, node.gpus_per_node, num_gpus)
    nvme_bytes = node_share_bytes(node.nvme_bytes, node.gpus_per_node, num_gpus)
    note = f"share {num_gpus}/{node.gpus_per_node} of node {node.name}"
    sources = dict(node.sources)
    for key in ("cpu_memory_gib", "nvme_capacity_tb"):
        if key in sources:
            sources[key] = f"{sources[key]}; {note}"
    return node.model_copy(update={
        "gpus_per_node": num_gpus,
        "cpu_memory_gib": cpu_bytes / GIB,
        "nvme_capacity_tb": nvme_bytes / TB,
        "sources": sources,
    })


def with_cpu_memory(cluster: Cluster, cpu_mem_gib: float) -> Cluster:
    """The cluster with `cpu_mem_gib` GiB of host RAM per node (`--cpu-mem-gib`): the RAM this
    job may use on each of its nodes (on a slice of a node: the slice's), replacing the profile's
    or its share's figure. Apply it after the cluster is built (after `partial_node`)."""
    if not cpu_mem_gib > 0:
        raise PlanInputError("--cpu-mem-gib", f"must be a positive number of GiB, got {cpu_mem_gib}")
    sources = {**cluster.node.sources, "cpu_memory_gib": "user input --cpu-mem-gib"}
    node = cluster.node.model_copy(update={"cpu_memory_gib": cpu_mem_gib, "sources": sources})
    return cluster.model_copy(update={"node": node})


def apply_host_accounting(cpu_parts: dict[str, int], nvme_parts: dict[str, int],
                          offload_optimizer: str, accounting: HostAccounting = "deepspeed",
                          ) -> tuple[dict[str, int], dict[str, int]]:
    """(cpu, nvme) parts of one GPU under the named accounting. `deepspeed` returns them as the
    engine allocates them; `zero-infinity-paper` moves the 16-bit gradient partition buffer to
    NVMe when the optimizer is offloaded to NVMe."""
    check_accounting(accounting)
    if accounting == "deepspeed" or offload_optimizer != "nvme":
        return dict(cpu_parts), dict(nvme_parts)
    cpu, nvme = dict(cpu_parts), dict(nvme_parts)
    for name in PAPER_MOVES_TO_NVME:
        if name in cpu:
            nvme[name] = nvme.get(name, 0) + cpu.pop(name)
    return cpu, nvme


def accounting_used(accounting: HostAccounting, zero_stage: int, offload_optimizer: str) -> str | None:
    """The sentence a verdict prints about which host accounting it used, or None when the two
    agree (no ZeRO-3 optimizer offload, so no gradient partition buffer on the host)."""
    check_accounting(accounting)
    if zero_stage != 3 or offload_optimizer == "none":
        return None
    if offload_optimizer == "cpu" and accounting == "zero-infinity-paper":
        return f"host memory: {HOST_ACCOUNTINGS['deepspeed']} (the paper agrees for CPU offload)"
    return f"host memory: {HOST_ACCOUNTINGS[accounting]}"


def check_accounting(accounting: str) -> None:
    """One-line error for an unknown accounting name."""
    if accounting not in HOST_ACCOUNTINGS:
        raise PlanInputError("host_accounting",
                             f"unknown {accounting!r}; allowed: {', '.join(HOST_ACCOUNTINGS)}")
