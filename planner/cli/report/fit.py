"""Rendering of `zplan fit`, `zplan presets` and `zplan show`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from planner.cli.report import (emit_json, fmt_bytes, fmt_count, fmt_seconds, fmt_short, gib,
                                 human_console, print_table)
from planner.cli.report import table as new_table
from planner.cli.report.check import transient_note
from planner.memory.reserve import headroom_warning

if TYPE_CHECKING:
    from planner.search.fitting import FitResult, ModelSummary
    from planner.memory.plan import MemoryPlan

BAR_WIDTH = 24


def _bar(used: int, capacity: int) -> str:
    """A text bar of used / capacity; red past capacity."""
    fraction = used / capacity if capacity else 1.0
    filled = min(BAR_WIDTH, round(fraction * BAR_WIDTH))
    colour = "red" if fraction > 1 else "yellow" if fraction > 0.9 else "green"
    return f"[{colour}]{'█' * filled}[/{colour}]{'·' * (BAR_WIDTH - filled)} {fraction:5.0%}"


WIDE_COLUMNS = 130
"""From this console width on, the memory table draws a bar instead of a percentage."""


def memory_table(memory: MemoryPlan, wide: bool = False) -> Table:
    """One row per pipeline stage: every part of the per-GPU bytes, total, headroom, use of the
    GPU (a bar on a wide console, a percentage otherwise, so the table fits 100 columns)."""
    table = new_table("Memory per GPU, per pipeline stage (GiB; in-flt: micro-batches in flight, free: headroom)")
    for header in ("stage", "layers", "params", "grads", "optim.", "activ.", "in-flt",
                   "buffers", "working", "total", "free", "use of GPU" if wide else "use"):
        table.add_column(header, justify="left" if header == "use of GPU" else "right", no_wrap=True)
    for s in memory.stages:
        use = (_bar(s.total_bytes, s.capacity_bytes) if wide
               else f"{s.total_bytes / s.capacity_bytes:.0%}" if s.capacity_bytes else "-")
        table.add_row(
            str(s.stage), str(s.num_layers), gib(s.params_bytes), gib(s.grads_bytes),
            gib(s.optimizer_bytes), gib(s.activations_bytes), str(s.in_flight_microbatches),
            gib(sum(s.buffers.values())), gib(sum(s.working.values())),
            gib(s.total_bytes), gib(s.headroom_bytes), use,
        )
    if memory.reserve:  # the runtime reserve of every GPU, its own row (parts: reserve_line)
        table.add_row("reserve", *["-"] * 8, gib(sum(memory.reserve.values())), "-", "-")
    return table


def reserve_line(memory: MemoryPlan, gpu_memory_bytes: int) -> str:
    """The reserve's named parts and the capacity they leave (planner.memory.reserve)."""
    if not memory.reserve:
        return f"runtime reserve: none ({memory.reserve_note})"
    parts = ", ".join(f"{name} {fmt_bytes(b)}" for name, b in memory.reserve.items())
    capacity = memory.stages[0].capacity_bytes
    return (f"runtime reserve per GPU {fmt_bytes(sum(memory.reserve.values()))} ({parts}): "
            f"capacity {fmt_bytes(capacity)} of {fmt_bytes(gpu_memory_bytes)}")


def _layout_line(result: FitResult) -> str:
    layout = result.layout
    if layout is None:
        return "no layout"
    parts = [f"tp={layout.tp}", f"pp={layout.pp}", f"dp={layout.dp}", f"zero={layout.zero_stage}",
             f"micro_batch={layout.micro_batch}", f"grad_accum={layout.grad_accum}",
             f"recompute={layout.recompute_label}"]
    if layout.dp_engine != "deepspeed":
        parts.insert(4, f"dp_engine={layout.dp_engine}")
    if layout.dp_shard is not None and layout.dp_shard < layout.dp:  # HSDP: the 2-D mesh
        parts.insert(3, f"dp_shard={layout.dp_shard} (HSDP {layout.dp // layout.dp_shard}x"
                        f"{layout.dp_shard})")
    if layout.ep > 1:
        parts.insert(3, f"ep={layout.ep}")
    if layout.virtual_stages > 1:
        parts.append(f"virtual_stages={layout.virtual_stages}")
    if layout.cp > 1:
        parts.insert(3, f"cp={layout.cp} ({layout.cp_comm_type})")
    if layout.first_stage_layers is not None or layout.last_stage_layers is not None:
        parts.append(f"first/last_stage_layers={layout.first_stage_layers}/{layout.last_stage_layers}")
    if layout.offload_optimizer != "none":
        parts.append(f"offload_optimizer={layout.offload_optimizer}")
    if layout.offload_params != "none":
        parts.append(f"offload_params={layout.offload_params}")
    if layout.sequence_parallel:
        parts.append("sequence_parallel")
    if layout.flash_attention:
        parts.append("flash_attention")
    if layout.megatron_overlap is not None:
        parts.append("megatron_overlap=" + (",".join(layout.megatron_overlap) or "none"))
    return " ".join(parts)


def verdict_line(result: FitResult) -> str:
    """One line: FITS with the tightest headroom, or DOES NOT FIT and what overflows."""
    memory = result.memory
    if memory is None:
        return f"DOES NOT FIT: no layout of {result.cluster.num_gpus} GPUs fits"
    if memory.fits:
        peak = memory.peak_stage
        warning = headroom_warning(peak.headroom_bytes, peak.capacity_bytes)
        line = (f"FITS: peak {fmt_bytes(peak.total_bytes)} of {fmt_bytes(peak.capacity_bytes)} "
                f"on stage {peak.stage} (headroom {fmt_bytes(peak.headroom_bytes)})"
                + (f"; {warning}" if warning else "") + transient_note(peak))
    else:
        line = "DOES NOT FIT: " + "; ".join(memory.overflows)
    return line + (f"; {memory.host_accounting_note}" if memory.host_accounting_note else "")


def print_fit(result: FitResult) -> None:
    """Human report of `zplan fit` on stdout."""
    console = human_console()
    cluster = result.cluster
    console.print(
        f"[bold]{result.model.name}[/bold]: {fmt_count(result.params_total)} parameters  |  "
        f"{cluster.name}: {cluster.num_gpus} x {cluster.gpu.name} ({cluster.num_nodes} node{'s' if cluster.num_nodes != 1 else ''})  |  "
        f"seq {result.setup.seq_len}, global batch {result.setup.global_batch}, "
        f"{result.setup.precision.name} + {result.setup.optimizer.name}"
    )
    label = "best layout found" if result.searched else "layout"
    console.print(f"{label}: {_layout_line(result)}")
    if result.layout is not None:
        console.print(f"engines that can run it: {', '.join(engines(result)) or 'none'}")
    if result.memory is not None:
        print_table(console, memory_table(result.memory, wide=console.width >= WIDE_COLUMNS))
        console.print(reserve_line(result.memory, cluster.gpu.memory_bytes))
        node = result.memory.node
        console.print(
            f"per node: CPU {fmt_bytes(node.cpu_bytes)} of {fmt_bytes(node.cpu_capacity_bytes)}, "
            f"NVMe {fmt_bytes(node.nvme_bytes)} of {fmt_bytes(node.nvme_capacity_bytes)}"
        )
    if result.step is not None:
        step = result.step
        console.print(
            f"step {fmt_seconds(step.step_s)}, {step.tokens_per_s:,.0f} tokens/s, "
            f"MFU {step.mfu:.1%}{mfu_note(result.setup)}, {step.days:,.1f} days for "
            f"{fmt_short(result.setup.train_tokens)} tokens "
            f"({step.gpu_hours:,.0f} GPU-hours)"
            + (f"; expert all-to-all {fmt_seconds(step.ep_comm_s)}" if step.ep_comm_s else "")
            + (f"; host overhead (calibrated) {fmt_seconds(step.host_overhead_s)}" if step.host_overhead_s else "")
        )
    if result.strategies:
        print_table(console, strategy_table(result))
    console.print(verdict_line(result), style="bold green" if result.fits else "bold red")
    from planner.cli.report.check import suggestion_lines

    for line in suggestion_lines(result.suggestions):
        console.print(line, highlight=False)


def strategy_table(result: FitResult) -> Table:
    """Minimum GPUs of each strategy."""
    table = new_table(f"Minimum GPUs per strategy ({result.cluster.gpu.name}, micro-batch 1, full recompute)")
    table.add_column("strategy")
    table.add_column("min GPUs", justify="right")
    table.add_column("layout")
    for row in result.strategies:
        layout = row.layout
        shape = "never fits" if layout is None else f"tp={layout.tp} pp={layout.pp} dp={layout.dp}"
        table.add_row(row.strategy, "-" if row.min_gpus is None else f"{row.min_gpus:,}", shape)
    return table


def emit(result: FitResult) -> None:
    """`zplan fit --json`."""
    emit_json("fit", {"verdict": verdict_line(result), **result.model_dump(mode="json"),
                      "engines": engines(result)})


def engines(result: FitResult) -> list[str]:
    """The engines that can run the layout shown (planner.io.engines); [] without a layout."""
    from planner.io.engines import supported_engines

    if result.layout is None:
        return []
    return supported_engines(result.model, result.layout, result.setup.precision)


def print_presets(listing: dict[str, list[str]], json_out: bool) -> None:
    """`zplan presets`."""
    if json_out:
        emit_json("presets", listing)
        return
    console = human_console()
    for kind, names in listing.items():
        console.print(f"[bold]{kind}[/bold] ({len(names)}): " + ", ".join(names))


def print_model(summary: ModelSummary, json_out: bool) -> None:
    """`zplan show MODEL`."""
    if json_out:
        emit_json("model", summary)
        return
    console = human_console()
    count = summary.params
    table = new_table(f"{summary.model.name}: parameters")
    table.add_column("part")
    table.add_column("parameters", justify="right")
    rows = [
        ("embeddings", count.embedding),
        ("one block: attention", count.layer.attention),
        ("one block: MLP / experts", count.layer.mlp),
        ("one block: router", count.layer.router),
        ("one block: norms", count.layer.norms),
        (f"all {summary.model.num_layers} blocks", count.layers),
        ("final norm", count.final_norm),
        ("output projection (untied)", count.lm_head),
        ("pooler", count.pooler),
        ("total", count.total),
        ("active per token", count.active),
        ("seed approx. 12·nl·hd²", summary.approx_12lh2),
        ("seed approx. 12·nl·hd² + 2·V·hd", summary.approx_with_embeddings),
    ]
    if summary.model.published_params:
        rows.append(("published", summary.model.published_params))
    for name, value in rows:
        table.add_row(name, fmt_count(value))
    console.print(table)
    f = summary.flops_per_token
    per = summary.seq_len
    console.print(
        f"FLOPs per token at seq {per}: forward {f.forward_flops / per:,.4g}, backward "
        f"{f.backward_flops / per:,.4g}, training {f.model_flops / per:,.4g} "
        f"(6·active params = {6 * count.active:,.4g})"
    )


def mfu_note(setup) -> str:
    """What an fp8 run's MFU is stated against: the bf16 peak, as the field reports it
    (planner.memory.fp8.mfu_peak_dtype; docs/fp8.md)."""
    from planner.memory.fp8 import mfu_peak_dtype

    dtype = setup.precision.compute_dtype
    peak = mfu_peak_dtype(dtype)
    return f" (of the {peak} peak; fp8 GEMMs at the fp8 peak)" if peak != dtype else ""
