"""Exact parameter counts of a ModelSpec, and what one GPU of each pipeline stage holds.

Counting rules (EQUATIONS.md §1; seed 000 §3 eq.1, 004 §2.1), one block of a decoder:
attention Q h x (a*d), K and V h x (kv*d) each, O (a*d) x h (d = head size); MLP gelu h x f + f x h,
swiglu gate, up h x f and down f x h; biases when the spec says so; two norms (LayerNorm weight and
bias 2h, RMSNorm weight h). Mixture-of-experts: router h x E (no bias) + E routed experts + shared.
Multi-head latent attention (DeepSeek-V2/V3, transformers models/deepseek_v3/modeling_deepseek_v3.py
DeepseekV3Attention): q_a h x r_q, RMSNorm r_q, q_b r_q x a(nope + rope); kv_a h x (r_kv + rope),
RMSNorm r_kv, kv_b r_kv x a(nope + v); o a*v x h. Models mixing dense and MoE blocks
(first_dense_replace, moe_layer_step) are summed block by block.

Tensor/pipeline split (Megatron-LM, megatron/core/tensor_parallel/layers.py and
megatron/core/models/common/language_module/language_module.py, see docs/params.md):
column-parallel linears (QKV, fc1 / gate+up) split weights and biases by tp; row-parallel
linears (attention out, fc2 / down) split weights, keep biases whole; norms replicated; word
embedding and lm_head vocab-parallel; position and token-type embeddings replicated.
tp wider than the kv heads (tp % kv_heads == 0): Megatron still splits the fused QKV weight
evenly and all-gathers its output so each rank computes with one (replicated) kv head
(megatron/core/transformer/attention.py at d98e8a6, `num_query_groups < world_size`).
MLA: the down-projections q_a / kv_a are replicated (TELinear parallel_mode "duplicated"),
the up-projections column-parallel, linear_proj row-parallel
(megatron/core/transformer/multi_latent_attention.py at d98e8a6).
"""

from __future__ import annotations

import functools

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
    """One MoE block for MoE models, else one dense block."""
    dense_layer: LayerParams
    """One dense block (equal to `layer` for dense models)."""
    num_moe_layers: int
    """Blocks with an MoE MLP (0 for dense models); the rest are dense blocks."""
    layers: int
    """Every block: num_moe_layers x layer.total + dense blocks x dense_layer.total."""
    final_norm: int
    lm_head: int
    """Untied output projection (+ its bias); 0 when tied and without bias."""
    pooler: int
    total: int
    """The main model, as transformers builds it (no MTP modules)."""
    active: int
    mtp: int
    """DeepSeek-V3 multi-token-prediction modules, counted apart from `total` (0 otherwise)."""


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
    """Q, K, V, O of one block (+ q/k norms); GQA shrinks K and V to kv_heads x head_size
    columns; MLA is counted by `mla_attention_params`."""
    if model.is_mla:
        return mla_attention_params(model)
    h, d = model.hidden_size, model.head_size
    q_width = model.num_heads * d  # a * head_dim
    kv_width = model.kv_heads * d  # kv_heads * head_dim
    qkv_bias = model.linear_bias or model.qkv_bias  # Qwen2-style bias on q, k, v only
    qk_norms = 2 * d if model.qk_norm else 0  # q_norm, k_norm: RMSNorm(head_dim) each
    return (
        _linear_params(h, q_width, qkv_bias)
        + 2 * _linear_params(h, kv_width, qkv_bias)  # K and V
        + _linear_params(q_width, h, model.linear_bias)  # O
        + qk_norms
    )


def mla_attention_params(model: ModelSpec) -> int:
    """Multi-head latent attention (DeepseekV3Attention): biases on q_a, kv_a and o when
    `linear_bias` (config attention_bias); the latent RMSNorms have weights only."""
    h, a, bias = model.hidden_size, model.num_heads, model.linear_bias
    r_kv, rope = model.kv_lora_rank or 0, model.qk_rope_head_dim
    qk_dim = model.qk_nope_head_dim + rope  # query/key width per head
    if model.q_lora_rank is None:
        query = _linear_params(h, a * qk_dim, False)  # q_proj
    else:
        r_q = model.q_lora_rank
        query = _linear_params(h, r_q, bias) + r_q + _linear_params(r_q, a * qk_dim, False)
    kv = (_linear_params(h, r_kv + rope, bias)  # kv_a_proj_with_mqa: latent + shared rope key
          + r_kv  # kv_a_layernorm
          + _linear_params(r_kv, a * (model.qk_nope_head_dim + model.v_head_dim), False))  # kv_b
    out = _linear_params(a * model.v_head_dim, h, bias)  # o_proj
    return query + kv + out


def mlp_params(model: ModelSpec, ffn: int) -> int:
    """One MLP (or one expert) of inner width ffn: gelu 2 matrices, swiglu 3."""
    h, bias = model.hidden_size, model.linear_bias
    up = _linear_params(h, ffn, bias)  # fc1, or gate / up each
    down = _linear_params(ffn, h, bias)  # fc2 / down
    return (2 * up if model.mlp == "swiglu" else up) + down


def router_params(model: ModelSpec) -> int:
    """MoE gate: h x E, no bias (Mixtral `gate`); 0 for dense models. Qwen2-MoE's shared-expert
    gate h x 1 is added when the spec has one. DeepSeek-V3's e_score_correction_bias is a
    buffer, not a parameter (DeepseekV3TopkRouter)."""
    gate = model.hidden_size if model.shared_expert_gate else 0
    return model.hidden_size * model.num_experts + gate


def block_norms(model: ModelSpec) -> int:
    """Norms of one block over h: pre-attention and pre-MLP, plus post-attention and post-MLP
    with sandwich norms (Gemma 3's four)."""
    return (4 if model.sandwich_norms else 2) * norm_params(model)


def layer_params(model: ModelSpec, moe: bool | None = None) -> LayerParams:
    """One block, total and active (MoE active = top-k routed + shared experts). `moe` picks
    the MoE or the dense block of a model that has both; None: MoE when the model has experts."""
    moe = model.is_moe if moe is None else moe
    attention = attention_params(model)
    norms = block_norms(model)
    router = router_params(model) if moe else 0
    if moe:
        expert = mlp_params(model, model.expert_ffn_size)
        mlp = (model.num_experts + model.num_shared_experts) * expert
        active_mlp = (model.experts_per_token + model.num_shared_experts) * expert
    else:
        mlp = active_mlp = mlp_params(model, model.ffn_hidden_size)
    shared = attention + norms + router
    return LayerParams.computed(
        attention=attention, mlp=mlp, router=router, norms=norms,
        total=shared + mlp, active=shared + active_mlp,
    )


def mtp_module_params(model: ModelSpec) -> int:
    """One DeepSeek-V3 multi-token-prediction module without the embedding and output head it
    shares with the main model (report §2.2): eh_proj 2h x h, enorm and hnorm, the MoE block,
    and the shared head's final norm (checkpoint layer 61: enorm, hnorm, eh_proj, shared_head.norm)."""
    h = model.hidden_size
    return 2 * h * h + 3 * norm_params(model) + layer_params(model, moe=True).total


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
    dense = layer_params(model, moe=False)
    num_moe = model.num_moe_layers
    num_dense = model.num_layers - num_moe
    embedding = embedding_params(model)
    final_norm = norm_params(model) if model.final_norm else 0
    lm_head = lm_head_params(model)
    pooler = _linear_params(model.hidden_size, model.hidden_size, True) if model.pooler else 0
    outside = embedding + final_norm + lm_head + pooler  # every token touches these
    if num_moe:
        blocks = num_moe * layer.total + num_dense * dense.total
        active_blocks = num_moe * layer.active + num_dense * dense.active
    else:
        blocks, active_blocks = model.num_layers * dense.total, model.num_layers * dense.active
    return ParamCount.computed(
        embedding=embedding, layer=layer, dense_layer=dense, num_moe_layers=num_moe,
        layers=blocks, final_norm=final_norm, lm_head=lm_head, pooler=pooler,
        total=outside + blocks, active=outside + active_blocks,
        mtp=model.mtp_modules * mtp_module_params(model),
    )


# --------------------------------------------------------------------------- seed forms


def approx_params_blocks(num_layers: int, hidden: int) -> int:
    """Approximation 12·nl·hd²: four linears (h,3h) (h,h) (h,4h) (4h,h) per block (000 eq.1)."""
    return 12 * num_layers * hidden**2


def approx_params_with_embeddings(num_layers: int, hidden: int, vocab: int) -> int:
    """Approximation 12·nl·hd² + 2·V·hd: input and output embeddings counted (004 §2.1)."""
    return approx_params_blocks(num_layers, hidden) + 2 * vocab * hidden


# --------------------------------------------------------------------------- pipeline split


def layers_per_stage(num_layers: int, pp: int, first: int | None = None,
                     last: int | None = None) -> list[int]:
    """Blocks per pipeline stage. With `first` / `last` (Megatron-LM's
    `--decoder-first/last-pipeline-num-layers`) those stages hold that many and the middle
    stages share the rest evenly (Megatron-LM transformer_block.py `get_num_layers_to_build`,
    commit d98e8a64; the divisibility rules are planner.core.rules'). Otherwise as even as
    possible; the extra ones go to the LAST stages (stage 1 already keeps the most micro-batches
    in flight under 1F1B, seed 004 §3.5.2)."""
    return list(_layers_per_stage(num_layers, pp, first or None, last or None))


@functools.lru_cache(maxsize=4096)
def _layers_per_stage(num_layers: int, pp: int, first: int | None, last: int | None
                      ) -> tuple[int, ...]:
    """`layers_per_stage`, remembered (a sweep's tables ask for each (pp, split) several times)."""
    if first or last:  # 0 = not given (layout columns store None as 0)
        return tuple(uneven_layers_per_stage(num_layers, pp, first, last))
    if pp < 1:
        raise PlanInputError("pp", f"pipeline degree must be at least 1 (got {pp})")
    if pp > num_layers:
        raise PlanInputError(
            "pp", f"pipeline degree pp={pp} exceeds num_layers={num_layers}; each stage needs a layer"
        )
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if stage >= pp - extra else 0) for stage in range(pp))


def uneven_layers_per_stage(num_layers: int, pp: int, first: int | None,
                            last: int | None) -> list[int]:
    """Megatron's uneven split: first / last stage counts as given, the middle stages
    (num_layers - first - last) / (pp - stages given) each; a split that does not add up is a
    one-line error naming the flags."""
    given = [n for n in (first, last) if n is not None]
    middle_stages = pp - len(given)
    middle_layers = num_layers - sum(given)
    if pp < 2 or middle_layers < 0 or bool(middle_layers) != bool(middle_stages) \
            or (middle_stages and middle_layers % middle_stages):
        raise PlanInputError("first_stage_layers", (
            f"first_stage_layers={first}, last_stage_layers={last} leave {middle_layers} layers of "
            f"num_layers={num_layers} for {max(middle_stages, 0)} middle stages of pp={pp}; "
            "they must divide evenly (Megatron-LM transformer_config.py, uneven PP)"))
    per = middle_layers // middle_stages if middle_stages else 0
    out = [per] * pp
    if first is not None:
        out[0] = first
    if last is not None:
        out[-1] = last
    return out


def check_tp(model: ModelSpec, tp: int) -> None:
    """Megatron splits heads, the fused QKV output and the MLP widths evenly (utils.divide
    asserts); num_kv_heads must be a multiple or a divisor of tp (transformer_config.py
    `__post_init__` at d98e8a64): split over tp, or, when tp is wider, each rank computes with
    one kv head replicated tp / kv times (`kv_heads_per_rank`). The same rule as
    planner.core.rules `TP_RULE_NAME` (that one over layout columns)."""
    if tp < 1:
        raise PlanInputError("tp", f"tensor-parallel degree must be at least 1 (got {tp})")
    widths = [("num_heads", model.num_heads)]
    if model.num_moe_layers:
        widths.append(("expert_ffn_hidden_size", model.expert_ffn_size))
    if model.num_moe_layers < model.num_layers:
        widths.append(("ffn_hidden_size", model.ffn_hidden_size))
    if not model.is_mla:
        widths.append(("fused QKV width (num_heads + 2 num_kv_heads) x head_dim", qkv_width(model)))
    for field, value in widths:
        if value % tp:
            raise PlanInputError("tp", f"tp={tp} must divide {field} ({value}) of model {model.name}")
    kv = model.kv_heads
    if not model.is_mla and kv % tp and tp % kv:
        raise PlanInputError(
            "tp", f"num_kv_heads ({kv}) of model {model.name} must be a multiple or a divisor of "
                  f"tp={tp} (kv heads are split, or replicated when tp is wider)")


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """Key/value heads each tp rank computes with: kv / tp, or 1 (replicated tp / kv times)
    when tp is wider than the kv heads (Megatron attention.py `num_query_groups_per_partition`,
    vLLM QKVParallelLinear `num_kv_head_replicas`). MLA: every rank's heads have their own
    key/value, a / tp."""
    check_tp(model, tp)
    if model.is_mla:
        return model.num_heads // tp
    return max(1, model.kv_heads // tp)


def qkv_width(model: ModelSpec) -> int:
    """Outputs of the fused Q, K, V projection (standard attention)."""
    return (model.num_heads + 2 * model.kv_heads) * model.head_size


def layer_tensors_per_rank(model: ModelSpec, tp: int, moe: bool | None = None) -> list[tuple[str, int]]:
    """One block's tensors (name, elements) on one tp rank, Megatron layout: fused linear_qkv
    and gate+up are column-parallel (weight and bias split), linear_proj and fc2 row-parallel
    (weight split, bias replicated), norms and the MoE router replicated, experts split by tp.
    `moe` picks the MoE or the dense block (None: MoE when the model has experts). tp wider
    than the kv heads: the QKV weight is still split evenly (`_attention_tensors`)."""
    return list(_layer_tensors(model, tp, model.is_moe if moe is None else moe))


@functools.lru_cache(maxsize=1024)
def _layer_tensors(model: ModelSpec, tp: int, moe: bool) -> tuple[tuple[str, int], ...]:
    """`layer_tensors_per_rank`, remembered per (model, tp, block kind): a sweep's stage tables
    ask for the same few tp values for every pp and stage (a fresh list is returned each call)."""
    check_tp(model, tp)
    h = model.hidden_size
    tensors = _mla_tensors(model, tp) if model.is_mla else _attention_tensors(model, tp)
    norm_tensors = [("weight", h), ("bias", h)] if model.norm == "layernorm" else [("weight", h)]
    norms = ("input_norm", "pre_mlp_norm")
    if model.sandwich_norms:
        norms += ("post_attention_norm", "post_mlp_norm")
    for norm in norms:
        tensors += [(f"{norm}.{part}", n) for part, n in norm_tensors]
    if moe:
        tensors.append(("router.weight", h * model.num_experts))
        if model.shared_expert_gate:
            tensors.append(("shared_expert_gate.weight", h))
        for e in range(model.num_experts + model.num_shared_experts):
            tensors += _mlp_tensors(model, model.expert_ffn_size, tp, f"experts.{e}.")
    else:
        tensors += _mlp_tensors(model, model.ffn_hidden_size, tp, "mlp.")
    return tuple(tensors)


def _attention_tensors(model: ModelSpec, tp: int) -> list[tuple[str, int]]:
    """Standard attention on one tp rank: the fused QKV weight split evenly (also when tp is
    wider than the kv heads), q/k norms over head_dim replicated."""
    h, d = model.hidden_size, model.head_size
    width = qkv_width(model)
    tensors = [("linear_qkv.weight", h * width // tp)]
    if model.linear_bias or model.qkv_bias:
        tensors.append(("linear_qkv.bias", width // tp))
    if model.qk_norm:
        tensors += [("q_layernorm.weight", d), ("k_layernorm.weight", d)]
    tensors.append(("linear_proj.weight", model.num_heads * d * h // tp))
    if model.linear_bias:
        tensors.append(("linear_proj.bias", h))  # row-parallel bias: whole on every rank
    return tensors


def _mla_tensors(model: ModelSpec, tp: int) -> list[tuple[str, int]]:
    """MLA on one tp rank (Megatron MLASelfAttention): down-projections and latent norms
    replicated, up-projections column-parallel, linear_proj row-parallel."""
    h, a, bias = model.hidden_size, model.num_heads, model.linear_bias
    r_kv, rope, nope, v = model.kv_lora_rank or 0, model.qk_rope_head_dim, model.qk_nope_head_dim, model.v_head_dim
    if model.q_lora_rank is None:
        tensors = [("linear_q_proj.weight", h * a * (nope + rope) // tp)]
    else:
        r_q = model.q_lora_rank
        tensors = [("linear_q_down_proj.weight", h * r_q)]
        tensors += [("linear_q_down_proj.bias", r_q)] if bias else []
        tensors += [("q_layernorm.weight", r_q), ("linear_q_up_proj.weight", r_q * a * (nope + rope) // tp)]
    tensors.append(("linear_kv_down_proj.weight", h * (r_kv + rope)))
    tensors += [("linear_kv_down_proj.bias", r_kv + rope)] if bias else []
    tensors += [("kv_layernorm.weight", r_kv), ("linear_kv_up_proj.weight", r_kv * a * (nope + v) // tp),
                ("linear_proj.weight", a * v * h // tp)]
    tensors += [("linear_proj.bias", h)] if bias else []
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


def layer_params_per_rank(model: ModelSpec, tp: int, moe: bool | None = None) -> int:
    """One block's parameters on one tp rank (`moe` as in layer_tensors_per_rank)."""
    return _layer_numel(model, tp, model.is_moe if moe is None else moe)


@functools.lru_cache(maxsize=1024)
def _layer_numel(model: ModelSpec, tp: int, moe: bool) -> int:
    """`layer_params_per_rank`, remembered as `_layer_tensors` is (the sweep's stage tables)."""
    return sum(n for _, n in _layer_tensors(model, tp, moe))


@functools.lru_cache(maxsize=1024)
def largest_layer_tensor(model: ModelSpec, tp: int) -> int:
    """Elements of the largest tensor of a block on one tp rank, over the model's block kinds."""
    return max(n for moe in block_kinds(model) for _, n in _layer_tensors(model, tp, moe))


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


def block_kinds(model: ModelSpec) -> set[bool]:
    """Which blocks the model has: True for MoE blocks, False for dense ones."""
    moe = model.num_moe_layers  # closed form: no scan over the layers (called per tp in a sweep)
    return {kind for kind, present in ((True, moe > 0), (False, moe < model.num_layers)) if present}


def stage_param_counts(model: ModelSpec, tp: int, pp: int,
                       first: int | None = None, last: int | None = None
                       ) -> list[tuple[int, int, int, int]]:
    """(num_layers, layer_params, embedding_params, head_params) of each pipeline stage as
    plain ints: `stage_params` without the typed records (the sweep's hot path)."""
    per_layer = {moe: layer_params_per_rank(model, tp, moe) for moe in block_kinds(model)}
    only = next(iter(per_layer.values())) if len(per_layer) == 1 else None  # one block kind
    stages, start = [], 0
    for stage, n_layers in enumerate(layers_per_stage(model.num_layers, pp, first, last)):
        embedding = first_stage_extra_params(model, tp) if stage == 0 else 0
        head = last_stage_extra_params(model, tp, pp) if stage == pp - 1 else 0
        if only is not None:
            layers = n_layers * only
        else:
            layers = sum(per_layer[model.layer_is_moe(i)] for i in range(start, start + n_layers))
        start += n_layers
        stages.append((n_layers, layers, embedding, head))
    return stages


def stage_record(stage: int, counts: tuple[int, int, int, int]) -> StageParams:
    """The typed record of one stage's `stage_param_counts` entry."""
    n_layers, layers, embedding, head = counts
    return StageParams.computed(stage=stage, num_layers=n_layers, layer_params=layers,
                       embedding_params=embedding, head_params=head,
                       total=layers + embedding + head)


def stage_params(model: ModelSpec, tp: int, pp: int,
                 first: int | None = None, last: int | None = None) -> list[StageParams]:
    """Parameters held by one GPU (largest tp rank) of each pipeline stage; MoE and dense
    blocks counted where they sit (first_dense_layers, moe_layer_step); `first` / `last` the
    uneven stage sizes (`layers_per_stage`)."""
    return [stage_record(i, counts) for i, counts in
            enumerate(stage_param_counts(model, tp, pp, first, last))]


def largest_param_numel(model: ModelSpec, tp: int, stage: int, pp: int) -> int:
    """Elements of the largest single tensor one tp rank holds on a stage (Megatron layout),
    the size of a whole-parameter gather or staging buffer."""
    candidates = [largest_layer_tensor(model, tp)]
    vocab_matrix = vocab_rows_per_rank(model, tp) * model.hidden_size
    if stage == 0:
        candidates.append(vocab_matrix)
        if model.position == "learned":
            candidates.append(model.max_seq_len * model.hidden_size)
    if stage == pp - 1 and _last_stage_has_output_matrix(model, pp):
        candidates.append(vocab_matrix)
    return max(candidates)
