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


SESSION_10_SOURCES = ("NVIDIA Megatron-LM README", "PyTorch torchtitan")
SESSION_11_SOURCES = ("NVIDIA NeMo-Framework-Launcher README",)
MOSAIC = "MosaicML llm-foundry"
DGXC = "NVIDIA dgxc-benchmarking"
FMS = "IBM / PyTorch fms-fsdp"


def test_split_is_by_paper():
    # The rule: Shoeybi 2019 in sample, the sources added in session 10 (NEW SPLIT RULE, the
    # Megatron-LM README's H100 table and torchtitan's benchmark pages) out_of_sample_2, every
    # other paper in this file out of sample.
    for r in RUNS.values():
        expected = ("in_sample" if r.paper.startswith("Shoeybi") else
                    "out_of_sample_2" if r.paper.startswith(SESSION_10_SOURCES) else
                    "out_of_sample_3" if r.paper.startswith(SESSION_11_SOURCES) else
                    "out_of_sample_4" if r.paper.startswith(MOSAIC) else
                    "out_of_sample_7" if r.paper.startswith(DGXC) and "v25.01" not in r.paper
                    else "out_of_sample_5" if r.paper.startswith(DGXC) else
                    "out_of_sample_6" if r.paper.startswith(FMS) else
                    "out_of_sample")
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


MCORE = {n: r for n, r in RUNS.items() if n.startswith("mcore-h100-")}


def test_mcore_h100_table_products_and_aggregates():
    # Megatron-LM README model table: aggregate PFLOP/s = per-GPU TFLOP/s x GPUs / 1000, e.g.
    # 177B: 432.8 x 2304 = 997,171 -> 997.2; 462B: 459.9 x 6144 = 2,825,626 -> 2825.6.
    # MFU = TFLOP/s / 989.5 within the table's 1 % rounding (120B: 420.5 / 989.5 = 42.5 % -> 43 %).
    assert len(MCORE) == 9
    for r in MCORE.values():
        assert abs(r.tflops_per_gpu * r.num_gpus / 1000 - r.aggregate_pflops) <= 0.1, r.name
        assert abs(r.tflops_per_gpu / H100_BF16_DENSE_TFLOPS - r.mfu) <= 0.01, r.name
        assert r.dp == 48 and r.model.num_layers % r.pp == 0


def test_mcore_h100_sizes_imply_untied_embeddings_and_4h_mlp():
    # Parameters of a GPT block with a 4h MLP: 12·l·h² (biases and norms < 0.1 %); untied input
    # and output embeddings add 2·V·h with V = 131,072. 177B: 12 x 96 x 12288² = 173.95e9,
    # + 2 x 131072 x 12288 = 3.22e9 -> 177.17e9 ("177B"; tied would be 175.56e9, "176B").
    # 1.7B: 1.208e9 + 0.537e9 = 1.745e9 ("1.7B", 2.6 % off; tied 1.476e9, 13 % off); 32B:
    # 31.47e9 (1.6 %; tied 30.53e9, 4.6 %). In every row the untied reading is within 3 % of
    # the label and nearer to it than the tied reading.
    labels = {"1.7b": 1.7e9, "7.1b": 7.1e9, "16b": 16e9, "32b": 32e9, "70b": 70e9,
              "119b": 119e9, "177b": 177e9, "314b": 314e9, "462b": 462e9}
    for key, label in labels.items():
        m = MCORE[f"mcore-h100-{key}"].model
        untied = 12 * m.num_layers * m.hidden_size**2 + 2 * m.vocab_size * m.hidden_size
        tied = untied - m.vocab_size * m.hidden_size
        assert abs(untied / label - 1) < 0.03, key
        assert abs(untied / label - 1) < abs(tied / label - 1), key
        assert m.tied_embeddings is False


def test_torchtitan_rows_dims_and_batches():
    # torchtitan llama3_configs: ffn = multiple_of·ceil(1.3·int(2·4·dim/3) / multiple_of):
    # 8B: int(32768/3) = 10922, x 1.3 = 14198.6 -> 14 x 1024 = 14,336;
    # 70B: int(65536/3) = 21845, x 1.3 = 28398.5 -> 7 x 4096 = 28,672.
    # Global batch = local batch x FSDP degree: 2 x 8 = 16, 2 x 128 = 256, 16 x 32 = 512, 12 x 8.
    import math
    for name, mult in (("torchtitan-8b-fsdp-8gpu", 1024), ("torchtitan-70b-fsdp32-tp8-256gpu", 4096)):
        m = RUNS[name].model
        assert m.ffn_hidden_size == mult * math.ceil(1.3 * int(8 * m.hidden_size / 3) / mult)
    for name, expected in (("torchtitan-8b-fsdp-8gpu", 16), ("torchtitan-8b-fsdp-128gpu", 256),
                           ("torchtitan-70b-fsdp32-tp8-256gpu", 512),
                           ("torchtitan-8b-fsdp8-tp8-64gpu", 96)):
        r = RUNS[name]
        assert r.global_batch == r.micro_batch * r.dp == expected
        assert r.tflops_per_gpu is None and r.tokens_per_s_per_gpu > 0


def test_a_row_gives_exactly_one_metric():
    row = RUNS["torchtitan-8b-fsdp-8gpu"].model_dump()
    with pytest.raises(ValueError):
        prd.PublicRun(**{**row, "tflops_per_gpu": 100.0})
    with pytest.raises(ValueError):
        prd.PublicRun(**{**row, "tokens_per_s_per_gpu": None})


# NeMo-Framework-Launcher README 7.1.2 (commit 3579cdb3): total tokens per second by node count
# as printed, and the README's own speed-up row, which is total(n) / total(first node count).
NEMO_2022_TOTALS = {
    "5b": {1: 40345, 2: 79815, 4: 161754, 8: 312774, 16: 659481, 32: 1159288},
    "175b": {8: 7500, 16: 14950, 32: 29537, 64: 58211, 128: 109684},
}
NEMO_2022_SPEEDUPS = {"5b": {2: 1.98, 4: 4.01, 8: 7.75, 16: 16.35, 32: 28.73},
                      "175b": {16: 1.99, 32: 3.94, 64: 7.76, 128: 14.62}}


def test_nemo_2022_rows_are_totals_over_gpus():
    # e.g. 40,345 tokens/s on 1 node = 8 GPUs -> 5,043.125 per GPU; 109,684 on 128 nodes =
    # 1,024 GPUs -> 107.11328125 per GPU.
    for size, totals in NEMO_2022_TOTALS.items():
        for nodes, total in totals.items():
            r = RUNS[f"nemo-2022-gpt3-{size}-{nodes * 8}gpu"]
            assert r.num_gpus == 8 * nodes
            assert r.tokens_per_s_per_gpu == pytest.approx(total / (8 * nodes), abs=1e-4)
            assert r.split == "out_of_sample_3"


def test_nemo_2022_transcription_matches_readme_speedups():
    # The README's speed-up row is a second transcription check: 1,159,288 / 40,345 = 28.734
    # (printed 28.73x); 109,684 / 7,500 = 14.625 (printed 14.62x, truncated): 0.01 tolerance.
    for size, speedups in NEMO_2022_SPEEDUPS.items():
        base_nodes = min(NEMO_2022_TOTALS[size])
        base = RUNS[f"nemo-2022-gpt3-{size}-{base_nodes * 8}gpu"]
        for nodes, printed in speedups.items():
            r = RUNS[f"nemo-2022-gpt3-{size}-{nodes * 8}gpu"]
            ratio = (r.tokens_per_s_per_gpu * r.num_gpus) / (base.tokens_per_s_per_gpu
                                                              * base.num_gpus)
            assert ratio == pytest.approx(printed, abs=0.01), r.name


def test_nemo_2022_vocab_padding():
    # Megatron pads 50,257 GPT-2 BPE entries to a multiple of 128 x tp:
    # tp 1: ceil(50257 / 128) x 128 = 393 x 128 = 50,304; tp 8: ceil(50257 / 1024) x 1024 = 51,200.
    assert RUNS["nemo-2022-gpt3-5b-8gpu"].model.vocab_size == 50_304
    assert RUNS["nemo-2022-gpt3-175b-64gpu"].model.vocab_size == 51_200


# ---------------------------------------------------------------- out_of_sample_4 (MosaicML)
# Composer's speed monitor (composer/callbacks/speed_monitor.py, GPU_AVAILABLE_FLOPS, the peak
# llm-foundry's collect_results.py divides by): h100-sxm amp_bf16 = 1.979e15 / 2, a100 312e12.
COMPOSER_PEAK_FLOPS = {"h100-sxm": 1.979e15 / 2, "a100-80gb": 312e12}
MOSAIC_ROWS = [r for r in RUNS.values() if r.split == "out_of_sample_4"]


def mpt_params(layers: int, d: int, vocab: int, seq: int) -> int:
    """MPT with llm-foundry's defaults (no_bias False, learned_pos_emb True, tied embeddings):
    per block Wqkv 3d^2+3d, out_proj d^2+d, up 4d^2+4d, down 4d^2+d, two LayerNorms 2 x 2d
    = 12d^2 + 13d; final LayerNorm 2d; token embedding V·d; positions seq·d."""
    return layers * (12 * d * d + 13 * d) + 2 * d + (vocab + seq) * d


def test_mosaic_rows_selection():
    # The FOURTH SPLIT RULE takes every FULL_SHARD amp_bf16 DEFAULT row of the three tables:
    # counted in the stored README, 123 rows; all ZeRO-3, tp = pp = 1, dp = GPUs.
    assert len(MOSAIC_ROWS) == 123
    for r in MOSAIC_ROWS:
        assert r.engine == "composer-fsdp1-full-shard" and r.tp == r.pp == 1, r.name
        assert r.gpu in COMPOSER_PEAK_FLOPS and r.flash_attention, r.name


def test_mpt_param_formula_by_hand():
    # MPT-7B at seq 2048 (README NumParams 6,658,859,008):
    # 32 x (12 x 4096^2 + 13 x 4096) = 6,444,154,880; + 2 x 4096 = 8,192;
    # (50,368 + 2,048) x 4,096 = 214,695,936; total 6,658,859,008.
    assert mpt_params(32, 4096, 50368, 2048) == 6_444_154_880 + 8_192 + 214_695_936
    assert 6_444_154_880 + 8_192 + 214_695_936 == 6_658_859_008
    # MPT-70B: 80 x (12 x 8192^2 + 13 x 8192) + 16,384 + 52,416 x 8,192 = 64,862,437,376.
    assert mpt_params(80, 8192, 50368, 2048) == 64_862_437_376


def test_mosaic_num_params_match_dims():
    # Every row's NumParams column equals the hand formula on the row's yaml dimensions and
    # sequence length (the positional table grows with seq: 7B 1024 -> 2048 adds 1024 x 4096).
    for r in MOSAIC_ROWS:
        m = r.model
        assert r.num_params == mpt_params(m.num_layers, m.hidden_size, m.vocab_size,
                                          m.seq_len), r.name


def test_mosaic_zplan_param_count_matches_source():
    # zplan's exact count of the GPT block the evaluator builds equals MPT's NumParams minus
    # nothing: same block (biases, LayerNorm, learned positions, tied embeddings).
    from benchmarks.published_runs import _data_model
    from planner.core.params import count_params

    for name in ("mosaic-mpt-7b-h100-s2048-8gpu", "mosaic-mpt-70b-h100-s2048-512gpu",
                 "mosaic-mpt-125m-a100-s2048-8gpu"):
        r = RUNS[name]
        assert count_params(_data_model(r)).total == r.num_params, name


def test_mosaic_batches_and_token_totals():
    # GlobalBatchSize = MicroBatchSize x GradAccum x GPUs (70B, 512 GPUs: 8 x 1 x 512 = 4096);
    # GlobalBatchSize (T) = GlobalBatchSize x seq (4096 x 2048 = 8,388,608).
    for r in MOSAIC_ROWS:
        c = r.cross_check
        assert r.global_batch == r.micro_batch * c["grad_accum"] * r.num_gpus, r.name
        assert c["global_batch_tokens"] == r.global_batch * r.model.seq_len, r.name


def test_mosaic_throughput_columns_agree():
    # T/s/GPU = T/s / GPUs, rounded (70B 512 GPUs: 515,636 / 512 = 1007.1 -> 1007);
    # S/s = T/s / seq, rounded to an integer (515,636 / 2048 = 251.8 -> 251 or 252).
    for r in MOSAIC_ROWS:
        c = r.cross_check
        assert abs(c["tokens_per_s"] / r.num_gpus - r.tokens_per_s_per_gpu) <= 1.0, r.name
        assert abs(c["tokens_per_s"] / r.model.seq_len - c["samples_per_s"]) < 1.0, r.name


def test_mosaic_mfu_from_throughput():
    # MFU = (6 N + 12 L d s) x T/s/GPU / peak (README 'MFU and HFU'). MPT-7B H100 s2048 8 GPUs:
    # 6 x 6,658,859,008 = 39,953,154,048; 12 x 32 x 4096 x 2048 = 3,221,225,472; sum
    # 43,174,379,520 x 10,643 = 4.5951e14 / 989.5e12 = 0.4644 (README 46.44).
    r = RUNS["mosaic-mpt-7b-h100-s2048-8gpu"]
    assert r.tokens_per_s_per_gpu == 10643 and r.mfu == pytest.approx(0.4644, abs=5e-5)
    for r in MOSAIC_ROWS:
        m = r.model
        per_token = 6 * r.num_params + 12 * m.num_layers * m.hidden_size * m.seq_len
        mfu = per_token * r.tokens_per_s_per_gpu / COMPOSER_PEAK_FLOPS[r.gpu]
        # T/s/GPU is rounded to an integer: relative slack 1/T (at least 0.3 %).
        assert mfu == pytest.approx(r.mfu, rel=max(3e-3, 1.0 / r.tokens_per_s_per_gpu)), r.name


# ------------------------------------------------------- out_of_sample_5 (NVIDIA dgxc-benchmarking)
DGXC_ROWS = [r for r in RUNS.values() if r.split == "out_of_sample_5"]


def test_dgxc_rows_selection():
    # FIFTH SPLIT RULE: every BF16 column of five tables at v25.01: 340B 5 + 15B 8 + 175B 5 +
    # 405B 3 (the full-model columns) + 70B 6 = 27 rows, all on H100 with tp or pp > 1.
    counts = {}
    for r in DGXC_ROWS:
        counts[r.name.rsplit("-", 1)[0]] = counts.get(r.name.rsplit("-", 1)[0], 0) + 1
        assert r.gpu == "h100-sxm" and (r.tp > 1 or r.pp > 1), r.name
    assert counts == {"nemo-nemotron4-340b": 5, "nemo-nemotron4-15b": 8, "nemo-gpt3-175b": 5,
                      "nemo-llama3.1-405b": 3, "nemo-llama3.1-70b": 6}


def test_dgxc_throughput_is_sequence_times_batch_over_step():
    # The README's formula: tokens/s = seq x GBS / step. 340B on 128 GPUs: 4096 x 32 / 4.61 =
    # 28,431.7 (table 28,432); 405B on 576: 8192 x 252 / 17.20 = 120,022.3 (table 120,022).
    # The step is printed to 0.01 s (0.1 s for '4.7'): the table's figure lies within the range
    # a half-unit of the last printed digit allows.
    # One source inconsistency: the 70B 2048-GPU column prints step 14.98 s but 2,248,957
    # tokens/s = 8192 x 4096 / 14.92 (the 1024-GPU column's step; 14.98 would give 2,239,948,
    # 0.4 % less). The row keeps the table's tokens/s (the FIFTH SPLIT RULE's metric).
    assert 4096 * 32 / 4.61 == pytest.approx(28_432, abs=0.5)
    assert 8192 * 4096 / 14.92 == pytest.approx(2_248_957, abs=0.5)
    for r in DGXC_ROWS:
        if r.name == "nemo-llama3.1-70b-2048gpu":
            assert r.cross_check["tokens_per_s"] == 2_248_957 and r.iteration_time_s == 14.98
            continue
        exact = r.model.seq_len * r.global_batch
        step = r.iteration_time_s
        half = 0.05 if round(step, 1) == step else 0.005
        assert exact / (step + half) <= r.cross_check["tokens_per_s"] <= exact / (step - half), \
            r.name
        assert r.tokens_per_s_per_gpu == pytest.approx(
            r.cross_check["tokens_per_s"] / r.num_gpus, abs=0.05), r.name


def test_dgxc_batches_follow_the_readmes_rules():
    # GBS = dp x MBS x GA with the table titles' GA: 340B 16 (128 GPUs: dp = 128/(8 x 8) = 2,
    # 32 = 2 x 1 x 16), 15B 4 (16 GPUs: dp 4, 64 = 4 x 4 x 4), 405B 63 (576 GPUs: dp =
    # 576/(8 x 9 x 2) = 4, 252 = 4 x 63), 70B 64 (64 GPUs: dp = 64/(4 x 4 x 2) = 2, 128 = 2 x 64);
    # 175B: GBS = nodes x 16 (README), 128 GPUs = 16 nodes -> 256 = 4 x 1 x 64.
    title_ga = {"nemo-nemotron4-340b": 16, "nemo-nemotron4-15b": 4, "nemo-llama3.1-405b": 63,
                "nemo-llama3.1-70b": 64}
    for r in DGXC_ROWS:
        ga = r.global_batch // (r.dp * r.micro_batch)
        assert r.global_batch == r.dp * r.micro_batch * ga == r.dp * r.micro_batch * \
            r.cross_check["grad_accum"], r.name
        family = r.name.rsplit("-", 1)[0]
        if family in title_ga:
            assert ga == title_ga[family], r.name
        else:
            assert r.global_batch == r.num_gpus // 8 * 16, r.name
        # Megatron's interleaving: layers split evenly over pp x v chunks, and the micro-batch
        # count a multiple of pp (340B: 96 / (8 x 12) = 1 layer per chunk, 16 = 2 x 8).
        assert r.model.num_layers % (r.pp * r.virtual_stages) == 0, r.name
        assert r.virtual_stages == 1 or ga % r.pp == 0, r.name


def _dgxc_model_flops_per_sample(layers, hidden, seq, vocab, ffn=None, groups=None, heads=None):
    """The READMEs' Notes: GPT rows 24·l·h² + 12·l·h·s (attention) + 48·l·h² (MLP) + 6·V·h;
    Llama rows 12·l·h²·(1 + g/a + s/h) + 18·l·f·h + 6·V·h; both times s."""
    if ffn is None:
        per_token = 24 * layers * hidden**2 + 12 * layers * hidden * seq + \
            48 * layers * hidden**2 + 6 * vocab * hidden
    else:
        per_token = 12 * layers * hidden**2 * (1 + groups / heads + seq / hidden) + \
            18 * layers * ffn * hidden + 6 * vocab * hidden
    return seq * per_token


def test_dgxc_dimensions_reproduce_the_readmes_model_flops():
    # Each README's Notes state the model FLOPs of one sample from the dimensions; the rows'
    # dimensions must give the same figure: 340B 1.01e16, 15B 434.5e12 (434,526,299,070,464),
    # 175B 2.20e15, 70B 3.94e15, 405B 2.17e16. (The Llama Notes print the leading factor as
    # "8129", a typo: 8192 x 481.43e9 = 3.944e15 gives their 3.94E+15, 8129 x would give 3.91.)
    # The Notes use 16 query groups for 405B (12 x 126 x 16384^2 x (1 + 16/128 + 1/2)).
    printed = {"nemo-nemotron4-340b": (1.01e16, 0.005), "nemo-nemotron4-15b": (434.5e12, 1e-3),
               "nemo-gpt3-175b": (2.20e15, 0.005), "nemo-llama3.1-70b": (3.94e15, 0.002),
               "nemo-llama3.1-405b": (2.17e16, 0.002)}
    for r in DGXC_ROWS:
        m = r.model
        gpt = m.mlp is not None or m.num_kv_heads is None
        flops = _dgxc_model_flops_per_sample(
            m.num_layers, m.hidden_size, m.seq_len, m.vocab_size,
            None if gpt else m.ffn_hidden_size, m.num_kv_heads, m.num_heads)
        value, rel = printed[r.name.rsplit("-", 1)[0]]
        assert flops == pytest.approx(value, rel=rel), r.name
    # (The 15B Notes print the attention term as 38,666,279,738; by hand 24 x 32 x 6144^2 +
    # 12 x 32 x 6144 x 4096 = 28,991,029,248 + 9,663,676,416 = 38,654,705,664: their product
    # 434.53e12 is 0.011 % above the exact 434.48e12, inside the 0.1 % checked.)
    assert _dgxc_model_flops_per_sample(32, 6144, 4096, 256000) == 434_478_891_663_360


def test_dgxc_nemotron_mlp_is_four_h_non_gated():
    # nemotron_340b.yaml: ffn_hidden_size 4 x hidden (73,728 = 4 x 18,432), activation
    # squared-relu (two matrices); 15B: 24,576 = 4 x 6,144.
    for r in DGXC_ROWS:
        if "nemotron" in r.name:
            assert r.model.ffn_hidden_size == 4 * r.model.hidden_size and r.model.mlp == "gelu"
            assert r.model.tied_embeddings is False


# ---------------------------------------------------------------- out_of_sample_6 (fms-fsdp)
# foundation-model-stack/fms-fsdp README at 4ffb9bd: 4 Llama 2 sizes on 128 A100 80GB (400 Gb/s)
# and 96 H100 80GB (800 Gb/s), batch size 2 per GPU, seq 4096, vocabulary 32,000, untied.
FMS_ROWS = [r for r in RUNS.values() if r.split == "out_of_sample_6"]
FMS_PEAK_FLOPS = {"a100-80gb": 312e12, "h100-sxm": 989e12}  # the README's '312 vs 989TFLOPS'


def llama2_params(layers: int, d: int, kv_heads: int, heads: int, ffn: int, vocab: int) -> int:
    """Llama 2 (fms LLaMA: no biases, RMSNorm scales only, untied head): per block q, o d^2
    each; k, v d x (kv_heads x d/heads) each; gate, up, down 3 x d x ffn; two norms 2d;
    final norm d; embedding and head 2 x V x d."""
    kv = kv_heads * (d // heads)
    return layers * (2 * d * d + 2 * d * kv + 3 * d * ffn + 2 * d) + d + 2 * vocab * d


def test_fms_rows_selection():
    # SIXTH SPLIT RULE: every row of the table, 4 sizes x 2 GPU types = 8 rows; the 7B rows
    # (HSDP) and the 13B rows (every-k-th-block AC) marked not_modelled before any error.
    assert len(FMS_ROWS) == 8
    assert {r.gpu: r.num_gpus for r in FMS_ROWS} == {"a100-80gb": 128, "h100-sxm": 96}
    # session 12 (h10): the 7B rows' not_modelled was lifted once HSDP (Layout.dp_shard) was
    # committed, with dp_shard 8 = one node's GPUs (fms-fsdp 4ffb9bd HYBRID_SHARD without a
    # process group). Session 13 (t10e): the 13B rows' not_modelled was lifted once partial
    # recompute (`recompute: block`) was committed, with k = 2 of fms's every-k-th-block AC
    # derived from the README's HFU / MFU (the derivation is the YAML comment): n = 40 // 2
    assert not [r.name for r in FMS_ROWS if r.not_modelled]
    block = sorted((r.name, r.recompute_num_layers) for r in FMS_ROWS if r.recompute == "block")
    assert block == [("fms-llama2-13b-a100-128gpu", 20), ("fms-llama2-13b-h100-96gpu", 20)]
    hsdp = sorted((r.name, r.dp_shard) for r in FMS_ROWS if r.dp_shard is not None)
    assert hsdp == [("fms-llama2-7b-a100-128gpu", 8), ("fms-llama2-7b-h100-96gpu", 8)]
    for r in FMS_ROWS:
        assert r.tp == r.pp == 1 and r.dp == r.num_gpus and r.micro_batch == 2, r.name
        assert r.global_batch == 2 * r.num_gpus, r.name  # batch size 2 per GPU, no accumulation
        assert r.model.seq_len == 4096 and r.model.vocab_size == 32_000, r.name
        # 400 Gb/s / 8 = 50 GB/s (A100 cluster); 800 Gb/s / 8 = 100 GB/s (H100 cluster)
        assert r.inter_node_gb_per_s == {"a100-80gb": 50, "h100-sxm": 100}[r.gpu], r.name


def test_llama2_params_by_hand():
    # 7B: 32 x (2 x 4096^2 + 2 x 4096 x 4096 + 3 x 4096 x 11008 + 8192) = 32 x 202,383,360
    # = 6,476,267,520; + 4096 + 2 x 32,000 x 4096 = 262,144,000 -> 6,738,415,616.
    assert llama2_params(32, 4096, 32, 32, 11008, 32000) == 6_738_415_616
    # 70B: kv 8 x 128 = 1024; per block 2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 28672 + 16384
    # = 134,217,728 + 16,777,216 + 704,643,072 + 16,384 = 855,654,400; x 80 = 68,452,352,000;
    # + 8192 + 2 x 32,000 x 8192 = 524,288,000 -> 68,976,648,192.
    assert llama2_params(80, 8192, 8, 64, 28672, 32000) == 68_976_648_192


def test_fms_zplan_param_count_matches_hand_formula():
    from benchmarks.published_runs import _data_model
    from planner.core.params import count_params

    for r in FMS_ROWS:
        m = r.model
        assert count_params(_data_model(r)).total == llama2_params(
            m.num_layers, m.hidden_size, m.num_kv_heads, m.num_heads, m.ffn_hidden_size,
            m.vocab_size), r.name


def test_fms_mfu_from_throughput():
    # MFU = (6N + 12 L d s) x tokens/s/GPU / peak (nanoGPT / PaLM, the README's method).
    # 7B A100: 6 x 6,738,415,616 = 40,430,493,696; 12 x 32 x 4096 x 4096 = 6,442,450,944;
    # 46,872,944,640 x 3700 = 1.7343e14 / 312e12 = 0.556 (README 0.57). The table's figures are
    # rounded (throughput to 2-3 digits, MFU to 2): agreement within 10 % is what they allow
    # (largest: 34B H100, 0.348 vs 0.32).
    for r in FMS_ROWS:
        m = r.model
        n = llama2_params(m.num_layers, m.hidden_size, m.num_kv_heads, m.num_heads,
                          m.ffn_hidden_size, m.vocab_size)
        per_token = 6 * n + 12 * m.num_layers * m.hidden_size * m.seq_len
        mfu = per_token * r.tokens_per_s_per_gpu / FMS_PEAK_FLOPS[r.gpu]
        assert mfu == pytest.approx(r.cross_check["mfu"], rel=0.10), r.name


def test_fms_hfu_over_mfu_matches_recompute():
    # HFU counts the recompute forward: none -> HFU = MFU; full AC -> about 1 + 2/6 = 4/3 (the
    # blocks' forward again; embedding and head not recomputed); every-k-th-block AC in between.
    for r in FMS_ROWS:
        ratio = r.cross_check["hfu"] / r.cross_check["mfu"]
        if r.recompute == "none":
            assert ratio == 1.0, r.name
        elif r.recompute == "full":
            assert 1.25 <= ratio <= 1.42, r.name
        else:
            assert 1.0 < ratio < 4 / 3, r.name


def test_opt_175b_layout_from_the_metaseq_launcher():
    # metaseq launcher/opt_baselines.py (f7ffa5f): ddp_bsz = (batch_size // (gpus / mp)) // 2048
    # with '175b' batch 2.0 M = 2,097,152 tokens, model_parallel 8, 992 GPUs: 992 / 8 = 124;
    # 2,097,152 // 124 = 16,912; 16,912 // 2048 = 8 sequences per GPU; --update-freq 1.
    r = RUNS["opt-175b"]
    assert (r.tp, r.dp) == (8, 124) and (2_097_152 // 124) // 2048 == 8 == r.micro_batch
    assert r.global_batch == 8 * 124 == 992  # 992 x 2048 = 2,031,616 tokens, "2M tokens"
    assert "zero2" in r.engine  # --no-reshard-after-forward


# ------------------------------------- out_of_sample_7 (later dgxc-benchmarking: GB200, new H100)
LATER_ROWS = [r for r in RUNS.values() if r.split == "out_of_sample_7"]
# The READMEs' model FLOPs of one sample (their Notes): 405B 2.17E+16 (v25.05.05 llama3.1),
# Nemotron-4 340B 8.62124e15 and 15B 3.85e14 (v25.05.05 nemotron), Llama 3.1 8B 4.74E+14
# (v25.04.02 llama3.1), GPT-3 175B 2.20E+15 (v25.04.02 nemo_megatron); 70B 3.94e15 (v25.01
# llama3.1/README_70b.md: the v25.04.02 Notes work only the 8B example).
LATER_FLOPS = {"llama3.1-405b": 2.17e16, "nemotron4-340b": 8.62124e15, "nemotron4-15b": 3.85e14,
               "llama3.1-8b": 4.74e14, "llama3.1-70b": 3.94e15, "gpt3-175b": 2.20e15}
# The READMEs' peak tables: GB200 BF16 2,450 TFLOP/s (v25.05.05 llama3.1 'Peak theoretical
# throughput'), H100 BF16 989.
LATER_PEAK = {"gb200": 2450e12, "h100-sxm": 989e12}


def _later_family(r) -> str:
    return next(k for k in LATER_FLOPS if k in r.name)


def test_later_dgxc_rows_selection():
    # SEVENTH SPLIT RULE: 405B 3 GB200 + 1 H100; Nemotron-4 15B 1 H100, 340B 1 H100 + 3 GB200
    # weak + 3 GB200 strong scaling (v25.05.05); Llama 3.1 8B 5, 70B 6, GPT-3 175B 5 H100
    # (v25.04.02): 28 rows, 9 on GB200.
    counts = {}
    for r in LATER_ROWS:
        key = r.name.rsplit("-", 1)[0]
        counts[key] = counts.get(key, 0) + 1
        release = "v25.05.05" if ("405b" in r.name or "nemotron" in r.name) else "v25.04.02"
        assert f"(release {release})" in r.paper, r.name
        assert r.gpu in ("gb200", "h100-sxm") and r.category == "dense", r.name
        assert (r.cluster == "gb200-nvl72-seg16x8") == (r.gpu == "gb200"), r.name
        # tp 1 (Llama 3.1 8B): no tensor-parallel communication to overlap
        assert r.tp > 1 or "tp_comm" not in r.megatron_overlap, r.name
    assert counts == {
        "dgxc-llama3.1-405b-gb200": 3, "dgxc-llama3.1-405b-h100-sxm": 1,
        "dgxc-nemotron4-15b-h100-sxm": 1, "dgxc-nemotron4-340b-h100-sxm": 1,
        "dgxc-nemotron4-340b-gb200": 3, "dgxc-nemotron4-340b-gb200-strong": 3,
        "dgxc-llama3.1-8b-h100-sxm": 5, "dgxc-llama3.1-70b-h100-sxm": 6,
        "dgxc-gpt3-175b-h100-sxm": 5}
    assert RUNS[list(RUNS)[-1]].split == "out_of_sample_7"  # appended at the END of the runs


def test_later_dgxc_throughput_is_sequence_times_batch_over_step():
    # tokens/s = seq x GBS / step (the READMEs' formula). 405B on 128 GB200: 8192 x 64 / 9.347 =
    # 56,091.8 (table 56,092); 340B strong on 128 GB200: 4096 x 512 / 32.66 = 64,211.6 (64,211:
    # truncated, so one token/s of slack below). The table's figure lies within the
    # range a half-unit of the step's last printed digit allows.
    assert 8192 * 64 / 9.347 == pytest.approx(56_092, abs=0.5)
    assert 4096 * 512 / 32.66 == pytest.approx(64_211.6, abs=0.05)
    for r in LATER_ROWS:
        exact = r.model.seq_len * r.global_batch
        step = r.iteration_time_s
        decimals = len(repr(step).split(".")[1])
        half = 0.5 * 10 ** -decimals
        assert exact / (step + half) <= r.cross_check["tokens_per_s"] + 1 \
            and r.cross_check["tokens_per_s"] <= exact / (step - half), r.name
        assert r.tokens_per_s_per_gpu == pytest.approx(
            r.cross_check["tokens_per_s"] / r.num_gpus, abs=0.05), r.name


def test_later_dgxc_batches_and_the_gpt3_typo():
    # GBS = DP x MBS x GA of the layout table; the printed GBS agrees everywhere but GPT-3 175B
    # on 512 H100: the v25.04.02 table prints 1204 with DP 16, GA 64, MBS 1 (= 1024), and its
    # throughput 249,068 tokens/s = 2048 x 1024 / 8.42 (= 249,068.4), not 2048 x 1204 / 8.42
    # (292,850): 1024 is the batch that ran.
    assert 2048 * 1024 / 8.42 == pytest.approx(249_068, abs=0.5)
    for r in LATER_ROWS:
        assert r.global_batch == r.dp * r.micro_batch * r.cross_check["grad_accum"], r.name
        printed = r.cross_check["gbs_printed"]
        if r.name == "dgxc-gpt3-175b-h100-sxm-512gpu":
            assert (printed, r.global_batch) == (1204, 1024)
        else:
            assert printed == r.global_batch, r.name
        assert r.cross_check["layers_printed"] == r.model.num_layers, r.name


def test_later_dgxc_mfu_from_the_readmes_model_flops():
    # MFU = GBS x model FLOPs / step / GPUs / peak (the READMEs' formula), e.g. 405B on 128
    # GB200: 64 x 2.17e16 / 9.347 / 128 / 2.45e15 = 0.4738 (table 47.4 %); GPT-3 on 512 H100
    # with the batch 1024: 1024 x 2.20e15 / 8.42 / 512 / 989e12 = 0.5284 (table 52.84 %). The
    # printed MFU and model FLOPs are rounded (3 significant digits): 0.3 % relative allowed.
    assert 64 * 2.17e16 / 9.347 / 128 / 2.45e15 == pytest.approx(0.4738, abs=1e-4)
    assert 1024 * 2.20e15 / 8.42 / 512 / 989e12 == pytest.approx(0.5284, abs=1e-4)
    for r in LATER_ROWS:
        mfu = r.global_batch * LATER_FLOPS[_later_family(r)] / r.iteration_time_s / \
            r.num_gpus / LATER_PEAK[r.gpu]
        assert mfu == pytest.approx(r.mfu, rel=3e-3), r.name


def test_later_dgxc_layer_split_and_interleaving():
    # Chunks of pp x vp: Nemotron-4 340B on GB200 96 / (4 x 12) = 2 layers per chunk, on H100
    # 96 / (8 x 12) = 1; GPT-3 96 / (8 x 6) = 2; 70B 80 / (4 x 5) = 4. Llama 3.1 405B: 126 over
    # 8 x 8 = 64 chunks does not divide; with the embedding and the loss counted as one layer
    # each (Megatron-Core account_for_*_in_pipeline_split) (126 + 2) / 64 = 2.
    assert 126 % 64 != 0 and (126 + 2) % 64 == 0
    for r in LATER_ROWS:
        chunks = r.pp * r.virtual_stages
        extra = len(r.pipeline_split_accounting)
        assert (r.model.num_layers + extra) % chunks == 0, r.name
        assert (extra == 2) == ("405b" in r.name), r.name
        ga = r.cross_check["grad_accum"]
        assert r.virtual_stages == 1 or ga % r.pp == 0, r.name


def test_gb200_segment_cluster_profile():
    # 16 compute trays x 4 GPUs = 64 GPUs per NVLink segment; one 400 Gb/s NIC per GPU = 50 GB/s
    # -> 64 x 50 = 3,200 GB/s per segment. 128 / 256 / 512 GPUs are 2 / 4 / 8 segments (and no
    # multiple of a whole 72-GPU rack).
    from planner.io.loading import load_cluster

    c = load_cluster("gb200-nvl72-seg16x8")
    assert c.node.gpus_per_node == 16 * 4 and c.inter_node_gb_per_s == 64 * 50
    assert c.gpu.name == "gb200" and c.num_gpus == 512
    for r in LATER_ROWS:
        if r.gpu == "gb200":
            assert r.num_gpus % 64 == 0 and r.num_gpus % 72 != 0, r.name
