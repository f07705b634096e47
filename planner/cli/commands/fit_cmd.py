"""`zplan fit`, `zplan presets`, `zplan show`.

Seed and paper citations: docs/references.md
"""

from __future__ import annotations

from typing import Annotated

import typer

from planner.cli.commands import _options as opt
from planner.cli.commands._common import EXIT_DOES_NOT_FIT, EXIT_FITS, input_errors_exit_2


@input_errors_exit_2
def fit(
    model: opt.ModelOpt,
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
    engine: opt.EngineOpt = None,
    last_stage_layers: opt.LastStageLayersOpt = None,
    zero: opt.ZeroOpt = None,
    offload_optimizer: opt.OffloadOptimizerOpt = None,
    offload_params: opt.OffloadParamsOpt = None,
    recompute: opt.RecomputeOpt = None,
    recompute_every_k: opt.RecomputeEveryKOpt = None,
    recompute_num_layers: opt.RecomputeNumLayersOpt = None,
    sequence_parallel: opt.SequenceParallelOpt = None,
    flash_attention: opt.FlashAttentionOpt = None,
    tempo: opt.TempoOpt = None,
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
    calibration: opt.CalibrationOpt = None,
    efficiency: opt.EfficiencyOpt = None,
    profiles: opt.ProfilesOpt = None,
    json_out: opt.JsonOpt = False,
    plot: opt.PlotOpt = None,
    force: opt.ForceOpt = False,
) -> int:
    """Does MODEL fit on CLUSTER? Per-stage GPU memory, CPU/NVMe per node, and the verdict.

    With layout options: the breakdown of that layout. Without: the best layout found (with
    --engine: the best that engine runs) and the minimum GPUs of every strategy (DDP, ZeRO-1/2/3,
    offload, TP x PP x DP).
    Exit 0 fits, 1 does not fit, 2 bad input.
    """
    from planner.search import fitting
    from planner.io.jobfile import make_setup
    from planner.cli.report import fit as render

    if plot is not None:
        from planner.cli.report.plot import check_plot_target

        check_plot_target(plot, force)
    spec = opt.resolve_model(model, profiles)
    hardware = opt.with_host_memory(opt.resolve_cluster(cluster, gpu, gpus, profiles), cpu_mem_gib)
    length = opt.default_seq_len(spec, seq_len)
    tokens = tokens if tokens is not None else opt.DEFAULT_TOKENS
    precision = precision or opt.DEFAULT_PRECISION
    optimizer = optimizer or opt.DEFAULT_OPTIMIZER
    engine_name = opt.engine_choice(engine)
    if efficiency is None:  # --efficiency overrides the calibration file, as on sweep
        efficiency = fitting.calibrated_efficiency(calibration, hardware, precision)
    layout_fields = dict(
        tp=tp, pp=pp, dp=dp, ep=ep, cp=cp, cp_comm_type=cp_comm_type, virtual_stages=vp,
        first_stage_layers=first_stage_layers,
        last_stage_layers=last_stage_layers, dp_engine=dp_engine, dp_shard=dp_shard, zero_stage=zero, offload_optimizer=offload_optimizer,
        offload_params=offload_params, recompute=recompute, recompute_every_k=recompute_every_k,
        recompute_num_layers=recompute_num_layers,
        sequence_parallel=sequence_parallel, flash_attention=flash_attention,
        tempo=opt.tempo_techniques(tempo) or None, megatron_overlap=opt.megatron_overlaps(megatron_overlap), micro_batch=micro_batch, grad_accum=grad_accum,
    )
    if engine_name is not None and dp_engine is None and (zero or 0) >= 2:
        from planner.io.engines import SHARDED_DP_MODEL  # ZeRO-2/3 timed as the engine shards

        layout_fields["dp_engine"] = SHARDED_DP_MODEL[engine_name]
    if any(value is not None for value in layout_fields.values()):
        layout, batch = opt.layout_from_flags(hardware, global_batch, **layout_fields)
        setup = make_setup(length, batch, tokens, precision, optimizer, reserve, implementation,
                           host_accounting, moe_capacity_factor, moe_load_imbalance)
        if engine_name is not None:
            from planner.io.engines import check_engine

            check_engine(engine_name, spec, layout, setup.precision, field="--engine", timed=True)
        result = fitting.fit_layout(spec, hardware, layout, setup, efficiency)
    else:
        batch = global_batch if global_batch is not None else opt.default_global_batch(hardware.num_gpus)
        setup = make_setup(length, batch, tokens, precision, optimizer, reserve, implementation,
                           host_accounting, moe_capacity_factor, moe_load_imbalance)
        result = fitting.fit_search(spec, hardware, setup, efficiency, engine_name)
    if json_out:
        render.emit(result)
    else:
        render.print_fit(result)
    if plot is not None:
        from planner.cli.report.plot import plot_fit

        plot_fit(result, plot, force)
    raise typer.Exit(EXIT_FITS if result.fits else EXIT_DOES_NOT_FIT)


@input_errors_exit_2
def presets(
    profiles: opt.ProfilesOpt = None,
    json_out: opt.JsonOpt = False,
) -> None:
    """List the shipped (and your --profiles) models, GPUs, nodes and clusters."""
    from planner.io.loading import list_presets
    from planner.cli.report import fit as render

    listing = list_presets(opt.extra_dirs(profiles))
    render.print_presets(listing, json_out)


@input_errors_exit_2
def show(
    model: Annotated[str, typer.Argument(help="Model preset name or file.")],
    seq_len: opt.SeqLenOpt = None,
    profiles: opt.ProfilesOpt = None,
    json_out: opt.JsonOpt = False,
) -> None:
    """A model's exact parameter breakdown and its FLOPs per token."""
    from planner.search import fitting
    from planner.cli.report import fit as render

    spec = opt.resolve_model(model, profiles)
    summary = fitting.model_summary(spec, opt.default_seq_len(spec, seq_len))
    render.print_model(summary, json_out)


def register(app: typer.Typer) -> None:
    """Add fit, presets and show to the app."""
    app.command()(fit)
    app.command()(presets)
    app.command()(show)
