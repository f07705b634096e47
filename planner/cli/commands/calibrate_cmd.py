"""`zplan calibrate`: run short real PyTorch training steps and compare them with the planner.

torch is optional: without it the command prints how to install it and exits 2. torch is imported
only inside the command body (directly, and through planner.calibrate.run / .distributed), never at
import time.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from planner.calibrate import INSTALL_HINT, torch_available
from planner.calibrate.config import (
    check_norm_impl,
    check_size,
    expand_recompute,
    run_specs,
    scaled_model,
)
from planner.cli.commands import _options as opt
from planner.cli.commands._common import EXIT_BAD_INPUT, input_errors_exit_2
from planner.core.errors import PlanInputError

_SCALE = "Scale the model down"
_RUN = "What to run"


def _int_opt(flag: str, text: str):
    return Annotated[int | None, typer.Option(flag, min=1, help=text, rich_help_panel=_SCALE)]


@input_errors_exit_2
def calibrate(
    model: opt.ModelOpt,
    layers: _int_opt("--layers", "Transformer blocks.") = None,
    hidden: _int_opt("--hidden", "Hidden size (head size becomes hidden/heads).") = None,
    heads: _int_opt("--heads", "Query heads.") = None,
    kv_heads: _int_opt("--kv-heads", "Key/value heads (GQA).") = None,
    ffn: _int_opt("--ffn", "MLP inner width.") = None,
    vocab: _int_opt("--vocab", "Vocabulary size.") = None,
    seq_len: Annotated[int, typer.Option("--seq-len", min=1, help="Tokens per sequence.", rich_help_panel=_SCALE)] = 64,
    micro_batch: Annotated[int, typer.Option("--micro-batch", min=1, help="Sequences per step.", rich_help_panel=_SCALE)] = 2,
    precision: Annotated[list[str], typer.Option("--precision", help="Precision recipe (repeatable): fp32, bf16-mixed, megatron-bf16, zero-fp16, zero-infinity-fp16.", rich_help_panel=_RUN)] = ["fp32"],  # noqa: B006
    optimizer: Annotated[str, typer.Option("--optimizer", help="adam, adamw, sgd-momentum, sgd.", rich_help_panel=_RUN)] = "adam",
    recompute: Annotated[list[str], typer.Option("--recompute", help="none, full, every_k, selective or all (repeatable).", rich_help_panel=_RUN)] = ["none"],  # noqa: B006
    every_k: Annotated[int, typer.Option("--every-k", min=1, help="Blocks per checkpointed segment for every_k.", rich_help_panel=_RUN)] = 2,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Timed training steps (after warm-up).", rich_help_panel=_RUN)] = 3,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed warm-up steps.", rich_help_panel=_RUN)] = 1,
    device: Annotated[str, typer.Option("--device", help="auto (CUDA if present), cpu, cuda, cuda:N.", rich_help_panel=_RUN)] = "auto",
    early_stop: Annotated[bool, typer.Option("--early-stop/--no-early-stop", help="torch checkpoint early stop (torch's default) or re-run whole segments as Megatron does.", rich_help_panel=_RUN)] = False,
    norm_impl: Annotated[str, typer.Option("--norm-impl", help="fused: norms save what the engines' fused kernels save (input + fp32 statistics; Apex / Transformer Engine, torch's CUDA kernel); torch: torch's own norm ops (on the CPU a composite RMSNorm keeping two fp32 copies of the input, bf16 LayerNorm statistics under bf16).", rich_help_panel=_RUN)] = "fused",
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="Also run DDP / ZeRO-1 / FSDP2 on N local processes (gloo on CPU, NCCL on CUDA).", rich_help_panel=_RUN)] = 1,
    max_params: Annotated[float, typer.Option("--max-params", help="Refuse models larger than this.", rich_help_panel=_RUN)] = 3e8,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU profile the run is on: names the calibration entries and gives the peak FLOP/s.")] = None,
    peak_tflops: Annotated[float | None, typer.Option("--peak-tflops", min=0, help="Dense peak TFLOP/s of this device (instead of --gpu's profile), e.g. for a CPU.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write a calibration file (YAML) for `fit/sweep --calibration`; appends to an existing one.")] = None,
    profiles: opt.ProfilesOpt = None,
    json_out: opt.JsonOpt = False,
) -> None:
    """Train a (scaled-down) model for a few steps with real PyTorch and report predicted vs
    measured: parameters, model-state bytes, saved activations, FLOPs, step time."""
    if not torch_available():
        print(f"zplan: error: {INSTALL_HINT}", file=sys.stderr)
        raise typer.Exit(EXIT_BAD_INPUT)
    from planner.io.loading import load_model

    dirs = opt.extra_dirs(profiles)
    spec = scaled_model(load_model(model, dirs), layers=layers, hidden=hidden, heads=heads,
                        kv_heads=kv_heads, ffn=ffn, vocab=vocab)
    check_size(spec, max_params)
    check_norm_impl(norm_impl)
    runs = run_specs(spec, seq_len, micro_batch, precision, optimizer, expand_recompute(recompute), every_k)
    if gpu is not None and _runs_on_cpu(device):
        raise PlanInputError("gpu", f"--gpu {gpu} names the GPU this run is on, but it runs on the CPU; "
                             "use --peak-tflops for a CPU peak")
    peak = _peak_flops_per_s(gpu, peak_tflops, runs, dirs)
    results = _run_with_progress(runs, steps, warmup, device, early_stop, norm_impl, quiet=json_out)
    distributed = None
    if nproc > 1:
        from planner.calibrate.distributed import run_distributed

        distributed = run_distributed(spec, seq_len, micro_batch, nproc, device)
    calibration = _write_calibration(results, gpu, peak, out, _one_gpu_cluster(gpu, dirs))
    _render(results, calibration, distributed, out, json_out)


def _runs_on_cpu(device: str) -> bool:
    import torch

    return device == "cpu" or (device == "auto" and not torch.cuda.is_available())


def _peak_flops_per_s(gpu, peak_tflops, runs, dirs) -> float | None:
    """--peak-tflops, else the --gpu profile's dense peak for the runs' dtype, else unknown."""
    from planner.io.loading import load_gpu

    if peak_tflops:
        return peak_tflops * 1e12
    if gpu is None:
        return None
    dtypes = {r.setup.precision.compute_dtype for r in runs}
    if len(dtypes) > 1:
        raise PlanInputError("precision", "with --gpu, run one compute dtype at a time (the peak differs)")
    profile = load_gpu(gpu, dirs)
    try:
        return profile.peak_flops_per_s(dtypes.pop())
    except ValueError as err:
        raise PlanInputError("gpu", str(err)) from None


def _one_gpu_cluster(gpu, dirs):
    """One GPU of the --gpu profile, as `zplan fit --gpu NAME --gpus 1` builds it: the hardware the
    step-time model is inverted on. None without --gpu, or when no node profile uses the GPU (the
    calibration entries then fall back to the whole-step figure, flagged in their note)."""
    if gpu is None:
        return None
    from planner.io.loading import cluster_for_gpus

    try:
        return cluster_for_gpus(gpu, 1, dirs)
    except PlanInputError:
        return None


def _run_with_progress(runs, steps, warmup, device, early_stop, norm_impl, quiet: bool):
    from rich.progress import Progress

    from planner.calibrate.run import run_all
    from planner.cli.report import human_console

    with Progress(console=human_console(), transient=True, disable=quiet or len(runs) == 1) as progress:
        task = progress.add_task("calibrating", total=len(runs))
        return run_all(runs, steps, warmup, device, early_stop,
                       on_done=lambda _result: progress.advance(task), norm_impl=norm_impl)


def _write_calibration(results, gpu, peak, out, cluster):
    import torch

    from planner.calibrate.results import build_calibration
    from planner.io.calibration import (
        load_calibration,
        merge_calibrations,
        write_calibration,
    )

    name = gpu or results[0].measured.device  # `cpu` or the CUDA device name
    created = datetime.now(UTC).isoformat(timespec="seconds")
    calibration = build_calibration(results, name, peak, created, torch.__version__, cluster)
    if out is not None:
        if out.exists():
            calibration = merge_calibrations(load_calibration(out), calibration)
        write_calibration(calibration, out)
    return calibration


def _render(results, calibration, distributed, out, json_out: bool) -> None:
    from planner.cli.report import calibrate as report

    if json_out:
        report.render_json(results, calibration, distributed)
    else:
        report.render_human(results, str(out) if out else None, calibration)
        if distributed is not None:
            report.render_distributed(distributed)


def register(app: typer.Typer) -> None:
    """Add `zplan calibrate` to the app."""
    app.command("calibrate")(calibrate)
