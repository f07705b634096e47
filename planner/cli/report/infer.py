"""Rendering of `zplan infer` and `zplan budget`: rich tables and `--json` on stdout."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from planner.cli.report import emit_json, fmt_bytes, fmt_count, fmt_seconds, human_console
from planner.cli.report import table as new_table

if TYPE_CHECKING:
    from planner.timing.budget import ComputeBudget, LossTerms, ModelBudget
    from planner.memory.infer import InferPlan, Roofline


def _roofline_row(table: Table, phase: str, r: Roofline, result: str) -> None:
    table.add_row(phase, f"{r.flops:.3e}", fmt_bytes(r.hbm_bytes), f"{r.intensity_flops_per_byte:,.1f}",
                  f"{r.ridge_flops_per_byte:,.1f}", r.bound, fmt_seconds(r.time_s), result)


def render_infer(plan: InferPlan, json_out: bool) -> None:
    """The memory breakdown, the limits and the speed bounds of one deployment."""
    if json_out:
        emit_json("infer", plan)
        return
    cfg, mem = plan.config, plan.memory
    console = human_console()
    console.print(
        f"[bold]{plan.model}[/bold] on [bold]{plan.gpu}[/bold]: {fmt_count(plan.params_total)} params, "
        f"weights {cfg.weights}, KV cache {cfg.kv_dtype}, tp={cfg.tp}, batch={cfg.batch}, "
        f"context={cfg.context:,}")
    table = new_table("Memory per GPU")
    table.add_column("part")
    table.add_column("bytes", justify="right")
    for name, value in (("weights", mem.weights_bytes), ("KV cache", mem.kv_cache_bytes),
                        ("forward workspace", mem.workspace_bytes),
                        ("runtime overhead (20 % of weights)", mem.overhead_bytes),
                        ("total", mem.total_bytes), ("capacity", mem.capacity_bytes),
                        ("headroom", mem.headroom_bytes)):
        table.add_row(name, fmt_bytes(value))
    console.print(table)
    verdict = "[green]fits[/green]" if mem.fits else "[red]does not fit[/red]"
    tp_text = "none (not even tp = num_kv_heads)" if plan.min_tp is None else str(plan.min_tp)
    console.print(f"{verdict}; largest batch at context {cfg.context:,}: {plan.max_batch:,}; "
                  f"largest context at batch {cfg.batch}: {plan.max_context:,}; "
                  f"smallest tp that fits: {tp_text}")
    speed = new_table(f"Roofline bounds per GPU ({plan.compute_dtype} peak × {plan.efficiency:.2f}, "
                        "HBM peak)")
    for header in ("phase", "FLOPs", "bytes", "FLOP/byte", "ridge", "bound", "time ≥", "rate ≤"):
        speed.add_column(header, justify="left" if header in ("phase", "bound") else "right")
    _roofline_row(speed, "prefill", plan.prefill,
                  f"TTFT ≥ {fmt_seconds(plan.ttft_s)}")
    _roofline_row(speed, "decode step", plan.decode,
                  f"{plan.decode_tokens_per_s:,.1f} tok/s")
    console.print(speed)
    console.print(f"prefill: {cfg.batch} × {cfg.context:,} prompt tokens; decode step: one token for each "
                  f"of {cfg.batch} sequences at context {cfg.context:,} (the slowest step)")
    for note in plan.notes:
        console.print(f"note: {note}")


def _loss_line(loss: LossTerms, law: str) -> str:
    return (f"predicted loss ({law}): {loss.finite_model:.3f} (finite model) + "
            f"{loss.finite_data:.3f} (finite data) + {loss.irreducible:.3f} (irreducible) = "
            f"[bold]{loss.loss:.3f}[/bold]")


def render_compute_budget(budget: ComputeBudget, gpu_name: str, json_out: bool) -> None:
    """FLOPs available and the compute-optimal model for them."""
    if json_out:
        emit_json("budget", {"mode": "compute", "gpu": gpu_name, **budget.model_dump(mode="json")})
        return
    console = human_console()
    console.print(
        f"{budget.num_gpus:,} × {gpu_name} at MFU {budget.mfu:.2f} for {budget.seconds / 86400:,.1f} "
        f"days ({budget.gpu_hours:,.0f} GPU-hours): [bold]{budget.flops:.3e}[/bold] training FLOPs")
    console.print(f"compute-optimal: N = {fmt_count(budget.optimal_params)} parameters, "
                  f"D = {fmt_count(budget.optimal_tokens)} tokens (C = 6·N·D, D/N from the law)")
    console.print(_loss_line(budget.loss, budget.law))


def render_model_budget(budget: ModelBudget, gpu_name: str | None, json_out: bool) -> None:
    """Training cost of a given model and token count, and its predicted loss."""
    if json_out:
        emit_json("budget", {"mode": "model", "gpu": gpu_name, **budget.model_dump(mode="json")})
        return
    console = human_console()
    active = "" if budget.active_params == budget.params else f" ({fmt_count(budget.active_params)} active)"
    console.print(f"{fmt_count(budget.params)} parameters{active} × {fmt_count(budget.tokens)} tokens × "
                  f"{budget.k} = [bold]{budget.flops:.3e}[/bold] FLOPs "
                  f"({budget.tokens_per_param:.1f} tokens per parameter; compute-optimal "
                  f"{fmt_count(budget.compute_optimal_tokens)} tokens)")
    if budget.days is not None and budget.gpu_hours is not None:
        console.print(f"on {budget.num_gpus:,} × {gpu_name} at MFU {budget.mfu:.2f}: "
                      f"[bold]{budget.days:,.1f} days[/bold], {budget.gpu_hours:,.0f} GPU-hours")
    console.print(_loss_line(budget.loss, budget.law))
