"""Does a two-rank step follow the memory-contention probe? (issue 12; a benchmark, asserts nothing)

Two pinned rank processes (one core, one thread each, as `zplan calibrate hardware` runs them)
repeat, for MINUTES minutes, one round of:
1. the contention part's 16 MiB copy probe (`planner.calibrate.contention.probe_rounds`: each
   rank alone while the other waits, then both at once) -> its slowdown, as the part measures it;
2. the model's plain forward + backward (no engine, no collective) on each rank alone while
   the other waits, then on both at once -> the slowdown the model's own op mix
   sees from the other rank; and the same for the contention part's fixed probe model
   (`contention.block_probe`: 4 x 512, sequence 128, micro-batch 2), both measured as the part
   measures its probes (`contention.probe_rounds`);
3. 4 steps of the configuration under its engine (DDP / ZeRO-1 / FSDP2, as
   `planner.calibrate.steps` runs them).
Rank 0 prints one line per round. Use SEEN rows only (`planner.calibrate.heldout.SEEN`): looking
at a held-out row's step here would spend it.

    python benchmarks/contention_vs_step.py ["h176 s280 b8 ZeRO-1"] [MINUTES]

2026-11-28 (this host, docs/calibrate.md "The twelfth held-out set"), on h176, measured by
earlier versions of this script that timed the two models as the median of 3 runs alone / 3
together: 11:57-12:02 UTC, copy probe x0.97-0.98 in two rounds and x1.71-1.87 in thirteen, probe
model x1.01-1.07, the model's own forward + backward x0.95-1.06, steps 1014-1238 ms in either
state; a 7-minute run of probe and steps only: median step 1110 ms in the copy probe's low
state (x1.0), 1149 ms in its high state.
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
"""Runs of the copy probe per phase; the model and the probe model run `MODEL_REPS` / 2."""
MODEL_REPS = 1


def slowdown(fn, reps: int) -> float:
    """Together / alone of `fn`, measured as the contention part measures it
    (`contention.probe_rounds`, no collective), the mean over the two ranks."""
    alone_s, together_s, _ = ct.probe_rounds(fn, torch.device("cpu"), reps, None, with_collective=False)
    ratios = [None, None]
    dist.all_gather_object(ratios, together_s / alone_s)
    return statistics.fmean(ratios)


def worker(rank: int, label: str, minutes: float, port: int) -> None:
    warnings.filterwarnings("ignore")
    pin(rank, 1)
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    device = torch.device("cpu")
    cfg = next(c for c in heldout.seen_configs(loading.load_model("gpt2"), 2) if c.name.startswith(label))
    torch.manual_seed(0)
    tokens, labels = token_batch(cfg.model, cfg.seq_len, cfg.micro_batch, device, seed=1000 + rank)
    model = ct.forward_backward(build_model(cfg.model, cfg.seq_len), tokens, labels)
    block = ct.block_probe(device)[0]
    engine, optimizer = steps._wrap(cfg, build_model(cfg.model, cfg.seq_len))
    copy = ct.probe("memory", device, COPY_BYTES)[0]
    for warm in (model, block, lambda: steps._one_step(engine, optimizer, tokens, labels)):
        warm()
    end = time.time() + 60 * minutes
    while not ct.agreed_max(1.0 if time.time() > end else 0.0, None):
        copy_x, block_x, model_x = slowdown(copy, PROBE_REPS), slowdown(block, 2 * MODEL_REPS), slowdown(model, MODEL_REPS)
        dist.barrier()
        step_ms = [round(1e3 * sum(steps._one_step(engine, optimizer, tokens, labels))) for _ in range(4)]
        if rank == 0:
            print(f"{time.strftime('%H:%M:%S')} copy probe x{copy_x:.2f}  probe block x{block_x:.2f}  "
                  f"model forward+backward together/alone x{model_x:.2f}  {cfg.name} steps ms {step_ms}",
                  flush=True)
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
