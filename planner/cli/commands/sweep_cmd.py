"""`zplan sweep`: rank every parallel layout of a model on a cluster by estimated step time."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.cli.commands._common import EXIT_DOES_NOT_FIT, EXIT_FITS, input_errors_exit_2
from planner.cli.commands._options import (
    DEFAULT_TOKENS,
    CalibrationOpt,
    ClusterOpt,
    GpuOpt,
    JsonOpt,
    ModelOpt,
    OptimizerOpt,
    PrecisionOpt,
    ProfilesOpt,
    SeqLenOpt,
    TokensOpt,
    default_seq_len,
    extra_dirs,
    resolve_model,
)
from planner.core.errors import PlanInputError

DEFAULT_GLOBAL_BATCH = 1024


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

    dirs = extra_dirs(profiles)
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


def register(app: typer.Typer) -> None:
    """Add `zplan sweep`."""

    @app.command("sweep")
    @input_errors_exit_2
    def sweep_command(
        model: ModelOpt,
        cluster: ClusterOpt = None,
        gpu: GpuOpt = None,
        gpus: Annotated[Optional[str], typer.Option(
            "--gpus", help="GPU count, list (64,128,256) or doubling range (64-1024); with "
                           "--cluster it resizes the cluster.")] = None,
        seq_len: SeqLenOpt = None,
        global_batch: Annotated[int, typer.Option(
            "--global-batch", min=1, help="Sequences per optimizer step.")] = DEFAULT_GLOBAL_BATCH,
        tokens: TokensOpt = DEFAULT_TOKENS,
        precision: PrecisionOpt = "zero-fp16",
        optimizer: OptimizerOpt = "adam",
        sort: Annotated[str, typer.Option(
            "--sort", help="step-time | tokens-per-s | mfu | memory-headroom | gpu-hours")] = "step-time",
        top: Annotated[int, typer.Option("--top", min=1, help="Layouts shown.")] = 10,
        show_rejected: Annotated[int, typer.Option(
            "--rejected", min=0, help="Fastest rejected layouts shown, with the reason.")] = 5,
        tp: Annotated[Optional[str], typer.Option("--tp", help="Pin tp, e.g. 8 or 4,8.")] = None,
        pp: Annotated[Optional[str], typer.Option("--pp", help="Pin pp, e.g. 1,2,4.")] = None,
        dp: Annotated[Optional[str], typer.Option("--dp", help="Pin dp.")] = None,
        virtual_stages: Annotated[Optional[str], typer.Option(
            "--virtual-stages", help="Pin interleaved virtual stages, e.g. 1.")] = None,
        zero: Annotated[Optional[str], typer.Option("--zero", help="ZeRO stages, e.g. 1,3.")] = None,
        micro_batch: Annotated[Optional[str], typer.Option(
            "--micro-batch", help="Micro-batch sizes [default: 1,2,4,... dividing the batch].")] = None,
        recompute: Annotated[Optional[str], typer.Option(
            "--recompute", help="none, selective, full (comma list).")] = None,
        offload_optimizer: Annotated[Optional[str], typer.Option(
            "--offload-optimizer", help="none, cpu, nvme (comma list).")] = None,
        offload_params: Annotated[Optional[str], typer.Option(
            "--offload-params", help="none, cpu, nvme (comma list).")] = None,
        no_offload: Annotated[bool, typer.Option("--no-offload", help="Keep everything on the GPUs.")] = False,
        sequence_parallel: Annotated[Optional[bool], typer.Option(
            "--sequence-parallel/--no-sequence-parallel", help="Pin sequence parallelism [default: both].")] = None,
        max_tp: Annotated[Optional[int], typer.Option("--max-tp", min=1, help="Largest tp.")] = None,
        max_pp: Annotated[Optional[int], typer.Option("--max-pp", min=1, help="Largest pp.")] = None,
        max_virtual_stages: Annotated[Optional[int], typer.Option(
            "--max-virtual-stages", min=1, help="Largest number of virtual stages.")] = None,
        allow_cross_node_tp: Annotated[bool, typer.Option(
            "--allow-cross-node-tp", help="Let tp span nodes (over the inter-node network).")] = False,
        flash_attention: Annotated[bool, typer.Option(
            "--flash-attention", help="Every layout uses fused attention (no s x s tensors).")] = False,
        efficiency: Annotated[Optional[float], typer.Option(
            "--efficiency", help="Fraction of dense peak the matmuls reach "
                                 "[default: --calibration, else the GPU profile].")] = None,
        calibration: CalibrationOpt = None,
        csv_path: Annotated[Optional[str], typer.Option(
            "--csv", help="Write the shown rows with every column as CSV to this file ('-' = stdout).")] = None,
        as_json: JsonOpt = False,
        profiles: ProfilesOpt = None,
    ) -> None:
        """Rank every parallel layout (tp, pp, dp, ZeRO, offload, recompute, micro-batch) by
        estimated step time; show why the attractive ones that do not fit are rejected.

        Exit 0 when a layout fits (for at least one GPU count), 1 when none does."""
        from planner.search import sweep
        from planner.io.jobfile import make_setup
        from planner.cli.report import human_console
        from planner.cli.report import sweep as report

        spec = resolve_model(model, profiles)
        clusters = _clusters(cluster, gpu, gpus, profiles)
        setup = make_setup(default_seq_len(spec, seq_len), global_batch, tokens, precision, optimizer)
        constraints = sweep.Constraints(
            tp=_ints("tp", tp), pp=_ints("pp", pp), dp=_ints("dp", dp),
            virtual_stages=_ints("virtual_stages", virtual_stages), zero_stage=_ints("zero", zero),
            micro_batch=_ints("micro_batch", micro_batch),
            recompute=_choices("recompute", recompute, sweep.RECOMPUTE_MODES),
            offload_optimizer=("none",) if no_offload
            else _choices("offload_optimizer", offload_optimizer, sweep.TARGETS),
            offload_params=("none",) if no_offload
            else _choices("offload_params", offload_params, sweep.TARGETS),
            sequence_parallel=None if sequence_parallel is None else (sequence_parallel,),
            max_tp=max_tp, max_pp=max_pp, max_virtual_stages=max_virtual_stages,
            allow_cross_node_tp=allow_cross_node_tp, flash_attention=flash_attention,
        )
        if any(z not in (0, 1, 2, 3) for z in constraints.zero_stage or ()):
            raise PlanInputError("zero", f"ZeRO stages are 0, 1, 2, 3; got {zero}")
        if efficiency is None and calibration is not None:
            from planner.io.calibration import efficiency_for, load_calibration

            efficiency = efficiency_for(load_calibration(calibration), clusters[0].gpu.name,
                                        setup.precision.compute_dtype)
        sweep.check_sort(sort)
        console = human_console()
        results = _run(spec, clusters, setup, constraints, sort, top, show_rejected, efficiency,
                       console)
        if csv_path == "-":
            sys.stdout.write(report.csv_text(results))
        elif csv_path:
            Path(csv_path).write_text(report.csv_text(results))
        if as_json:
            report.emit(results)
        else:
            report.render(console, results)
        raise typer.Exit(EXIT_FITS if any(r.top for r in results) else EXIT_DOES_NOT_FIT)


def _run(spec, clusters, setup, constraints, sort, top, show_rejected, efficiency, console):
    """One sweep per GPU count, with a progress bar on stderr."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from planner.search.sweep import sweep

    results = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    # a terminal gets a live bar; redirected stderr gets nothing extra
    with Progress(*columns, console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        for cl in clusters:
            task = progress.add_task(f"{cl.num_gpus} GPUs", total=None)

            def report_progress(done: int, total: int, task=task) -> None:
                progress.update(task, completed=done, total=total)

            results.append(sweep(spec, cl, setup, constraints, sort=sort, top=top,
                                 rejected=show_rejected, efficiency=efficiency,
                                 progress=report_progress))
    return results
