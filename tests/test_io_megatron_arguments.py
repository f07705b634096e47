"""The flags `megatron_flags` writes, parsed by a transcription of Megatron-LM's own argparse
declarations.

Megatron-LM's parser (`megatron/training/arguments.py`) cannot be installed: the PyPI package
`megatron-core` (0.16.1, wheel and sdist checked) ships only `megatron/core`. So the
declarations of every flag the writer can emit are copied below by hand from
NVIDIA/Megatron-LM `megatron/training/arguments.py` at commit 000c4ac24f61159c138b0975def722c65245983c
(name, action, type, choices; the function each comes from is named), into a parser built as
`parse_args()` builds its own (`argparse.ArgumentParser(allow_abbrev=False)`). A misspelt flag,
a value given to a store_true flag, a missing value or a value outside `choices` is an argparse
error here as it is in Megatron-LM. What this does not check: flags the writer never emits, and
`validate_args`' cross-flag rules (tests/test_io_megatron.py reads the lines back instead).
"""

from __future__ import annotations

import argparse

import pytest

from planner.io.megatron import megatron_flags
from planner.io.loading import load_model
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout, TrainSetup

_STORE_TRUE = "store_true"


def megatron_parser() -> argparse.ArgumentParser:
    """The subset of Megatron-LM's parser covering every flag `megatron_flags` can write."""
    p = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    # _add_network_size_args
    for flag in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
                 "--kv-channels", "--max-position-embeddings"):
        p.add_argument(flag, type=int, default=None)
    p.add_argument("--num-query-groups", type=int, default=1)
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    p.add_argument("--group-query-attention", action=_STORE_TRUE)
    # type=lambda s: AttnBackend[s], choices=list(AttnBackend); help: "(flash,fused,unfused,local,auto)"
    p.add_argument("--attention-backend", default="auto", choices=["flash", "fused", "unfused", "local", "auto"])
    p.add_argument("--position-embedding-type", type=str, default="learned_absolute",
                   choices=["learned_absolute", "rope", "mrope", "relative", "none"])
    p.add_argument("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"])
    p.add_argument("--swiglu", action=_STORE_TRUE)
    p.add_argument("--untie-embeddings-and-output-weights", action=_STORE_TRUE)
    # _add_regularization_args
    p.add_argument("--attention-dropout", type=float, default=0.1)
    p.add_argument("--hidden-dropout", type=float, default=0.1)
    # _add_training_args
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--global-batch-size", type=int, default=None)
    p.add_argument("--recompute-activations", action=_STORE_TRUE)
    p.add_argument("--recompute-granularity", type=str, default=None, choices=["full", "selective"])
    p.add_argument("--recompute-method", type=str, default=None, choices=["uniform", "block"])
    p.add_argument("--recompute-num-layers", type=int, default=None)
    p.add_argument("--train-iters", type=int, default=None)
    p.add_argument("--train-samples", type=int, default=None)
    p.add_argument("--use-flash-attn", action=_STORE_TRUE)
    p.add_argument("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    p.add_argument("--add-qkv-bias", action=_STORE_TRUE, dest="add_qkv_bias")
    p.add_argument("--optimizer", type=str, default="adam", choices=["adam", "sgd", "muon", "dist_muon"])
    p.add_argument("--sequence-parallel", action=_STORE_TRUE)
    # _add_mixed_precision_args
    for flag in ("--fp16", "--bf16", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"):
        p.add_argument(flag, action=_STORE_TRUE)
    # _add_distributed_args
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    p.add_argument("--use-distributed-optimizer", action=_STORE_TRUE)
    # _add_tokenizer_args, _add_data_args
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--seq-length", type=int, default=None)
    # _add_moe_args
    p.add_argument("--num-experts", type=int, default=None)
    p.add_argument("--moe-ffn-hidden-size", type=int, default=None)
    p.add_argument("--moe-shared-expert-intermediate-size", type=int, default=None)
    p.add_argument("--moe-router-topk", type=int, default=2)
    return p


def _setup(precision: str, batch: int, optimizer: str = "adamw") -> TrainSetup:
    return TrainSetup(seq_len=4096, global_batch=batch, train_tokens=4096 * 1000,
                      precision=get_precision(precision), optimizer=get_optimizer(optimizer))


LLAMA2_7B = load_model("llama2-7b")


@pytest.mark.parametrize(
    ("model", "layout", "precision"),
    [
        (LLAMA2_7B, Layout(tp=2, pp=2, dp=2, virtual_stages=2, zero_stage=1, sequence_parallel=True,
                           recompute="selective", flash_attention=True, micro_batch=2, grad_accum=4), "megatron-bf16"),
        (LLAMA2_7B, Layout(tp=4, pp=2, dp=1, recompute="every_k", recompute_every_k=2), "bf16-mixed"),
        (load_model("gpt3-175b"), Layout(tp=8, pp=8, dp=2, recompute="full"), "megatron-fp16"),
        (load_model("llama3-70b"), Layout(tp=8, pp=4, dp=4), "zero-fp16"),
        (load_model("mixtral-8x7b"), Layout(tp=2, pp=4, dp=1), "fp32"),
    ],
)
def test_flags_parse_with_megatrons_declarations(model, layout, precision):
    batch = layout.micro_batch * layout.grad_accum * layout.dp
    flags = megatron_flags(model, layout, _setup(precision, batch))
    args = megatron_parser().parse_args(flags)  # argparse exits on any misspelling or arity error
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (layout.tp, layout.pp)
    assert (args.micro_batch_size, args.global_batch_size) == (layout.micro_batch, batch)
    assert (args.num_layers, args.hidden_size, args.num_attention_heads) == (
        model.num_layers, model.hidden_size, model.num_heads)
    assert args.seq_length == 4096 and args.train_samples == 1000  # 4096*1000 tokens / 4096
    if layout.virtual_stages > 1:  # layers / (pp * chunks) = 32 / (2 * 2) = 8
        assert args.num_layers_per_virtual_pipeline_stage == model.num_layers // (layout.pp * layout.virtual_stages)
    assert args.sequence_parallel is layout.sequence_parallel
    assert args.use_distributed_optimizer is (layout.zero_stage == 1)
    granularity = {"none": None, "selective": "selective", "full": "full", "every_k": "full"}
    assert args.recompute_granularity == granularity[layout.recompute]
    assert (args.bf16, args.fp16) == ("bf16" in precision, "fp16" in precision)
    assert args.attention_backend == ("flash" if layout.flash_attention else "unfused")
    if model.is_moe:  # Mixtral-8x7B: 8 experts, top-2 (model card)
        assert (args.num_experts, args.moe_router_topk) == (8, 2)


def test_rarer_model_flags_parse():
    """kv-channels, add-qkv-bias and shared experts, which no preset needs."""
    odd = LLAMA2_7B.model_copy(update={"head_dim": 96, "qkv_bias": True, "linear_bias": False})
    args = megatron_parser().parse_args(megatron_flags(odd, Layout(dp=8), _setup("megatron-bf16", 8)))
    assert args.kv_channels == 96 and args.add_qkv_bias and not args.add_bias_linear
    mixtral = load_model("mixtral-8x7b")
    shared = mixtral.model_copy(update={"num_shared_experts": 2})
    args = megatron_parser().parse_args(megatron_flags(shared, Layout(dp=8), _setup("megatron-bf16", 8)))
    assert args.moe_shared_expert_intermediate_size == 2 * mixtral.expert_ffn_size


@pytest.mark.parametrize(
    "bad",
    [
        ["--virtual-pipeline-model-parallel-size", "2"],  # not a Megatron-LM flag
        ["--tensor-model-parallel", "2"],  # abbreviations are off (allow_abbrev=False)
        ["--sequence-parallel", "true"],  # store_true takes no value
        ["--recompute-granularity", "layer"],  # outside choices
    ],
)
def test_parser_rejects_what_megatron_rejects(bad):
    with pytest.raises(SystemExit):
        megatron_parser().parse_args(bad)
