"""Rendering of `zplan sweep`: ranked tables, JSON / CSV with every column."""

from __future__ import annotations

import csv
import io
from typing import Any

from rich.console import Console
from rich.table import Table

from planner.cli.report import GIB, emit_json, fmt_seconds, print_table
from planner.cli.report import table as new_table
from planner.search.sweep import SweepResult, SweepRow


def layout_label(row: SweepRow) -> str:
    """Short description of the non-default choices: `z3 off=cpu/- rc=sel sp L=7/7 ring` (L: the
    uneven first / last stage layers; ring / a2a: the context-parallel comm type when cp > 1)."""
    lay = row.layout
    parts = [f"z{lay.zero_stage}" + (" fsdp2" if lay.dp_engine == "fsdp2" else "")]
    if lay.ep > 1:
        parts.append(f"ep{lay.ep}")
    if lay.offload_optimizer != "none" or lay.offload_params != "none":
        parts.append(f"off={lay.offload_optimizer.replace('none', '-')}/"
                     f"{lay.offload_params.replace('none', '-')}")
    if lay.recompute != "none":
        parts.append(f"rc={lay.recompute[:3]}" + (str(lay.recompute_num_layers or "")))
    if lay.sequence_parallel:
        parts.append("sp")
    if lay.first_stage_layers or lay.last_stage_layers:  # Megatron's uneven first / last stage
        parts.append(f"L={lay.first_stage_layers or '-'}/{lay.last_stage_layers or '-'}")
    if lay.cp > 1:
        parts.append("ring" if lay.cp_comm_type == "p2p" else "a2a")
    return " ".join(parts)


def shard_cell(row: SweepRow) -> str:
    """The HSDP shard group (`Layout.dp_shard`) when smaller than dp, else `-` (states over the
    whole dp group)."""
    lay = row.layout
    return str(lay.dp_shard) if lay.dp_shard is not None and lay.dp_shard < lay.dp else "-"


def _layout_cells(row: SweepRow) -> list[str]:
    lay = row.layout
    return [str(lay.tp), str(lay.pp), str(lay.dp), shard_cell(row), str(lay.cp),
            str(lay.virtual_stages), layout_label(row), str(lay.micro_batch), str(lay.grad_accum)]


def _add_columns(table: Table, names: tuple[str, ...], text: tuple[str, ...] = ("states",)) -> None:
    """Numbers right-aligned and never wrapped or cut; the `text` columns left-aligned, and the
    ones that wrap when the table must fit 100 columns (report.PIPE_WIDTH)."""
    for name in names:
        table.add_column(name, justify="left" if name in text else "right",
                         no_wrap=name not in text)


def ranked_table(result: SweepResult) -> Table:
    """The top layouts, best first. The run's length in days, or in GPU-hours when ranked by
    them (days x 24 x the GPUs: the same order at one GPU count); both are in `--json` /
    `--csv`. The table keeps to 100 columns."""
    table = new_table(f"{result.model} on {result.cluster}: {result.num_gpus} GPUs, "
                        f"best {len(result.top)} of {result.fitting} fitting "
                        f"({result.evaluated} evaluated), by {result.sort}")
    gpu_hours = result.sort == "gpu-hours"
    _add_columns(table, ("#", "tp", "pp", "dp", "shard", "cp", "v", "states", "mb", "ga", "step",
                         "tok/s", "MFU", "GPU-h" if gpu_hours else "days", "peak\nGiB", "free\nGiB"))
    for rank, row in enumerate(result.top, start=1):
        est = row.estimate
        table.add_row(str(rank), *_layout_cells(row), fmt_seconds(est.step_s),
                      f"{est.tokens_per_s:,.0f}", f"{est.mfu:.1%}",
                      f"{est.gpu_hours:,.0f}" if gpu_hours else f"{est.days:,.1f}",
                      f"{row.gpu_peak_bytes / GIB:,.1f}", f"{row.headroom_bytes / GIB:,.1f}")
    return table


def cp_note(result: SweepResult) -> list[str]:
    """Why the first layout splits sequences: what it saves against the best layout without
    context parallelism (`SweepResult.best_without_cp`)."""
    if not result.top or result.top[0].layout.cp == 1:
        return []
    best, lay = result.top[0], result.top[0].layout
    line = (f"#1 splits each sequence over cp={lay.cp} GPUs ({lay.cp_comm_type}; exposed cp "
            f"traffic {best.estimate.cp_comm_s:.2f} s)")
    plain = result.best_without_cp
    if plain is None:
        return [line + "; no layout without context parallelism fits"]
    est, p = plain.estimate, plain.layout
    return [line + f"; the best without it, tp {p.tp} pp {p.pp} dp {p.dp} shard {shard_cell(plain)} "
            f"{layout_label(plain)}, "
            f"takes {fmt_seconds(est.step_s)} (recompute {est.recompute_s:.2f} s, offload "
            f"{est.offload_s:.2f} s, tp {est.tp_comm_s:.2f} s): "
            f"{1 - best.estimate.step_s / est.step_s:.1%} less step time with cp"]


def variant_notes(result: SweepResult) -> list[str]:
    """One line per ranked row that folds near-identical layouts (sweep.collapse_variants):
    other offload targets, or other HSDP shard groups (`dp_shard=N`)."""
    lines = []
    for rank, row in enumerate(result.top, start=1):
        shards = [v for v in row.variants if v.startswith("dp_shard=")]
        offloads = [v for v in row.variants if v not in shards]
        parts = ([f"offload optimizer/params {', '.join(offloads)}"] if offloads else []) + \
            ([f"HSDP {', '.join(shards)}"] if shards else [])
        if parts:
            lines.append(f"#{rank} also as {' and '.join(parts)} (same fit, step within 0.5 %)")
    return lines


def engine_note(result: SweepResult) -> list[str]:
    """Which engines can run the first row (as `zplan fit` prints it), and how to keep one."""
    engines = result.top[0].engines
    return [f"engines that can run #1: {', '.join(engines) or 'none'}"
            + ("" if len(engines) == 4 else " (--engine E shows only what E runs)")]


def breakdown_table(row: SweepRow) -> Table:
    """Where the best layout's step time goes."""
    est = row.estimate
    table = new_table(f"step time of #1 ({fmt_seconds(est.step_s)}, efficiency "
                        f"{est.compute_efficiency:.2f} of dense peak)")
    table.add_column("term")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for name in ("compute_s", "recompute_s", "memory_bound_s", "tp_comm_s", "cp_comm_s", "pp_comm_s",
                 "bubble_s", "dp_comm_exposed_s", "offload_s", "cpu_optimizer_s",
                 "gpu_optimizer_s", "ep_comm_s", "host_overhead_s"):
        value = getattr(est, name)
        table.add_row(name.removesuffix("_s"), f"{value:.4f}", f"{value / est.step_s:.1%}")
    table.add_row("dp_comm (incl. hidden)", f"{est.dp_comm_s:.4f}", "")
    return table


def rejected_table(result: SweepResult) -> Table:
    """The fastest layouts that do not fit, and why."""
    table = new_table(f"fastest rejected layouts ({result.evaluated - result.fitting} rejected)")
    _add_columns(table, ("tp", "pp", "dp", "shard", "cp", "v", "states", "mb", "ga", "step",
                         "rejected because"), text=("states", "rejected because"))
    for row in result.rejected:
        table.add_row(*_layout_cells(row), fmt_seconds(row.estimate.step_s), row.reason)
    return table


def scaling_table(results: list[SweepResult]) -> Table:
    """Best layout per GPU count; scaling efficiency = tokens/s per GPU vs the first count."""
    table = new_table("scaling: best layout per GPU count")
    _add_columns(table, ("GPUs", "tp", "pp", "dp", "shard", "cp", "v", "states", "mb", "ga", "step",
                         "tokens/s", "MFU", "days", "scaling eff."))
    base = None
    for result in results:
        if not result.top:
            table.add_row(str(result.num_gpus), *["-"] * 13, "no fit")
            continue
        row = result.top[0]
        per_gpu = row.estimate.tokens_per_s / result.num_gpus
        base = base or per_gpu
        table.add_row(str(result.num_gpus), *_layout_cells(row), fmt_seconds(row.estimate.step_s),
                      f"{row.estimate.tokens_per_s:,.0f}", f"{row.estimate.mfu:.1%}",
                      f"{row.estimate.days:,.1f}", f"{per_gpu / base:.1%}")
    return table


def render(console: Console, results: list[SweepResult]) -> None:
    """Human output for one or several GPU counts."""
    for result in results:
        if result.top:
            print_table(console, ranked_table(result))
            for line in variant_notes(result) + engine_note(result) + cp_note(result):
                console.print(line, soft_wrap=True, highlight=False)
            print_table(console, breakdown_table(result.top[0]))
        else:
            console.print(f"[bold]{result.model} on {result.cluster}, {result.num_gpus} GPUs:[/] "
                          f"no layout fits: {result.empty_reason}")
        if result.rejected:
            print_table(console, rejected_table(result))
        console.print(f"{result.evaluated:,} layouts evaluated in {result.seconds:.2f} s")
        if result.excluded:
            console.print(excluded_line(result))
    if len(results) > 1:
        print_table(console, scaling_table(results))


def excluded_line(result: SweepResult) -> str:
    """The layout rules that removed combinations before evaluation, most first."""
    parts = sorted(result.excluded.items(), key=lambda kv: (-kv[1], kv[0]))
    return "excluded by layout rules: " + ", ".join(f"{rule} {n:,}" for rule, n in parts)


def flat_row(result: SweepResult, row: SweepRow) -> dict[str, Any]:
    """Every column of one row, flat (CSV)."""
    out: dict[str, Any] = {"num_gpus": result.num_gpus, "fits": row.fits}
    out |= {k: v for k, v in row.layout.model_dump().items() if k != "tempo"}
    out["variants"] = ";".join(row.variants)
    out["engines"] = ";".join(row.engines)
    out |= row.estimate.model_dump()
    out |= {k: getattr(row, k) for k in ("gpu_peak_bytes", "peak_stage", "headroom_bytes",
                                         "node_cpu_bytes", "node_nvme_bytes", "reason")}
    return out


def csv_text(results: list[SweepResult]) -> str:
    """Top and rejected rows of every GPU count, every column."""
    rows = [flat_row(r, row) for r in results for row in (*r.top, *r.rejected)]
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buffer.getvalue()


def emit(results: list[SweepResult]) -> None:
    """`--json`: one document with a result per GPU count."""
    emit_json("sweep", {"results": [r.model_dump(mode="json") for r in results]})
