"""Per-op overhead of a real forward + backward that no kernel part carries: a part.

The kernel curves, the GEMM table and `view_op_s` time each op called bare, without autograd.
In a training step every op also goes through the model's Python (module calls, the saved-tensor
tags) and autograd (a graph node per differentiable op in forward, its evaluation by the engine
in backward). This part measures that cost per recorded op on a tiny instance of the model the
steps use, where the ops' data movement is negligible: GPT-2's architecture scaled to `TINY`
(2 blocks of width 32, 8 tokens, one sequence), its forward + backward timed for real (median of
`reps` after warm-up), minus what the other parts predict for its inventory, divided by the
inventory's op count (GEMMs + other kernels + aliasing ops, planner.calibrate.predict.Inventory):

    dispatch_per_op_s = (t_tiny_step - t_tiny_parts) / ops_tiny

The predictor adds `dispatch_per_op_s x ops` of the step being predicted. Not fitted on any step
that is predicted: the tiny model is none of the held-apart configurations.
"""

from __future__ import annotations

import statistics

TINY = {"layers": 2, "hidden": 32, "heads": 4, "ffn": 128, "vocab": 64}
TINY_SEQ_LEN = 8
TINY_MICRO_BATCH = 1


def per_op_seconds(step_s: float, parts_s: float, ops: int) -> float:
    """(measured tiny step - the parts' prediction of it) / its op count, at least 0."""
    if ops <= 0:
        raise ValueError("the tiny step recorded no ops")
    return max(0.0, (step_s - parts_s) / ops)


def op_count(inv) -> int:
    """Ops of an inventory the per-op overhead applies to: every recorded aten op."""
    return len(inv.gemms) + len(inv.kernels) + inv.views


def measure(parts, reps: int = 30, warmup: int = 10) -> float:
    """`dispatch_per_op_s` on this process's device settings (the caller pins and sets threads),
    against `parts` (its GEMM table, kernel curves and `view_op_s`)."""
    import time

    import torch

    from planner.calibrate import predict as P
    from planner.calibrate.config import scaled_model
    from planner.calibrate.models import build_model
    from planner.calibrate.run import token_batch
    from planner.io.loading import load_model

    model = scaled_model(load_model("gpt2"), **TINY, kv_heads=None)
    inv = P.inventory(model, TINY_SEQ_LEN, TINY_MICRO_BATCH)
    gemm, memory, views = P.compute_seconds(inv, parts.model_copy(update={"dispatch_per_op_s": None}))
    torch.manual_seed(0)
    net = build_model(model, TINY_SEQ_LEN)
    tokens, labels = token_batch(model, TINY_SEQ_LEN, TINY_MICRO_BATCH, torch.device("cpu"), seed=0)
    times = []
    for i in range(warmup + reps):
        start = time.perf_counter()
        net(tokens, labels).backward()
        if i >= warmup:
            times.append(time.perf_counter() - start)
        for p in net.parameters():
            p.grad = None
    return per_op_seconds(statistics.median(times), gemm + memory + views, op_count(inv))
