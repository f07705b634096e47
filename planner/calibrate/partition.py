"""Per-rank predictions for torch's own sharding rules (no torch import).

The planner's ZeRO formulas split Φ evenly (ceil(Φ/N) per rank, seed 001 §2). torch's engines
split differently, so the exact per-rank prediction needs their rules:
- `ZeroRedundancyOptimizer` (ZeRO-1) gives WHOLE parameters to ranks: sorted by size, largest
  first (stable), each to the rank with the fewest elements so far, ties to the lowest rank
  (torch/distributed/optim/zero_redundancy_optimizer.py `_partition_parameters`, `_get_min_index`).
- FSDP2 `fully_shard` splits EVERY parameter on dim 0 into N chunks of ceil(d0/N) rows (the
  last ranks get fewer or none), and keeps each chunk padded to ceil(d0/N) rows
  (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, `_init_sharded_param`).
The tensor list is the calibrate model's (planner.calibrate.models), in `named_parameters` order.
Seed and paper citations: docs/references.md
"""

from __future__ import annotations

import math

from planner.core.spec import ModelSpec

Shape = tuple[int, ...]


def _linear(out_f: int, in_f: int, bias: bool, prefix: str) -> list[tuple[str, Shape]]:
    return [(f"{prefix}.weight", (out_f, in_f))] + ([(f"{prefix}.bias", (out_f,))] if bias else [])


def _norm(model: ModelSpec, prefix: str) -> list[tuple[str, Shape]]:
    h = model.hidden_size
    return [(f"{prefix}.weight", (h,))] + ([(f"{prefix}.bias", (h,))] if model.norm == "layernorm" else [])


def block_tensor_shapes(model: ModelSpec, i: int) -> list[tuple[str, Shape]]:
    """Block i: norm1, norm2, attention q, k, v, o, then the MLP or the router, routed and shared
    experts (module registration order)."""
    h, d, p = model.hidden_size, model.head_size, f"blocks.{i}"
    qkv_bias = model.linear_bias or model.qkv_bias
    out = _norm(model, f"{p}.norm1") + _norm(model, f"{p}.norm2")
    out += _linear(model.num_heads * d, h, qkv_bias, f"{p}.attn.q")
    out += _linear(model.kv_heads * d, h, qkv_bias, f"{p}.attn.k")
    out += _linear(model.kv_heads * d, h, qkv_bias, f"{p}.attn.v")
    out += _linear(h, model.num_heads * d, model.linear_bias, f"{p}.attn.o")
    if not model.is_moe:
        return out + _mlp(model, model.ffn_hidden_size, f"{p}.mlp")
    out.append((f"{p}.mlp.router.weight", (model.num_experts, h)))  # no bias
    for e in range(model.num_experts):
        out += _mlp(model, model.expert_ffn_size, f"{p}.mlp.experts.{e}")
    for e in range(model.num_shared_experts):
        out += _mlp(model, model.expert_ffn_size, f"{p}.mlp.shared.{e}")
    return out


def _mlp(model: ModelSpec, f: int, p: str) -> list[tuple[str, Shape]]:
    h, bias = model.hidden_size, model.linear_bias
    if model.mlp == "swiglu":
        return _linear(f, h, bias, f"{p}.gate") + _linear(f, h, bias, f"{p}.up") + _linear(h, f, bias, f"{p}.down")
    return _linear(f, h, bias, f"{p}.fc1") + _linear(h, f, bias, f"{p}.fc2")


def model_tensor_shapes(model: ModelSpec) -> list[tuple[str, Shape]]:
    """Every parameter tensor of the calibrate model, in `named_parameters()` order
    (the root's own `head_bias` first, then the children in registration order)."""
    h, V = model.hidden_size, model.vocab_size
    out: list[tuple[str, Shape]] = []
    if model.tied_embeddings and model.lm_head_bias:
        out.append(("head_bias", (V,)))
    out.append(("word.weight", (V, h)))
    if model.position == "learned":
        out.append(("position.weight", (model.max_seq_len, h)))
    if model.type_vocab_size:
        out.append(("token_type.weight", (model.type_vocab_size, h)))
    if model.embedding_norm:
        out += _norm(model, "embedding_norm")
    for i in range(model.num_layers):
        out += block_tensor_shapes(model, i)
    if model.final_norm:
        out += _norm(model, "final_norm")
    if not model.tied_embeddings:
        out += _linear(V, h, model.lm_head_bias, "lm_head")
    if model.pooler:
        out += _linear(h, h, True, "pooler")
    return out


def zero1_partition_numels(numels: list[int], world: int) -> list[int]:
    """Elements each rank's ZeroRedundancyOptimizer steps (whole parameters, greedy by size)."""
    sizes = [0] * world
    for n in sorted(numels, reverse=True):  # stable: equal sizes keep their order
        rank = sizes.index(min(sizes))  # the first rank with the fewest elements
        sizes[rank] += n
    return sizes


def fsdp2_local_numels(shapes: list[Shape], world: int, rank: int) -> tuple[int, int]:
    """(unpadded, padded) elements of `rank`'s FSDP2 shards: dim 0 in chunks of ceil(d0/N)."""
    local = padded = 0
    for shape in shapes:
        rows = -(-shape[0] // world)  # ceil(d0 / N)
        rest = math.prod(shape[1:])
        mine = max(0, min(rows, shape[0] - rank * rows))
        local += mine * rest
        padded += rows * rest
    return local, padded
