"""FSDP2's memory as torch's own `FSDPMemTracker` sees it, without a GPU (issue 11, item 2).

A harness model (embedding, L residual MLP blocks, untied head, cross entropy on fp32 logits) is
wrapped as the FSDP2 recipes do: `fully_shard` per block, then the root
(torch/distributed/fsdp/_fully_shard/_fully_shard.py), with a `MixedPrecisionPolicy`, on a
fake process group of `world` ranks (torch.testing._internal.distributed.fake_pg: collectives
return without communicating, shapes are exact). Tensors are real CPU tensors: under
FakeTensorMode the tracker counts 15 state-sized copies in a foreach AdamW step over DTensors
that real tensors do not allocate (measured: OptState 39,321,640 B fake vs 5,242,920 B real at
world 4, hidden 256, 4 blocks), so the small real model is the reference. Two full steps
(forward, backward, AdamW, zero_grad) run inside
`torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`; the peak snapshot's categories
(sharded / unsharded parameters and gradients, all-gather and reduce-scatter buffers, optimizer
states, activations, temporaries) are returned.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Block(nn.Module):
    """x + W2 relu(W1 x): one FSDP group of 2·h·4h parameters."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, 4 * hidden, bias=False)
        self.down = nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    """Embedding (V·h), L blocks, untied head (h·V): the root group holds 2·V·h parameters."""

    def __init__(self, hidden: int, layers: int, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(layers))
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return nn.functional.cross_entropy(self.head(x).float().flatten(0, 1), ids.flatten())


def tracked_peak(world: int, hidden: int, layers: int, vocab: int, seq_len: int, micro_batch: int,
                 reshard_after_forward: bool = True, param_dtype: str = "bf16",
                 reduce_dtype: str = "fp32") -> dict[str, int]:
    """{FSDPMemTracker category: bytes} at the peak of two training steps on rank 0 of `world`."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        net = Net(hidden, layers, vocab)
        policy = MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype])
        for block in net.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
        fully_shard(net, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, foreach=True)
        ids = torch.randint(0, vocab, (micro_batch, seq_len))
        tracker = FSDPMemTracker(net, optimizer)
        tracker.track_inputs((ids,))
        with tracker:
            for _ in range(2):
                optimizer.zero_grad()
                net(ids).backward()
                optimizer.step()
                tracker.reset_mod_stats()
        snapshot = next(iter(tracker.get_tracker_snapshot("peak").values()))
        return {getattr(k, "value", str(k)): int(v) for k, v in snapshot.items()}
    finally:
        dist.destroy_process_group()
