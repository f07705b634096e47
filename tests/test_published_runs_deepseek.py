"""The DeepSeek-V3 row of benchmarks/data/published_runs.yaml: relations its source states,
worked by hand (no model error is computed here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("published_runs_data",
                                               ROOT / "benchmarks" / "published_runs_data.py")
prd = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("published_runs_data", prd)
_spec.loader.exec_module(prd)

RUN = {r.name: r for r in prd.load_runs()}["deepseek-v3-671b-2048gpu"]


def test_layout_is_the_reports():
    # §3.2: PP 16, EP 64 over 8 nodes (64 / 8 GPUs per node = 8), ZeRO-1 DP, no TP; 2048 GPUs
    assert (RUN.tp, RUN.pp, RUN.ep, RUN.num_gpus) == (1, 16, 64, 2048)
    assert RUN.dp == 2048 // 16 == 128 and RUN.dp % RUN.ep == 0
    assert RUN.category == "moe" and RUN.split == "out_of_sample"


def test_gpu_hours_per_trillion_tokens_are_3_7_days_on_2048_gpus():
    # §1: 180K H800 GPU-hours per trillion tokens, "3.7 days on our cluster with 2048 H800 GPUs"
    assert 180_000 / 2048 / 24 == pytest.approx(3.66, abs=0.01)


def test_derived_tflops_per_gpu():
    # 1e12 tokens / (180,000 GPU-h x 3600 s) = 1543.2 tokens/s/GPU; x 6 x 37e9 = 342.6 TFLOP/s
    tokens_per_s = 1e12 / (180_000 * 3600)
    assert tokens_per_s == pytest.approx(1543.2, abs=0.05)
    assert 6 * 37e9 * tokens_per_s / 1e12 == pytest.approx(RUN.tflops_per_gpu, abs=0.05)
    # against the H800's BF16 dense peak (989.5, as H100 SXM): 34.6 %
    assert RUN.tflops_per_gpu / 989.5 == pytest.approx(0.346, abs=0.001)


def test_pretraining_hours_consistent():
    # Table 1: 2,664K GPU-hours of pre-training for 14.8T tokens = 180K per trillion
    assert 2_664_000 / 14.8 == pytest.approx(180_000, rel=1e-9)
