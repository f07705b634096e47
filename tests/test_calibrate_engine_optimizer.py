"""The engine optimizer-step part (planner/calibrate/engine_optimizer.py): the fit, the
predictor's use of it, and the probe on two real gloo ranks."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from test_calibrate_hardware import _parts

from planner.calibrate.config import scaled_model
from planner.calibrate.engine_optimizer import EngineOptimizerFit
from planner.calibrate.fits import OptimizerFit, fit_optimizer
from planner.calibrate.predict import (StepConfig, communication_seconds, optimizer_seconds, param_sizes,
                                       predict_step)
from planner.io.loading import load_model

SHAPES = ((2, 1000), (8, 1000), (8, 500), (64, 16), (256, 16))


def test_fit_recovers_synthetic_latency_per_tensor_and_per_element() -> None:
    # t = 0.2 ms + 0.3 ms per tensor + 4 ns per element, e.g. (8, 500): 0.2 + 2.4 + 0.016 = 2.616 ms
    times = [2e-4 + 3e-4 * c + 4e-9 * c * n for c, n in SHAPES]
    assert times[2] == pytest.approx(2.616e-3)
    fit = fit_optimizer(SHAPES, times)
    assert fit.latency_s == pytest.approx(2e-4, rel=1e-6)
    assert fit.per_tensor_s == pytest.approx(3e-4, rel=1e-6)
    assert fit.per_element_s == pytest.approx(4e-9, rel=1e-6)


# GPT-2 at 2 x 64 (4 heads, ffn 256, vocab 128), by hand: per block Q, K, V, O 4 x 64 x 64 = 16,384
# + 4 biases of 64; fc1 256 x 64 = 16,384 + 256; fc2 64 x 256 = 16,384 + 64; two LayerNorms
# 4 x 64 = 256 -> 49,984 elements in 16 tensors. Outside: word 128 x 64 = 8,192, position
# 1,024 x 64 = 65,536 (GPT-2's n_positions), final norm 2 x 64 -> 73,856 in 4 tensors.
TENSORS = 2 * 16 + 4
ELEMENTS = 2 * 49_984 + 73_856


def _model():
    return scaled_model(load_model("gpt2"), layers=2, hidden=64, heads=4, ffn=256, vocab=128, kv_heads=None)


def _with_engines(parts):
    fits = tuple(EngineOptimizerFit(engine=e, ranks=2, shapes=SHAPES, times_s=(1.0,) * len(SHAPES), fit=f)
                 for e, f in (("zero1", OptimizerFit(latency_s=1e-3, per_tensor_s=1e-3, per_element_s=4e-9)),
                              ("fsdp2", OptimizerFit(latency_s=0.0, per_tensor_s=3e-4, per_element_s=1e-9))))
    return parts.model_copy(update={"engine_optimizers": fits})


def test_hand_counted_parameter_list() -> None:
    sizes = param_sizes(_model(), 32)
    assert (len(sizes), sum(sizes)) == (TENSORS, ELEMENTS) == (36, 173_824)


def test_zero1_and_fsdp2_steps_use_the_part_at_the_whole_lists_totals() -> None:
    parts = _with_engines(_parts())
    zero1 = StepConfig(name="z", model=_model(), seq_len=32, micro_batch=1, strategy="zero1", nproc=2)
    fsdp2 = zero1.model_copy(update={"strategy": "fsdp2"})
    # ZeRO-1: 1 ms + 36 x 1 ms + 173,824 x 4 ns = 37 ms + 0.695296 ms = 37.695296 ms
    assert optimizer_seconds(zero1, parts, 2) == pytest.approx(37.695296e-3)
    # FSDP2: 36 x 0.3 ms + 173,824 x 1 ns = 10.8 ms + 0.173824 ms = 10.973824 ms
    assert optimizer_seconds(fsdp2, parts, 2) == pytest.approx(10.973824e-3)
    pred = predict_step(zero1, parts)
    assert pred.optimizer_s == pytest.approx(37.695296e-3) and pred.optimizer_contention_s == 0.0


def test_zero1_broadcasts_leave_the_communication_term_only_with_the_part() -> None:
    plain, with_part = _parts(), _with_engines(_parts())
    cfg = StepConfig(name="z", model=_model(), seq_len=32, micro_batch=1, strategy="zero1", nproc=2)
    # send/recv of the test parts: 100 us + bytes / 2 GB/s, one per parameter tensor (fp32):
    # 36 x 100 us + 173,824 x 4 B / 2e9 B/s = 3.6 ms + 0.347648 ms
    broadcasts = 36 * 100e-6 + 173_824 * 4 / 2e9
    assert communication_seconds(cfg, plain) - communication_seconds(cfg, with_part) == pytest.approx(broadcasts)
    ddp = cfg.model_copy(update={"strategy": "ddp"})  # DDP: Adam part as before, no engine part
    assert optimizer_seconds(ddp, with_part, 2) == optimizer_seconds(ddp, plain, 2)


def _probe_worker(rank: int, store: str) -> None:
    import torch
    import torch.distributed as dist

    from planner.calibrate.collectives import close
    from planner.calibrate.engine_optimizer import measure

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}/s", rank=rank, world_size=2)
    finished = False
    try:
        fits = measure(dist.group.WORLD, torch.device("cpu"), shapes=SHAPES, reps=2)
        if rank == 0:
            Path(store, "fits.json").write_text("[" + ",".join(f.model_dump_json() for f in fits) + "]")
        finished = True
    finally:
        close(finished)


def test_probe_runs_both_engines_on_two_gloo_ranks() -> None:
    import json

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as store:
        mp.spawn(_probe_worker, args=(store,), nprocs=2, join=True)
        fits = [EngineOptimizerFit.model_validate(f) for f in json.loads(Path(store, "fits.json").read_text())]
    assert [(f.engine, f.ranks, len(f.times_s)) for f in fits] == [("zero1", 2, 5), ("fsdp2", 2, 5)]
    for f in fits:
        assert all(t > 0 for t in f.times_s)
        assert f.fit == fit_optimizer(f.shapes, f.times_s)
