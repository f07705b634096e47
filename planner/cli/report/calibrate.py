"""Rendering of `zplan calibrate`: one rich table per configuration (quantity, predicted,
measured, error %), tensor classes that disagree, and the JSON document."""

from __future__ import annotations

import math
from typing import Any

from rich.markup import escape
from rich.table import Table

from planner.cli.report import emit_json, human_console, print_table

TOLERANCE_PCT = {"params": 0.0, "bytes": 2.0, "flops": 1.0}
"""Accuracy targets of issue 4: counts and model-state bytes exact, saved activations 2 %, FLOPs 1 %."""
EXACT_QUANTITIES = ("parameters", "parameter bytes", "gradient bytes", "optimizer-state bytes")


def fmt_value(value: float | None, unit: str) -> str:
    """Integers with separators for counts and bytes, milliseconds for times, 4 significant
    digits for FLOPs."""
    if value is None:
        return "-"
    if unit in ("params", "bytes", "count"):
        return f"{value:,.0f}"
    if unit == "s":
        return f"{value * 1e3:.2f} ms"
    return f"{value:.4g}"


def fmt_error(error: float | None) -> str:
    return "-" if error is None else f"{error:+.2f} %"


def tolerance_pct(quantity: str, unit: str) -> float | None:
    """The target a row is held to (None: measured only)."""
    if quantity in EXACT_QUANTITIES:
        return 0.0
    return TOLERANCE_PCT.get(unit)


def _style(row) -> str:
    tol = tolerance_pct(row.quantity, row.unit)
    err = row.error_pct
    if tol is None or err is None:
        return ""
    return "green" if abs(err) <= tol else "red"


def rows_table(title: str, rows, styled: bool = True) -> Table:
    """Quantity, predicted, measured, error, note; with `styled`, the error green or red against
    the row's tolerance."""
    table = Table(title=escape(title), title_justify="left")
    for name in ("quantity", "predicted", "measured", "error"):
        table.add_column(name, justify="left" if name == "quantity" else "right")
    table.add_column("note")
    for row in rows:
        style = _style(row) if styled else ""
        error = fmt_error(row.error_pct)
        table.add_row(row.quantity, fmt_value(row.predicted, row.unit), fmt_value(row.measured, row.unit),
                      f"[{style}]{error}[/]" if style else error, row.note)
    return table


def results_table(result) -> Table:
    """Summary table of one configuration."""
    return rows_table(f"{result.label} norms={result.measured.norm_impl} on {result.measured.device}",
                      result.rows)


def class_table(result) -> Table | None:
    """The tensor classes whose bytes differ from the planner's inventory (None if all agree)."""
    differing = [r for r in result.classes if r.predicted != r.measured]
    if not differing:
        return None
    table = Table(title="tensor classes that differ (bytes saved for backward)", title_justify="left")
    for name in ("tensor class", "predicted", "measured", "difference"):
        table.add_column(name, justify="left" if name == "tensor class" else "right")
    table.add_column("note")
    for r in differing:
        diff = r.measured - (r.predicted or 0)
        table.add_row(r.quantity, fmt_value(r.predicted, "bytes"), fmt_value(r.measured, "bytes"),
                      f"{diff:+,.0f}", r.note)
    return table


def efficiency_table(calibration) -> Table | None:
    """The calibration entries' two efficiencies and how the matmul-level one was derived
    (None when no entry has a peak to measure against)."""
    entries = [e for e in calibration.entries
               if e.efficiency is not None or e.end_to_end_utilisation is not None]
    if not entries:
        return None
    table = Table(title=f"efficiency ({entries[0].gpu}, fraction of dense peak)", title_justify="left")
    for name in ("model", "recompute", "step", "non-matmul (model)", "matmul-level", "end-to-end"):
        table.add_column(name, justify="left" if name in ("model", "recompute") else "right")
    table.add_column("how")
    for e in entries:
        flagged = e.efficiency_source == "end_to_end_fallback"
        matmul = "-" if e.efficiency is None else f"{e.efficiency:.4g}"
        table.add_row(escape(e.model), e.recompute, fmt_value(e.step_time_s, "s"), fmt_value(e.non_matmul_s, "s"),
                      f"[red]{matmul}[/]" if flagged else matmul,
                      "-" if e.end_to_end_utilisation is None else f"{e.end_to_end_utilisation:.4g}",
                      escape(e.note))
    return table


def render_human(results: list, calibration_path: str | None = None, calibration=None) -> None:
    console = human_console()
    for result in results:
        print_table(console, results_table(result))
        classes = class_table(result)
        if classes is not None:
            print_table(console, classes)
        console.print()
    efficiency = efficiency_table(calibration) if calibration is not None else None
    if efficiency is not None:
        print_table(console, efficiency)
    if calibration_path:
        console.print(f"calibration written to {calibration_path}")


def result_payload(result) -> dict[str, Any]:
    """JSON form of one configuration (rows carry their error_pct)."""
    return {"label": result.label, "run": result.run.model_dump(mode="json"),
            "measured": result.measured.model_dump(mode="json"),
            "rows": _rows_json(result.rows), "classes": _rows_json(result.classes)}


def render_distributed(distributed: dict[str, Any]) -> None:
    """Per-rank DDP / ZeRO-1 / FSDP2 table."""
    title = f"distributed: {distributed['nproc']} processes (fp32 Adam, one step)"
    print_table(human_console(), rows_table(title, distributed["rows"], styled=False))


def _rows_json(items) -> list[dict[str, Any]]:
    out = []
    for r in items:
        err = r.error_pct
        out.append(r.model_dump(mode="json") | {"error_pct": err if err is None or math.isfinite(err) else None})
    return out


def render_json(results: list, calibration=None, distributed=None) -> None:
    payload: dict[str, Any] = {"configurations": [result_payload(r) for r in results]}
    if calibration is not None:
        payload["calibration"] = calibration.model_dump(mode="json")
    if distributed is not None:
        payload["distributed"] = {"nproc": distributed["nproc"], "ranks": distributed["ranks"],
                                  "rows": _rows_json(distributed["rows"])}
    emit_json("calibrate", payload)


def render_hf_json(config_path: str, rows: list) -> None:
    """`zplan calibrate --hf-config --json`: one document, kind `calibrate-hf`."""
    emit_json("calibrate-hf", {"config": config_path, "rows": [
        r.model_dump(mode="json") | {"block_error_pct": 100 * r.block_error} for r in rows]})
