"""FSDP2's own work around its collectives, as measured parts: the copies it makes (bytes from
the code, timed on the measured copy curve) and the per-hook overhead (measured on a tiny model).

From torch 2.13.0's torch/distributed/fsdp/_fully_shard/ (the installed package):
- `_fsdp_common._get_dim0_padded_size`: every parameter is padded along dim 0 to a multiple of
  the world size n; a rank's shard is padded_dim0 / n rows;
- `_fsdp_collectives.foreach_all_gather` -> `all_gather_copy_in`: the rank's shards are copied
  (`torch._foreach_copy_`) into its slice of the flat all-gather output: S elements read and
  written (S = the group's padded shard elements); with a `MixedPrecisionPolicy.param_dtype`
  other than the parameters' own, `_get_param_all_gather_inputs` first casts the shards into a
  flat buffer (`_foreach_copy_` across dtypes: S read in the original dtype, S written in the
  param dtype);
- `foreach_all_gather_copy_out`: `split_with_sizes_copy` from the n x S output into every
  parameter's padded unsharded tensor: n·S read, n·S written;
- `foreach_reduce` -> `foreach_reduce_scatter_copy_in`: `chunk_cat` of the unsharded gradients
  (U elements, unpadded) into the padded n x S reduce-scatter input (in the reduce dtype);
  then, when the reduce dtype differs from the parameters', `_to_dtype_if_needed` casts the S-
  element output back (S read, S written). fp32 without a policy: no cast; the gradient is
  averaged inside the collective (`_get_gradient_divide_factors` returns ReduceOp.AVG, no div_).
Per step with `reshard_after_forward=True`: every block's group is all-gathered twice (before
forward and again before backward); the root's once (`_fsdp_state.FSDPState._lazy_init` sets its
`post_forward_mesh_info = None`); every group reduce-scattered once.
Hooks (`_fsdp_param_group.FSDPParamGroup`): `pre_forward`, `post_forward`, `pre_backward` and
`post_backward` (via `RegisterPostBackwardFunction`) run once per group per step: 4 per group.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from planner.core.spec import Frozen
from planner.timing.host_overhead import HOOKS_PER_GROUP  # noqa: F401 (the one definition, re-exported)
from planner.timing.sharded_dp import fsdp2_group_copy_bytes, padded_shard_elements  # noqa: F401 (re-exported)


class CopyBytes(Frozen):
    """Bytes read + written by FSDP2's copies for one parameter group, per occurrence."""

    param_cast: int
    """Shards cast into the param dtype before the all-gather (0 without a mixed-precision policy)."""
    all_gather_copy_in: int
    all_gather_copy_out: int
    reduce_scatter_copy_in: int
    grad_cast: int
    """The reduce-scatter output cast back to the parameters' dtype (0 when they match)."""


def group_copy_bytes(shapes: Sequence[Sequence[int]], world: int, orig_bytes: int = 4,
                     param_bytes: int | None = None, reduce_bytes: int | None = None) -> CopyBytes:
    """The copies of one group of parameters of `shapes` on `world` ranks (element sizes in bytes:
    the parameters', the mixed-precision param dtype's and reduce dtype's; None = the parameters');
    the one definition is planner/timing/sharded_dp.fsdp2_group_copy_bytes."""
    c = fsdp2_group_copy_bytes(shapes, world, orig_bytes, param_bytes, reduce_bytes)
    return CopyBytes(**{k.removesuffix("_bytes"): v for k, v in c._asdict().items()})


def step_copies(blocks: Sequence[Sequence[Sequence[int]]], root: Sequence[Sequence[int]], world: int,
                **dtypes: int) -> list[int]:
    """Bytes of every copy FSDP2 makes in one step (one entry per copy op): each block gathered
    twice, the root once, every group reduce-scattered once."""
    out: list[int] = []
    for shapes, gathers in [*((b, 2) for b in blocks), (root, 1)]:
        c = group_copy_bytes(shapes, world, **dtypes)
        gather = [c.all_gather_copy_in, c.all_gather_copy_out] + ([c.param_cast] if c.param_cast else [])
        out += gather * gathers + [c.reduce_scatter_copy_in] + ([c.grad_cast] if c.grad_cast else [])
    return out


def hooks_per_step(groups: int) -> int:
    return HOOKS_PER_GROUP * groups


TINY_BLOCKS = 8
TINY_WIDTH = 16


def hook_seconds(device_type: str = "cpu", rounds: int = 5, reps: int = 40) -> float:
    """Measured FSDP2 overhead per hook: forward + backward of `TINY_BLOCKS` Linear(16, 16) blocks
    each `fully_shard`-ed (plus the root) on a one-rank mesh, minus the same model unsharded, over
    the hook count. The tensors are tiny, so this is the hooks' dispatch and bookkeeping (with
    the one-rank collectives and copies of 16 x 16 tensors they issue). Median of `rounds`
    interleaved rounds of `reps` steps each. Runs its own one-rank process group when none is
    initialized (a spawned rank or torchrun's already has one: then on a new one-rank group)."""
    import torch
    import torch.distributed as dist

    own = not dist.is_initialized()
    if own:
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        return _hook_seconds(torch, dist, device_type, rounds, reps)
    finally:
        if own:
            dist.destroy_process_group()


def _tiny(torch, device):
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(TINY_WIDTH, TINY_WIDTH) for _ in range(TINY_BLOCKS))).to(device)


def _hook_seconds(torch, dist, device_type: str, rounds: int, reps: int) -> float:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    from planner.calibrate.hardware import now, sync

    device = torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    groups = [dist.new_group([r]) for r in range(dist.get_world_size())]
    mesh = DeviceMesh.from_group(groups[dist.get_rank()], device_type)
    plain, sharded = _tiny(torch, device), _tiny(torch, device)
    for block in sharded:
        fully_shard(block, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    x = torch.randn(4, TINY_WIDTH, device=device)

    def step(net) -> float:
        sync(device)
        start = now()
        net(x).sum().backward()
        sync(device)
        seconds = now() - start
        for param in net.parameters():
            param.grad = None  # as the steps' zero_grad(set_to_none=True): no accumulation path
        return seconds

    for net in (plain, sharded):
        for _ in range(3):
            step(net)
    diffs = []
    for _ in range(rounds):
        t_plain = statistics.median(step(plain) for _ in range(reps))
        t_sharded = statistics.median(step(sharded) for _ in range(reps))
        diffs.append(t_sharded - t_plain)
    return max(0.0, statistics.median(diffs)) / hooks_per_step(TINY_BLOCKS + 1)
