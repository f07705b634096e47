"""Memory-bound ops in the step's cache state: a part, measured against reuse distance.

The kernel curves (planner.calibrate.hardware.kernel_curve) time an op over and over on the same
operands, so the operands were touched by the previous call and sit in the cache. In a training
step an op's input was written (or last read) some megabytes of traffic earlier: by then it may
have left the last-level cache. docs/calibrate.md measured the gap (memory-bound ops 1.3-14x
slower in the step than alone). This part measures it directly and the predictor reads each op
where the step puts it:

- reuse distance (from the recorded op order, `reuse_distances`): for each input of an op, the
  bytes read + written by every op between the last op that touched that input (wrote or read
  it) and this one. An input touched by no earlier op of the step (a parameter read by the
  forward, the token batch) was last touched by the previous step: `cyclic_distances` counts
  the bytes from its last touch in the step to the step's end, the optimizer step's traffic in
  between, and the bytes from the step's start to this op (steps repeat alike; the engines'
  own copies between steps are not counted: a named approximation). The op's distance
  (`op_distance`) is the byte-weighted mean of its inputs' distances (an input without one,
  in a recording without the loop, at `cold_bytes`, the largest distance measured). A named
  approximation: the inputs of one op are read together, so one distance per op.
- the curve (`measure_reuse_curve`): for each op kind and input size, the op timed right after
  `D` bytes were streamed through a scratch buffer (a copy of D/2 bytes into D/2 bytes), D on a
  grid from 0 to 4 x the last-level cache; stored as the ratio t(size, D) / t(size, 0), both
  timed in the same loop, so the kernel curve stays the baseline and this part is its factor.
- lookup (`ReuseCurve.factor`): bilinear in (log bytes moved, D) between grid points, the edge
  values held beyond the grid (above the largest size measured the op streams from memory
  whatever D is; beyond 4 x LLC nothing more is evicted).

The last-level cache size is read from sysfs (`/sys/devices/system/cpu/cpu0/cache/index*/`
`level`, `type`, `size`: the highest-level data or unified cache; Linux
Documentation/ABI/testing/sysfs-devices-system-cpu) on a CPU, and from
`torch.cuda.get_device_properties(d).L2_cache_size` on CUDA.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from planner.core.spec import Frozen

SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
DISTANCE_MULTIPLES = (0.0, 0.25, 1.0, 4.0)
"""The distance grid as multiples of the last-level cache."""
MAX_SIZE_MULTIPLE = 2.0
"""Input sizes measured: the kernel sizes up to this many times the last-level cache."""


class OpTouch(NamedTuple):
    """One recorded op: the (storage key, bytes) it reads and writes."""

    reads: tuple[tuple[int, int], ...]
    writes: tuple[tuple[int, int], ...]

    @property
    def touched_bytes(self) -> int:
        return sum(b for _, b in self.reads) + sum(b for _, b in self.writes)


def reuse_distances(ops: Sequence[OpTouch]) -> list[tuple[int | None, ...]]:
    """Per op, per read: the bytes touched by the ops strictly between the last op that read or
    wrote the same storage and this op (None: no earlier op touched it)."""
    last_touch: dict[int, int] = {}  # storage -> bytes touched up to the end of its last op
    total, out = 0, []
    for op in ops:
        out.append(tuple(total - last_touch[key] if key in last_touch else None for key, _ in op.reads))
        total += op.touched_bytes
        for key, _ in op.reads + op.writes:
            last_touch[key] = total
    return out


def cyclic_distances(ops: Sequence[OpTouch], between_steps_bytes: int) -> list[tuple[int, ...]]:
    """`reuse_distances` of a step that runs over and over, as training does: an input no earlier
    op of the step touched was last touched by the previous step, so its distance is the bytes
    after its last touch in the step (the step's tail) + `between_steps_bytes` (the optimizer
    step's traffic) + the bytes before this op (the step's head)."""
    first = reuse_distances(ops)
    starts, ends, total = [], [], 0
    for op in ops:
        starts.append(total)
        total += op.touched_bytes
        ends.append(total)
    last_end: dict[int, int] = {}
    for op, end in zip(ops, ends, strict=True):
        for key, _ in op.reads + op.writes:
            last_end[key] = end
    return [tuple(d if d is not None else total - last_end[key] + between_steps_bytes + start
                  for (key, _), d in zip(op.reads, dists, strict=True))
            for op, dists, start in zip(ops, first, starts, strict=True)]


def op_distance(read_bytes: Sequence[int], distances: Sequence[int | None], cold_bytes: float) -> float:
    """The byte-weighted mean reuse distance of an op's inputs, a cold input (None) at `cold_bytes`;
    `cold_bytes` for an op reading nothing."""
    weights = list(read_bytes)
    if sum(weights) == 0:
        return cold_bytes
    values = [cold_bytes if d is None else d for d in distances]
    return sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)


class ReuseCurve(Frozen):
    """One kind's slowdown with its operands `D` bytes of traffic back: `ratios[i][j]` =
    t(bytes_moved[i], distances_bytes[j]) / t(bytes_moved[i], 0)."""

    kind: str
    bytes_moved: tuple[float, ...]
    distances_bytes: tuple[float, ...]
    ratios: tuple[tuple[float, ...], ...]

    def factor(self, num_bytes: float, distance_bytes: float) -> float:
        """Bilinear in (log bytes moved, distance), edge values held beyond the grid."""
        rows = [_interp(self.distances_bytes, r, distance_bytes) for r in self.ratios]
        logs = [math.log(b) for b in self.bytes_moved]
        return _interp(logs, rows, math.log(max(num_bytes, 1.0)))


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear through (xs, ys) (xs increasing), the end values held outside."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] + w * (ys[i] - ys[i - 1])


def last_level_cache_bytes(device_type: str = "cpu", root: Path = SYSFS_CACHE) -> tuple[int, str]:
    """(size in bytes, where it was read) of the last-level cache of the device."""
    if device_type == "cuda":
        import torch

        size = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        return int(size), "torch.cuda.get_device_properties().L2_cache_size"
    best: tuple[int, int] | None = None
    for index in sorted(root.glob("index*")):
        if (index / "type").read_text().strip() == "Instruction":
            continue
        level, size = int((index / "level").read_text()), parse_cache_size((index / "size").read_text())
        best = max(best or (level, size), (level, size))
    if best is None:
        raise ValueError(f"no data or unified cache listed under {root}")
    return best[1], f"{root}/index*/size (level {best[0]})"


def parse_cache_size(text: str) -> int:
    """sysfs cache sizes: `32768K`, `2M`, or plain bytes."""
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def timed_after_streaming(fn: Callable[[], object], stream: Callable[[], object] | None, sync: Callable[[], None],
                          now: Callable[[], float], reps: int) -> float:
    """Median time of `fn` alone, each call right after `stream` (None: right after the previous call)."""
    fn()
    times = []
    for _ in range(reps):
        if stream is not None:
            stream()
        sync()
        start = now()
        fn()
        sync()
        times.append(now() - start)
    return statistics.median(times)


def measure_reuse_curve(kind: str, sizes_bytes: Sequence[int], llc_bytes: int, device, reps: int = 7) -> ReuseCurve:
    """The kind's ratios on `sizes_bytes` (input bytes) x the distance grid (multiples of `llc_bytes`)."""
    import torch

    from planner.calibrate import hardware as hw

    distances = tuple(m * llc_bytes for m in DISTANCE_MULTIPLES)
    half = max(1, int(distances[-1] // 8))  # fp32 elements in D_max / 2 bytes
    src, dst = torch.randn(half, device=device), torch.empty(half, device=device)
    moved, ratios = [], []
    for size in (s for s in sizes_bytes if s <= MAX_SIZE_MULTIPLE * llc_bytes):
        fn, num_bytes = hw._kernel(kind, size // 4, device)
        times = []
        for d in distances:
            n = int(d // 8)
            stream = (lambda n=n: dst[:n].copy_(src[:n])) if n else None
            times.append(timed_after_streaming(fn, stream, lambda: hw.sync(device), hw.now, reps))
        moved.append(float(num_bytes))
        ratios.append(tuple(t / times[0] for t in times))
    return ReuseCurve(kind=kind, bytes_moved=tuple(moved), distances_bytes=distances, ratios=tuple(ratios))
