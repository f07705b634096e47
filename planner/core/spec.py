"""Typed inputs of the planner: what is trained, on what, laid out how, with which setup.

Four inputs kept apart (calculon's Application / System / Execution split,
docs/references.md#paper-calculon): `ModelSpec` + `Cluster` + `Layout` + `TrainSetup`. All are
frozen pydantic models with `extra="forbid"`; hardware numbers come from YAML in
`hardware_profiles/` with a source each.
YAML keys carry their unit (`memory_gib`, `nvlink_gb_per_s`); SI values are exposed as
properties with the unit in the name (`memory_bytes`, `intra_node_bytes_per_s`).
Cross-field rules raise `ValueError` messages that name every factor involved.
Seed and paper citations: docs/references.md
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import Annotated, Any, Literal, Self, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from planner.core.field_docs import describe_fields
from planner.core.limits import (MAX_BUCKET_ELEMENTS, MAX_LATENCY_US, MAX_LAYERS, MAX_MEMORY_GIB,
                                 MAX_NVME_TB, MAX_RANKS, MAX_SEQ_LEN, MAX_SEQUENCES, MAX_TOKENS,
                                 MIN_EFFICIENCY, MIN_PARAMS_PER_S, MIN_PEAK_TFLOPS,
                                 MIN_RATE_GB_PER_S)

GIB = 1024**3
MIB = 1024**2
KIB = 1024
GB = 10**9
TB = 10**12
US = 1e-6


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for integers, exact (no float): DeepSpeed partitions, vocab rows per tp rank."""
    return -(-a // b)


Dtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8"]
OffloadTarget = Literal["none", "cpu", "nvme"]
RecomputeMode = Literal["none", "selective", "full", "every_k", "block"]
TempoTechnique = Literal["gelu", "layernorm", "dropout"]
CpCommType = Literal["p2p", "a2a"]


class Frozen(BaseModel):
    """Base: frozen, unknown keys rejected, docstrings become field descriptions (in the JSON
    Schemas; read when a schema is built, not at import: planner/core/field_docs.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=describe_fields,
                              defer_build=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: object, info: ValidationInfo) -> object:
        """`tp: true` is not 1: a boolean where the field takes no boolean is an error
        (pydantic's lax mode would read True as 1)."""
        if isinstance(value, bool) and info.field_name is not None:
            if _refuses_bool(cls.model_fields[info.field_name].annotation):
                raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
        return value

    @classmethod
    def computed(cls, **values: Any) -> Self:
        """An instance from values the planner computed (a result: a memory plan, a step-time
        breakdown, a parameter count), not from user input: pydantic's `model_construct`, no
        validation, so a result class's validator is built only if a JSON document is written.
        Building them cost `zplan fit` some 4.5 ms of its ~60 ms own work (issue 9,
        docs/cli_latency.md). Names the class does not have are refused here, since
        `model_construct` would drop them without a word. tests/test_computed_results.py
        re-validates every result that fit, check and sweep build and checks that each value
        already has the type validation would give it."""
        cls._refuse_unknown(values)
        return cls.model_construct(**values)

    @classmethod
    def _refuse_unknown(cls, values: dict[str, Any]) -> None:
        """TypeError for a name the class does not have (the unvalidated constructors would
        drop it without a word)."""
        unknown = values.keys() - cls.__pydantic_fields__.keys()
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {', '.join(sorted(unknown))}")

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: object) -> None:
        """Attach `_no_bool_for_number` only to the fields it can refuse (numbers that are not
        booleans), not to all of them: on every other field it returns its input unchanged,
        and each validated field costs schema-building time at the first validation (about
        40 % of it: issue 9, command latency). Same predicate as the validator's, evaluated
        once; a class with an unresolved annotation keeps the validator on every field."""
        super().__pydantic_init_subclass__(**kwargs)
        validators = cls.__pydantic_decorators__.field_validators
        decorator = validators.get("_no_bool_for_number")
        if decorator is None or not getattr(cls, "__pydantic_fields_complete__", False):
            return
        numbers = tuple(name for name, info in cls.model_fields.items() if _refuses_bool(info.annotation))
        if numbers:
            validators["_no_bool_for_number"] = dataclasses.replace(
                decorator, info=dataclasses.replace(decorator.info, fields=numbers))
        else:
            del validators["_no_bool_for_number"]


def _refuses_bool(annotation: object) -> bool:
    """True when `_no_bool_for_number` refuses a boolean for a field of this type."""
    allowed = _leaf_types(annotation)
    return bool not in allowed and (int in allowed or float in allowed)


def _leaf_types(annotation: object) -> set[object]:
    """The plain types inside Optional[...] / Union[...] / Annotated[...] (Literal values too)."""
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return {type(arg) for arg in args}
    if not args:
        return {annotation}
    return set().union(*(_leaf_types(arg) for arg in args))


# --------------------------------------------------------------------------- model


_MODEL_HASHES: dict[int, tuple[int, weakref.ref]] = {}
"""`ModelSpec.__hash__` of each live instance by id, with the weak reference whose callback
forgets it when the instance is freed (a plain weakref: `weakref.finalize` would register an
exit handler, and `planner.cli.app.console` ends numpy-only commands with `os._exit`)."""


class ModelSpec(Frozen):
    """What is trained: a decoder (GPT, Llama, Mistral, Mixtral, Qwen3, DeepSeek-V3, Llama 4,
    Gemma 3) or an encoder (BERT). Fields after `sliding_window` describe issue 13's models; their
    defaults leave every earlier model's counts unchanged.

    Sizes are bounded (layers <= 100,000; hidden and heads <= 1M; MLP width <= 10M; vocabulary and
    context <= 100M tokens; experts <= 100,000): far past 100T-parameter models and 10M-token
    contexts, and small enough that every formula runs in bounded time with exact integers or
    float64 columns (a hostile `num_layers: 1e18` is one line, exit 2, instead of a hang)."""

    name: str
    """Short identifier, e.g. `gpt3-175b`."""
    arch: Literal["decoder", "encoder"] = "decoder"
    """`decoder` (causal LM, GPT/Llama) or `encoder` (BERT: token-type embeddings, embedding norm)."""
    num_layers: int = Field(gt=0, le=MAX_LAYERS)
    """Transformer blocks (nl, L)."""
    hidden_size: int = Field(gt=0, le=1_000_000)
    """Model width (hd, h)."""
    num_heads: int = Field(gt=0, le=1_000_000)
    """Query attention heads (a)."""
    num_kv_heads: int | None = Field(default=None, gt=0)
    """Key/value heads for grouped-query attention; None means equal to `num_heads` (MHA)."""
    head_dim: int | None = Field(default=None, gt=0)
    """Per-head width; None means `hidden_size / num_heads`."""
    ffn_hidden_size: int = Field(gt=0, le=10_000_000)
    """MLP inner width (4h for GPT; 11008 for Llama-2-7B). For MoE models: the dense-layer width."""
    vocab_size: int = Field(gt=0, le=100_000_000)
    """Vocabulary rows of the embedding matrix (V), as the checkpoint stores them (padded if so)."""
    max_seq_len: int = Field(gt=0, le=MAX_SEQ_LEN)
    """Longest sequence the model supports (learned position-embedding rows)."""
    mlp: Literal["gelu", "swiglu"] = "gelu"
    """`gelu`: two matrices h->f->h; `swiglu`: gated, three matrices (gate, up, down)."""
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    """LayerNorm (weight and bias) or RMSNorm (weight only)."""
    position: Literal["learned", "rotary"] = "learned"
    """Learned absolute position embeddings (max_seq_len x h) or rotary (no parameters)."""
    tied_embeddings: bool = True
    """Output projection shares the input embedding matrix (one V x h) or not (two)."""
    linear_bias: bool = True
    """Biases on every linear layer of the blocks (GPT-2/3, BERT: yes; Llama: no)."""
    qkv_bias: bool = False
    """Bias on the Q, K, V projections only, even when `linear_bias` is off (Qwen2)."""
    lm_head_bias: bool = False
    """Bias on the output projection (rare)."""
    final_norm: bool = True
    """A norm after the last block (GPT-2 ln_f, Llama norm). BERT has none."""
    dropout: bool = True
    """Dropout after attention probabilities and after each residual branch (GPT-3 yes, Llama no)."""
    type_vocab_size: int = Field(default=0, ge=0)
    """Encoder only: token-type (segment) embedding rows (BERT: 2)."""
    embedding_norm: bool = False
    """Encoder only: a LayerNorm right after the embeddings (BERT)."""
    pooler: bool = False
    """Encoder only: the pooler dense layer h x h + bias (BERT's BertModel)."""
    num_experts: int = Field(default=0, ge=0, le=100_000)
    """Mixture-of-experts: routed experts per MoE layer; 0 means a dense model."""
    experts_per_token: int = Field(default=0, ge=0)
    """Mixture-of-experts: routed experts active per token (top-k)."""
    expert_ffn_hidden_size: int | None = Field(default=None, gt=0)
    """Mixture-of-experts: inner width of each expert; None means `ffn_hidden_size`."""
    num_shared_experts: int = Field(default=0, ge=0)
    """Mixture-of-experts: always-active shared experts (DeepSeek / Qwen-MoE style)."""
    sliding_window: int | None = Field(default=None, gt=0)
    """Attention window in tokens on EVERY layer (Mistral); None means full causal attention.
    Models mixing local and global layers use `local_window` instead."""
    first_dense_layers: int = Field(default=0, ge=0)
    """MoE: the first k blocks keep a dense MLP of `ffn_hidden_size` (DeepSeek
    `first_k_dense_replace`: DeepSeek-V3 3). 0 keeps every block an MoE block."""
    moe_layer_step: int = Field(default=1, gt=0)
    """MoE: block i (0-based) is an MoE block when i >= first_dense_layers and
    (i + 1) % moe_layer_step == 0; the others are dense (Llama 4 `interleave_moe_layer_step`,
    Qwen2-MoE `decoder_sparse_step`; Maverick 2: blocks 1, 3, 5, ... are MoE)."""
    shared_expert_gate: bool = False
    """MoE: a sigmoid gate h x 1 (no bias) scales the shared experts' output (Qwen2-MoE)."""
    mtp_modules: int = Field(default=0, ge=0)
    """DeepSeek-V3 multi-token prediction modules (`num_nextn_predict_layers`), counted apart
    from the main model: each is one MoE block + a 2h x h projection + three RMSNorms; it
    shares the embedding and output head (DeepSeek-V3 report §2.2). transformers does not
    build them; 0 for every other model."""
    q_lora_rank: int | None = Field(default=None, gt=0)
    """Multi-head latent attention: rank of the query down-projection (q_a_proj h x r_q, an
    RMSNorm over r_q, q_b_proj r_q x a*(nope + rope)); None: one query projection
    h x a*(nope + rope) (DeepSeek-V2-Lite). Only with `kv_lora_rank`."""
    kv_lora_rank: int | None = Field(default=None, gt=0)
    """Multi-head latent attention (DeepSeek-V2/V3): width of the compressed key/value latent
    (kv_a_proj_with_mqa h x (r_kv + rope), an RMSNorm over r_kv, kv_b_proj
    r_kv x a*(nope + v)). None means standard (MHA/GQA) attention."""
    qk_nope_head_dim: int = Field(default=0, ge=0)
    """MLA: per-head query/key width without rotary embedding (DeepSeek-V3 128)."""
    qk_rope_head_dim: int = Field(default=0, ge=0)
    """MLA: per-head query width with rotary embedding; the key's rope part (this width) is
    shared by all heads (DeepSeek-V3 64)."""
    v_head_dim: int = Field(default=0, ge=0)
    """MLA: per-head value width (DeepSeek-V3 128)."""
    qk_norm: bool = False
    """An RMSNorm over head_dim on the queries and one on the keys (weights 2 x head_dim per
    block; Qwen3, Gemma 3). Llama 4's weightless L2 norm is not this."""
    sandwich_norms: bool = False
    """Two more norms per block, after attention and after the MLP (Gemma 2/3: four norms)."""
    gate_activation: Literal["silu", "gelu_tanh"] = "silu"
    """Activation of the gated MLP's gate (`mlp: swiglu` means gated, three matrices): SiLU
    (Llama) or tanh-approximated GELU (Gemma's GeGLU). Same parameters and matmul FLOPs."""
    local_window: int | None = Field(default=None, gt=0)
    """Interleaved local/global attention: tokens a local layer attends to (Gemma 3
    `sliding_window` 1024; Llama 4 `attention_chunk_size` 8192). None: every layer global."""
    local_attention: Literal["sliding", "chunked"] = "sliding"
    """Local layers' kind: a sliding window of the last `local_window` tokens (Gemma 3), or
    attention within fixed chunks of `local_window` tokens (Llama 4 chunked attention)."""
    global_layer_step: int = Field(default=1, gt=0)
    """With `local_window`: block i (0-based) is global (full causal attention) when
    (i + 1) % global_layer_step == 0, local otherwise (Gemma 3 `sliding_window_pattern` 6,
    Llama 4 `no_rope_layer_interval` 4)."""
    published_params: int | None = Field(default=None, gt=0)
    """The official total parameter count, when the model's authors give an exact one."""
    source: str = ""
    """Where the dimensions come from (paper table, config.json)."""

    def __hash__(self) -> int:
        """Computed once per instance (frozen: the fields never change), where pydantic hashes
        the tuple of ~45 fields at every call (~0.6 us): a sweep looks the model up in its
        per-key caches (`functools.lru_cache`) 200-400 times. The same value as pydantic's (the
        fields' tuple), so equal models hash equal; forgotten when the instance is freed."""
        key = id(self)
        known = _MODEL_HASHES.get(key)
        if known is not None:
            return known[0]
        value = hash(tuple(self.__dict__[name] for name in type(self).model_fields))
        _MODEL_HASHES[key] = (value, weakref.ref(self, lambda _, key=key: _MODEL_HASHES.pop(key, None)))
        return value

    @property
    def kv_heads(self) -> int:
        """Key/value heads, MHA when not given."""
        return self.num_kv_heads or self.num_heads

    @property
    def head_size(self) -> int:
        """Per-head width."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def expert_ffn_size(self) -> int:
        """Inner width of each routed or shared expert."""
        return self.expert_ffn_hidden_size or self.ffn_hidden_size

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank is not None

    def layer_is_moe(self, layer: int) -> bool:
        """Block `layer` (0-based) has an MoE MLP (first_dense_layers, moe_layer_step)."""
        return (self.is_moe and layer >= self.first_dense_layers
                and (layer + 1) % self.moe_layer_step == 0)

    @property
    def num_moe_layers(self) -> int:
        """Blocks with an MoE MLP; the other num_layers - num_moe_layers are dense. The count of
        `layer_is_moe` in closed form: block i is MoE when (i + 1) is a multiple of
        moe_layer_step in (first_dense_layers, num_layers], i.e. L // step - min(first, L) // step
        (constant time: the sweep asks for it once per tp rule check)."""
        if not self.is_moe:
            return 0
        step, last = self.moe_layer_step, self.num_layers
        return last // step - min(self.first_dense_layers, last) // step

    def layer_is_local(self, layer: int) -> bool:
        """Block `layer` (0-based) attends only within `local_window` (interleaved local/global)."""
        return self.local_window is not None and (layer + 1) % self.global_layer_step != 0

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads}) unless head_dim is given"
            )
        if self.num_heads % self.kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.kv_heads})"
            )
        if self.is_moe and not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) must be between 1 and "
                f"num_experts ({self.num_experts})"
            )
        if not self.is_moe and (self.experts_per_token or self.num_shared_experts):
            raise ValueError("experts_per_token / num_shared_experts need num_experts > 0")
        if self.arch == "decoder" and (self.type_vocab_size or self.embedding_norm or self.pooler):
            raise ValueError("type_vocab_size, embedding_norm and pooler are for arch=encoder")
        _check_moe_placement(self)
        _check_mla(self)
        if self.local_window is not None and self.sliding_window is not None:
            raise ValueError(
                f"sliding_window ({self.sliding_window}) applies to every layer; with local_window "
                f"({self.local_window}) give only one of them")
        if self.local_window is None and (self.global_layer_step != 1 or self.local_attention != "sliding"):
            raise ValueError("global_layer_step / local_attention need local_window")
        if self.gate_activation != "silu" and self.mlp != "swiglu":
            raise ValueError(f"gate_activation={self.gate_activation} needs the gated MLP (mlp: swiglu)")
        return self


def _check_moe_placement(model: ModelSpec) -> None:
    """Dense-layer placement and MTP fields only make sense for MoE models (MTP: V3's block is MoE)."""
    moe_only = {"first_dense_layers": model.first_dense_layers != 0,
                "moe_layer_step": model.moe_layer_step != 1,
                "shared_expert_gate": model.shared_expert_gate,
                "mtp_modules": model.mtp_modules != 0}
    given = [name for name, set_ in moe_only.items() if set_]
    if given and not model.is_moe:
        raise ValueError(f"{', '.join(given)} need num_experts > 0")
    if model.is_moe and model.num_moe_layers == 0:
        raise ValueError(
            f"first_dense_layers ({model.first_dense_layers}) and moe_layer_step "
            f"({model.moe_layer_step}) leave no MoE block among num_layers ({model.num_layers})")
    if model.shared_expert_gate and not model.num_shared_experts:
        raise ValueError("shared_expert_gate needs num_shared_experts > 0")


def _check_mla(model: ModelSpec) -> None:
    """MLA needs its three head widths; its fields are meaningless without kv_lora_rank."""
    widths = {"qk_nope_head_dim": model.qk_nope_head_dim, "qk_rope_head_dim": model.qk_rope_head_dim,
              "v_head_dim": model.v_head_dim}
    if model.is_mla:
        missing = [name for name, value in widths.items() if value == 0]
        if missing:
            raise ValueError(f"kv_lora_rank (multi-head latent attention) needs {', '.join(missing)} > 0")
        if model.kv_heads != model.num_heads:
            raise ValueError(
                f"multi-head latent attention has one key/value per query head: num_kv_heads "
                f"({model.kv_heads}) must equal num_heads ({model.num_heads})")
        if model.qkv_bias:
            raise ValueError("qkv_bias is not defined for multi-head latent attention")
    elif model.q_lora_rank is not None or any(widths.values()):
        raise ValueError("q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim need kv_lora_rank")


# --------------------------------------------------------------------------- hardware


class GemmPoint(Frozen):
    """One GEMM C[m x n] = A[m x k] · B[k x n] in `dtype` that ran at `efficiency` x the GPU's
    dense peak for that dtype: a published measurement, or one made by `zplan calibrate hardware`
    (planner/calibrate/hardware.py). planner.timing.gemm interpolates between points."""

    dtype: Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
    m: int
    n: int
    k: int
    efficiency: float
    source: str


class CollectivePoint(Frozen):
    """One collective fitted to t(bytes) = latency + bytes / algbw, measured through
    torch.distributed by `zplan calibrate hardware`. `bus_gb_per_s` is nccl-tests' bus bandwidth
    (NVIDIA/nccl-tests doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for
    all-gather / reduce-scatter / all-to-all, x 1 for send/recv), `bytes` being nccl-tests' size."""

    op: Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
    level: Literal["intra", "inter"]
    """`intra`: ranks within one node; `inter`: one rank per node, across nodes."""
    ranks: int = Field(gt=0)
    latency_us: float = Field(ge=0, le=MAX_LATENCY_US)
    bus_gb_per_s: float = Field(ge=MIN_RATE_GB_PER_S)
    source: str


class Fsdp2GroupPoint(Frozen):
    """FSDP2's cost per parameter group per step as FSDP2 calls its collectives (copies, hooks and
    waits included), measured by `zplan calibrate hardware` (planner.calibrate.fsdp2_collectives):
    t(group bytes) = latency + group bytes / group bandwidth."""

    schedule: Literal["block", "root"]
    """`block`: resharded after forward (two all-gathers, one reduce-scatter); `root`: gathered once."""
    ranks: int = Field(gt=1)
    latency_us: float = Field(ge=0, le=MAX_LATENCY_US)
    group_gb_per_s: float = Field(ge=MIN_RATE_GB_PER_S)
    """Parameter bytes of the group per second of the fitted slope, GB/s."""
    source: str


class GpuSpec(Frozen):
    """One accelerator. Every number has a `sources` entry (vendor sheet)."""

    name: str
    """Identifier, e.g. `a100-80gb`."""
    memory_gib: float = Field(gt=0, le=MAX_MEMORY_GIB)
    """HBM capacity in GiB (2^30 bytes)."""
    peak_tflops: dict[Dtype, Annotated[float, Field(ge=MIN_PEAK_TFLOPS)]]
    """Dense (no 2:4 sparsity) peak tensor throughput per dtype, in TFLOP/s (10^12)."""
    hbm_gb_per_s: float = Field(ge=MIN_RATE_GB_PER_S)
    """HBM bandwidth in GB/s (10^9 bytes/s)."""
    achieved_efficiency: float = Field(default=0.5, ge=MIN_EFFICIENCY, le=1)
    """Fraction of dense peak the large matmuls (GEMMs) of a training step achieve. The step-time
    model adds memory-bound element-wise kernels, the optimizer step, communication and the
    pipeline bubble on top, so this is above an end-to-end MFU (A100: 0.628 fitted to Narayanan
    et al. 2021 Table 1 by benchmarks/published_runs.py; docs/accuracy.md). Replaced by
    `zplan calibrate` measurements via `--calibration`."""
    end_to_end_utilisation: float | None = Field(default=None, gt=0, le=1)
    """Fraction of dense peak a published end-to-end training run reached on this GPU, counting
    the FLOPs it executed (recompute included, as the seed's k = 8 does): the default utilisation
    of `zplan budget`, which has no layout to run the step-time model on."""
    gemm_efficiency: tuple[GemmPoint, ...] = ()
    """Achieved GEMM efficiencies by shape and dtype, each point with its own source (the step
    model's per-GEMM efficiency, planner.timing.gemm): published measurements in the shipped
    profiles, measured ones from `zplan calibrate hardware`; empty when none is known."""
    usable_memory_gib: float | None = Field(default=None, gt=0, le=MAX_MEMORY_GIB)
    """Device memory CUDA reports to a process as the total, GiB as PyTorch prints it (two
    decimals): `torch.cuda.mem_get_info()[1]`, the "total capacity" of PyTorch's OOM message and
    vLLM's `total_memory`. What a process can ever use; below nvidia-smi's total on recent
    drivers. None: not known (the runtime reserve then refuses to guess)."""
    cuda_context_mib: float | None = Field(default=None, ge=0)
    """Device memory the CUDA context of one PyTorch process takes outside the allocator, MiB
    (driver, loaded kernels; lazy module loading since CUDA 11.7). None: not known."""
    cublas_workspace_kib: int | None = Field(default=None, ge=0)
    """PyTorch's default cuBLAS workspace per (handle, stream) on this architecture, KiB
    (aten/src/ATen/cuda/CublasHandlePool.cpp `parseChosenWorkspaceSize`). None: not known."""
    sm_count: int | None = Field(default=None, gt=0)
    """Streaming multiprocessors (vendor whitepaper): the share an overlapped NCCL collective's
    CTAs take from compute (planner/timing/interference.py). None: not known (no interference
    modelled)."""
    sources: dict[str, str]
    """Citation for each numeric field, keyed by field name."""

    @property
    def memory_bytes(self) -> int:
        return int(round(self.memory_gib * GIB))

    @property
    def usable_memory_bytes(self) -> int | None:
        """The CUDA-reported total in bytes (to the 0.005 GiB the figure is printed with), or
        None when the profile does not give it."""
        if self.usable_memory_gib is None:
            return None
        return int(round(self.usable_memory_gib * GIB))

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gb_per_s * GB

    def peak_flops_per_s(self, dtype: Dtype) -> float:
        """Dense peak FLOP/s for a dtype; a missing dtype is an input error."""
        if dtype not in self.peak_tflops:
            raise ValueError(
                f"gpu {self.name} has no peak_tflops for {dtype}; has {sorted(self.peak_tflops)}"
            )
        return self.peak_tflops[dtype] * 1e12

    @model_validator(mode="after")
    def _sources(self) -> GpuSpec:
        fields = ("memory_gib", "peak_tflops", "hbm_gb_per_s", "achieved_efficiency")
        optional = ("end_to_end_utilisation", "usable_memory_gib", "cuda_context_mib",
                    "cublas_workspace_kib")
        fields += tuple(name for name in optional if getattr(self, name) is not None)
        _require_sources(self, fields)
        return self


class NodeSpec(Frozen):
    """A server: GPUs of one kind, their intra-node link, host memory, local NVMe."""

    name: str
    """Identifier, e.g. `dgx-a100`."""
    gpu: str
    """Name of the GPU profile (a file in hardware_profiles/gpus/)."""
    gpus_per_node: int = Field(gt=0, le=100_000)
    """GPUs in one node."""
    intra_node_gb_per_s: float = Field(ge=MIN_RATE_GB_PER_S)
    """GPU-to-GPU bandwidth per GPU per direction inside the node (NVLink/NVSwitch or PCIe), GB/s."""
    intra_node_latency_us: float = Field(ge=0, le=MAX_LATENCY_US)
    """Latency of one intra-node message, microseconds (alpha of the alpha-beta model)."""
    pcie_gb_per_s: float = Field(ge=MIN_RATE_GB_PER_S)
    """Host-to-device bandwidth per GPU per direction (offload traffic), GB/s."""
    cpu_memory_gib: float = Field(ge=0, le=MAX_MEMORY_GIB)
    """Host DRAM per node, GiB."""
    nvme_capacity_tb: float = Field(default=0, ge=0, le=MAX_NVME_TB)
    """Local NVMe capacity per node, TB (10^12 bytes)."""
    nvme_read_gb_per_s: float = Field(default=0, ge=0)
    """Aggregate NVMe read bandwidth per node, GB/s."""
    nvme_write_gb_per_s: float = Field(default=0, ge=0)
    """Aggregate NVMe write bandwidth per node, GB/s."""
    cpu_adam_params_per_s: float = Field(default=1e9, ge=MIN_PARAMS_PER_S)
    """Optimizer step throughput of the host CPUs for offloaded Adam, parameters per second."""
    collectives: tuple[CollectivePoint, ...] = ()
    """Measured intra-node collectives (`zplan calibrate hardware`), each with its own source."""
    fsdp2_hook_us: float | None = Field(default=None, ge=0, le=MAX_LATENCY_US)
    """FSDP2's overhead per hook (four per parameter group per step), microseconds (`zplan calibrate hardware`)."""
    dispatch_per_op_us: float | None = Field(default=None, ge=0, le=MAX_LATENCY_US)
    """Python + autograd overhead per op of a real forward + backward, microseconds (`zplan calibrate hardware`)."""
    fsdp2_groups: tuple[Fsdp2GroupPoint, ...] = ()
    """FSDP2 per-group cost as called, each with its own source (`zplan calibrate hardware`)."""
    sources: dict[str, str]
    """Citation for each numeric field, keyed by field name."""

    @property
    def intra_node_bytes_per_s(self) -> float:
        return self.intra_node_gb_per_s * GB

    @property
    def pcie_bytes_per_s(self) -> float:
        return self.pcie_gb_per_s * GB

    @property
    def cpu_memory_bytes(self) -> int:
        return int(round(self.cpu_memory_gib * GIB))

    @property
    def nvme_bytes(self) -> int:
        return int(round(self.nvme_capacity_tb * TB))

    @model_validator(mode="after")
    def _nvme_rates(self) -> NodeSpec:
        """0 means no NVMe figures (NVMe offload is then refused); a rate is at least
        MIN_RATE_GB_PER_S, like every other bandwidth (planner/core/limits.py)."""
        for field in ("nvme_read_gb_per_s", "nvme_write_gb_per_s"):
            rate = getattr(self, field)
            if 0 < rate < MIN_RATE_GB_PER_S:
                raise ValueError(f"{field}={rate}: 0 (no NVMe figures) or at least "
                                 f"{MIN_RATE_GB_PER_S} GB/s")
        return self

    @model_validator(mode="after")
    def _sources(self) -> NodeSpec:
        _require_sources(
            self,
            ("gpus_per_node", "intra_node_gb_per_s", "intra_node_latency_us", "pcie_gb_per_s",
             "cpu_memory_gib")
            + tuple(f for f in ("fsdp2_hook_us", "dispatch_per_op_us") if getattr(self, f) is not None),
        )
        return self


class ClusterSpec(Frozen):
    """A cluster file: `num_nodes` copies of a node and the network between them."""

    name: str
    """Identifier, e.g. `dgx2x32`."""
    node: str
    """Name of the node profile (a file in hardware_profiles/nodes/)."""
    num_nodes: int = Field(gt=0, le=1_000_000)
    """Nodes in the cluster."""
    inter_node_gb_per_s: float = Field(ge=MIN_RATE_GB_PER_S)
    """Network bandwidth per node per direction (sum of its NICs), GB/s."""
    inter_node_latency_us: float = Field(ge=0, le=MAX_LATENCY_US)
    """Latency of one inter-node message, microseconds."""
    collectives: tuple[CollectivePoint, ...] = ()
    """Measured inter-node collectives (`zplan calibrate hardware` under torchrun), with sources."""
    sources: dict[str, str]
    """Citation for each numeric field, keyed by field name."""

    @model_validator(mode="after")
    def _sources(self) -> ClusterSpec:
        _require_sources(self, ("inter_node_gb_per_s", "inter_node_latency_us"))
        return self


class Cluster(Frozen):
    """Resolved hardware: the GPU, the node and the cluster, ready for the formulas."""

    name: str
    """The cluster's (or node's) name."""
    gpu: GpuSpec
    """The GPU of every node."""
    node: NodeSpec
    """The node, repeated `num_nodes` times."""
    num_nodes: int = Field(gt=0, le=1_000_000)
    """Nodes in the cluster."""
    inter_node_gb_per_s: float = Field(ge=MIN_RATE_GB_PER_S)
    """Network bandwidth per node per direction, GB/s."""
    inter_node_latency_us: float = Field(ge=0, le=MAX_LATENCY_US)
    """Latency of one inter-node message, microseconds."""

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.node.gpus_per_node

    @property
    def inter_node_bytes_per_s(self) -> float:
        return self.inter_node_gb_per_s * GB


def _require_sources(obj: BaseModel, fields: tuple[str, ...]) -> None:
    sources = getattr(obj, "sources")
    missing = [f for f in fields if f not in sources]
    if missing:
        raise ValueError(f"sources: missing a citation for {', '.join(missing)}")


# --------------------------------------------------------------------------- layout


class EngineBuffers(Frozen):
    """Sizes of the engines' temporary GPU buffers, as the user's config sets them.

    Defaults are the engines' own: DeepSpeed deepspeed/runtime/zero/config.py
    (DeepSpeedZeroConfig; `pp_int(5e8)` etc.) and PyTorch DDP's `bucket_cap_mb`
    (torch/nn/parallel/distributed.py `_DEFAULT_BUCKET_CAP_MB = 25`). Element counts are of the
    buffer's dtype (planner.model_states says which). Accepts 5e8 and YAML's "5e8" string form.
    Bounds are DeepSpeedZeroConfig's: reduce_bucket_size > 0, the other four >= 0 (0 turns
    prefetching / persistence off); DDP's bucket > 0.
    """

    reduce_bucket_elements: int = Field(default=500_000_000, gt=0, le=MAX_BUCKET_ELEMENTS)
    """DeepSpeed `zero_optimization.reduce_bucket_size`, elements; default 5e8."""
    allgather_bucket_elements: int = Field(default=500_000_000, ge=0, le=MAX_BUCKET_ELEMENTS)
    """DeepSpeed `zero_optimization.allgather_bucket_size`, elements; default 5e8 (ZeRO-1/2)."""
    prefetch_bucket_elements: int = Field(default=50_000_000, ge=0, le=MAX_BUCKET_ELEMENTS)
    """DeepSpeed `zero_optimization.stage3_prefetch_bucket_size`, elements; default 5e7."""
    max_live_parameters: int = Field(default=1_000_000_000, ge=0, le=MAX_BUCKET_ELEMENTS)
    """DeepSpeed `zero_optimization.stage3_max_live_parameters`, elements; default 1e9."""
    param_persistence_threshold: int = Field(default=100_000, ge=0, le=MAX_BUCKET_ELEMENTS)
    """DeepSpeed `zero_optimization.stage3_param_persistence_threshold`, elements; default 1e5:
    ZeRO-3 keeps tensors of at most this many elements whole on every GPU."""
    ddp_bucket_bytes: int = Field(default=25 * 1024 * 1024, gt=0, le=MAX_BUCKET_ELEMENTS)
    """PyTorch DDP `bucket_cap_mb` x 1024 x 1024, bytes; default 25 MiB (26,214,400)."""

    @field_validator("*", mode="before")
    @classmethod
    def _whole_number(cls, value: object) -> object:
        """5e8 (float) and "5e8" (YAML 1.1 reads it as a string) as the integer 500000000."""
        if isinstance(value, bool):
            raise ValueError(f"must be a whole number, got {value!r}")
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"must be a whole number, got {value!r}") from None
            value = number
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value


MegatronOverlap = Literal["tp_comm", "grad_reduce", "param_gather"]
"""Megatron-Core overlaps (Layout.megatron_overlap)."""


class Layout(Frozen):
    """How the job is laid out on the cluster (the Execution of calculon)."""

    tp: int = Field(default=1, gt=0, le=MAX_RANKS)
    """Tensor-parallel degree (t). Must divide heads and kv heads."""
    pp: int = Field(default=1, gt=0, le=MAX_RANKS)
    """Pipeline-parallel degree (p). At most the number of layers."""
    dp: int = Field(default=1, gt=0, le=MAX_RANKS)
    """Data-parallel degree (Nd): ranks that see different sequences. ZeRO / the distributed
    optimizer partitions over dp x cp ranks (Megatron's data-and-context-parallel group)."""
    dp_shard: int | None = Field(default=None, gt=0, le=MAX_RANKS)
    """HSDP shard group size: states sharded over dp_shard ranks and replicated over
    dp / dp_shard groups (torch 2.13 `fully_shard(mesh=2-D (replicate, shard))`; FSDP1
    `ShardingStrategy.HYBRID_SHARD` / `_HYBRID_SHARD_ZERO2`). None: the whole dp group. Must
    divide dp; needs dp_engine fsdp2 (rules.py; docs/collectives.md "HSDP")."""
    ep: int = Field(default=1, gt=0, le=MAX_RANKS)
    """Expert-parallel degree (Megatron `--expert-model-parallel-size`): the routed experts of
    every MoE layer are split over `ep` ranks carved out of the dp ranks (Megatron-Core
    parallel_state.py: expert dp = tp·dp / (etp·ep) with expert tp = tp); the expert weights'
    gradients and optimizer states are sharded over the dp / ep expert-data-parallel ranks.
    1 for dense models (planner.memory.experts, docs/moe.md)."""
    cp: int = Field(default=1, gt=0, le=MAX_RANKS)
    """Context-parallel degree (Megatron-LM `--context-parallel-size`; DeepSpeed Ulysses
    `sequence_parallel_size`): every sequence is split over cp ranks, world = tp x cp x pp x dp
    (planner/timing/context.py, docs/context_parallel.md)."""
    cp_comm_type: CpCommType = "p2p"
    """How attention sees the whole sequence under cp > 1 (Megatron `--cp-comm-type`): `p2p` ring
    attention (KV chunks passed peer to peer, overlapped with attention; the default) or `a2a`
    (Ulysses-style all-to-alls that trade the sequence split for a head split)."""
    virtual_stages: int = Field(default=1, gt=0, le=MAX_LAYERS)
    """Model chunks per pipeline rank for the interleaved 1F1B schedule (1 = plain 1F1B)."""
    first_stage_layers: int | None = Field(default=None, gt=0, le=MAX_LAYERS)
    """Blocks on the first pipeline stage, as Megatron-LM's `--decoder-first-pipeline-num-layers`
    (None: the even split); the middle stages share the rest evenly (params.layers_per_stage)."""
    last_stage_layers: int | None = Field(default=None, gt=0, le=MAX_LAYERS)
    """Blocks on the last pipeline stage, as `--decoder-last-pipeline-num-layers` (None: even)."""
    zero_stage: Literal[0, 1, 2, 3] = 0
    """0 = DDP; 1 = optimizer states partitioned; 2 = + gradients; 3 = + parameters."""
    dp_engine: Literal["deepspeed", "fsdp2"] = "deepspeed"
    """Who runs the sharded data parallelism: DeepSpeed ZeRO, or PyTorch FSDP2 (`fully_shard`),
    with zero_stage 3 = `reshard_after_forward=True` (re-gathered in backward) and 2 =
    `reshard_after_forward=False` (kept gathered from forward to backward); the step model
    follows each engine's schedule (planner/timing/sharded_dp.py). Memory: DeepSpeed's
    accounting of the same stage (a named approximation for FSDP2's unit buffers)."""
    offload_optimizer: OffloadTarget = "none"
    """Where optimizer states (and the fp32 master copy) live: GPU (`none`), `cpu` or `nvme`."""
    offload_params: OffloadTarget = "none"
    """Where the fp16/bf16 parameters live between uses; needs ZeRO-3."""
    recompute: RecomputeMode = "none"
    """Activation recompute: none; selective (attention core, Korthikanti et al.);
    full (keep each layer's input); every_k (keep the input of every k-th layer); block (the
    first `recompute_num_layers` blocks of each chunk fully recomputed, the rest keep all)."""
    recompute_every_k: int = Field(default=1, gt=0, le=MAX_LAYERS)
    """For `every_k`: layers per checkpointed segment (ZeRO-Infinity's ci)."""
    recompute_num_layers: int | None = Field(default=None, gt=0, le=MAX_LAYERS)
    """For `block` (Megatron-LM `--recompute-method block --recompute-num-layers n`): the first
    n blocks of every model chunk (each pipeline stage; each virtual chunk under interleaving)
    keep only their input and are recomputed, the others keep everything. A chunk of fewer
    than n blocks recomputes all of them, as Megatron does (megatron/core/recompute.py
    `checkpointed_forward`, method "block", commit d98e8a64: `layer_idx < recompute_num_layers`
    over the chunk's `num_layers_per_pipeline_rank = len(self.layers)`); n must not exceed the
    largest chunk (rule table). fms-fsdp / torchtitan's every-k-th-block AC over L blocks is
    n = floor(L / k) (docs/activations.md). Needed by `block`, refused with the other modes."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms and dropouts split over the tp ranks."""
    flash_attention: bool = True
    """Fused attention that saves no s x s tensors (keeps only softmax statistics). On by
    default: Megatron-Core with Transformer Engine (`--attention-backend auto` picks flash or
    fused attention), transformers' SDPA (the default attention) and FSDP recipes all run a
    fused kernel for causal LMs; false for the unfused (s x s) account of Korthikanti §4."""
    tempo: tuple[TempoTechnique, ...] = ()
    """Tempo (seed 003) techniques: in-place `gelu`, in-place `layernorm`, `dropout` recompute."""
    micro_batch: int = Field(default=1, gt=0, le=MAX_SEQUENCES)
    """Sequences per micro-batch per data-parallel rank (b)."""
    grad_accum: int = Field(default=1, gt=0, le=MAX_SEQUENCES)
    """Micro-batches per step per data-parallel rank (m, the pipeline's micro-batch count)."""
    buffers: EngineBuffers = EngineBuffers()
    """The engines' bucket sizes (DeepSpeed zero_optimization keys, DDP bucket_cap_mb)."""
    megatron_overlap: tuple[MegatronOverlap, ...] | None = None
    """Megatron-Core's overlaps switched on: `tp_comm` (--tp-comm-overlap), `grad_reduce`
    (--overlap-grad-reduce), `param_gather` (--overlap-param-gather); () = a Megatron run with
    its defaults, all off. None: not modelled as Megatron (gradients reduced behind backward,
    parameter all-gather and TP exposed). planner/timing/megatron_overlap.py."""

    @classmethod
    def trusted(cls, **fields: Any) -> Layout:
        """A Layout of values the rule table has already passed (`planner.core.rules`), built
        without validation: the default Layout with `fields` replaced (pydantic's `model_copy`,
        documented as unvalidated). The sweep builds its internal layouts this way; 1.6 us each
        against `model_construct`'s 11 us, which deep-copies the default of every field not
        given (the buffers model among them). Names Layout does not have are refused, as in
        `Frozen.computed`."""
        cls._refuse_unknown(fields)
        return _default_layout().model_copy(update=fields)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def recompute_label(self) -> str:
        """The recompute mode as reports show it: `block:n` with its count, else the mode."""
        return f"block:{self.recompute_num_layers}" if self.recompute == "block" else self.recompute

    @model_validator(mode="after")
    def _check(self) -> Layout:
        from planner.core.columns import CODED  # the rule table reads coded columns
        from planner.core.rules import layout_error

        ranks = self.tp * self.cp * self.pp * self.dp  # Python ints: exact
        if ranks > MAX_RANKS:
            raise ValueError(f"tp*cp*pp*dp = {self.tp}*{self.cp}*{self.pp}*{self.dp} = {ranks:,} "
                             f"ranks; at most {MAX_RANKS:,} (2^40)")
        sequences = self.micro_batch * self.grad_accum * self.dp
        if sequences > MAX_SEQUENCES:
            raise ValueError(f"micro_batch*grad_accum*dp = {self.micro_batch}*{self.grad_accum}*"
                             f"{self.dp} = {sequences:,} sequences per step; at most "
                             f"{MAX_SEQUENCES:,} (2^30)")

        fields = {name: getattr(self, name) for name in ("tp", "pp", "ep", "virtual_stages",
                                                         "zero_stage",
                                                         "offload_optimizer", "offload_params",
                                                         "sequence_parallel", "cp")}
        coded = {k: CODED[k].index(v) if k in CODED else int(v) for k, v in fields.items()}
        error = layout_error(coded)
        if error:
            raise ValueError(error)
        if (self.recompute == "block") != (self.recompute_num_layers is not None):
            raise ValueError(f"recompute_num_layers={self.recompute_num_layers} with recompute="
                             f"{self.recompute}: block needs it (the first n blocks of each "
                             "pipeline chunk recomputed), the other modes take none")
        if len(set(self.tempo)) != len(self.tempo):
            raise ValueError(f"tempo: techniques repeat {list(self.tempo)}")
        if self.megatron_overlap is not None:
            _check_megatron_overlap(self)
        if self.cp > 1 and not self.flash_attention:
            raise ValueError(f"cp={self.cp} needs flash_attention: Megatron runs context "
                             "parallelism only inside Transformer Engine's fused attention")
        return self


@functools.cache
def _default_layout() -> Layout:
    """Layout's defaults, built once (the template `Layout.trusted` copies)."""
    return Layout.model_construct()


def megatron_overlap_requires(overlap: tuple[str, ...]) -> tuple[tuple[int, ...], bool]:
    """(ZeRO stages, sequence parallelism needed) that Megatron runs `overlap` with
    (megatron/training/arguments.py at d98e8a64): its DDP (zero 0) or distributed optimizer
    (zero 1), only the latter for param_gather; tp_comm needs --sequence-parallel. Read by the
    Layout rule below and by the sweep's pins (`megatron_overlap.sweep_pins`)."""
    return ((1,) if "param_gather" in overlap else (0, 1)), "tp_comm" in overlap


def _check_megatron_overlap(layout: Layout) -> None:
    """Megatron-LM's own rules (`megatron_overlap_requires`)."""
    over = layout.megatron_overlap
    if len(set(over)) != len(over):
        raise ValueError(f"megatron_overlap: entries repeat {list(over)}")
    zeros, needs_sp = megatron_overlap_requires(over)
    if layout.zero_stage > 1 or layout.dp_engine != "deepspeed":
        raise ValueError("megatron_overlap: Megatron's DDP or distributed optimizer only "
                         f"(zero_stage 0 or 1, dp_engine deepspeed), got zero_stage "
                         f"{layout.zero_stage}, dp_engine {layout.dp_engine}")
    if needs_sp and not layout.sequence_parallel:  # which Megatron turns off at tp=1
        raise ValueError("megatron_overlap: tp_comm (--tp-comm-overlap) needs "
                         "sequence_parallel (--sequence-parallel, tp > 1)")
    if "param_gather" in over and (layout.zero_stage not in zeros or "grad_reduce" not in over):
        raise ValueError("megatron_overlap: param_gather (--overlap-param-gather) needs "
                         "zero_stage 1 (--use-distributed-optimizer) and grad_reduce "
                         "(--overlap-grad-reduce)")


# --------------------------------------------------------------------------- setup


class Optimizer(Frozen):
    """Optimizer state per parameter."""

    name: str
    """Identifier, e.g. `adam`."""
    num_states: int = Field(ge=0)
    """States per parameter: Adam/AdamW 2 (momentum, variance), SGD with momentum 1."""
    state_bytes: float = Field(gt=0)
    """Bytes per state element: 4 (fp32), 1 (8-bit Adam, plus `state_overhead_bytes`)."""
    state_overhead_bytes: float = Field(default=0, ge=0)
    """Extra bytes per parameter for quantization statistics (8-bit Adam block absmax)."""


class PrecisionRecipe(Frozen):
    """Bytes of every part of the model states, per parameter (docs/equations.md §2)."""

    name: str
    """Identifier, e.g. `zero-fp16`."""
    compute_dtype: Dtype
    """Dtype of the matmuls (selects the GPU's peak FLOP/s)."""
    param_bytes: int = Field(gt=0)
    """Working copy of each parameter (2 for fp16/bf16, 4 for fp32)."""
    grad_bytes: int = Field(gt=0)
    """Gradient as accumulated (2 in fp16, 4 for Megatron's fp32 main_grad)."""
    master_param_bytes: int = Field(ge=0)
    """fp32 master copy held by the optimizer (4 in mixed precision, 0 when params are fp32)."""
    optimizer_grad_copy_bytes: int = Field(default=0, ge=0)
    """An fp32 gradient copy held with the optimizer states (ZeRO-Infinity's extra 4)."""
    activation_bytes: int = Field(gt=0)
    """Bytes of one saved activation element (2 for fp16/bf16, 4 for fp32). FP8 recipes: the
    elements that stay in bf16 (norms, softmax, residuals); linear inputs are saved in fp8
    (planner.memory.fp8)."""
    fp8_weight_cache_bytes: float = Field(default=0, ge=0)
    """FP8 training (Transformer Engine): the fp8 copy of each weight and its transpose kept
    for the step beside the working copy, bytes per parameter (2 with bf16 params on Hopper,
    1 with fp8 params; docs/fp8.md). 0 for every non-fp8 recipe."""
    fp8_scaling: Literal["per-tensor", "mxfp8"] | None = None
    """FP8 training: how the fp8 tensors are scaled (one fp32 scale per tensor on Hopper, one
    E8M0 byte per 32 elements with MXFP8 on Blackwell); what the saved linear inputs cost
    (planner.memory.fp8). None for every non-fp8 recipe."""
    source: str
    """Where the convention comes from."""


class TrainSetup(Frozen):
    """What one run does: sequence length, batch, tokens, precision and optimizer."""

    seq_len: int = Field(gt=0, le=MAX_SEQ_LEN)
    """Tokens per sequence (s); at most ModelSpec's bound on max_seq_len."""
    global_batch: int = Field(gt=0, le=MAX_SEQUENCES)
    """Sequences per optimizer step across all data-parallel ranks."""
    train_tokens: float = Field(gt=0, le=MAX_TOKENS)
    """Tokens of the whole run (D)."""
    precision: PrecisionRecipe
    """Bytes of parameters, gradients, master copy and activations (planner.recipes)."""
    optimizer: Optimizer
    """The optimizer's states per parameter (planner.recipes)."""
    implementation: Literal["megatron", "hf-eager", "hf-sdpa"] = "megatron"
    """The code that runs the blocks, which decides what they save for backward
    (planner.memory.implementations, docs/implementations.md): `megatron` (TE / Apex fused
    kernels, any tp / pp / recompute), `hf-eager` / `hf-sdpa` (transformers' Python modules, eager
    or SDPA attention; tp = pp = 1, recompute none or full = HF gradient checkpointing). The
    precision mode comes from the recipe (`autocast-*`: fp32 weights under torch.autocast)."""
    host_accounting: Literal["deepspeed", "zero-infinity-paper"] = "deepspeed"
    """Where offloaded states live (planner.memory.host, docs/host.md): `deepspeed` as the engine
    allocates them (a 16-bit gradient buffer in pinned CPU memory even under NVMe offload),
    `zero-infinity-paper` as the paper counts them (that buffer on NVMe too)."""
    reserve_gib: float | None = Field(default=None, ge=0, le=MAX_MEMORY_GIB)
    """Runtime reserve per GPU, GiB, replacing the profile's CUDA context, NCCL, cuBLAS and
    fragmentation parts (`--reserve`); None: those parts from the GPU profile
    (planner.memory.reserve, docs/reserve.md)."""
    moe_capacity_factor: float | None = Field(default=None, gt=0, le=1000)
    """MoE token capacity per expert as a multiple of the even share T·k/E (Megatron
    `--moe-expert-capacity-factor` with `--moe-pad-expert-input-to-capacity`: every expert's
    buffer is padded to it, so the all-to-all and the experts' activations carry factor x the
    routed tokens); None: dropless, exactly the routed tokens (planner.timing.expert, docs/moe.md)."""
    moe_load_imbalance: float = Field(default=1.0, ge=1.0, le=1000)
    """MoE load imbalance, a stated input: the busiest expert-parallel rank receives this
    factor x the average routed tokens (1.0: perfectly balanced, the default; a dropless run
    with a capacity factor c is bounded by c). It scales the all-to-all a rank waits for and
    the expert activations it keeps (planner.timing.expert, planner.memory.experts)."""
