"""Arithmetic intensity and offload efficiency (ZeRO-Infinity, seed 000 §4; docs/equations.md §5).

Without overlap of compute and data movement (seed 000 §4):
    compute_time = total_computation / peak_tp
    ait = total_computation / total_data_movement
    communication_time = total_data_movement / bw = total_computation / (ait · bw)
    efficiency = compute_time / (compute_time + communication_time) = ait·bw / (ait·bw + peak_tp)
Per training iteration with activation checkpointing (ZeRO-Infinity §4.1): computation
2·4·bsz·seq·params FLOPs (2 per multiply-add; forward, recompute forward, backward x 2), and the
intensities seq·bsz (parameters and gradients), seq·bsz/4 (optimizer states), 24·hd·ci
(activation checkpoints). The data movements below are the ones that give those intensities.
Units: FLOPs, bytes, bytes/s, FLOP/s; ait in FLOPs per byte.
Seed and paper citations: docs/references.md
"""

from __future__ import annotations

from planner.memory.activations import checkpoint_bytes
from planner.core.errors import PlanInputError

FP16_BYTES = 2
OPTIMIZER_STATE_BYTES = 16
"""fp32 parameter, gradient, momentum and variance per parameter, read and written once."""


def iteration_flops(bsz: int, seq: int, params: float) -> float:
    """ZeRO-Infinity §4.1: 2 x 4 x bsz x seq x params per iteration with checkpointing
    (forward 1 + recompute 1 + backward 2 passes, 2 FLOPs per multiply-add)."""
    return 2 * 4 * bsz * seq * params


def params_grads_moved_bytes(params: float) -> float:
    """fp16 parameters loaded for forward, recompute and backward, gradients stored once:
    4 x 2 bytes per parameter (gives ait = seq·bsz, ZeRO-Infinity §4.1)."""
    return 4 * FP16_BYTES * params


def optimizer_moved_bytes(params: float) -> float:
    """Optimizer states (16 bytes per parameter) read and written once per step: 2 x 16 x params."""
    return 2 * OPTIMIZER_STATE_BYTES * params


def checkpoints_moved_bytes(bsz: int, seq: int, hidden: int, num_layers: int, ci: int) -> float:
    """Activation checkpoints (seed 000 eq.3) written in forward and read in backward: 2 x eq.3."""
    return 2 * checkpoint_bytes(bsz, seq, hidden, num_layers, ci)


def arithmetic_intensity(total_flops: float, total_bytes: float) -> float:
    """ait = total computation / total data movement, FLOPs per byte (seed 000 §4)."""
    if total_bytes <= 0:
        raise PlanInputError("total_bytes", f"data movement must be positive (got {total_bytes})")
    return total_flops / total_bytes


def arithmetic_intensity_params_grads(bsz: int, seq: int) -> float:
    """ZeRO-Infinity §4.1 closed form for parameters and gradients: seq x bsz."""
    return seq * bsz


def arithmetic_intensity_optimizer(bsz: int, seq: int) -> float:
    """ZeRO-Infinity §4.1 closed form for optimizer states: seq x bsz / 4."""
    return seq * bsz / 4


def arithmetic_intensity_checkpoints(hidden: int, ci: int) -> float:
    """ZeRO-Infinity §4.1 closed form for activation checkpoints: 24 x hd x ci."""
    return 24 * hidden * ci


def compute_time_s(total_flops: float, peak_flops_per_s: float) -> float:
    """compute_time = total_computation / peak_tp (seed 000 §4)."""
    return total_flops / peak_flops_per_s


def communication_time_s(total_flops: float, ait: float, bw_bytes_per_s: float) -> float:
    """communication_time = total_computation / (ait x bw) (seed 000 §4)."""
    return total_flops / (ait * bw_bytes_per_s)


def offload_efficiency(ait: float, bw_bytes_per_s: float, peak_flops_per_s: float) -> float:
    """efficiency = ait·bw / (ait·bw + peak_tp): compute time over compute + movement time,
    no overlap (seed 000 §4; docs/equations.md §5)."""
    return ait * bw_bytes_per_s / (ait * bw_bytes_per_s + peak_flops_per_s)


def required_bandwidth_bytes_per_s(ait: float, peak_flops_per_s: float, efficiency: float) -> float:
    """The bandwidth that reaches `efficiency`: the efficiency equation solved for bw,
    bw = efficiency·peak_tp / (ait·(1 - efficiency))."""
    if not 0 < efficiency < 1:
        raise PlanInputError("efficiency", f"must be strictly between 0 and 1 (got {efficiency})")
    return efficiency * peak_flops_per_s / (ait * (1 - efficiency))
