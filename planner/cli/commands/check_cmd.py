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

DeepSpeedOpt = Annotated[Optional[Path], typer.Option(
    "--deepspeed", help="A DeepSpeed ds_config.json as the layout (with --model and --cluster).",
    rich_help_panel=_ENGINE)]
AccelerateOpt = Annotated[Optional[Path], typer.Option(
    "--accelerate-config", help="An accelerate config YAML (FSDP / DEEPSPEED / MULTI_GPU) as the "
    "layout, with --model, --cluster and --micro-batch; implementation hf-sdpa by default.",
    rich_help_panel=_ENGINE)]
MegatronOpt = Annotated[Optional[Path], typer.Option(
    "--megatron-args", help="A Megatron-LM launch line / args file: model, layout and batch from its flags.",
    rich_help_panel=_ENGINE)]


@input_errors_exit_2
def check(
    job: Annotated[Optional[Path], typer.Argument(help="Job YAML: model, cluster, layout, setup.")] = None,
    deepspeed: DeepSpeedOpt = None,
    megatron_args: MegatronOpt = None,
    accelerate_config: AccelerateOpt = None,
    model: opt.ModelOrNoneOpt = None,
    cluster: opt.ClusterOpt = None,
    gpu: opt.GpuOpt = None,
    gpus: opt.GpusOpt = None,
    tp: opt.TpOpt = None,
    pp: opt.PpOpt = None,
    ep: opt.EpOpt = None,
    dp_shard: opt.DpShardOpt = None,
    micro_batch: opt.MicroBatchOpt = None,
    grad_accum: opt.GradAccumOpt = None,
    global_batch: opt.GlobalBatchOpt = None,
    seq_len: opt.SeqLenOpt = None,
    tokens: opt.TokensOpt = None,
    precision: opt.PrecisionOpt = None,
    optimizer: opt.OptimizerOpt = None,
    recompute: opt.RecomputeOpt = None,
    recompute_every_k: opt.RecomputeEveryKOpt = None,
    recompute_num_layers: opt.RecomputeNumLayersOpt = None,
    flash_attention: opt.FlashAttentionOpt = None,
    implementation: opt.ImplementationOpt = None,
    host_accounting: opt.HostAccountingOpt = None,
    reserve: opt.ReserveOpt = None,
    cpu_mem_gib: opt.CpuMemOpt = None,
    profiles: opt.ProfilesOpt = None,
    json_out: opt.JsonOpt = False,
) -> None:
    """Does this job fit? `zplan check JOB.yaml`, `--deepspeed ds.json --model M --cluster C`,
    or `--megatron-args FILE --cluster C`. Prints one verdict line.

    Also `--accelerate-config FILE --model M --cluster C --micro-batch B` (accelerate's YAML).

    Exit 0 fits, 1 does not fit, 2 bad input.
    """
    from planner.io import check as lib
    from planner.cli.report import check as render

    sources = [name for name, value in (("JOB", job), ("--deepspeed", deepspeed),
                                        ("--megatron-args", megatron_args),
                                        ("--accelerate-config", accelerate_config)) if value is not None]
    if len(sources) != 1:
        raise PlanInputError("check", "give exactly one of JOB, --deepspeed FILE, --megatron-args FILE, "
                             "--accelerate-config FILE"
                             + (f" (got {', '.join(sources)})" if sources else ""))
    numbers = dict(tp=tp, pp=pp, ep=ep, dp_shard=dp_shard, micro_batch=micro_batch, grad_accum=grad_accum, global_batch=global_batch,
                   recompute=recompute, recompute_every_k=recompute_every_k,
                   recompute_num_layers=recompute_num_layers, flash_attention=flash_attention)
    host = dict(reserve_gib=reserve, cpu_mem_gib=cpu_mem_gib, implementation=implementation,
                host_accounting=host_accounting)
    if job is not None:
        _refuse_given("check", "a job file says everything", dict(
            numbers, model=model, cluster=cluster, gpu=gpu, gpus=gpus, seq_len=seq_len, tokens=tokens,
            precision=precision, optimizer=optimizer))
        from planner.io.jobfile import load_job

        result = lib.check(*load_job(job, opt.extra_dirs(profiles)), source="job", **host)
    elif deepspeed is not None:
        if dp_shard is not None:
            raise PlanInputError("--dp-shard", f"{dp_shard} with --deepspeed: DeepSpeed shards over "
                                 "the whole dp group (MiCS, mics_shard_size, is not modelled)")
        if model is None:
            raise PlanInputError("--model", "--deepspeed needs --model (a DeepSpeed config has no model)")
        opt.check_recompute_num_layers(recompute, recompute_num_layers)
        spec = opt.resolve_model(model, profiles)
        hardware = _hardware(cluster, gpu, gpus, profiles)
        result = lib.check_deepspeed(
            deepspeed, spec, hardware, num_gpus=gpus, seq_len=opt.default_seq_len(spec, seq_len),
            tokens=tokens or opt.DEFAULT_TOKENS, optimizer=optimizer or opt.DEFAULT_OPTIMIZER,
            precision=precision, **host, **numbers)
    elif accelerate_config is not None:
        if model is None:
            raise PlanInputError("--model", "--accelerate-config needs --model (an accelerate config has no model)")
        _refuse_given("--accelerate-config", "the config's mixed_precision says the precision",
                      dict(precision=precision))
        from planner.io.accelerate_config import num_processes, read_accelerate_config

        spec = opt.resolve_model(model, profiles)
        processes = num_processes(read_accelerate_config(accelerate_config), gpus)
        hardware = _hardware(cluster, gpu, processes if gpu is not None else gpus, profiles)
        result = lib.check_accelerate(
            accelerate_config, spec, hardware, num_gpus=gpus, seq_len=opt.default_seq_len(spec, seq_len),
            tokens=tokens or opt.DEFAULT_TOKENS, optimizer=optimizer or opt.DEFAULT_OPTIMIZER,
            **host, **numbers)
    else:
        _refuse_given("--megatron-args", "the launch line says these",
                      dict(numbers, model=model, seq_len=seq_len, precision=precision))
        hardware = _hardware(cluster, gpu, gpus, profiles)
        result = lib.check_megatron(cast(Path, megatron_args), hardware, num_gpus=gpus, tokens=tokens,
                                    optimizer=optimizer, default_tokens=opt.DEFAULT_TOKENS, **host)
    for note in result.notes:  # assumptions and which input won: diagnostics, on stderr
        print(f"zplan: note: {note}", file=sys.stderr)
    if json_out:
        render.emit(result)
    else:
        print(render.verdict_line(result))
        for line in render.suggestion_lines(result.suggestions):
            print(line)
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
