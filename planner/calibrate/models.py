"""Torch models built from a `planner.core.spec.ModelSpec`: GPT-style and Llama-style decoders, a
BERT-style encoder, with the recompute policy of a `planner.core.spec.Layout`.

Every tensor saved for backward is created under a `tags.tensor_class` naming what it is
(e.g. `fc1_input`), so the saved-tensor hook can attribute it. Attention is explicit matmuls
on CPU (FlopCounterMode counts no FLOPs for CPU scaled_dot_product_attention) and SDPA on CUDA.
Parameter layout follows `planner.core.params` (Q, K, V, O; fc1/fc2 or gate/up/down; two norms).
Seed and paper citations: docs/references.md
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.calibrate import tags
from planner.calibrate.config import check_norm_impl
from planner.core.errors import PlanInputError
from planner.core.spec import ModelSpec

DROPOUT_P = 0.1
"""Dropout probability when the spec has dropout (GPT-2/3 and BERT use 0.1)."""


class FusedRMSNorm(torch.autograd.Function):
    """RMSNorm y = x · rsqrt(mean(x²) + eps) · w, statistics in fp32, that saves for backward
    exactly (x, rstd [fp32, one per row], w), as the fused GPU kernels do.

    Reproduces the saved tensors of:
    - Apex `apex/normalization/fused_layer_norm.py` `FusedRMSNormAffineFunction.forward`
      (NVIDIA/apex@014f30f): `ctx.save_for_backward(input_, weight_, invvar)`, invvar fp32 for
      fp16 / bf16 input (its fake kernel: `dtype = torch.float32`); Megatron-LM's `FusedRMSNorm`;
    - Transformer Engine `transformer_engine/common/include/transformer_engine/rmsnorm.h`
      (NVIDIA/TransformerEngine@2562e68): `nvte_rmsnorm_fwd` returns z and rsigma [N], and
      `nvte_rmsnorm_bwd(dz, x, rsigma, gamma, ...)` needs exactly x, rsigma and gamma;
    - torch `tools/autograd/derivatives.yaml` `_fused_rms_norm` (the CUDA path of `F.rms_norm`):
      the backward reads `input`, `weight` and `result1` (rstd), with rstd in the computation
      dtype (fp32 for bf16 / fp16: `torch/_decomp/decompositions.py` `_fused_rms_norm`).
    The backward is torch's `_fused_rms_norm_backward` decomposition written out:
    x̂ = x·rstd, g = dy·w, dx = rstd · (g − x̂ · mean(g·x̂)), dw = Σ dy·x̂ over the rows.
    rstd keeps shape [..., 1] (torch's keepdim) so the hook files it under `norm*.stats`.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        stat = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = x.to(stat)
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return (xf * rstd * weight.to(stat)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, rstd, weight = ctx.saved_tensors
        xhat = x.to(rstd.dtype) * rstd
        dyf = dy.to(rstd.dtype)
        g = dyf * weight.to(rstd.dtype)
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        dw = (dyf * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class RMSNorm(nn.Module):
    """RMSNorm with a weight only (Zhang & Sennrich 2019; Llama `LlamaRMSNorm`); `impl` is
    `fused` (FusedRMSNorm, the engines' saved tensors) or `torch` (`F.rms_norm`)."""

    def __init__(self, hidden: int, eps: float = 1e-5, impl: str = "fused") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps, self.impl = eps, impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "fused":
            return FusedRMSNorm.apply(x, self.weight, self.eps)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class FusedLayerNorm(torch.autograd.Function):
    """LayerNorm y = (x − mean) · rstd · w + b, statistics in fp32, that saves for backward
    exactly (x, mean [fp32], rstd [fp32], w, b), as the fused GPU kernels do.

    Reproduces the saved tensors of Apex `apex/normalization/fused_layer_norm.py`
    `FusedLayerNormAffineFunction.forward` (NVIDIA/apex@014f30f):
    `ctx.save_for_backward(input_, weight_, bias_, mean, invvar)`, mean and invvar fp32 for fp16 /
    bf16 input (its fake kernel: `dtype = torch.float32`), which Megatron-LM's `FusedLayerNorm`
    calls; torch's CUDA `native_layer_norm` also returns fp32 mean / rstd. (CPU
    `native_layer_norm` returns them in the input dtype: 2 bytes under bf16.)
    Backward: x̂ = (x − mean)·rstd, g = dy·w, dx = rstd · (g − mean(g) − x̂ · mean(g·x̂)),
    dw = Σ dy·x̂, db = Σ dy over the rows. Statistics keep shape [..., 1] (`norm*.stats`).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        stat = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = x.to(stat)
        mean = xf.mean(-1, keepdim=True)
        rstd = torch.rsqrt((xf - mean).pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, mean, rstd, weight, bias)
        return ((xf - mean) * rstd * weight.to(stat) + bias.to(stat)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, mean, rstd, weight, bias = ctx.saved_tensors
        xhat = (x.to(rstd.dtype) - mean) * rstd
        dyf = dy.to(rstd.dtype)
        g = dyf * weight.to(rstd.dtype)
        dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
        rows = (-1, x.shape[-1])
        dw = (dyf * xhat).reshape(rows).sum(0)
        db = dyf.reshape(rows).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), db.to(bias.dtype), None


class LayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` (same parameters) whose forward is FusedLayerNorm when `impl` is `fused`."""

    def __init__(self, hidden: int, impl: str = "fused") -> None:
        super().__init__(hidden)
        self.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "fused":
            return FusedLayerNorm.apply(x, self.weight, self.bias, self.eps)
        return super().forward(x)


def make_norm(spec: ModelSpec, impl: str = "fused") -> nn.Module:
    """LayerNorm (weight and bias) or RMSNorm (weight), as the spec says, in `impl` (`config.NORM_IMPLS`)."""
    if spec.norm == "layernorm":
        return LayerNorm(spec.hidden_size, impl=impl)
    return RMSNorm(spec.hidden_size, impl=impl)


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """Dropout that keeps a 1-byte boolean mask, on every device.

    `F.dropout` on CPU multiplies by a noise tensor of the input dtype (2 or 4 bytes per element
    saved); CUDA uses the fused `native_dropout` with a bool mask. Calling `native_dropout`
    directly gives the CUDA behaviour on the CPU too, which is what the planner models.
    """
    return torch.native_dropout(x, p, True)[0]


def _tagged(name: str, fn, *args):
    with tags.tensor_class(name):
        return fn(*args)


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021), rotate-half form as in Llama."""

    def __init__(self, head_dim: int, max_seq: int, base: float = 10000.0) -> None:
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(max_seq).float(), inv)
        emb = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [b, heads, s, d]
        s = x.shape[2]
        cos, sin = self.cos[:s].to(x.dtype), self.sin[:s].to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


class AttentionCore(nn.Module):
    """softmax(QK^T/sqrt(d) + mask) V with dropout on the probabilities (explicit bmm on the CPU,
    SDPA on CUDA)."""

    def __init__(self, spec: ModelSpec, use_sdpa: bool, seq_len: int) -> None:
        super().__init__()
        self.causal = spec.arch == "decoder"
        self.window = spec.sliding_window
        self.p = DROPOUT_P if spec.dropout else 0.0
        self.use_sdpa = use_sdpa
        s = seq_len  # masks sized to the run, not to max_seq_len (Mistral: 32768)
        allowed = torch.ones(s, s, dtype=torch.bool)
        if self.causal:
            allowed = allowed.tril()
        if self.window:
            allowed = allowed & ~torch.ones(s, s, dtype=torch.bool).tril(-self.window)
        self.register_buffer("blocked", ~allowed, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = self.p if self.training else 0.0
        if self.use_sdpa:  # flash / memory-efficient kernels keep q, k, v (kv heads), out, lse
            s = q.shape[2]
            tags.name(q, "attn.q"), tags.name(k, "attn.k"), tags.name(v, "attn.v")
            with tags.tensor_class("attn.core"):
                return F.scaled_dot_product_attention(
                    q, k, v, dropout_p=p, is_causal=self.causal and not self.window,
                    attn_mask=~self.blocked[:s, :s] if self.window else None, enable_gqa=True)
        b, a, s, d = q.shape
        # GQA: K and V repeated to the query heads before the matmuls, as Megatron's unfused
        # DotProductAttention and Hugging Face `repeat_kv` do (so the saved K, V have a heads)
        k = k.repeat_interleave(a // k.shape[1], dim=1) if k.shape[1] != a else k
        v = v.repeat_interleave(a // v.shape[1], dim=1) if v.shape[1] != a else v
        q3 = tags.name(q.reshape(b * a, s, d).contiguous(), "attn.q")
        k3 = tags.name(k.reshape(b * a, s, d).contiguous(), "attn.k")
        v3 = tags.name(v.reshape(b * a, s, d).contiguous(), "attn.v")
        scores = torch.bmm(q3, k3.transpose(1, 2)).view(b, a, s, s) * (1.0 / math.sqrt(d))
        scores = scores.masked_fill(self.blocked[:s, :s], float("-inf"))
        probs = _tagged("attn.softmax_output", torch.softmax, scores, -1)
        if p:
            probs = _tagged("attn.softmax_dropout_mask", dropout, probs, p)
            tags.name(probs, "attn.softmax_dropout_output")
        ctx = torch.bmm(probs.view(b * a, s, s), v3)
        return ctx.view(b, a, s, d)


class Attention(nn.Module):
    """Q, K, V, O projections around the core; rotary on Q and K when the spec says so."""

    def __init__(self, spec: ModelSpec, use_sdpa: bool, selective: bool, seq_len: int) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_size
        self.heads, self.kv_heads, self.head_dim = spec.num_heads, spec.kv_heads, d
        qkv_bias = spec.linear_bias or spec.qkv_bias
        self.q = nn.Linear(h, self.heads * d, bias=qkv_bias)
        self.k = nn.Linear(h, self.kv_heads * d, bias=qkv_bias)
        self.v = nn.Linear(h, self.kv_heads * d, bias=qkv_bias)
        self.o = nn.Linear(self.heads * d, h, bias=spec.linear_bias)
        self.rotary = Rotary(d, seq_len) if spec.position == "rotary" else None
        self.core = AttentionCore(spec, use_sdpa, seq_len)
        self.selective = selective

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        with tags.tensor_class("attn.qkv_input"):
            q, k, v = self.q(x), self.k(x), self.v(x)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rotary is not None:
            with tags.tensor_class("attn.rotary"):
                q, k = self.rotary(q), self.rotary(k)
        if self.selective and self.training:  # Korthikanti et al.: recompute the core only
            tags.name(q, "attn.q"), tags.name(k, "attn.k"), tags.name(v, "attn.v")
            with tags.tensor_class("attn.core_input"):
                ctx = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            ctx = self.core(q, k, v)
        ctx = ctx.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)
        return _tagged("attn.proj_input", self.o, ctx)


class MLP(nn.Module):
    """GELU MLP (fc1, fc2) or SwiGLU (gate, up, down) of inner width `width`; its saved tensors
    are named `{prefix}.act_input` etc. (`mlp` for a dense block, `moe.expert` / `moe.shared`)."""

    def __init__(self, spec: ModelSpec, width: int | None = None, prefix: str = "mlp",
                 input_class: str = "mlp.fc1_input") -> None:
        super().__init__()
        h, f, bias = spec.hidden_size, width or spec.ffn_hidden_size, spec.linear_bias
        self.swiglu = spec.mlp == "swiglu"
        self.prefix, self.input_class = prefix, input_class
        if self.swiglu:
            self.gate = nn.Linear(h, f, bias=bias)
            self.up = nn.Linear(h, f, bias=bias)
            self.down = nn.Linear(f, h, bias=bias)
        else:
            self.fc1 = nn.Linear(h, f, bias=bias)
            self.fc2 = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.prefix
        if self.swiglu:
            with tags.tensor_class(self.input_class):
                gate, up = self.gate(x), self.up(x)
            act = _tagged(f"{p}.act_input", F.silu, gate)
            tags.name(act, f"{p}.act_output")
            tags.name(up, f"{p}.up_output")
            prod = torch.mul(act, up)
            return _tagged(f"{p}.fc2_input", self.down, prod)
        hidden = _tagged(self.input_class, self.fc1, x)
        act = _tagged(f"{p}.act_input", F.gelu, hidden)
        return _tagged(f"{p}.fc2_input", self.fc2, act)


class MoE(nn.Module):
    """Mixture of experts, Mixtral-style: router h x E without bias, softmax over all experts in
    fp32, top-k, weights renormalised over the k; each token dispatched by index to its k experts
    (no capacity limit), outputs weighted and summed; shared experts see every token."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.k = spec.experts_per_token
        self.router = nn.Linear(spec.hidden_size, spec.num_experts, bias=False)
        self.experts = nn.ModuleList(
            MLP(spec, spec.expert_ffn_size, "moe.expert", "moe.expert_input") for _ in range(spec.num_experts))
        self.shared = nn.ModuleList(
            MLP(spec, spec.expert_ffn_size, "moe.shared", "mlp.fc1_input") for _ in range(spec.num_shared_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        logits = _tagged("mlp.fc1_input", self.router, flat)
        probs = _tagged("moe.router_probs", torch.softmax, logits.float(), -1)
        with tags.tensor_class("moe.routing_other"):  # top-k indices, renormalisation
            weights, chosen = probs.topk(self.k, dim=-1)
            weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel() == 0:
                continue
            with tags.tensor_class("moe.dispatch_indices"):
                routed = flat[token]
                w = weights[token, slot]
            y = expert(routed)
            tags.name(y, "moe.expert_output"), tags.name(w, "moe.routing_weights")
            with tags.tensor_class("moe.dispatch_indices"):
                # scatter_add (Megatron's unpermute) keeps only the index; index_add (Hugging Face
                # Mixtral) would also keep the weighted outputs (its derivative uses expand_as(source))
                where = token[:, None].expand(-1, flat.shape[-1])
                out = out.scatter_add(0, where, y * w[:, None])
        for shared in self.shared:
            out = out + shared(flat)
        return out.view_as(x)


class Block(nn.Module):
    """One transformer block: pre-norm (decoders) or post-norm (BERT) residual layout."""

    def __init__(self, spec: ModelSpec, index: int, use_sdpa: bool, selective: bool,
                 seq_len: int, norm_impl: str = "fused") -> None:
        super().__init__()
        self.index = index
        self.pre_norm = spec.arch == "decoder"
        self.norm1, self.norm2 = make_norm(spec, norm_impl), make_norm(spec, norm_impl)
        self.attn = Attention(spec, use_sdpa, selective, seq_len)
        self.mlp = MoE(spec) if spec.is_moe else MLP(spec)
        self.p = DROPOUT_P if spec.dropout else 0.0

    def _drop(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if not (self.p and self.training):
            return x
        return _tagged(name, dropout, x, self.p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with tags.layer(self.index):
            if self.pre_norm:
                x = x + self._drop("attn.dropout_mask", self.attn(_tagged("norm1.input", self.norm1, x)))
                return x + self._drop("mlp.dropout_mask", self.mlp(_tagged("norm2.input", self.norm2, x)))
            x = _tagged("norm1.input", self.norm1, x + self._drop("attn.dropout_mask", self.attn(x)))
            return _tagged("norm2.input", self.norm2, x + self._drop("mlp.dropout_mask", self.mlp(x)))


class TransformerLM(nn.Module):
    """Embeddings, blocks (with the layout's recompute policy), final norm, LM head, loss.

    Decoders train next-token prediction; the encoder trains token prediction through the tied
    embedding (an MLM-like loss without a transform layer, so only BertModel's parameters exist).
    """

    def __init__(self, spec: ModelSpec, seq_len: int, recompute: str = "none", every_k: int = 1,
                 use_sdpa: bool = False, norm_impl: str = "fused") -> None:
        super().__init__()
        h = spec.hidden_size
        self.spec, self.recompute, self.every_k = spec, recompute, every_k
        self.word = nn.Embedding(spec.vocab_size, h)
        self.position = nn.Embedding(spec.max_seq_len, h) if spec.position == "learned" else None
        self.token_type = nn.Embedding(spec.type_vocab_size, h) if spec.type_vocab_size else None
        self.embedding_norm = make_norm(spec, norm_impl) if spec.embedding_norm else None
        self.blocks = nn.ModuleList(Block(spec, i, use_sdpa, recompute == "selective", seq_len, norm_impl)
                                    for i in range(spec.num_layers))
        self.final_norm = make_norm(spec, norm_impl) if spec.final_norm else None
        self.lm_head = None if spec.tied_embeddings else nn.Linear(h, spec.vocab_size, bias=spec.lm_head_bias)
        self.head_bias = (nn.Parameter(torch.zeros(spec.vocab_size))
                          if spec.tied_embeddings and spec.lm_head_bias else None)
        self.pooler = nn.Linear(h, h) if spec.pooler else None
        self.p = DROPOUT_P if spec.dropout else 0.0

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        tags.name(tokens, "embedding.token_ids")
        with tags.tensor_class("embedding.other"):
            x = self.word(tokens)
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            if self.position is not None:
                x = x + self.position(positions)[None]
            if self.token_type is not None:
                x = x + self.token_type(torch.zeros_like(tokens))
        if self.embedding_norm is not None:
            x = _tagged("embedding.norm.input", self.embedding_norm, x)
        if self.p and self.training:
            x = _tagged("embedding.dropout_mask", dropout, x, self.p)
        return x

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """The blocks under the recompute policy: full = one checkpoint per block, every_k = per
        segment of k blocks (keeps the segment input), selective is inside Attention."""
        step = {"full": 1, "every_k": self.every_k}.get(self.recompute) if self.training else None
        if step is None:
            for block in self.blocks:
                x = block(x)
            return x
        for first in range(0, len(self.blocks), step):
            segment = self.blocks[first:first + step]
            with tags.layer(first), tags.tensor_class("checkpoint_input"):
                x = checkpoint(_run_segment, segment, x, use_reentrant=False)
        return x

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy loss of one micro-batch."""
        x = self.run_blocks(self.embed(tokens))
        if self.final_norm is not None:
            x = _tagged("final_norm.input", self.final_norm, x)
        tags.name(x, "head.input")  # before the pooler, which saves a view of it
        extra = 0.0
        if self.pooler is not None:  # BERT's pooler on the first token: run so it trains (x 0)
            with tags.tensor_class("pooler"):
                extra = 0.0 * torch.tanh(self.pooler(x[:, 0])).float().sum()
        weight = self.word.weight if self.lm_head is None else self.lm_head.weight
        bias = self.head_bias if self.lm_head is None else self.lm_head.bias
        logits = _tagged("head.input", F.linear, x, weight, bias)
        tags.name(labels, "head.labels")
        with tags.tensor_class("head.logits_fp32"):  # log_softmax keeps its fp32 output
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        return loss + extra


def _run_segment(segment: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    for block in segment:
        x = block(x)
    return x


def build_model(spec: ModelSpec, seq_len: int, recompute: str = "none", every_k: int = 1,
                use_sdpa: bool = False, norm_impl: str = "fused") -> TransformerLM:
    """The torch model of `spec` for sequences of `seq_len` tokens with the recompute policy,
    in fp32 on the CPU; `norm_impl` as in `config.NORM_IMPLS`."""
    if seq_len > spec.max_seq_len:
        raise PlanInputError("seq_len", f"{seq_len} exceeds max_seq_len ({spec.max_seq_len}) of {spec.name}")
    return TransformerLM(spec, seq_len, recompute, every_k, use_sdpa, check_norm_impl(norm_impl))
