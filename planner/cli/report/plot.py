"""`--plot FILE.png|svg`: fit's per-stage memory breakdown and the sweep's step-time / memory front.

matplotlib (the `plot` extra) is imported only here and only when a picture is asked for, with the
non-interactive Agg backend; the file is written with `planner.io.safe_write.write_atomic`'s rules
(refused if it exists unless --force; temporary file in the same directory, then a rename).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.core.errors import PlanInputError
from planner.core.spec import GIB

if TYPE_CHECKING:
    from planner.search.fitting import FitResult
    from planner.search.sweep import SweepResult, SweepRow

FORMATS = {".png": "png", ".svg": "svg"}


def check_plot_target(path: Path, force: bool) -> None:
    """Refuse a bad suffix, an existing file (without --force) or a missing matplotlib up front."""
    from planner.io.safe_write import refuse_existing

    if Path(path).suffix.lower() not in FORMATS:
        raise PlanInputError("--plot", f"{path}: give a .png or .svg file name")
    refuse_existing(Path(path), force, "--plot")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlanInputError("--plot", "needs matplotlib: pip install 'zplan[plot]'") from None


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot.subplots(figsize=(8, 4.5), layout="constrained")


def _save(fig: Any, path: Path, force: bool) -> None:
    """Render to memory, then write atomically (the text API takes str; SVG is text, PNG is not)."""
    from matplotlib import pyplot

    from planner.io.safe_write import write_bytes_atomic

    buffer = io.BytesIO()
    fig.savefig(buffer, format=FORMATS[Path(path).suffix.lower()])
    pyplot.close(fig)
    write_bytes_atomic(Path(path), buffer.getvalue(), force, "--plot")


def stage_parts_gib(stage: Any) -> dict[str, float]:
    """The stacked bars of one pipeline stage: model states, activations, buffers, working (GiB)."""
    return {
        "parameters": stage.params_bytes / GIB,
        "gradients": stage.grads_bytes / GIB,
        "optimizer states": stage.optimizer_bytes / GIB,
        "activations": stage.activations_bytes / GIB,
        "buffers": sum(stage.buffers.values()) / GIB,
        "working": sum(stage.working.values()) / GIB,
    }


def plot_fit(result: FitResult, path: Path, force: bool) -> None:
    """Stacked bar per pipeline stage (GiB on one GPU) with the GPU's capacity as a line."""
    if result.memory is None:
        raise PlanInputError("--plot", "no layout fits, so there is no breakdown to draw")
    stages = result.memory.stages
    fig, ax = _figure()
    bottoms = [0.0] * len(stages)
    labels = [str(stage.stage) for stage in stages]
    for part in stage_parts_gib(stages[0]):
        heights = [stage_parts_gib(stage)[part] for stage in stages]
        ax.bar(labels, heights, bottom=bottoms, label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.axhline(stages[0].capacity_bytes / GIB, color="black", linestyle="--", label="GPU capacity")
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per GPU")
    ax.set_title(f"{result.model.name} on {result.cluster.name}: memory per stage")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path, force)


def strategy(row: SweepRow) -> str:
    """The family a layout belongs to: ZeRO stage and offload, tp/pp when used."""
    lay = row.layout
    name = f"ZeRO-{lay.zero_stage}"
    if lay.offload_optimizer != "none" or lay.offload_params != "none":
        name += " + offload"
    if lay.tp > 1 or lay.pp > 1:
        name += " + TP/PP"
    return name


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both axes (lower step time and lower memory), by step time."""
    front: list[tuple[float, float]] = []
    for point in sorted(set(points)):
        if not front or point[1] < front[-1][1]:
            front.append(point)
    return front


def plot_sweep(results: list[SweepResult], path: Path, force: bool) -> None:
    """Step time vs peak GPU memory of the ranked layouts shown, one colour per strategy, with the
    Pareto front of each strategy drawn as a line (only the rows the sweep reports: --top)."""
    fig, ax = _figure()
    groups: dict[str, list[tuple[float, float]]] = {}
    for result in results:
        for row in result.top:
            groups.setdefault(strategy(row), []).append((row.estimate.step_s, row.gpu_peak_bytes / GIB))
    if not groups:
        raise PlanInputError("--plot", "no layout fits, so there is no front to draw")
    for name, points in sorted(groups.items()):
        ax.scatter([p[0] for p in points], [p[1] for p in points], label=name, s=14)
        front = pareto_front(points)
        ax.plot([p[0] for p in front], [p[1] for p in front], linewidth=1)
    ax.set_xlabel("step time (s)")
    ax.set_ylabel("peak GiB per GPU")
    ax.set_title(f"{results[0].model}: step time vs memory of the ranked layouts")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path, force)
