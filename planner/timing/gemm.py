"""GEMM efficiency by shape, and a transformer block's GEMMs at their real shapes.

Efficiency of C[m x n] = A[m x k]·B[k x n] (fraction of the GPU's dense peak for the dtype):
1. **Measured table** (`GpuSpec.gemm_efficiency`, each point cited in the GPU's YAML):
   linear interpolation of the points' efficiencies in log10 of the arithmetic intensity,
   constant beyond the first and last point. One point means one constant.
2. **Roofline cap** (Williams et al. 2009, "Roofline", CACM 52(4); the seeds' efficiency-by-
   arithmetic-intensity argument, EQUATIONS.md §5): a GEMM cannot exceed
   ai · HBM bandwidth / peak, with ai = 2mnk / (e·(mk + kn + mn)) FLOPs per byte for e-byte
   elements (each operand read once, the result written once: the minimum traffic).
3. **Wave quantisation** (NVIDIA Deep Learning Performance Guide, "Matrix Multiplication
   Background", sections "Tile Quantization" and "Wave Quantization"): with t_m x t_n output
   tiles on S SMs the GPU runs ceil(ceil(m/t_m)·ceil(n/t_n) / S) waves of S tiles; efficiency
   m·n / (waves · S · t_m · t_n). Available as `wave_quantisation`, NOT applied by default:
   the measured points already include the quantisation at their shapes, the SM count and the
   library's tile choice are not in the profiles, and cuBLAS picks tiles to reduce this loss.
Every function works on scalars and numpy arrays.

Block GEMMs (`forward_gemms`, `backward_gemms`): per GPU under tensor parallelism t with b
sequences of s tokens (T = b·s rows; sequence parallelism all-gathers to T before the GEMMs),
Megatron's column/row-parallel split (Shoeybi et al. 2019 §3): QKV [T, (h + 2·kv·d)/t, h],
attention output [T, h, h/t], MLP up [T, f/t (x2 SwiGLU), h], MLP down [T, h, f/t], logits
[T, V/t, h]; without flash attention the scores Q·K^T [s, s, d] and context P·V [s, d, s]
batched over b·a/t heads. Backward: per forward GEMM, the data gradient [m, k, n] and the
weight gradient [k, n, m] (dX = dY·W^T, dW = X^T·dY), each the same 2mnk FLOPs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from planner.core.spec import GemmPoint, GpuSpec

FALLBACK_DTYPE = {"fp16": "bf16", "bf16": "fp16"}
"""fp16 and bf16 run on the same tensor-core path at the same dense peak on every shipped GPU
(datasheets, `peak_tflops`): a table with points for only one of them serves both (assumption)."""


class Gemm(NamedTuple):
    """One GEMM kind of a block: `count` independent products of [m x k]·[k x n]."""

    name: str
    m: object
    n: object
    k: object
    count: object


def gemm_flops(m, n, k):
    """2·m·n·k FLOPs (one multiply and one add per term)."""
    return 2.0 * np.asarray(m, dtype=float) * np.asarray(n, dtype=float) * np.asarray(k, dtype=float)


def gemm_min_bytes(m, n, k, element_bytes):
    """e·(mk + kn + mn): read A and B once, write C once."""
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    return element_bytes * (m * k + k * n + m * n)


def arithmetic_intensity(m, n, k, element_bytes):
    """FLOPs per byte of minimum HBM traffic."""
    return gemm_flops(m, n, k) / gemm_min_bytes(m, n, k, element_bytes)


def roofline_fraction(ai, peak_flops_per_s, hbm_bytes_per_s):
    """min(1, ai · bandwidth / peak): the memory-bound ceiling as a fraction of peak."""
    return np.minimum(1.0, np.asarray(ai, dtype=float) * hbm_bytes_per_s / peak_flops_per_s)


def wave_quantisation(m, n, tile_m, tile_n, num_sms):
    """m·n / (waves · S · t_m · t_n) with waves = ceil(tiles / S), tiles = ceil(m/t_m)·ceil(n/t_n):
    the useful fraction of the tile slots the GPU runs (tile and wave quantisation together)."""
    m, n = np.asarray(m, dtype=float), np.asarray(n, dtype=float)
    tiles = np.ceil(m / tile_m) * np.ceil(n / tile_n)
    waves = np.ceil(tiles / num_sms)
    return m * n / (waves * num_sms * tile_m * tile_n)


def table_points(gpu: GpuSpec, dtype: str) -> tuple[GemmPoint, ...]:
    """The GPU's measured points for a dtype (fp16/bf16 stand in for each other)."""
    points = tuple(p for p in gpu.gemm_efficiency if p.dtype == dtype)
    if not points and dtype in FALLBACK_DTYPE:
        points = tuple(p for p in gpu.gemm_efficiency if p.dtype == FALLBACK_DTYPE[dtype])
    return points


def interpolate_in_intensity(ai, point_ai, point_efficiency):
    """Linear in log10(ai) between the points (sorted here), constant beyond the ends."""
    order = np.argsort(point_ai)
    xs = np.log10(np.asarray(point_ai, dtype=float)[order])
    ys = np.asarray(point_efficiency, dtype=float)[order]
    return np.interp(np.log10(np.asarray(ai, dtype=float)), xs, ys)


def gemm_efficiency(gpu: GpuSpec, dtype: str, m, n, k, element_bytes: int = 2):
    """Achieved fraction of `gpu`'s dense `dtype` peak for [m x k]·[k x n]: the measured table
    interpolated in arithmetic intensity, capped by the roofline. Falls back to the GPU's
    `achieved_efficiency` when it has no point for the dtype."""
    points = table_points(gpu, dtype)
    if not points:
        ai = arithmetic_intensity(m, n, k, element_bytes)
        table = np.full_like(ai, gpu.achieved_efficiency)
        return np.minimum(table, roofline_fraction(ai, gpu.peak_flops_per_s(dtype), gpu.hbm_bytes_per_s))
    return efficiency_from_points(points, m, n, k, element_bytes, gpu.peak_flops_per_s(dtype),
                                  gpu.hbm_bytes_per_s)


def efficiency_from_points(points, m, n, k, element_bytes: int, peak_flops_per_s: float,
                           memory_bytes_per_s: float):
    """`gemm_efficiency` on a bare list of measured points (one dtype) and a device's peak and
    memory bandwidth, without a GpuSpec: the measured table interpolated in arithmetic
    intensity, capped by the roofline. What `zplan calibrate hardware` predicts steps with."""
    ai = arithmetic_intensity(m, n, k, element_bytes)
    p_ai = [arithmetic_intensity(p.m, p.n, p.k, element_bytes) for p in points]
    table = interpolate_in_intensity(ai, p_ai, [p.efficiency for p in points])
    return np.minimum(table, roofline_fraction(ai, peak_flops_per_s, memory_bytes_per_s))


def gemm_time_s(gemm: Gemm, gpu: GpuSpec, dtype: str, element_bytes: int = 2):
    """count · 2mnk / (peak · efficiency(shape))."""
    eff = gemm_efficiency(gpu, dtype, gemm.m, gemm.n, gemm.k, element_bytes)
    return gemm.count * gemm_flops(gemm.m, gemm.n, gemm.k) / (gpu.peak_flops_per_s(dtype) * eff)


def forward_gemms(hidden, ffn_hidden, num_heads, kv_heads, head_dim, seq_len, micro_batch, tp,
                  swiglu: bool = False, flash_attention: bool = True) -> tuple[Gemm, ...]:
    """One transformer block's forward GEMMs on one GPU (see the module docstring)."""
    tokens = np.asarray(micro_batch) * np.asarray(seq_len)
    qkv_out = (np.asarray(num_heads) + 2 * np.asarray(kv_heads)) * head_dim / tp
    up = (2 if swiglu else 1) * np.asarray(ffn_hidden) / tp
    attn_in = np.asarray(num_heads) * head_dim / tp
    gemms = [Gemm("qkv", tokens, qkv_out, hidden, 1),
             Gemm("attn_out", tokens, hidden, attn_in, 1),
             Gemm("mlp_up", tokens, up, hidden, 1),
             Gemm("mlp_down", tokens, hidden, np.asarray(ffn_hidden) / tp, 1)]
    if not flash_attention:
        heads = np.asarray(micro_batch) * np.asarray(num_heads) / tp
        gemms += [Gemm("scores", seq_len, seq_len, head_dim, heads),
                  Gemm("context", seq_len, head_dim, seq_len, heads)]
    return tuple(gemms)


def logits_gemm(hidden, vocab_size, seq_len, micro_batch, tp) -> Gemm:
    """The output projection on the last pipeline stage: [T, V/t, h]."""
    tokens = np.asarray(micro_batch) * np.asarray(seq_len)
    return Gemm("logits", tokens, np.asarray(vocab_size) / tp, hidden, 1)


def backward_gemms(forward: tuple[Gemm, ...]) -> tuple[Gemm, ...]:
    """Data gradient [m, k, n] and weight gradient [k, n, m] of each forward GEMM. For the
    attention-core products both are data gradients, which have the same two shapes."""
    out = []
    for g in forward:
        out += [Gemm(f"{g.name}_dgrad", g.m, g.k, g.n, g.count),
                Gemm(f"{g.name}_wgrad", g.k, g.n, g.m, g.count)]
    return tuple(out)


def shape_factor(gpu: GpuSpec, dtype: str, m, n, k, element_bytes: int = 2):
    """How a GEMM of this shape fares relative to the GPU's best measured GEMM: the table
    interpolated at its arithmetic intensity over the table's largest efficiency (1 when the
    GPU has no point for the dtype: no shape information beyond the roofline)."""
    points = table_points(gpu, dtype)
    ai = arithmetic_intensity(m, n, k, element_bytes)
    if not points:
        return np.ones_like(ai)
    p_ai = [arithmetic_intensity(p.m, p.n, p.k, element_bytes) for p in points]
    best = max(p.efficiency for p in points)
    return interpolate_in_intensity(ai, p_ai, [p.efficiency for p in points]) / best


def in_training_efficiency(gpu: GpuSpec, dtype: str, level, m, n, k, element_bytes: int = 2):
    """A GEMM's efficiency inside a training step: `level` (the profile's `achieved_efficiency`,
    the in-training efficiency of the large GEMMs, fitted on in-sample published runs) times
    `shape_factor`, capped by the roofline. Named approximation: the gap between an isolated
    GEMM benchmark and the same GEMM in a training step is one factor per GPU."""
    ai = arithmetic_intensity(m, n, k, element_bytes)
    roof = roofline_fraction(ai, gpu.peak_flops_per_s(dtype), gpu.hbm_bytes_per_s)
    return np.minimum(level * shape_factor(gpu, dtype, m, n, k, element_bytes), roof)


def block_efficiency(gpu: GpuSpec, dtype: str, level, gemms: tuple[Gemm, ...],
                     element_bytes: int = 2):
    """One efficiency for a block's GEMMs (forward and backward): total FLOPs over the sum of
    each GEMM's FLOPs / its own efficiency, i.e. the block's matmul time is exactly the sum of
    its GEMMs' times at their shapes. The GEMMs are stacked into one array (one
    `in_training_efficiency` call instead of one per GEMM) and summed in their order."""
    shape = np.broadcast_shapes(*(np.shape(x) for g in gemms for x in (g.m, g.n, g.k, g.count)))
    m, n, k, count = (np.empty((len(gemms), *shape)) for _ in range(4))
    for i, g in enumerate(gemms):  # row i: GEMM i's dimension, broadcast by the assignment
        m[i], n[i], k[i], count[i] = g.m, g.n, g.k, g.count
    f = count * gemm_flops(m, n, k)
    per_gemm = f / in_training_efficiency(gpu, dtype, level, m, n, k, element_bytes)
    total, weighted = 0.0, 0.0
    for i in range(len(gemms)):
        total, weighted = total + f[i], weighted + per_gemm[i]
    return total / weighted
