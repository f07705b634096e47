"""`zplan sweep`: rank every parallel layout of a model on a cluster by estimated step time."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.commands._common import EXIT_DOES_NOT_FIT, EXIT_FITS, input_errors_exit_2
from planner.cli.commands import _options as opt
from planner.core.errors import PlanInputError


def _ints(field: str, text: Optional[str]) -> tuple[int, ...] | None:
    """`8` or `1,2,4` -> (1, 2, 4); None stays None."""
    if text is None:
        return None
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise PlanInputError(field, f"expected integers like 1,2,4, got {text!r}") from None
    if not values or min(values) < 0:
        raise PlanInputError(field, f"expected non-negative integers like 1,2,4, got {text!r}")
    return values


def _choices(field: str, text: Optional[str], allowed: tuple[str, ...]) -> tuple[str, ...] | None:
    """`none,cpu` -> ("none", "cpu"), each checked against the allowed names."""
    if text is None:
        return None
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise PlanInputError(field, f"{', '.join(bad) or text!r} not allowed; choose from "
                                    f"{', '.join(allowed)}")
    return values


def _clusters(cluster: Optional[str], gpu: Optional[str], gpus: Optional[str],
              profiles: Optional[list[Path]]):
    """One cluster per requested GPU count (from --cluster, or --gpu with --gpus)."""
    from planner.io.loading import cluster_for_gpus, load_cluster
    from planner.search.sweep import parse_gpu_counts, with_gpus

    dirs = opt.extra_dirs(profiles)
    if (cluster is None) == (gpu is None):
        raise PlanInputError("--cluster",
                             "give --cluster NAME, or --gpu NAME with --gpus N (one of the two)")
    if cluster is not None:
        base = load_cluster(cluster, dirs)
        if gpus is None:
            return [base]
        return [with_gpus(base, n) for n in parse_gpu_counts(gpus)]
    if gpus is None:
        raise PlanInputError("--gpus", "--gpu needs --gpus N (a count, list or range)")
    return [cluster_for_gpus(gpu, n, dirs) for n in parse_gpu_counts(gpus)]


DeepSpeedBuffersOpt = Annotated[Optional[Path], typer.Option(
    "--deepspeed-buckets", help="A DeepSpeed ds_config.json whose zero_optimization bucket sizes every "
                        "candidate uses (memory buffers and the exposed last bucket); the layout is "
                        "still searched.")]
ProgressOpt = Annotated[bool, typer.Option(
    "--progress", help="Show the progress bar on stderr even when stderr is not a terminal "
                       "(by default only on a terminal).")]


def _deepspeed_buffers(path: Optional[Path], hidden_size: int, console):
    """The config's bucket sizes (planner.io.deepspeed.config_buffers), or the defaults;
    the reader's notes (e.g. an "auto" filled by the HF Trainer rule) go to stderr."""
    from planner.core.spec import EngineBuffers

    if path is None:
        return EngineBuffers()
    from planner.io.deepspeed import config_buffers, read_deepspeed_config

    buffers, notes = config_buffers(read_deepspeed_config(path), hidden_size)
    for note in notes:
        console.print(f"note: {note}")
    return buffers


def register(app: typer.Typer) -> None:
    """Add `zplan sweep`."""

    @app.command("sweep")
    @input_errors_exit_2
    def sweep_command(
        model: opt.ModelOpt,
        cluster: opt.ClusterOpt = None,
        gpu: opt.GpuOpt = None,
        gpus: opt.GpusRangeOpt = None,
        seq_len: opt.SeqLenOpt = None,
        global_batch: opt.GlobalBatchOpt = None,
        tokens: opt.TokensOpt = None,
        precision: opt.PrecisionOpt = None,
        optimizer: opt.OptimizerOpt = None,
        sort: Annotated[str, typer.Option(
            "--sort", help="step-time | tokens-per-s | mfu | memory-headroom | gpu-hours")] = "step-time",
        top: Annotated[int, typer.Option("--top", min=1, help="Layouts shown.")] = 10,
        show_rejected: Annotated[int, typer.Option(
            "--rejected", min=0, help="Fastest rejected layouts shown, with the reason.")] = 5,
        tp: opt.TpPinsOpt = None,
        pp: opt.PpPinsOpt = None,
        dp: opt.DpPinsOpt = None,
        ep: opt.EpPinsOpt = None,
        cp: opt.CpPinsOpt = None,
        cp_comm_type: opt.CpCommTypePinsOpt = None,
        virtual_stages: opt.VirtualStagesPinsOpt = None,
        zero: opt.ZeroPinsOpt = None,
        micro_batch: opt.MicroBatchPinsOpt = None,
        recompute: opt.RecomputePinsOpt = None,
        recompute_num_layers: opt.SweepRecomputeNumLayersOpt = None,
        dp_engine: opt.DpEnginePinsOpt = None,
        dp_shard: opt.SweepDpShardOpt = None,
        engine: opt.EngineOpt = None,
        offload_optimizer: opt.OffloadOptimizerPinsOpt = None,
        offload_params: opt.OffloadParamsPinsOpt = None,
        no_offload: Annotated[bool, typer.Option("--no-offload", help="Keep everything on the GPUs.")] = False,
        sequence_parallel: opt.SequenceParallelOpt = None,
        megatron_overlap: opt.MegatronOverlapOpt = None,
        max_tp: Annotated[Optional[int], typer.Option("--max-tp", min=1, help="Largest tp.")] = None,
        max_pp: Annotated[Optional[int], typer.Option("--max-pp", min=1, help="Largest pp.")] = None,
        max_virtual_stages: Annotated[Optional[int], typer.Option(
            "--max-virtual-stages", min=1, help="Largest number of virtual stages.")] = None,
        allow_cross_node_tp: Annotated[bool, typer.Option(
            "--allow-cross-node-tp", help="Let tp span nodes (over the inter-node network).")] = False,
        flash_attention: opt.FlashAttentionOpt = None,
        implementation: opt.ImplementationOpt = None,
        host_accounting: opt.HostAccountingOpt = None,
        moe_capacity_factor: opt.MoeCapacityFactorOpt = None,
        moe_load_imbalance: opt.MoeLoadImbalanceOpt = None,
        reserve: opt.ReserveOpt = None,
        cpu_mem_gib: opt.CpuMemOpt = None,
        efficiency: opt.EfficiencyOpt = None,
        calibration: opt.CalibrationOpt = None,
        csv_path: Annotated[Optional[str], typer.Option(
            "--csv", help="Write the shown rows with every column as CSV to this file ('-' = stdout; "
                          "refused if the file exists, unless --force).", rich_help_panel=opt.OUTPUT)] = None,
        as_json: opt.JsonOpt = False,
        plot: opt.PlotOpt = None,
        force: opt.ForceOpt = False,
        profiles: opt.ProfilesOpt = None,
        deepspeed: DeepSpeedBuffersOpt = None,
        show_progress: ProgressOpt = False,
    ) -> None:
        """Rank every parallel layout (tp, pp, dp, ZeRO, offload, recompute, micro-batch) by
        estimated step time; show why the attractive ones that do not fit are rejected.

        Exit 0 when a layout fits (for at least one GPU count), 1 when none does."""
        from planner.core import columns
        from planner.search import sweep
        from planner.timing.megatron_overlap import sweep_pins
        from planner.io.jobfile import make_setup
        from planner.cli.report import human_console, progress_console
        from planner.cli.report import sweep as report

        for target in (Path(csv_path) if csv_path not in (None, "-") else None, plot):
            if target is not None:  # refused before any work, so nothing is half-written
                from planner.io.safe_write import refuse_existing

                refuse_existing(target, force, "--plot" if target == plot else "--csv")
        spec = opt.resolve_model(model, profiles)
        clusters = [opt.with_host_memory(cl, cpu_mem_gib) for cl in _clusters(cluster, gpu, gpus, profiles)]
        setups = [make_setup(opt.default_seq_len(spec, seq_len),
                             global_batch if global_batch is not None else opt.default_global_batch(cl.num_gpus),
                             tokens if tokens is not None else opt.DEFAULT_TOKENS,
                             precision or opt.DEFAULT_PRECISION, optimizer or opt.DEFAULT_OPTIMIZER, reserve,
                             implementation, host_accounting, moe_capacity_factor,
                             moe_load_imbalance)
                  for cl in clusters]
        setup = setups[0]
        console = progress_console()
        buffers = _deepspeed_buffers(deepspeed, spec.hidden_size, console)
        overlap = opt.megatron_overlaps(megatron_overlap)
        zero_pins, engine_pins, sp_pins = sweep_pins(
            overlap, _ints("zero", zero), _choices("dp_engine", dp_engine, columns.DP_ENGINES),
            None if sequence_parallel is None else (sequence_parallel,))
        depth = opt.sweep_recompute_num_layers(recompute_num_layers)
        modes = _choices("recompute", recompute, sweep.PINNABLE_RECOMPUTE)
        if depth == sweep.AUTO_DEPTH and modes is None:  # auto: block joins the default modes
            modes = sweep.PINNABLE_RECOMPUTE
        constraints = sweep.Constraints(
            tp=_ints("tp", tp), pp=_ints("pp", pp), dp=_ints("dp", dp), ep=_ints("ep", ep),
            cp=_ints("cp", cp),
            cp_comm_type=_choices("cp_comm_type", cp_comm_type, columns.CP_COMM_TYPES),
            virtual_stages=_ints("virtual_stages", virtual_stages), zero_stage=zero_pins,
            micro_batch=_ints("micro_batch", micro_batch),
            recompute=modes, recompute_num_layers=depth,
            dp_engine=engine_pins,
            offload_optimizer=("none",) if no_offload
            else _choices("offload_optimizer", offload_optimizer, sweep.TARGETS),
            offload_params=("none",) if no_offload
            else _choices("offload_params", offload_params, sweep.TARGETS),
            sequence_parallel=sp_pins,
            max_tp=max_tp, max_pp=max_pp, max_virtual_stages=max_virtual_stages,
            allow_cross_node_tp=allow_cross_node_tp, flash_attention=flash_attention is not False,
            buffers=buffers, megatron_overlap=overlap, dp_shard=opt.sweep_dp_shard(dp_shard),
            engine=opt.engine_choice(engine),
        )
        opt.check_recompute_num_layers("block" if "block" in (constraints.recompute or ()) else recompute, depth)
        if any(z not in (0, 1, 2, 3) for z in constraints.zero_stage or ()):
            raise PlanInputError("zero", f"ZeRO stages are 0, 1, 2, 3; got {zero}")
        if efficiency is None and calibration is not None:
            from planner.io.calibration import efficiency_for, load_calibration

            efficiency = efficiency_for(load_calibration(calibration), clusters[0].gpu.name,
                                        setup.precision.compute_dtype)
        sweep.check_sort(sort)
        results = _run(spec, clusters, setups, constraints, sort, top, show_rejected, efficiency,
                       console, show_progress)
        if csv_path == "-":
            sys.stdout.write(report.csv_text(results))
        elif csv_path:
            from planner.io.safe_write import write_atomic

            write_atomic(Path(csv_path), report.csv_text(results), force, "--csv")
        if plot is not None:
            from planner.cli.report.plot import plot_sweep

            plot_sweep(results, plot, force)
        if as_json:
            report.emit(results)
        elif csv_path != "-":
            report.render(human_console(), results)
        raise typer.Exit(EXIT_FITS if any(r.top for r in results) else EXIT_DOES_NOT_FIT)


def _run(spec, clusters, setups, constraints, sort, top, show_rejected, efficiency, console,
         force_progress: bool = False):
    """One sweep per GPU count, with one progress bar on stderr over all of them: each GPU count
    is one unit, advanced per evaluated chunk (sweep's progress callback), and the layouts
    evaluated so far. Shown when stderr is a terminal, or with --progress (then the bar is
    drawn even into a file or pipe)."""
    from rich.progress import (BarColumn, Progress, TaskProgressColumn, TextColumn,
                               TimeElapsedColumn)

    from planner.cli.report import progress_console
    from planner.search.sweep import sweep

    if force_progress and not console.is_terminal:
        console = progress_console(force_terminal=True)
    results: list = []
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
               TextColumn("{task.fields[layouts]:,} layouts"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task("sweep", total=len(clusters), layouts=0)
        for i, (cl, setup) in enumerate(zip(clusters, setups)):
            so_far = sum(r.evaluated for r in results)
            progress.update(task, description=f"{cl.num_gpus} GPUs, batch {setup.global_batch}")

            def report_progress(done: int, total: int, i=i, so_far=so_far) -> None:
                progress.update(task, completed=i + done / max(total, 1), layouts=so_far + done)

            results.append(sweep(spec, cl, setup, constraints, sort=sort, top=top,
                                 rejected=show_rejected, efficiency=efficiency,
                                 progress=report_progress))
            progress.update(task, completed=i + 1, layouts=so_far + results[-1].evaluated)
    return results
