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
from planner.core.spec import Layout, ModelSpec, ceil_div

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


# --------------------------------------------------------------------------- saved activations


CORE_OUTPUT = "attn.core_output"
"""The attention kernel's own bf16 output O, saved by flash / fused attention for its backward
(TE backends.py FusedAttnFunc saves q, k, v, out in 16 bits unless fp8 attention is asked for).
In bf16 it is the same storage as the projection's saved input and is counted once; under fp8
the projection saves an fp8 copy instead, so O becomes an entry of its own."""


def linear_input_features(model: ModelSpec, layout: Layout) -> dict[str, int]:
    """in_features of every inventory entry (planner.memory.activations) that is the saved input
    of a Transformer Engine linear, on one tensor-parallel rank. Megatron's TE layer spec
    (get_gpt_layer_with_transformer_engine_spec) builds linear_qkv and linear_fc1 as
    TELayerNormColumnParallelLinear and linear_proj, linear_fc2 as TERowParallelLinear; MoE
    experts are TE grouped linears and the shared expert a TE MLP of width
    num_shared x expert_ffn (one tensor). Not fp8: an MoE layer's router input (`mlp.fc1_input`
    of an MoE block, the router is a plain torch linear), the output layer's input (`head.input`,
    Megatron's output_layer is not a TE module) and everything that is not a linear input."""
    t, h = layout.tp, model.hidden_size
    out = {"attn.qkv_input": h, "attn.proj_input": model.num_heads * model.head_size // t}
    if model.is_mla:  # MLA (activations.mla_attention_saved_bytes): the up projections' norm
        # outputs are TE linear inputs too; the output projection reads a/t heads of v_head_dim
        out["attn.proj_input"] = model.num_heads * model.v_head_dim // t
        out["attn.kv_norm.output"] = model.kv_lora_rank or 0
        if model.q_lora_rank is not None:
            out["attn.q_norm.output"] = model.q_lora_rank
    if model.is_moe:
        out["moe.expert_input"] = h
        out["moe.expert.fc2_input"] = model.expert_ffn_size // t
        if model.num_shared_experts:
            out["moe.shared.fc2_input"] = model.num_shared_experts * model.expert_ffn_size // t
    else:
        out["mlp.fc1_input"] = h
        out["mlp.fc2_input"] = model.ffn_hidden_size // t
    return out


def fp8_inventory(model: ModelSpec, layout: Layout, inventory: dict[str, int],
                  activation_bytes: int, scaling: Fp8Scaling) -> dict[str, int]:
    """One block's saved tensors under an FP8 recipe: each TE linear's saved input becomes its
    fp8 copy (`fp8_saved_input_bytes`: 1 byte per element + scales; rows = the bf16 entry's
    elements / in_features), everything else keeps `activation_bytes`. With flash attention the
    attention kernel's bf16 output O is added (`CORE_OUTPUT`).

    With sequence parallel the column-parallel linears save the local shard: row-wise only for
    per-tensor scaling ("All-gather is not supported with FP8 column-wise data",
    layernorm_linear.py, `input_quantizer.set_usage(columnwise=False)`), column-wise only for
    MXFP8 (layernorm_linear.py: "For MXFP8, columnwise only data can be allgathered"); one
    byte per element and one scale either way for per-tensor, the column-wise E8M0 grid for
    MXFP8. Named approximation: the routed experts' inputs are taken as one tensor
    (TE keeps one per local expert: 4 more bytes per expert per-tensor, and per-expert padding
    of the MXFP8 grid, not counted)."""
    out = dict(inventory)
    for name, cols in linear_input_features(model, layout).items():
        if name in out:
            rows = out[name] // (activation_bytes * cols)
            out[name] = fp8_saved_input_bytes(rows, cols, scaling)
    if model.is_mla and "attn.qkv_input" in out:
        # MLA: linear_kv_down_proj and linear_q_down_proj (or linear_q_proj) are two TE linears
        # reading the same bf16 tensor; each quantizes and saves its own fp8 copy (the unfused
        # MLA spec, Megatron-LM multi_latent_attention.py at d98e8a64)
        out["attn.qkv_input"] *= 2
    if layout.flash_attention and "attn.proj_input" in inventory:
        out[CORE_OUTPUT] = inventory["attn.proj_input"]
    return out
