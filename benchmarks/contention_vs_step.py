"""Does a two-rank step follow the memory-contention probe? (issue 12; a benchmark, asserts nothing)

Two pinned rank processes (one core, one thread each, as `zplan calibrate hardware` runs them)
repeat, for MINUTES minutes, one round of:
1. the contention part's 16 MiB copy probe (`planner.calibrate.contention.probe_rounds`: each
   rank alone while the other waits, then both at once) -> its slowdown, as the part measures it;
2. the model's plain forward + backward (no engine, no collective), 3 times on each rank alone
   while the other waits, then 3 times on both at once -> the slowdown the model's own op mix
   sees from the other rank; and the same for a fixed probe model (`PROBE_ROW`, SEEN-1's
   "large b2": 4 x 512, sequence 128, micro-batch 2), a candidate contention part that is not
   the configuration predicted;
3. 4 steps of the configuration under its engine (DDP / ZeRO-1 / FSDP2, as
   `planner.calibrate.steps` runs them).
Rank 0 prints one line per round. Use SEEN rows only (`planner.calibrate.heldout.SEEN`): looking
at a held-out row's step here would spend it.

    python benchmarks/contention_vs_step.py ["h176 s280 b8 ZeRO-1"] [MINUTES]

2026-11-28 (this host, docs/calibrate.md "The twelfth held-out set"): the copy probe read x1.7-1.9
(its high state) in every round of a 4-minute run, while the model's forward + backward together
ran x0.96-1.07 of alone; in an earlier 7-minute run of steps only, steps in the probe's low state
(x1.0) had a median 1110 ms, in the high state 1149 ms.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.calibrate import contention as ct  # noqa: E402
from planner.calibrate import heldout, steps  # noqa: E402
from planner.calibrate.models import build_model  # noqa: E402
from planner.calibrate.procedure import pin  # noqa: E402
from planner.calibrate.run import token_batch  # noqa: E402
from planner.io import loading  # noqa: E402

COPY_BYTES = 16 * 2**20
PROBE_REPS = 100
PROBE_ROW = "large b2 DDP"
"""The SEEN-1 row whose model (4 x 512, sequence 128, micro-batch 2) is the fixed probe block."""


def forward_backward_s(net, tokens, labels, times: int) -> float:
    """Median seconds of `times` plain forward + backward passes."""
    out = []
    for _ in range(times):
        start = time.perf_counter()
        net(tokens, labels).backward()
        out.append(time.perf_counter() - start)
        for p in net.parameters():
            p.grad = None
    return statistics.median(out)


def alone_and_together(net, tokens, labels) -> tuple[float, float]:
    """(this rank alone while the other waits, both ranks at once): median forward + backward."""
    alone = 0.0
    for turn in range(2):
        dist.barrier()
        if dist.get_rank() == turn:
            alone = forward_backward_s(net, tokens, labels, 3)
        dist.barrier()
    return alone, forward_backward_s(net, tokens, labels, 3)


def worker(rank: int, label: str, minutes: float, port: int) -> None:
    warnings.filterwarnings("ignore")
    pin(rank, 1)
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    device = torch.device("cpu")
    seen = heldout.seen_configs(loading.load_model("gpt2"), 2)
    cfg = next(c for c in seen if c.name.startswith(label))
    fixed = next(c for c in seen if c.name.startswith(PROBE_ROW))
    torch.manual_seed(0)
    plain = build_model(cfg.model, cfg.seq_len)
    probe_net = build_model(fixed.model, fixed.seq_len)
    probe_in = token_batch(fixed.model, fixed.seq_len, fixed.micro_batch, device, seed=2000 + rank)
    engine, optimizer = steps._wrap(cfg, build_model(cfg.model, cfg.seq_len))
    tokens, labels = token_batch(cfg.model, cfg.seq_len, cfg.micro_batch, device, seed=1000 + rank)
    forward_backward_s(plain, tokens, labels, 2)
    forward_backward_s(probe_net, *probe_in, 2)
    for _ in range(3):
        steps._one_step(engine, optimizer, tokens, labels)
    copy = ct.probe("memory", device, COPY_BYTES)[0]
    end = time.time() + 60 * minutes
    while not ct.agreed_max(1.0 if time.time() > end else 0.0, None):
        alone_s, together_s, _ = ct.probe_rounds(copy, device, PROBE_REPS, None)
        probe = [None, None]
        dist.all_gather_object(probe, together_s / alone_s)
        alone, together = alone_and_together(plain, tokens, labels)
        model = [None, None]
        dist.all_gather_object(model, together / alone)
        alone, together = alone_and_together(probe_net, *probe_in)
        block = [None, None]
        dist.all_gather_object(block, together / alone)
        dist.barrier()
        step_ms = [round(1e3 * sum(steps._one_step(engine, optimizer, tokens, labels))) for _ in range(4)]
        if rank == 0:
            print(f"{time.strftime('%H:%M:%S')} copy probe x{statistics.fmean(probe):.2f}  "
                  f"probe block x{statistics.fmean(block):.2f}  "
                  f"model forward+backward together/alone x{statistics.fmean(model):.2f}  "
                  f"{cfg.name} steps ms {step_ms}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "h176 s280 b8 ZeRO-1"
    minutes = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    seen = {row[0] for rows in heldout.SEEN for row in rows}
    if label not in seen:
        print(f"contention_vs_step: {label!r} is not a SEEN row (planner/calibrate/heldout.py)", file=sys.stderr)
        sys.exit(2)
    mp.spawn(worker, args=(label, minutes, 29536), nprocs=2)


if __name__ == "__main__":
    main()
