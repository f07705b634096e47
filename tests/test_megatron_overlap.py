"""Megatron-Core overlaps (planner/timing/megatron_overlap.py): every figure worked by hand.

Engine sources: Transformer Engine d0067d0d transformer_engine/pytorch/module/base.py
(`initialize_ub` default methods and `get_default_config`: ring_exchange num_splits = tp,
pipeline num_splits 4 and num_sm 16 with set_sm_margin, bulk num_sm 16 with set_sm_margin),
comm_gemm_overlap.cpp line 143 (`_math_sms = sm_count - num_comm_sm` under set_sm_margin);
Megatron-LM d98e8a64 megatron/core/distributed/distributed_data_parallel.py line 134 (bucket
max(40e6, 1e6 x dp) parameters) and megatron/training/arguments.py (flag rules).
"""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from planner.core.errors import PlanInputError
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout, ModelSpec, TrainSetup
from planner.io.loading import cluster_for_gpus
from planner.io.megatron import job_from_megatron, megatron_flags, parse_megatron_args
from planner.timing import megatron_overlap as mo
from planner.timing.steptime import estimate_step


def test_sm_margin_factor_h100():
    # 132 SMs, 16 for the collective: the GEMM runs on 116, 132/116 = 1.13793 as long,
    # i.e. 16/116 = 0.137931 extra.
    assert mo.margin_factor(132) == pytest.approx(16 / 116)
    assert mo.margin_factor(108) == pytest.approx(16 / 92)  # A100
    assert mo.margin_factor(None) == 0.0


def test_ring_exchange_exposed():
    # tp 4, all-gather 0.8 s in 3 transfers of 0.2667 s, GEMM 0.4 s in 4 chunks of 0.1 s:
    # each transfer overhangs its chunk by 0.1667 s -> 3 x 0.1667 = 0.5 s exposed.
    assert mo.ring_exchange_exposed_s(0.8, 0.4, 4) == pytest.approx(0.5)
    # all-gather 0.3 s (0.1 per transfer) under chunks of 0.2 s: hidden.
    assert mo.ring_exchange_exposed_s(0.3, 0.8, 4) == pytest.approx(0.0)
    assert mo.ring_exchange_exposed_s(0.3, 0.8, 1) == 0.0  # no tp, no userbuffers


def test_pipelined_reduce_scatter_exposed():
    # GEMM 1.0 s slowed by the margin 0.137931 to 1.137931 s; reduce-scatter 0.4 s in 4
    # chunks of 0.1 s, each hidden behind the next 0.2845 s GEMM chunk except the last:
    # exposed = 0.137931 + 0.1 = 0.237931 s.
    assert mo.pipeline_rs_exposed_s(0.4, 1.0, 16 / 116) == pytest.approx(16 / 116 + 0.1)
    # communication-bound, no margin: RS 2.0, GEMM 1.0: 3 x (0.5 - 0.25) + 0.5 = 1.25 s.
    assert mo.pipeline_rs_exposed_s(2.0, 1.0, 0.0) == pytest.approx(1.25)


def test_bulk_exposed():
    assert mo.bulk_exposed_s(1.0, 0.5, 0.0) == pytest.approx(0.5)  # 1.0 - 0.5
    assert mo.bulk_exposed_s(0.2, 1.0, 0.1) == pytest.approx(0.1)  # margin only: 1.0 x 0.1


def test_layer_exposed_by_hand():
    # tp 2, no margin, one all-gather / reduce-scatter 0.3 s; GEMMs qkv 0.6, proj 0.2,
    # fc1 0.8, fc2 0.8 s.
    # forward: ring AG.qkv 1 x max(0, 0.3 - 0.3) = 0; ring AG.fc1 max(0, 0.3 - 0.4) = 0;
    #   pipeline proj.RS 3 x max(0, (0.3 - 0.2)/4) + 0.3/4 = 0.075 + 0.075 = 0.15;
    #   pipeline fc2.RS 0 + 0.075 = 0.075                                   -> 0.225
    # backward: ring AG.proj-dgrad max(0, 0.3 - 0.1) = 0.2; ring AG.fc2-dgrad 0;
    #   bulk AG / RS beside the qkv and fc1 dgrad / wgrad GEMMs (>= 0.6 s): 0 -> 0.2
    gemms = np.array([0.6, 0.2, 0.8, 0.8])
    assert mo.tp_layer_exposed_s(0.3, gemms, 2, 0.0, False) == pytest.approx(0.425)
    assert mo.tp_layer_exposed_s(0.3, gemms, 2, 0.0, True) == pytest.approx(0.65)  # + forward
    assert mo.tp_layer_exposed_s(0.3, gemms, 1, 0.1, False) == 0.0


def test_block_gemm_flops():
    # h 4096, fused QKV 3 x 4096, 4h GeLU MLP, 2048 tokens, tp 8: 2 x 2048 / 8 = 512 per
    # (k x n): qkv 512 x 4096 x 12288 = 2.5769803776e10; proj 512 x 4096^2 = 8.589934592e9;
    # fc1 = fc2 = 512 x 4096 x 16384 = 3.4359738368e10.
    f = mo.block_gemm_flops(4096, 12288, 4096, 16384, False, 2048, 8)
    assert f.tolist() == [2.5769803776e10, 8.589934592e9, 3.4359738368e10, 3.4359738368e10]
    # SwiGLU doubles fc1 (gate and up): 6.8719476736e10
    assert mo.block_gemm_flops(4096, 12288, 4096, 16384, True, 2048, 8)[2] == 6.8719476736e10


def test_megatron_bucket():
    assert mo.bucket_params(8) == 40_000_000  # max(40e6, 8e6)
    assert mo.bucket_params(48) == 48_000_000  # max(40e6, 48e6)


def test_dp_exposed_by_hand():
    # distributed optimizer: gradient reduce-scatter 0.4 s, parameter all-gather 0.2 s,
    # last bucket 0.05 s, first parameter bucket 0.025 s; one micro-batch forward 0.1 s,
    # backward 0.2 s; no SM interference.
    z1 = np.array(1)
    args = (z1, 0.4, 0.2, 0.05, 0.025, 0.1, 0.2)
    assert [float(x) for x in mo.dp_exposed_s(*args, overlap=())] == pytest.approx([0.6, 0.6])
    # --overlap-grad-reduce: max(0.4 - 0.2, 0.05) = 0.2; all-gather exposed 0.2 -> 0.4
    assert float(mo.dp_exposed_s(*args, overlap=("grad_reduce",))[1]) == pytest.approx(0.4)
    # + --overlap-param-gather: max(0.2 - 0.1, 0.025) = 0.1 -> 0.3
    both = ("grad_reduce", "param_gather")
    assert float(mo.dp_exposed_s(*args, overlap=both)[1]) == pytest.approx(0.3)
    # DDP all-reduce = 2 passes: 0.8 s, floor 2 x 0.05; overlapped: max(0.8 - 0.2, 0.1) = 0.6
    ddp = mo.dp_exposed_s(np.array(0), 0.4, 0.2, 0.05, 0.025, 0.1, 0.2, ("grad_reduce",))
    assert [float(x) for x in ddp] == pytest.approx([0.8, 0.6])
    # SM interference k = 24/132: max(0.2, 0.05 + k x 0.35 = 0.1136) = 0.2 still
    k = 24 / 132
    assert float(mo.dp_exposed_s(*args, overlap=both, k=k)[1]) == pytest.approx(
        0.2 + max(0.1, 0.025 + k * 0.175))


def test_interleaved_grad_reduce_by_hand():
    # Megatron-LM d98e8a64 schedules.py (interleaved, align_grad_reduce): chunk c's gradients
    # (grad_s / v) launched after its last backward, c rounds of pp chunk micro-batches before
    # the end. pp 4, v 3, one micro-batch's stage backward 0.3 s -> a round is 4 x 0.1 = 0.4 s.
    # Gradient reduce-scatter of the stage 1.2 s -> 0.4 s per chunk; no interference.
    # Launches at -0.8 (chunk 2), -0.4 (chunk 1), 0 (chunk 0); the stream runs -0.8 .. 0.4:
    # exposed 0.4 s = max(1.2 - 0.8, 1.2 / 3).
    assert float(mo.interleaved_grad_exposed_s(1.2, 0.3, 4, 3)) == pytest.approx(0.4)
    # A slower reduction, 3.0 s (1.0 per chunk): stream -0.8 .. 2.2 -> 2.2 = 3.0 - 0.8.
    assert float(mo.interleaved_grad_exposed_s(3.0, 0.3, 4, 3)) == pytest.approx(2.2)
    # A fast one, 0.3 s (0.1 per chunk): chunks 2 and 1 finish before chunk 0 is launched;
    # only chunk 0's 0.1 s after the last backward.
    assert float(mo.interleaved_grad_exposed_s(0.3, 0.3, 4, 3)) == pytest.approx(0.1)
    # interference k = 0.2 on the overlapped 0.2 s of the fast case: 0.1 + 0.2 x 0.2 = 0.14
    assert float(mo.interleaved_grad_exposed_s(0.3, 0.3, 4, 3, k=0.2)) == pytest.approx(0.14)


def test_interleaved_param_gather_by_hand():
    # Chunks 0 and 1 launched at the step start, chunk c+1 when chunk c's first micro-batch
    # starts; chunk c needed at c rounds (pp x fwd / v) in, hiding all but its first bucket
    # behind its own first micro-batch (fwd / v). pp 4, v 3, micro-batch forward 0.15 s ->
    # chunk micro-batch 0.05 s, round 0.2 s; all-gather 0.6 s (0.2 per chunk), bucket 0.01 s.
    # Chunk 0: max(0.2 - 0.05, 0.01) = 0.15; all three: 0.6 - (2 x 0.2 + 0.05) = 0.15.
    assert float(mo.interleaved_param_exposed_s(0.6, 0.15, 4, 3, 0.01)) == pytest.approx(0.15)
    # 1.5 s (0.5 per chunk): chunk 0 0.45; whole queue 1.5 - 0.45 = 1.05 (the larger).
    assert float(mo.interleaved_param_exposed_s(1.5, 0.15, 4, 3, 0.01)) == pytest.approx(1.05)


def test_dp_exposed_switches_to_the_interleaved_schedule_at_v_above_1():
    # The test_dp_exposed_by_hand case (grad 0.4, param 0.2, buckets 0.05 / 0.025, forward 0.1,
    # backward 0.2) on pp 4: v = 1 keeps 0.2 + 0.1 = 0.3; v = 2: grads behind (2-1) x 4 x 0.2 / 2
    # = 0.4 s, at least chunk 0's 0.2 -> 0.2; params: chunk 0 max(0.1 - 0.05, 0.025) = 0.05,
    # whole max(0.2 - (1 x 4 + 1) x 0.05, 0.025) = 0.025 -> 0.05; total 0.25.
    both = ("grad_reduce", "param_gather")
    args = (np.array(1), 0.4, 0.2, 0.05, 0.025, 0.1, 0.2, both)
    assert float(mo.dp_exposed_s(*args, pp=4, v=1)[1]) == pytest.approx(0.3)
    assert float(mo.dp_exposed_s(*args, pp=4, v=2)[1]) == pytest.approx(0.25)
    # without the overlaps the schedule changes nothing: all 0.6 exposed
    assert float(mo.dp_exposed_s(*args[:-1], (), pp=4, v=2)[1]) == pytest.approx(0.6)


def test_interleaving_changes_the_wired_dp_exposure():
    # Wired through estimate_step: pp 4 with the Megatron overlaps; v = 2 launches the chunk
    # reductions by the schedule (a round of 4 chunk micro-batches hides them), so the exposed
    # data-parallel time differs from v = 1's last-micro-batch window while the total is equal.
    base = dict(tp=4, pp=4, dp=8, zero_stage=1, sequence_parallel=True, micro_batch=1,
                grad_accum=8, megatron_overlap=("tp_comm", "grad_reduce", "param_gather"))
    one, two = _step(Layout(**base)), _step(Layout(**base, virtual_stages=2))
    assert two.dp_comm_s == pytest.approx(one.dp_comm_s)
    assert two.dp_comm_exposed_s != pytest.approx(one.dp_comm_exposed_s)


# --------------------------------------------------------------------------- wired

MODEL = ModelSpec(name="gpt-13b", num_layers=40, hidden_size=5120, num_heads=40,
                  ffn_hidden_size=20480, vocab_size=51200, max_seq_len=2048)


def _step(layout: Layout):
    setup = TrainSetup(seq_len=2048, global_batch=layout.dp * layout.micro_batch * layout.grad_accum,
                       train_tokens=1e9, precision=get_precision("megatron-bf16"),
                       optimizer=get_optimizer("adam"))
    return estimate_step(MODEL, cluster_for_gpus("h100-sxm", layout.num_gpus), layout, setup)


def test_megatron_defaults_expose_the_whole_reduction():
    # megatron_overlap = (): Megatron's defaults, gradients reduce-scattered and parameters
    # all-gathered outside any compute window -> exposed = total.
    base = dict(tp=4, dp=8, zero_stage=1, sequence_parallel=True, micro_batch=1, grad_accum=4)
    off = _step(Layout(**base, megatron_overlap=()))
    assert off.dp_comm_exposed_s == pytest.approx(off.dp_comm_s)
    on = _step(Layout(**base, megatron_overlap=("grad_reduce", "param_gather")))
    assert on.dp_comm_s == pytest.approx(off.dp_comm_s)
    assert on.dp_comm_exposed_s < off.dp_comm_exposed_s
    # --tp-comm-overlap hides TP traffic (the exposed rest plus the GEMMs' SM margin)
    tp = _step(Layout(**base, megatron_overlap=("tp_comm",)))
    assert tp.tp_comm_s < off.tp_comm_s and tp.compute_s == off.compute_s


def test_layout_rules_are_megatrons():
    with pytest.raises(ValidationError, match="needs sequence_parallel"):
        Layout(tp=2, megatron_overlap=("tp_comm",))
    with pytest.raises(ValidationError, match="needs zero_stage 1"):
        Layout(zero_stage=0, megatron_overlap=("grad_reduce", "param_gather"))
    with pytest.raises(ValidationError, match="needs zero_stage 1"):
        Layout(zero_stage=1, megatron_overlap=("param_gather",))  # without grad_reduce
    with pytest.raises(ValidationError, match="repeat"):
        Layout(megatron_overlap=("grad_reduce", "grad_reduce"))
    with pytest.raises(ValidationError, match="zero_stage 0 or 1"):
        Layout(zero_stage=3, megatron_overlap=())
    with pytest.raises(ValidationError):
        Layout(megatron_overlap=("overlap_everything",))


LINE = ("--num-layers 40 --hidden-size 5120 --num-attention-heads 40 --seq-length 2048 "
        "--max-position-embeddings 2048 --vocab-size 51200 --micro-batch-size 1 "
        "--global-batch-size 64 --tensor-model-parallel-size 4 --bf16 ")


def test_megatron_line_round_trip_with_overlap_flags():
    text = LINE + ("--sequence-parallel --use-distributed-optimizer --tp-comm-overlap "
                   "--overlap-grad-reduce --overlap-param-gather")
    job = job_from_megatron(*parse_megatron_args(text), num_gpus=32)
    assert job.layout.megatron_overlap == ("tp_comm", "grad_reduce", "param_gather")
    setup = TrainSetup(seq_len=2048, global_batch=64, train_tokens=1e9,
                       precision=get_precision("megatron-bf16"), optimizer=get_optimizer("adam"))
    flags = megatron_flags(job.model, job.layout, setup)
    for flag in ("--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather"):
        assert flag in flags
    again = job_from_megatron(*parse_megatron_args(" ".join(flags)), num_gpus=32)
    assert again.layout == job.layout
    only = job_from_megatron(*parse_megatron_args(LINE + "--overlap-grad-reduce"), num_gpus=32)
    assert only.layout.megatron_overlap == ("grad_reduce",)


@pytest.mark.parametrize("extra, match", [
    ("--tp-comm-overlap", "tp_comm .* needs sequence_parallel"),
    ("--overlap-param-gather --overlap-grad-reduce", "needs zero_stage 1"),
    ("--use-distributed-optimizer --overlap-param-gather", "grad_reduce"),
])
def test_bad_megatron_overlap_flags_are_input_errors(extra, match):
    with pytest.raises(PlanInputError, match=match):
        job_from_megatron(*parse_megatron_args(LINE + extra), num_gpus=32)


def test_sweep_pins_and_rows_match_estimate_step():
    # The sweep carries the user's pin to every candidate; each ranked row's step time is
    # estimate_step's on that row's typed layout (the same functions, one row vs all).
    from planner.search import sweep

    zero, engine, sp = mo.sweep_pins(("tp_comm", "grad_reduce", "param_gather"), None, None, None)
    assert (zero, engine, sp) == ((1,), ("deepspeed",), (True,))
    assert mo.sweep_pins(None, (3,), None, None) == ((3,), None, None)
    with pytest.raises(PlanInputError, match="zero 0/1"):
        mo.sweep_pins(("grad_reduce",), (2, 3), None, None)
    with pytest.raises(PlanInputError, match="needs --sequence-parallel"):
        mo.sweep_pins(("tp_comm",), None, None, (False,))
    cluster = cluster_for_gpus("h100-sxm", 32)
    setup = TrainSetup(seq_len=2048, global_batch=64, train_tokens=1e9,
                       precision=get_precision("megatron-bf16"), optimizer=get_optimizer("adam"))
    overlap = ("tp_comm", "grad_reduce", "param_gather")
    result = sweep.sweep(MODEL, cluster, setup, sweep.Constraints(
        zero_stage=zero, dp_engine=engine, sequence_parallel=sp, megatron_overlap=overlap,
        recompute=("selective",), offload_optimizer=("none",), offload_params=("none",)), top=3)
    assert result.top
    for row in result.top:
        assert row.layout.megatron_overlap == overlap and row.layout.sequence_parallel
        assert row.estimate.step_s == pytest.approx(
            estimate_step(MODEL, cluster, row.layout, setup).step_s, rel=1e-9)
