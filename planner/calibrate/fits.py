"""Pure fits and look-ups over measured parts (numpy only, no torch).

- `fit_alpha_beta`: least squares of t = α + bytes / bandwidth, the latency/bandwidth form of the
  step model (Hockney 1994, "The communication challenge for MPP", eq. 1; EQUATIONS.md §8);
- `interp_loglog`: time of a memory-bound kernel at any byte count from a measured curve
  (piecewise linear in log bytes / log seconds, the two end segments extended);

The bus-bandwidth factor and the α–β time are the step model's own
(`planner.timing.collectives.bus_factor` / `alpha_beta_s`), the GEMM efficiency by shape the
planner's (`planner.timing.gemm.efficiency_from_points`): each formula once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from planner.core.spec import Frozen
from planner.timing.collectives import Collective, alpha_beta_s


class OptimizerFit(Frozen):
    """An optimizer step's time: t = latency_s + per_tensor_s·tensors + per_element_s·elements."""

    latency_s: float
    per_tensor_s: float
    per_element_s: float

    def seconds(self, tensors: int, elements: int) -> float:
        return self.latency_s + self.per_tensor_s * tensors + self.per_element_s * elements


def fit_optimizer(shapes: Sequence[tuple[int, int]], times_s: Sequence[float]) -> OptimizerFit:
    """Least squares of t = latency + a·tensors + b·elements over parameter lists of
    (tensors, elements each); the intercept and the per-tensor slope clipped at 0."""
    rows = np.array([(1.0, count, count * numel) for count, numel in shapes])
    (lat, per_tensor, per_elem), *_ = np.linalg.lstsq(rows, np.array(times_s, dtype=float), rcond=None)
    return OptimizerFit(latency_s=max(float(lat), 0.0), per_tensor_s=max(float(per_tensor), 0.0),
                        per_element_s=float(per_elem))


class AlphaBeta(Frozen):
    """t(bytes) = latency_s + bytes / bytes_per_s."""

    latency_s: float
    bytes_per_s: float

    def seconds(self, num_bytes: float) -> float:
        return float(alpha_beta_s(num_bytes, self.bytes_per_s, 1, self.latency_s))


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


BUS_OPS = Collective.__args__
"""The collectives measured, as the step model names them (planner.timing.collectives)."""


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


def interp_linear(sizes_bytes: Sequence[float], times_s: Sequence[float], num_bytes: float) -> float:
    """Time at `num_bytes` on the measured (bytes, seconds) points, linear between points and
    along the last segment above them; below the first point, the first point's time (the
    latency floor: a smaller transfer is not timed faster than the smallest one measured)."""
    x = np.asarray(sizes_bytes, dtype=float)
    y = np.asarray(times_s, dtype=float)
    order = np.argsort(x)
    x, y = x[order], y[order]
    if num_bytes <= x[0]:
        return float(y[0])
    i = int(np.clip(np.searchsorted(x, num_bytes) - 1, 0, len(x) - 2))
    slope = (y[i + 1] - y[i]) / (x[i + 1] - x[i])
    return float(y[i] + slope * (num_bytes - x[i]))
