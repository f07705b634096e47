"""zplan budget: FLOPs of a GPU budget, compute-optimal N and D, and the Chinchilla loss.

Expected values are the seed's worked examples (seed 004 §1.3-§1.5 and §4, docs/equations.md §4, §7)
or arithmetic written out here.
"""

from __future__ import annotations

import json
import math

import pytest

from planner.timing.budget import (
    available_flops,
    budget_for_model,
    budget_from_compute,
    compute_optimal,
    predicted_loss,
)
from planner.data import builtin_laws, scaling_law
from planner.core.errors import PlanInputError

LAW = scaling_law("chinchilla-approach3")


def test_builtin_law_constants_and_source():
    # Hoffmann et al. 2022 approach 3 as seed 004 §4 quotes it
    assert (LAW.A, LAW.alpha, LAW.B, LAW.beta, LAW.E) == (406.4, 0.34, 410.7, 0.28, 1.69)
    assert LAW.tokens_per_param == 20
    assert "Hoffmann" in LAW.source
    assert builtin_laws()["default"] == "chinchilla-approach3"
    assert scaling_law().name == "chinchilla-approach3"


def test_gopher_loss_seed():
    # seed 004 §4: L(280e9, 300e9) = 0.052 + 0.251 + 1.69 = 1.993
    terms = predicted_loss(280e9, 300e9, LAW)
    assert terms.finite_model == pytest.approx(0.052, abs=5e-4)
    assert terms.finite_data == pytest.approx(0.251, abs=5e-4)
    assert terms.loss == pytest.approx(1.993, abs=5e-4)


def test_chinchilla_loss_seed():
    # seed 004 §4: L(70e9, 1.4e12) = 0.083 + 0.163 + 1.69 = 1.936 (the sum of the rounded terms;
    # unrounded 0.0835 + 0.1632 + 1.69 = 1.9366, so the tolerance is 1e-3)
    terms = predicted_loss(70e9, 1.4e12, LAW)
    assert terms.finite_model == pytest.approx(0.083, abs=1e-3)
    assert terms.finite_data == pytest.approx(0.163, abs=5e-4)
    assert terms.loss == pytest.approx(1.936, abs=1e-3)
    assert terms.loss < predicted_loss(280e9, 300e9, LAW).loss  # Chinchilla beats Gopher


def test_gpt3_training_days_seed():
    # seed 004 §1.4: 8 · 300e9 · 175e9 / (1024 · 312e12 · 0.45) = 2.921e6 s = 33.8 days ≈ 34
    result = budget_for_model(175e9, 300e9, "full", LAW, num_gpus=1024, peak_flops_per_s=312e12, mfu=0.45)
    assert result.k == 8
    assert result.flops == pytest.approx(8 * 175e9 * 300e9)
    assert result.days == pytest.approx(8 * 300e9 * 175e9 / (1024 * 312e12 * 0.45) / 86400)
    assert round(result.days) == 34
    assert result.gpu_hours == pytest.approx(result.days * 24 * 1024)


def test_gpt3_6pd_seed():
    # seed 004 §1.3: 6 × 174,600e6 × 300e9 = 3.1428e23 FLOPs
    result = budget_for_model(174.6e9, 300e9, "none", LAW)
    assert result.flops == pytest.approx(3.1428e23)
    assert result.days is None
    assert result.compute_optimal_tokens == pytest.approx(20 * 174.6e9)


def test_compute_optimal_recovers_chinchilla():
    # C = 6 · 70e9 · 1.4e12 = 5.88e23; N = sqrt(C / 120) = sqrt(4.9e21) = 7e10, D = 20 N = 1.4e12
    n_params, n_tokens = compute_optimal(5.88e23, 20)
    assert n_params == pytest.approx(70e9)
    assert n_tokens == pytest.approx(1.4e12)


def test_budget_from_compute_round_trip():
    # 1024 GPUs · 312e12 · 0.45 · 1 day (86,400 s) = 1.2422e22 FLOPs
    seconds = 86_400
    result = budget_from_compute(1024, 312e12, 0.45, seconds, LAW)
    assert result.flops == pytest.approx(1024 * 312e12 * 0.45 * 86_400)
    assert result.flops == available_flops(1024, 312e12, 0.45, seconds)
    assert result.optimal_params == pytest.approx(math.sqrt(result.flops / 120))
    assert 6 * result.optimal_params * result.optimal_tokens == pytest.approx(result.flops)
    assert result.gpu_hours == pytest.approx(1024 * 24)
    assert result.loss.loss == pytest.approx(
        predicted_loss(result.optimal_params, result.optimal_tokens, LAW).loss)


@pytest.mark.parametrize("call, field", [
    (lambda: budget_from_compute(1024, 312e12, 0.0, 86400, LAW), "mfu"),
    (lambda: budget_from_compute(1024, 312e12, 1.5, 86400, LAW), "mfu"),
    (lambda: budget_from_compute(0, 312e12, 0.4, 86400, LAW), "gpus"),
    (lambda: budget_for_model(70e9, 0, "none", LAW), "tokens"),
    (lambda: budget_for_model(70e9, 1e12, "selective", LAW), "recompute"),
    (lambda: predicted_loss(-1, 1e12, LAW), "params"),
])
def test_bad_inputs(call, field):
    with pytest.raises(PlanInputError) as err:
        call()
    assert err.value.field == field


def test_user_law_file(tmp_path):
    path = tmp_path / "law.yaml"
    path.write_text("laws:\n  mine:\n    A: 1\n    alpha: 1\n    B: 1\n    beta: 1\n    E: 1\n"
                    "    tokens_per_param: 10\n    source: a test fit\n")
    law = scaling_law(str(path))
    assert law.name == "mine"
    assert predicted_loss(2, 4, law).loss == pytest.approx(1 / 2 + 1 / 4 + 1)
    assert compute_optimal(6 * 10 * 100, 10) == pytest.approx((10, 100))  # C = 6·N·(10 N), N = 10


def test_unknown_and_malformed_laws(tmp_path):
    with pytest.raises(PlanInputError, match="chinchilla-approach3"):
        scaling_law("kaplan-2020")
    bad = tmp_path / "bad.yaml"
    bad.write_text("laws:\n  x:\n    A: 1\n")
    with pytest.raises(PlanInputError, match="law"):
        scaling_law(str(bad))


# --------------------------------------------------------------------------- CLI


@pytest.mark.cli
def test_cli_gopher_json(zplan):
    result = zplan("budget", "--params", "280e9", "--tokens", "300e9", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["kind"] == "budget" and doc["mode"] == "model"
    assert doc["loss"]["loss"] == pytest.approx(1.993, abs=5e-4)


@pytest.mark.cli
def test_cli_gpt3_34_days(zplan):
    # seed 004 §1.4 uses 40 GB A100s at 312 TFLOP/s
    result = zplan("budget", "--params", "175e9", "--tokens", "300e9", "--gpu", "a100-40gb",
                   "--gpus", "1024", "--mfu", "0.45", "--recompute", "full", "--json")
    assert result.returncode == 0, result.stderr
    assert round(json.loads(result.stdout)["days"]) == 34


@pytest.mark.cli
def test_cli_compute_budget_human(zplan):
    result = zplan("budget", "--gpu", "a100-80gb", "--gpus", "1024", "--days", "30", "--mfu", "0.4")
    assert result.returncode == 0, result.stderr
    assert "compute-optimal" in result.stdout and "predicted loss" in result.stdout


@pytest.mark.cli
@pytest.mark.parametrize("args", [
    ("--gpu", "a100-80gb", "--gpus", "8", "--days", "1", "--mfu", "1.5"),      # mfu > 1
    ("--gpu", "a100-80gb", "--gpus", "8"),                                      # no days
    ("--params", "70e9"),                                                       # no tokens
    ("--params", "70e9", "--tokens", "1e12", "--law", "no-such-law"),
])
def test_cli_bad_input_exit_2(zplan, args):
    result = zplan("budget", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.cli
def test_cli_cluster_gpu_hours(zplan):
    # dgx-a100x128: 128 nodes × 8 A100-80GB = 1024 GPUs. 24,576 GPU-hours = 24 h on 1024 GPUs:
    # C = 1024 · 312e12 · 0.5 · 86,400 s = 1.3804e22 FLOPs; N = sqrt(C / 120)
    result = zplan("budget", "--cluster", "dgx-a100x128", "--gpu-hours", "24576", "--mfu", "0.5", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["num_gpus"] == 1024
    assert doc["flops"] == pytest.approx(1024 * 312e12 * 0.5 * 86_400)
    assert doc["optimal_params"] == pytest.approx(math.sqrt(1024 * 312e12 * 0.5 * 86_400 / 120))


def test_moe_flops_count_active_params():
    # 6 · 40 active · 10 tokens = 2,400 FLOPs; the loss uses the 100 total parameters
    result = budget_for_model(100, 10, "none", LAW, active_params=40)
    assert result.flops == 6 * 40 * 10
    assert result.loss == predicted_loss(100, 10, LAW)
