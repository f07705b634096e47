"""The measurement procedure shared by the parts and the steps, so both are timed the same way.

Why consecutive runs differed (2026-11-23, 2-core VM; docs/calibrate.md "Run-to-run stability"):
- placement: unpinned, the kernel scheduler moves each rank and gloo's threads between the two
  cores at will, so one step has both ranks' compute on one core and the next has them apart; a
  part measured in one placement predicts a step that ran in another;
- few repetitions and one statistic for all: 4 timed steps (median) and 3 timings per large
  collective, where single steps of one configuration varied by 1.6x.
The procedure therefore (1) pins every rank, on a CPU, to its own cores before torch creates its
threads or gloo its pair threads (they inherit the mask: Linux sched_setaffinity(2)), with the
same `threads_per_rank` intra-op threads in the parts and the steps; (2) repeats more and takes
the median; (3) records the spread (interquartile range over the median), so a run whose
measurements moved more than the goal says so. GPUs (written, not run here): pinning is skipped
(NCCL ranks are bound to their device; torchrun / SLURM bind the cores), repetitions and the
statistic are the same.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from planner.core.spec import Frozen


class Summary(Frozen):
    """A robust summary of repeated timings of one thing."""

    median_s: float
    spread: float
    """(75th - 25th percentile) / median: 0.1 = the middle half of the runs lies within 10 %."""
    runs: int


def summarize(samples_s: Sequence[float]) -> Summary:
    """Median and relative interquartile range (quartiles by linear interpolation between the
    sorted samples, `statistics.quantiles(method="inclusive")`); one sample has spread 0."""
    if not samples_s:
        raise ValueError("no timings to summarize")
    med = statistics.median(samples_s)
    if len(samples_s) == 1 or med <= 0:
        return Summary(median_s=med, spread=0.0, runs=len(samples_s))
    q1, _q2, q3 = statistics.quantiles(samples_s, n=4, method="inclusive")
    return Summary(median_s=med, spread=(q3 - q1) / med, runs=len(samples_s))


def rank_cores(rank: int, threads: int, cores: Sequence[int]) -> tuple[int, ...]:
    """The `threads` cores of `rank`: ranks take consecutive blocks of the allowed cores, wrapping
    around when there are more ranks x threads than cores (then ranks share, as they would anyway)."""
    if threads < 1 or not cores:
        raise ValueError("need at least one thread and one core")
    ordered = sorted(cores)
    return tuple(sorted({ordered[(rank * threads + i) % len(ordered)] for i in range(threads)}))


def pin(rank: int, threads: int, device_type: str = "cpu") -> tuple[int, ...] | None:
    """Pin this process (the calling thread and every thread it starts later) to `rank`'s cores
    on a CPU; returns the previous mask to restore, None where nothing was pinned (CUDA, or no
    sched_setaffinity on this OS)."""
    if device_type != "cpu" or not hasattr(os, "sched_setaffinity"):
        return None
    before = tuple(sorted(os.sched_getaffinity(0)))
    os.sched_setaffinity(0, rank_cores(rank, threads, before))
    return before


@contextmanager
def pinned(rank: int, threads: int, device_type: str = "cpu") -> Iterator[None]:
    """`pin` for the block, the previous mask restored after it."""
    before = pin(rank, threads, device_type)
    try:
        yield
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)
