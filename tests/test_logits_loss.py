"""The loss kernels over the logits (planner/timing/logits.py), worked by hand from torch 2.13.0
(`torch/_decomp/decompositions.py` `_nll_loss_backward`, `_log_softmax_backward_data`; log_softmax
in autocast's float32 list, `torch/testing/_internal/autocast_test_lists.py`) and torchtitan's
`cross_entropy_loss` (`pred.float()`)."""

from __future__ import annotations

import pytest

from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout, ModelSpec, TrainSetup
from planner.timing.logits import loss_bytes_per_logit, loss_kernel_bytes
from planner.timing.steptime import estimate_step


def test_bytes_per_logit_by_hand():
    # bf16 logits: forward cast 2 + 4, log_softmax 4 + 4 = 14; backward nll_loss_backward
    # writes 4, log_softmax backward reads 4 + 4 writes 4, cast back reads 4 writes 2 = 22.
    assert loss_bytes_per_logit(2) == (14, 36)
    # fp32 logits: no casts: forward 8, backward 4 + 12 = 16.
    assert loss_bytes_per_logit(4) == (8, 24)


def test_mpt_125m_micro_batch_by_hand():
    # MosaicML MPT-125m, micro-batch 40 x 2048 tokens, vocabulary 50,368, one GPU (tp 1):
    # 81,920 x 50,368 = 4,126,146,560 logits x 36 B = 148,541,276,160 B; at the A100's
    # 2,039 GB/s (datasheet) 72.85 ms per micro-batch.
    fwd, total = loss_kernel_bytes(40 * 2048, 50368, 1)
    assert total == 148_541_276_160
    assert fwd == 4_126_146_560 * 14
    assert total / 2.039e12 == pytest.approx(0.07285, rel=1e-3)
    # tensor parallel splits the vocabulary: tp 4 moves a quarter
    assert loss_kernel_bytes(40 * 2048, 50368, 4)[1] == total / 4


def test_step_grows_by_the_loss_bytes_of_a_larger_vocabulary():
    # Two models differing only in vocabulary (32,000 vs 64,000), one A100, bf16, micro-batch 2
    # x 1024 tokens, 3 micro-batches: the memory-bound term grows by
    # 3 x 2,048 x 32,000 x 36 B = 7,077,888,000 B / 2.039e12 B/s = 3.4713 ms.
    from planner.io.loading import cluster_for_gpus

    setup = TrainSetup(seq_len=1024, global_batch=6, train_tokens=1e9,
                       precision=get_precision("megatron-bf16"), optimizer=get_optimizer("adam"))
    layout = Layout(micro_batch=2, grad_accum=3)
    cluster = cluster_for_gpus("a100-80gb", 1)
    est = {v: estimate_step(ModelSpec(name=f"v{v}", num_layers=4, hidden_size=512, num_heads=8,
                                      ffn_hidden_size=2048, vocab_size=v, max_seq_len=1024),
                            cluster, layout, setup) for v in (32000, 64000)}
    grown = est[64000].memory_bound_s - est[32000].memory_bound_s
    assert grown == pytest.approx(3 * 2048 * 32000 * 36 / 2.039e12, rel=1e-9)
