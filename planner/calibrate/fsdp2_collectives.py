"""FSDP2's collectives as FSDP2 calls them, measured on the ranks of a node: a part.

The collectives part times the bare `all_gather_into_tensor` / `reduce_scatter_tensor` (SUM)
between barriers. Inside FSDP2 (torch 2.13.0, torch/distributed/fsdp/_fully_shard/) the same
bytes go through a different path:
- `_fsdp_collectives.foreach_all_gather` issues `dist.all_gather_single(output, input,
  async_op=...)` (`DefaultAllGather.__call__`) on the group's flat buffer after the copy-in, and
  `FSDPParamGroup.wait_for_unshard` waits on the work, then `foreach_all_gather_copy_out`;
  `all_gather_into_tensor` is a deprecated alias of the same call (distributed_c10d.py), so
  gloo runs the same allgather either way (no fallback differs);
- `foreach_reduce` issues `dist.reduce_scatter_single(..., op=ReduceOp.AVG)` for fp32
  gradients (`_get_gradient_divide_factors`: no pre/post division for fp32 / bf16), after the
  `chunk_cat` copy-in;
- on a CPU every `device_handle.stream(...)` is the one CPU stream, and gloo runs the collective
  on its own threads pinned to the rank's cores, so time the rank waits for the peer, the copy-in
  / copy-out, the hooks and the collective all land on the step.
So the part is FSDP2 itself: a stack of `GROUPS` bias-free `Linear(w, w)` blocks, each its own
`fully_shard` group, applied to one row (compute negligible), forward + backward on every rank
of the node at once, minus the same stack unsharded, per group:

    c(B) = (t_sharded - t_plain) / GROUPS,   B = 4·w² bytes of a group's fp32 parameters

over widths `WIDTHS`, fitted to α + B/β (planner.calibrate.fits.fit_alpha_beta; the node profile's
`fsdp2_groups` keys) and read by the predictor on the measured points themselves
(`Fsdp2CollectiveFit.seconds`: linear between them, along the last segment above): the cost
per byte grows with the group (SEEN parts of 2026-11-24: 4 -> 9 MiB costs 3.6 ms/MiB on the
block schedule where the α–β fit over 64 KiB .. 9 MiB, weighted by 1/t, says 2.7), so a
straight line through small and large groups reads large groups low. Measured twice:
with `reshard_after_forward=True` (a block: all-gather before forward and again before backward,
one reduce-scatter) and `False` (FSDP2's root: gathered once, one reduce-scatter). The predictor
uses c_block(B) per block and c_root(B) for the root in place of the bare collectives, FSDP2's
copies and its hooks (all inside c).
"""

from __future__ import annotations

import math
import statistics

from planner.calibrate.fits import AlphaBeta, fit_alpha_beta, interp_linear
from planner.core.spec import Frozen

GROUPS = 4
WIDTHS = (128, 256, 512, 1024, 1536, 2048, 2560, 2880, 2944, 3072)
"""Group parameter bytes 64 KiB .. 36 MiB: the held-apart models' block groups are 0.4-33 MiB
(12·h² x 4 bytes: h848 32.9 MiB), so every predicted group lies inside the measured range (until
2026-11-24 the range ended at 9 MiB and groups up to 26 MB were extrapolated). Points on both
sides of 32 MiB (2880: 31.6 MiB, 2944: 33.1 MiB): the per-group cost jumps there (block schedule,
2026-11-28 on this host: 31.6 MiB 104 ms, 33.1 MiB 150-163 ms, twice each; 3.1-3.3 ms/MiB below,
4.5-5.3 above), where both glibc's largest mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB on
64-bit: larger buffers are mapped and unmapped on every allocation, so re-faulted) and this
host's 32 MiB last-level cache lie; a group read between 16 and 36 MiB straddled the jump (the
ninth held-out set's h832 FSDP2 row, 31.7 MiB groups, +12 to +18 %)."""


class Fsdp2CollectiveFit(Frozen):
    """Per-group FSDP2 cost by group bytes, raw points and fit; `resharded` = a block's schedule."""

    resharded: bool
    ranks: int
    sizes_bytes: tuple[float, ...]
    times_s: tuple[float, ...]
    fit: AlphaBeta

    def seconds(self, num_bytes: float) -> float:
        """Per-group cost of a group of `num_bytes` parameter bytes, on the measured points
        (`fits.interp_linear`)."""
        return interp_linear(self.sizes_bytes, self.times_s, num_bytes)


def group_bytes(width: int, elem_bytes: int = 4) -> int:
    """Parameter bytes of one probe group: a bias-free Linear(width, width)."""
    return width * width * elem_bytes


def per_group_seconds(sharded_s: float, plain_s: float, groups: int = GROUPS) -> float:
    """(sharded - plain) / groups, at least 0."""
    return max(0.0, (sharded_s - plain_s) / groups)


def fitted(resharded: bool, ranks: int, widths, per_group_s) -> Fsdp2CollectiveFit:
    sizes = [float(group_bytes(w)) for w in widths]
    return Fsdp2CollectiveFit(resharded=resharded, ranks=ranks, sizes_bytes=tuple(sizes),
                              times_s=tuple(per_group_s), fit=fit_alpha_beta(sizes, per_group_s))


class Fsdp2GroupCost(Frozen):
    """FSDP2's per-group cost measured on a group of the given parameter shapes (one of a model's
    blocks, or its root), `resharded` = a block's schedule; the predictor reads it for a group of
    exactly those shapes in place of the width curve (`measure_groups`)."""

    resharded: bool
    ranks: int
    shapes: tuple[tuple[int, ...], ...]
    seconds: float


def group_elements(shapes) -> int:
    """Elements of a group of parameters of `shapes`."""
    return sum(math.prod(s) for s in shapes)


def shapes_key(shapes) -> tuple[tuple[int, ...], ...]:
    """`shapes` (lists or tuples) as the tuple of tuples `Fsdp2GroupCost.shapes` holds, so that a
    group is found whatever sequence type its shapes came in."""
    return tuple(tuple(s) for s in shapes)


def measure(group, device, widths=WIDTHS, rounds: int = 3, reps: int = 5) -> list[Fsdp2CollectiveFit]:
    """Both schedules on `group` (every rank of it calls this); every rank returns the fits."""
    import torch
    import torch.distributed as dist

    ranks = dist.get_world_size(group)
    out = []
    for resharded in (True, False):
        times = [_per_group_seconds(torch, dist, group, device, _linear(torch, w), torch.randn(1, w, device=device),
                                    resharded, rounds, reps) for w in widths]
        out.append(fitted(resharded, ranks, widths, [max(t, 1e-9) for t in times]))
    return out


def measure_groups(group, device, groups, rounds: int = 3, reps: int = 5) -> list[Fsdp2GroupCost]:
    """The per-group cost of each (resharded, shapes) in `groups` on `group` (every rank of it
    calls this), with probe groups holding parameters of exactly those shapes (`_shapes_group`).
    Why shapes and not only bytes: FSDP2's copy-out allocates one unsharded tensor per parameter
    (_fsdp_collectives.foreach_all_gather_copy_out), and a tensor above glibc's mmap threshold
    (at most 32 MiB) is mapped fresh, so faulted, on every allocation while smaller ones reuse
    the heap. A block of 12·h² elements in four matrices costs less than one tensor of the same
    bytes once h is large (SEEN shapes, 2 ranks, 2026-11-28 16:16 UTC: h888 36.1 MiB 146 vs
    179 ms per group on the block schedule, h904 158 vs 189, h632 18.3 MiB 38.6 vs 50.2, h432
    8.6 MiB 23.0 vs 23.0)."""
    import torch
    import torch.distributed as dist

    ranks = dist.get_world_size(group)
    return [Fsdp2GroupCost(resharded=resharded, ranks=ranks, shapes=shapes_key(shapes),
                           seconds=max(_per_group_seconds(torch, dist, group, device, _shapes_group(torch, shapes),
                                                          torch.zeros(1, device=device), resharded, rounds, reps), 1e-9))
            for resharded, shapes in groups]


def _linear(torch, width: int):
    """The width curve's probe group: a bias-free Linear(width, width)."""
    return lambda: torch.nn.Linear(width, width, bias=False)


def _shapes_group(torch, shapes):
    """A probe group holding one parameter of each shape; its forward adds one element of each
    to the input (compute negligible; backward writes every parameter's whole gradient, as a
    block's backward does)."""

    class ShapesGroup(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.params = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(*s) * 0.01) for s in shapes)

        def forward(self, x):
            return x + sum(p.reshape(-1)[:1] for p in self.params)

    return ShapesGroup


def _per_group_seconds(torch, dist, group, device, make_group, x, resharded: bool, rounds: int, reps: int) -> float:
    """(t_sharded - t_plain) / GROUPS for a stack of GROUPS groups built by `make_group`, each its
    own `fully_shard` group under a sharded root, forward + backward of `x` on every rank."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from planner.calibrate.hardware import now, sync

    torch.manual_seed(0)
    plain = torch.nn.Sequential(*(make_group() for _ in range(GROUPS))).to(device)
    sharded = torch.nn.Sequential(*(make_group() for _ in range(GROUPS))).to(device)
    mesh = DeviceMesh.from_group(group, device.type)
    for block in sharded:
        fully_shard(block, mesh=mesh, reshard_after_forward=resharded)
    fully_shard(sharded, mesh=mesh, reshard_after_forward=resharded)

    def step(net) -> float:
        dist.barrier(group=group)
        sync(device)
        start = now()
        net(x).sum().backward()
        sync(device)
        seconds = now() - start
        for p in net.parameters():
            p.grad = None
        return seconds

    for net in (plain, sharded, plain, sharded):
        step(net)
    diffs = []
    for _ in range(rounds):
        t_plain = statistics.median(step(plain) for _ in range(reps))
        t_sharded = statistics.median(step(sharded) for _ in range(reps))
        diffs.append(per_group_seconds(t_sharded, t_plain))
    return statistics.median(diffs)
