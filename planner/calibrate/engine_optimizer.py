"""The optimizer step as the sharding engines call it, measured on the ranks of a node: a part.

The optimizer part (`hardware.optimizer_fit`) times `torch.optim.Adam.step` on plain tensors in
one process. Two engines step differently (torch 2.13.0):
- ZeRO-1, `torch.distributed.optim.ZeroRedundancyOptimizer.step` (zero_redundancy_optimizer.py):
  each rank runs Adam on its partition (`_partition_parameters`: tensors by size, largest first,
  to the rank holding the fewest elements), then `_sync_params` broadcasts every parameter from
  its owner rank (one `dist.broadcast` per tensor without `parameters_as_bucket_view`), so the
  step holds Adam on ~1/n of the elements plus a broadcast of every tensor, with both ranks
  stepping at once;
- FSDP2 (`fully_shard`): the parameters are DTensor shards (`Shard(0)`), and `Adam.step` runs
  through DTensor's dispatch (torch/distributed/tensor/_dispatch.py) on every op of every
  tensor: a per-tensor overhead the plain-tensor part does not hold, on 1/n of the elements.
So the part is the engine's step itself on synthetic fp32 parameter lists (`SHAPES`), every
rank of the node stepping at once after a barrier, fitted by least squares to

    t = latency_s + per_tensor_s x tensors + per_element_s x elements

with `tensors` and `elements` counted over the WHOLE parameter list (not one rank's share): the
share each rank steps and broadcasts is what the engine decides, inside the measurement. The
predictor uses it for ZeRO-1 and FSDP2 steps on the same number of ranks in place of the Adam
part, its contention slowdown and (ZeRO-1) the per-tensor broadcasts of the collectives part.
Named approximation: the fit is linear in the list's totals; a list whose tensors the greedy
partition splits unevenly (one huge tensor) steps slower than the fit says on the rank that
holds it.
"""

from __future__ import annotations

import statistics
from typing import Literal

from planner.calibrate.fits import OptimizerFit, fit_optimizer
from planner.core.spec import Frozen

Engine = Literal["zero1", "fsdp2"]

SHAPES = ((2, 2_000_000), (8, 2_000_000), (8, 500_000), (64, 16_000), (256, 16_000), (512, 1_000))
"""(tensors, elements each) of the synthetic parameter lists; even counts so the greedy
partition splits each list evenly over 2 ranks; totals 1 K to 16 M elements (the held-apart
models hold 2-17 M parameters in 20-80 tensors)."""


class EngineOptimizerFit(Frozen):
    """One engine's optimizer step on `ranks` ranks: the points and their fit."""

    engine: Engine
    ranks: int
    shapes: tuple[tuple[int, int], ...]
    times_s: tuple[float, ...]
    fit: OptimizerFit


def measure(group, device, shapes=SHAPES, reps: int = 5) -> list[EngineOptimizerFit]:
    """Both engines' steps on `group` (every rank of it calls this); every rank returns the fits."""
    import torch.distributed as dist

    ranks = dist.get_world_size(group)
    out = []
    for engine in ("zero1", "fsdp2"):
        times = [_one_list(engine, group, device, count, numel, reps) for count, numel in shapes]
        out.append(EngineOptimizerFit(engine=engine, ranks=ranks, shapes=tuple(shapes), times_s=tuple(times),
                                      fit=fit_optimizer(shapes, times)))
    return out


def _optimizer(engine: str, group, device, count: int, numel: int):
    """(optimizer, its parameters) with gradients in place, states created."""
    import torch

    torch.manual_seed(0)
    holder = torch.nn.Module()
    holder.params = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(numel, device=device))
                                           for _ in range(count))
    if engine == "fsdp2":
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(holder, mesh=DeviceMesh.from_group(group, device.type))
        for p in holder.params:  # DTensor shards: the gradient as FSDP2's reduce-scatter leaves it
            p.grad = torch.full_like(p, 1e-3)  # (DTensor's random ops warn on a CPU mesh)
        return torch.optim.Adam(holder.parameters(), lr=1e-4)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    for p in holder.params:
        p.grad = torch.randn_like(p)
    return ZeroRedundancyOptimizer(list(holder.params), optimizer_class=torch.optim.Adam, lr=1e-4,
                                   process_group=group)


def _one_list(engine: str, group, device, count: int, numel: int, reps: int) -> float:
    import torch.distributed as dist

    from planner.calibrate.hardware import now, sync

    opt = _optimizer(engine, group, device, count, numel)
    opt.step()  # creates the states

    def step() -> float:
        dist.barrier(group=group)
        sync(device)
        start = now()
        opt.step()
        sync(device)
        return now() - start

    step()
    return statistics.median(step() for _ in range(reps))
