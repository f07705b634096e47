"""Rendering of `zplan infer` and `zplan budget`: rich tables and `--json` on stdout."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from planner.cli.report import emit_json, fmt_count, fmt_seconds, gib, human_console
from planner.cli.report import table as new_table
from planner.memory.reserve import headroom_warning

if TYPE_CHECKING:
    from planner.timing.budget import ComputeBudget, LossTerms, ModelBudget
    from planner.memory.infer import InferMemory, InferPlan, Roofline


def _roofline_row(table: Table, phase: str, r: Roofline, result: str) -> None:
    table.add_row(phase, f"{r.flops:.3e}", gib(r.hbm_bytes), f"{r.intensity_flops_per_byte:,.1f}",
                  f"{r.ridge_flops_per_byte:,.1f}", r.bound, fmt_seconds(r.time_s), result)


def _memory_rows(mem: InferMemory) -> list[tuple[str, int]]:
    """(label, bytes) rows of the per-GPU memory table, in the order of the account."""
    step = f"activation peak ({mem.step_tokens:,}-token step)"
    if mem.account == "seed":
        return [("weights", mem.weights_bytes), ("KV cache", mem.kv_cache_bytes), (step, mem.workspace_bytes),
                ("runtime overhead (20 % of weights, seed 004 §2.3.2)", mem.overhead_bytes),
                ("total", mem.total_bytes), ("capacity (nominal HBM)", mem.capacity_bytes),
                ("headroom", mem.headroom_bytes)]
    outside = [name for name in mem.reserve_parts if name not in ("cublas_workspace", "user_reserve")]
    inside = [(f"reserve: {name.replace('_', ' ')}", value) for name, value in mem.reserve_parts.items()
              if name not in outside]
    margin = [(f"outside the budget: {name.replace('_', ' ')}", mem.reserve_parts[name]) for name in outside]
    return [("weights", mem.weights_bytes), (step, mem.workspace_bytes), *inside,
            ("KV cache needed", mem.kv_cache_bytes), ("KV cache room", mem.kv_budget_bytes),
            (f"budget ({mem.memory_utilisation:g} × capacity)", mem.budget_bytes),
            ("headroom in the budget", mem.headroom_bytes), *margin,
            ("total", mem.total_bytes), ("capacity (CUDA-reported)", mem.capacity_bytes)]


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
        f"context={cfg.context:,}, account {mem.account}")
    table = new_table(f"Memory per GPU (one of {cfg.tp} tp ranks)")
    table.add_column("part")
    table.add_column("GiB", justify="right")
    for name, value in _memory_rows(mem):
        table.add_row(name, gib(value))
    console.print(table)
    verdict = "[green]fits[/green]" if mem.fits else "[red]does not fit[/red]"
    tp_text = "none (not even tp = num_kv_heads)" if plan.min_tp is None else str(plan.min_tp)
    warning = headroom_warning(mem.headroom_bytes, mem.capacity_bytes) if mem.account == "seed" else None
    console.print(f"{verdict}{f' ({warning})' if warning else ''}; largest batch at context "
                  f"{cfg.context:,}: {plan.max_batch:,}; largest context at batch {cfg.batch}: "
                  f"{plan.max_context:,}; smallest tp that fits: {tp_text}")
    speed = new_table(f"Roofline bounds per tp rank ({plan.compute_dtype} peak × {plan.efficiency:.2f}, "
                        "HBM peak); the tp ranks run each step together")
    for header in ("phase", "FLOPs", "HBM GiB", "FLOP/byte", "ridge", "bound", "time ≥", "rate ≤"):
        speed.add_column(header, justify="left" if header in ("phase", "bound") else "right")
    _roofline_row(speed, "prefill", plan.prefill,
                  f"TTFT ≥ {fmt_seconds(plan.ttft_s)}")
    _roofline_row(speed, "decode step", plan.decode,
                  f"{plan.decode_tokens_per_s:,.1f} tok/s per tp group")
    console.print(speed)
    console.print(f"decode: ≤ {plan.decode_tokens_per_s:,.1f} tok/s for the tp group of {cfg.tp} GPU"
                  f"{'s' if cfg.tp > 1 else ''} = ≤ {plan.decode_tokens_per_s_per_gpu:,.1f} tok/s per GPU")
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
    console.print(f"compute-optimal by the D = {budget.optimal_tokens / budget.optimal_params:g}·N rule: "
                  f"N = {fmt_count(budget.optimal_params)} parameters, "
                  f"D = {fmt_count(budget.optimal_tokens)} tokens (C = 6·N·D)")
    console.print(_loss_line(budget.loss, budget.law))
    if budget.loss_optimal_params is not None and budget.loss_at_loss_optimal is not None:
        console.print(f"compute-optimal by the argmin of the fitted law: N = {fmt_count(budget.loss_optimal_params)} "
                      f"parameters, D = {fmt_count(budget.loss_optimal_tokens)} tokens (C = 6·N·D)")
        console.print(_loss_line(budget.loss_at_loss_optimal, budget.law))


def render_model_budget(budget: ModelBudget, gpu_name: str | None, json_out: bool) -> None:
    """Training cost of a given model and token count, and its predicted loss."""
    if json_out:
        emit_json("budget", {"mode": "model", "gpu": gpu_name, **budget.model_dump(mode="json")})
        return
    console = human_console()
    active = "" if budget.active_params == budget.params else f" ({fmt_count(budget.active_params)} active)"
    console.print(f"{fmt_count(budget.params)} parameters{active} × {fmt_count(budget.tokens)} tokens × "
                  f"{budget.k} = [bold]{budget.flops - budget.attention_flops:.3e}[/bold] FLOPs "
                  f"({budget.tokens_per_param:.1f} tokens per parameter; compute-optimal "
                  f"{fmt_count(budget.compute_optimal_tokens)} tokens)")
    if budget.seq_len is not None:
        console.print(f"+ attention at sequence length {budget.seq_len:,}: "
                      f"{budget.attention_flops:.3e} FLOPs "
                      f"({budget.attention_flops / (budget.flops - budget.attention_flops):.1%} on top)"
                      f" = [bold]{budget.flops:.3e}[/bold] FLOPs")
    if budget.days is not None and budget.gpu_hours is not None:
        console.print(f"on {budget.num_gpus:,} × {gpu_name} at MFU {budget.mfu:.2f}: "
                      f"[bold]{budget.days:,.1f} days[/bold], {budget.gpu_hours:,.0f} GPU-hours")
    console.print(_loss_line(budget.loss, budget.law))
