"""The contention part of `zplan calibrate hardware` (planner.calibrate.contention) and how the
predictor applies it; the log-softmax curves. Every expected number is worked out by hand here."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from planner.calibrate.parts import ContentionPoint, KernelCurve
from test_calibrate_hardware import _parts


def _point(kind: str, slowdown: float, *, with_collective: bool = False, bytes_moved: float = 0,
           ranks: int = 2) -> ContentionPoint:
    return ContentionPoint(kind=kind, ranks=ranks, with_collective=with_collective, probe="t",
                           bytes_moved=bytes_moved, alone_s=(1e-3, 2e-3),
                           together_s=(slowdown * 1e-3, slowdown * 2e-3))


def test_slowdown_is_the_mean_of_the_ranks_ratios() -> None:
    # rank 0: 3 ms / 2 ms = 1.5; rank 1: 4 ms / 4 ms = 1.0; mean 1.25
    point = ContentionPoint(kind="gemm", ranks=2, with_collective=False, probe="t",
                            alone_s=(2e-3, 4e-3), together_s=(3e-3, 4e-3))
    assert point.slowdown == pytest.approx(1.25, rel=1e-12)


def test_repeated_measurements_keep_the_median_slowdown() -> None:
    # slowdowns by hand: (1.9 + 1.8) / 2 = 1.85; (1.0 + 0.98) / 2 = 0.99; (1.7 + 1.6) / 2 = 1.65
    from planner.calibrate.contention import median_point

    def measured(r0: float, r1: float) -> ContentionPoint:
        return ContentionPoint(kind="memory", ranks=2, with_collective=False, probe="t",
                               bytes_moved=2**25, alone_s=(1e-3, 1e-3), together_s=(r0 * 1e-3, r1 * 1e-3))

    kept = median_point([measured(1.9, 1.8), measured(1.0, 0.98), measured(1.7, 1.6)])
    assert kept.slowdown == pytest.approx(1.65, rel=1e-12)
    assert median_point([measured(1.0, 0.98), measured(1.9, 1.8)]).slowdown == pytest.approx(0.99, rel=1e-12)


def test_parts_slowdown_interpolates_memory_in_log_bytes() -> None:
    parts = _parts().model_copy(update={"contention": (
        _point("memory", 1.0, bytes_moved=1e6), _point("memory", 2.0, bytes_moved=1e8),
        _point("memory", 5.0, bytes_moved=1e6, with_collective=True), _point("gemm", 1.5))})
    # 1e7 is halfway between 1e6 and 1e8 in log bytes: 1 + 0.5 · (2 - 1) = 1.5
    assert parts.slowdown("memory", 2, False, 1e7) == pytest.approx(1.5, rel=1e-12)
    # 1e6 · 10^0.25 is 0.25 of the 2 decades, an eighth of the way: 1 + 0.125 · (2 - 1) = 1.125
    assert parts.slowdown("memory", 2, False, 1e6 * 10**0.25) == pytest.approx(1.125, rel=1e-12)
    assert parts.slowdown("memory", 2, False, 10) == pytest.approx(1.0)  # held below the smallest
    assert parts.slowdown("memory", 2, False, 1e12) == pytest.approx(2.0)  # and above the largest
    assert parts.slowdown("memory", 2, True, 1e9) == pytest.approx(5.0)  # the one with-collective point
    assert parts.slowdown("gemm", 2) == pytest.approx(1.5)
    assert parts.slowdown("gemm", 1) == 1.0  # one rank: no one to contend with
    assert parts.slowdown("gemm", 4) == 1.0  # not measured for 4 ranks: none applied
    assert parts.slowdown("dispatch", 2) == 1.0


def _tiny(strategy: str, nproc: int):
    from planner.calibrate.config import scaled_model
    from planner.calibrate.predict import StepConfig
    from planner.io.loading import load_model

    spec = scaled_model(load_model("gpt2"), layers=1, hidden=8, heads=2, ffn=16, vocab=10, kv_heads=None)
    return StepConfig(name="t", model=spec, seq_len=4, micro_batch=1, strategy=strategy, nproc=nproc)


def _uniform(quiet: float, loaded: float, backend: str = "gloo"):
    points = tuple(_point(kind, s, with_collective=wc) for kind in ("gemm", "memory", "dispatch")
                   for wc, s in ((False, quiet), (True, loaded)))
    return _parts().model_copy(update={"contention": points, "backend": backend})


def test_contention_multiplies_compute_and_optimizer_on_gloo() -> None:
    from planner.calibrate.predict import optimizer_shard, predict_step

    cfg = _tiny("ddp", 2)
    bare = predict_step(cfg, _parts())
    slow = predict_step(cfg, _uniform(2.0, 3.0))
    alone = bare.gemm_s + bare.memory_bound_s + bare.dispatch_s
    assert bare.compute_contention_s == 0.0 and bare.optimizer_contention_s == 0.0
    # gloo: no share of compute is counted as overlapped, so every compute term at x2 (not x3)
    assert slow.compute_s == pytest.approx(2 * alone, rel=1e-12)
    assert slow.compute_contention_s == pytest.approx(alone, rel=1e-12)
    # Adam by hand: 8888 elements (test_calibrate_hardware's count), 1e-5 s per tensor + 4e-9 s
    # per element, then x2 for the two ranks stepping at once
    tensors, elements = optimizer_shard(cfg)
    assert elements == 8888
    assert slow.optimizer_s == pytest.approx(2 * (1e-5 * tensors + 4e-9 * 8888), rel=1e-12)
    assert slow.communication_s == bare.communication_s == pytest.approx(117.776e-6, rel=1e-9)
    # one process: nobody to contend with
    single = predict_step(_tiny("single", 1), _uniform(2.0, 3.0))
    assert single.compute_contention_s == 0.0 and single.optimizer_contention_s == 0.0


def test_a_block_point_times_forward_and_backward_at_its_one_slowdown() -> None:
    """With the fixed probe model's point (`block`), forward + backward are timed at its slowdown
    (x1.1 here) whatever the per-kind probes read (x2 here); the engine's copies and the
    optimizer step keep the copy probe's (x2): the ranks stream memory there in lockstep."""
    from planner.calibrate.predict import compute_seconds, engine_copy_seconds, inventory, optimizer_shard, predict_step

    cfg = _tiny("ddp", 2)
    bare = predict_step(cfg, _parts())
    alone = bare.gemm_s + bare.memory_bound_s + bare.dispatch_s
    # DDP's two gradient copies per bucket (alone) are part of memory_bound_s; the rest is the
    # forward + backward of the inventory
    copies = engine_copy_seconds(cfg, _parts())
    forward_backward = sum(compute_seconds(inventory(cfg.model, cfg.seq_len, cfg.micro_batch), _parts()))
    assert copies > 0 and forward_backward + copies == pytest.approx(alone, rel=1e-12)
    uniform = _uniform(2.0, 3.0)
    parts = uniform.model_copy(update={"contention": (*uniform.contention, _point("block", 1.1),
                                                      _point("block", 1.5, with_collective=True))})
    slow = predict_step(cfg, parts)
    assert slow.compute_s == pytest.approx(1.1 * forward_backward + 2 * copies, rel=1e-12)
    assert slow.compute_contention_s == pytest.approx(0.1 * forward_backward + copies, rel=1e-9)
    tensors, _ = optimizer_shard(cfg)
    assert slow.optimizer_s == pytest.approx(2 * (1e-5 * tensors + 4e-9 * 8888), rel=1e-12)
    # an older parts file (no block point) keeps the per-kind slowdowns: x2 on gloo
    assert predict_step(cfg, uniform).compute_s == pytest.approx(2 * alone, rel=1e-12)
    assert parts.has_contention("block", 2) and not uniform.has_contention("block", 2)
    assert not parts.has_contention("block", 1)  # one rank: nothing to contend with


def test_nccl_counts_the_overlapped_share_at_the_with_collective_slowdown() -> None:
    from planner.calibrate.predict import predict_step

    cfg = _tiny("ddp", 2)
    bare = predict_step(cfg, _parts())
    alone = bare.gemm_s + bare.memory_bound_s + bare.dispatch_s
    slow = predict_step(cfg, _uniform(2.0, 3.0, backend="nccl"))
    # share = min(1, backward communication / compute at x2) = 117.776 µs / (2 · alone);
    # compute = (1 - share) · 2 · alone + share · 3 · alone
    share = min(1.0, 117.776e-6 / (2 * alone))
    assert 0 < share < 1
    assert slow.compute_s == pytest.approx((1 - share) * 2 * alone + share * 3 * alone, rel=1e-9)


def test_log_softmax_has_its_own_curves_and_old_parts_fall_back_to_softmax() -> None:
    import torch

    from planner.calibrate.hardware import _kernel
    from planner.calibrate.predict import _kind

    assert _kind("_log_softmax") == "log_softmax"
    assert _kind("_log_softmax_backward_data") == "log_softmax_backward"
    assert _kind("_softmax") == "softmax"
    # bytes: the forward reads the input and writes the output (2 · 2048 · 4); the backward reads
    # the gradient and the output and writes the input gradient (3 · 2048 · 4)
    assert _kernel("log_softmax", 2048, torch.device("cpu"))[1] == 16384
    assert _kernel("log_softmax_backward", 2048, torch.device("cpu"))[1] == 24576
    old = _parts()  # measured before the log-softmax curves existed
    assert old.kernel("log_softmax") == old.kernel("softmax")
    new = old.model_copy(update={"kernels": (*old.kernels, KernelCurve(
        kind="log_softmax", bytes_moved=(1.0, 2.0), times_s=(1.0, 2.0)))})
    assert new.kernel("log_softmax").times_s == (1.0, 2.0)


def _probe_worker(rank: int, store: str) -> None:
    import torch
    import torch.distributed as dist

    from planner.calibrate.contention import measure_contention

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}/store", rank=rank, world_size=2)
    try:
        points = measure_contention(torch.device("cpu"), dist.group.WORLD, copy_max_bytes=256 * 2**10,
                                    phase_budget_s=0.03)
        if rank == 0:
            Path(store, "points.json").write_text(json.dumps([p.model_dump() for p in points]))
    finally:
        dist.destroy_process_group()


def test_contention_probes_run_on_two_gloo_processes() -> None:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="zplan-test-cont-") as store:
        mp.spawn(_probe_worker, args=(store,), nprocs=2, join=True)
        points = [ContentionPoint.model_validate(p) for p in json.loads(Path(store, "points.json").read_text())]
    # one GEMM, one copy (256 KiB: the only size within copy_max_bytes), the dispatch loop, each
    # quiet and with an all-reduce in flight; the fixed model's forward + backward quiet only on
    # gloo (the predictor reads a with-collective slowdown only on NCCL)
    assert [(p.kind, p.with_collective) for p in points] == [
        ("gemm", False), ("gemm", True), ("memory", False), ("memory", True), ("dispatch", False), ("dispatch", True),
        ("block", False)]
    assert points[6].probe == "forward + backward of GPT-2 4 x 512, sequence 128, micro-batch 2"
    assert all(p.ranks == 2 and len(p.alone_s) == len(p.together_s) == 2 for p in points)
    assert all(t > 0 for p in points for t in (*p.alone_s, *p.together_s))
    assert points[2].bytes_moved == 2 * 256 * 2**10  # read + written
    assert points[0].probe == "float32 GEMM 512x512 @ 512x512"
    assert points[1].collective.startswith("all_reduce of 16 MiB")
