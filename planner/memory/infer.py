"""Inference memory per GPU and roofline speed bounds for autoregressive decoding.

Seed 004 §2.3.2: inference holds the weights (2 bytes per parameter in fp16) and the KV cache
(`2·b·s·L·h_kv·2` bytes in fp16), and the runtime adds "under 20 %" of the model memory
(total ≈ 1.2 × model memory, after kipply's "Transformer Inference Arithmetic"): the `seed`
account. The default `serving` account is a serving engine's (vLLM, vllm/v1/worker/
gpu_worker.py `determine_available_memory`, vllm-project/vllm@35d5cda1): of the total memory CUDA
reports, a fraction `gpu_memory_utilization` (default 0.9) is the budget; weights, the activation
peak of the largest batched step (a forward over `max_num_batched_tokens` tokens), and the memory
outside PyTorch's allocator (CUDA context, NCCL buffers; here with the cuBLAS workspace, the
runtime reserve of planner.memory.reserve) come off it, and the KV cache gets the rest.
Speed: a roofline (Williams et al. 2009) per phase: time ≥ max(FLOPs / compute, bytes / HBM).
Prefill (the prompt) is normally FLOP-bound, decode (one token per step) memory-bound.
All byte counts are exact integers for the stated convention; approximations are named.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Literal

from pydantic import Field

from planner.core.errors import PlanInputError
from planner.core.kvcache import cached_tokens, kv_elements_per_token
from planner.core.params import count_params
from planner.core.spec import Dtype, Frozen, GpuSpec, ModelSpec, ceil_div
from planner.memory.reserve import nccl_buffer_bytes, runtime_reserve_bytes

WeightDtype = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4"]
KvDtype = Literal["fp32", "bf16", "fp16", "fp8", "int8"]
Account = Literal["serving", "seed"]

WEIGHT_BITS: dict[str, int] = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4}
"""Bits per stored weight. Quantization scales / zero points are NOT counted (see docs/infer.md)."""
DEFAULT_MEMORY_UTILISATION = 0.9
"""vLLM's `gpu_memory_utilization` default (EngineArgs / CacheConfig, 0.9): the fraction of the
total device memory the engine may use; the rest is its margin."""
DEFAULT_MAX_BATCHED_TOKENS = 8192
"""vLLM's `max_num_batched_tokens` default for the OpenAI server on GPUs of >= 70 GiB other than
A100 (vllm/engine/arg_utils.py `get_batch_defaults`; 2048 on other GPUs, so 8192 gives a larger,
safer activation peak there): tokens of one batched step (chunked prefill)."""
KV_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
"""Bytes per cached K or V element."""
LOGITS_BYTES = 4
"""Logits are materialised in fp32 for sampling (one vocabulary row per sequence)."""


class InferConfig(Frozen):
    """One inference deployment: batch, context, tensor parallelism and dtypes."""

    batch: int
    """Concurrent sequences (b)."""
    context: int
    """Tokens per sequence held in the KV cache: prompt + generated (s)."""
    tp: int = 1
    """Tensor-parallel degree; must divide num_heads and num_kv_heads."""
    weights: WeightDtype = "fp16"
    kv_dtype: KvDtype = "fp16"
    activation_bytes: int = Field(default=2, gt=0)
    """Bytes of one activation element in the forward pass (fp16/bf16: 2)."""
    flash_attention: bool = True
    """Fused attention: no b·a·s·s score matrix is materialised."""
    allow_long_context: bool = False
    """Plan a context beyond the model's max_seq_len anyway."""
    prefill_chunk: int | None = Field(default=None, gt=0)
    """`seed` account: prompt tokens per forward pass (chunked prefill); None: the whole prompt."""
    account: Account = "serving"
    """`serving` (a serving engine's budget, vLLM) or `seed` (seed 004 §2.3.2: weights + 20 %)."""
    memory_utilisation: float = Field(default=DEFAULT_MEMORY_UTILISATION, gt=0, le=1)
    """`serving`: fraction of the CUDA-reported memory the engine may use (vLLM's
    gpu_memory_utilization)."""
    max_batched_tokens: int | None = Field(default=None, gt=0)
    """`serving`: tokens of the largest batched step (vLLM's max_num_batched_tokens); None: 8192."""
    reserve_override_bytes: int | None = Field(default=None, ge=0)
    """`serving`: the runtime reserve given by the user (`--reserve GIB`) instead of the profile's."""


class InferMemory(Frozen):
    """Bytes on one GPU (one tp rank)."""

    account: Account
    weights_bytes: int
    kv_cache_bytes: int
    workspace_bytes: int
    """Activation peak: transient tensors of one layer's forward over the step's tokens (`seed`:
    the prompt or its chunk per sequence; `serving`: the largest batched step), plus the logits."""
    overhead_bytes: int
    """`seed`: 20 % of the weights (seed 004 §2.3.2); `serving`: the runtime reserve (sum of
    `reserve_parts`)."""
    reserve_parts: dict[str, int] = {}
    """`serving`: the named parts of the runtime reserve (planner.memory.reserve)."""
    step_tokens: int
    """Token rows of the step whose activation peak is counted."""
    total_bytes: int
    capacity_bytes: int
    """`seed`: the nominal HBM; `serving`: the total CUDA reports (the GPU's usable_memory_gib)."""
    memory_utilisation: float
    """Fraction of the capacity that may be used (`seed`: 1)."""
    budget_bytes: int
    """floor(memory_utilisation x capacity): what everything but `outside_budget_bytes` must
    stay within (`seed`: the capacity)."""
    outside_budget_bytes: int = 0
    """`serving`: reserve parts held outside the budget (CUDA context, NCCL buffers); they must
    fit in capacity - budget."""
    kv_budget_bytes: int
    """The budget minus everything in it but the KV cache: the KV cache room (vLLM's "Available
    KV cache memory")."""
    headroom_bytes: int
    """budget - (total - outside_budget_bytes)."""
    fits: bool


class ServingReserve(Frozen):
    """The runtime reserve of one GPU for the `serving` account, as plain numbers.

    vLLM takes its memory snapshot after the CUDA context exists and after NCCL is initialised
    (vllm/v1/worker/gpu_worker.py, "Initialize the distributed environment BEFORE taking memory
    snapshot ... NCCL buffers are allocated before we measure"), so those two live outside the
    `gpu_memory_utilization` budget, in its margin; the cuBLAS workspace is allocated by the
    caching allocator during the profile run, so it is inside (part of the torch peak).
    """

    in_budget_parts: dict[str, int] = {}
    """Counted inside the budget: cuBLAS workspace, or the user's `--reserve`."""
    before_engine_parts: dict[str, int] = {}
    """Outside the budget, held before the engine's snapshot: the CUDA context."""
    nccl_bytes_per_communicator: int = 0
    """Outside the budget: NCCL buffers of the one tensor-parallel communicator (tp > 1)."""

    def outside_budget(self, tp: int) -> dict[str, int]:
        """Parts held outside the budget at this tp: NCCL buffers only when there is a tp group."""
        nccl = {"nccl_buffers": self.nccl_bytes_per_communicator} if tp > 1 else {}
        return {**self.before_engine_parts, **(nccl if self.nccl_bytes_per_communicator else {})}

    def parts(self, tp: int) -> dict[str, int]:
        """Every named part at this tp."""
        return {**self.outside_budget(tp), **self.in_budget_parts}


NO_RESERVE = ServingReserve()


class Roofline(Frozen):
    """A roofline bound on one phase: time ≥ max(FLOPs / compute roof, bytes / bandwidth)."""

    flops: float
    """FLOPs on one GPU."""
    hbm_bytes: int
    """Bytes one GPU reads from (or writes to) HBM."""
    intensity_flops_per_byte: float
    ridge_flops_per_byte: float
    """Intensity where the compute roof (peak × efficiency) meets the HBM roof."""
    compute_time_s: float
    memory_time_s: float
    time_s: float
    bound: Literal["compute", "memory"]
    """`compute` when intensity ≥ ridge (FLOP-bound), else `memory`."""


# --------------------------------------------------------------------------- memory formulas


def check_config(model: ModelSpec, cfg: InferConfig) -> None:
    """User-input rules: a decoder, batch and context ≥ 1, context ≤ max_seq_len, tp | heads."""
    if model.arch != "decoder":
        raise PlanInputError("model", f"{model.name} is an encoder; infer plans decoders with a KV cache")
    if cfg.batch < 1:
        raise PlanInputError("batch", f"must be >= 1, got {cfg.batch}")
    if cfg.context < 1:
        raise PlanInputError("context", f"must be >= 1, got {cfg.context}")
    if cfg.context > model.max_seq_len and not cfg.allow_long_context:
        raise PlanInputError(
            "context", f"{cfg.context} exceeds {model.name}'s max_seq_len {model.max_seq_len}; "
            "pass --allow-long-context to plan it anyway")
    check_tp(model, cfg.tp)


def check_tp(model: ModelSpec, tp: int) -> None:
    """tp must divide the query heads; the kv heads are split when tp divides them and
    replicated when tp is a multiple of them (vLLM QKVParallelLinear: `num_kv_heads = 1`,
    `num_kv_head_replicas = divide(tp_size, total_num_kv_heads)`, vllm/model_executor/layers/
    linear.py; Megatron transformer_config.py the same). MLA has no kv heads to split: the
    latent is cached whole on every rank (kv_cache_elements_per_token_per_rank)."""
    if tp in tp_candidates(model):
        return
    kv_rule = "" if model.is_mla else (f", and divide or be a multiple of num_kv_heads "
                                       f"({model.kv_heads})")
    raise PlanInputError(
        "tp", f"must divide num_heads ({model.num_heads}){kv_rule}, got {tp}; allowed: "
        f"{', '.join(map(str, tp_candidates(model)))}")


def tp_candidates(model: ModelSpec) -> list[int]:
    """Every tp that divides the query heads and divides or is a multiple of the kv heads."""
    kv = model.kv_heads
    return [t for t in range(1, model.num_heads + 1) if model.num_heads % t == 0
            and (model.is_mla or kv % t == 0 or t % kv == 0)]


def replicated_weight_params(model: ModelSpec, tp: int) -> int:
    """Parameters a tp group holds beyond one copy of the model, because tp ranks replicate them:
    with tp wider than the kv heads, each of the tp - kv extra copies of a kv head's K and V
    projections (vLLM QKVParallelLinear loads the kv head of rank r // replicas); for MLA the
    down-projections and latent norms, whole on every rank (vLLM deepseek_v2.py and Megatron
    MLASelfAttention keep q_a_proj / kv_a_proj_with_mqa replicated): tp - 1 extra copies. Other
    replicated tensors (norms, MoE router) are split like the rest (an approximation, < 0.2 %)."""
    h, layers = model.hidden_size, model.num_layers
    if model.is_mla:
        r_q, r_kv, rope = model.q_lora_rank or 0, model.kv_lora_rank or 0, model.qk_rope_head_dim
        bias = model.linear_bias
        per_layer = h * (r_kv + rope) + r_kv + (r_kv + rope if bias else 0)
        per_layer += (h * r_q + r_q + (r_q if bias else 0)) if r_q else 0
        return (tp - 1) * layers * per_layer
    extra_heads = max(0, tp - model.kv_heads)  # kv heads beyond one copy of each
    bias = model.linear_bias or model.qkv_bias
    return extra_heads * layers * 2 * (h * model.head_size + (model.head_size if bias else 0))


def weights_bytes(num_params: int, weights: str, tp: int = 1) -> int:
    """Weight bytes on one tp rank: ceil(P · bits / 8) split evenly over tp (seed 004 §2.3.2: 2P fp16).

    Approximation: norms (replicated in Megatron tp) are split like the rest; they are < 0.01 %.
    """
    total_bytes = ceil_div(num_params * WEIGHT_BITS[weights], 8)  # int4 packs two per byte
    return ceil_div(total_bytes, tp)


def cached_positions(model: ModelSpec, context: int) -> int:
    """Most positions any block keeps in its KV cache (the key length of the score matrix):
    the context on a global block, capped by a sliding window when every block slides
    (Mistral's rolling buffer, Jiang et al. 2023, §2), or by the local window when all
    blocks are local."""
    return max(cached_tokens(model, i, context) for i in range(model.num_layers))


def kv_cache_elements_per_token_per_rank(model: ModelSpec, tp: int) -> int:
    """Cached elements per token in one block on one tp rank. Standard attention: K and V of
    the rank's kv heads, kv / tp, or 1 replicated head when tp is wider (vLLM
    QKVParallelLinear). MLA: the whole latent c_KV + shared rope key on every rank (vLLM
    vllm/v1/kv_cache_interface.py MLAAttentionSpec: one kv head of width kv_lora_rank +
    qk_rope_head_dim, no separate V, "MLA: cache is always replicated" over tp). vLLM's
    `fp8_ds_mla` layout (656 bytes per token with its scales) is not this fp8 count."""
    if model.is_mla:
        return kv_elements_per_token(model)
    return 2 * max(1, model.kv_heads // tp) * model.head_size


def kv_cache_bytes(model: ModelSpec, batch: int, context: int, kv_bytes: int, tp: int = 1) -> int:
    """KV cache on one tp rank: Σ over blocks of per-rank elements x cached tokens x b x bytes.

    Seed 004 §2.3.2 gives `2·b·s·L·h_kv·2` for fp16; here per block (planner.core.kvcache):
    GQA-aware, the MLA latent, and local blocks (sliding or chunked) keeping at most
    `local_window` tokens.
    """
    per_token = kv_cache_elements_per_token_per_rank(model, tp)
    tokens = sum(cached_tokens(model, i, context) for i in range(model.num_layers))
    return per_token * tokens * batch * kv_bytes


def mlp_width(model: ModelSpec) -> int:
    """Inner MLP width a token passes through: d_ff, or (top-k + shared) · expert width for MoE."""
    if model.is_moe:
        return (model.experts_per_token + model.num_shared_experts) * model.expert_ffn_size
    return model.ffn_hidden_size


def token_row_elements(model: ModelSpec, kv_positions: int, tp: int = 1,
                       flash_attention: bool = True) -> int:
    """Elements alive at once per token row of one layer's forward (inference frees each layer's
    tensors before the next layer runs), from the tensor inventory of seed 004 §2.2.3:
    residual stream + norm output (2·h), Q/K/V (a + 2·kv heads)·head_dim / tp, then the larger of
    the attention stage (scores and probabilities 2·(a/tp)·kv_positions without fused attention,
    else the attention output a·head_dim/tp) and the MLP stage (GELU: linear output and GELU
    output, 2·f/tp; SwiGLU: gate, up and their product, 3·f/tp). An estimate, not an allocator
    trace."""
    heads, kv_heads, d = model.num_heads // tp, max(1, model.kv_heads // tp), model.head_size
    residual = 2 * model.hidden_size  # layer input x and its normalised copy
    qkv = (heads + 2 * kv_heads) * d  # Q, K, V projections
    if flash_attention:
        attention = heads * d  # only the attention output; statistics are negligible
    else:
        attention = 2 * heads * kv_positions  # scores and softmax probabilities
    mlp = (3 if model.mlp == "swiglu" else 2) * mlp_width(model) // tp
    return residual + qkv + max(attention, mlp)


def step_activation_bytes(model: ModelSpec, tokens: int, sequences: int, kv_positions: int,
                          activation_bytes: int, tp: int = 1, flash_attention: bool = True) -> int:
    """Activation peak of one forward step over `tokens` token rows from `sequences` sequences:
    tokens x row elements x bytes, plus fp32 logits of each sequence's last position (V/tp,
    vocab-parallel)."""
    rows = tokens * token_row_elements(model, kv_positions, tp, flash_attention)
    logits = sequences * ceil_div(model.vocab_size, tp) * LOGITS_BYTES
    return rows * activation_bytes + logits


def workspace_bytes(model: ModelSpec, batch: int, tokens: int, kv_positions: int,
                    activation_bytes: int, tp: int = 1, flash_attention: bool = True) -> int:
    """Peak transient memory of a forward pass over `tokens` new tokens of each of `batch`
    sequences (prefill): `step_activation_bytes` over batch x tokens rows."""
    return step_activation_bytes(model, batch * tokens, batch, kv_positions, activation_bytes, tp,
                                 flash_attention)


def batched_step_tokens(cfg: InferConfig) -> int:
    """Token rows of the largest batched step a serving engine runs: every cached token of the
    batch, capped by max_num_batched_tokens (chunked prefill splits longer prompts)."""
    return min(cfg.batch * cfg.context, cfg.max_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS)


def memory_budget_bytes(capacity_bytes: int, utilisation: float) -> int:
    """floor(utilisation x capacity), exact for the decimal written (0.9 is 9/10, not a binary
    float)."""
    return math.floor(Fraction(str(utilisation)) * capacity_bytes)


def runtime_overhead_bytes(weight_bytes: int) -> int:
    """20 % of the model memory (seed 004 §2.3.2: runtime costs independent of the KV cache,
    "generally under 20 %", total ≈ 1.2 × model memory), applied to the weights only as an upper
    estimate; rounded up."""
    return ceil_div(weight_bytes * 2, 10)


def inference_memory(model: ModelSpec, num_params: int, cfg: InferConfig, capacity_bytes: int,
                     reserve: ServingReserve = NO_RESERVE) -> InferMemory:
    """Bytes on one GPU under cfg.account: `serving_memory` or `seed_memory`."""
    if cfg.account == "seed":
        return seed_memory(model, num_params, cfg, capacity_bytes)
    return serving_memory(model, num_params, cfg, capacity_bytes, reserve)


def seed_memory(model: ModelSpec, num_params: int, cfg: InferConfig,
                capacity_bytes: int) -> InferMemory:
    """Seed 004 §2.3.2: weights + KV cache + forward workspace + 20 % of the weights, against the
    nominal HBM."""
    weights = weights_bytes(num_params + replicated_weight_params(model, cfg.tp), cfg.weights, cfg.tp)
    kv = kv_cache_bytes(model, cfg.batch, cfg.context, KV_BYTES[cfg.kv_dtype], cfg.tp)
    chunk = min(cfg.context, cfg.prefill_chunk or cfg.context)  # new tokens per forward pass
    work = workspace_bytes(model, cfg.batch, chunk, cached_positions(model, cfg.context),
                           cfg.activation_bytes, cfg.tp, cfg.flash_attention)
    overhead = runtime_overhead_bytes(weights)
    total = weights + kv + work + overhead
    return InferMemory(
        account="seed", weights_bytes=weights, kv_cache_bytes=kv, workspace_bytes=work,
        overhead_bytes=overhead, step_tokens=cfg.batch * chunk, total_bytes=total,
        capacity_bytes=capacity_bytes, memory_utilisation=1.0, budget_bytes=capacity_bytes,
        kv_budget_bytes=capacity_bytes - (total - kv), headroom_bytes=capacity_bytes - total,
        fits=total <= capacity_bytes,
    )


def serving_memory(model: ModelSpec, num_params: int, cfg: InferConfig, capacity_bytes: int,
                   reserve: ServingReserve = NO_RESERVE) -> InferMemory:
    """A serving engine's account (vLLM `determine_available_memory`): weights + activation peak
    of the largest batched step + the in-budget reserve + KV cache within floor(utilisation x
    capacity); the CUDA context and NCCL buffers within the rest of the capacity."""
    weights = weights_bytes(num_params + replicated_weight_params(model, cfg.tp), cfg.weights, cfg.tp)
    kv = kv_cache_bytes(model, cfg.batch, cfg.context, KV_BYTES[cfg.kv_dtype], cfg.tp)
    tokens = batched_step_tokens(cfg)
    peak = step_activation_bytes(model, tokens, min(cfg.batch, tokens),
                                 cached_positions(model, cfg.context), cfg.activation_bytes,
                                 cfg.tp, cfg.flash_attention)
    budget = memory_budget_bytes(capacity_bytes, cfg.memory_utilisation)
    outside = sum(reserve.outside_budget(cfg.tp).values())
    in_budget_non_kv = weights + peak + sum(reserve.in_budget_parts.values())
    in_budget = in_budget_non_kv + kv
    parts = reserve.parts(cfg.tp)
    return InferMemory(
        account="serving", weights_bytes=weights, kv_cache_bytes=kv, workspace_bytes=peak,
        overhead_bytes=sum(parts.values()), reserve_parts=parts, step_tokens=tokens,
        total_bytes=in_budget + outside, capacity_bytes=capacity_bytes,
        memory_utilisation=cfg.memory_utilisation, budget_bytes=budget,
        outside_budget_bytes=outside, kv_budget_bytes=budget - in_budget_non_kv,
        headroom_bytes=budget - in_budget,
        fits=in_budget <= budget and outside <= capacity_bytes - budget,
    )


def serving_reserve(gpu: GpuSpec, cfg: InferConfig) -> ServingReserve:
    """The GPU profile's runtime reserve for a serving engine: the CUDA context and one
    tensor-parallel NCCL communicator (tp > 1) outside the budget, the cuBLAS workspace inside;
    `--reserve` replaces all three and is counted inside the budget (conservative). No
    fragmentation part: the utilisation fraction is the engine's margin. The driver's shortfall
    is already out of the CUDA-reported capacity."""
    if cfg.reserve_override_bytes is not None:
        return ServingReserve(in_budget_parts={"user_reserve": cfg.reserve_override_bytes})
    parts = runtime_reserve_bytes(gpu, fragmentation_fraction=0)
    return ServingReserve(in_budget_parts={"cublas_workspace": parts["cublas_workspace"]},
                          before_engine_parts={"cuda_context": parts["cuda_context"]},
                          nccl_bytes_per_communicator=nccl_buffer_bytes(1))


def serving_capacity_bytes(gpu: GpuSpec) -> int:
    """The CUDA-reported total of the GPU (its profile's usable_memory_gib)."""
    usable = gpu.usable_memory_bytes
    if usable is None:
        raise PlanInputError("gpu.usable_memory_gib",
                             f"gpu {gpu.name} has no usable_memory_gib; add it with a source, or "
                             "use --account seed")
    return usable


# --------------------------------------------------------------------------- searches


def _fits(model: ModelSpec, num_params: int, cfg: InferConfig, capacity_bytes: int,
          reserve: ServingReserve = NO_RESERVE) -> bool:
    return inference_memory(model, num_params, cfg, capacity_bytes, reserve).fits


def _largest(ok, low: int, high: int) -> int:
    """Largest n in [low, high] with ok(n), given ok is monotone (true then false); low-1 if none."""
    if not ok(low):
        return low - 1
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if ok(mid) else (low, mid - 1)
    return low


def max_batch(model: ModelSpec, num_params: int, cfg: InferConfig, capacity_bytes: int,
              limit: int = 1 << 24, reserve: ServingReserve = NO_RESERVE) -> int:
    """Largest batch that fits at cfg.context (0 if none); memory grows with batch, so bisect."""
    return _largest(
        lambda b: _fits(model, num_params, cfg.model_copy(update={"batch": b}), capacity_bytes,
                        reserve),
        1, limit)


def max_context(model: ModelSpec, num_params: int, cfg: InferConfig, capacity_bytes: int,
                reserve: ServingReserve = NO_RESERVE) -> int:
    """Largest context that fits at cfg.batch (0 if none), up to max_seq_len (or cfg.context if
    --allow-long-context asked for more)."""
    limit = max(model.max_seq_len, cfg.context) if cfg.allow_long_context else model.max_seq_len
    return _largest(
        lambda s: _fits(model, num_params, cfg.model_copy(update={"context": s}), capacity_bytes,
                        reserve),
        1, limit)


def min_tp(model: ModelSpec, num_params: int, cfg: InferConfig, capacity_bytes: int,
           reserve: ServingReserve = NO_RESERVE) -> int | None:
    """Smallest tp dividing the head counts at which cfg fits on each GPU; None if none does."""
    for tp in tp_candidates(model):
        if _fits(model, num_params, cfg.model_copy(update={"tp": tp}), capacity_bytes, reserve):
            return tp
    return None


# --------------------------------------------------------------------------- speed formulas


def attention_flops(model: ModelSpec, batch: int, new_tokens: int, past_tokens: int) -> int:
    """Forward FLOPs of QK^T and (softmax)·V for `new_tokens` queries after `past_tokens` cached.

    Seed 004 §1.2.1: 2·s·s·h for QK^T and the same for ·V per layer, i.e. 4·h per (query, key)
    pair, with h = a·head_dim; causal, so query i sees keys 1..i, per block capped by its
    window (sliding) or its chunk (chunked local attention). MLA counts 2·a·(nope + rope) for
    the scores and 2·a·v_head_dim for the values (the unabsorbed form; a decode kernel that
    absorbs the up-projections does more FLOPs per pair: an approximation, docs/infer.md).
    """
    a = model.num_heads
    if model.is_mla:
        per_pair = 2 * a * (model.qk_nope_head_dim + model.qk_rope_head_dim) + 2 * a * model.v_head_dim
    else:
        per_pair = 4 * a * model.head_size
    last = past_tokens + new_tokens
    pairs = sum(layer_visible_pairs(model, i, past_tokens, last) for i in range(model.num_layers))
    return per_pair * batch * pairs


def layer_visible_pairs(model: ModelSpec, layer: int, first: int, last: int) -> int:
    """(query, key) pairs of block `layer` for queries first+1..last (1-based positions)."""
    if model.layer_is_local(layer):
        window = model.local_window
        if model.local_attention == "chunked":
            return sum_visible_keys_chunked(first, last, window)
        return sum_visible_keys(first, last, window)
    return sum_visible_keys(first, last, model.sliding_window)


def sum_visible_keys(first: int, last: int, window: int | None) -> int:
    """Σ_{i=first+1}^{last} min(i, w): (query, key) pairs of causal attention, exact integer."""
    def prefix(n: int) -> int:  # Σ_{i=1}^{n} min(i, w)
        m = n if window is None else min(n, window)
        return m * (m + 1) // 2 + (n - m) * m
    return prefix(last) - prefix(first)


def sum_visible_keys_chunked(first: int, last: int, chunk: int) -> int:
    """Σ_{i=first+1}^{last} ((i - 1) mod c + 1): chunked attention (Llama 4), where query i sees
    the keys of its own chunk of c tokens up to itself; exact integer."""
    def prefix(n: int) -> int:  # q whole chunks of c(c+1)/2 pairs, then r(r+1)/2
        q, r = divmod(n, chunk)
        return q * chunk * (chunk + 1) // 2 + r * (r + 1) // 2
    return prefix(last) - prefix(first)


def decode_weight_params(model: ModelSpec, total: int, layer_total: int, layer_active: int,
                         batch: int) -> int:
    """Parameters read per decode step: all of them for a dense model; for MoE, the experts the
    batch's b·k routings can touch (at most min(E, b·k) per MoE block, an upper estimate);
    dense blocks (first_dense_layers, moe_layer_step) are read whole. `layer_total` and
    `layer_active` are one MoE block's."""
    if not model.is_moe or model.num_experts == model.experts_per_token:
        return total  # every expert is read
    per_expert = (layer_total - layer_active) // (model.num_experts - model.experts_per_token)
    unread = model.num_experts - min(model.num_experts, batch * model.experts_per_token)
    return total - model.num_moe_layers * unread * per_expert


def roofline(flops: float, n_bytes: int, compute_flops_per_s: float,
             bytes_per_s: float) -> Roofline:
    """Williams et al. 2009 roofline: time ≥ max(F / compute, B / bandwidth); bound by the larger."""
    compute_s = flops / compute_flops_per_s
    memory_s = n_bytes / bytes_per_s
    return Roofline(
        flops=flops, hbm_bytes=n_bytes,
        intensity_flops_per_byte=flops / n_bytes if n_bytes else float("inf"),
        ridge_flops_per_byte=compute_flops_per_s / bytes_per_s,
        compute_time_s=compute_s, memory_time_s=memory_s, time_s=max(compute_s, memory_s),
        bound="compute" if compute_s >= memory_s else "memory",
    )


def prefill_roofline(model: ModelSpec, active_params: int, weight_bytes_per_gpu: int,
                     cfg: InferConfig, compute_flops_per_s: float, bytes_per_s: float) -> Roofline:
    """Time to first token ≥ prefill of b × s prompt tokens on one tp rank.

    FLOPs 2·P·b·s (seed 004 §1.5, C_forward ≈ 2·P·D) + causal attention, ÷ tp; bytes: the rank's
    weights read once + its KV cache written once. Communication between tp ranks is ignored.
    """
    flops = (2 * active_params * cfg.batch * cfg.context
             + attention_flops(model, cfg.batch, cfg.context, 0)) / cfg.tp
    kv = kv_cache_bytes(model, cfg.batch, cfg.context, KV_BYTES[cfg.kv_dtype], cfg.tp)
    return roofline(flops, weight_bytes_per_gpu + kv, compute_flops_per_s, bytes_per_s)


def decode_roofline(model: ModelSpec, active_params: int, read_weight_bytes_per_gpu: int,
                    cfg: InferConfig, compute_flops_per_s: float, bytes_per_s: float) -> Roofline:
    """One decode step (one new token for each of b sequences) at the full context, one tp rank.

    FLOPs 2·P·b + attention over the cached positions, ÷ tp; bytes: the weights it reads plus the
    whole KV cache (kipply's per-token roofline). The last step of a generation, the slowest.
    """
    flops = (2 * active_params * cfg.batch
             + attention_flops(model, cfg.batch, 1, cfg.context - 1)) / cfg.tp
    kv = kv_cache_bytes(model, cfg.batch, cfg.context, KV_BYTES[cfg.kv_dtype], cfg.tp)
    return roofline(flops, read_weight_bytes_per_gpu + kv, compute_flops_per_s, bytes_per_s)


# --------------------------------------------------------------------------- the plan


class InferPlan(Frozen):
    """Everything `zplan infer` reports for one model, GPU and deployment."""

    model: str
    gpu: str
    config: InferConfig
    params_total: int
    params_active: int
    """Parameters one token passes through (MoE: top-k and shared experts)."""
    memory: InferMemory
    max_batch: int
    """Largest batch that fits at config.context (0: not even one sequence)."""
    max_context: int
    """Largest context that fits at config.batch (0: not even one token)."""
    min_tp: int | None
    """Smallest tp (dividing the head counts) at which config fits; None if none does."""
    compute_dtype: Dtype
    efficiency: float
    """Fraction of the dense peak the compute roof assumes."""
    prefill: Roofline
    decode: Roofline
    ttft_s: float
    """Time-to-first-token lower bound: the prefill roofline time."""
    decode_tokens_per_s: float
    """Upper bound on generated tokens per second for the whole batch, at the full context: the
    rate of the tensor-parallel group (its tp GPUs run each step together)."""
    decode_tokens_per_s_per_gpu: float
    """The group's rate divided by its tp GPUs (for comparing deployments per GPU)."""
    notes: list[str]


def default_compute_dtype(weights: str, gpu: GpuSpec | None = None) -> Dtype:
    """Matmul dtype: the weights' own for fp32/fp16/bf16; fp8 weights compute in fp8 on a GPU
    with an fp8 peak (Hopper W8A8) and in fp16 elsewhere (weight-only, as on A100); fp16 for
    int8/int4 weight-only quantization."""
    if weights == "fp8" and (gpu is None or "fp8" in gpu.peak_tflops):
        return "fp8"
    return weights if weights in ("fp32", "fp16", "bf16") else "fp16"  # type: ignore[return-value]


def plan_inference(model: ModelSpec, gpu: GpuSpec, cfg: InferConfig, efficiency: float | None = None,
                   compute_dtype: Dtype | None = None) -> InferPlan:
    """Memory on one GPU, the batch / context / tp limits, and prefill and decode bounds."""
    check_config(model, cfg)
    count = count_params(model)
    eff = gpu.achieved_efficiency if efficiency is None else efficiency
    if not 0 < eff <= 1:
        raise PlanInputError("efficiency", f"must be in (0, 1], got {eff}")
    dtype = compute_dtype or default_compute_dtype(cfg.weights, gpu)
    if dtype not in gpu.peak_tflops:
        raise PlanInputError("compute_dtype", f"gpu {gpu.name} has no peak for {dtype}; "
                             f"has {', '.join(sorted(gpu.peak_tflops))}")
    compute = gpu.peak_flops_per_s(dtype) * eff
    if cfg.account == "serving":
        capacity, reserve = serving_capacity_bytes(gpu), serving_reserve(gpu, cfg)
    else:
        capacity, reserve = gpu.memory_bytes, NO_RESERVE
    memory = inference_memory(model, count.total, cfg, capacity, reserve)
    read_params = decode_weight_params(model, count.total, count.layer.total, count.layer.active,
                                       cfg.batch)
    prefill = prefill_roofline(model, count.active, memory.weights_bytes, cfg, compute,
                               gpu.hbm_bytes_per_s)
    decode = decode_roofline(model, count.active, weights_bytes(read_params, cfg.weights, cfg.tp),
                             cfg, compute, gpu.hbm_bytes_per_s)
    return InferPlan(
        model=model.name, gpu=gpu.name, config=cfg, params_total=count.total,
        params_active=count.active, memory=memory,
        max_batch=max_batch(model, count.total, cfg, capacity, reserve=reserve),
        max_context=max_context(model, count.total, cfg, capacity, reserve),
        min_tp=min_tp(model, count.total, cfg, capacity, reserve),
        compute_dtype=dtype, efficiency=eff, prefill=prefill, decode=decode,
        ttft_s=prefill.time_s, decode_tokens_per_s=cfg.batch / decode.time_s,
        decode_tokens_per_s_per_gpu=cfg.batch / decode.time_s / cfg.tp,
        notes=_notes(model, cfg),
    )


def _notes(model: ModelSpec, cfg: InferConfig) -> list[str]:
    notes = []
    if cfg.account == "serving":
        notes.append(f"serving account: {cfg.memory_utilisation:g} of the CUDA-reported memory "
                     "(vLLM gpu_memory_utilization); activation peak of a "
                     f"{batched_step_tokens(cfg):,}-token batched step; CUDA graphs not counted")
    if cfg.weights in ("fp8", "int8", "int4"):
        notes.append(f"{cfg.weights} weights: quantization scales and zero points are not counted")
    if model.sliding_window and cfg.context > model.sliding_window:
        notes.append(f"sliding window {model.sliding_window}: the KV cache holds only the last "
                     f"{model.sliding_window} positions (rolling buffer)")
    if cfg.context > model.max_seq_len:
        notes.append(f"context {cfg.context} beyond max_seq_len {model.max_seq_len} "
                     "(--allow-long-context)" + ("; learned position embeddings have no rows "
                                                  "there" if model.position == "learned" else ""))
    if model.local_window is not None and cfg.context > model.local_window:
        notes.append(f"{model.local_attention} local attention: local blocks cache at most "
                     f"{model.local_window} tokens, every {model.global_layer_step}th block the "
                     "whole context")
    if model.is_mla:
        notes.append("MLA: the compressed latent + rope key is cached, whole on every tp rank")
    elif cfg.tp > model.kv_heads:
        notes.append(f"tp {cfg.tp} > {model.kv_heads} kv heads: each kv head (cache and K/V "
                     f"weights) replicated on {cfg.tp // model.kv_heads} ranks, as vLLM does")
    if model.is_moe:
        notes.append("MoE decode reads at most min(E, batch·top-k) experts per MoE block (upper "
                     "estimate); dense blocks whole")
    if model.mtp_modules:
        notes.append("multi-token-prediction modules not loaded (speculative decoding off)")
    notes.append("bounds ignore tensor-parallel communication and kernel launch latency")
    return notes
