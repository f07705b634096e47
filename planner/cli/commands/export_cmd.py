"""`zplan export --format deepspeed|megatron|accelerate-fsdp|torchrun`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.commands import _options as opt
from planner.cli.commands._common import EXIT_DOES_NOT_FIT, EXIT_FITS, input_errors_exit_2
from planner.core.errors import PlanInputError
from planner.io.export import FORMATS


@input_errors_exit_2
def export(
    fmt: Annotated[str, typer.Option("--format", "-f", help=f"One of: {', '.join(FORMATS)}.")],
    job: Annotated[Optional[Path], typer.Option("--job", help="Take model, cluster, layout and setup from a job YAML.")] = None,
    model: opt.ModelOrNoneOpt = None,
    cluster: opt.ClusterOpt = None,
    gpu: opt.GpuOpt = None,
    gpus: opt.GpusOpt = None,
    tp: opt.TpOpt = None,
    pp: opt.PpOpt = None,
    dp: opt.DpOpt = None,
    ep: opt.EpOpt = None,
    cp: opt.CpOpt = None,
    cp_comm_type: opt.CpCommTypeOpt = None,
    vp: opt.VirtualStagesOpt = None,
    first_stage_layers: opt.FirstStageLayersOpt = None,
    dp_engine: opt.DpEngineOpt = None,
    dp_shard: opt.DpShardOpt = None,
    last_stage_layers: opt.LastStageLayersOpt = None,
    zero: opt.ZeroOpt = None,
    offload_optimizer: opt.OffloadOptimizerOpt = None,
    offload_params: opt.OffloadParamsOpt = None,
    recompute: opt.RecomputeOpt = None,
    recompute_every_k: opt.RecomputeEveryKOpt = None,
    recompute_num_layers: opt.RecomputeNumLayersOpt = None,
    sequence_parallel: opt.SequenceParallelOpt = None,
    flash_attention: opt.FlashAttentionOpt = None,
    megatron_overlap: opt.MegatronOverlapOpt = None,
    micro_batch: opt.MicroBatchOpt = None,
    grad_accum: opt.GradAccumOpt = None,
    seq_len: opt.SeqLenOpt = None,
    global_batch: opt.GlobalBatchOpt = None,
    tokens: opt.TokensOpt = None,
    precision: opt.PrecisionOpt = None,
    optimizer: opt.OptimizerOpt = None,
    implementation: opt.ImplementationOpt = None,
    host_accounting: opt.HostAccountingOpt = None,
    moe_capacity_factor: opt.MoeCapacityFactorOpt = None,
    moe_load_imbalance: opt.MoeLoadImbalanceOpt = None,
    reserve: opt.ReserveOpt = None,
    cpu_mem_gib: opt.CpuMemOpt = None,
    output: opt.OutputOpt = None,
    force: opt.ForceOpt = False,
    nvme_path: Annotated[str, typer.Option(help="DeepSpeed nvme_path for NVMe offload.")] = "/local_nvme",
    script: Annotated[Optional[str], typer.Option(help="Training script for megatron/torchrun lines.")] = None,
    profiles: opt.ProfilesOpt = None,
) -> None:
    """Write a layout as a DeepSpeed config, a Megatron-LM launch line, an accelerate FSDP2
    config or a torchrun line. The layout comes from --job, from layout flags, or is the best
    one the search finds. The verdict line goes to stderr; exit 0 fits, 1 does not, 2 bad input.
    """
    from planner.io.check import check as plan_check
    from planner.io.export import export_text
    from planner.io.jobfile import make_setup
    from planner.cli.report.check import verdict_line

    if fmt not in FORMATS:
        raise PlanInputError("--format", f"{fmt!r}; allowed: {', '.join(FORMATS)}")
    if output is not None:
        from planner.io.safe_write import refuse_existing

        refuse_existing(output, force)  # before any work: nothing is written on a refusal
    layout_fields = dict(
        tp=tp, pp=pp, dp=dp, ep=ep, cp=cp, cp_comm_type=cp_comm_type, virtual_stages=vp,
        first_stage_layers=first_stage_layers,
        last_stage_layers=last_stage_layers, dp_engine=dp_engine, dp_shard=dp_shard, zero_stage=zero, offload_optimizer=offload_optimizer,
        offload_params=offload_params, recompute=recompute, recompute_every_k=recompute_every_k,
        recompute_num_layers=recompute_num_layers,
        sequence_parallel=sequence_parallel, flash_attention=flash_attention, micro_batch=micro_batch,
        grad_accum=grad_accum, megatron_overlap=opt.megatron_overlaps(megatron_overlap),
    )
    given = any(v is not None for v in layout_fields.values())
    if job is not None:
        others = (model, cluster, gpu, gpus, seq_len, global_batch, tokens, precision, optimizer,
                  reserve, cpu_mem_gib, implementation, host_accounting, moe_capacity_factor,
                  moe_load_imbalance)
        if given or any(value is not None for value in others):
            raise PlanInputError("--job", "the job file gives model, cluster, layout and setup; drop the other flags")
        from planner.io.jobfile import load_job

        spec, hardware, layout, setup = load_job(job, opt.extra_dirs(profiles))
    else:
        if model is None:
            raise PlanInputError("--model", "give --model (or --job JOB.yaml)")
        spec = opt.resolve_model(model, profiles)
        hardware = opt.with_host_memory(opt.resolve_cluster(cluster, gpu, gpus, profiles), cpu_mem_gib)
        length = opt.default_seq_len(spec, seq_len)
        names = dict(precision=precision or opt.DEFAULT_PRECISION, optimizer=optimizer or opt.DEFAULT_OPTIMIZER,
                     reserve_gib=reserve, implementation=implementation,
                     host_accounting=host_accounting, moe_capacity_factor=moe_capacity_factor,
                     moe_load_imbalance=moe_load_imbalance)
        run_tokens = tokens if tokens is not None else opt.DEFAULT_TOKENS
        if given:
            layout, batch = opt.layout_from_flags(hardware, global_batch, **layout_fields)
            setup = make_setup(length, batch, run_tokens, **names)
        else:
            batch = global_batch if global_batch is not None else opt.default_global_batch(hardware.num_gpus)
            setup = make_setup(length, batch, run_tokens, **names)
            layout = _best_layout(fmt, spec, hardware, setup)
    text = export_text(fmt, spec, hardware, layout, setup, nvme_path, script)  # type: ignore[arg-type]
    result = plan_check(spec, hardware, layout, setup)  # every check done before the first byte
    if output is None:
        sys.stdout.write(text)
    else:
        from planner.io.safe_write import write_atomic

        write_atomic(output, text, force)
    print(verdict_line(result) + (f" -> {output}" if output else ""), file=sys.stderr)
    if fmt == "deepspeed":
        _not_in_the_config(layout)
    raise typer.Exit(EXIT_FITS if result.fits else EXIT_DOES_NOT_FIT)


def _not_in_the_config(layout) -> None:
    """The planned fields a DeepSpeed config has no key for, and where they go instead (a note on
    stderr), so the round trip through `zplan check --deepspeed` plans the same job."""
    flags = [f"--tp {layout.tp}"] if layout.tp > 1 else []
    flags += [f"--pp {layout.pp}"] if layout.pp > 1 else []
    flags += ["--flash-attention"] if layout.flash_attention else []
    if flags:
        print("zplan: note: not DeepSpeed config keys, give them to the training script and to "
              f"`zplan check --deepspeed FILE {' '.join(flags)}`", file=sys.stderr)


def _best_layout(fmt: str, model, cluster, setup):
    """The fastest fitting layout the format can express and its engine can run
    (planner.io.export.search_constraints)."""
    from planner.io.export import search_constraints
    from planner.search.sweep import sweep

    result = sweep(model, cluster, setup, search_constraints(fmt), top=1, rejected=0)  # type: ignore[arg-type]
    if result.top:
        return result.top[0].layout
    print(f"zplan: no layout of {model.name} fits {cluster.name} that {fmt} can express", file=sys.stderr)
    raise typer.Exit(EXIT_DOES_NOT_FIT)


def register(app: typer.Typer) -> None:
    """Add `export` to the app."""
    app.command()(export)
