"""The step's transient peak inside the plan, the sweep and the verdict (issue 11, item 1).

Every expected figure is worked by hand from the shapes (planner.memory.peak's module docstring
names the engine code each transient comes from); the plan's own figures are used only as the
other terms of a sum whose transient part is worked here.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from planner.core.spec import GIB, Layout
from planner.io.jobfile import make_setup
from planner.io.loading import cluster_for_gpus, load_model
from planner.memory import peak
from planner.memory.plan import plan_memory
from planner.search import sweep


def test_megatron_vocab_parallel_loss_casts_one_bf16_gradient_on_the_last_stage():
    # llama3-8b, tp 2, pp 2, b 2, s 4096, bf16: the vocab-parallel loss writes its gradient into
    # the fp32 softmax it saved; only the cast back to bf16 is new: b*s*ceil(V/t)*2 bytes
    model = load_model("llama3-8b")
    cluster = cluster_for_gpus("h100-sxm", 8)
    layout = Layout(tp=2, pp=2, dp=2, micro_batch=2, grad_accum=4)
    plan = plan_memory(model, cluster, layout, make_setup(4096, 16, 1e9, "bf16-mixed", "adam"))
    first, last = plan.stages
    assert last.buffers["loss_backward"] == 2 * 4096 * (128256 // 2) * 2 == 1_050_673_152
    assert "loss_backward" not in first.buffers and "optimizer_step" not in last.buffers
    assert last.total_bytes == (last.params_bytes + last.grads_bytes + last.optimizer_bytes
                                + last.activations_bytes + sum(last.buffers.values()))


def test_fp32_logits_need_no_cast_in_the_vocab_parallel_loss():
    model = load_model("gpt2")
    cluster = cluster_for_gpus("h100-sxm", 1)
    plan = plan_memory(model, cluster, Layout(micro_batch=2), make_setup(1024, 2, 1e9, "fp32", "adam"))
    assert "loss_backward" not in plan.stages[0].buffers


def test_transformers_unfused_loss_keeps_two_fp32_logit_tensors():
    # hf-sdpa llama3-8b, b 1, s 2048: nll_loss_backward's fp32 [T, V] gradient and
    # _log_softmax_backward_data's fp32 [T, V] output alive together: 2 * 2048 * 128256 * 4
    model = load_model("llama3-8b")
    cluster = cluster_for_gpus("h100-sxm", 1)
    setup = make_setup(2048, 1, 1e9, "bf16-mixed", "adam", None, "hf-sdpa")
    plan = plan_memory(model, cluster, Layout(micro_batch=1), setup)
    assert plan.stages[0].buffers["loss_backward"] == 2 * 2048 * 128256 * 4 == 2_101_346_304


def test_loss_backward_counts_only_beyond_the_recompute_segment():
    # full recompute: the head's backward frees the fp32 loss gradients before the last block is
    # recomputed, so the transient is max(loss, segment): the buffer holds loss - segment
    model = load_model("llama3-8b")
    cluster = cluster_for_gpus("h100-sxm", 1)
    setup = make_setup(2048, 1, 1e9, "bf16-mixed", "adam", None, "hf-sdpa")
    stage = plan_memory(model, cluster, Layout(micro_batch=1, recompute="full"), setup).stages[0]
    segment = stage.working["recompute_segment"]
    assert 0 < segment < 2_101_346_304
    assert stage.buffers["loss_backward"] == 2_101_346_304 - segment


def test_fsdp2_foreach_adam_temporary_exceeds_small_activations():
    # gpt2 (124,439,808 parameters, tied head), FSDP2 ZeRO-3 over 8 GPUs, s 32, b 1, fp32:
    # torch AdamW's foreach keeps one fp32 copy of the local shard's exp_avg_sq:
    # ceil(124,439,808 / 8) * 4 = 62,219,904 bytes; the backward holds the activations and the
    # loss (vocab-parallel with fp32 logits: no cast, 0), so the optimizer
    # step exceeds it by 62,219,904 - activations
    model = load_model("gpt2")
    cluster = cluster_for_gpus("h100-sxm", 8)
    layout = Layout(dp=8, zero_stage=3, dp_engine="fsdp2", micro_batch=1)
    stage = plan_memory(model, cluster, layout, make_setup(32, 8, 1e9, "fp32", "adam")).stages[0]
    assert stage.num_params == 124_439_808
    assert stage.buffers["optimizer_step"] == 124_439_808 // 8 * 4 - stage.activations_bytes
    assert stage.buffers["optimizer_step"] > 0
    # the same layout on DeepSpeed: FusedAdam keeps no temporary
    ds = plan_memory(model, cluster, layout.model_copy(update={"dp_engine": "deepspeed"}),
                     make_setup(32, 8, 1e9, "fp32", "adam")).stages[0]
    assert "optimizer_step" not in ds.buffers


def test_fsdp2_foreach_temporary_is_over_the_dp_x_cp_shard():
    # the same gpt2 over dp 4 x cp 2: the optimizer states are sharded over the 8 dp x cp ranks
    # (model_states.shard_ranks), so foreach's one fp32 state-sized temporary is of the same
    # ceil(124,439,808 / 8) elements, 62,219,904 bytes (not / 4: 124,439,808 bytes, what the
    # plan counted before session 23). The backward's own bytes (kept activations, cp's
    # attention buffers; the loss 0 with fp32 logits) are the plan's.
    model = load_model("gpt2")
    cluster = cluster_for_gpus("h100-sxm", 8)
    layout = Layout(dp=4, cp=2, zero_stage=3, dp_engine="fsdp2", micro_batch=1)
    stage = plan_memory(model, cluster, layout, make_setup(32, 4, 1e9, "fp32", "adam")).stages[0]
    assert stage.optimizer_bytes == 124_439_808 // 8 * 8  # exp_avg + exp_avg_sq, fp32, / 8
    backward = stage.activations_bytes + stage.working["cp_attention_buffers"]
    assert stage.buffers["optimizer_step"] + backward == 124_439_808 // 8 * 4 == 62_219_904


def test_the_verdict_counts_the_transient():
    # capacity set (through the reserve) between the resident bytes and the step's peak: the
    # resident would fit, the step does not, and the plan says so
    model = load_model("llama3-8b")
    cluster = cluster_for_gpus("h100-sxm", 1)
    layout = Layout(micro_batch=1)
    base = make_setup(2048, 1, 1e9, "bf16-mixed", "adam", 0.0, "hf-sdpa")
    # llama3-8b's 16 bytes per parameter exceed 80 GB: a 2-layer cut of it (same vocabulary)
    small = model.model_copy(update={"num_layers": 2, "published_params": None})
    stage = plan_memory(small, cluster, layout, base).stages[0]
    resident = stage.total_bytes - stage.buffers["loss_backward"]
    reserve_gib = (cluster.gpu.memory_bytes - resident - 2_101_346_304 // 2) / GIB
    plan = plan_memory(small, cluster, layout, base.model_copy(update={"reserve_gib": reserve_gib}))
    assert plan.stages[0].capacity_bytes >= resident and not plan.fits
    assert plan.overflows and plan.overflows[0].startswith("GPU memory on stage 1")


def test_sweep_columns_carry_the_same_transients():
    model = load_model("gpt2")
    cluster = cluster_for_gpus("h100-sxm", 8)
    setup = make_setup(128, 8, 1e9, "fp32", "adam")
    c = sweep.Constraints(dp_engine=("fsdp2",), micro_batch=(1,))
    cands = sweep.enumerate_candidates(model, cluster, setup, c)
    cols = sweep.evaluate(model, cluster, setup, cands, c)
    assert len(cands) > 0
    for i in range(len(cands)):
        mem = plan_memory(model, cluster, sweep.layout_at(cands, i, c), setup)
        assert int(cols["gpu_peak_bytes"][i]) == max(s.total_bytes for s in mem.stages)
    assert np.any([("optimizer_step" in s.buffers) for i in range(len(cands))
                   for s in plan_memory(model, cluster, sweep.layout_at(cands, i, c), setup).stages])


def test_the_peak_is_the_larger_of_the_two_moments():
    # by hand: kept 10, recompute segment 4, loss backward 7, optimizer temporaries 30 bytes.
    # Start of backward: 10 kept + max(7, 4) = 17; optimizer step: 30 (activations freed).
    # The named parts on top of kept + recompute (14): loss_backward 7 - 4 = 3, optimizer_step
    # 30 - 17 = 13; 14 + 3 + 13 = 30, the larger moment.
    assert peak.backward_moment_bytes(10, 4, 7) == 17
    assert peak.above_resident_bytes(17, 30) == 30
    assert peak.plan_transients(10, 4, 7, 30) == {"loss_backward": 3, "optimizer_step": 13}
    # temporaries of 5 bytes: the backward is the peak (17), no optimizer_step excess; a loss
    # smaller than the recompute segment adds nothing either
    assert peak.plan_transients(10, 4, 7, 5) == {"loss_backward": 3, "optimizer_step": 0}
    assert peak.plan_transients(10, 4, 2, 5) == {"loss_backward": 0, "optimizer_step": 0}
    # the sweep's columns: the same arithmetic on arrays
    got = peak.above_resident_bytes(peak.backward_moment_bytes(np.array([10, 10]), 4, 7),
                                    np.array([30, 5]))
    assert got.tolist() == [30, 17]


@given(*[st.integers(0, 2**62 // 4)] * 4)
def test_the_named_transients_add_up_to_the_larger_moment(kept, recompute, loss, temps):
    # `plan_memory` reports the named parts, the sweep adds the larger moment to the states
    # directly: for any byte counts the two are the same total, and neither part is negative
    parts = peak.plan_transients(kept, recompute, loss, temps)
    moment = peak.backward_moment_bytes(kept, recompute, loss)
    assert min(parts.values()) >= 0
    assert kept + recompute + sum(parts.values()) == peak.above_resident_bytes(moment, temps)
    assert peak.above_resident_bytes(moment, temps) == max(kept + max(loss, recompute), temps)
