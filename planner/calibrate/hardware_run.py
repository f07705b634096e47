"""`zplan calibrate hardware`: measure every part on this machine (or this torchrun rank) and
return one `HardwareParts`.

The device parts (GEMMs, memory-bound kernels, the optimizer, host<->device, file I/O) run in
this process with `threads_per_rank` intra-op threads: on a CPU one rank is that many cores, the
CPU analogue of one GPU per rank. The collectives run on `nproc` spawned processes, or on the
ranks torchrun started (then every rank measures its device and rank 0 reports).
"""

from __future__ import annotations

import socket
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch
from pydantic import Field

from planner import __version__
from planner.calibrate import collectives as coll
from planner.calibrate import hardware as hw
from planner.calibrate import page_faults, reuse
from planner.calibrate.dispatch import measure as measure_dispatch
from planner.calibrate.fits import BUS_OPS
from planner.calibrate.fsdp2_overhead import hook_seconds as fsdp2_hook_seconds
from planner.calibrate.parts import HardwareParts
from planner.calibrate.procedure import pin, pinned
from planner.core.errors import PlanInputError
from planner.core.spec import Frozen

Tick = Callable[[str], None]


class HardwareConfig(Frozen):
    """What to measure and how long to wait."""

    device: str = "auto"
    dtypes: tuple[str, ...] = ("fp32",)
    gemm_grid: tuple[int, ...] | None = None
    kernel_max_bytes: int | None = None
    """Largest memory-bound kernel input (4 KiB upwards x4); default 256 MiB CPU, 4 GiB CUDA."""
    nproc: int = Field(default=2, ge=1)
    threads_per_rank: int | None = None
    max_message_bytes: int = 64 * 2**20
    timeout_s: float = Field(default=300, gt=0)
    file_path: Path | None = None
    file_bytes: int = 256 * 2**20
    peak_flops_per_s: dict[str, float] = {}
    peak_source: str = ""
    clock: str = "wall"
    """`wall` or `thread` (CPU time of the calling thread; see hardware.use_clock)."""
    stall_rank: int | None = None
    stall_s: float = 0.0


def pick(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PlanInputError("device", f"{device}: no CUDA device here; use cpu or auto")
    if device != "cpu" and not device.startswith("cuda"):
        raise PlanInputError("device", f"{device}: one of auto, cpu, cuda, cuda:N")
    return torch.device(device)


def threads_for(cfg: HardwareConfig, device: torch.device, ranks_per_node: int) -> int:
    """CPU: the cores split evenly over the ranks of a node (at least 1); CUDA: torch's default."""
    if cfg.threads_per_rank:
        return cfg.threads_per_rank
    if device.type == "cuda":
        return torch.get_num_threads()
    import os

    return max(1, (os.cpu_count() or 1) // ranks_per_node)


def gemm_table(cfg: HardwareConfig, device: torch.device, tick: Tick):
    """Median times on the grid per dtype, then efficiencies against the given or best peak."""
    grid = cfg.gemm_grid or (hw.CUDA_GEMM_GRID if device.type == "cuda" else hw.CPU_GEMM_GRID)
    points, peaks, how = [], {}, {}
    for dtype in cfg.dtypes:
        seconds = hw.gemm_seconds_by_shape(dtype, grid, device, lambda: tick("gemm"))
        best = max(2 * m * n * k / t for (m, n, k), t in seconds.items())
        peaks[dtype] = cfg.peak_flops_per_s.get(dtype, best)
        how[dtype] = cfg.peak_source if dtype in cfg.peak_flops_per_s else \
            "no vendor peak given: the best GEMM throughput measured on the grid"
        points += hw.gemm_points(dtype, seconds, peaks[dtype], "")
    return points, peaks, "; ".join(f"{d}: {h}" for d, h in how.items())


def grid_size(cfg: HardwareConfig, device: torch.device) -> int:
    grid = cfg.gemm_grid or (hw.CUDA_GEMM_GRID if device.type == "cuda" else hw.CPU_GEMM_GRID)
    return len(grid) ** 3 * len(cfg.dtypes)


def kernel_sizes(cfg: HardwareConfig, device: torch.device) -> tuple[int, ...]:
    sizes = hw.CUDA_KERNEL_BYTES if device.type == "cuda" else hw.CPU_KERNEL_BYTES
    if cfg.kernel_max_bytes is None:
        return sizes
    chosen = tuple(s for s in sizes if s <= cfg.kernel_max_bytes)
    if len(chosen) < 2:
        raise PlanInputError("kernel-max-bytes", f"must be at least {sizes[1]} (two sizes), got {cfg.kernel_max_bytes}")
    return chosen


def measure_device(cfg: HardwareConfig, device: torch.device, tick: Tick) -> dict:
    """Every part of one rank's device, as HardwareParts fields."""
    gemm, peaks, peak_source = gemm_table(cfg, device, tick)
    kernels = tuple(hw.kernel_curve(kind, kernel_sizes(cfg, device), device, lambda: tick("kernels"))
                    for kind in hw.KERNEL_KINDS)
    reuse_fields = measure_reuse(kernel_sizes(cfg, device), device, tick)
    optimizer = hw.optimizer_fit(device)
    tick("optimizer")
    copies = hw.host_device_bytes_per_s(device)
    file = hw.file_bandwidth(cfg.file_path, cfg.file_bytes) if cfg.file_path else None
    tick("io")
    hook_s = fsdp2_hook_seconds(device.type)
    tick("fsdp2 hooks")
    fields = {"fsdp2_hook_s": hook_s, "gemm": tuple(gemm), "peak_flops_per_s": peaks, "peak_source": peak_source,
              "kernels": kernels, "view_op_s": hw.view_op_seconds(device), "optimizer": optimizer,
              "host_to_device_bytes_per_s": copies[0] if copies else None,
              "device_to_host_bytes_per_s": copies[1] if copies else None, "file": file, **reuse_fields}
    if device.type == "cpu" and "fp32" in peaks:  # the tiny model runs on the CPU in fp32
        fields["dispatch_per_op_s"] = measure_dispatch(_partial_parts(fields))
    if device.type == "cpu":
        fields["fault_s_per_page"] = page_faults.fault_seconds_per_page()
    tick("dispatch")
    return fields


def measure_reuse(sizes: tuple[int, ...], device: torch.device, tick: Tick) -> dict:
    """The reuse part (planner.calibrate.reuse) of every kernel kind, as HardwareParts fields;
    none when the last-level cache size cannot be read (no sysfs: the predictor then uses the
    cache-resident curves alone)."""
    try:
        llc, source = reuse.last_level_cache_bytes(device.type)
    except (OSError, ValueError):
        for _ in hw.KERNEL_KINDS:
            tick("reuse")
        return {}
    curves = []
    for kind in hw.KERNEL_KINDS:
        curves.append(reuse.measure_reuse_curve(kind, sizes, llc, device))
        tick("reuse")
    return {"reuse": tuple(curves), "last_level_cache_bytes": llc, "last_level_cache_source": source}


def _partial_parts(fields: dict) -> HardwareParts:
    """The device parts measured so far as a HardwareParts (placeholder stamp), for the dispatch
    part's subtraction of what they predict."""
    return HardwareParts(host="", date="", zplan_version="", torch_version="", device="cpu", backend="gloo",
                         threads_per_rank=1, world_size=1, num_nodes=1, cpu_memory_bytes=0, **fields)


def total_ticks(cfg: HardwareConfig, device: torch.device) -> int:
    return grid_size(cfg, device) + len(hw.KERNEL_KINDS) * (len(kernel_sizes(cfg, device)) + 1) + 4


def stamp(device: torch.device, threads: int, world: int, nodes: int) -> dict:
    name = "cpu" if device.type == "cpu" else torch.cuda.get_device_name(device)
    return {"host": socket.gethostname(), "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "zplan_version": __version__, "torch_version": torch.__version__, "device": name,
            "backend": "nccl" if device.type == "cuda" else "gloo", "threads_per_rank": threads,
            "world_size": world, "num_nodes": nodes, "cpu_memory_bytes": hw.cpu_memory_bytes(),
            "clock": hw._clock[0]}


def collective_cfg(cfg: HardwareConfig, device: torch.device, threads: int) -> dict:
    return {"threads": threads, "device": device.type, "timeout_s": cfg.timeout_s,
            "sizes": list(coll.message_sizes(cfg.max_message_bytes, device.type)), "ops": list(BUS_OPS),
            "stall_rank": cfg.stall_rank, "stall_s": cfg.stall_s, "copy_max_bytes": cfg.kernel_max_bytes,
            "clock": cfg.clock}


def check_config(cfg: HardwareConfig) -> None:
    """Input errors before anything is measured."""
    hw.use_clock(cfg.clock)
    if cfg.file_path is not None:
        hw.check_file_path(cfg.file_path)
    for dtype in cfg.dtypes:
        if dtype not in hw.TORCH_DTYPES:
            raise PlanInputError("dtype", f"{dtype}: one of {', '.join(hw.TORCH_DTYPES)}")


def calibrate_local(cfg: HardwareConfig, tick: Tick) -> HardwareParts:
    """A single machine: device parts here, collectives on `nproc` spawned processes."""
    check_config(cfg)
    device = pick(cfg.device)
    coll.message_sizes(cfg.max_message_bytes, device.type)
    threads = threads_for(cfg, device, cfg.nproc)
    torch.set_num_threads(threads)
    with pinned(0, threads, device.type):  # rank 0's cores, as the steps' rank 0 (procedure.py)
        parts = measure_device(cfg, device, tick)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        fits, contention, fsdp2, optimizers = coll.spawn_collectives(cfg.nproc, collective_cfg(cfg, device, threads))
    return HardwareParts(**stamp(device, threads, cfg.nproc, 1), **parts, collectives=tuple(fits),
                         contention=tuple(contention), fsdp2_collectives=tuple(fsdp2),
                         engine_optimizers=tuple(optimizers))


def calibrate_torchrun(cfg: HardwareConfig, env: dict[str, int], tick: Tick) -> HardwareParts | None:
    """Under torchrun: every rank measures its device, then the collectives on every level;
    rank 0 returns the parts (the others None)."""
    check_config(cfg)
    world, local_world = env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]
    device = coll.rank_device(env["LOCAL_RANK"], cfg.device)
    threads = threads_for(cfg, device, local_world)
    pin(env["LOCAL_RANK"], threads, device.type)
    torch.set_num_threads(threads)
    parts = measure_device(cfg, device, tick if env["RANK"] == 0 else (lambda _what: None))
    coll.init("nccl" if device.type == "cuda" else "gloo", cfg.timeout_s, env["RANK"], world, None)
    finished = False
    try:
        c = collective_cfg(cfg, device, threads)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            progress = coll._stderr_progress(env["RANK"], len(c["ops"]) * len(c["sizes"]) * (1 + (world > local_world)))
            fits, contention = coll.measure_all_levels(tuple(c["sizes"]), tuple(c["ops"]), device, world, local_world,
                                                       cfg.timeout_s, progress, copy_max_bytes=cfg.kernel_max_bytes)
            fsdp2 = coll.fsdp2_on_node(device, world, local_world)
            optimizers = coll.engine_optimizers_on_node(device, world, local_world)
        finished = True
    except coll.CollectiveFailed as err:
        raise PlanInputError("timeout-s" if "time" in err.message.lower() else "collectives", str(err)) from None
    finally:
        coll.close(finished)
    if env["RANK"] != 0:
        return None
    return HardwareParts(**stamp(device, threads, world, world // local_world), **parts, collectives=tuple(fits),
                         contention=tuple(contention), fsdp2_collectives=tuple(fsdp2),
                         engine_optimizers=tuple(optimizers))
