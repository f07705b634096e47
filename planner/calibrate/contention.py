"""Contention: how much slower one rank's compute runs when the other ranks of its node compute at
the same time, and while a collective is in flight.

The device parts (planner.calibrate.hardware) are timed in one process with the rest of the
machine idle. A data-parallel step runs N ranks at once: on a CPU they share the last-level
cache, the DRAM bandwidth and (with gloo) the cores that gloo's threads need to reduce and copy;
on GPUs NCCL's kernels take SMs and memory bandwidth from the compute kernels they overlap
(the reason NCCL_MAX_CTAS / NCCL_MIN_CTAS exist: NCCL docs, "Environment Variables").
Neither shows in a one-process part, so it is measured as a part of its own, per process count:

- `alone`: each rank in turn times the probe while every other rank waits in a barrier;
- `together`: every rank times the probe at the same time;
- `with_collective`: every rank times the probe while a queue of asynchronous all-reduces of
  `COLLECTIVE_BYTES` runs on the backend's own thread (gloo) or stream (NCCL), long enough to
  cover the probe (checked: a run the collectives did not cover is timed again with more).

The three phases are interleaved over `ROUNDS` rounds, so load from other processes that drifts
during the measurement lands on all three alike; the whole measurement is repeated `REPEATS`
times and the repeat with the median slowdown kept (`median_point`). Probes: a GEMM (`gemm`),
copies over sizes from L2-resident to well beyond the last-level cache (`memory`: what ranks
share depends on whether the data stays in a core's own cache, the shared cache or DRAM), the
aliasing op `t()` (`dispatch`: framework overhead on the host thread), and a fixed model's
forward + backward (`block`: GPT-2's architecture at `BLOCK_SHAPE`, sequence `BLOCK_SEQ_LEN`,
micro-batch `BLOCK_MICRO_BATCH`, a probe workload, never the configuration predicted).
Slowdown = mean(together) / mean(alone) per rank, averaged over the ranks
(`ContentionPoint.slowdown`).

Why `block` (2026-11-28, this 2-core host, SEEN rows only; docs/calibrate.md "The twelfth
held-out set"): the 16 MiB copy probe flips between x1.0 and x1.6-1.9 over seconds to minutes,
while a two-rank model's own forward + backward runs x0.95-1.07 of one rank alone in either
state, and so does the fixed block (x1.01-1.07). Both ranks copying at full rate all the time
overstates what a step's op mix meets from the other rank; the predictor times forward and
backward at the `block` slowdown when the parts hold it (planner.calibrate.predict), and keeps
the copy probe for the phases where the ranks do stream memory in lockstep (the engines' copies,
the optimizer step).
On CUDA the probe is timed with events on the compute stream (never `torch.cuda.synchronize`,
which would also wait for the NCCL stream).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from planner.calibrate.hardware import now
from planner.calibrate.heldout import LARGE
from planner.calibrate.parts import ContentionPoint

GEMM_SIDE = {"cpu": 512, "cuda": 8192}
COPY_BYTES = {"cpu": tuple(256 * 2**10 * 4**i for i in range(5)),  # 256 KiB .. 64 MiB: L2, L3, DRAM
              "cuda": (64 * 2**20, 512 * 2**20, 2 * 2**30)}
COLLECTIVE_BYTES = {"cpu": 16 * 2**20, "cuda": 512 * 2**20}
PHASE_BUDGET_S = 0.45
"""Seconds of probe per phase, split over the rounds."""
ROUNDS = 3
REPEATS = 3
"""Whole measurements (`probe_rounds`) per probe; the point kept is the one with the median
slowdown. Repeated in one pair of rank processes (2026-11-28, this host, SEEN evidence: the
ninth and tenth sets' large-micro-batch ZeRO-1 rows followed this probe), the 16 and 64 MiB
copies read x1.6-1.9 in 12 of 16 measurements and x0.96-1.02 in the others, a whole
measurement at a time; one measurement per calibration made such rows swing by 15 %."""
MAX_REPS = 5000
DISPATCH_CALLS = 500
BLOCK_SHAPE = LARGE
"""The `block` probe's model: GPT-2's architecture at SEEN-1's "large" shape (4 x 512), 15.1 M
parameters."""
BLOCK_SEQ_LEN = 128
BLOCK_MICRO_BATCH = 2


def probes(device: torch.device, copy_max_bytes: int | None = None) -> list[tuple[str, int]]:
    """(kind, buffer bytes) of every probe: one GEMM, copies over sizes up to `copy_max_bytes`
    (the smallest one at least), the dispatch loop, the fixed model's forward + backward."""
    sizes = COPY_BYTES[device.type]
    chosen = [b for b in sizes if copy_max_bytes is None or b <= copy_max_bytes] or [sizes[0]]
    return [("gemm", 0), *(("memory", b) for b in chosen), ("dispatch", 0), ("block", 0)]


def probe(kind: str, device: torch.device, buffer_bytes: int = 0) -> tuple[Callable[[], object], str]:
    """The probe of `kind` and a description of it (`buffer_bytes`: the copy's source size)."""
    if kind == "gemm":
        side = GEMM_SIDE[device.type]
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
        a = torch.randn(side, side, device=device, dtype=dtype)
        b = torch.randn(side, side, device=device, dtype=dtype)
        return (lambda: a @ b), f"{str(dtype).removeprefix('torch.')} GEMM {side}x{side} @ {side}x{side}"
    if kind == "memory":
        x, y = torch.ones(buffer_bytes // 4, device=device), torch.empty(buffer_bytes // 4, device=device)
        return (lambda: y.copy_(x)), f"copy_ of {buffer_bytes / 2**20:g} MiB fp32"
    if kind == "dispatch":
        x = torch.ones(8, 8, device=device)

        def views():
            for _ in range(DISPATCH_CALLS):
                x.t()
        return views, f"{DISPATCH_CALLS} calls of t() on an 8x8 tensor"
    if kind == "block":
        return block_probe(device)
    raise ValueError(f"unknown contention probe {kind!r}")


def block_probe(device: torch.device) -> tuple[Callable[[], object], str]:
    """Forward + backward of the fixed probe model (`BLOCK_SHAPE`), fp32 on a CPU, bf16 on CUDA."""
    from planner.calibrate.config import scaled_model
    from planner.calibrate.models import build_model
    from planner.calibrate.run import token_batch
    from planner.io.loading import load_model

    spec = scaled_model(load_model("gpt2"), **BLOCK_SHAPE, kv_heads=None)
    net = build_model(spec, BLOCK_SEQ_LEN).to(device)
    if device.type == "cuda":
        net = net.to(torch.bfloat16)
    tokens, labels = token_batch(spec, BLOCK_SEQ_LEN, BLOCK_MICRO_BATCH, device, seed=0)
    return (forward_backward(net, tokens, labels),
            f"forward + backward of GPT-2 {BLOCK_SHAPE['layers']} x {BLOCK_SHAPE['hidden']}, "
            f"sequence {BLOCK_SEQ_LEN}, micro-batch {BLOCK_MICRO_BATCH}")


def forward_backward(net: torch.nn.Module, tokens, labels) -> Callable[[], None]:
    """One forward + backward of `net`; the gradients are dropped after each run, so every run
    allocates them as a step does."""
    def run() -> None:
        net(tokens, labels).backward()
        for p in net.parameters():
            p.grad = None
    return run


def timed(fn: Callable[[], object], device: torch.device, reps: int) -> list[float]:
    """Seconds of each of `reps` runs: on a CPU the parts' clock (`hardware.use_clock`: wall, or the
    thread's CPU time, which leaves out time-slicing and keeps cache / DRAM sharing), events on the
    current stream on CUDA."""
    out = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = now()
            fn()
            out.append(now() - t0)
    return out


def agreed_max(value: float, group) -> float:
    """The largest `value` over the group's ranks (every rank must run the same count)."""
    t = torch.tensor([float(value)], dtype=torch.float64)
    if dist.get_backend(group) == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def alone_times(fn, device, reps: int, group) -> list[float]:
    """Each rank in turn, the others waiting in a barrier; this rank's times."""
    mine: list[float] = []
    for turn in range(dist.get_world_size(group)):
        dist.barrier(group=group)
        if dist.get_rank(group) == turn:
            mine = timed(fn, device, reps)
        dist.barrier(group=group)
    return mine


def together_times(fn, device, reps: int, group) -> list[float]:
    dist.barrier(group=group)
    return timed(fn, device, reps)


def with_collective_times(fn, device, reps: int, probe_s: float, group) -> list[float]:
    """The probe while queued all-reduces run; more are queued until they outlast the probe."""
    buf = torch.ones(COLLECTIVE_BYTES[device.type] // 4, device=device)
    dist.barrier(group=group)
    start = time.perf_counter()
    dist.all_reduce(buf, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    one_s = agreed_max(time.perf_counter() - start, group)
    count = int(agreed_max(math.ceil(2 * probe_s * reps / one_s) + 1, group))
    for _ in range(4):
        dist.barrier(group=group)
        works = [dist.all_reduce(buf, group=group, async_op=True) for _ in range(count)]
        times = timed(fn, device, reps)
        covered = not works[-1].is_completed()
        for w in works:
            w.wait()
        if agreed_max(0.0 if covered else 1.0, group) == 0.0:
            break
        count *= 2
    return times  # never covered after 4 doublings: the last timing, as close as we got


def probe_rounds(fn, device, reps: int, group, with_collective: bool = True) -> tuple[float, float, float | None]:
    """(alone, together, with a collective) mean seconds per run of this rank over `ROUNDS`
    interleaved rounds: load from outside that drifts during the measurement lands on all three
    alike. The mean, not the median: a probe shorter than a scheduler time slice is preempted in
    few of its runs, and a median would drop exactly the runs that show the sharing of a core (a
    step's time is the sum of its ops, so the mean is the figure it sees)."""
    alone: list[float] = []
    together: list[float] = []
    loaded: list[float] = []
    for _ in range(ROUNDS):
        alone += alone_times(fn, device, reps, group)
        together += together_times(fn, device, reps, group)
        if with_collective:
            loaded += with_collective_times(fn, device, reps, statistics.fmean(together), group)
    return (statistics.fmean(alone), statistics.fmean(together),
            statistics.fmean(loaded) if with_collective else None)


def median_point(points: list[ContentionPoint]) -> ContentionPoint:
    """Of repeated measurements of one probe, the one with the median slowdown (the lower
    middle of an even count)."""
    return sorted(points, key=lambda p: p.slowdown)[(len(points) - 1) // 2]


def measure_contention(device: torch.device, group, copy_max_bytes: int | None = None,
                       phase_budget_s: float = PHASE_BUDGET_S,
                       progress: Callable[[int, int, str], None] | None = None) -> list[ContentionPoint]:
    """Every probe alone, together and with a collective on `group`; the group's rank 0 returns the
    points (the others an empty list). `progress(done, total, probe)` after each probe."""
    ranks = dist.get_world_size(group)
    nccl = dist.get_backend(group) == "nccl"
    points = []
    todo = probes(device, copy_max_bytes)
    for done, (kind, buffer_bytes) in enumerate(todo, 1):
        fn, what = probe(kind, device, buffer_bytes)
        fn()
        once = statistics.median(timed(fn, device, 3))
        reps = int(agreed_max(min(MAX_REPS, max(5, phase_budget_s / ROUNDS / max(once, 1e-7))), group))
        # the block probe with a collective only where the predictor reads it (NCCL's overlapped
        # share; on gloo nothing is counted as overlapped): on gloo the queue of all-reduces it
        # needs to be covered took ~70 s on the 2-core host
        loaded = kind != "block" or nccl
        repeats = []
        for _ in range(REPEATS):
            rows: list = [None] * ranks
            dist.all_gather_object(rows, probe_rounds(fn, device, reps, group, loaded), group=group)
            repeats.append(rows)
        if dist.get_rank(group) == 0:
            def kept(column: int, **extra) -> ContentionPoint:  # the median repeat's point
                return median_point([ContentionPoint(kind=kind, ranks=ranks, probe=what,
                                                     bytes_moved=2 * buffer_bytes,
                                                     alone_s=tuple(r[0] for r in rows),
                                                     together_s=tuple(r[column] for r in rows), **extra)
                                     for rows in repeats])
            points.append(kept(1, with_collective=False))
            if loaded:
                points.append(kept(2, with_collective=True, collective=f"all_reduce of "
                                   f"{COLLECTIVE_BYTES[device.type] // 2**20} MiB, queued async"))
        if progress:
            progress(done, len(todo), what)
    return points
