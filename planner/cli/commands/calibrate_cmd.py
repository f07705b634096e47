"""`zplan calibrate`: run short real PyTorch training steps and compare them with the planner
(`zplan calibrate model`, also what `zplan calibrate --model ...` runs), or measure this
machine's hardware and write a calibrated profile (`zplan calibrate hardware`).

torch is optional: without it the command prints how to install it and exits 2. torch is imported
only inside the command body (directly, and through planner.calibrate.run / .distributed), never at
import time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from planner.calibrate import INSTALL_HINT, torch_available
from planner.calibrate.config import (
    check_norm_impl,
    check_nproc_devices,
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
    model: opt.ModelOrNoneOpt = None,
    hf_config: Annotated[Path | None, typer.Option("--hf-config", help="A Hugging Face config.json (or its directory): build that model with transformers (no download) at --layers blocks (default 2) on the CPU and at full size on the meta device, and compare saved activations, parameters and FLOPs with the implementation inventory. Instead of --model.", rich_help_panel=_RUN)] = None,
    attention: Annotated[str, typer.Option("--attention", help="With --hf-config: sdpa, eager, or flash-meta / efficient-meta / cudnn-meta (the CUDA kernels' saves on the meta device).", rich_help_panel=_RUN)] = "sdpa",
    layers: _int_opt("--layers", "Transformer blocks.") = None,
    hidden: _int_opt("--hidden", "Hidden size (head size becomes hidden/heads).") = None,
    heads: _int_opt("--heads", "Query heads.") = None,
    kv_heads: _int_opt("--kv-heads", "Key/value heads (GQA).") = None,
    ffn: _int_opt("--ffn", "MLP inner width.") = None,
    vocab: _int_opt("--vocab", "Vocabulary size.") = None,
    seq_len: Annotated[int, typer.Option("--seq-len", min=1, help="Tokens per sequence.", rich_help_panel=_SCALE)] = 64,
    micro_batch: Annotated[int, typer.Option("--micro-batch", min=1, help="Sequences per step.", rich_help_panel=_SCALE)] = 2,
    precision: Annotated[list[str] | None, typer.Option("--precision", help="Precision recipe (repeatable): fp32 (default), bf16-mixed, megatron-bf16, zero-fp16, zero-infinity-fp16. With --hf-config: fp32, bf16, fp16, autocast-bf16, autocast-fp16 (default bf16 and autocast-bf16).", rich_help_panel=_RUN)] = None,
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
    if hf_config is not None:
        if model is not None:
            raise PlanInputError("hf_config", "give --model or --hf-config, not both")
        _calibrate_hf(hf_config, attention, seq_len, micro_batch, precision, layers, json_out)
        return
    if model is None:
        raise PlanInputError("model", "give --model NAME (a preset, YAML or config.json) or --hf-config PATH")
    precision = precision or ["fp32"]
    _check_devices(nproc, device)
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
    with _within_memory():
        results = _run_with_progress(runs, steps, warmup, device, early_stop, norm_impl, quiet=json_out)
    distributed = None
    if nproc > 1:
        from planner.calibrate.distributed import run_distributed

        distributed = run_distributed(spec, seq_len, micro_batch, nproc, device)
    calibration = _write_calibration(results, gpu, peak, out, _one_gpu_cluster(gpu, dirs))
    _render(results, calibration, distributed, out, json_out)


def _check_devices(nproc: int, device: str) -> None:
    """`--nproc N` under a CUDA request needs N CUDA devices (config.check_nproc_devices)."""
    import torch

    available = torch.cuda.is_available()
    check_nproc_devices(nproc, device, available, torch.cuda.device_count() if available else 0,
                        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def _calibrate_hf(path: Path, attention: str, seq_len: int, micro_batch: int,
                  precision: list[str] | None, layers: int | None, json_out: bool) -> None:
    """`zplan calibrate --hf-config`: planner.calibrate.hf_run on the user's config.json."""
    from planner.calibrate.hf_run import calibrate_hf, render
    from planner.cli.report import calibrate as report

    kwargs = {"precisions": tuple(precision)} if precision else {}
    with _within_memory():
        rows = calibrate_hf(path, seq_len=seq_len, micro_batch=micro_batch, attention=attention,
                            cpu_layers=layers or 2, **kwargs)
    if json_out:
        report.render_hf_json(str(path), rows)
    else:
        print(render(rows))


@contextmanager
def _within_memory() -> Iterator[None]:
    """A run that asks the device for more memory than it has is a configuration this machine
    cannot take, not a bug in zplan: one line naming the allocation, exit 2 (it was an
    "internal error", exit 3). torch's CPU allocator raises a RuntimeError "can't allocate
    memory", CUDA `torch.OutOfMemoryError` (a RuntimeError), Python a MemoryError."""
    try:
        yield
    except (MemoryError, RuntimeError) as err:
        text = str(err)
        if not (isinstance(err, MemoryError) or "can't allocate memory" in text
                or "out of memory" in text.lower()):
            raise
        first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
        raise PlanInputError("memory", f"the run needs more memory than this device has ({first}); "
                             "give a smaller --seq-len, --micro-batch, --grid or model") from None


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
    from planner.io.calibration import append_calibration

    name = gpu or results[0].measured.device  # `cpu` or the CUDA device name
    created = datetime.now(UTC).isoformat(timespec="seconds")
    calibration = build_calibration(results, name, peak, created, torch.__version__, cluster)
    if out is not None:  # locked and atomic: concurrent runs appending to one file lose nothing
        calibration = append_calibration(calibration, out)
    return calibration


def _render(results, calibration, distributed, out, json_out: bool) -> None:
    from planner.cli.report import calibrate as report

    if json_out:
        report.render_json(results, calibration, distributed)
    else:
        report.render_human(results, str(out) if out else None, calibration)
        if distributed is not None:
            report.render_distributed(distributed)


_HW = "What to measure"
_OUT = "Output"


def _torchrun_or_none():
    from planner.calibrate.collectives import torchrun_env

    return torchrun_env()


@input_errors_exit_2
def hardware(
    device: Annotated[str, typer.Option("--device", help="auto (CUDA if present), cpu, cuda, cuda:N.", rich_help_panel=_HW)] = "auto",
    dtype: Annotated[list[str] | None, typer.Option("--dtype", help="GEMM dtype (repeatable): fp32, bf16, fp16. Default: fp32 on a CPU, bf16 and fp32 on CUDA.", rich_help_panel=_HW)] = None,
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="Local processes for the collectives and the distributed steps (ignored under torchrun).", rich_help_panel=_HW)] = 2,
    threads: Annotated[int | None, typer.Option("--threads-per-rank", min=1, help="torch threads per rank (CPU default: cores / ranks per node).", rich_help_panel=_HW)] = None,
    grid: Annotated[str | None, typer.Option("--grid", help="GEMM sizes for m, n and k, comma-separated (CPU default 32,128,512,2048; CUDA 256,1024,4096,16384).", rich_help_panel=_HW)] = None,
    max_message_bytes: Annotated[int, typer.Option("--max-message-bytes", min=1, help="Largest collective message (1 KiB upwards x4). CPU default 64 MiB; use 2**30 on GPUs.", rich_help_panel=_HW)] = 64 * 2**20,
    kernel_max_bytes: Annotated[int | None, typer.Option("--kernel-max-bytes", min=1, help="Largest memory-bound kernel input (4 KiB upwards x4); default 256 MiB on a CPU, 4 GiB on CUDA.", rich_help_panel=_HW)] = None,
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=0.001, help="A collective not done within this is an error (exit 2).", rich_help_panel=_HW)] = 300.0,
    nvme_path: Annotated[Path | None, typer.Option("--nvme-path", help="Directory on the NVMe / file system to time a file write (fsync) and read on.", rich_help_panel=_HW)] = None,
    nvme_bytes: Annotated[int, typer.Option("--nvme-bytes", min=1, help="Size of that file.", rich_help_panel=_HW)] = 256 * 2**20,
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU profile whose peak_tflops the GEMM efficiencies are fractions of (default: the best measured throughput).", rich_help_panel=_HW)] = None,
    peak_tflops: Annotated[float | None, typer.Option("--peak-tflops", min=0, help="Dense peak TFLOP/s of this device, for every --dtype.", rich_help_panel=_HW)] = None,
    clock: Annotated[str, typer.Option("--clock", help="wall, or thread: each rank's CPU time (a shared CPU machine; one thread per rank).", rich_help_panel=_HW)] = "wall",
    predict: Annotated[bool, typer.Option("--predict/--no-predict", help="Then predict and measure held-apart training steps (DDP, ZeRO-1, FSDP2; CPU only).", rich_help_panel=_HW)] = True,
    name: Annotated[str | None, typer.Option("--name", help="Profile name (default: device and host).", rich_help_panel=_OUT)] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Profiles directory: writes/merges gpus/NAME.yaml, nodes/NAME-nodeN.yaml (and clusters/ under torchrun with >= 2 nodes); use it with --profiles.", rich_help_panel=_OUT)] = None,
    profiles: opt.ProfilesOpt = None,
    json_out: opt.JsonOpt = False,
    stall_rank: Annotated[int | None, typer.Option("--stall-rank", hidden=True)] = None,
    stall_s: Annotated[float, typer.Option("--stall-s", hidden=True)] = 0.0,
) -> None:
    """Measure this machine: GEMMs by shape, memory-bound kernels, the optimizer, collectives
    (alpha-beta, nccl-tests bus bandwidth), host<->device and file I/O; write a calibrated
    profile; predict held-apart training steps from the parts and measure them."""
    if not torch_available():
        print(f"zplan: error: {INSTALL_HINT}", file=sys.stderr)
        raise typer.Exit(EXIT_BAD_INPUT)
    from planner.calibrate.hardware_run import HardwareConfig

    env = _torchrun_or_none()
    if env is None:  # under torchrun each rank has its own device; --nproc is ignored
        _check_devices(nproc, device)
    if gpu is not None and _runs_on_cpu(device):
        raise PlanInputError("gpu", f"--gpu {gpu} gives a GPU's peak, but this run is on the CPU; "
                             "use --peak-tflops for a CPU peak, or neither (the best measured GEMM)")
    cfg = HardwareConfig(
        device=device, dtypes=tuple(dtype or _default_dtypes(device)), gemm_grid=_grid(grid), nproc=nproc,
        threads_per_rank=threads, max_message_bytes=max_message_bytes, kernel_max_bytes=kernel_max_bytes, timeout_s=timeout_s,
        file_path=nvme_path, file_bytes=nvme_bytes, clock=clock, stall_rank=stall_rank, stall_s=stall_s,
        **_peaks(gpu, peak_tflops, dtype or _default_dtypes(device), opt.extra_dirs(profiles)))
    with _within_memory():
        parts = _measure(cfg, env, quiet=json_out)
    if parts is None:  # a torchrun rank other than 0
        return
    written = _write(parts, out, name)
    steps = _predict(parts, nproc) if predict and parts.device == "cpu" and env is None else []
    _render_hardware(parts, written, steps, json_out)


def _default_dtypes(device: str) -> list[str]:
    import torch

    on_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return ["bf16", "fp32"] if on_cuda else ["fp32"]


def _grid(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        sizes = tuple(sorted({int(v) for v in text.split(",")}))
    except ValueError:
        raise PlanInputError("grid", f"{text!r}: comma-separated whole numbers, e.g. 64,256,1024") from None
    if len(sizes) < 2 or sizes[0] < 1:
        raise PlanInputError("grid", f"{text!r}: at least two positive sizes")
    return sizes


def _peaks(gpu, peak_tflops, dtypes, dirs) -> dict:
    """The peak each dtype's efficiencies are fractions of: --peak-tflops, --gpu's profile, or none."""
    if peak_tflops:
        return {"peak_flops_per_s": {d: peak_tflops * 1e12 for d in dtypes},
                "peak_source": f"--peak-tflops {peak_tflops:g} given by the user"}
    if gpu is None:
        return {}
    from planner.io.loading import load_gpu

    profile = load_gpu(gpu, dirs)
    peaks = {d: profile.peak_flops_per_s(d) for d in dtypes if d in profile.peak_tflops}
    return {"peak_flops_per_s": peaks,
            "peak_source": f"peak_tflops of the {gpu} profile: {profile.sources.get('peak_tflops', '')}"}


def _measure(cfg, env, quiet: bool):
    from rich.progress import Progress

    from planner.calibrate.hardware_run import calibrate_local, calibrate_torchrun, pick, total_ticks
    from planner.cli.report import human_console

    show = not quiet and (env is None or env["RANK"] == 0)
    with Progress(console=human_console(), transient=True, disable=not show) as progress:
        task = progress.add_task("device parts", total=total_ticks(cfg, pick(cfg.device) if env is None else
                                                                   _env_device(cfg, env)))

        def tick(what: str) -> None:
            progress.update(task, advance=1, description=f"device parts: {what}")

        if env is None:
            return calibrate_local(cfg, tick)
        return calibrate_torchrun(cfg, env, tick)


def _env_device(cfg, env):
    import torch

    on_cuda = cfg.device != "cpu" and torch.cuda.is_available()
    return torch.device("cuda", env["LOCAL_RANK"]) if on_cuda else torch.device("cpu")


def _write(parts, out: Path | None, name: str | None) -> list[str]:
    if out is None:
        return []
    from planner.calibrate.profile_file import slug, write_profiles

    if out.exists() and not out.is_dir():
        raise PlanInputError("out", f"{out} is a file; --out takes a profiles directory")
    label = slug(name or f"{parts.device}-{parts.host}")
    memory = parts.cpu_memory_bytes if parts.device == "cpu" else _device_memory_bytes()
    return [str(p) for p in write_profiles(parts, out, label, memory)]


def _device_memory_bytes() -> int:
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory


def _predict(parts, nproc: int) -> list[dict]:
    from rich.progress import Progress

    from planner.calibrate.heldout import step_configs
    from planner.calibrate.predict import predict_step
    from planner.calibrate.steps import measure_step
    from planner.cli.report import human_console
    from planner.io.loading import load_model

    configs = step_configs(load_model("gpt2"), nproc)
    rows = []
    with Progress(console=human_console(), transient=True) as progress:
        task = progress.add_task("held-apart steps", total=len(configs))
        for cfg in configs:
            predicted = predict_step(cfg, parts)
            measured = measure_step(cfg, parts.threads_per_rank, clock=parts.clock)
            rows.append({"config": cfg, "predicted": predicted, "measured": measured})
            progress.advance(task)
    return rows


def _render_hardware(parts, written, steps, json_out: bool) -> None:
    from planner.cli.report import calibrate_hardware as report

    if json_out:
        report.render_json(parts, written, steps)
    else:
        report.render_human(parts, written, steps)


class _ModelByDefault(TyperGroup):
    """`zplan calibrate --model ...` (no sub-command) keeps running `zplan calibrate model`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["model", *args]
        return super().parse_args(ctx, args)


def register(app: typer.Typer) -> None:
    """Add `zplan calibrate` (`model`, the default, and `hardware`) to the app."""
    group = typer.Typer(cls=_ModelByDefault, no_args_is_help=True, add_completion=False,
                        help="Real PyTorch runs: `model` (the default) checks the planner against a "
                             "training run; `hardware` measures this machine into a profile.")
    group.command("model")(calibrate)
    group.command("hardware")(hardware)
    app.add_typer(group, name="calibrate")
