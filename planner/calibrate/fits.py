"""Pure fits and look-ups over measured parts (numpy only, no torch).

- `fit_alpha_beta`: least squares of t = α + bytes / bandwidth, the latency/bandwidth form of the
  step model (Hockney 1994, "The communication challenge for MPP", eq. 1; EQUATIONS.md §8);
- `bus_factor`: nccl-tests' bus-bandwidth factor (NVIDIA/nccl-tests doc/PERFORMANCE.md,
  "Bus bandwidth": all-reduce 2(n-1)/n; all-gather, reduce-scatter and all-to-all (n-1)/n;
  send/recv 1), applied to the algorithm bandwidth algbw = size / time;
- `interp_loglog`: time of a memory-bound kernel at any byte count from a measured curve
  (piecewise linear in log bytes / log seconds, the two end segments extended);
- `gemm_seconds`: time of one GEMM from a measured efficiency-by-shape table, interpolated
  trilinearly in (log m, log n, log k) and clamped to the grid's range.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from planner.core.spec import Frozen, GemmPoint


class AlphaBeta(Frozen):
    """t(bytes) = latency_s + bytes / bytes_per_s."""

    latency_s: float
    bytes_per_s: float

    def seconds(self, num_bytes: float) -> float:
        return self.latency_s + num_bytes / self.bytes_per_s


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> AlphaBeta:
    """Least squares of t = α + β·bytes weighted by 1/t (relative errors, so the KB sizes fix α
    and the MB-GB sizes fix β); α is clamped at 0. Needs two sizes or more."""
    x = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if x.size < 2 or len(set(x.tolist())) < 2:
        raise ValueError("fit_alpha_beta needs at least two different message sizes")
    if np.any(t <= 0):
        raise ValueError("fit_alpha_beta needs positive times")
    w = 1.0 / t
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if alpha < 0:  # no negative latency: refit the slope through the origin
        alpha, beta = 0.0, float(np.sum(w * w * x * t) / np.sum(w * w * x * x))
    if beta <= 0:
        raise ValueError("fit_alpha_beta: times do not grow with size")
    return AlphaBeta(latency_s=float(alpha), bytes_per_s=float(1.0 / beta))


BUS_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw factor for `op` on `ranks` ranks (doc/PERFORMANCE.md)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    if op == "send_recv":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; one of {', '.join(BUS_OPS)}")


def interp_loglog(sizes_bytes: Sequence[float], times_s: Sequence[float], num_bytes: float) -> float:
    """Time at `num_bytes` on the measured (bytes, seconds) curve, linear in log-log between
    points and along the end segments outside them."""
    lx = np.log(np.asarray(sizes_bytes, dtype=float))
    ly = np.log(np.asarray(times_s, dtype=float))
    order = np.argsort(lx)
    lx, ly = lx[order], ly[order]
    q = math.log(max(num_bytes, 1.0))
    i = int(np.clip(np.searchsorted(lx, q) - 1, 0, len(lx) - 2))
    slope = (ly[i + 1] - ly[i]) / (lx[i + 1] - lx[i])
    return float(math.exp(ly[i] + slope * (q - lx[i])))


def _bracket(axis: list[int], value: int) -> tuple[int, int, float]:
    """Indices of the grid values around `value` and the log-space weight of the upper one."""
    v = min(max(value, axis[0]), axis[-1])
    hi = next(i for i, a in enumerate(axis) if a >= v)
    lo = max(hi - 1, 0)
    if axis[hi] == axis[lo]:
        return lo, hi, 0.0
    return lo, hi, math.log(v / axis[lo]) / math.log(axis[hi] / axis[lo])


def gemm_efficiency(points: Sequence[GemmPoint], dtype: str, m: int, n: int, k: int) -> float:
    """Efficiency of (m x k) @ (k x n) in `dtype`, trilinear in log m, log n, log k over a full
    grid of measured points (outside the grid: the nearest face)."""
    table = {(p.m, p.n, p.k): p.efficiency for p in points if p.dtype == dtype}
    if not table:
        raise ValueError(f"no measured GEMM points for {dtype}")
    axes = [sorted({key[i] for key in table}) for i in range(3)]
    brackets = [_bracket(axes[i], v) for i, v in enumerate((m, n, k))]
    total = 0.0
    for corner in range(8):
        weight, key = 1.0, []
        for i, (lo, hi, w) in enumerate(brackets):
            upper = (corner >> i) & 1
            weight *= w if upper else 1.0 - w
            key.append(axes[i][hi if upper else lo])
        if weight:
            if tuple(key) not in table:
                raise ValueError(f"GEMM table for {dtype} is not a full grid: missing {tuple(key)}")
            total += weight * math.log(table[tuple(key)])
    return math.exp(total)


def gemm_seconds(points: Sequence[GemmPoint], dtype: str, m: int, n: int, k: int,
                 peak_flops_per_s: float) -> float:
    """2·m·n·k FLOPs at the interpolated efficiency of the shape."""
    return 2.0 * m * n * k / (gemm_efficiency(points, dtype, m, n, k) * peak_flops_per_s)
