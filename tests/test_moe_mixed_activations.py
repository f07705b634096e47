"""Activations of models mixing dense and MoE blocks (DeepSeek-V3's dense first blocks, Llama 4's
alternation): each block keeps its own kind's tensors, per stage and per interleaved chunk.

Tiny model worked by hand from the inventory of docs/activations.md: h 64, 4 heads (d 16, MHA),
dense MLP width 256, 4 routed experts of width 32, top-2, SwiGLU, RMSNorm, no dropout, flash
attention; s = 16, b = 1, 2-byte activations, tp = 1, no recompute.
  norm1 / norm2: input 16·64·2 = 2,048 + rstd 16·4 = 64                      -> 2,112 each
  attention: qkv input 2,048, q 16·4·16·2 = 2,048, k 2,048, v 2,048, lse 4·16·4 = 256,
             projection input 2,048                                           -> 10,496
  dense MLP: fc1 input 2,048 + 4 SwiGLU tensors of 16·256·2 = 8,192           -> 34,816
  MoE MLP:   fc1 input 2,048, router probs 16·4·4 = 256, expert input 2·16·64·2 = 4,096,
             4 SwiGLU tensors of (2·16)·32·2 = 2,048, expert output 4,096,
             routing weights 2·16·2 = 64                                      -> 18,752
  dense block 2,112 + 10,496 + 2,112 + 34,816 = 49,536; MoE block 33,472.
"""

from __future__ import annotations

from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout, ModelSpec, TrainSetup
from planner.memory import activations

DENSE_BLOCK, MOE_BLOCK = 49_536, 33_472


def _model(**kw) -> ModelSpec:
    base = dict(name="tiny-moe", num_layers=4, hidden_size=64, num_heads=4, ffn_hidden_size=256,
                vocab_size=128, max_seq_len=64, mlp="swiglu", norm="rmsnorm", position="rotary",
                tied_embeddings=False, linear_bias=False, dropout=False, num_experts=4,
                experts_per_token=2, expert_ffn_hidden_size=32)
    return ModelSpec(**(base | kw))


def _setup() -> TrainSetup:
    return TrainSetup(seq_len=16, global_batch=2, train_tokens=1e6,
                      precision=get_precision("megatron-bf16"), optimizer=get_optimizer("adam"))


def test_block_kinds_by_hand():
    model, lay = _model(first_dense_layers=1), Layout()
    assert activations.layer_activation_bytes(model, lay, 16, 1, 2, moe=False) == DENSE_BLOCK
    assert activations.layer_activation_bytes(model, lay, 16, 1, 2, moe=True) == MOE_BLOCK


def test_dense_first_block_on_stage_one():
    """pp = 2: stage 1 holds block 0 (dense) and block 1 (MoE), stage 2 two MoE blocks."""
    model = _model(first_dense_layers=1)
    layout = Layout(pp=2, grad_accum=2)
    stages = activations.stage_activations(model, layout, _setup(), [2, 2])
    extras = [sum(s.extras.values()) for s in stages]
    assert stages[0].per_microbatch_bytes - extras[0] == DENSE_BLOCK + MOE_BLOCK
    assert stages[1].per_microbatch_bytes - extras[1] == 2 * MOE_BLOCK


def test_interleaved_chunks_follow_megatron_assignment():
    """moe_layer_step 2 (blocks 1 and 3 MoE), pp = 2, v = 2: chunk c of rank i holds block
    c·2 + i, so rank 0 holds blocks 0 and 2 (both dense), rank 1 blocks 1 and 3 (both MoE)."""
    model = _model(moe_layer_step=2)
    assert activations.chunk_moe_layers(model, [2, 2], 2) == [[0, 0], [1, 1]]
    layout = Layout(pp=2, virtual_stages=2, grad_accum=2)
    stages = activations.stage_activations(model, layout, _setup(), [2, 2])
    assert stages[0].per_microbatch_bytes - sum(stages[0].extras.values()) == 2 * DENSE_BLOCK
    assert stages[1].per_microbatch_bytes - sum(stages[1].extras.values()) == 2 * MOE_BLOCK


def test_full_recompute_working_is_the_larger_block():
    model = _model(first_dense_layers=1)
    lay = Layout(recompute="full")
    assert activations.recompute_working_bytes(model, lay, 16, 1, 2, 4) == DENSE_BLOCK
