"""Typed inputs of the planner: what is trained, on what, laid out how, with which setup.

Four inputs kept apart (calculon's Application / System / Execution split, DESIGN.md):
`ModelSpec` + `Cluster` + `Layout` + `TrainSetup`. All are frozen pydantic models with
`extra="forbid"`; hardware numbers come from YAML in `hardware_profiles/` with a source each.
YAML keys carry their unit (`memory_gib`, `nvlink_gb_per_s`); SI values are exposed as
properties with the unit in the name (`memory_bytes`, `intra_node_bytes_per_s`).
Cross-field rules raise `ValueError` messages that name every factor involved.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

GIB = 1024**3
GB = 10**9
TB = 10**12
US = 1e-6


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for integers, exact (no float): DeepSpeed partitions, vocab rows per tp rank."""
    return -(-a // b)


Dtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8"]
OffloadTarget = Literal["none", "cpu", "nvme"]
RecomputeMode = Literal["none", "selective", "full", "every_k"]
TempoTechnique = Literal["gelu", "layernorm", "dropout"]


class Frozen(BaseModel):
    """Base: frozen, unknown keys rejected, docstrings become field descriptions."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


# --------------------------------------------------------------------------- model


class ModelSpec(Frozen):
    """What is trained: a decoder (GPT, Llama, Mistral, Mixtral) or an encoder (BERT)."""

    name: str
    """Short identifier, e.g. `gpt3-175b`."""
    arch: Literal["decoder", "encoder"] = "decoder"
    """`decoder` (causal LM, GPT/Llama) or `encoder` (BERT: token-type embeddings, embedding norm)."""
    num_layers: int = Field(gt=0)
    """Transformer blocks (nl, L)."""
    hidden_size: int = Field(gt=0)
    """Model width (hd, h)."""
    num_heads: int = Field(gt=0)
    """Query attention heads (a)."""
    num_kv_heads: int | None = Field(default=None, gt=0)
    """Key/value heads for grouped-query attention; None means equal to `num_heads` (MHA)."""
    head_dim: int | None = Field(default=None, gt=0)
    """Per-head width; None means `hidden_size / num_heads`."""
    ffn_hidden_size: int = Field(gt=0)
    """MLP inner width (4h for GPT; 11008 for Llama-2-7B). For MoE models: the dense-layer width."""
    vocab_size: int = Field(gt=0)
    """Vocabulary rows of the embedding matrix (V), as the checkpoint stores them (padded if so)."""
    max_seq_len: int = Field(gt=0)
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
    num_experts: int = Field(default=0, ge=0)
    """Mixture-of-experts: routed experts per MoE layer; 0 means a dense model."""
    experts_per_token: int = Field(default=0, ge=0)
    """Mixture-of-experts: routed experts active per token (top-k)."""
    expert_ffn_hidden_size: int | None = Field(default=None, gt=0)
    """Mixture-of-experts: inner width of each expert; None means `ffn_hidden_size`."""
    num_shared_experts: int = Field(default=0, ge=0)
    """Mixture-of-experts: always-active shared experts (DeepSeek / Qwen-MoE style)."""
    sliding_window: int | None = Field(default=None, gt=0)
    """Attention window in tokens (Mistral); None means full causal attention."""
    published_params: int | None = Field(default=None, gt=0)
    """The official total parameter count, when the model's authors give an exact one."""
    source: str = ""
    """Where the dimensions come from (paper table, config.json)."""

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
        return self


# --------------------------------------------------------------------------- hardware


class GpuSpec(Frozen):
    """One accelerator. Every number has a `sources` entry (vendor sheet)."""

    name: str
    """Identifier, e.g. `a100-80gb`."""
    memory_gib: float = Field(gt=0)
    """HBM capacity in GiB (2^30 bytes)."""
    peak_tflops: dict[Dtype, float]
    """Dense (no 2:4 sparsity) peak tensor throughput per dtype, in TFLOP/s (10^12)."""
    hbm_gb_per_s: float = Field(gt=0)
    """HBM bandwidth in GB/s (10^9 bytes/s)."""
    achieved_efficiency: float = Field(default=0.5, gt=0, le=1)
    """Fraction of dense peak the large matmuls (GEMMs) of a training step achieve. The step-time
    model adds memory-bound element-wise kernels, the optimizer step, communication and the
    pipeline bubble on top, so this is above an end-to-end MFU (A100: 0.628 fitted to Narayanan
    et al. 2021 Table 1 by benchmarks/published_runs.py; docs/accuracy.md). Replaced by
    `zplan calibrate` measurements via `--calibration`."""
    end_to_end_utilisation: float | None = Field(default=None, gt=0, le=1)
    """Fraction of dense peak a published end-to-end training run reached on this GPU, counting
    the FLOPs it executed (recompute included, as the seed's k = 8 does): the default utilisation
    of `zplan budget`, which has no layout to run the step-time model on."""
    sources: dict[str, str]
    """Citation for each numeric field, keyed by field name."""

    @property
    def memory_bytes(self) -> int:
        return int(round(self.memory_gib * GIB))

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
        if self.end_to_end_utilisation is not None:
            fields += ("end_to_end_utilisation",)
        _require_sources(self, fields)
        return self


class NodeSpec(Frozen):
    """A server: GPUs of one kind, their intra-node link, host memory, local NVMe."""

    name: str
    """Identifier, e.g. `dgx-a100`."""
    gpu: str
    """Name of the GPU profile (a file in hardware_profiles/gpus/)."""
    gpus_per_node: int = Field(gt=0)
    """GPUs in one node."""
    intra_node_gb_per_s: float = Field(gt=0)
    """GPU-to-GPU bandwidth per GPU per direction inside the node (NVLink/NVSwitch or PCIe), GB/s."""
    intra_node_latency_us: float = Field(ge=0)
    """Latency of one intra-node message, microseconds (alpha of the alpha-beta model)."""
    pcie_gb_per_s: float = Field(gt=0)
    """Host-to-device bandwidth per GPU per direction (offload traffic), GB/s."""
    cpu_memory_gib: float = Field(ge=0)
    """Host DRAM per node, GiB."""
    nvme_capacity_tb: float = Field(default=0, ge=0)
    """Local NVMe capacity per node, TB (10^12 bytes)."""
    nvme_read_gb_per_s: float = Field(default=0, ge=0)
    """Aggregate NVMe read bandwidth per node, GB/s."""
    nvme_write_gb_per_s: float = Field(default=0, ge=0)
    """Aggregate NVMe write bandwidth per node, GB/s."""
    cpu_adam_params_per_s: float = Field(default=1e9, gt=0)
    """Optimizer step throughput of the host CPUs for offloaded Adam, parameters per second."""
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
    def _sources(self) -> NodeSpec:
        _require_sources(
            self,
            ("gpus_per_node", "intra_node_gb_per_s", "intra_node_latency_us", "pcie_gb_per_s",
             "cpu_memory_gib"),
        )
        return self


class ClusterSpec(Frozen):
    """A cluster file: `num_nodes` copies of a node and the network between them."""

    name: str
    """Identifier, e.g. `dgx2x32`."""
    node: str
    """Name of the node profile (a file in hardware_profiles/nodes/)."""
    num_nodes: int = Field(gt=0)
    """Nodes in the cluster."""
    inter_node_gb_per_s: float = Field(gt=0)
    """Network bandwidth per node per direction (sum of its NICs), GB/s."""
    inter_node_latency_us: float = Field(ge=0)
    """Latency of one inter-node message, microseconds."""
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
    num_nodes: int = Field(gt=0)
    """Nodes in the cluster."""
    inter_node_gb_per_s: float = Field(gt=0)
    """Network bandwidth per node per direction, GB/s."""
    inter_node_latency_us: float = Field(ge=0)
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

    reduce_bucket_elements: int = Field(default=500_000_000, gt=0)
    """DeepSpeed `zero_optimization.reduce_bucket_size`, elements; default 5e8."""
    allgather_bucket_elements: int = Field(default=500_000_000, ge=0)
    """DeepSpeed `zero_optimization.allgather_bucket_size`, elements; default 5e8 (ZeRO-1/2)."""
    prefetch_bucket_elements: int = Field(default=50_000_000, ge=0)
    """DeepSpeed `zero_optimization.stage3_prefetch_bucket_size`, elements; default 5e7."""
    max_live_parameters: int = Field(default=1_000_000_000, ge=0)
    """DeepSpeed `zero_optimization.stage3_max_live_parameters`, elements; default 1e9."""
    param_persistence_threshold: int = Field(default=100_000, ge=0)
    """DeepSpeed `zero_optimization.stage3_param_persistence_threshold`, elements; default 1e5:
    ZeRO-3 keeps tensors of at most this many elements whole on every GPU."""
    ddp_bucket_bytes: int = Field(default=25 * 1024 * 1024, gt=0)
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


class Layout(Frozen):
    """How the job is laid out on the cluster (the Execution of calculon)."""

    tp: int = Field(default=1, gt=0)
    """Tensor-parallel degree (t). Must divide heads and kv heads."""
    pp: int = Field(default=1, gt=0)
    """Pipeline-parallel degree (p). At most the number of layers."""
    dp: int = Field(default=1, gt=0)
    """Data-parallel degree (Nd); ZeRO partitions across these ranks."""
    virtual_stages: int = Field(default=1, gt=0)
    """Model chunks per pipeline rank for the interleaved 1F1B schedule (1 = plain 1F1B)."""
    zero_stage: Literal[0, 1, 2, 3] = 0
    """0 = DDP; 1 = optimizer states partitioned; 2 = + gradients; 3 = + parameters."""
    offload_optimizer: OffloadTarget = "none"
    """Where optimizer states (and the fp32 master copy) live: GPU (`none`), `cpu` or `nvme`."""
    offload_params: OffloadTarget = "none"
    """Where the fp16/bf16 parameters live between uses; needs ZeRO-3."""
    recompute: RecomputeMode = "none"
    """Activation recompute: none; selective (attention core, Korthikanti et al.);
    full (keep each layer's input); every_k (keep the input of every k-th layer)."""
    recompute_every_k: int = Field(default=1, gt=0)
    """For `every_k`: layers per checkpointed segment (ZeRO-Infinity's ci)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms and dropouts split over the tp ranks."""
    flash_attention: bool = False
    """Fused attention that saves no s x s tensors (keeps only softmax statistics)."""
    tempo: tuple[TempoTechnique, ...] = ()
    """Tempo (seed 003) techniques: in-place `gelu`, in-place `layernorm`, `dropout` recompute."""
    micro_batch: int = Field(default=1, gt=0)
    """Sequences per micro-batch per data-parallel rank (b)."""
    grad_accum: int = Field(default=1, gt=0)
    """Micro-batches per step per data-parallel rank (m, the pipeline's micro-batch count)."""
    buffers: EngineBuffers = EngineBuffers()
    """The engines' bucket sizes (DeepSpeed zero_optimization keys, DDP bucket_cap_mb)."""

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @model_validator(mode="after")
    def _check(self) -> Layout:
        from planner.core.columns import CODED  # the rule table reads coded columns
        from planner.core.rules import layout_error

        fields = {name: getattr(self, name) for name in ("tp", "pp", "virtual_stages", "zero_stage",
                                                         "offload_optimizer", "offload_params",
                                                         "sequence_parallel")}
        coded = {k: CODED[k].index(v) if k in CODED else int(v) for k, v in fields.items()}
        error = layout_error(coded)
        if error:
            raise ValueError(error)
        if len(set(self.tempo)) != len(self.tempo):
            raise ValueError(f"tempo: techniques repeat {list(self.tempo)}")
        return self


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
    """Bytes of every part of the model states, per parameter (EQUATIONS.md §2)."""

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
    """Bytes of one saved activation element (2 for fp16/bf16, 4 for fp32)."""
    source: str
    """Where the convention comes from."""


class TrainSetup(Frozen):
    """What one run does: sequence length, batch, tokens, precision and optimizer."""

    seq_len: int = Field(gt=0)
    """Tokens per sequence (s)."""
    global_batch: int = Field(gt=0)
    """Sequences per optimizer step across all data-parallel ranks."""
    train_tokens: float = Field(gt=0)
    """Tokens of the whole run (D)."""
    precision: PrecisionRecipe
    """Bytes of parameters, gradients, master copy and activations (planner.recipes)."""
    optimizer: Optimizer
    """The optimizer's states per parameter (planner.recipes)."""
