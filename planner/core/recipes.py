"""Named precision recipes and optimizers (docs/equations.md §2).

Bytes per parameter = param + grad + master + optimizer grad copy + states x state bytes.
The three conventions of the seeds are all here and all real:
ZeRO paper 16 (001 §1.3), Megatron 18 (004 §3.5.1), ZeRO-Infinity 20 (000 §3 eq.2).
Seed and paper citations: docs/references.md
"""

from __future__ import annotations

from planner.core.errors import PlanInputError
from planner.core.spec import Optimizer, PrecisionRecipe

MXFP8_BLOCK = 32
"""Elements sharing one E8M0 scale in MXFP8 (OCP Microscaling spec v1.0 §5; Transformer Engine
transformer_engine/pytorch/constants.py MXFP8_BLOCK_SCALING_SIZE = 32)."""

PRECISIONS: dict[str, PrecisionRecipe] = {
    recipe.name: recipe
    for recipe in (
        PrecisionRecipe(
            name="zero-fp16", compute_dtype="fp16", param_bytes=2, grad_bytes=2,
            master_param_bytes=4, activation_bytes=2,
            source="ZeRO paper (seed 001 §1.3): fp16 param 2 + fp16 grad 2 + K=12 with Adam",
        ),
        PrecisionRecipe(
            name="bf16-mixed", compute_dtype="bf16", param_bytes=2, grad_bytes=2,
            master_param_bytes=4, activation_bytes=2,
            source="bf16 params and grads, fp32 master weights: the ZeRO paper's 16 bytes in bf16",
        ),
        PrecisionRecipe(
            name="megatron-bf16", compute_dtype="bf16", param_bytes=2, grad_bytes=4,
            master_param_bytes=4, activation_bytes=2,
            source="Megatron (seed 004 §3.5.1): bf16 param 2 + fp32 main_grad 4 + fp32 param, m, v 12",
        ),
        PrecisionRecipe(
            name="megatron-fp16", compute_dtype="fp16", param_bytes=2, grad_bytes=4,
            master_param_bytes=4, activation_bytes=2,
            source="Megatron --fp16 --accumulate-allreduce-grads-in-fp32: fp16 param 2 + fp32 "
                   "main_grad 4 + fp32 param, m, v 12 = 18 (seed 004 §3.5.1 in fp16)",
        ),
        PrecisionRecipe(
            name="zero-infinity-fp16", compute_dtype="fp16", param_bytes=2, grad_bytes=2,
            master_param_bytes=4, optimizer_grad_copy_bytes=4, activation_bytes=2,
            source="ZeRO-Infinity (seed 000 §3 eq.2): the 16 bytes + an fp32 gradient copy 4 = 20",
        ),
        PrecisionRecipe(
            name="te-fp8", compute_dtype="fp8", param_bytes=2, grad_bytes=4,
            master_param_bytes=4, activation_bytes=2, fp8_weight_cache_bytes=2,
            fp8_scaling="per-tensor",
            source="Megatron-LM --fp8-format hybrid with Transformer Engine (per-tensor scaling, "
                   "Hopper): bf16 param 2 + fp8 weight copy 1 + its transpose 1 (TE "
                   "module/linear.py quantize_weight, rowwise and columnwise usage while grad is "
                   "enabled; NVIDIA/TransformerEngine@d0067d0d) + fp32 main_grad 4 + fp32 param, "
                   "m, v 12 = 20 (docs/fp8.md)",
        ),
        PrecisionRecipe(
            name="te-fp8-params", compute_dtype="fp8", param_bytes=1, grad_bytes=4,
            master_param_bytes=4, activation_bytes=2, fp8_weight_cache_bytes=1,
            fp8_scaling="per-tensor",
            source="Megatron-LM --fp8-param-gather (TE quantized_model_init: the parameter IS the "
                   "fp8 tensor): fp8 param 1 + its transpose 1 + fp32 main_grad 4 + fp32 master, "
                   "m, v 12 = 18 (docs/fp8.md)",
        ),
        PrecisionRecipe(
            name="te-mxfp8", compute_dtype="fp8", param_bytes=2, grad_bytes=4,
            master_param_bytes=4, activation_bytes=2,
            fp8_weight_cache_bytes=2 + 2 / MXFP8_BLOCK, fp8_scaling="mxfp8",
            source="Transformer Engine MXFP8BlockScaling (Blackwell): bf16 param 2 + fp8 rowwise "
                   "and columnwise copies 1 + 1, each with one E8M0 byte per 32 elements "
                   "(constants.py MXFP8_BLOCK_SCALING_SIZE = 32; scale padding to 128 x 4 not "
                   "counted) + fp32 main_grad 4 + 12 = 20.0625 (docs/fp8.md)",
        ),
        PrecisionRecipe(
            name="autocast-bf16", compute_dtype="bf16", param_bytes=4, grad_bytes=4,
            master_param_bytes=0, activation_bytes=2,
            source="fp32 weights under torch.autocast(bfloat16) (HF Trainer bf16=True, plain "
                   "AMP): fp32 param 4 + fp32 grad 4 + Adam m, v 8 = 16; matmuls and their "
                   "saved inputs in bf16 (planner.memory.implementations, docs/implementations.md)",
        ),
        PrecisionRecipe(
            name="autocast-fp16", compute_dtype="fp16", param_bytes=4, grad_bytes=4,
            master_param_bytes=0, activation_bytes=2,
            source="fp32 weights under torch.autocast(float16) with a GradScaler (HF Trainer "
                   "fp16=True): 4 + 4 + 8 = 16 bytes per parameter with Adam",
        ),
        PrecisionRecipe(
            name="fp32", compute_dtype="fp32", param_bytes=4, grad_bytes=4,
            master_param_bytes=0, activation_bytes=4,
            source="plain fp32 Adam without mixed precision: 4 + 4 + 8 = 16 bytes (seed 004 note)",
        ),
    )
}

# 8-bit Adam keeps one fp32 absmax per 2048-element block per state
# (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization", §2, block size 2048).
_BLOCKWISE_ABSMAX_BYTES = 2 * 4 / 2048

OPTIMIZERS: dict[str, Optimizer] = {
    opt.name: opt
    for opt in (
        Optimizer(name="adam", num_states=2, state_bytes=4),
        Optimizer(name="adamw", num_states=2, state_bytes=4),
        Optimizer(name="sgd-momentum", num_states=1, state_bytes=4),
        Optimizer(name="sgd", num_states=0, state_bytes=4),
        Optimizer(name="adam-8bit", num_states=2, state_bytes=1,
                  state_overhead_bytes=_BLOCKWISE_ABSMAX_BYTES),
    )
}

DEFAULT_PRECISION = "zero-fp16"
DEFAULT_OPTIMIZER = "adam"


def get_precision(name: str) -> PrecisionRecipe:
    """The named precision recipe, or a one-line error listing the allowed names."""
    if name not in PRECISIONS:
        raise PlanInputError("precision", f"unknown recipe {name!r}; allowed: {', '.join(PRECISIONS)}")
    return PRECISIONS[name]


def get_optimizer(name: str) -> Optimizer:
    """The named optimizer, or a one-line error listing the allowed names."""
    if name not in OPTIMIZERS:
        raise PlanInputError("optimizer", f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def optimizer_bytes_per_param(precision: PrecisionRecipe, optimizer: Optimizer) -> float:
    """K of the ZeRO paper: bytes the optimizer step holds per parameter (seed 001 §1.3).

    master fp32 copy + optional fp32 gradient copy + states x bytes + quantization statistics.
    Adam with mixed precision: 4 + 0 + 2 x 4 = 12.
    """
    return (
        precision.master_param_bytes
        + precision.optimizer_grad_copy_bytes
        + optimizer.num_states * optimizer.state_bytes
        + optimizer.state_overhead_bytes
    )


def model_state_bytes_per_param(precision: PrecisionRecipe, optimizer: Optimizer) -> float:
    """Bytes per parameter of every model state with nothing sharded: working param + grad +
    the fp8 weight copies (FP8 recipes) + K. zero-fp16 with Adam: 2 + 2 + 0 + 12 = 16;
    te-fp8 with Adam: 2 + 4 + 2 + 12 = 20."""
    return (precision.param_bytes + precision.grad_bytes + precision.fp8_weight_cache_bytes
            + optimizer_bytes_per_param(precision, optimizer))
