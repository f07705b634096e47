"""What `zplan calibrate hardware` measured: the parts, as plain typed data (no torch).

`planner.calibrate.hardware` fills a `HardwareParts`; `planner.calibrate.profile_file` turns it
into GPU / node / cluster profile YAML; `planner.calibrate.predict` predicts training steps
from it. Times are seconds, sizes bytes.
"""

from __future__ import annotations

from typing import Literal

from planner.calibrate.fits import AlphaBeta, interp_loglog
from planner.core.spec import Frozen, GemmPoint
from planner.timing.collectives import bus_factor

KernelKind = Literal["copy", "elementwise", "transcendental", "random", "reduction", "norm", "softmax"]


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


class OptimizerFit(Frozen):
    """torch.optim.Adam step time: t = latency_s + per_tensor_s·tensors + per_element_s·elements."""

    latency_s: float
    per_tensor_s: float
    per_element_s: float

    def seconds(self, tensors: int, elements: int) -> float:
        return self.latency_s + self.per_tensor_s * tensors + self.per_element_s * elements


class FileBandwidth(Frozen):
    """Sequential write (fsync'd) and read (page cache dropped) of one file on the user's path."""

    path: str
    file_bytes: int
    write_bytes_per_s: float
    read_bytes_per_s: float
    capacity_bytes: int


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

    def kernel(self, kind: str) -> KernelCurve:
        return next(c for c in self.kernels if c.kind == kind)

    def collective(self, op: str, ranks: int, level: str = "intra") -> CollectiveFit:
        for fit in self.collectives:
            if fit.op == op and fit.ranks == ranks and fit.level == level:
                return fit
        raise ValueError(f"no {level} {op} on {ranks} ranks was measured")

    @property
    def where(self) -> str:
        """The `source:` of every measured number."""
        return f"measured on {self.host}, {self.date}, zplan {self.zplan_version} (torch {self.torch_version})"
