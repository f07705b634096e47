"""Budget: attention FLOPs at a sequence length, and the loss-optimal N, D (by hand)."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.data import scaling_law
from planner.timing.budget import (attention_flops_per_token, budget_for_model,
                                   budget_from_compute, loss_optimal, predicted_loss)

LAW = scaling_law()  # Hoffmann et al. 2022 approach 3: A 406.4, α 0.34, B 410.7, β 0.28, E 1.69


def test_attention_term_llama3_8b_at_8k_is_about_a_quarter():
    # Llama 3 8B: 32 layers, 32 heads x 128 = 4096, T = 8192; 8,030,261,248 parameters
    # (exact count of the HF checkpoint, model_presets/llama3-8b.yaml).
    # attention 12 x 32 x 4096 x 8192 = 12,884,901,888 FLOPs per token;
    # 6N = 48,181,567,488; ratio 0.26743.
    per_token = attention_flops_per_token(32, 4096, 8192, 6)
    assert per_token == 12_884_901_888
    assert per_token / (6 * 8_030_261_248) == pytest.approx(0.26743, abs=1e-5)
    # full recompute: one more forward, 16 x 32 x 4096 x 8192
    assert attention_flops_per_token(32, 4096, 8192, 8) == 16 * 32 * 4096 * 8192


def test_budget_for_model_adds_attention():
    # 8e9 parameters, 1e12 tokens, (32, 4096, 8192): 6 x 8e9 x 1e12 = 4.8e22
    # + 12,884,901,888 x 1e12 = 1.2884901888e22 -> 6.0884901888e22.
    r = budget_for_model(8e9, 1e12, "none", LAW, attention=(32, 4096, 8192))
    assert r.attention_flops == pytest.approx(1.2884901888e22)
    assert r.flops == pytest.approx(6.0884901888e22)
    assert budget_for_model(8e9, 1e12, "none", LAW).flops == pytest.approx(4.8e22)


def test_loss_optimal_closed_form_by_hand():
    # C = 5.76e23 (the Gopher budget of Hoffmann et al.): G = (0.34 x 406.4 / (0.28 x 410.7))^(1/0.62)
    # = (138.176 / 114.996)^1.6129 = 1.34472; N = G x (C/6)^(0.28/0.62) = 1.34472 x 9.6e22^0.451613
    # = 1.34472 x 2.3938e10 = 3.219e10; D = C / (6 N) = 2.982e12.
    g = (0.34 * 406.4 / (0.28 * 410.7)) ** (1 / 0.62)
    n_hand = g * (5.76e23 / 6) ** (0.28 / 0.62)
    assert g == pytest.approx(1.34472, abs=1e-4)
    assert n_hand == pytest.approx(3.219e10, rel=1e-3)
    n, d = loss_optimal(5.76e23, LAW)
    assert n == pytest.approx(n_hand, rel=1e-12)
    assert 6 * n * d == pytest.approx(5.76e23)


def test_loss_optimal_is_a_minimum_and_beats_the_rule():
    # Independent check of the argmin: moving N by 1 % either way at fixed C raises the loss.
    c = 5.76e23
    n, d = loss_optimal(c, LAW)
    best = predicted_loss(n, d, LAW).loss
    for f in (1.01, 1 / 1.01):
        assert predicted_loss(n * f, c / (6 * n * f), LAW).loss > best
    r = budget_from_compute(1024, 989.5e12, 0.4, 30 * 86400, LAW)
    assert r.loss_at_loss_optimal.loss <= r.loss.loss
    assert r.optimal_tokens == pytest.approx(20 * r.optimal_params)  # the rule, labelled as such


def test_cli_seq_len_json_and_bad_input():
    runner = CliRunner()
    ok = runner.invoke(app, ["budget", "--model", "llama3-8b", "--tokens", "1e12",
                             "--seq-len", "8192", "--json"])
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.stdout)
    assert data["attention_flops"] == pytest.approx(12 * 32 * 4096 * 8192 * 1e12)
    assert data["seq_len"] == 8192
    bad = runner.invoke(app, ["budget", "--params", "8e9", "--tokens", "1e12", "--seq-len", "8192"])
    assert bad.exit_code == 2
    assert "--seq-len" in bad.output and "Traceback" not in bad.output
