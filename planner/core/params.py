"""Exact parameter counts of a ModelSpec, and what one GPU of each pipeline stage holds.

Counting rules (EQUATIONS.md §1; seed 000 §3 eq.1, 004 §2.1), one block of a decoder:
attention Q h x (a*d), K and V h x (kv*d) each, O (a*d) x h (d = head size); MLP gelu h x f + f x h,
swiglu gate, up h x f and down f x h; biases when the spec says so; two norms (LayerNorm weight and
bias 2h, RMSNorm weight h). Mixture-of-experts: router h x E (no bias) + E routed experts + shared.

Tensor/pipeline split (Megatron-LM, megatron/core/tensor_parallel/layers.py and
megatron/core/models/common/language_module/language_module.py, see docs/params.md):
column-parallel linears (QKV, fc1 / gate+up) split weights and biases by tp; row-parallel
linears (attention out, fc2 / down) split weights, keep biases whole; norms replicated; word
embedding and lm_head vocab-parallel; position and token-type embeddings replicated.
"""

from __future__ import annotations

from planner.core.errors import PlanInputError
from planner.core.spec import Frozen, ModelSpec, ceil_div


class LayerParams(Frozen):
    """One transformer block, whole (not split by tp)."""

    attention: int
    """Q, K, V, O weights and their biases."""
    mlp: int
    """Dense MLP, or every routed + shared expert of an MoE layer."""
    router: int
    """MoE gate h x E (0 for dense models)."""
    norms: int
    """The two norms of the block."""
    total: int
    active: int
    """Parameters a token touches (MoE: top-k routed + shared experts only)."""


class ParamCount(Frozen):
    """Exact parameter count of a model, by part."""

    embedding: int
    """Word + learned position + token-type embeddings + embedding norm."""
    layer: LayerParams
    layers: int
    """num_layers x layer.total."""
    final_norm: int
    lm_head: int
    """Untied output projection (+ its bias); 0 when tied and without bias."""
    pooler: int
    total: int
    active: int


class StageParams(Frozen):
    """Parameters held by ONE GPU (one tp rank, the largest) of a pipeline stage."""

    stage: int
    """0-based pipeline rank."""
    num_layers: int
    layer_params: int
    """num_layers x one block's share on this tp rank."""
    embedding_params: int
    """Word (vocab-parallel) + position + token-type embeddings + embedding norm (first stage)."""
    head_params: int
    """Final norm + lm_head (or the tied word-embedding copy) + pooler (last stage)."""
    total: int


# --------------------------------------------------------------------------- pieces


def _linear_params(fan_in: int, fan_out: int, bias: bool) -> int:
    """A dense layer: fan_in x fan_out weights (+ fan_out biases)."""
    return fan_in * fan_out + (fan_out if bias else 0)


def norm_params(model: ModelSpec) -> int:
    """One norm over h: LayerNorm weight + bias (2h), RMSNorm weight (h)."""
    return 2 * model.hidden_size if model.norm == "layernorm" else model.hidden_size


def attention_params(model: ModelSpec) -> int:
    """Q, K, V, O of one block; GQA shrinks K and V to kv_heads x head_size columns."""
    h, d = model.hidden_size, model.head_size
    q_width = model.num_heads * d  # a * head_dim
    kv_width = model.kv_heads * d  # kv_heads * head_dim
    qkv_bias = model.linear_bias or model.qkv_bias  # Qwen2-style bias on q, k, v only
    return (
        _linear_params(h, q_width, qkv_bias)
        + 2 * _linear_params(h, kv_width, qkv_bias)  # K and V
        + _linear_params(q_width, h, model.linear_bias)  # O
    )


def mlp_params(model: ModelSpec, ffn: int) -> int:
    """One MLP (or one expert) of inner width ffn: gelu 2 matrices, swiglu 3."""
    h, bias = model.hidden_size, model.linear_bias
    up = _linear_params(h, ffn, bias)  # fc1, or gate / up each
    down = _linear_params(ffn, h, bias)  # fc2 / down
    return (2 * up if model.mlp == "swiglu" else up) + down


def router_params(model: ModelSpec) -> int:
    """MoE gate: h x E, no bias (Mixtral `gate`); 0 for dense models."""
    return model.hidden_size * model.num_experts


def layer_params(model: ModelSpec) -> LayerParams:
    """One block, total and active (MoE active = top-k routed + shared experts)."""
    attention = attention_params(model)
    norms = 2 * norm_params(model)  # pre-attention and pre-MLP (or post-, BERT) norms
    router = router_params(model)
    if model.is_moe:
        expert = mlp_params(model, model.expert_ffn_size)
        mlp = (model.num_experts + model.num_shared_experts) * expert
        active_mlp = (model.experts_per_token + model.num_shared_experts) * expert
    else:
        mlp = active_mlp = mlp_params(model, model.ffn_hidden_size)
    shared = attention + norms + router
    return LayerParams(
        attention=attention, mlp=mlp, router=router, norms=norms,
        total=shared + mlp, active=shared + active_mlp,
    )


def embedding_params(model: ModelSpec) -> int:
    """Word + learned positions + token types + embedding norm (BERT): one rank's share at tp=1."""
    return first_stage_extra_params(model, tp=1)


def lm_head_params(model: ModelSpec) -> int:
    """Untied output projection V x h (+ V bias); tied shares the word embedding."""
    weight = 0 if model.tied_embeddings else model.vocab_size * model.hidden_size
    return weight + (model.vocab_size if model.lm_head_bias else 0)


def count_params(model: ModelSpec) -> ParamCount:
    """Exact count of what the spec describes (EQUATIONS.md §1: count what the config says)."""
    layer = layer_params(model)
    embedding = embedding_params(model)
    final_norm = norm_params(model) if model.final_norm else 0
    lm_head = lm_head_params(model)
    pooler = _linear_params(model.hidden_size, model.hidden_size, True) if model.pooler else 0
    outside = embedding + final_norm + lm_head + pooler  # every token touches these
    return ParamCount(
        embedding=embedding, layer=layer, layers=model.num_layers * layer.total,
        final_norm=final_norm, lm_head=lm_head, pooler=pooler,
        total=outside + model.num_layers * layer.total,
        active=outside + model.num_layers * layer.active,
    )


# --------------------------------------------------------------------------- seed forms


def approx_params_blocks(num_layers: int, hidden: int) -> int:
    """Approximation 12·nl·hd²: four linears (h,3h) (h,h) (h,4h) (4h,h) per block (000 eq.1)."""
    return 12 * num_layers * hidden**2


def approx_params_with_embeddings(num_layers: int, hidden: int, vocab: int) -> int:
    """Approximation 12·nl·hd² + 2·V·hd: input and output embeddings counted (004 §2.1)."""
    return approx_params_blocks(num_layers, hidden) + 2 * vocab * hidden


# --------------------------------------------------------------------------- pipeline split


def layers_per_stage(num_layers: int, pp: int) -> list[int]:
    """Blocks per pipeline stage, as even as possible; the extra ones go to the LAST stages
    (stage 1 already keeps the most micro-batches in flight under 1F1B, seed 004 §3.5.2)."""
    if pp < 1:
        raise PlanInputError("pp", f"pipeline degree must be at least 1 (got {pp})")
    if pp > num_layers:
        raise PlanInputError(
            "pp", f"pipeline degree pp={pp} exceeds num_layers={num_layers}; each stage needs a layer"
        )
    base, extra = divmod(num_layers, pp)
    return [base + (1 if stage >= pp - extra else 0) for stage in range(pp)]


def check_tp(model: ModelSpec, tp: int) -> None:
    """Megatron splits heads, kv groups and the MLP width evenly (utils.divide asserts)."""
    if tp < 1:
        raise PlanInputError("tp", f"tensor-parallel degree must be at least 1 (got {tp})")
    widths = [("num_heads", model.num_heads), ("num_kv_heads", model.kv_heads)]
    if model.is_moe:  # every block is an MoE block: only the expert width is split
        widths.append(("expert_ffn_hidden_size", model.expert_ffn_size))
    else:
        widths.append(("ffn_hidden_size", model.ffn_hidden_size))
    for field, value in widths:
        if value % tp:
            raise PlanInputError("tp", f"tp={tp} must divide {field} ({value}) of model {model.name}")


def layer_tensors_per_rank(model: ModelSpec, tp: int) -> list[tuple[str, int]]:
    """One block's tensors (name, elements) on one tp rank, Megatron layout: fused linear_qkv
    and gate+up are column-parallel (weight and bias split), linear_proj and fc2 row-parallel
    (weight split, bias replicated), norms and the MoE router replicated, experts split by tp."""
    check_tp(model, tp)
    h, d = model.hidden_size, model.head_size
    qkv_width = (model.num_heads + 2 * model.kv_heads) * d  # fused Q, K, V outputs
    tensors = [("linear_qkv.weight", h * qkv_width // tp)]
    if model.linear_bias or model.qkv_bias:
        tensors.append(("linear_qkv.bias", qkv_width // tp))
    tensors.append(("linear_proj.weight", model.num_heads * d * h // tp))
    if model.linear_bias:
        tensors.append(("linear_proj.bias", h))  # row-parallel bias: whole on every rank
    norm_tensors = [("weight", h), ("bias", h)] if model.norm == "layernorm" else [("weight", h)]
    for norm in ("input_norm", "pre_mlp_norm"):
        tensors += [(f"{norm}.{part}", n) for part, n in norm_tensors]
    if model.is_moe:
        tensors.append(("router.weight", router_params(model)))
        for e in range(model.num_experts + model.num_shared_experts):
            tensors += _mlp_tensors(model, model.expert_ffn_size, tp, f"experts.{e}.")
    else:
        tensors += _mlp_tensors(model, model.ffn_hidden_size, tp, "mlp.")
    return tensors


def _mlp_tensors(model: ModelSpec, ffn: int, tp: int, prefix: str) -> list[tuple[str, int]]:
    """fc1 (gelu) or fused gate+up (swiglu) column-parallel, fc2 row-parallel."""
    h = model.hidden_size
    up_width = (2 if model.mlp == "swiglu" else 1) * ffn
    tensors = [(prefix + "fc1.weight", h * up_width // tp)]
    if model.linear_bias:
        tensors.append((prefix + "fc1.bias", up_width // tp))
    tensors.append((prefix + "fc2.weight", ffn * h // tp))
    if model.linear_bias:
        tensors.append((prefix + "fc2.bias", h))  # replicated
    return tensors


def layer_params_per_rank(model: ModelSpec, tp: int) -> int:
    """One block's parameters on one tp rank."""
    return sum(n for _, n in layer_tensors_per_rank(model, tp))


def vocab_rows_per_rank(model: ModelSpec, tp: int) -> int:
    """Vocab-parallel rows on the largest tp rank: ceil(V / tp)."""
    return ceil_div(model.vocab_size, tp)


def first_stage_extra_params(model: ModelSpec, tp: int) -> int:
    """Embeddings on one tp rank: word vocab-parallel, positions/token types/norm replicated."""
    h = model.hidden_size
    positions = model.max_seq_len * h if model.position == "learned" else 0  # rotary: none
    norm = norm_params(model) if model.embedding_norm else 0
    return vocab_rows_per_rank(model, tp) * h + positions + model.type_vocab_size * h + norm


def last_stage_extra_params(model: ModelSpec, tp: int, pp: int) -> int:
    """Final norm + lm_head on one tp rank; tied with pp > 1 keeps its own word-embedding copy
    (Megatron language_module.setup_embeddings_and_output_layer, gradients all-reduced)."""
    rows = vocab_rows_per_rank(model, tp)
    h = model.hidden_size
    head = rows * h if _last_stage_has_output_matrix(model, pp) else 0
    head += rows if model.lm_head_bias else 0  # vocab-parallel bias
    final_norm = norm_params(model) if model.final_norm else 0
    pooler = _linear_params(h, h, True) if model.pooler else 0  # Megatron BERT: replicated Linear
    return head + final_norm + pooler


def _last_stage_has_output_matrix(model: ModelSpec, pp: int) -> bool:
    """Untied lm_head; or a decoder's tied output on a separate last stage (pp > 1). A tied
    encoder (BertModel) has no output projection; with pp == 1 the tied matrix is shared."""
    if not model.tied_embeddings:
        return True
    return model.arch == "decoder" and pp > 1


def stage_params(model: ModelSpec, tp: int, pp: int) -> list[StageParams]:
    """Parameters held by one GPU (largest tp rank) of each pipeline stage."""
    per_layer = layer_params_per_rank(model, tp)
    stages = []
    for stage, n_layers in enumerate(layers_per_stage(model.num_layers, pp)):
        embedding = first_stage_extra_params(model, tp) if stage == 0 else 0
        head = last_stage_extra_params(model, tp, pp) if stage == pp - 1 else 0
        layers = n_layers * per_layer
        stages.append(StageParams(
            stage=stage, num_layers=n_layers, layer_params=layers,
            embedding_params=embedding, head_params=head, total=layers + embedding + head,
        ))
    return stages


def largest_param_numel(model: ModelSpec, tp: int, stage: int, pp: int) -> int:
    """Elements of the largest single tensor one tp rank holds on a stage (Megatron layout),
    the size of a whole-parameter gather or staging buffer."""
    candidates = [n for _, n in layer_tensors_per_rank(model, tp)]
    vocab_matrix = vocab_rows_per_rank(model, tp) * model.hidden_size
    if stage == 0:
        candidates.append(vocab_matrix)
        if model.position == "learned":
            candidates.append(model.max_seq_len * model.hidden_size)
    if stage == pp - 1 and _last_stage_has_output_matrix(model, pp):
        candidates.append(vocab_matrix)
    return max(candidates)
