"""One calibration run: build the model, train a few steps, measure everything the planner predicts."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils.checkpoint import set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from planner.calibrate.compare import class_rows, compare
from planner.calibrate.config import RunSpec
from planner.calibrate.measure import capture_saved
from planner.calibrate.models import build_model
from planner.calibrate.results import ConfigResult, Measured
from planner.calibrate.train import Trainer
from planner.core.spec import Layout, ModelSpec, TrainSetup


def pick_device(requested: str = "auto") -> torch.device:
    """`auto` = CUDA when available, else CPU."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def token_batch(model: ModelSpec, seq_len: int, micro_batch: int, device: torch.device, seed: int):
    """(tokens, next-token labels) of `micro_batch` random sequences, reproducible from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.vocab_size, (micro_batch, seq_len + 1), generator=gen).to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def run_configuration(model: ModelSpec, setup: TrainSetup, layout: Layout, steps: int = 3,
                      warmup: int = 1, device: str = "auto", seed: int = 0,
                      early_stop: bool = False, norm_impl: str = "fused") -> Measured:
    """Train `warmup + steps` steps on one micro-batch per step and measure; step 0 is instrumented.

    `early_stop` is torch's non-reentrant checkpoint option (torch default True): recomputation
    stops once every tensor backward needs exists again, so ops whose outputs nobody saved (the
    scores·V matmul of selective recompute, a block's last linear without dropout) are not re-run.
    False re-runs the whole checkpointed function, as Megatron's CheckpointFunction does.
    `norm_impl` (`planner.calibrate.config.NORM_IMPLS`): `fused` norms save what the engines'
    fused kernels save (input + fp32 statistics); `torch` runs torch's own norm ops.
    """
    dev = pick_device(device)
    torch.manual_seed(seed)
    net = build_model(model, setup.seq_len, layout.recompute, layout.recompute_every_k,
                      use_sdpa=dev.type == "cuda", norm_impl=norm_impl)
    trainer = Trainer(net, setup.precision, setup.optimizer, dev)
    net.train()
    tokens, labels = token_batch(model, setup.seq_len, layout.micro_batch, dev, seed)
    trainer.zero_grad()
    with set_checkpoint_early_stop(early_stop):
        with FlopCounterMode(display=False) as fwd:
            loss, saved = capture_saved(net, lambda: net(tokens, labels))
        with FlopCounterMode(display=False) as bwd:
            trainer.backward(loss)
        trainer.optimizer_step()
        step_time = _timed_steps(trainer, tokens, labels, steps, warmup, dev)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    flops = fwd.get_total_flops() + bwd.get_total_flops()
    layers = saved.by_layer()
    return Measured(
        device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        norm_impl=norm_impl,
        states=trainer.state_bytes(),
        saved_per_layer=[layers.get(i, {}) for i in range(model.num_layers)],
        saved_outside_layers=saved.outside_layers(),
        forward_flops=fwd.get_total_flops(), backward_flops=bwd.get_total_flops(),
        step_time_s=step_time, achieved_flops_per_s=flops / step_time if step_time > 0 else 0.0,
        peak_memory_bytes=peak,
    )


def _timed_steps(trainer: Trainer, tokens, labels, steps: int, warmup: int, dev: torch.device) -> float:
    """Mean seconds per step over `steps` steps after `warmup` untimed ones (the last step's
    gradients and optimizer state stay resident so the caller can measure them)."""
    def one_step() -> None:
        trainer.zero_grad()
        trainer.backward(trainer.model(tokens, labels))
        trainer.optimizer_step()

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(warmup):
        one_step()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        one_step()
    sync()
    return (time.perf_counter() - start) / max(steps, 1)


def run_all(runs: list[RunSpec], steps: int = 3, warmup: int = 1, device: str = "auto",
            early_stop: bool = False, on_done: Callable[[ConfigResult], None] | None = None,
            norm_impl: str = "fused") -> list[ConfigResult]:
    """Run every configuration and compare each with the planner; `on_done` after each (progress)."""
    results = []
    for spec in runs:
        measured = run_configuration(spec.model, spec.setup, spec.layout, steps, warmup, device,
                                     early_stop=early_stop, norm_impl=norm_impl)
        result = ConfigResult(
            label=spec.label, run=spec, measured=measured,
            rows=compare(spec.model, spec.setup, spec.layout, measured),
            classes=class_rows(spec.model, spec.setup, spec.layout, measured))
        results.append(result)
        if on_done is not None:
            on_done(result)
    return results
