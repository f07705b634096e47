"""Measure real training steps (single process, DDP, ZeRO-1, FSDP2) to check `predict`.

Each rank runs pinned to its own cores with the parts' `threads_per_rank` intra-op threads
(planner.calibrate.procedure: the same placement the parts were measured in), fp32 parameters,
Adam, `warmup` untimed steps, then `steps` timed ones (median, with the interquartile spread
recorded): forward + backward, then the optimizer step, timed apart. One more step runs under torch.profiler: the communication term is
the summed duration of the backend's collective records (`gloo:*` / `nccl:*`, the names
ProcessGroupGloo / ProcessGroupNCCL give their work), compute is the rest of forward + backward.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from planner.calibrate.collectives import close
from planner.calibrate.hardware import now, use_clock
from planner.calibrate.models import build_model
from planner.calibrate.predict import StepConfig
from planner.calibrate.procedure import pin, pinned, summarize
from planner.calibrate.run import token_batch
from planner.core.spec import Frozen


class Measured(Frozen):
    """Rank 0's measured seconds of one step, per term."""

    step_s: float
    forward_backward_s: float
    optimizer_s: float
    communication_s: float
    step_spread: float = 0.0
    """Interquartile range of the timed steps over their median (procedure.summarize)."""
    runs: int = 0

    @property
    def compute_s(self) -> float | None:
        """Forward + backward minus the profiler's communication; None when the collective
        records (which run on the backend's threads, overlapping) add up to more than that."""
        rest = self.forward_backward_s - self.communication_s
        return rest if rest >= 0 else None


def _wrap(cfg: StepConfig, net: torch.nn.Module):
    """(model, optimizer) for the strategy."""
    if cfg.strategy == "fsdp2" and cfg.nproc > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (cfg.nproc,))
        for block in net.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(net, mesh=mesh)
        return net, torch.optim.Adam(net.parameters(), lr=1e-4)
    if cfg.strategy in ("ddp", "zero1") and cfg.nproc > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(net)
        if cfg.strategy == "zero1":
            return ddp, ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
        return ddp, torch.optim.Adam(ddp.parameters(), lr=1e-4)
    return net, torch.optim.Adam(net.parameters(), lr=1e-4)


def _one_step(net, opt, tokens, labels) -> tuple[float, float]:
    start = now()
    net(tokens, labels).backward()
    mid = now()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return mid - start, now() - mid


def _comm_seconds(net, opt, tokens, labels) -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        net(tokens, labels).backward()
    opt.zero_grad(set_to_none=True)
    events = [e for e in prof.events() if e.name.startswith(("gloo:", "nccl:"))]
    return sum(e.cpu_time_total for e in events) / 1e6


def measure(cfg: StepConfig, rank: int, threads: int, steps: int, warmup: int) -> Measured:
    """Rank `rank`'s step times (the caller has pinned it: `procedure.pin`)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    net, opt = _wrap(cfg, build_model(cfg.model, cfg.seq_len))
    tokens, labels = token_batch(cfg.model, cfg.seq_len, cfg.micro_batch, torch.device("cpu"), seed=1000 + rank)
    for _ in range(warmup):
        _one_step(net, opt, tokens, labels)
    timed = [_one_step(net, opt, tokens, labels) for _ in range(steps)]
    fwd_bwd = statistics.median(t[0] for t in timed)
    optim = statistics.median(t[1] for t in timed)
    comm = _comm_seconds(net, opt, tokens, labels) if cfg.nproc > 1 else 0.0
    step = summarize([a + b for a, b in timed])
    return Measured(step_s=step.median_s, forward_backward_s=fwd_bwd, optimizer_s=optim, communication_s=comm,
                    step_spread=step.spread, runs=step.runs)


def _worker(rank: int, store_dir: str, cfg_json: str, threads: int, steps: int, warmup: int,
            clock: str, pin_ranks: bool = True) -> None:
    warnings.filterwarnings("ignore")
    if pin_ranks:
        pin(rank, threads)  # before gloo starts its threads: they inherit the mask
    use_clock(clock)
    cfg = StepConfig.model_validate_json(cfg_json)
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank, world_size=cfg.nproc)
    finished = False
    try:
        result = measure(cfg, rank, threads, steps, warmup)
        Path(store_dir, f"rank{rank}.json").write_text(result.model_dump_json())
        finished = True
    finally:
        close(finished)


STEPS = 10
WARMUP = 3


def measure_step(cfg: StepConfig, threads: int, steps: int = STEPS, warmup: int = WARMUP,
                 clock: str = "wall", pin_ranks: bool = True) -> Measured:
    """Rank 0's measurements of `cfg` (one process here, pinned to rank 0's cores, or `nproc`
    spawned ones, each pinned to its own; `pin_ranks=False` leaves placement to the scheduler,
    for the stability comparison of benchmarks/calibrate_hardware.py --stability)."""
    use_clock(clock)
    if cfg.nproc == 1:
        with pinned(0, threads, "cpu" if pin_ranks else "none"):
            return measure(cfg, 0, threads, steps, warmup)
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="zplan-step-") as tmp:
        mp.spawn(_worker, args=(tmp, cfg.model_dump_json(), threads, steps, warmup, clock, pin_ranks), nprocs=cfg.nproc, join=True)
        return Measured.model_validate_json(Path(tmp, "rank0.json").read_text())
