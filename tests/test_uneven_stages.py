"""Uneven pipeline stages as Megatron-LM's --decoder-first/last-pipeline-num-layers: the split,
its rules (transformer_config.py / transformer_block.py, NVIDIA/Megatron-LM commit d98e8a64),
memory per stage and the bubble by hand, the Megatron reader and writer."""

from __future__ import annotations

import pytest

from planner.core import params, rules
from planner.core.columns import LayoutColumns
from planner.core.errors import PlanInputError
from planner.core.spec import Layout, ModelSpec
from planner.io.megatron import job_from_megatron, megatron_flags, parse_megatron_args
from planner.memory.plan import plan_memory
from planner.timing.steptime import estimate_step
from test_sweep_steptime_cases import SETUP, cluster

# A GPT of 30 blocks, h = 64, 4 heads, f = 4h, V = 100, learned positions of 16, tied embeddings
GPT30 = ModelSpec(name="gpt30", num_layers=30, hidden_size=64, num_heads=4, ffn_hidden_size=256,
                  vocab_size=100, max_seq_len=16)


def test_126_layers_over_16_stages_with_first_and_last_counts():
    # Llama 3 405B's depth: 7 on the first and last stage leave 126 - 14 = 112 = 14 x 8
    assert params.layers_per_stage(126, 16, 7, 7) == [7] + [8] * 14 + [7]
    # only the first given: 126 - 6 = 120 over 15 stages = 8
    assert params.layers_per_stage(126, 16, first=6) == [6] + [8] * 15
    # 126 - 13 = 113 does not divide over 14 middle stages: a one-line error
    with pytest.raises(PlanInputError, match="113 layers of num_layers=126 for 14 middle"):
        params.layers_per_stage(126, 16, 6, 7)


def _allowed(layout: Layout, model: ModelSpec = GPT30) -> bool:
    ctx = rules.Context(model, cluster(layout.num_gpus), SETUP)
    ok, _ = rules.mask(ctx, LayoutColumns.from_layout(layout))
    return bool(ok[0])


def test_megatron_rules_with_interleaving():
    # 30 layers, pp 4, v 2: even interleaving needs 30 % 8 == 0 (refused); with first 6, last
    # 8 the middle 16 over 2 stages = 8, and 6, 8, 8 are all multiples of v = 2 (allowed)
    base = dict(pp=4, virtual_stages=2, grad_accum=4, micro_batch=1)
    assert not _allowed(Layout(**base))
    assert _allowed(Layout(**base, first_stage_layers=6, last_stage_layers=8))
    # v = 4: 6 % 4 != 0 (transformer_config.py "must be divisible by virtual pipeline parallel
    # degree")
    assert not _allowed(Layout(**{**base, "virtual_stages": 4, "grad_accum": 4},
                               first_stage_layers=6, last_stage_layers=8))
    # pp 2 with both given: no middle stage, so first + last must be all 30 layers
    assert _allowed(Layout(pp=2, first_stage_layers=14, last_stage_layers=16, grad_accum=4))
    assert not _allowed(Layout(pp=2, first_stage_layers=14, last_stage_layers=14, grad_accum=4))
    # the interleaved schedule still needs micro-batches divisible by pp (global batch 6 here)
    ctx = rules.Context(GPT30, cluster(4), SETUP.model_copy(update=dict(global_batch=6)))
    _, rejected = rules.mask(ctx, LayoutColumns.from_layout(
        Layout(**{**base, "grad_accum": 6}, first_stage_layers=6, last_stage_layers=8)))
    assert list(rejected) == ["interleaving needs grad_accum divisible by pp"]


def test_memory_per_stage_by_hand():
    # GPT block with biases, tp 1: 12 h^2 + 13 h = 49,152 + 832 = 49,984 parameters.
    # First stage: + word embeddings V h = 6,400 + learned positions 16 h = 1,024.
    # Last stage (pp > 1, tied): its own word-embedding copy 6,400 + final LayerNorm 2 h = 128.
    per_layer = 12 * 64**2 + 13 * 64
    stages = params.stage_params(GPT30, 1, 4, first=6, last=8)
    assert [s.num_layers for s in stages] == [6, 8, 8, 8]
    assert [s.total for s in stages] == [6 * per_layer + 6400 + 1024, 8 * per_layer,
                                         8 * per_layer, 8 * per_layer + 6400 + 128]
    # plan_memory holds the same parameters per stage (zero-fp16: 2 bytes each)
    lay = Layout(pp=4, first_stage_layers=6, last_stage_layers=8, grad_accum=4)
    plan = plan_memory(GPT30, cluster(4), lay, SETUP)
    assert [s.num_layers for s in plan.stages] == [6, 8, 8, 8]
    assert [s.params_bytes for s in plan.stages] == [2 * s.total for s in stages]


def test_bubble_by_hand():
    # Stages [6, 8, 8, 8] blocks; the output layer and loss on the last stage (Megatron-Core
    # post_process; planner/timing/stage_placement), so it is the slowest: 8 blocks + head.
    # Fill and drain run through the other 22 blocks (not pp - 1 = 3 slowest-stage times):
    # per 1F1B (Narayanan et al. 2021 §2.2.1) bubble = 22 blocks' step time / m.
    # The head by hand (B = 4, s = 16, h = 64, V = 100; one GPU a stage, m = 4 of b = 1): the
    # logits forward 2·B·s·h·V = 819,200 FLOPs x 3 with the backward at 1e12 x 0.5, and the
    # loss kernels' 36 B per logit over 4 x 16 x 100 logits at 1000 GB/s: 5.1456e-6 s.
    head_s = 3 * 2 * 4 * 16 * 64 * 100 / 0.5e12 + 4 * 16 * 100 * 36 / 1000e9
    assert head_s == pytest.approx(5.1456e-6, rel=1e-12)
    lay = Layout(pp=4, first_stage_layers=6, last_stage_layers=8, grad_accum=4)
    est = estimate_step(GPT30, cluster(4), lay, SETUP, efficiency=0.5)
    block_s = (est.compute_s + est.recompute_s + est.memory_bound_s - head_s) / 8
    assert est.bubble_s == pytest.approx(22 * block_s / 4, rel=1e-9)
    # even stages of 8 (32 blocks): the others hold 24 blocks
    even = estimate_step(GPT30.model_copy(update=dict(num_layers=32)), cluster(4),
                         Layout(pp=4, grad_accum=4), SETUP, efficiency=0.5)
    even_block_s = (even.compute_s + even.recompute_s + even.memory_bound_s - head_s) / 8
    assert even.bubble_s == pytest.approx(24 * even_block_s / 4, rel=1e-9)
    # (before the head was placed: 2.75 and 3 slowest-stage times, the head spread evenly)


def test_megatron_flags_round_trip():
    lay = Layout(tp=1, pp=4, dp=1, virtual_stages=2, first_stage_layers=6, last_stage_layers=8,
                 grad_accum=4)
    flags = megatron_flags(GPT30, lay, SETUP.model_copy(update=dict(global_batch=4)))
    text = " ".join(flags)
    assert "--decoder-first-pipeline-num-layers 6" in text
    assert "--decoder-last-pipeline-num-layers 8" in text
    # arguments.py: uneven stages take --num-virtual-stages-per-pipeline-rank, not the
    # layers-per-virtual-stage flag
    assert "--num-virtual-stages-per-pipeline-rank 2" in text
    assert "--num-layers-per-virtual-pipeline-stage" not in text
    launcher, args = parse_megatron_args("torchrun --nproc_per_node 4 pretrain_gpt.py " + text)
    job = job_from_megatron(launcher, args, num_gpus=None)
    assert (job.layout.first_stage_layers, job.layout.last_stage_layers) == (6, 8)
    assert job.layout.virtual_stages == 2


def test_cli_fit_accepts_and_refuses(zplan):
    ok = zplan("fit", "--model", "gpt3-175b", "--gpu", "h100-sxm", "--gpus", "768", "--tp", "8",
               "--pp", "12", "--first-stage-layers", "6", "--last-stage-layers", "10")
    assert ok.returncode in (0, 1), ok.stderr
    assert "   12      10 " in ok.stdout  # the last stage holds 10 blocks
    bad = zplan("fit", "--model", "gpt3-175b", "--gpu", "h100-sxm", "--gpus", "768", "--tp", "8",
                "--pp", "12", "--first-stage-layers", "7", "--last-stage-layers", "7")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "first_stage_layers" in bad.stderr
