"""Micro-benchmarks of one rank's device: GEMMs by shape, memory-bound kernels, the optimizer,
host<->device copies and file I/O on a path the user names.

Collectives are in `planner.calibrate.collectives`. Every timing is the median of `reps` runs
after one warm-up run, with `torch.cuda.synchronize` around it on CUDA.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F

from planner.calibrate.fits import OptimizerFit, fit_optimizer
from planner.calibrate.parts import FileBandwidth, KernelCurve
from planner.core.errors import PlanInputError
from planner.core.spec import GemmPoint

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CPU_GEMM_GRID = (32, 128, 512, 2048)
CUDA_GEMM_GRID = (256, 1024, 4096, 16384)
CPU_KERNEL_BYTES = tuple(4096 * 4**i for i in range(9))  # 4 KiB .. 256 MiB of input
CUDA_KERNEL_BYTES = tuple(4096 * 4**i for i in range(11))  # 4 KiB .. 4 GiB
NORM_WIDTH = 1024
KERNEL_KINDS = ("copy", "elementwise", "transcendental", "random", "reduction", "norm", "softmax", "log_softmax",
                "log_softmax_backward")


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
_clock = ["wall"]


def use_clock(name: str) -> None:
    """`wall` (perf_counter, the default) or `thread` (this thread's CPU time: on a shared CPU
    machine with one thread per rank it leaves out the time other processes held the core)."""
    if name not in CLOCKS:
        raise PlanInputError("clock", f"{name}: one of {', '.join(CLOCKS)}")
    _clock[0] = name


def now() -> float:
    return CLOCKS[_clock[0]]()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median wall time of `fn` over `reps` runs after one warm-up run."""
    fn()
    times = []
    for _ in range(reps):
        sync(device)
        start = now()
        fn()
        sync(device)
        times.append(now() - start)
    return statistics.median(times)


def _reps_for(seconds_once: float, budget_s: float = 0.3) -> int:
    return int(min(50, max(3, budget_s / max(seconds_once, 1e-7))))


def gemm_seconds_by_shape(dtype: str, grid: Iterable[int], device: torch.device,
                          on_done: Callable[[], None] = lambda: None) -> dict[tuple[int, int, int], float]:
    """Median time of (m x k) @ (k x n) for every (m, n, k) on the grid."""
    grid = tuple(grid)
    out = {}
    for m in grid:
        for n in grid:
            for k in grid:
                a = torch.randn(m, k, device=device).to(TORCH_DTYPES[dtype])
                b = torch.randn(k, n, device=device).to(TORCH_DTYPES[dtype])
                once = median_seconds(lambda: a @ b, device, 1)
                out[(m, n, k)] = median_seconds(lambda: a @ b, device, _reps_for(once))
                on_done()
    return out


def gemm_points(dtype: str, seconds: dict[tuple[int, int, int], float], peak_flops_per_s: float,
                source: str) -> list[GemmPoint]:
    """Efficiency = 2·m·n·k / (t · peak) per measured shape."""
    return [GemmPoint(dtype=dtype, m=m, n=n, k=k, efficiency=2 * m * n * k / (t * peak_flops_per_s),
                      source=source) for (m, n, k), t in sorted(seconds.items())]


def _kernel(kind: str, numel: int, device: torch.device) -> tuple[Callable[[], object], int]:
    """The kernel of `kind` on `numel` fp32 elements, and the bytes it reads plus writes.
    On a GPU all of these are memory-bound; on a CPU `transcendental` (GELU: erf), `random`
    (dropout: a Bernoulli draw per element) and the loss's `log_softmax` and its backward (an exp
    per element; measured 2-3x the time of `softmax` on the same rows with one thread, torch 2.13
    CPU) are bound by arithmetic, hence their own curves."""
    x = torch.randn(numel, device=device)
    elem = x.element_size()
    if kind == "copy":
        y = torch.empty_like(x)
        return (lambda: y.copy_(x)), 2 * numel * elem
    if kind == "elementwise":
        z = torch.randn(numel, device=device)
        return (lambda: torch.add(x, z)), 3 * numel * elem
    if kind == "transcendental":
        return (lambda: F.gelu(x)), 2 * numel * elem
    if kind == "random":
        return (lambda: torch.native_dropout(x, 0.1, True)), 2 * numel * elem + numel
    rows = x.view(-1, min(NORM_WIDTH, numel))
    if kind == "reduction":
        return (lambda: rows.sum(-1)), (numel + rows.shape[0]) * elem
    if kind == "norm":
        w = torch.ones(rows.shape[-1], device=device)
        return (lambda: F.layer_norm(rows, (rows.shape[-1],), w, w)), 2 * numel * elem
    if kind == "softmax":
        return (lambda: torch.softmax(rows, -1)), 2 * numel * elem
    if kind == "log_softmax":  # the loss's: on a CPU exp and log per element, not memory-bound
        return (lambda: torch.log_softmax(rows, -1)), 2 * numel * elem
    if kind == "log_softmax_backward":  # grad - exp(output) * sum(grad): an exp per element again
        out = torch.log_softmax(rows, -1)
        return (lambda: torch.ops.aten._log_softmax_backward_data(rows, out, -1, rows.dtype)), 3 * numel * elem
    raise ValueError(f"unknown kernel kind {kind!r}")


def kernel_curve(kind: str, sizes_bytes: Iterable[int], device: torch.device,
                 on_done: Callable[[], None] = lambda: None) -> KernelCurve:
    """Time one memory-bound kernel over input sizes (fp32)."""
    moved, times = [], []
    for size in sizes_bytes:
        fn, num_bytes = _kernel(kind, size // 4, device)
        once = median_seconds(fn, device, 1)
        times.append(median_seconds(fn, device, _reps_for(once)))
        moved.append(float(num_bytes))
        on_done()
    return KernelCurve(kind=kind, bytes_moved=tuple(moved), times_s=tuple(times))


def view_op_seconds(device: torch.device, calls: int = 2000) -> float:
    """Mean time of one aliasing op (`t()`), which moves no data: the dispatch cost."""
    x = torch.randn(8, 8, device=device)
    start = now()
    for _ in range(calls):
        x.t()
    return (now() - start) / calls


OPTIMIZER_SHAPES = ((1, 4_000_000), (8, 250_000), (64, 16_000), (512, 1_000), (256, 16_000))
"""(tensors, elements each) of the synthetic parameter lists Adam is timed on."""


def optimizer_fit(device: torch.device, shapes=OPTIMIZER_SHAPES) -> OptimizerFit:
    """Time `torch.optim.Adam.step` (torch's default implementation for the device) on synthetic
    fp32 parameter lists; least squares of t = latency + a·tensors + b·elements (fits.fit_optimizer)."""
    times = []
    for count, numel in shapes:
        params = [torch.zeros(numel, device=device, requires_grad=True) for _ in range(count)]
        for p in params:
            p.grad = torch.randn(numel, device=device)
        opt = torch.optim.Adam(params, lr=1e-4)
        opt.step()  # creates the states
        times.append(median_seconds(opt.step, device, 5))
    return fit_optimizer(shapes, times)


def host_device_bytes_per_s(device: torch.device, num_bytes: int = 256 * 2**20) -> tuple[float, float] | None:
    """Pinned host -> device and device -> host copy bandwidth (None without a device)."""
    if device.type != "cuda":
        return None
    host = torch.empty(num_bytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    h2d = median_seconds(lambda: dev.copy_(host, non_blocking=True), device, 5)
    d2h = median_seconds(lambda: host.copy_(dev, non_blocking=True), device, 5)
    return num_bytes / h2d, num_bytes / d2h


def check_file_path(path: Path) -> Path:
    """The NVMe / file path must be an existing writable directory."""
    if not path.is_dir():
        raise PlanInputError("nvme-path", f"{path} is not an existing directory")
    if not os.access(path, os.W_OK | os.R_OK | os.X_OK):
        raise PlanInputError("nvme-path", f"{path} is not readable and writable by this user")
    return path


def file_bandwidth(path: Path, file_bytes: int, chunk_bytes: int = 8 * 2**20) -> FileBandwidth:
    """Write `file_bytes` sequentially and fsync; drop the file from the page cache
    (posix_fadvise DONTNEED); read it back. The file is removed afterwards."""
    check_file_path(path)
    chunk = os.urandom(min(chunk_bytes, file_bytes))
    chunks = math.ceil(file_bytes / len(chunk))
    fd, name = tempfile.mkstemp(prefix="zplan-io-", dir=path)
    try:
        start = time.perf_counter()
        for _ in range(chunks):
            os.write(fd, chunk)
        os.fsync(fd)
        write_s = time.perf_counter() - start
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.lseek(fd, 0, os.SEEK_SET)
        start = time.perf_counter()
        while os.read(fd, len(chunk)):
            pass
        read_s = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(name)
    total = chunks * len(chunk)
    return FileBandwidth(path=str(path), file_bytes=total, write_bytes_per_s=total / write_s,
                         read_bytes_per_s=total / read_s, capacity_bytes=shutil.disk_usage(path).total)


def cpu_memory_bytes() -> int:
    """Physical memory of this host (sysconf pages x page size)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
