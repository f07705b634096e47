"""Transcription checks of benchmarks/data/published_runs.yaml (no model error is computed here).

Every number checked is a relation the sources themselves state, worked by hand below.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("published_runs_data",
                                               ROOT / "benchmarks" / "published_runs_data.py")
prd = importlib.util.module_from_spec(_spec)
sys.modules["published_runs_data"] = prd
_spec.loader.exec_module(prd)

RUNS = {r.name: r for r in prd.load_runs()}
H100_BF16_DENSE_TFLOPS = 989.5  # NVIDIA H100 SXM datasheet, 1,979 with sparsity / 2


def test_layout_products_equal_gpu_counts():
    # tp·cp·pp·dp = GPUs, e.g. Llama 3 128K row: 8 x 16 x 16 x 8 = 16,384; MT-NLG 8 x 35 x 12 = 3360.
    for r in RUNS.values():
        assert r.tp * r.cp * r.pp * r.dp == r.num_gpus, r.name


def test_split_is_by_paper():
    # The rule: Shoeybi 2019 in sample, every other paper in this file out of sample.
    for r in RUNS.values():
        expected = "in_sample" if r.paper.startswith("Shoeybi") else "out_of_sample"
        assert r.split == expected, r.name


def test_llama3_table4_tokens_and_batch_per_dp():
    # Table 4: 16M tokens per batch in every row: 2048 x 8192 = 16,777,216 and
    # 128 x 131,072 = 16,777,216; batch per DP rank 2048/64 = 32, 2048/128 = 16, 128/8 = 16.
    expected_per_dp = {"llama3-405b-8k-8192gpu": 32, "llama3-405b-8k-16384gpu": 16,
                       "llama3-405b-128k-16384gpu": 16}
    for name, per_dp in expected_per_dp.items():
        r = RUNS[name]
        assert r.global_batch * r.model.seq_len == 16_777_216
        assert r.global_batch // r.dp == per_dp


def test_llama3_mfu_matches_tflops_over_dense_peak():
    # 430/989.5 = 0.4346 (43 %), 400/989.5 = 0.4042 (table: 41 %), 380/989.5 = 0.3840 (38 %):
    # within one percentage point, the table's rounding.
    for name in ("llama3-405b-8k-8192gpu", "llama3-405b-8k-16384gpu", "llama3-405b-128k-16384gpu"):
        r = RUNS[name]
        assert abs(r.tflops_per_gpu / H100_BF16_DENSE_TFLOPS - r.mfu) <= 0.01, name


def test_megatron_2019_per_gpu_from_aggregate():
    # Shoeybi et al. 2019: 15.1 PFLOP/s over 512 GPUs = 29.49 TFLOP/s per GPU (76 % of 512 x 39
    # = 19.97 PFLOP/s is 15.18, the paper's scaling-efficiency statement, consistent).
    r = RUNS["megatron-8.3b-v100"]
    assert abs(15.1e3 / 512 - r.tflops_per_gpu) < 0.05
    assert abs(0.76 * 512 * 39 / 1e3 - 15.1) < 0.1


def test_every_row_cites_and_names_its_assumptions():
    for r in RUNS.values():
        assert len(r.source) > 40 and r.paper
        assert r.checked in ("stored", "transcribed")


def test_mt_nlg_iteration_times_match_tflops_by_megatron_eq3():
    # Narayanan et al. 2021 eq. 3: F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)); MT-NLG B 1920,
    # s 2048, l 105, h 20480, V 50272: 1 + 0.0166667 + 0.0014611 = 1.0181278,
    # F = 1.662478e19 x 1.0181278 = 1.692598e19 FLOPs per iteration.
    # 2240 GPUs, 60.1 s -> 125.7 (paper 126); 2800, 50.2 s -> 120.4 (121); 3360, 44.4 s -> 113.5 (113).
    f = 96 * 1920 * 2048 * 105 * 20480**2 * (1 + 2048 / (6 * 20480) + 50272 / (16 * 105 * 20480))
    assert f == pytest.approx(1.692598e19, rel=1e-6)
    for gpus in (2240, 2800, 3360):
        r = RUNS[f"mt-nlg-530b-{gpus}"]
        assert r.num_gpus == gpus and r.dp == gpus // 280
        assert abs(f / (r.iteration_time_s * gpus) / 1e12 - r.tflops_per_gpu) <= 1.0
