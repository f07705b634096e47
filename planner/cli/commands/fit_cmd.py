"""`zplan fit`, `zplan presets`, `zplan show`.

Seed and paper citations: docs/references.md
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from planner.cli.commands import _options as opt
from planner.cli.commands._common import EXIT_DOES_NOT_FIT, EXIT_FITS, input_errors_exit_2
from planner.core.errors import PlanInputError
from planner.core.recipes import DEFAULT_OPTIMIZER, DEFAULT_PRECISION
from planner.core.spec import Cluster, Layout, ModelSpec

_LAYOUT_HELP = "Layout (any of these selects an explicit layout; without them zplan searches)"


def _tempo(value: Optional[str]) -> tuple[str, ...]:
    """`--tempo gelu,layernorm` or `--tempo all` as a tuple of techniques."""
    if not value:
        return ()
    if value == "all":
        return ("gelu", "layernorm", "dropout")
    return tuple(part.strip() for part in value.split(",") if part.strip())


def explicit_layout(
    cluster: Cluster, model: ModelSpec, global_batch: Optional[int], **fields: object
) -> tuple[Layout, int]:
    """The layout the flags describe, with dp and grad_accum derived when not given.

    dp = GPUs / (tp*pp); grad_accum = global_batch / (micro_batch*dp), or pp when no global batch
    is given (enough micro-batches to fill the 1F1B pipeline, seed 004 §3.5.2).
    Returns the layout and the global batch.
    """
    tp, pp = int(fields["tp"] or 1), int(fields["pp"] or 1)  # type: ignore[call-overload]
    dp = fields.pop("dp")
    if dp is None:
        if cluster.num_gpus % (tp * pp):
            raise PlanInputError(
                "dp", f"GPUs {cluster.num_gpus} are not divisible by tp*pp = {tp}*{pp}"
            )
        dp = cluster.num_gpus // (tp * pp)
    micro = int(fields["micro_batch"])  # type: ignore[call-overload]
    grad_accum = fields.pop("grad_accum")
    if grad_accum is None:
        if global_batch is None:
            grad_accum = pp
        elif global_batch % (micro * int(dp)):  # type: ignore[call-overload]
            raise PlanInputError(
                "global_batch",
                f"global_batch={global_batch} is not divisible by micro_batch*dp = {micro}*{dp}",
            )
        else:
            grad_accum = global_batch // (micro * int(dp))  # type: ignore[call-overload]
    layout = Layout(dp=dp, grad_accum=grad_accum, **{k: v for k, v in fields.items() if v is not None})  # type: ignore[arg-type]
    batch = global_batch if global_batch is not None else layout.micro_batch * layout.grad_accum * layout.dp
    return layout, batch


@input_errors_exit_2
def fit(
    model: opt.ModelOpt,
    cluster: opt.ClusterOpt = None,
    gpu: opt.GpuOpt = None,
    gpus: opt.GpusOpt = None,
    tp: Annotated[Optional[int], typer.Option(min=1, help="Tensor-parallel degree.", rich_help_panel=_LAYOUT_HELP)] = None,
    pp: Annotated[Optional[int], typer.Option(min=1, help="Pipeline-parallel degree.", rich_help_panel=_LAYOUT_HELP)] = None,
    dp: Annotated[Optional[int], typer.Option(min=1, help="Data-parallel degree [default: GPUs/(tp*pp)].", rich_help_panel=_LAYOUT_HELP)] = None,
    vp: Annotated[Optional[int], typer.Option("--virtual-stages", min=1, help="Virtual pipeline stages per rank (interleaved 1F1B).", rich_help_panel=_LAYOUT_HELP)] = None,
    zero: Annotated[Optional[int], typer.Option("--zero", min=0, max=3, help="ZeRO stage 0-3.", rich_help_panel=_LAYOUT_HELP)] = None,
    offload_optimizer: Annotated[Optional[str], typer.Option(help="none|cpu|nvme", rich_help_panel=_LAYOUT_HELP)] = None,
    offload_params: Annotated[Optional[str], typer.Option(help="none|cpu|nvme (ZeRO-3)", rich_help_panel=_LAYOUT_HELP)] = None,
    recompute: Annotated[Optional[str], typer.Option(help="none|selective|full|every_k", rich_help_panel=_LAYOUT_HELP)] = None,
    recompute_every_k: Annotated[Optional[int], typer.Option(min=1, help="Layers per checkpointed segment for every_k.", rich_help_panel=_LAYOUT_HELP)] = None,
    sequence_parallel: Annotated[Optional[bool], typer.Option("--sequence-parallel/--no-sequence-parallel", help="Megatron sequence parallelism (tp > 1).", rich_help_panel=_LAYOUT_HELP)] = None,
    flash_attention: Annotated[Optional[bool], typer.Option("--flash-attention/--no-flash-attention", help="Fused attention: no s x s tensors saved.", rich_help_panel=_LAYOUT_HELP)] = None,
    tempo: Annotated[Optional[str], typer.Option(help="Tempo techniques: gelu,layernorm,dropout or all.", rich_help_panel=_LAYOUT_HELP)] = None,
    micro_batch: Annotated[Optional[int], typer.Option(min=1, help="Sequences per micro-batch per GPU.", rich_help_panel=_LAYOUT_HELP)] = None,
    grad_accum: Annotated[Optional[int], typer.Option(min=1, help="Micro-batches per step [default: global/(micro*dp), or pp].", rich_help_panel=_LAYOUT_HELP)] = None,
    seq_len: opt.SeqLenOpt = None,
    global_batch: opt.GlobalBatchOpt = None,
    tokens: opt.TokensOpt = opt.DEFAULT_TOKENS,
    precision: opt.PrecisionOpt = DEFAULT_PRECISION,
    optimizer: opt.OptimizerOpt = DEFAULT_OPTIMIZER,
    calibration: opt.CalibrationOpt = None,
    profiles: opt.ProfilesOpt = None,
    json_out: opt.JsonOpt = False,
) -> int:
    """Does MODEL fit on CLUSTER? Per-stage GPU memory, CPU/NVMe per node, and the verdict.

    With layout options: the breakdown of that layout. Without: the best layout found and the
    minimum GPUs of every strategy (DDP, ZeRO-1/2/3, offload, TP x PP x DP).
    Exit 0 fits, 1 does not fit, 2 bad input.
    """
    from planner.search import fitting
    from planner.io.jobfile import make_setup
    from planner.cli.report import fit as render

    spec = opt.resolve_model(model, profiles)
    hardware = opt.resolve_cluster(cluster, gpu, gpus, profiles)
    length = opt.default_seq_len(spec, seq_len)
    efficiency = fitting.calibrated_efficiency(calibration, hardware, precision)
    layout_fields = dict(
        tp=tp, pp=pp, dp=dp, virtual_stages=vp, zero_stage=zero, offload_optimizer=offload_optimizer,
        offload_params=offload_params, recompute=recompute, recompute_every_k=recompute_every_k,
        sequence_parallel=sequence_parallel, flash_attention=flash_attention,
        tempo=_tempo(tempo) or None, micro_batch=micro_batch, grad_accum=grad_accum,
    )
    if any(value is not None for value in layout_fields.values()):
        layout_fields["micro_batch"] = micro_batch or 1
        layout, batch = explicit_layout(hardware, spec, global_batch, **layout_fields)
        setup = make_setup(length, batch, tokens, precision, optimizer)
        result = fitting.fit_layout(spec, hardware, layout, setup, efficiency)
    else:
        batch = global_batch if global_batch is not None else hardware.num_gpus
        setup = make_setup(length, batch, tokens, precision, optimizer)
        result = fitting.fit_search(spec, hardware, setup, efficiency)
    if json_out:
        render.emit(result)
    else:
        render.print_fit(result)
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
