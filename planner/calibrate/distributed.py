"""`zplan calibrate --nproc N`: DDP, ZeRO-1 (ZeroRedundancyOptimizer) and FSDP2 (`fully_shard`)
on N local processes, measured per rank and compared with the planner.

Processes are started with `torch.multiprocessing.spawn` and meet through a FileStore in a
temporary directory (no network, not even loopback TCP). gloo on CPU, NCCL on CUDA.
Distributed runs use fp32 parameters and Adam (the engines' own mixed precision is not the
planner's master-weight recipe), one micro-batch per rank, one step.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from planner.calibrate.collectives import close
from planner.calibrate.compare import Row, distributed_rows
from planner.calibrate.measure import tensor_bytes
from planner.calibrate.models import build_model
from planner.calibrate.run import pick_device, token_batch
from planner.core.spec import ModelSpec


def _batch(model: ModelSpec, seq_len: int, micro_batch: int, device: torch.device):
    """This rank's batch: a different seed, so different data, on every rank."""
    return token_batch(model, seq_len, micro_batch, device, seed=1000 + dist.get_rank())


def _adam_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Local bytes of Adam's moments (DTensor states counted by their local shard), no step counters."""
    states = [v for s in optimizer.state.values() for k, v in s.items() if torch.is_tensor(v) and k != "step"]
    return tensor_bytes(_local(v) for v in states)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class CollectiveCounter(TorchDispatchMode):
    """Counts c10d collectives as they pass the dispatcher (`allgather_base`, `reduce_scatter_base`).
    (torch's CommDebugMode counts the same ops but its module tracker fails on MoE blocks.)"""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            name = func._schema.name.split("::")[-1].strip("_")
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def ddp_and_zero1(model: ModelSpec, seq_len: int, micro_batch: int, device: torch.device) -> dict[str, Any]:
    """One DDP step with a communication hook counting all-reduced gradient bytes, stepped by
    ZeroRedundancyOptimizer(Adam): this rank's optimizer-state bytes."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    net = build_model(model, seq_len).to(device)
    ddp = DDP(net, device_ids=[device.index] if device.type == "cuda" else None,
              find_unused_parameters=model.is_moe)  # an expert may receive no token
    counted = {"bytes": 0, "buckets": 0}

    def hook(state, bucket):
        counted["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
        counted["buckets"] += 1
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(dist.group.WORLD, hook)
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
    tokens, labels = _batch(model, seq_len, micro_batch, device)
    ddp(tokens, labels).backward()
    zero.step()
    return {"allreduce_bytes": counted["bytes"], "buckets": counted["buckets"],
            "zero1_optimizer_bytes": _adam_state_bytes(zero.optim),
            "zero1_numel": sum(p.numel() for g in zero.optim.param_groups for p in g["params"])}


def fsdp2(model: ModelSpec, seq_len: int, micro_batch: int, device: torch.device) -> dict[str, Any]:
    """One FSDP2 step: `fully_shard` on every block, then the root; local bytes and collectives."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    net = build_model(model, seq_len).to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in net.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
    tokens, labels = _batch(model, seq_len, micro_batch, device)
    with CollectiveCounter() as comm:
        net(tokens, labels).backward()
    optimizer.step()
    counts = comm.counts
    params = [_local(p) for p in net.parameters()]
    return {
        "param_bytes": tensor_bytes(params),
        "param_storage_bytes": sum(p.untyped_storage().nbytes() for p in params),
        "grad_bytes": tensor_bytes(_local(p.grad) for p in net.parameters() if p.grad is not None),
        "optimizer_bytes": _adam_state_bytes(optimizer),
        "collectives": counts,
    }


def _worker(rank: int, world: int, store_dir: str, model_json: str, seq_len: int, micro_batch: int,
            device_name: str) -> None:
    warnings.filterwarnings("ignore", message="Full backward hook")  # FSDP2 hooks on int inputs
    model = ModelSpec.model_validate_json(model_json)
    device = pick_device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{store_dir}/store", rank=rank, world_size=world)
    finished = False
    try:
        out = {"rank": rank, "ddp": ddp_and_zero1(model, seq_len, micro_batch, device),
               "fsdp2": fsdp2(model, seq_len, micro_batch, device)}
        Path(store_dir, f"rank{rank}.json").write_text(json.dumps(out))
        finished = True
    finally:
        close(finished)


def measure_ranks(model: ModelSpec, seq_len: int, micro_batch: int, nproc: int, device: str = "auto") -> list[dict]:
    """Spawn `nproc` processes and return each rank's measurements."""
    with tempfile.TemporaryDirectory(prefix="zplan-dist-") as tmp:
        mp.spawn(_worker, args=(nproc, tmp, model.model_dump_json(), seq_len, micro_batch, device),
                 nprocs=nproc, join=True)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(nproc)]


def run_distributed(model: ModelSpec, seq_len: int, micro_batch: int, nproc: int,
                    device: str = "auto") -> dict[str, Any]:
    """Measure `nproc` ranks and compare: {"nproc", "ranks": raw measurements, "rows": [Row]}."""
    ranks = measure_ranks(model, seq_len, micro_batch, nproc, device)
    rows: list[Row] = distributed_rows(model, ranks)
    return {"nproc": nproc, "ranks": ranks, "rows": rows}
