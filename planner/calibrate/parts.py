"""What `zplan calibrate hardware` measured: the parts, as plain typed data (no torch).

`planner.calibrate.hardware` fills a `HardwareParts`; `planner.calibrate.profile_file` turns it
into GPU / node / cluster profile YAML; `planner.calibrate.predict` predicts training steps
from it. Times are seconds, sizes bytes.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from planner.calibrate.engine_optimizer import EngineOptimizerFit
from planner.calibrate.fits import AlphaBeta, OptimizerFit, interp_loglog
from planner.calibrate.fsdp2_collectives import Fsdp2CollectiveFit, Fsdp2GroupCost, shapes_key
from planner.calibrate.reuse import ReuseCurve
from planner.calibrate.shape_gemms import ShapeGemm
from planner.core.spec import Frozen, GemmPoint
from planner.timing.collectives import bus_factor

KernelKind = Literal["copy", "elementwise", "transcendental", "random", "reduction", "norm", "softmax", "log_softmax",
                     "log_softmax_backward"]


class KernelCurve(Frozen):
    """A memory-bound kernel timed at several sizes; `bytes_moved` counts reads plus writes."""

    kind: KernelKind
    bytes_moved: tuple[float, ...]
    times_s: tuple[float, ...]

    def seconds(self, num_bytes: float) -> float:
        return interp_loglog(self.bytes_moved, self.times_s, num_bytes)

    @property
    def large_bytes_per_s(self) -> float:
        """Effective bandwidth at the largest size measured."""
        return self.bytes_moved[-1] / self.times_s[-1]


class CollectiveFit(Frozen):
    """One collective on one topology level: the raw timings and their α–β fit. `sizes_bytes`
    are nccl-tests' sizes (all-reduce: the buffer; all-gather: the gathered output;
    reduce-scatter: the input; all-to-all: the per-rank buffer; send/recv: the message)."""

    op: Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
    level: Literal["intra", "inter"]
    ranks: int
    sizes_bytes: tuple[float, ...]
    times_s: tuple[float, ...]
    fit: AlphaBeta

    @property
    def bus_bytes_per_s(self) -> float:
        """nccl-tests busbw of the fitted algorithm bandwidth."""
        return self.fit.bytes_per_s * float(bus_factor(self.op, self.ranks))


class FileBandwidth(Frozen):
    """Sequential write (fsync'd) and read (page cache dropped) of one file on the user's path."""

    path: str
    file_bytes: int
    write_bytes_per_s: float
    read_bytes_per_s: float
    capacity_bytes: int


class ContentionPoint(Frozen):
    """One rank's probe timed alone and with the other `ranks - 1` ranks of its node running the
    same probe at once (and, with `with_collective`, while an all-reduce is in flight); one entry
    per rank in `alone_s` / `together_s`. planner.calibrate.contention measures it."""

    kind: Literal["gemm", "memory", "dispatch", "block"]
    ranks: int = Field(ge=2)
    with_collective: bool
    probe: str
    """What was timed, e.g. `float32 GEMM 512x512 @ 512x512`."""
    bytes_moved: float = 0
    """memory probes: bytes read + written by one copy (0 for the other kinds)."""
    alone_s: tuple[float, ...]
    together_s: tuple[float, ...]
    collective: str = ""
    """The collective in flight (with_collective only)."""

    @property
    def slowdown(self) -> float:
        """together / alone, the mean over the ranks. (A synchronous step waits for its slowest
        rank, but on a machine shared with other work the largest ratio is mostly noise; the mean
        is the stable estimate of the same figure when ranks are alike.)"""
        ratios = [t / a for a, t in zip(self.alone_s, self.together_s, strict=True)]
        return sum(ratios) / len(ratios)


class HardwareParts(Frozen):
    """Everything one calibration run measured, with where and when."""

    host: str
    date: str
    zplan_version: str
    torch_version: str
    device: str
    """`cpu` or the CUDA device name."""
    backend: Literal["gloo", "nccl"]
    threads_per_rank: int
    clock: Literal["wall", "thread"] = "wall"
    """How the device parts were timed: wall time, or the calling thread's CPU time."""
    """torch intra-op threads of each rank (CPU: one rank is this many cores)."""
    world_size: int
    num_nodes: int
    peak_flops_per_s: dict[str, float]
    """The peak each GEMM efficiency is a fraction of, per dtype."""
    peak_source: str
    gemm: tuple[GemmPoint, ...]
    kernels: tuple[KernelCurve, ...]
    view_op_s: float
    """One aliasing op (view, transpose): dispatch cost with no data moved."""
    optimizer: OptimizerFit
    collectives: tuple[CollectiveFit, ...] = ()
    host_to_device_bytes_per_s: float | None = None
    device_to_host_bytes_per_s: float | None = None
    file: FileBandwidth | None = None
    cpu_memory_bytes: int
    contention: tuple[ContentionPoint, ...] = ()
    """Per-rank compute slowdown with N ranks at once (empty: one rank, or an older parts file)."""
    fsdp2_hook_s: float | None = None
    """FSDP2's overhead per hook (planner.calibrate.fsdp2_overhead.hook_seconds); None in an
    older parts file (the prediction then has no hook term)."""
    dispatch_per_op_s: float | None = None
    """Python + autograd overhead per recorded op of a real forward + backward
    (planner.calibrate.dispatch); None in an older parts file (no such term then)."""
    fsdp2_collectives: tuple[Fsdp2CollectiveFit, ...] = ()
    """FSDP2's per-group cost as FSDP2 calls its collectives (copies, hooks and waits included),
    block and root schedules (planner.calibrate.fsdp2_collectives); empty in an older parts file
    (the predictor then adds the bare collectives, the copies and the hooks)."""
    fsdp2_groups: tuple[Fsdp2GroupCost, ...] = ()
    """FSDP2's per-group cost on groups of given models' parameter shapes (a block's, the
    root's: `fsdp2_collectives.measure_groups`); the predictor uses them for those groups and the
    width curve (`fsdp2_collectives`) for every other."""
    shape_gemms: tuple[ShapeGemm, ...] = ()
    """GEMMs timed at the shapes and layouts of given models' steps (planner.calibrate.shape_gemms);
    the predictor uses them for those calls and the table for every other."""
    reuse: tuple[ReuseCurve, ...] = ()
    """Memory-bound ops timed with their operands D bytes of traffic back (planner.calibrate.reuse):
    the factor on the kernel curve at each op's reuse distance; empty in an older parts file
    (factor 1, the cache-resident curves alone)."""
    last_level_cache_bytes: int | None = None
    """The last-level cache the reuse grid is built on; None in an older parts file."""
    last_level_cache_source: str = ""
    """Where `last_level_cache_bytes` was read (sysfs, or the CUDA device properties)."""
    fault_s_per_page: float | None = None
    """CPU hosts: seconds of the first touch of one page freshly mapped from the kernel, beyond
    writing it again (planner.calibrate.page_faults); None on CUDA (the caching allocator keeps
    its segments) and in an older parts file (no page-fault term then)."""
    engine_optimizers: tuple[EngineOptimizerFit, ...] = ()
    """ZeRO-1's and FSDP2's optimizer step as the engines call it on the node's ranks
    (planner.calibrate.engine_optimizer); empty in an older parts file (the predictor then uses
    the Adam part with its contention slowdown, and ZeRO-1's broadcasts from the collectives)."""

    def kernel(self, kind: str) -> KernelCurve:
        """The curve of `kind`; a parts file measured before the log-softmax curves existed
        answers those with its `softmax` curve (what the predictor used then)."""
        found = next((c for c in self.kernels if c.kind == kind), None)
        if found is None and kind.startswith("log_softmax"):
            return self.kernel("softmax")
        if found is None:
            raise ValueError(f"no {kind} kernel curve was measured")
        return found

    def reuse_factor(self, kind: str, num_bytes: float, distance_bytes: float) -> float:
        """t(op with operands `distance_bytes` of traffic back) / t(op cache-resident) for `kind` at
        `num_bytes` moved; 1 when the reuse part was not measured for the kind."""
        curve = next((c for c in self.reuse if c.kind == kind), None)
        return 1.0 if curve is None else curve.factor(num_bytes, distance_bytes)

    @property
    def cold_distance_bytes(self) -> float:
        """The reuse distance of an operand no earlier op of the step touched: the largest measured."""
        return max((c.distances_bytes[-1] for c in self.reuse), default=0.0)

    def collective(self, op: str, ranks: int, level: str = "intra") -> CollectiveFit:
        for fit in self.collectives:
            if fit.op == op and fit.ranks == ranks and fit.level == level:
                return fit
        raise ValueError(f"no {level} {op} on {ranks} ranks was measured")

    def has_contention(self, kind: str, ranks: int, with_collective: bool = False) -> bool:
        """Whether the parts hold a `kind` contention point for `ranks` ranks (older parts files
        have no `block` point)."""
        return ranks > 1 and any((p.kind, p.ranks, p.with_collective) == (kind, ranks, with_collective)
                                 for p in self.contention)

    def slowdown(self, kind: str, ranks: int, with_collective: bool = False, num_bytes: float = 0) -> float:
        """The measured slowdown of `kind` compute with `ranks` ranks at once; for `memory`, at
        `num_bytes` moved (piecewise linear in log bytes between the probed sizes, the end values
        held beyond them). 1 for one rank and when it was not measured (an older parts file: the
        prediction then has no contention)."""
        if ranks <= 1:
            return 1.0
        points = sorted((p for p in self.contention if (p.kind, p.ranks, p.with_collective) ==
                         (kind, ranks, with_collective)), key=lambda p: p.bytes_moved)
        if not points:
            return 1.0
        if len(points) == 1 or num_bytes <= points[0].bytes_moved:
            return points[0].slowdown
        if num_bytes >= points[-1].bytes_moved:
            return points[-1].slowdown
        lo, hi = next((a, b) for a, b in zip(points, points[1:]) if num_bytes <= b.bytes_moved)
        w = math.log(num_bytes / lo.bytes_moved) / math.log(hi.bytes_moved / lo.bytes_moved)
        return lo.slowdown + w * (hi.slowdown - lo.slowdown)

    def engine_optimizer(self, engine: str, ranks: int) -> OptimizerFit | None:
        """The engine's optimizer-step fit on `ranks` ranks, None when not measured."""
        return next((f.fit for f in self.engine_optimizers if f.engine == engine and f.ranks == ranks), None)

    def fsdp2_fit(self, resharded: bool, ranks: int) -> AlphaBeta | None:
        """The FSDP2-as-called fit of the schedule on `ranks` ranks, None when not measured."""
        curve = self.fsdp2_curve(resharded, ranks)
        return None if curve is None else curve.fit

    def fsdp2_curve(self, resharded: bool, ranks: int) -> Fsdp2CollectiveFit | None:
        """The FSDP2-as-called part of the schedule on `ranks` ranks (its measured points and
        fit: `fsdp2_collectives.Fsdp2CollectiveFit`), None when not measured."""
        return next((f for f in self.fsdp2_collectives if f.resharded == resharded and f.ranks == ranks), None)

    def fsdp2_group_seconds(self, resharded: bool, ranks: int, shapes) -> float | None:
        """The measured per-group cost of a group of exactly `shapes` on `ranks` ranks, None when
        not measured (`fsdp2_groups`)."""
        key = shapes_key(shapes)
        return next((g.seconds for g in self.fsdp2_groups
                     if g.resharded == resharded and g.ranks == ranks and g.shapes == key), None)

    @property
    def where(self) -> str:
        """The `source:` of every measured number."""
        return f"measured on {self.host}, {self.date}, zplan {self.zplan_version} (torch {self.torch_version})"
