"""FP8 training (Transformer Engine) bytes, worked out by hand from TE's code at
NVIDIA/TransformerEngine@d0067d0d (docs/fp8.md): per parameter and per saved activation."""

from __future__ import annotations

import pytest

from planner.core.recipes import OPTIMIZERS, PRECISIONS, model_state_bytes_per_param
from planner.memory.fp8 import (
    fp8_saved_input_bytes,
    fp8_weight_cache_bytes,
    mfu_peak_dtype,
    mxfp8_columnwise_scale_bytes,
)

ADAM = OPTIMIZERS["adam"]


@pytest.mark.parametrize("name, expected", [
    # bf16 param 2 + fp32 main_grad 4 + fp8 copy 1 + fp8 transpose 1 + fp32 master 4 + m 4 + v 4
    ("te-fp8", 2 + 4 + 1 + 1 + 4 + 4 + 4),
    # the parameter is the fp8 copy (1) + its transpose 1 + main_grad 4 + master, m, v 12
    ("te-fp8-params", 1 + 1 + 4 + 4 + 4 + 4),
    # MXFP8: two fp8 copies with one E8M0 scale byte per 32 elements each: 2 x (1 + 1/32)
    ("te-mxfp8", 2 + 4 + 2 * (1 + 1 / 32) + 12),
    # unchanged conventions: the ZeRO paper's 16 and Megatron's 18 carry no fp8 copies
    ("zero-fp16", 2 + 2 + 12),
    ("megatron-bf16", 2 + 4 + 12),
])
def test_bytes_per_parameter_with_adam(name, expected):
    assert model_state_bytes_per_param(PRECISIONS[name], ADAM) == pytest.approx(expected, abs=0)


def test_fp8_recipes_compute_in_fp8_and_keep_bf16_elsewhere():
    for name in ("te-fp8", "te-fp8-params", "te-mxfp8"):
        recipe = PRECISIONS[name]
        assert recipe.compute_dtype == "fp8"
        assert recipe.activation_bytes == 2  # norms, softmax, residuals stay bf16
        assert recipe.master_param_bytes == 4 and recipe.grad_bytes == 4


def test_saved_linear_input_per_tensor_scaling():
    # Llama-2-7B fc1 input, micro-batch 1 x 4096 tokens x 4096 features: the column-wise fp8
    # copy is 1 byte per element + one fp32 scale_inv (4 bytes); bf16 would be 2 per element.
    assert fp8_saved_input_bytes(4096, 4096) == 4096 * 4096 + 4 == 16_777_220
    assert 2 * 4096 * 4096 == 33_554_432  # the bf16 input it replaces: 2.0x


def test_saved_linear_input_mxfp8():
    # [4096 x 4096] column-wise: 4096 / 32 = 128 scale rows (multiple of 4) x 4096 columns
    # (multiple of 128) = 524,288 E8M0 bytes, 1/32 of the data
    assert mxfp8_columnwise_scale_bytes(4096, 4096) == 128 * 4096 == 524_288
    assert fp8_saved_input_bytes(4096, 4096, "mxfp8") == 4096 * 4096 + 524_288
    # padding: 100 tokens -> 100 // 32 = 3 scale rows, padded to 4; 100 columns padded to 128
    assert mxfp8_columnwise_scale_bytes(100, 100) == 4 * 128


def test_weight_cache_of_one_matrix():
    # Hopper per-tensor: row-wise copy and its transpose, 1 byte each + 4-byte scale each
    assert fp8_weight_cache_bytes(11008, 4096) == 2 * (11008 * 4096 + 4)
    # fp8 parameters: only the transpose is extra
    assert fp8_weight_cache_bytes(11008, 4096, fp8_param=True) == 11008 * 4096 + 4
    # MXFP8: row-wise scales round_up(11008, 128) x round_up(4096 / 32, 4) = 11008 x 128;
    # column-wise round_up(11008 / 32, 4) x round_up(4096, 128) = 344 x 4096
    n = 11008 * 4096
    assert fp8_weight_cache_bytes(11008, 4096, "mxfp8") == 2 * n + 11008 * 128 + 344 * 4096


def test_mfu_is_against_the_bf16_peak_for_fp8():
    assert mfu_peak_dtype("fp8") == "bf16"
    assert mfu_peak_dtype("fp16") == "fp16"
