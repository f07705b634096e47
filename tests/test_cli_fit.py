"""`zplan fit`, `zplan presets`, `zplan show` through the CLI: exit codes 0/1/2, one-line errors."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.cli

H, L, V, S = 12288, 96, 50257, 2048  # GPT-3 175B (Brown et al. 2020, Table 2.1), V of GPT-2's BPE


def gpt3_exact_params() -> int:
    """GPT-3 175B by hand: learned positions, tied embeddings, biases, LayerNorm (GPT-2 layout)."""
    embeddings = V * H + S * H
    attention = 4 * H * H + 4 * H  # Q, K, V, O weights + biases
    mlp = 8 * H * H + 4 * H + H  # fc1 h x 4h + 4h bias, fc2 4h x h + h bias
    norms = 2 * 2 * H  # two LayerNorms, weight + bias
    return embeddings + L * (attention + mlp + norms) + 2 * H  # + final LayerNorm


def assert_one_line_error(result, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert result.stdout == ""


def test_fit_main_job_fits(zplan):
    result = zplan("fit", "--model", "gpt3-175b", "--cluster", "dgx2x32")
    assert result.returncode == 0, result.stderr
    assert "FITS" in result.stdout
    assert "Minimum GPUs per strategy" in result.stdout


def test_fit_json_is_one_document_on_stdout(zplan):
    result = zplan("fit", "--model", "gpt3-175b", "--cluster", "dgx2x32", "--tp", "8", "--pp", "8",
                   "--zero", "1", "--recompute", "full", "--global-batch", "1024", "--json")
    assert result.returncode in (0, 1), result.stderr
    doc = json.loads(result.stdout)
    assert doc["kind"] == "fit" and doc["schema_version"] == 1
    assert doc["params_total"] == gpt3_exact_params()
    assert doc["layout"]["dp"] == 512 // (8 * 8)  # dp derived from the 512 GPUs of dgx2x32
    assert doc["layout"]["grad_accum"] == 1024 // (1 * 8)  # global / (micro * dp)
    assert len(doc["memory"]["stages"]) == 8
    assert doc["fits"] == (result.returncode == 0)


def test_fit_ddp_of_175b_does_not_fit(zplan):
    # DDP keeps 16 bytes per parameter on every GPU (seed 001 §2): 16 x 1.75e11 = 2.8 TB > 32 GB.
    result = zplan("fit", "--model", "gpt3-175b", "--cluster", "dgx2x32", "--zero", "0")
    assert result.returncode == 1, result.stderr
    assert "DOES NOT FIT" in result.stdout and "GPU memory on stage 1" in result.stdout


def test_unknown_model_is_one_line(zplan):
    assert_one_line_error(zplan("fit", "--model", "gpt5-zillion", "--cluster", "dgx2"), "gpt5-zillion")


def test_tp_not_dividing_heads_is_one_line(zplan):
    # GPT-3 175B has 96 heads; 96 is not divisible by 5 (and 5 divides 80 GPUs? use --gpus 80)
    result = zplan("fit", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "80", "--tp", "5")
    assert_one_line_error(result, "tp=5 must divide num_heads=96")


def test_impossible_batch_is_one_line(zplan):
    result = zplan("fit", "--model", "gpt2", "--cluster", "dgx2", "--micro-batch", "3",
                   "--global-batch", "100")
    assert_one_line_error(result, "global_batch=100", "micro_batch*dp = 3*16")


def test_zero_tp_is_one_line(zplan):
    assert_one_line_error(zplan("fit", "--model", "gpt2", "--cluster", "dgx2", "--tp", "0"), "--tp")


def test_malformed_model_yaml_is_one_line(zplan, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnum_layers: [1, 2\n")
    assert_one_line_error(zplan("fit", "--model", str(bad), "--cluster", "dgx2"), "bad.yaml")


def test_negative_size_in_user_model_is_one_line(zplan, tmp_path):
    bad = tmp_path / "neg.yaml"
    bad.write_text("name: neg\nnum_layers: -4\nhidden_size: 64\nnum_heads: 4\nffn_hidden_size: 256\n"
                   "vocab_size: 100\nmax_seq_len: 128\n")
    assert_one_line_error(zplan("fit", "--model", str(bad), "--cluster", "dgx2"), "num_layers")


def test_presets_lists_models_and_hardware(zplan):
    result = zplan("presets", "--json")
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    assert "gpt3-175b" in listing["models"] and "dgx2x32" in listing["clusters"]


def test_show_reports_exact_count(zplan):
    result = zplan("show", "gpt3-175b", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["params"]["total"] == gpt3_exact_params()
    assert doc["approx_with_embeddings"] == 175_181_291_520  # EQUATIONS.md §1
