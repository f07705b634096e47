"""`zplan check`: the CI gate. One verdict line; exit 0 fits, 1 does not fit, 2 bad input."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional, cast

import typer

from planner.cli.commands import _options as opt
from planner.cli.commands._common import EXIT_DOES_NOT_FIT, EXIT_FITS, input_errors_exit_2
from planner.core.errors import PlanInputError

_ENGINE = "Engine configs (instead of a job file)"
_JOB = "Job numbers for --deepspeed (fill \"auto\" and what the JSON cannot say)"

DeepSpeedOpt = Annotated[Optional[Path], typer.Option(
    "--deepspeed", help="A DeepSpeed ds_config.json as the layout (with --model and --cluster).",
    rich_help_panel=_ENGINE)]
MegatronOpt = Annotated[Optional[Path], typer.Option(
    "--megatron-args", help="A Megatron-LM launch line / args file: model, layout and batch from its flags.",
    rich_help_panel=_ENGINE)]


def _int_opt(help_text: str) -> object:
    return typer.Option(min=1, help=help_text, rich_help_panel=_JOB)


@input_errors_exit_2
def check(
    job: Annotated[Optional[Path], typer.Argument(help="Job YAML: model, cluster, layout, setup.")] = None,
    deepspeed: DeepSpeedOpt = None,
    megatron_args: MegatronOpt = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model for --deepspeed: preset, YAML or HF config.json.")] = None,
    cluster: opt.ClusterOpt = None,
    gpu: opt.GpuOpt = None,
    gpus: Annotated[Optional[int], typer.Option("--gpus", min=1, help="GPUs of the job (with --cluster: that many of its GPUs).")] = None,
    tp: Annotated[Optional[int], _int_opt("Tensor-parallel degree (not a DeepSpeed key).")] = None,
    pp: Annotated[Optional[int], _int_opt("Pipeline-parallel degree (not a DeepSpeed key).")] = None,
    micro_batch: Annotated[Optional[int], _int_opt("Fills train_micro_batch_size_per_gpu \"auto\".")] = None,
    grad_accum: Annotated[Optional[int], _int_opt("Fills gradient_accumulation_steps \"auto\".")] = None,
    global_batch: Annotated[Optional[int], _int_opt("Fills train_batch_size \"auto\".")] = None,
    seq_len: opt.SeqLenOpt = None,
    tokens: Annotated[Optional[float], typer.Option("--tokens", min=1, help="Training tokens [default: 300e9, or the launch line's].")] = None,
    precision: Annotated[Optional[str], typer.Option("--precision", help="Recipe; fills bf16/fp16 \"auto\" [default: from the file].")] = None,
    optimizer: Annotated[Optional[str], typer.Option("--optimizer", help="adam, adamw, sgd-momentum, sgd, adam-8bit [default: adam].")] = None,
    recompute: Annotated[Optional[str], typer.Option(help="none|selective|full|every_k [default: full if the file has activation_checkpointing].", rich_help_panel=_JOB)] = None,
    recompute_every_k: Annotated[Optional[int], _int_opt("Layers per checkpointed segment for every_k.")] = None,
    flash_attention: Annotated[Optional[bool], typer.Option("--flash-attention/--no-flash-attention", help="Fused attention (no s x s tensors).", rich_help_panel=_JOB)] = None,
    profiles: opt.ProfilesOpt = None,
    json_out: opt.JsonOpt = False,
) -> None:
    """Does this job fit? `zplan check JOB.yaml`, `--deepspeed ds.json --model M --cluster C`,
    or `--megatron-args FILE --cluster C`. Prints one verdict line.

    Exit 0 fits, 1 does not fit, 2 bad input.
    """
    from planner.io import check as lib
    from planner.cli.report import check as render

    sources = [name for name, value in (("JOB", job), ("--deepspeed", deepspeed),
                                        ("--megatron-args", megatron_args)) if value is not None]
    if len(sources) != 1:
        raise PlanInputError("check", "give exactly one of JOB, --deepspeed FILE, --megatron-args FILE"
                             + (f" (got {', '.join(sources)})" if sources else ""))
    numbers = dict(tp=tp, pp=pp, micro_batch=micro_batch, grad_accum=grad_accum, global_batch=global_batch,
                   recompute=recompute, recompute_every_k=recompute_every_k, flash_attention=flash_attention)
    if job is not None:
        _refuse_given("check", "a job file says everything", dict(
            numbers, model=model, cluster=cluster, gpu=gpu, gpus=gpus, seq_len=seq_len, tokens=tokens,
            precision=precision, optimizer=optimizer))
        from planner.io.jobfile import load_job

        result = lib.check(*load_job(job, opt.extra_dirs(profiles)), source="job")
    elif deepspeed is not None:
        if model is None:
            raise PlanInputError("--model", "--deepspeed needs --model (a DeepSpeed config has no model)")
        spec = opt.resolve_model(model, profiles)
        hardware = _hardware(cluster, gpu, gpus, profiles)
        result = lib.check_deepspeed(
            deepspeed, spec, hardware, num_gpus=gpus, seq_len=opt.default_seq_len(spec, seq_len),
            tokens=tokens or opt.DEFAULT_TOKENS, optimizer=optimizer or "adam", precision=precision, **numbers)
    else:
        _refuse_given("--megatron-args", "the launch line says these",
                      dict(numbers, model=model, seq_len=seq_len, precision=precision))
        hardware = _hardware(cluster, gpu, gpus, profiles)
        result = lib.check_megatron(cast(Path, megatron_args), hardware, num_gpus=gpus, tokens=tokens,
                                    optimizer=optimizer, default_tokens=opt.DEFAULT_TOKENS)
    if json_out:
        render.emit(result)
    else:
        print(render.verdict_line(result), file=sys.stderr)
    raise typer.Exit(EXIT_FITS if result.fits else EXIT_DOES_NOT_FIT)


def _refuse_given(field: str, why: str, options: dict[str, object]) -> None:
    """Raise naming every option given (not None) that the source already says."""
    given = ["--" + name.replace("_", "-") for name, value in options.items() if value is not None]
    if given:
        raise PlanInputError(field, f"{why}; drop {', '.join(given)}")


def _hardware(cluster: Optional[str], gpu: Optional[str], gpus: Optional[int], profiles: Optional[list[Path]]):
    """--cluster C (optionally with --gpus N: that many of its GPUs) or --gpu G --gpus N."""
    if cluster is not None and gpu is None:
        from planner.io.loading import load_cluster

        return load_cluster(cluster, opt.extra_dirs(profiles))
    return opt.resolve_cluster(cluster, gpu, gpus, profiles)


def register(app: typer.Typer) -> None:
    """Add `check` to the app."""
    app.command()(check)
