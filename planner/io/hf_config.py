"""Read a Hugging Face `config.json` into a `ModelSpec` (local files only, no hub access).

One small mapping function per `model_type`. Defaults follow the transformers configuration
classes (`configuration_<model>.py`) where a key is absent: `num_key_value_heads` -> heads,
`head_dim` -> hidden / heads, `n_inner: null` -> 4h, and `tie_word_embeddings` per class
(PretrainedConfig's default True for GPT-2, OPT, BERT; False for GPT-NeoX, Llama, Mistral,
Qwen2, Mixtral, Qwen2-MoE). What `ModelSpec` cannot express exactly raises `PlanInputError`
naming the key; the one named approximation (Qwen2-MoE's shared-expert gate) is written into
the spec's `source` and documented in docs/io.md.
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


def _qwen2_moe(config: Config) -> Config:
    """Qwen2MoeConfig: routed experts of moe_intermediate_size plus one shared expert.

    The shared expert of width S counts as S / moe_intermediate_size shared experts (same
    3·h·S parameters). Its sigmoid gate `shared_expert_gate` (h x 1 per layer) has no spec
    field: it is left out and named in the spec's source (an approximation of h per layer).
    """
    layers = _int(config, "num_hidden_layers")
    sparse_step = _int(config, "decoder_sparse_step", 1)
    if sparse_step != 1 or config.get("mlp_only_layers"):
        raise PlanInputError(
            "decoder_sparse_step",
            f"decoder_sparse_step={sparse_step}, mlp_only_layers={config.get('mlp_only_layers')}: "
            "dense and MoE layers mixed are not representable (needs a spec field for dense layers)",
        )
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
    )
    if shared:
        fields["_note"] = (
            f"approximation: shared_expert_gate ({fields['hidden_size']} x 1 per layer, "
            f"{layers * fields['hidden_size']:,} parameters in all) is not counted"
        )
    return fields


def _deepseek(config: Config) -> Config:
    """DeepSeek-MoE style keys (model_type deepseek): n_routed_experts, n_shared_experts,
    moe_intermediate_size, first_k_dense_replace, moe_layer_freq. MHA attention."""
    if _int(config, "first_k_dense_replace", 0) or _int(config, "moe_layer_freq", 1) != 1:
        raise PlanInputError(
            "first_k_dense_replace",
            f"first_k_dense_replace={config.get('first_k_dense_replace')}, moe_layer_freq="
            f"{config.get('moe_layer_freq', 1)}: dense layers before/between MoE layers are not "
            "representable (needs a spec field for the number of dense layers)",
        )
    fields = _llama(config)
    fields.update(
        num_experts=_int(config, "n_routed_experts"),
        experts_per_token=_int(config, "num_experts_per_tok"),
        expert_ffn_hidden_size=_int(config, "moe_intermediate_size"),
        num_shared_experts=_int(config, "n_shared_experts", 0),
    )
    return fields


def _deepseek_mla(config: Config) -> Config:
    """DeepSeek-V2/V3 use multi-head latent attention (kv_lora_rank): no spec field for it."""
    raise PlanInputError(
        "model_type",
        f"{config.get('model_type')} uses multi-head latent attention (kv_lora_rank="
        f"{config.get('kv_lora_rank')}), which the model spec cannot represent",
    )


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
    "bert": _bert,
}
