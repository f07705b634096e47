"""The output layer on the last pipeline stage (planner/timing/stage_placement.py), by hand.

Sources: NVIDIA/Megatron-LM commit d98e8a64, megatron/training/training.py `build_model`
(post_process only on the last pipeline rank's last virtual chunk, pre_process on the first's
first) and megatron/core/models/gpt/gpt_model.py (the output layer built only where
post_process); megatron/core/transformer/transformer_block.py `get_num_layers_to_build` for
the account-for-embedding / -loss split.
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.spec import Layout
from planner.io.loading import cluster_for_gpus, load_model
from planner.timing import stage_placement as sp
from planner.timing.steptime import estimate_step
from test_plan import make_setup


def test_last_stage_layers_by_hand():
    # even split, extras to the last stages (params.layers_per_stage): 126 / 16 -> ceil 8;
    # 96 / 8 = 12; uneven: Llama 3 405B 7, 8 x 14, 7 -> last 7; only first given (29 over 2,
    # first 14) -> the other stage 15; one stage: all 126.
    got = sp.last_stage_layers(126, np.array([16, 16, 1]), np.array([0, 7, 0]),
                               np.array([0, 7, 0]))
    assert got.tolist() == [8, 7, 126]
    assert int(sp.last_stage_layers(96, 8)) == 12
    assert int(sp.last_stage_layers(29, 2, 14, 0)) == 15


def test_slowest_stage_and_fill_by_hand():
    # GPT-3 175B on pp 8 (12 blocks a stage), V = 51,200, h = 12,288: the logits GEMM is
    # 2·h·V = 1.258e9 FLOPs a token against a block's 24·h² + 4·s·h = 3.624e9 + 0.1007e9 =
    # 3.725e9 (s = 2048): 0.338 blocks by FLOPs. The last stage (12 + 0.338) is the slowest;
    # the fill runs through the other 84 blocks: 84 / 12.338 = 6.808 units (7 without the head).
    lam = 2 * 12288 * 51200 / (24 * 12288**2 + 4 * 2048 * 12288)
    assert lam == pytest.approx(0.3378, abs=1e-4)
    blocks, on_last = sp.slowest_stage(12, 12, lam)
    assert (int(blocks), float(on_last)) == (12, 1.0)
    assert float(sp.fill_units(96, lam, blocks, on_last)) == pytest.approx(84 / 12.3378, rel=1e-4)
    # Llama 3 405B, 7, 8 x 14, 7 blocks: a head worth 0.8 block leaves the 8-block stages the
    # slowest (7.8 < 8), the fill then 126 + 0.8 - 8 = 118.8 blocks = 14.85 units; a head of
    # 1.5 blocks makes the last stage (8.5) the slowest: (126 - 7) / 8.5 = 14.0 units.
    blocks, on_last = sp.slowest_stage(8, 7, 0.8)
    assert (int(blocks), float(on_last)) == (8, 0.0)
    assert float(sp.fill_units(126, 0.8, blocks, on_last)) == pytest.approx(118.8 / 8)
    blocks, on_last = sp.slowest_stage(8, 7, 1.5)
    assert (int(blocks), float(on_last)) == (7, 1.0)
    assert float(sp.fill_units(126, 1.5, blocks, on_last)) == pytest.approx(119 / 8.5)
    # one stage: the fill is empty whatever the head
    assert float(sp.fill_units(96, 0.34, 96, 1.0)) == 0.0


def test_accounted_stage_layers_by_hand():
    # Megatron get_num_layers_to_build: Llama 3.1 405B, pp 8, both flags: (126 + 2) / 8 = 16 a
    # stage, the first and the last build one fewer: 15, 16 x 6, 15 (and with vp 8: chunks of
    # 2, the first chunk 1 + embedding, the last 1 + loss). Loss only: 126 + 1 = 127 does not
    # divide by 8 (Megatron asserts the same); 95 + 1 = 96: 12 a stage, the last 11.
    assert sp.accounted_stage_layers(126, 8, True, True) == (15, 15)
    assert sp.accounted_stage_layers(126, 8, False, False) == (None, None)
    assert sp.accounted_stage_layers(95, 8, False, True) == (12, 11)
    with pytest.raises(ValueError, match="127 accounted layers"):
        sp.accounted_stage_layers(126, 8, False, True)


def test_head_on_the_last_stage_slows_a_pipeline_by_its_flops():
    # GPT-3 175B (V = 50,257 padded as the preset has it), tp 8 pp 8 on 64 A100, --efficiency
    # fixed at 0.5 so the matmul time is FLOPs / (312e12 x 0.5): the slowest stage's matmul
    # FLOPs = 12 blocks' share + the WHOLE head's share (pp / GPUs of the job's logits FLOPs),
    # where the old even spread gave 12 / 96 of (blocks + head). By hand from flops: per GPU
    # (job FLOPs x pp / GPUs = / 8), blocks 12 / 96.
    model = load_model("gpt3-175b")
    cluster = cluster_for_gpus("a100-80gb", 64)
    setup = make_setup(64, seq_len=2048, precision="megatron-bf16")
    layout = Layout(tp=8, pp=8, dp=1, micro_batch=1, grad_accum=64, flash_attention=True)
    est = estimate_step(model, cluster, layout, setup, efficiency=0.5)
    h, v, s, b, L = 12288, model.vocab_size, 2048, 64, 96
    head = 2 * b * s * h * v  # logits forward of the whole step (seed 004 §1.2.4)
    from planner.core import flops

    blocks = flops.forward_flops(model, b, s) - head
    per_gpu = 3 * (blocks * 12 / L + head) / 8
    assert est.compute_s == pytest.approx(per_gpu / (312e12 * 0.5), rel=1e-9)
    even = 3 * (blocks + head) * 12 / L / 8
    assert per_gpu / even == pytest.approx(1 + (head * (1 - 12 / L)) / ((blocks + head) * 12 / L),
                                           rel=1e-12)
