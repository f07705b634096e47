"""Read a Hugging Face `config.json` into a `ModelSpec` (local files only, no hub access).

One small mapping function per `model_type`. Defaults follow the transformers configuration
classes (`configuration_<model>.py`) where a key is absent: `num_key_value_heads` -> heads,
`head_dim` -> hidden / heads, `n_inner: null` -> 4h, and `tie_word_embeddings` per class
(PretrainedConfig's default True for GPT-2, OPT, BERT; False for GPT-NeoX, Llama, Mistral,
Qwen2, Mixtral, Qwen2-MoE). What `ModelSpec` cannot express exactly raises `PlanInputError`
naming the key. Multimodal configs (Llama 4, Gemma 3) are read from their `text_config`: the
planner models the text decoder (`*ForCausalLM`), not the vision tower.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.core.errors import PlanInputError, format_validation_error
from planner.core.spec import ModelSpec

Config = dict[str, Any]


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a local `config.json` (or a directory holding one) into a ModelSpec."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    config = read_json(path, "model")
    # the model's own name, else its architecture, and only then its folder (in a Hugging Face
    # cache the folder is a commit hash under snapshots/)
    architectures = config.get("architectures")
    own_name = config.get("_name_or_path") or (
        architectures[0] if isinstance(architectures, list) and architectures else None)
    folder = path.resolve().parent.name
    return model_from_hf_dict(config, name=str(own_name or folder or config.get("model_type")),
                              source=f"Hugging Face config {path}")


def read_json(path: Path, field: str) -> Config:
    """A JSON object from a file, or a one-line PlanInputError naming the file and line."""
    from planner.io.strict import read_json as read_strict_json  # duplicates, NaN, non-UTF-8

    data = read_strict_json(path, field)
    if not isinstance(data, dict):
        raise PlanInputError(field, f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def model_from_hf_dict(config: Config, name: str, source: str = "Hugging Face config") -> ModelSpec:
    """Dispatch on `model_type` to the family's mapping; build and validate the ModelSpec."""
    model_type = config.get("model_type")
    if model_type not in _FAMILIES:
        raise PlanInputError(
            "model_type",
            f"{model_type!r} is not supported; allowed: {', '.join(sorted(_FAMILIES))}",
        )
    fields = _FAMILIES[model_type](config)
    note = fields.pop("_note", "")
    fields.setdefault("name", name.rstrip("/").split("/")[-1] or model_type)
    fields["source"] = f"{source} (model_type {model_type}){'; ' + note if note else ''}"
    try:
        return ModelSpec(**fields)
    except ValidationError as err:
        raise PlanInputError("model", format_validation_error(err)) from None


# --------------------------------------------------------------------------- helpers


def _req(config: Config, key: str) -> Any:
    """A key the family cannot do without."""
    if config.get(key) is None:
        raise PlanInputError(key, f"missing in config.json (model_type {config.get('model_type')})")
    return config[key]


def _int(config: Config, key: str, default: int | None = None) -> int:
    """An integer key (default when absent or null)."""
    value = config.get(key)
    if value is None:
        if default is None:
            return int(_req(config, key))
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise PlanInputError(key, f"must be an integer, got {value!r}")
    if value < (0 if key in _ZERO_ALLOWED else 1):
        raise PlanInputError(key, f"must be at least {0 if key in _ZERO_ALLOWED else 1} "
                                  f"(a size, a count or a divisor), got {value}")
    return value


_ZERO_ALLOWED = {"first_k_dense_replace", "n_shared_experts", "num_experts", "type_vocab_size",
                 "shared_expert_intermediate_size", "decoder_sparse_step", "moe_layer_freq"}
"""Integer keys where 0 means "none"; every other integer key is a size, a count or a divisor."""


def _any_dropout(config: Config, *keys: str, default: float = 0.0) -> bool:
    """True when any of the named dropout probabilities is above zero."""
    return any(float(config.get(k, default) or 0.0) > 0 for k in keys)


def _reject(config: Config, key: str, bad: Callable[[Any], bool], why: str) -> None:
    """Raise when a key has a value the spec cannot represent."""
    if key in config and bad(config[key]):
        raise PlanInputError(key, f"{config[key]!r} is not representable: {why}")


def _standard_dims(config: Config) -> Config:
    """The dimensions most configs spell the same way (PretrainedConfig's attribute names)."""
    return {
        "num_layers": _int(config, "num_hidden_layers"),
        "hidden_size": _int(config, "hidden_size"),
        "num_heads": _int(config, "num_attention_heads"),
        "ffn_hidden_size": _int(config, "intermediate_size"),
        "vocab_size": _int(config, "vocab_size"),
        "max_seq_len": _int(config, "max_position_embeddings"),
    }


def _llama_like(config: Config, tie_default: bool = False) -> Config:
    """Shared fields of the Llama family: RMSNorm, SwiGLU, rotary, GQA, no biases."""
    hidden, heads = _int(config, "hidden_size"), _int(config, "num_attention_heads")
    return {
        **_standard_dims(config),
        "num_kv_heads": _int(config, "num_key_value_heads", heads),  # missing -> MHA
        "head_dim": _int(config, "head_dim", hidden // heads),  # missing -> hidden / heads
        "mlp": "swiglu",
        "norm": "rmsnorm",
        "position": "rotary",
        "tied_embeddings": bool(config.get("tie_word_embeddings", tie_default)),
        "linear_bias": False,
        "dropout": _any_dropout(config, "attention_dropout"),
    }


# --------------------------------------------------------------------------- families


def _gpt2(config: Config) -> Config:
    """GPT2Config: n_embd, n_layer, n_head, n_inner (null -> 4h), n_positions; Conv1D with bias."""
    hidden = _int(config, "n_embd")
    return {
        "num_layers": _int(config, "n_layer"),
        "hidden_size": hidden,
        "num_heads": _int(config, "n_head"),
        "ffn_hidden_size": _int(config, "n_inner", 4 * hidden),  # GPT2MLP: n_inner or 4 * n_embd
        "vocab_size": _int(config, "vocab_size"),
        "max_seq_len": _int(config, "n_positions"),
        "tied_embeddings": bool(config.get("tie_word_embeddings", True)),
        "dropout": _any_dropout(config, "resid_pdrop", "attn_pdrop", "embd_pdrop", default=0.1),
    }


def _gpt_neox(config: Config) -> Config:
    """GPTNeoXConfig: rotary (no position parameters), untied `embed_out` by default.

    Parallel attention (`use_parallel_residual`) and `rotary_pct` change no parameter count;
    the activation inventory treats the block as sequential (same saved tensors).
    """
    _reject(config, "attention_bias", lambda v: v is False,
            "GPT-NeoX MLP keeps its biases, the spec has one bias switch for all linears")
    return {
        **_standard_dims(config),
        "position": "rotary",
        "tied_embeddings": bool(config.get("tie_word_embeddings", False)),
        "dropout": _any_dropout(config, "attention_dropout", "hidden_dropout"),
    }


def _opt(config: Config) -> Config:
    """OPTConfig: learned positions with an offset of 2 (OPTLearnedPositionalEmbedding), so the
    table has max_position_embeddings + 2 rows; ReLU 2-matrix MLP of width ffn_dim."""
    hidden = _int(config, "hidden_size")
    _reject(config, "word_embed_proj_dim", lambda v: v not in (None, hidden),
            f"needs project_in/project_out layers (hidden_size {hidden}), e.g. OPT-350m")
    _reject(config, "layer_norm_elementwise_affine", lambda v: v is False,
            "LayerNorms without weights")
    _reject(config, "enable_bias", lambda v: v is False, "OPT without linear biases")
    final = bool(config.get("do_layer_norm_before", True)) and not config.get(
        "_remove_final_layer_norm", False)  # OPTDecoder keeps final_layer_norm only then
    return {
        "num_layers": _int(config, "num_hidden_layers"),
        "hidden_size": hidden,
        "num_heads": _int(config, "num_attention_heads"),
        "ffn_hidden_size": _int(config, "ffn_dim"),
        "vocab_size": _int(config, "vocab_size"),
        "max_seq_len": _int(config, "max_position_embeddings") + 2,  # offset 2 rows
        "tied_embeddings": bool(config.get("tie_word_embeddings", True)),
        "final_norm": final,
        "dropout": _any_dropout(config, "dropout", "attention_dropout", default=0.1),
        "_note": "OPT: max_seq_len = max_position_embeddings + 2 (position offset rows)",
    }


def _llama(config: Config) -> Config:
    """LlamaConfig (Llama 2 / 3): attention_bias and mlp_bias default False."""
    fields = _llama_like(config)
    attention_bias, mlp_bias = bool(config.get("attention_bias")), bool(config.get("mlp_bias"))
    if attention_bias != mlp_bias:
        raise PlanInputError(
            "attention_bias",
            f"attention_bias={attention_bias} with mlp_bias={mlp_bias} is not representable "
            "(the spec has one bias switch for all block linears, plus qkv_bias)",
        )
    fields["linear_bias"] = attention_bias
    return fields


def _mistral(config: Config) -> Config:
    """MistralConfig: Llama block plus `sliding_window` (null means full attention)."""
    fields = _llama_like(config)
    fields["sliding_window"] = config.get("sliding_window")
    return fields


def _qwen2(config: Config) -> Config:
    """Qwen2Config: bias on q, k, v only (Qwen2Attention); window only if use_sliding_window."""
    fields = _llama_like(config)
    fields["qkv_bias"] = True
    if config.get("use_sliding_window"):
        fields["sliding_window"] = config.get("sliding_window")
    return fields


def _mixtral(config: Config) -> Config:
    """MixtralConfig: every layer a sparse MoE of num_local_experts SwiGLU experts, top-k."""
    fields = _mistral(config)
    fields["num_experts"] = _int(config, "num_local_experts")
    fields["experts_per_token"] = _int(config, "num_experts_per_tok")
    fields["expert_ffn_hidden_size"] = fields["ffn_hidden_size"]
    return fields


def _no_dense_list(config: Config) -> None:
    """Qwen-MoE `mlp_only_layers` (an explicit list of dense blocks) has no spec field."""
    if config.get("mlp_only_layers"):
        raise PlanInputError(
            "mlp_only_layers",
            f"{config['mlp_only_layers']!r} is not representable (dense blocks are placed by "
            "decoder_sparse_step only); allowed: an empty list")


def _qwen2_moe(config: Config) -> Config:
    """Qwen2MoeConfig: routed experts of moe_intermediate_size plus one shared expert with a
    sigmoid gate h x 1 (Qwen2MoeSparseMoeBlock.shared_expert_gate); block i is MoE when
    (i + 1) % decoder_sparse_step == 0, dense of intermediate_size otherwise.

    The shared expert of width S counts as S / moe_intermediate_size shared experts (same
    3·h·S parameters and FLOPs).
    """
    _no_dense_list(config)
    fields = _qwen2(config)
    expert = _int(config, "moe_intermediate_size")
    shared = _int(config, "shared_expert_intermediate_size", 0)
    if shared % expert:
        raise PlanInputError(
            "shared_expert_intermediate_size",
            f"{shared} is not a multiple of moe_intermediate_size {expert}; not representable",
        )
    fields.update(
        num_experts=_int(config, "num_experts"),
        experts_per_token=_int(config, "num_experts_per_tok"),
        expert_ffn_hidden_size=expert,
        num_shared_experts=shared // expert,
        shared_expert_gate=shared > 0,
        moe_layer_step=_int(config, "decoder_sparse_step", 1),
    )
    return fields


def _qwen3(config: Config) -> Config:
    """Qwen3Config: the Llama block plus q_norm / k_norm (RMSNorm over head_dim, Qwen3Attention);
    attention_bias (default False) on q, k, v and o only."""
    fields = _llama_like(config)
    fields["qk_norm"] = True
    if config.get("attention_bias"):
        raise PlanInputError("attention_bias", "True is not representable for Qwen3 (bias on o_proj "
                                               "without MLP biases)")
    if config.get("use_sliding_window"):
        fields["sliding_window"] = config.get("sliding_window")
    return fields


def _qwen3_moe(config: Config) -> Config:
    """Qwen3MoeConfig: Qwen3 attention, routed experts only (no shared expert), router h x E;
    block i is MoE when (i + 1) % decoder_sparse_step == 0 (Qwen3MoeDecoderLayer)."""
    _no_dense_list(config)
    fields = _qwen3(config)
    fields.update(
        num_experts=_int(config, "num_experts"),
        experts_per_token=_int(config, "num_experts_per_tok"),
        expert_ffn_hidden_size=_int(config, "moe_intermediate_size"),
        moe_layer_step=_int(config, "decoder_sparse_step", 1),
    )
    return fields


def _deepseek_moe_fields(config: Config) -> Config:
    """DeepSeek MoE keys: n_routed_experts, n_shared_experts, moe_intermediate_size, the first
    first_k_dense_replace blocks dense. moe_layer_freq != 1 is refused: transformers' DeepSeek-V2/V3
    ignore it (every block from first_k_dense_replace on is MoE) while the original code does not."""
    if _int(config, "moe_layer_freq", 1) != 1:
        raise PlanInputError(
            "moe_layer_freq",
            f"{config['moe_layer_freq']} is not representable; allowed: 1 (every block after "
            "first_k_dense_replace is MoE)")
    return {
        "num_experts": _int(config, "n_routed_experts"),
        "experts_per_token": _int(config, "num_experts_per_tok"),
        "expert_ffn_hidden_size": _int(config, "moe_intermediate_size"),
        "num_shared_experts": _int(config, "n_shared_experts", 0),
        "first_dense_layers": _int(config, "first_k_dense_replace", 0),
    }


def _deepseek(config: Config) -> Config:
    """DeepSeek-MoE (model_type deepseek): MHA attention, MoE after first_k_dense_replace."""
    fields = _llama(config)
    fields.update(_deepseek_moe_fields(config))
    return fields


def _deepseek_mla(config: Config) -> Config:
    """DeepSeek-V2/V3 (DeepseekV3Attention): multi-head latent attention, MoE blocks after
    first_k_dense_replace; V3's num_nextn_predict_layers multi-token-prediction modules are
    counted apart (transformers does not build them)."""
    mla_keys = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    missing = [key for key in mla_keys if config.get(key) is None]
    if missing:
        raise PlanInputError(missing[0], f"missing in config.json: multi-head latent attention "
                                         f"needs {', '.join(mla_keys)}")
    fields = _llama_like(config)
    fields["linear_bias"] = bool(config.get("attention_bias"))  # q_a, kv_a, o only
    if fields["linear_bias"]:
        raise PlanInputError("attention_bias", "True is not representable (bias on q_a, kv_a and "
                                               "o without MLP biases)")
    del fields["head_dim"]  # MLA widths are given per part below
    fields.update(
        num_kv_heads=None,
        q_lora_rank=config.get("q_lora_rank"),
        **{key: _int(config, key) for key in mla_keys},
        **_deepseek_moe_fields(config),
        mtp_modules=_int(config, "num_nextn_predict_layers", 0),
    )
    return fields


def _text_config(config: Config) -> Config:
    """A multimodal config's language model part (`text_config`), or the config itself."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _llama4(config: Config) -> Config:
    """Llama4TextConfig: MoE blocks of num_local_experts experts (intermediate_size) + one shared
    expert, dense blocks of intermediate_size_mlp, block i MoE when (i + 1) %
    interleave_moe_layer_step == 0; chunked attention (attention_chunk_size) on the rope layers,
    every no_rope_layer_interval-th block global (Llama4TextConfig defaults). Its q/k L2 norm has
    no weights."""
    config = _text_config(config)
    for key in ("moe_layers", "no_rope_layers", "layer_types"):
        if config.get(key):
            raise PlanInputError(key, "explicit per-layer lists are not representable; allowed: "
                                      "interleave_moe_layer_step / no_rope_layer_interval")
    fields = _llama(config)
    chunk = config.get("attention_chunk_size", 8192)
    fields.update(
        ffn_hidden_size=_int(config, "intermediate_size_mlp", 16384),
        expert_ffn_hidden_size=_int(config, "intermediate_size"),
        num_experts=_int(config, "num_local_experts"),
        experts_per_token=_int(config, "num_experts_per_tok"),
        num_shared_experts=1,
        moe_layer_step=_int(config, "interleave_moe_layer_step", 1),
        local_window=chunk,
        local_attention="chunked",
        global_layer_step=_int(config, "no_rope_layer_interval", 4),
    )
    if chunk is None:
        fields.update(local_attention="sliding", global_layer_step=1)
    return fields


def _gemma3(config: Config) -> Config:
    """Gemma3TextConfig (or Gemma3Config's text_config): GeGLU MLP (gelu_pytorch_tanh gate),
    q/k norms, four norms per block, tied embeddings, vocab 262208 by default; block i global
    when (i + 1) % sliding_window_pattern == 0, the others a sliding window."""
    config = _text_config(config)
    if config.get("layer_types"):
        raise PlanInputError("layer_types", "explicit per-layer lists are not representable; "
                                            "allowed: sliding_window_pattern")
    defaults = {  # Gemma3TextConfig class defaults (transformers 5.23 configuration_gemma3.py)
        "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "max_position_embeddings": 131_072, "tie_word_embeddings": True}
    config = {**defaults, **{k: v for k, v in config.items() if v is not None}}
    fields = _llama_like(config, tie_default=True)
    if bool(config.get("attention_bias")):
        raise PlanInputError("attention_bias", "True is not representable for Gemma 3")
    fields.update(
        qk_norm=True, sandwich_norms=True, gate_activation="gelu_tanh",
        local_window=_int(config, "sliding_window", 4096),
        global_layer_step=_int(config, "sliding_window_pattern", 6),
    )
    return fields


def _bert(config: Config) -> Config:
    """BertConfig -> BertModel: word + position + token-type embeddings, embedding LayerNorm,
    post-norm blocks, pooler; no final norm. The MLM head (BertForMaskedLM) is not counted."""
    return {
        "arch": "encoder",
        **_standard_dims(config),
        "type_vocab_size": _int(config, "type_vocab_size", 2),
        "embedding_norm": True,
        "pooler": True,
        "final_norm": False,
        "tied_embeddings": True,
        "dropout": _any_dropout(config, "hidden_dropout_prob", "attention_probs_dropout_prob",
                                default=0.1),
    }


_FAMILIES: dict[str, Callable[[Config], Config]] = {
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "opt": _opt,
    "llama": _llama,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "deepseek": _deepseek,
    "deepseek_v2": _deepseek_mla,
    "deepseek_v3": _deepseek_mla,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "llama4": _llama4,
    "llama4_text": _llama4,
    "gemma3": _gemma3,
    "gemma3_text": _gemma3,
    "bert": _bert,
}
