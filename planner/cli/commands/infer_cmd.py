"""`zplan infer` (inference memory and speed bounds) and `zplan budget` (compute and scaling law)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.commands import _options as opt
from planner.cli.commands._common import EXIT_DOES_NOT_FIT, EXIT_FITS, input_errors_exit_2
from planner.core.errors import PlanInputError
from planner.core.limits import MAX_DAYS, MAX_GPU_HOURS, MAX_PARAMS, MIN_EFFICIENCY

WeightsOpt = Annotated[str, typer.Option("--weights", help="Weight dtype: fp32, bf16, fp16, fp8, int8, int4 (scales not counted).")]
KvDtypeOpt = Annotated[Optional[str], typer.Option("--kv-dtype", help="KV-cache dtype: fp32, fp16, bf16, fp8, int8 (default: the weights' float dtype, fp16 for int weights).")]


@input_errors_exit_2
def infer(
    model: opt.ModelOpt,
    gpu: opt.GpuOpt = None,
    tp: opt.TpOpt = None,
    batch: Annotated[int, typer.Option("--batch", help="Concurrent sequences.")] = 1,
    context: Annotated[Optional[int], typer.Option("--context", help="Tokens per sequence in the KV cache (default: the model's max_seq_len).")] = None,
    weights: WeightsOpt = "fp16",
    kv_dtype: KvDtypeOpt = None,
    flash_attention: opt.FlashAttentionOpt = None,
    efficiency: opt.EfficiencyOpt = None,
    prefill_chunk: Annotated[Optional[int], typer.Option("--prefill-chunk", min=1, help="Prompt tokens per forward pass (chunked prefill) (default: the whole prompt).")] = None,
    allow_long_context: Annotated[bool, typer.Option("--allow-long-context", help="Allow a context beyond the model's max_seq_len.")] = False,
    account: Annotated[str, typer.Option("--account", help="serving: a serving engine's budget (vLLM: utilisation × CUDA-reported memory, runtime reserve, activation peak of the largest batched step); seed: weights + 20 % (seed 004 §2.3.2).")] = "serving",
    memory_utilisation: Annotated[Optional[float], typer.Option("--gpu-memory-utilization", help="serving: fraction of the GPU's memory the engine may use (default: 0.9, vLLM's).")] = None,
    max_batched_tokens: Annotated[Optional[int], typer.Option("--max-batched-tokens", help="serving: tokens of the largest batched step (default: 8192, vLLM's max_num_batched_tokens).")] = None,
    reserve: opt.ReserveOpt = None,
    profiles: opt.ProfilesOpt = None,
    json_out: opt.JsonOpt = False,
) -> int:
    """Inference memory per GPU (weights, KV cache, activation peak, runtime reserve), the
    largest batch and context that fit, the smallest tp, and roofline bounds on
    time-to-first-token and tokens/s.

    Exit 0 fits, 1 does not fit, 2 bad input.
    """
    from planner.memory.infer import KV_BYTES, WEIGHT_BITS, InferConfig, default_compute_dtype, plan_inference
    from planner.io.loading import load_gpu
    from planner.cli.report.infer import render_infer

    if gpu is None:
        raise PlanInputError("--gpu", "give the GPU to serve on, e.g. --gpu a100-80gb")
    tp = tp if tp is not None else 1
    flash_attention = flash_attention if flash_attention is not None else True
    spec = opt.resolve_model(model, profiles)
    gpu_spec = load_gpu(gpu, opt.extra_dirs(profiles))
    weights = _choice("--weights", weights, tuple(WEIGHT_BITS))
    dtype = default_compute_dtype(weights)
    cfg = InferConfig(
        batch=batch, context=context if context is not None else spec.max_seq_len, tp=tp,
        weights=weights, kv_dtype=_choice("--kv-dtype", kv_dtype or _kv_default(dtype), tuple(KV_BYTES)),
        activation_bytes=4 if dtype == "fp32" else 2, flash_attention=flash_attention,
        allow_long_context=allow_long_context, prefill_chunk=prefill_chunk,
        account=_choice("--account", account, ("serving", "seed")),
        memory_utilisation=_fraction("--gpu-memory-utilization", memory_utilisation),
        max_batched_tokens=_positive("--max-batched-tokens", max_batched_tokens),
        reserve_override_bytes=_reserve_bytes(reserve),
    )
    plan = plan_inference(spec, gpu_spec, cfg, efficiency=efficiency)
    render_infer(plan, json_out)
    return EXIT_FITS if plan.memory.fits else EXIT_DOES_NOT_FIT


def _kv_default(compute_dtype: str) -> str:
    """KV cache in the compute dtype; fp8 compute keeps a 16-bit cache unless --kv-dtype fp8."""
    return "fp16" if compute_dtype == "fp8" else compute_dtype


def _fraction(field: str, value: Optional[float]) -> float:
    from planner.memory.infer import DEFAULT_MEMORY_UTILISATION

    if value is None:
        return DEFAULT_MEMORY_UTILISATION
    if not 0 < value <= 1:
        raise PlanInputError(field, f"must be in (0, 1], got {value}")
    return value


def _positive(field: str, value: Optional[int]) -> Optional[int]:
    if value is not None and value < 1:
        raise PlanInputError(field, f"must be >= 1, got {value}")
    return value


def _reserve_bytes(gib: Optional[float]) -> Optional[int]:
    """--reserve GIB as bytes (2^30 per GiB), rounded to the byte."""
    from planner.core.spec import GIB

    if gib is None:
        return None
    if not gib >= 0:
        raise PlanInputError("--reserve", f"must be >= 0 GiB, got {gib}")
    return int(round(gib * GIB))


def _choice(field: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise PlanInputError(field, f"unknown {value!r}; allowed: {', '.join(allowed)}")
    return value


@input_errors_exit_2
def budget(
    model: opt.ModelOrNoneOpt = None,
    params: Annotated[Optional[float], typer.Option("--params", min=1, max=MAX_PARAMS, callback=opt.finite, help="Parameter count instead of --model (e.g. 70e9).")] = None,
    tokens: opt.TokensOpt = None,
    cluster: opt.ClusterOpt = None,
    gpu: opt.GpuOpt = None,
    gpus: opt.GpusOpt = None,
    days: Annotated[Optional[float], typer.Option("--days", max=MAX_DAYS, callback=opt.finite, help="Wall-clock days of the budget.")] = None,
    gpu_hours: Annotated[Optional[float], typer.Option("--gpu-hours", max=MAX_GPU_HOURS, callback=opt.finite, help="GPU-hours of the budget (instead of --days).")] = None,
    mfu: Annotated[Optional[float], typer.Option("--mfu", min=MIN_EFFICIENCY, max=1.0, callback=opt.finite, help="Utilisation of dense peak (default: the GPU profile's end_to_end_utilisation, a published run's).")] = None,
    calibration: opt.CalibrationOpt = None,
    dtype: Annotated[str, typer.Option("--dtype", help="Dtype whose dense peak counts (bf16, fp16, fp8, ...).")] = "bf16",
    recompute: opt.RecomputeOpt = None,
    seq_len: opt.SeqLenOpt = None,
    law: Annotated[Optional[str], typer.Option("--law", help="Scaling law name in planner/data/scaling_laws.yaml, or a YAML file (default: chinchilla-approach3).")] = None,
    profiles: opt.ProfilesOpt = None,
    json_out: opt.JsonOpt = False,
) -> None:
    """Compute budget and Chinchilla scaling law.

    With GPUs and --days/--gpu-hours: the training FLOPs available, N and D by the D = 20 N rule
    and by the argmin of the fitted loss law (C = 6 N D), each with its predicted loss. With
    --model/--params and --tokens: the FLOPs (with --seq-len, the attention term), days and
    GPU-hours (GPUs optional) and the predicted loss. Exit 0, or 2 on bad input.
    """
    from planner.timing import budget as plan
    from planner.data import scaling_law
    from planner.core.flops import SECONDS_PER_DAY, SECONDS_PER_HOUR
    from planner.cli.report.infer import render_compute_budget, render_model_budget

    recompute = recompute or "none"  # none: 6PD; full: 8PD (a second forward)
    chosen_law = scaling_law(law)
    hardware = None
    if cluster is not None or gpu is not None or gpus is not None:
        hardware = opt.resolve_cluster(cluster, gpu, gpus, profiles)
    peak = utilisation = None
    if hardware is not None:
        peak = _peak(hardware.gpu, dtype)
        utilisation = _mfu(mfu, calibration, hardware.gpu, dtype)
    if model is not None or params is not None:
        if days is not None or gpu_hours is not None:
            raise PlanInputError("--days", "give --days/--gpu-hours for a budget, or --model/--params "
                                 "with --tokens for a run, not both")
        n_params, n_active = _param_count(model, params, profiles)
        if tokens is None:
            raise PlanInputError("--tokens", "needed with --model/--params (e.g. --tokens 300e9)")
        result = plan.budget_for_model(
            n_params, tokens, recompute, chosen_law,
            num_gpus=hardware.num_gpus if hardware else None, peak_flops_per_s=peak, mfu=utilisation,
            active_params=n_active, attention=_attention_dims(model, seq_len, profiles))
        render_model_budget(result, hardware.gpu.name if hardware else None, json_out)
        return
    if hardware is None or peak is None or utilisation is None:
        raise PlanInputError("--cluster", "give --cluster NAME or --gpu NAME --gpus N with --days or "
                             "--gpu-hours; or --model/--params with --tokens")
    if (days is None) == (gpu_hours is None):
        raise PlanInputError("--days", "give exactly one of --days and --gpu-hours")
    for flag, value in (("--days", days), ("--gpu-hours", gpu_hours)):
        if value is not None and not value > 0:
            raise PlanInputError(flag, f"must be a positive number (got {value})")
    seconds = days * SECONDS_PER_DAY if days is not None else (
        gpu_hours * SECONDS_PER_HOUR / hardware.num_gpus)  # type: ignore[operator]
    result = plan.budget_from_compute(hardware.num_gpus, peak, utilisation, seconds, chosen_law)
    render_compute_budget(result, hardware.gpu.name, json_out)


def _param_count(model: Optional[str], params: Optional[float], profiles) -> tuple[float, float]:
    """Total and active parameters of --model (exact count), or --params for both."""
    if model is not None and params is not None:
        raise PlanInputError("--params", "give --model or --params, not both")
    if params is not None:
        return params, params
    from planner.core.params import count_params

    count = count_params(opt.resolve_model(model, profiles))  # type: ignore[arg-type]
    return float(count.total), float(count.active)


def _attention_dims(model: Optional[str], seq_len: Optional[int],
                    profiles) -> tuple[int, int, int] | None:
    """(layers, heads x head dim, --seq-len) of --model for the attention FLOPs, or None."""
    if seq_len is None:
        return None
    if not seq_len > 0:
        raise PlanInputError("--seq-len", f"must be a positive integer (got {seq_len})")
    if model is None:
        raise PlanInputError("--seq-len", "needs --model (layers and attention width), not --params")
    spec = opt.resolve_model(model, profiles)
    return spec.num_layers, spec.num_heads * spec.head_size, seq_len


def _peak(gpu, dtype: str) -> float:
    if dtype not in gpu.peak_tflops:
        raise PlanInputError("--dtype", f"gpu {gpu.name} has no peak for {dtype!r}; has "
                             f"{', '.join(sorted(gpu.peak_tflops))}")
    return gpu.peak_flops_per_s(dtype)


def _mfu(mfu: Optional[float], calibration: Optional[Path], gpu, dtype: str) -> float:
    """--mfu, else a calibration file's measured end-to-end utilisation, else the GPU profile's end-to-end
    utilisation of a published run (not `achieved_efficiency`, which is a matmul-level fraction
    the step-time model adds other costs to)."""
    if mfu is not None:
        return mfu
    if calibration is not None:
        from planner.io.calibration import end_to_end_utilisation_for, load_calibration

        measured = end_to_end_utilisation_for(load_calibration(calibration), gpu.name, dtype)
        if measured is not None:
            return measured
    if gpu.end_to_end_utilisation is None:
        raise PlanInputError(
            "--mfu", f"gpu {gpu.name} has no end_to_end_utilisation in its profile; give --mfu"
        )
    return gpu.end_to_end_utilisation


def register(app: typer.Typer) -> None:
    """Add `infer` and `budget` to the app."""
    app.command()(infer)
    app.command()(budget)
