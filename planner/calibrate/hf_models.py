"""Measure a real Hugging Face `transformers` model built from a local config (never a download).

Two ways, both with `AutoModelForCausalLM.from_config` (no weights read):
- `cpu`: reduced depth, full width, one forward + loss under saved-tensor hooks, on CPU;
- `meta`: full size on the meta device (no memory, every shape exact). `attention="flash-meta"`
  replaces SDPA by `torch.ops.aten._scaled_dot_product_flash_attention`, the CUDA flash kernel,
  whose autograd saves are recorded on meta without a GPU.

Saved tensors are deduplicated by storage (a view keeps its whole storage alive) and parameters
and buffers are excluded; each storage is named by a tensor class of
`planner.memory.implementations` from the module that saved it and the autograd node
attributes that hold it (`_saved_*` of the graph's nodes). FLOPs: torch.utils.flop_counter.
`transformers` is an optional extra (`pip install 'zplan[hf]'`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from planner.calibrate.sdpa_backend import fused_kernels, graph_nodes
from planner.core.errors import PlanInputError

HF_INSTALL_HINT = "measuring a transformers model needs the hf extra: pip install 'zplan[hf]'"
PRECISIONS = ("fp32", "bf16", "fp16", "autocast-bf16", "autocast-fp16")
ATTENTIONS = ("eager", "sdpa", "flash-meta", "efficient-meta", "cudnn-meta")
_META_KERNELS = {"flash-meta": "flash", "efficient-meta": "efficient", "cudnn-meta": "cudnn"}
_LAYER = re.compile(r"\.(?:layers|h)\.(\d+)(?:\.|$)")


def transformers_available() -> bool:
    """True when `transformers` can be imported."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class HFMeasurement:
    """One forward + loss of a transformers model."""

    num_layers: int
    seq_len: int
    micro_batch: int
    parameters: int
    by_layer: dict[int, dict[str, int]] = field(default_factory=dict)
    """{block: {tensor class: bytes}}."""
    outside: dict[str, int] = field(default_factory=dict)
    """{tensor class: bytes} saved outside the blocks (embedding, rotary, final norm, head, loss)."""
    forward_flops: int = 0
    backward_flops: int = 0
    sdpa_kernels: dict[str, int] = field(default_factory=dict)
    """{fused SDPA kernel: calls} found in the autograd graph (planner.calibrate.sdpa_backend)."""

    def block(self, layer: int = 0) -> dict[str, int]:
        return self.by_layer.get(layer, {})

    def total_bytes(self) -> int:
        return sum(map(sum, (d.values() for d in self.by_layer.values()))) + sum(self.outside.values())


# --------------------------------------------------------------------------- building


def build_config(config: dict, attention: str, num_layers: int | None = None):
    """A transformers config from a config.json dict; `num_layers` overrides the depth."""
    from transformers import AutoConfig

    values = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "auto_map")}
    if "model_type" not in config:
        raise PlanInputError("model_type", "config.json has no model_type")
    try:
        cfg = AutoConfig.for_model(config["model_type"], **values)
    except ValueError as err:
        raise PlanInputError("model_type", str(err).splitlines()[0]) from None
    if num_layers is not None:
        for key in ("num_hidden_layers", "n_layer"):
            if hasattr(cfg, key):
                setattr(cfg, key, num_layers)
    cfg.use_cache = False
    return cfg


def build_model(config: dict, attention: str = "sdpa", precision: str = "fp32",
                num_layers: int | None = None, device: str = "cpu") -> nn.Module:
    """`AutoModelForCausalLM.from_config` in train mode; weights bf16/fp16 for those modes."""
    from transformers import AutoModelForCausalLM

    if precision not in PRECISIONS:
        raise PlanInputError("precision", f"{precision!r}; allowed: {', '.join(PRECISIONS)}")
    if attention not in ATTENTIONS:
        raise PlanInputError("attention", f"{attention!r}; allowed: {', '.join(ATTENTIONS)}")
    if attention in _META_KERNELS and device != "meta":
        raise PlanInputError("attention", f"{attention} runs on the meta device only")
    if device == "meta" and attention == "sdpa":
        attention = "flash-meta"  # on meta SDPA falls to the math path; CUDA runs the flash kernel
    impl = _register_meta_kernel(_META_KERNELS[attention]) if attention in _META_KERNELS else attention
    cfg = build_config(config, impl, num_layers)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=impl)
    return model.train()


def _register_meta_kernel(kernel: str) -> str:
    """Register an attention function calling a CUDA fused kernel's aten op directly (what SDPA
    dispatches to on a GPU): `flash`, `efficient` or `cudnn`. Their meta kernels return every
    output, so autograd's saves (q, k, v, out, fp32 log-sum-exp, RNG state) are the GPU's."""
    from transformers import AttentionInterface

    def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        aten = torch.ops.aten
        if kernel == "flash":
            out = aten._scaled_dot_product_flash_attention(query, key, value, dropout, True, False, scale=scaling)
        elif kernel == "efficient":
            out = aten._scaled_dot_product_efficient_attention(query, key, value, None, True, dropout, True,
                                                               scale=scaling)
        else:
            out = aten._scaled_dot_product_cudnn_attention(query, key, value, None, True, dropout, True, False,
                                                           scale=scaling)
        return out[0].transpose(1, 2).contiguous(), None

    name = f"zplan_meta_cuda_{kernel}".replace("flash", "fa")  # a name with "flash" means FA2 to transformers
    AttentionInterface.register(name, attend)
    return name


# --------------------------------------------------------------------------- measuring


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _module_stack(model: nn.Module) -> tuple[list[str], list]:
    stack: list[str] = []
    handles = []

    def enter(name: str):
        def hook(module, args) -> None:
            stack.append(name)
        return hook

    def leave(module, args, output) -> None:
        stack.pop()

    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(module.register_forward_hook(leave))
    return stack, handles


def _saved_by(loss: torch.Tensor) -> dict[int, set[str]]:
    """{storage: {"NodeName.attribute", ...}} over the autograd graph of `loss`."""
    out: dict[int, set[str]] = {}
    for node in graph_nodes(loss):
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attr)
            except RuntimeError:
                continue
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor):
                    out.setdefault(_key(t), set()).add(f"{node.name()}.{attr[7:]}")
    return out


def _precision_context(precision: str, device: str):
    if not precision.startswith("autocast"):
        return contextlib.nullcontext()
    if device == "meta":
        raise PlanInputError("precision", "autocast does not run on the meta device; use the CPU harness")
    dtype = torch.bfloat16 if precision == "autocast-bf16" else torch.float16
    return torch.autocast(device_type=device, dtype=dtype)


def measure(model: nn.Module, seq_len: int, micro_batch: int, precision: str = "fp32",
            flops: bool = True) -> HFMeasurement:
    """One forward + loss (and backward for FLOPs when not on meta) of `model` on random ids."""
    cfg = model.config
    device = next(model.parameters()).device.type
    excluded = {_key(t) for t in (*model.parameters(), *model.buffers())}
    records: dict[int, tuple[str, torch.Tensor]] = {}
    stack, handles = _module_stack(model)

    def pack(t: torch.Tensor) -> torch.Tensor:
        k = _key(t)
        if k not in excluded and k not in records and t.untyped_storage().nbytes():
            records[k] = (stack[-1] if stack else "", t)
        return t

    ids = torch.randint(0, cfg.vocab_size, (micro_batch, seq_len), device=device) \
        if device != "meta" else torch.zeros(micro_batch, seq_len, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    try:
        with counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                _precision_context(precision, device), _no_packing_check(device), \
                _cuda_dropout(device):
            loss = model(input_ids=ids, labels=ids).loss
        forward_flops = counter.get_total_flops()
        ops = _saved_by(loss)
        kernels = fused_kernels(loss)
        if flops:
            with counter:
                loss.backward()
    finally:
        for h in handles:
            h.remove()
    result = HFMeasurement(num_layers=_depth(cfg), seq_len=seq_len, micro_batch=micro_batch,
                           parameters=sum(p.numel() for p in model.parameters()),
                           forward_flops=forward_flops,
                           backward_flops=counter.get_total_flops() if flops else 0,
                           sdpa_kernels=kernels)
    shape = _Shape(seq_len, _head_dim(cfg), getattr(cfg, "hidden_size", None) or cfg.n_embd)
    for k, (module, t) in records.items():
        layer, cls = classify(module, ops.get(k, set()), t, shape)
        target = result.outside if layer is None else result.by_layer.setdefault(layer, {})
        names = cls.split("+")  # one storage kept as several classes of equal size (fused q, k, v)
        for name in names:
            target[name] = target.get(name, 0) + t.untyped_storage().nbytes() // len(names)
    for block in result.by_layer.values():
        _name_probabilities(block)
    return result


def _name_probabilities(block: dict[str, int]) -> None:
    """The probabilities the second matmul keeps, when not the softmax output itself: the
    dropout output when attention dropout ran, else the 16-bit cast of an fp32 softmax."""
    if "attn.softmax_probs" in block:
        name = "attn.softmax_dropout_output" if "attn.softmax_dropout_mask" in block else "attn.softmax_cast"
        block[name] = block.pop("attn.softmax_probs")


def _cuda_dropout(device: str):
    """On meta, run dropout as CUDA does: ATen `dropout` takes the fused `native_dropout` (bool
    mask) only for CUDA-like devices (Dropout.cpp `is_fused_kernel_acceptable`); meta would take
    `_dropout_impl`, which keeps a noise tensor of the input dtype, like the CPU."""
    if device != "meta":
        return contextlib.nullcontext()
    from unittest import mock

    def dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        return torch.ops.aten.native_dropout(x, p, True)[0]

    return mock.patch("torch.nn.functional.dropout", dropout)


def _no_packing_check(device: str):
    """On meta, skip transformers' packed-sequence detection (masking_utils.py
    `find_packed_sequence_indices` reads position-id values, which meta tensors do not have);
    our position ids are arange(s), never packed, so the answer it would give is None."""
    if device != "meta":
        return contextlib.nullcontext()
    from unittest import mock
    return mock.patch("transformers.masking_utils.find_packed_sequence_indices", lambda position_ids: None)


def _depth(cfg) -> int:
    return getattr(cfg, "num_hidden_layers", None) or cfg.n_layer


def _head_dim(cfg) -> int:
    if getattr(cfg, "kv_lora_rank", None):  # MLA: query / key head width (DeepseekV3Attention)
        return cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    d = getattr(cfg, "head_dim", None)
    if d:
        return d
    hidden = getattr(cfg, "hidden_size", None) or cfg.n_embd
    heads = getattr(cfg, "num_attention_heads", None) or cfg.n_head
    return hidden // heads


# --------------------------------------------------------------------------- classes


@dataclass(frozen=True)
class _Shape:
    seq_len: int
    head_dim: int
    hidden: int


_QKV = "attn.q+attn.k+attn.v"
_NORMS = {"input_layernorm": "norm1", "ln_1": "norm1", "post_attention_layernorm": "norm2",
          "ln_2": "norm2", "model.norm": "final_norm", "transformer.ln_f": "final_norm",
          "self_attn.q_a_layernorm": "attn.q_norm", "self_attn.kv_a_layernorm": "attn.kv_norm"}
_LINEARS = {"q_proj": "attn.qkv_input", "k_proj": "attn.qkv_input", "v_proj": "attn.qkv_input",
            "c_attn": "attn.qkv_input", "o_proj": "attn.proj_input", "attn.c_proj": "attn.proj_input",
            "gate_proj": "mlp.fc1_input", "up_proj": "mlp.fc1_input", "c_fc": "mlp.fc1_input",
            "down_proj": "mlp.fc2_input", "mlp.c_proj": "mlp.fc2_input", "lm_head": "head.input",
            "q_a_proj": "attn.qkv_input", "kv_a_proj_with_mqa": "attn.qkv_input",  # MLA
            "q_b_proj": "attn.q_up_input", "kv_b_proj": "attn.kv_up_input"}
_OPS = {"logsumexp": "attn.softmax_lse", "query": "attn.q", "key": "attn.k", "value": "attn.v",
        "output": "attn.proj_input", "rng_state": "attn.rng_state", "unused": "attn.rng_state",
        "philox_seed": "attn.rng_state", "philox_offset": "attn.rng_state", "log_sumexp": "attn.softmax_lse",
        "SoftmaxBackward0.result": "attn.softmax_output", "SafeSoftmaxBackward0.result": "attn.softmax_output",
        "SiluBackward0.self": "mlp.act_input", "GeluBackward0.self": "mlp.act_input",
        "PowBackward0.self@act": "mlp.act_input", "TanhBackward0.result": "mlp.act_tanh",
        "NllLossBackward0.self": "loss.log_softmax", "NllLossBackward0.target": "loss.targets",
        "NllLossBackward0.total_weight": "loss.total_weight"}


def classify(module: str, ops: set[str], t: torch.Tensor, shape: _Shape) -> tuple[int | None, str]:
    """(block or None, tensor class) of one saved storage."""
    m = _LAYER.search(module)
    layer = int(m.group(1)) if m else None
    rel = module[m.end():] if m else module
    if any(".mat2" in o for o in ops if o.startswith(("MmBackward0", "AddmmBackward0"))) and t.dim() == 2 \
            and not any("Bmm" in o for o in ops):
        if rel == "mlp.gate" and t.dtype == torch.float32:  # DeepSeek-V3: weight.type(float32)
            return layer, "moe.router_weight_cast"
        return layer, "autocast.head_weight_cast" if module == "lm_head" else "autocast.weight_casts"
    fused = {o.split(".")[-1] for o in ops if "ScaledDotProduct" in o}
    if {"query", "key", "value"} <= fused:  # GPT-2: q, k, v are views of the c_attn output
        return layer, _QKV
    for o in sorted(ops):
        if "ScaledDotProduct" in o:
            return layer, _OPS.get(o.split(".")[-1], "attn.other")
    if rel.startswith(("mlp.gate", "block_sparse_moe.gate", "mlp.experts", "block_sparse_moe.experts")):
        return layer, _moe_class(rel, ops, t, shape)
    if rel.startswith("mlp.shared_experts"):  # DeepseekV3MoE's shared experts (a DeepseekV3MLP)
        return layer, _shared_class(rel, ops)
    if any(o.startswith("EmbeddingBackward0") for o in ops):
        return None, "embedding.position_ids" if module.endswith("wpe") else "embedding.token_ids"
    for o in sorted(ops):
        if o in _OPS and (o.startswith(("Softmax", "SafeSoftmax", "Nll")) or "act" in rel):
            return (None if o.startswith("Nll") else layer), _OPS[o]
    cls = _by_module(rel if layer is not None else module, ops, t, shape)
    if cls == "rotary.cos_sin" or cls.startswith(("embedding", "loss")):
        return None, cls
    return layer, cls


def _by_module(rel: str, ops: set[str], t: torch.Tensor, shape: _Shape) -> str:
    if rel in _NORMS:
        prefix = _NORMS[rel]
        if t.dim() >= 2 and t.shape[-1] == 1 or any("result1" in o or "result2" in o for o in ops):
            return f"{prefix}.stats"
        if any(o in ("PowBackward0.self", "NativeLayerNormBackward0.input") for o in ops):
            return f"{prefix}.input"
        return f"{prefix}.normalized"
    leaf = rel.split(".")[-1]
    for key in (rel, ".".join(rel.split(".")[-2:]), leaf):
        if key in _LINEARS:
            return _LINEARS[key]
    if leaf == "act" or leaf == "act_fn":
        if "PowBackward0.self" in ops:
            return "mlp.act_input"
        return "mlp.act_one_plus_tanh" if "MulBackward0.other" in ops else "mlp.act_half_input"
    if leaf in ("resid_dropout", "dropout"):
        return "attn.dropout_mask" if rel.startswith("attn") else "mlp.dropout_mask"
    if leaf == "drop":
        return "embedding.dropout_mask"
    if leaf == "mlp":
        return "mlp.act_output" if "MulBackward0.self" in ops else "mlp.up_output"
    if leaf in ("self_attn", "attn"):
        return _attention_class(ops, t, shape)
    return "other:" + "+".join(sorted(ops))


_MOE_OPS = {"MmBackward0.self": "mlp.fc1_input", "SoftmaxBackward0.result": "moe.router_probs",
            "TopkBackward0.indices": "moe.topk_indices", "DivBackward0.other": "moe.topk_sum",
            "DivBackward0.self": "moe.topk_values", "IndexBackward0.indices": "moe.indices",
            "GroupedMmBackward0.offs": "moe.offsets", "SiluBackward0.self": "moe.expert.gate_up_output",
            "MulBackward0.other": "moe.routing_weights",
            "SigmoidBackward0.result": "moe.router_probs", "GatherBackward0.index": "moe.topk_indices"}


def _moe_class(rel: str, ops: set[str], t: torch.Tensor, shape: _Shape) -> str:
    """Router (`mlp.gate`) and grouped-mm experts (`mlp.experts`) of a transformers MoE block."""
    if rel == "mlp.gate" and not ops:  # DeepSeek-V3's group-limited routing (no node attribute)
        return "moe.group_mask" if t.dtype == torch.bool else "moe.group_topk_indices"
    for o, name in _MOE_OPS.items():  # in this order: SiLU's input before the product's operand
        if o in ops:
            return name
    wide = t.shape[-1] == shape.hidden
    if "GroupedMmBackward0.self" in ops:
        return "moe.expert_input" if wide else "moe.expert.fc2_input"
    if "MulBackward0.self" in ops:
        return "moe.expert_output" if wide else "moe.expert.act_output"
    return "moe.other:" + "+".join(sorted(ops))


def _shared_class(rel: str, ops: set[str]) -> str:
    leaf = rel.split(".")[-1]
    if leaf in ("gate_proj", "up_proj"):
        return "mlp.fc1_input"
    if leaf == "down_proj":
        return "moe.shared.fc2_input"
    if leaf == "act_fn":
        return "moe.shared.act_input"
    if "MulBackward0.self" in ops:
        return "moe.shared.act_output"
    return "moe.shared.up_output" if "MulBackward0.other" in ops else "moe.shared.other:" + "+".join(sorted(ops))


def _attention_class(ops: set[str], t: torch.Tensor, shape: _Shape) -> str:
    s, d = shape.seq_len, shape.head_dim
    last2 = tuple(t.shape[-2:])
    if not t.requires_grad and "MulBackward0.other" in ops and (
            t.shape[-1] == d or t.dim() == 4 and t.shape[:2] == (1, 1) and t.shape[-2] == s):
        return "rotary.cos_sin"  # MLA: (1, 1, s, rope/2) slices of cos, sin (rope interleave)
    if "MulBackward0.other" in ops and last2 == (s, s):
        return "attn.softmax_dropout_mask"
    if "NativeDropoutBackward0.result1" in ops:
        return "attn.softmax_dropout_mask"
    if {"BmmBackward0.self", "BmmBackward0.mat2"} <= ops and last2 != (s, s):
        return _QKV  # b = 1: the matmuls keep views of the fused c_attn output itself
    if "BmmBackward0.mat2" in ops:
        return "attn.k" if last2 == (d, s) else "attn.v"
    if "BmmBackward0.self" in ops:
        return "attn.q" if last2 == (s, d) else "attn.softmax_probs"
    return "attn.other:" + "+".join(sorted(ops))


def iter_precisions(device: str) -> Iterator[str]:
    """The precision modes a device can run (autocast needs a real device)."""
    return iter(PRECISIONS if device != "meta" else ("fp32", "bf16", "fp16"))
