"""Compute-budget planning: FLOPs a cluster delivers, compute-optimal N and D, predicted loss.

Seed 004 §1.4-§1.5 (C ≈ 6·P·D, 8·P·D with full recompute; time = k·D·P / (GPUs·peak·MFU);
D ≈ 20·P) and §4 (the Chinchilla parametric loss, Hoffmann et al. 2022 approach 3).
The law's constants are data (`planner/data/scaling_laws.yaml`), not code.
Seed and paper citations: docs/references.md

Two labelled answers to "which N and D for C FLOPs": the D = r·N **rule** (`compute_optimal`)
and the **loss-optimal** argmin of the fitted law under C = k·N·D (`loss_optimal`, Hoffmann et
al. 2022 eq. 4); they differ, and the loss printed for each is the law at that N, D.
With a sequence length the FLOPs include the attention scores and context,
2k·L·d_attn·T per token (`attention_flops_per_token`; PaLM, Chowdhery et al. 2022 App. B:
6N + 12·L·H·Q·T per token for k = 6), counted without causal halving as PaLM and Megatron do.
"""

from __future__ import annotations

import math

from pydantic import Field

from planner.core.errors import PlanInputError
from planner.core.flops import SECONDS_PER_HOUR, training_days, training_flops
from planner.core.spec import Frozen

RECOMPUTE_K = {"none": 6, "full": 8}
"""FLOPs per parameter per token: forward 2 + backward 4, plus a second forward 2 with full
activation recompute (seed 004 §1.4)."""


class ScalingLaw(Frozen):
    """L(N, D) = A / N^alpha + B / D^beta + E, and the compute-optimal tokens per parameter."""

    name: str
    A: float = Field(gt=0)
    alpha: float = Field(gt=0)
    B: float = Field(gt=0)
    beta: float = Field(gt=0)
    E: float = Field(ge=0)
    """Irreducible loss (entropy of text), nats per token."""
    tokens_per_param: float = Field(gt=0)
    """Compute-optimal D / N (20 for Chinchilla)."""
    source: str = Field(min_length=1)


class LossTerms(Frozen):
    """The three terms of the parametric loss and their sum (nats per token)."""

    finite_model: float
    """A / N^alpha: what a finite model costs."""
    finite_data: float
    """B / D^beta: what finite data costs."""
    irreducible: float
    """E."""
    loss: float


class ComputeBudget(Frozen):
    """What a GPU budget buys: FLOPs, and the compute-optimal model and data for them."""

    num_gpus: int
    peak_flops_per_s: float
    """Dense peak of one GPU in the chosen dtype."""
    mfu: float
    seconds: float
    gpu_hours: float
    flops: float
    """Training FLOPs available: GPUs · peak · MFU · seconds."""
    optimal_params: float
    """The D = tokens_per_param·N rule: N = sqrt(C / (6 · tokens_per_param))."""
    optimal_tokens: float
    """The rule's D = tokens_per_param · N."""
    law: str
    loss: LossTerms
    """The law at the rule's N, D."""
    loss_optimal_params: float | None = None
    """The argmin of the fitted law under C = 6·N·D (Hoffmann et al. 2022 eq. 4)."""
    loss_optimal_tokens: float | None = None
    """C / (6 · loss_optimal_params)."""
    loss_at_loss_optimal: LossTerms | None = None
    """The law at the loss-optimal N, D: never above `loss`."""


class ModelBudget(Frozen):
    """What training a given model on given tokens costs, and the loss the law predicts."""

    params: float
    """Total parameters (N of the scaling law)."""
    active_params: float
    """Parameters each token passes through (MoE: top-k experts); the FLOPs count these."""
    tokens: float
    k: int
    """FLOPs per parameter per token: 6, or 8 with full recompute."""
    flops: float
    """k·N_active·D, plus `attention_flops` when a sequence length is given."""
    seq_len: int | None = None
    """Training sequence length of the attention term; None: no attention term."""
    attention_flops: float = 0.0
    """2k·L·d_attn·T per token x D tokens (0 without a sequence length)."""
    num_gpus: int | None
    peak_flops_per_s: float | None
    mfu: float | None
    days: float | None
    """None when no GPUs were given."""
    gpu_hours: float | None
    tokens_per_param: float
    compute_optimal_tokens: float
    """tokens_per_param · N: the data a compute-optimal run would use for this N."""
    law: str
    loss: LossTerms


def predicted_loss(n_params: float, n_tokens: float, law: ScalingLaw) -> LossTerms:
    """Chinchilla parametric loss (Hoffmann et al. 2022 eq. 10; seed 004 §4)."""
    _positive("params", n_params)
    _positive("tokens", n_tokens)
    model_term = law.A / n_params**law.alpha  # finite model
    data_term = law.B / n_tokens**law.beta  # finite data
    return LossTerms(finite_model=model_term, finite_data=data_term, irreducible=law.E,
                     loss=model_term + data_term + law.E)


def available_flops(num_gpus: int, peak_flops_per_s: float, mfu: float, seconds: float) -> float:
    """C = GPUs · peak · MFU · time (seed 004 §1.4, the training-time equation solved for C)."""
    return num_gpus * peak_flops_per_s * mfu * seconds


def compute_optimal(c_flops: float, tokens_per_param: float, k: int = 6) -> tuple[float, float]:
    """N, D with C = k·N·D and D = r·N → N = sqrt(C / (k·r)) (seed 004 §1.5; k=6, r=20: C/120)."""
    n_params = math.sqrt(c_flops / (k * tokens_per_param))
    return n_params, tokens_per_param * n_params


def loss_optimal(c_flops: float, law: ScalingLaw, k: int = 6) -> tuple[float, float]:
    """argmin over N of L(N, C/(k·N)): dL/dN = 0 gives N^(α+β) = (α·A / (β·B)) · (C/k)^β, so
    N = G·(C/k)^(β/(α+β)), D = (C/k) / N with G = (α·A / (β·B))^(1/(α+β))
    (Hoffmann et al. 2022 eq. 4, for k = 6)."""
    _positive("flops", c_flops)
    g = (law.alpha * law.A / (law.beta * law.B)) ** (1 / (law.alpha + law.beta))
    n_params = g * (c_flops / k) ** (law.beta / (law.alpha + law.beta))
    return n_params, c_flops / (k * n_params)


def attention_flops_per_token(num_layers: int, attention_width: int, seq_len: int, k: int) -> float:
    """Scores Q·K^T and context P·V: 4·L·d_attn·T FLOPs per token forward (2 FLOPs per
    multiply-add, T keys per query, d_attn = heads x head dim), times k/2 passes (3 for k = 6:
    PaLM's 12·L·H·Q·T; 4 with full recompute). No causal halving (PaLM App. B, Megatron eq. 3)."""
    return 2 * k * num_layers * attention_width * seq_len


def check_mfu(mfu: float) -> float:
    """MFU must be a fraction in (0, 1]."""
    if not 0 < mfu <= 1:
        raise PlanInputError("mfu", f"must be in (0, 1], got {mfu}")
    return mfu


def budget_from_compute(num_gpus: int, peak_flops_per_s: float, mfu: float, seconds: float,
                        law: ScalingLaw) -> ComputeBudget:
    """FLOPs of a GPU budget, the compute-optimal N and D, and their predicted loss."""
    _positive("gpus", num_gpus)
    _positive("days", seconds)
    check_mfu(mfu)
    c_flops = available_flops(num_gpus, peak_flops_per_s, mfu, seconds)
    n_params, n_tokens = compute_optimal(c_flops, law.tokens_per_param)
    n_best, d_best = loss_optimal(c_flops, law)
    return ComputeBudget(
        num_gpus=num_gpus, peak_flops_per_s=peak_flops_per_s, mfu=mfu, seconds=seconds,
        gpu_hours=num_gpus * seconds / SECONDS_PER_HOUR, flops=c_flops,
        optimal_params=n_params, optimal_tokens=n_tokens, law=law.name,
        loss=predicted_loss(n_params, n_tokens, law), loss_optimal_params=n_best,
        loss_optimal_tokens=d_best, loss_at_loss_optimal=predicted_loss(n_best, d_best, law),
    )


def budget_for_model(params: float, tokens: float, recompute: str, law: ScalingLaw,
                     num_gpus: int | None = None, peak_flops_per_s: float | None = None,
                     mfu: float | None = None, active_params: float | None = None,
                     attention: tuple[int, int, int] | None = None) -> ModelBudget:
    """Days and GPU-hours to train P parameters on D tokens (k·P·D FLOPs), and the loss.

    For MoE models the FLOPs count the active parameters and the loss the total (the law was
    fitted on dense models, so for MoE it is an extrapolation either way). `attention` =
    (num_layers, attention width, seq_len) adds the attention term.
    """
    _positive("params", params)
    active = params if active_params is None else active_params
    _positive("active_params", active)
    _positive("tokens", tokens)
    if recompute not in RECOMPUTE_K:
        raise PlanInputError("recompute", f"must be one of {', '.join(RECOMPUTE_K)}, got {recompute!r}")
    k = RECOMPUTE_K[recompute]
    attn_flops, seq_len = 0.0, None
    if attention is not None:
        num_layers, width, seq_len = attention
        _positive("seq_len", seq_len)
        attn_flops = attention_flops_per_token(num_layers, width, seq_len, k) * tokens
    c_flops = training_flops(active, tokens, k=k) + attn_flops
    days = gpu_hours = None
    if num_gpus is not None and peak_flops_per_s is not None and mfu is not None:
        _positive("gpus", num_gpus)
        check_mfu(mfu)
        days = training_days(c_flops, num_gpus, peak_flops_per_s, mfu)
        gpu_hours = days * 24 * num_gpus
    return ModelBudget(
        params=params, active_params=active, tokens=tokens, k=k, flops=c_flops,
        seq_len=seq_len, attention_flops=attn_flops, num_gpus=num_gpus,
        peak_flops_per_s=peak_flops_per_s, mfu=mfu, days=days, gpu_hours=gpu_hours,
        tokens_per_param=tokens / params, compute_optimal_tokens=law.tokens_per_param * params,
        law=law.name, loss=predicted_loss(params, tokens, law),
    )


def _positive(field: str, value: float) -> None:
    if not value > 0 or not math.isfinite(value):
        raise PlanInputError(field, f"must be a positive number, got {value}")
