"""What `zplan fit` and `zplan show` compute, as data (rendering lives in planner.report.fit)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from planner.core import flops, params
from planner.timing import steptime
from planner.memory.plan import MemoryPlan, plan_memory
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Cluster, Frozen, Layout, ModelSpec, TrainSetup
from planner.search.strategies import StrategyMinimum, strategy_minimums
from planner.search.suggest import Suggestion, search_suggestions, suggest_changes


class FitResult(Frozen):
    """Everything `zplan fit` reports (and its `--json` document carries)."""

    model: ModelSpec
    params_total: int
    cluster: Cluster
    setup: TrainSetup
    searched: bool
    """True when no layout was given and zplan searched for the best one."""
    layout: Optional[Layout]
    """The layout shown (given, or the best found); None when nothing fits."""
    memory: Optional[MemoryPlan]
    step: Optional[steptime.StepEstimate]
    """The step-time estimate of the layout."""
    strategies: list[StrategyMinimum]
    """Minimum GPUs of each strategy (search mode only)."""
    fits: bool
    suggestions: list[Suggestion] = []
    """When it does not fit: the smallest changes that make it fit (planner.search.suggest)."""


class ModelSummary(Frozen):
    """`zplan show`: exact parameter breakdown, the seeds' approximations, FLOPs per token."""

    model: ModelSpec
    params: params.ParamCount
    approx_12lh2: int
    """Seed approximation 12·nl·hd² (EQUATIONS.md §1)."""
    approx_with_embeddings: int
    """Seed approximation 12·nl·hd² + 2·V·hd."""
    seq_len: int
    flops_per_token: flops.FlopsBreakdown
    """Forward/backward FLOPs of one sequence of `seq_len` tokens (tokens field = seq_len)."""


def calibrated_efficiency(path: Optional[Path], cluster: Cluster, precision: str) -> float | None:
    """Measured efficiency for this GPU and dtype from a `zplan calibrate` file, if given."""
    if path is None:
        return None
    from planner.io.calibration import efficiency_for, load_calibration

    dtype = get_precision(precision).compute_dtype
    return efficiency_for(load_calibration(path), cluster.gpu.name, dtype)


def fit_layout(
    model: ModelSpec, cluster: Cluster, layout: Layout, setup: TrainSetup, efficiency: float | None
) -> FitResult:
    """Memory and step time of one given layout."""
    memory = plan_memory(model, cluster, layout, setup)
    step = steptime.estimate_step(model, cluster, layout, setup, efficiency=efficiency)
    return FitResult.computed(
        model=model, params_total=params.count_params(model).total, cluster=cluster, setup=setup,
        searched=False, layout=layout, memory=memory, step=step, strategies=[], fits=memory.fits,
        suggestions=[] if memory.fits else suggest_changes(model, cluster, layout, setup),
    )


def fit_search(
    model: ModelSpec, cluster: Cluster, setup: TrainSetup, efficiency: float | None,
    engine: str | None = None,
) -> FitResult:
    """The fastest layout that fits (the sweep's ranking; with `engine`, the fastest that engine
    runs: `Constraints.engine`) and every strategy's minimum GPUs."""
    from planner.search import heap
    from planner.search.sweep import Constraints, best_layout

    heap.retain_freed_memory()  # as sweep(): the strategy minimums' columns reuse freed heap too
    strategies = strategy_minimums(model, cluster, setup)
    best = best_layout(model, cluster, setup, Constraints(engine=engine), efficiency=efficiency)
    total = params.count_params(model).total
    if best is None:
        return FitResult.computed(
            model=model, params_total=total, cluster=cluster, setup=setup, searched=True,
            layout=None, memory=None, step=None, strategies=strategies, fits=False,
            suggestions=search_suggestions(model, cluster, setup, strategies),
        )
    layout, step = best
    memory = plan_memory(model, cluster, layout, setup)
    return FitResult.computed(
        model=model, params_total=total, cluster=cluster, setup=setup, searched=True,
        layout=layout, memory=memory, step=step, strategies=strategies, fits=memory.fits,
    )


def model_summary(model: ModelSpec, seq_len: int) -> ModelSummary:
    """The parameter breakdown and the FLOPs of one sequence."""
    setup = TrainSetup(
        seq_len=seq_len, global_batch=1, train_tokens=seq_len,
        precision=get_precision("bf16-mixed"), optimizer=get_optimizer("adam"),
    )
    return ModelSummary.computed(
        model=model,
        params=params.count_params(model),
        approx_12lh2=params.approx_params_blocks(model.num_layers, model.hidden_size),
        approx_with_embeddings=params.approx_params_with_embeddings(
            model.num_layers, model.hidden_size, model.vocab_size
        ),
        seq_len=seq_len,
        flops_per_token=flops.step_flops(model, setup, Layout()),
    )
