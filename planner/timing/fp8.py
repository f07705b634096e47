"""FP8 training in the step time: which matmuls run at the fp8 peak, the cast kernels, MFU.

Transformer Engine under an FP8 recipe (docs/fp8.md; NVIDIA/TransformerEngine@d0067d0d,
transformer_engine/pytorch/module/linear.py and layernorm_linear.py) runs the GEMMs of its
linears in fp8: the attention projections and the MLP / expert matrices, forward (fprop) and
backward (dgrad, wgrad). Everything else runs as in bf16: the attention core (TE's fused /
flash attention is bf16 unless fp8 attention is asked for, `NVTE_FP8_DPA`), the MoE router
(a plain torch linear in Megatron's TopKRouter), the output layer (Megatron's output_layer is
not a TE module) and DeepSeek-V3's multi-token-prediction modules (named approximation: they
are counted at bf16).

Time of the matmuls = fp8 FLOPs / (fp8 peak x fp8 efficiency) + the rest / (bf16 peak x bf16
efficiency), each efficiency the block's GEMMs at their shapes (planner.timing.gemm), with
1-byte elements in the fp8 roofline. The step model keeps one "efficiency" per row: here it is
the achieved fraction of the **bf16** peak (`mixed_efficiency`, above 1 when fp8 is fast
enough), so that MFU = model FLOPs / (time x GPUs x bf16 peak), as the field reports it
(torchtitan `get_peak_flops`; planner.memory.fp8.mfu_peak_dtype).

In-training fp8 efficiency (`fp8_level`): the profile's `achieved_efficiency` is the bf16 one
(fitted or transferred as a fraction of the best isolated bf16 GEMM, hardware_profiles/gpus/);
the fp8 level is the same in-training-to-isolated ratio applied to the best isolated fp8 GEMM
of the profile's `gemm_efficiency` table (H100 SXM: 0.58 x 0.709 / 0.803 = 0.512). A GPU
without an fp8 or a bf16 point keeps `achieved_efficiency` for fp8 too: a stated ASSUMPTION
(fp8 GEMMs reach the same fraction of their peak as bf16 GEMMs of theirs; B200, GB200).

Cast kernels (memory-bound, at HBM bandwidth, `cast_bytes`): each fp8 GEMM input is read in
bf16 and written as its two fp8 copies (row-wise for the forward GEMM, column-wise for the
backward one; TE's cast-transpose kernel), the output gradient likewise in backward, and each
weight once per step (its bf16 copy read, its fp8 copies written; `te-fp8-params`: the fp8
parameter read and its transpose written). Named approximations: the cast LayerNormLinear
fuses into the norm is counted as its own kernel; delayed scaling's amax-history updates and
current scaling's extra amax pass (one more read) are not counted.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from planner.core import flops as flops_mod
from planner.core.columns import RECOMPUTE_MODES
from planner.core.recipes import MXFP8_BLOCK
from planner.core.spec import Cluster, GpuSpec, Layout, ModelSpec, TrainSetup
from planner.timing import gemm

FP8_ELEMENT_BYTES = 1
CAST_WRITE_BYTES = {"per-tensor": 2.0, "mxfp8": 2.0 * (1 + 1 / MXFP8_BLOCK)}
"""Bytes written per element by a cast to the two fp8 copies (row-wise + column-wise), with
MXFP8's one E8M0 scale byte per 32 elements on each (scale padding not counted)."""


def fp8_linear_forward_flops(model: ModelSpec, batch: float, seq_len: int) -> float:
    """Forward FLOPs of the GEMMs TE runs in fp8, whole model: every block's attention
    projections and MLP (dense blocks) or routed + shared expert matrices (MoE blocks);
    not the attention core, the router, the logits or the MTP modules (planner.core.flops)."""
    tokens = batch * seq_len
    attention = flops_mod.attention_linear_flops(model, tokens)
    dense = attention + flops_mod.mlp_flops(model, tokens, model.ffn_hidden_size)
    num_moe = model.num_moe_layers
    total = (model.num_layers - num_moe) * dense
    if num_moe:
        experts = (model.experts_per_token + model.num_shared_experts) * flops_mod.mlp_flops(
            model, tokens, model.expert_ffn_size)
        total += num_moe * (attention + experts)
    return total


def fp8_fractions(model: ModelSpec, setup: TrainSetup, flash_attention: bool) -> tuple[
        float, np.ndarray]:
    """(fp8 share of the model FLOPs, fp8 share of the recompute FLOPs per RECOMPUTE_MODES
    code). Backward is 2 x forward for every part, so the model share is the forward's. Full /
    every_k recompute re-runs the blocks' forward (its linears in fp8); selective recompute and
    flash attention's backward recompute only the attention core (bf16)."""
    batch, s = setup.global_batch, setup.seq_len
    linear = fp8_linear_forward_flops(model, batch, s)
    model_share = linear / flops_mod.forward_flops(model, batch, s)
    shares = []
    for mode in RECOMPUTE_MODES:  # block: full's share (named approximation: the recomputed
        as_mode = "full" if mode == "block" else mode  # blocks' linears over all the extra)
        extra = flops_mod.recompute_flops(model, Layout(recompute=as_mode, flash_attention=flash_attention),
                                          batch, s)
        fp8_part = linear if mode in ("full", "every_k", "block") else 0.0
        shares.append(fp8_part / extra if extra else 0.0)
    return model_share, np.array(shares)


def best_point(gpu: GpuSpec, dtype: str) -> float | None:
    """The largest measured isolated-GEMM efficiency of the profile for `dtype`, if any."""
    points = gemm.table_points(gpu, dtype)
    return max(p.efficiency for p in points) if points else None


def fp8_level(gpu: GpuSpec, level):
    """In-training efficiency of the large fp8 GEMMs: `level` (bf16) x best fp8 point / best
    bf16 point; `level` itself when the profile lacks either point (assumption, module doc)."""
    fp8_best, bf16_best = best_point(gpu, "fp8"), best_point(gpu, "bf16")
    if fp8_best is None or bf16_best is None:
        return level
    return level * fp8_best / bf16_best


class Fp8Efficiencies(NamedTuple):
    """Per row: the fp8 GEMMs' fraction of the fp8 peak, the bf16 matmuls' fraction of the bf16
    peak, and the fp8 / bf16 peak ratio."""

    fp8: object
    bf16: object
    peak_ratio: float


def gemm_efficiencies(model: ModelSpec, cluster: Cluster, setup: TrainSetup, level, micro_batch,
                      tp, flash_attention: bool, override: float | None = None,
                      cp=1) -> Fp8Efficiencies:
    """The block's linears (forward and backward) at the fp8 level with 1-byte elements; the
    bf16 rest at the block mix of `steptime.matmul_efficiency` as a bf16 run has it (s / cp
    tokens per GPU under context parallelism). An `--efficiency` override is the fraction of
    each dtype's own peak."""
    gpu = cluster.gpu
    ratio = gpu.peak_flops_per_s("fp8") / gpu.peak_flops_per_s("bf16")
    if override is not None:
        return Fp8Efficiencies(override, override, ratio)
    width = model.expert_ffn_size if model.is_moe else model.ffn_hidden_size
    args = (model.hidden_size, width, model.num_heads, model.kv_heads, model.head_size,
            setup.seq_len // np.asarray(cp), micro_batch, tp)
    linears = gemm.forward_gemms(*args, swiglu=model.mlp == "swiglu", flash_attention=True)
    everything = gemm.forward_gemms(*args, swiglu=model.mlp == "swiglu",
                                    flash_attention=flash_attention)
    fp8 = gemm.block_efficiency(gpu, "fp8", fp8_level(gpu, level),
                                linears + gemm.backward_gemms(linears), FP8_ELEMENT_BYTES)
    bf16 = gemm.block_efficiency(gpu, "bf16", level, everything + gemm.backward_gemms(everything),
                                 setup.precision.activation_bytes)
    return Fp8Efficiencies(fp8, bf16, ratio)


def mixed_efficiency(eff: Fp8Efficiencies, fp8_share):
    """Achieved fraction of the bf16 peak of FLOPs of which `fp8_share` run at the fp8 peak:
    1 / (share / (ratio x fp8 eff) + (1 - share) / bf16 eff); the time is then exactly
    fp8 FLOPs / (fp8 peak x fp8 eff) + the rest / (bf16 peak x bf16 eff)."""
    return 1.0 / (fp8_share / (eff.peak_ratio * eff.fp8) + (1.0 - fp8_share) / eff.bf16)


def cast_bytes(model: ModelSpec, setup: TrainSetup, micro_batch, tp, cp=1) -> tuple[object, object]:
    """(forward, backward) HBM bytes of the fp8 casts of one block and one micro-batch per GPU:
    per GEMM input element (forward) and output-gradient element (backward) one bf16 read +
    `CAST_WRITE_BYTES`. Shapes as `gemm.forward_gemms` (named approximation: an MoE block's
    experts at T tokens, as the matmul mix takes them)."""
    width = model.expert_ffn_size if model.is_moe else model.ffn_hidden_size
    linears = gemm.forward_gemms(model.hidden_size, width, model.num_heads, model.kv_heads,
                                 model.head_size, setup.seq_len // np.asarray(cp), micro_batch, tp,
                                 swiglu=model.mlp == "swiglu", flash_attention=True)
    per_element = setup.precision.activation_bytes + CAST_WRITE_BYTES[setup.precision.fp8_scaling]
    inputs = sum(np.multiply(g.m, g.k, dtype=np.float64) for g in linears)
    outputs = sum(np.multiply(g.m, g.n, dtype=np.float64) for g in linears)
    return inputs * per_element, outputs * per_element


def weight_cast_bytes(setup: TrainSetup, stage_params):
    """Once per step, each weight's fp8 copies made from its working copy: read param_bytes,
    write fp8_weight_cache_bytes (te-fp8: 2 + 2; te-fp8-params: 1 + 1; te-mxfp8: 2 + 2.0625).
    Named approximation: every parameter of the stage is counted (norms and embeddings are not
    cast)."""
    prec = setup.precision
    return np.asarray(stage_params, dtype=np.float64) * (prec.param_bytes + prec.fp8_weight_cache_bytes)


def fp8_work(work, model: ModelSpec, cluster: Cluster, setup: TrainSetup, cols, level,
             flash_attention: bool, override: float | None = None, forward_share=None):
    """`steptime.StageWork` of an FP8 recipe: the matmul efficiency as the fraction of the bf16
    peak (`mixed_efficiency`, separately for the recompute FLOPs), and the cast kernels added to
    the memory-bound bytes per layer and micro-batch (full recompute casts its forward again;
    the weights' casts spread over the step's layers and micro-batches)."""
    b, tp, rec, m = cols["micro_batch"], cols["tp"], cols["recompute"], cols["grad_accum"]
    cp = cols.get("cp", 1)  # s / cp tokens of each sequence per GPU
    eff = gemm_efficiencies(model, cluster, setup, level, b, tp, flash_attention, override, cp)
    model_share, recompute_shares = fp8_fractions(model, setup, flash_attention)
    forward, backward = cast_bytes(model, setup, b, tp, cp)
    if forward_share is None:
        forward_share = flops_mod.forward_repeat_share(model.num_layers, cols)
    again = forward * forward_share  # the forward's casts again on the recomputed blocks
    weights = weight_cast_bytes(setup, work.stage_params) / (m * work.layers)
    return dataclasses.replace(
        work, efficiency=mixed_efficiency(eff, model_share),
        recompute_efficiency=mixed_efficiency(eff, recompute_shares[rec]),
        elementwise_bytes=work.elementwise_bytes + forward + backward + again + weights,
        elementwise_fwd_bytes=work.elementwise_fwd_bytes + forward)
