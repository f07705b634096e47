"""The runtime reserve of one GPU: memory a job can never give to tensors it plans.

`zplan` used to pack model states and activations up to the card's nominal HBM. A process never
gets all of it: the driver reports less than the nominal size, the CUDA context takes its share
before the first tensor exists, NCCL allocates its communicator buffers, cuBLAS its workspace,
and PyTorch's caching allocator cannot hand out every free byte (fragmentation). Each part has
its source; see docs/reserve.md.

- `driver_unavailable`: nominal HBM (`memory_gib`) minus the total CUDA reports to a process
  (`usable_memory_gib` in the GPU profile, as PyTorch's OOM message prints it; H100 SXM 80 GB:
  79.11 GiB, 0.89 GiB short of 80 GiB; nvidia-smi's own total, 81,559 MiB, is higher).
- `cuda_context`: the CUDA context of one PyTorch process (`cuda_context_mib`, per generation).
- `nccl_buffers`: per communicator, per channel, per connection: NCCL's LL + LL128 + Simple
  protocol buffers (NVIDIA/nccl src/init.cc `computeBuffSizes`, src/include/device.h, commit
  5067397c): LL 8 lines x 512 threads x 8 steps x 16 bytes = 524,288; LL128 120 elements x 640
  threads x 8 steps x 8 bytes = 4,915,200; Simple `DEFAULT_BUFFSIZE` 1 << 22 = 4,194,304 (the
  `NCCL_BUFFSIZE` default, 4 MiB). Sum 9,633,792 bytes per connection.
- `cublas_workspace`: PyTorch's cuBLAS workspace per (handle, stream) (`cublas_workspace_kib`).
- `fragmentation`: an APPROXIMATION, a fraction of the usable memory the caching allocator loses
  to block rounding and splitting; see FRAGMENTATION_FRACTION.

`runtime_reserve_bytes` takes plain numbers besides the GPU profile, so the plan (and `--reserve
GIB`, given as `override_bytes`) can call it without a layout object.
"""

from __future__ import annotations

import math

import numpy as np

from planner.core.errors import PlanInputError
from planner.core.spec import GIB, KIB, MIB, GpuSpec

# NCCL protocol buffers of one connection (NVIDIA/nccl, commit 5067397c, src/init.cc lines
# 810-813 and src/include/device.h): NCCL_LL_LINES_PER_THREAD 8, NCCL_LL_MAX_NTHREADS 512,
# NCCL_STEPS 8, sizeof(union ncclLLFifoLine) 16; NCCL_LL128_ELEMS_PER_THREAD 120,
# NCCL_LL128_MAX_NTHREADS 640, sizeof(uint64_t) 8; DEFAULT_BUFFSIZE (1 << 22).
NCCL_LL_BUFFER_BYTES = 8 * 512 * 8 * 16
NCCL_LL128_BUFFER_BYTES = 120 * 640 * 8 * 8
NCCL_SIMPLE_BUFFER_BYTES = 1 << 22
NCCL_CONNECTION_BYTES = NCCL_LL_BUFFER_BYTES + NCCL_LL128_BUFFER_BYTES + NCCL_SIMPLE_BUFFER_BYTES

DEFAULT_NCCL_CHANNELS = 16
"""Channels of one communicator. NCCL picks the count from the topology at init; 16 is what an
8-GPU Hopper NVSwitch node logs ("16 coll channels, ... 16 p2p channels",
github.com/NVIDIA/nccl/issues/892, H800). PCIe boxes use fewer (2-8), so 16 is on the high side
for them. An input: pass what `NCCL_DEBUG=INFO` prints on your machine."""

NCCL_CONNECTIONS_PER_CHANNEL = 2
"""APPROXIMATION: buffers of two connections per channel and rank: the ring's receive from its
predecessor and one tree connection. Trees with two children, NVLS and p2p channels for
pipeline send/recv add more; setups with few algorithms enabled use less."""

FRAGMENTATION_FRACTION = 0.05
"""APPROXIMATION, not measured here: 5 % of the usable memory lost to the caching allocator
(blocks of >= 1 MiB are rounded up to 2 MiB and split; c10/cuda/CUDACachingAllocator.cpp
kRoundLarge). Seed 001 §1.1 (ZeRO, Rajbhandari et al. 2020 §3.2) names fragmented memory as the
third residual cost: requests fail although the total free memory suffices; the paper reports
OOM with over 30 % of memory still free on very large models. 5 % is a default for a steady
training loop (an assumption), to be replaced by a measured memory_reserved - memory_allocated."""

HEADROOM_MARGIN_FRACTION = 0.05
"""Headroom below 5 % of the capacity is inside the planner's own error: issue 11 sets the goal
"the step's peak within 5 %" (benchmarks/real_models.py). A verdict with less headroom says so."""


def _required(gpu: GpuSpec, field: str) -> float:
    value = getattr(gpu, field)
    if value is None:
        raise PlanInputError(
            f"gpu.{field}",
            f"gpu {gpu.name} has no {field} in its profile; add it with a source "
            "(docs/reserve.md) or give the reserve explicitly (--reserve GIB)")
    return value


def nccl_buffer_bytes(communicators: int, channels: int = DEFAULT_NCCL_CHANNELS,
                      connections_per_channel: int = NCCL_CONNECTIONS_PER_CHANNEL) -> int:
    """NCCL buffers one rank holds: communicators x channels x connections x 9,633,792 bytes."""
    for name, value in (("communicators", communicators), ("nccl_channels", channels),
                        ("connections_per_channel", connections_per_channel)):
        if value < 0:
            raise PlanInputError(name, f"must be >= 0, got {value}")
    return communicators * channels * connections_per_channel * NCCL_CONNECTION_BYTES


def training_communicators(tp: int, pp: int, dp: int, cp: int = 1) -> int:
    """NCCL communicators one rank initialises in a tp x cp x pp x dp job: one per parallel
    group of size > 1 (tensor-parallel all-reduce, pipeline send/recv, the gradient reduction
    over dp x cp ranks, and the context-parallel attention group). PyTorch's ProcessGroupNCCL
    creates a communicator on a group's first collective, so unused groups cost nothing.
    APPROXIMATION: Megatron's extra groups (embedding, model-parallel) not counted."""
    return sum(1 for degree in (tp, pp, dp * cp, cp) if degree > 1)


def runtime_reserve_bytes(gpu: GpuSpec, *, communicators: int = 0,
                          nccl_channels: int = DEFAULT_NCCL_CHANNELS, compute_streams: int = 1,
                          fragmentation_fraction: float = FRAGMENTATION_FRACTION,
                          override_bytes: int | None = None) -> dict[str, int]:
    """Named parts of the per-GPU reserve, bytes; their sum is subtracted from `memory_bytes`.

    `override_bytes` (the CLI's `--reserve GIB` x 2^30) replaces the context, NCCL, cuBLAS and
    fragmentation parts by one `user_reserve`; the driver's shortfall stays (it is not usable
    whatever the user says).
    """
    usable = gpu.usable_memory_bytes
    if usable is None:
        _required(gpu, "usable_memory_gib")
    driver = {"driver_unavailable": max(0, gpu.memory_bytes - usable)}  # type: ignore[operator]
    if override_bytes is not None:
        if override_bytes < 0:
            raise PlanInputError("--reserve", f"must be >= 0 GiB, got {override_bytes / GIB:g}")
        return {**driver, "user_reserve": override_bytes}
    if not 0 <= fragmentation_fraction < 1:
        raise PlanInputError("fragmentation_fraction", f"must be in [0, 1), got {fragmentation_fraction}")
    if compute_streams < 0:
        raise PlanInputError("compute_streams", f"must be >= 0, got {compute_streams}")
    return {
        **driver,
        "cuda_context": int(round(_required(gpu, "cuda_context_mib") * MIB)),
        "nccl_buffers": nccl_buffer_bytes(communicators, nccl_channels),
        "cublas_workspace": compute_streams * int(_required(gpu, "cublas_workspace_kib")) * KIB,
        "fragmentation": math.ceil(fragmentation_fraction * usable),  # type: ignore[operator]
    }


def headroom_warning(headroom_bytes: int, capacity_bytes: int,
                     margin_fraction: float = HEADROOM_MARGIN_FRACTION) -> str | None:
    """A phrase for the verdict line when 0 <= headroom < margin x capacity, else None.

    Negative headroom is "does not fit" and says so itself; a headroom at or above the margin
    needs no comment.
    """
    margin = margin_fraction * capacity_bytes
    if headroom_bytes < 0 or headroom_bytes >= margin:
        return None
    return (f"headroom {headroom_bytes / GIB:,.2f} GiB is below the {margin_fraction:.0%} margin "
            f"({margin / GIB:,.2f} GiB): within the planner's error, it may not fit")


def reserve_known(gpu: GpuSpec) -> bool:
    """The GPU profile carries every number the reserve's parts need."""
    return None not in (gpu.usable_memory_gib, gpu.cuda_context_mib, gpu.cublas_workspace_kib)


def layout_reserve_bytes(gpu: GpuSpec, communicators: int, override_gib: float | None = None) -> dict[str, int]:
    """The reserve the memory plan and the sweep subtract (one definition for both).

    `override_gib` (TrainSetup.reserve_gib, `--reserve`): that many GiB as `user_reserve`, plus
    the driver's shortfall when the profile knows it. Without an override and a profile lacking
    the reserve fields: no parts ({}): capacity stays the nominal HBM and the plan says so
    (`reserve_missing_note`), rather than inventing a number.
    """
    override = None if override_gib is None else int(round(override_gib * GIB))
    if gpu.usable_memory_gib is None:
        return {} if override is None else {"user_reserve": override}
    if override is None and not reserve_known(gpu):
        return {}
    return runtime_reserve_bytes(gpu, communicators=communicators, override_bytes=override)


def reserve_missing_note(gpu: GpuSpec) -> str:
    """What a plan without a reserve says (a GPU profile without the reserve fields)."""
    return (f"gpu {gpu.name} has no usable_memory_gib / cuda_context_mib / cublas_workspace_kib "
            "in its profile: no runtime reserve subtracted (capacity = nominal HBM); give one "
            "with --reserve GIB")


def reserve_column(gpu: GpuSpec, override_gib: float | None, tp, pp, dp, cp=1) -> np.ndarray:
    """`layout_reserve_bytes` of every layout of columns tp, pp, dp, cp (the sweep's and the
    strategy table's capacity, the same number plan_memory subtracts): the reserve for 0-4
    communicators, picked per row by `training_communicators`' count of groups above 1."""
    per_count = np.array([sum(layout_reserve_bytes(gpu, n, override_gib).values()) for n in range(5)],
                         dtype=np.int64)
    count = sum((np.asarray(d) > 1).astype(np.int64)
                for d in (tp, pp, np.asarray(dp) * cp, cp))
    return per_count[count]
