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

_LAYOUT = "Layout (any of these selects an explicit layout; without them the best layout is searched)"


def _layout_opt(help_text: str, **kw: object) -> object:
    return typer.Option(help=help_text, rich_help_panel=_LAYOUT, **kw)


@input_errors_exit_2
def export(
    fmt: Annotated[str, typer.Option("--format", "-f", help=f"One of: {', '.join(FORMATS)}.")],
    job: Annotated[Optional[Path], typer.Option("--job", help="Take model, cluster, layout and setup from a job YAML.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model preset, YAML or HF config.json.")] = None,
    cluster: opt.ClusterOpt = None,
    gpu: opt.GpuOpt = None,
    gpus: opt.GpusOpt = None,
    tp: Annotated[Optional[int], _layout_opt("Tensor-parallel degree.", min=1)] = None,
    pp: Annotated[Optional[int], _layout_opt("Pipeline-parallel degree.", min=1)] = None,
    dp: Annotated[Optional[int], _layout_opt("Data-parallel degree [default: GPUs/(tp*pp)].", min=1)] = None,
    vp: Annotated[Optional[int], typer.Option("--virtual-stages", min=1, help="Virtual stages per pipeline rank.", rich_help_panel=_LAYOUT)] = None,
    zero: Annotated[Optional[int], typer.Option("--zero", min=0, max=3, help="ZeRO stage 0-3.", rich_help_panel=_LAYOUT)] = None,
    offload_optimizer: Annotated[Optional[str], _layout_opt("none|cpu|nvme")] = None,
    offload_params: Annotated[Optional[str], _layout_opt("none|cpu|nvme (ZeRO-3)")] = None,
    recompute: Annotated[Optional[str], _layout_opt("none|selective|full|every_k")] = None,
    recompute_every_k: Annotated[Optional[int], _layout_opt("Layers per checkpointed segment.", min=1)] = None,
    sequence_parallel: Annotated[Optional[bool], typer.Option("--sequence-parallel/--no-sequence-parallel", help="Megatron sequence parallelism.", rich_help_panel=_LAYOUT)] = None,
    flash_attention: Annotated[Optional[bool], typer.Option("--flash-attention/--no-flash-attention", help="Fused attention.", rich_help_panel=_LAYOUT)] = None,
    micro_batch: Annotated[Optional[int], _layout_opt("Sequences per micro-batch per GPU.", min=1)] = None,
    grad_accum: Annotated[Optional[int], _layout_opt("Micro-batches per step.", min=1)] = None,
    seq_len: opt.SeqLenOpt = None,
    global_batch: opt.GlobalBatchOpt = None,
    tokens: opt.TokensOpt = opt.DEFAULT_TOKENS,
    precision: Annotated[Optional[str], typer.Option("--precision", help="Precision recipe [default: zero-fp16].")] = None,
    optimizer: Annotated[Optional[str], typer.Option("--optimizer", help="Optimizer [default: adam].")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
    nvme_path: Annotated[str, typer.Option(help="DeepSpeed nvme_path for NVMe offload.")] = "/local_nvme",
    script: Annotated[Optional[str], typer.Option(help="Training script for megatron/torchrun lines.")] = None,
    profiles: opt.ProfilesOpt = None,
) -> None:
    """Write a layout as a DeepSpeed config, a Megatron-LM launch line, an accelerate FSDP2
    config or a torchrun line. The layout comes from --job, from layout flags, or is the best
    one the search finds. The verdict line goes to stderr; exit 0 fits, 1 does not, 2 bad input.
    """
    from planner.cli.commands.fit_cmd import explicit_layout
    from planner.io.check import check as plan_check
    from planner.io.export import export_text
    from planner.io.jobfile import make_setup
    from planner.cli.report.check import verdict_line

    if fmt not in FORMATS:
        raise PlanInputError("--format", f"{fmt!r}; allowed: {', '.join(FORMATS)}")
    layout_fields = dict(
        tp=tp, pp=pp, dp=dp, virtual_stages=vp, zero_stage=zero, offload_optimizer=offload_optimizer,
        offload_params=offload_params, recompute=recompute, recompute_every_k=recompute_every_k,
        sequence_parallel=sequence_parallel, flash_attention=flash_attention, micro_batch=micro_batch,
        grad_accum=grad_accum,
    )
    given = any(v is not None for v in layout_fields.values())
    if job is not None:
        others = (model, cluster, gpu, gpus, seq_len, global_batch, precision, optimizer)
        if given or any(value is not None for value in others):
            raise PlanInputError("--job", "the job file gives model, cluster, layout and setup; drop the other flags")
        from planner.io.jobfile import load_job

        spec, hardware, layout, setup = load_job(job, opt.extra_dirs(profiles))
    else:
        if model is None:
            raise PlanInputError("--model", "give --model (or --job JOB.yaml)")
        spec = opt.resolve_model(model, profiles)
        hardware = opt.resolve_cluster(cluster, gpu, gpus, profiles)
        length = opt.default_seq_len(spec, seq_len)
        names = dict(precision=precision or "zero-fp16", optimizer=optimizer or "adam")
        if given:
            layout_fields["micro_batch"] = micro_batch or 1
            layout, batch = explicit_layout(hardware, spec, global_batch, **layout_fields)
            setup = make_setup(length, batch, tokens, **names)
        else:
            setup = make_setup(length, global_batch or hardware.num_gpus, tokens, **names)
            layout = _best_layout(fmt, spec, hardware, setup)
    text = export_text(fmt, spec, hardware, layout, setup, nvme_path, script)  # type: ignore[arg-type]
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
    result = plan_check(spec, hardware, layout, setup)
    print(verdict_line(result) + (f" -> {output}" if output else ""), file=sys.stderr)
    raise typer.Exit(EXIT_FITS if result.fits else EXIT_DOES_NOT_FIT)


def _best_layout(fmt: str, model, cluster, setup):
    """The fastest fitting layout the format can express (planner.sweep.best_layout)."""
    from planner.io.export import search_constraints
    from planner.search.sweep import best_layout

    found = best_layout(model, cluster, setup, search_constraints(fmt))  # type: ignore[arg-type]
    if found is None:
        print(f"zplan: no layout of {model.name} fits {cluster.name} that {fmt} can express", file=sys.stderr)
        raise typer.Exit(EXIT_DOES_NOT_FIT)
    return found[0]


def register(app: typer.Typer) -> None:
    """Add `export` to the app."""
    app.command()(export)
