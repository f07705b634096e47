"""FP8 training with Transformer Engine: bytes of what is kept in fp8 (docs/fp8.md).

Which tensors are fp8 (NVIDIA/TransformerEngine@d0067d0d, transformer_engine/pytorch/module/
linear.py): the inputs of every GEMM of a `te.Linear` / `LayerNormLinear` / `LayerNormMLP` (the
activation, the weight, and in backward the output gradient), the activation a linear saves
for its weight-gradient GEMM, and the weight's fp8 copy and transpose kept for the step.
What stays in higher precision: the master weights and optimizer states (fp32), the gradients
(fp32 main_grad in Megatron), the bf16 working weight (unless the recipe makes the parameter
itself fp8), norms, softmax and the attention core (bf16 unless fp8 attention is asked for),
residuals and the GEMM outputs. A linear's saved input keeps only its column-wise (transposed)
fp8 data: "Discard row-wise data since it is not needed in backward pass" (linear.py, update_usage
(rowwise_usage=False, columnwise_usage=True)), so it costs one byte per element plus its scales.
"""

from __future__ import annotations

from typing import Literal

from planner.core.recipes import MXFP8_BLOCK
from planner.core.spec import ceil_div

Fp8Scaling = Literal["per-tensor", "mxfp8"]
"""`per-tensor`: one fp32 scale per tensor (TE DelayedScaling and Float8CurrentScaling, Hopper);
`mxfp8`: one E8M0 byte per 32 elements (TE MXFP8BlockScaling, Blackwell)."""

FP8_ELEMENT_BYTES = 1
"""E4M3 and E5M2 both store one byte per element."""
PER_TENSOR_SCALE_BYTES = 4
"""One fp32 scale_inv per Float8Tensor (float8_tensor.py: `fp8_scale_inv` float32, shape [1])."""


def _round_up(value: int, multiple: int) -> int:
    return ceil_div(value, multiple) * multiple


def mxfp8_columnwise_scale_bytes(rows: int, cols: int) -> int:
    """E8M0 scales of the column-wise data of a [rows x cols] MXFP8 tensor: one per 32 rows of a
    column, the grid padded to multiples of [4, 128] (mxfp8_tensor.py get_scale_shape,
    columnwise: (round_up(rows // 32, 4), round_up(cols, 128)))."""
    return _round_up(rows // MXFP8_BLOCK, 4) * _round_up(cols, 128)


def fp8_saved_input_bytes(tokens: int, in_features: int, scaling: Fp8Scaling = "per-tensor") -> int:
    """Bytes a TE linear saves of its input [tokens x in_features] for the weight gradient:
    the column-wise fp8 copy (1 byte per element) + its scales. bf16 would save 2 per element."""
    data = tokens * in_features * FP8_ELEMENT_BYTES
    if scaling == "mxfp8":
        return data + mxfp8_columnwise_scale_bytes(tokens, in_features)
    return data + PER_TENSOR_SCALE_BYTES


def fp8_weight_cache_bytes(rows: int, cols: int, scaling: Fp8Scaling = "per-tensor",
                           fp8_param: bool = False) -> int:
    """Bytes of one weight's fp8 copies kept for the step: row-wise (forward GEMM) and
    column-wise (data-gradient GEMM; on Hopper the transpose), each with its scales. With an
    fp8 parameter (`te-fp8-params`) the row-wise copy is the parameter itself, so only the
    column-wise one is extra. Exact, scale padding included; recipes.py's per-parameter figure
    leaves the padding out."""
    n = rows * cols
    if scaling == "mxfp8":
        rowwise = n + _round_up(rows, 128) * _round_up(cols // MXFP8_BLOCK, 4)
        columnwise = n + mxfp8_columnwise_scale_bytes(rows, cols)
    else:
        rowwise = columnwise = n + PER_TENSOR_SCALE_BYTES
    return columnwise if fp8_param else rowwise + columnwise


def mfu_peak_dtype(compute_dtype: str) -> str:
    """The peak an MFU is stated against: bf16 for an fp8 run, as the field reports it
    (torchtitan torchtitan/tools/utils.py `get_peak_flops` returns the dense BF16 peak, e.g.
    989e12 for H100 SXM, and its MFU uses it with or without float8 training; docs/fp8.md)."""
    return "bf16" if compute_dtype == "fp8" else compute_dtype
