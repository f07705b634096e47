"""Calibrated hardware profiles: GPU / node / cluster YAML in the shipped schema, merged into what
is already on disk under a file lock and replaced atomically.

(`planner/io/safe_write.py` does not exist on this branch; `locked_update` is the small helper
the brief allows here: fcntl.flock on `<file>.lock`, then write a temporary file in the same
folder, fsync, and os.replace it over the target, POSIX rename being atomic.)

Merging never loses an entry: GEMM points are keyed by (dtype, m, n, k), collectives by (op,
level, ranks), `peak_tflops` and `sources` by name; a re-measured key takes the new value, every
other key is kept. Old GEMM points of a dtype whose peak changed are rescaled to the new peak
(efficiency x old peak / new peak: the measured time is what is kept).
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from planner.calibrate.parts import HardwareParts
from planner.core.spec import GIB, GB, TB, ClusterSpec, GpuSpec, NodeSpec

US_PER_S = 1e6


@contextmanager
def file_lock(path: Path):
    """An exclusive flock on `<path>.lock`, held for the block (ranks and reruns wait in turn)."""
    lock = path.with_name(path.name + ".lock")
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, fsync, then os.replace it over `path`."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def locked_update(path: Path, update: Callable[[dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
    """Under the lock: read `path` (None if absent), `update` it, validate-free write; returns it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path):
        old = yaml.safe_load(path.read_text()) if path.exists() else None
        new = update(old)
        atomic_write_text(path, yaml.safe_dump(new, sort_keys=False, width=120))
        return new


def _merge_keyed(old: list[dict], new: list[dict], key: Callable[[dict], tuple]) -> list[dict]:
    merged = {key(item): item for item in old}
    merged.update({key(item): item for item in new})
    return sorted(merged.values(), key=lambda item: tuple(str(k) for k in key(item)))


def _gemm_key(p: dict) -> tuple:
    return (p["dtype"], p["m"], p["n"], p["k"])


def _rescaled(points: list[dict], old_peaks: dict, new_peaks: dict) -> list[dict]:
    out = []
    for p in points:
        old, new = old_peaks.get(p["dtype"]), new_peaks.get(p["dtype"])
        scale = old / new if old and new else 1.0
        out.append({**p, "efficiency": p["efficiency"] * scale})
    return out


def merge_gpu(old: dict | None, new: dict) -> dict:
    """New scalars win; peak_tflops, sources and GEMM points are merged by key."""
    if not old:
        return new
    old_points = _rescaled(old.get("gemm_efficiency", []), old.get("peak_tflops", {}), new["peak_tflops"])
    return {**old, **new,
            "peak_tflops": {**old.get("peak_tflops", {}), **new["peak_tflops"]},
            "gemm_efficiency": _merge_keyed(old_points, new.get("gemm_efficiency", []), _gemm_key),
            "sources": {**old.get("sources", {}), **new["sources"]}}


def _coll_key(c: dict) -> tuple:
    return (c["op"], c["level"], c["ranks"])


def merge_with_collectives(old: dict | None, new: dict) -> dict:
    """Node / cluster files: new scalars win, collectives and sources merged by key."""
    if not old:
        return new
    merged = {**old, **new,
              "collectives": _merge_keyed(old.get("collectives", []), new.get("collectives", []), _coll_key),
              "sources": {**old.get("sources", {}), **new["sources"]}}
    if "fsdp2_groups" in old or "fsdp2_groups" in new:
        merged["fsdp2_groups"] = _merge_keyed(old.get("fsdp2_groups", []), new.get("fsdp2_groups", []),
                                              lambda g: (g["schedule"], g["ranks"]))
    return merged


def slug(text: str) -> str:
    """A file-name-safe lower-case name."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "device"


def main_dtype(parts: HardwareParts) -> str:
    dtypes = sorted({p.dtype for p in parts.gemm})
    return "bf16" if "bf16" in dtypes and parts.device != "cpu" else dtypes[0]


def gpu_profile(parts: HardwareParts, name: str, memory_bytes: int) -> dict:
    """The GpuSpec mapping of the measured parts."""
    where = parts.where
    dtype = main_dtype(parts)
    largest = max((p for p in parts.gemm if p.dtype == dtype), key=lambda p: p.m * p.n * p.k)
    copy = parts.kernel("copy")
    return {
        "name": name,
        "memory_gib": round(memory_bytes / GIB, 3),
        "peak_tflops": {d: round(v / 1e12, 6) for d, v in parts.peak_flops_per_s.items()},
        "hbm_gb_per_s": round(copy.large_bytes_per_s / GB, 3),
        "achieved_efficiency": round(min(largest.efficiency, 1.0), 4),
        "gemm_efficiency": [{**p.model_dump(), "source": f"{where}: median time of (m x k) @ (k x n), "
                             f"2mnk / (time x peak_tflops[{p.dtype}])"} for p in parts.gemm],
        "sources": {
            "memory_gib": f"{where}: {'host physical memory (sysconf)' if parts.device == 'cpu' else 'torch.cuda.get_device_properties total_memory'}",
            "peak_tflops": f"{where}: {parts.peak_source}",
            "hbm_gb_per_s": f"{where}: copy_ of {copy.bytes_moved[-1] / 2 / 2**20:.0f} MiB fp32, bytes read + written / median time",
            "achieved_efficiency": f"{where}: {dtype} GEMM {largest.m}x{largest.k} @ {largest.k}x{largest.n}, the largest on the grid",
        },
    }


def node_profile(parts: HardwareParts, name: str, gpu_name: str) -> dict:
    """The NodeSpec mapping: intra-node all-reduce bus bandwidth and send/recv latency."""
    where = parts.where
    ranks = parts.world_size // parts.num_nodes
    intra = [c for c in parts.collectives if c.level == "intra"]
    copy_gb_per_s = round(parts.kernel("copy").large_bytes_per_s / GB, 3)
    node = {"name": name, "gpu": gpu_name, "gpus_per_node": ranks, "sources": {
        "gpus_per_node": f"{where}: ranks per node (LOCAL_WORLD_SIZE or --nproc)"}}
    if intra:
        ar = parts.collective("all_reduce", ranks)
        p2p = parts.collective("send_recv", ranks)
        node |= {"intra_node_gb_per_s": round(ar.bus_bytes_per_s / GB, 4),
                 "intra_node_latency_us": round(p2p.fit.latency_s * US_PER_S, 2)}
        node["sources"] |= {
            "intra_node_gb_per_s": f"{where}: all-reduce on {ranks} ranks, nccl-tests bus bandwidth of the fitted alpha-beta (busbw = algbw x 2(n-1)/n)",
            "intra_node_latency_us": f"{where}: send/recv between neighbouring ranks, fitted alpha"}
    else:
        node |= {"intra_node_gb_per_s": copy_gb_per_s, "intra_node_latency_us": 0.0}
        node["sources"] |= {
            "intra_node_gb_per_s": f"{where}: one rank, no link between ranks: the device copy bandwidth stands in (a one-rank plan never uses it)",
            "intra_node_latency_us": f"{where}: one rank, no link between ranks"}
    node |= _host_fields(parts, copy_gb_per_s)
    node["sources"] |= _host_sources(parts)
    node["collectives"] = [_collective_entry(c, where) for c in intra]
    node |= _overhead_fields(parts)
    node["sources"] |= _overhead_sources(parts)
    if parts.fsdp2_collectives:
        node["fsdp2_groups"] = [_fsdp2_entry(f, where) for f in parts.fsdp2_collectives]
    node["sources"] = node.pop("sources")  # last, as in the shipped profiles
    return node


def _overhead_fields(parts: HardwareParts) -> dict:
    """FSDP2's per-hook and the per-op Python + autograd overhead, microseconds, when measured."""
    fields = {}
    if parts.fsdp2_hook_s is not None:
        fields["fsdp2_hook_us"] = round(parts.fsdp2_hook_s * US_PER_S, 3)
    if parts.dispatch_per_op_s is not None:
        fields["dispatch_per_op_us"] = round(parts.dispatch_per_op_s * US_PER_S, 3)
    return fields


def _overhead_sources(parts: HardwareParts) -> dict:
    where = parts.where
    sources = {}
    if parts.fsdp2_hook_s is not None:
        sources["fsdp2_hook_us"] = (f"{where}: FSDP2 tiny model minus the same model unsharded, per hook "
                                    "(planner/calibrate/fsdp2_overhead.py)")
    if parts.dispatch_per_op_s is not None:
        sources["dispatch_per_op_us"] = (f"{where}: tiny GPT-2 forward + backward minus the parts' prediction of it, "
                                         "per recorded op (planner/calibrate/dispatch.py)")
    return sources


def _fsdp2_entry(f, where: str) -> dict:
    return {"schedule": "block" if f.resharded else "root", "ranks": f.ranks,
            "latency_us": round(f.fit.latency_s * US_PER_S, 2), "group_gb_per_s": round(f.fit.bytes_per_s / GB, 4),
            "source": f"{where}: FSDP2 Linear stack on {f.ranks} ranks minus unsharded, per group, "
                      f"{len(f.sizes_bytes)} group sizes {f.sizes_bytes[0]:.0f}-{f.sizes_bytes[-1]:.0f} B, alpha-beta fit "
                      "(planner/calibrate/fsdp2_collectives.py)"}


def _host_fields(parts: HardwareParts, copy_gb_per_s: float) -> dict:
    fields: dict[str, Any] = {
        "pcie_gb_per_s": round(parts.host_to_device_bytes_per_s / GB, 3) if parts.host_to_device_bytes_per_s else copy_gb_per_s,
        "cpu_memory_gib": round(parts.cpu_memory_bytes / GIB, 3)}
    if parts.file is not None:
        fields |= {"nvme_capacity_tb": round(parts.file.capacity_bytes / TB, 4),
                   "nvme_read_gb_per_s": round(parts.file.read_bytes_per_s / GB, 4),
                   "nvme_write_gb_per_s": round(parts.file.write_bytes_per_s / GB, 4)}
    if parts.device == "cpu":
        fields["cpu_adam_params_per_s"] = float(f"{1 / parts.optimizer.per_element_s:.4g}")
    return fields


def _host_sources(parts: HardwareParts) -> dict:
    where = parts.where
    sources = {
        "pcie_gb_per_s": f"{where}: pinned host-to-device copy_ of 256 MiB" if parts.host_to_device_bytes_per_s
        else f"{where}: no accelerator, host and device memory are one DRAM: the copy bandwidth",
        "cpu_memory_gib": f"{where}: host physical memory (sysconf SC_PHYS_PAGES x SC_PAGE_SIZE)"}
    if parts.file is not None:
        f = parts.file
        sources |= {"nvme_capacity_tb": f"{where}: size of the file system holding {f.path}",
                    "nvme_read_gb_per_s": f"{where}: sequential read of {f.file_bytes / 2**20:.0f} MiB in {f.path} after posix_fadvise DONTNEED",
                    "nvme_write_gb_per_s": f"{where}: sequential write of {f.file_bytes / 2**20:.0f} MiB in {f.path} + fsync"}
    if parts.device == "cpu":
        sources["cpu_adam_params_per_s"] = f"{where}: torch.optim.Adam step, 1 / fitted seconds per element"
    return sources


def _collective_entry(c, where: str) -> dict:
    return {"op": c.op, "level": c.level, "ranks": c.ranks,
            "latency_us": round(c.fit.latency_s * US_PER_S, 2),
            "bus_gb_per_s": round(c.bus_bytes_per_s / GB, 4),
            "source": f"{where}: {len(c.sizes_bytes)} sizes {c.sizes_bytes[0]:.0f}-{c.sizes_bytes[-1]:.0f} B, alpha-beta fit, nccl-tests busbw"}


def cluster_profile(parts: HardwareParts, name: str, node_name: str) -> dict | None:
    """The ClusterSpec mapping, when inter-node collectives were measured (>= 2 nodes)."""
    inter = [c for c in parts.collectives if c.level == "inter"]
    if not inter:
        return None
    where = parts.where
    ar = parts.collective("all_reduce", parts.num_nodes, "inter")
    p2p = parts.collective("send_recv", parts.num_nodes, "inter")
    return {"name": name, "node": node_name, "num_nodes": parts.num_nodes,
            "inter_node_gb_per_s": round(ar.bus_bytes_per_s / GB, 4),
            "inter_node_latency_us": round(p2p.fit.latency_s * US_PER_S, 2),
            "collectives": [_collective_entry(c, where) for c in inter],
            "sources": {
                "num_nodes": f"{where}: WORLD_SIZE / LOCAL_WORLD_SIZE under torchrun",
                "inter_node_gb_per_s": f"{where}: all-reduce over one rank per node, nccl-tests bus bandwidth of the fitted alpha-beta (one rank's share of the node's NICs)",
                "inter_node_latency_us": f"{where}: send/recv between neighbouring nodes, fitted alpha"}}


def write_profiles(parts: HardwareParts, out_dir: Path, name: str, memory_bytes: int) -> list[Path]:
    """Merge the measured parts into `out_dir/{gpus,nodes,clusters}/<name>*.yaml`; every merged
    mapping is validated against the shipped schema before it replaces the file."""
    gpu_name, node_name = name, f"{name}-node{parts.world_size // parts.num_nodes}"
    written = [_update(out_dir / "gpus" / f"{gpu_name}.yaml", GpuSpec, merge_gpu,
                       gpu_profile(parts, gpu_name, memory_bytes)),
               _update(out_dir / "nodes" / f"{node_name}.yaml", NodeSpec, merge_with_collectives,
                       node_profile(parts, node_name, gpu_name))]
    cluster = cluster_profile(parts, f"{node_name}x{parts.num_nodes}", node_name)
    if cluster is not None:
        written.append(_update(out_dir / "clusters" / f"{cluster['name']}.yaml", ClusterSpec,
                               merge_with_collectives, cluster))
    return written


def _update(path: Path, spec_cls, merge, new: dict) -> Path:
    def update(old):
        merged = merge(old, new)
        spec_cls.model_validate(merged)  # never write a file the loader would refuse
        return merged

    locked_update(path, update)
    return path
