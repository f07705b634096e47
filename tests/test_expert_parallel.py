"""Expert parallelism (issue 13): rules, parameters and model states per GPU, the all-to-all.

Every expected number is worked by hand below from the model's config.json dimensions
(Mixtral-8x7B: h 4096, f 14336, 32 layers, 32 heads, 8 kv heads, 8 experts top-2, vocab 32000,
untied; DeepSeek-V3: h 7168, 61 layers of which the first 3 dense, 256 routed experts of
width 2048 top-8, 1 shared expert, MLA q_lora 1536 / kv_lora 512 / nope 128 / rope 64 / v 128,
128 heads, vocab 129280, untied) or from Megatron-LM's own estimator
(megatron/training/theoretical_memory_usage.py at commit d98e8a64), transcribed as arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.columns import LayoutColumns
from planner.core.errors import PlanInputError
from planner.core.recipes import get_optimizer, get_precision
from planner.core.rules import Context, check_layout
from planner.core.spec import Layout, TrainSetup
from planner.io.loading import load_cluster, load_model
from planner.memory import experts
from planner.memory.plan import plan_memory
from planner.timing import collectives, expert
from planner.timing.steptime import cluster_rates, estimate_step

MIXTRAL = load_model("mixtral-8x7b")
DSV3 = load_model("deepseek-v3")
H100x32 = load_cluster("dgx-h100x32")  # 32 nodes x 8 GPUs


def _setup(seq_len=4096, global_batch=256, **kw) -> TrainSetup:
    return TrainSetup(seq_len=seq_len, global_batch=global_batch, train_tokens=1e12,
                      precision=get_precision("megatron-bf16"), optimizer=get_optimizer("adam"), **kw)


# --------------------------------------------------------------------------- parameters

# Mixtral, one tp=2 rank:
#   one expert: 3 x 4096 x 14336 = 176,160,768; / tp 2 = 88,080,384; 8 experts = 704,643,072
#   attention (q 4096^2, k, v 4096 x 1024, o 4096^2) = 41,943,040 / 2 = 20,971,520
#   router 4096 x 8 = 32,768 and two RMSNorms 2 x 4096 = 8,192, replicated
#   dense part of a block = 20,971,520 + 32,768 + 8,192 = 21,012,480
#   embedding rows 32000 / 2 = 16,000 x 4096 = 65,536,000 (stage 1 of pp = 4: 8 blocks)
MIXTRAL_EXPERT_PER_RANK = 88_080_384
MIXTRAL_STAGE1_DENSE = 8 * 21_012_480 + 65_536_000  # 233,635,840


def test_mixtral_routed_params_per_rank():
    assert experts.routed_expert_params_per_rank(MIXTRAL, 2) == 8 * MIXTRAL_EXPERT_PER_RANK
    routed = experts.stage_routed_params(MIXTRAL, 2, 4)
    assert routed == [8 * 8 * MIXTRAL_EXPERT_PER_RANK] * 4


@pytest.mark.parametrize("ep, experts_here", [(1, 8), (2, 4), (8, 1)])
def test_mixtral_params_per_gpu(ep, experts_here):
    """Stage 1 at tp=2 pp=4: the dense part as without ep, the experts / ep."""
    layout = Layout(tp=2, pp=4, dp=32, ep=ep, zero_stage=1, grad_accum=8)
    plan = plan_memory(MIXTRAL, H100x32, layout, _setup())
    assert plan.stages[0].num_params == MIXTRAL_STAGE1_DENSE + 8 * experts_here * MIXTRAL_EXPERT_PER_RANK


def test_deepseek_v3_params_per_gpu_published_layout():
    """DeepSeek-V3 at tp=1, pp=16, ep=64 (its report's layout), last stage.

    61 layers over 16 stages: 3 3 3 4 ... 4 (the extra go last); the last stage holds blocks
    57-60, all MoE. Routed per GPU: 256/64 = 4 experts x 3 x 7168 x 2048 (44,040,192 each)
    = 176,160,768 per block, x 4 = 704,643,072.
    Dense part of one MoE block: MLA q_a 7168x1536 = 11,010,048, q_a norm 1,536, q_b
    1536 x 128 x 192 = 37,748,736, kv_a 7168 x 576 = 4,128,768, kv_a norm 512, kv_b
    512 x 128 x 256 = 16,777,216, o 16384 x 7168 = 117,440,512 (sum 187,107,328); router
    256 x 7168 = 1,835,008; shared expert 44,040,192; two norms 14,336: 232,996,864.
    Last stage: 4 blocks + final norm 7,168 + lm_head 129,280 x 7168 = 926,679,040."""
    dense = 4 * 232_996_864 + 7_168 + 926_679_040
    routed = 4 * 4 * 44_040_192
    layout = Layout(tp=1, pp=16, dp=128, ep=64, zero_stage=1, micro_batch=1, grad_accum=120)
    from planner.search.sweep import with_gpus

    plan = plan_memory(DSV3, with_gpus(H100x32, 2048), layout, _setup(global_batch=15360))
    assert plan.stages[-1].num_params == dense + routed == 2_563_316_736
    # stage 1 holds the three dense blocks: no routed experts, nothing divided
    assert experts.moe_layers_per_stage(DSV3, 16)[:2] == [0, 3]


# --------------------------------------------------------------------------- model states


def test_mixtral_states_sharded_over_expert_dp():
    """megatron-bf16 + Adam, distributed optimizer (ZeRO-1), dp = 32, ep = 8: expert dp = 4.
    params 2 B and fp32 main_grad 4 B per parameter held; K = 12 B sharded:
    dense 12 x 233,635,840 / 32 = 87,613,440; experts 12 x 704,643,072 / 4 = 2,113,929,216."""
    layout = Layout(tp=2, pp=4, dp=32, ep=8, zero_stage=1, grad_accum=8)
    stage = plan_memory(MIXTRAL, H100x32, layout, _setup()).stages[0]
    held = MIXTRAL_STAGE1_DENSE + 8 * MIXTRAL_EXPERT_PER_RANK
    assert stage.params_bytes == 2 * held
    assert stage.grads_bytes == 4 * held
    assert stage.optimizer_bytes == 87_613_440 + 2_113_929_216


def test_expert_states_match_megatron_estimator():
    """Megatron's compute_weight_and_optimizer_memory (theoretical_memory_usage.py, d98e8a64)
    for Mixtral, --use-distributed-optimizer, tp=2 pp=4 ep=8 on 256 GPUs, worked by hand:
      routed_expert_params = 2 x 4096 x 14336 x 8 x 3/2 = 1,409,286,144 per MoE layer
      expert_sharded_params_on_most_loaded_shard = 1,409,286,144 x 32 / 4 / (etp 2 x ep 8)
                                                 = 704,643,072
      expert_data_parallel_size = 256 / (2 x 8 x 4) = 4
      bytes = 704,643,072 x (6 + 12 / 4) = 6,341,787,648.
    Dense: tp_sharded = (41,943,040 x 32 / 4 + 4096 x 32000) / 2 = 233,308,160; replicated =
    ((2 x 4096 + 4096 x 8) x 32 + 4096) / 4 = 328,704 (Megatron spreads the final norm over
    the stages, zplan puts it on the last: 1,024 parameters apart on stage 1)."""
    layout = Layout(tp=2, pp=4, dp=32, ep=8, zero_stage=1, grad_accum=8)
    stage = plan_memory(MIXTRAL, H100x32, layout, _setup()).stages[0]
    megatron_expert_bytes = 704_643_072 * (6 + 12 // 4)
    megatron_dense_params = 233_308_160 + 328_704
    zplan_total = stage.params_bytes + stage.grads_bytes + stage.optimizer_bytes
    zplan_expert = 704_643_072 * (2 + 4) + 12 * 704_643_072 // 4
    assert zplan_expert == megatron_expert_bytes == 6_341_787_648
    assert zplan_total - zplan_expert == MIXTRAL_STAGE1_DENSE * (6 + 12 / 32)
    assert megatron_dense_params - MIXTRAL_STAGE1_DENSE == 4096 // 4


def test_ep1_states_unchanged():
    """ep = 1 is the model without expert parallelism: one partition of every parameter."""
    layout = Layout(tp=2, pp=4, dp=32, zero_stage=1, grad_accum=8)
    stage = plan_memory(MIXTRAL, H100x32, layout, _setup()).stages[0]
    held = MIXTRAL_STAGE1_DENSE + 64 * MIXTRAL_EXPERT_PER_RANK
    assert stage.num_params == held
    assert stage.optimizer_bytes == 12 * -(-held // 32)


# --------------------------------------------------------------------------- all-to-all


def test_dispatch_bytes_per_layer():
    """tokens x top_k x hidden x bytes: Mixtral b=1 s=4096 tp=1, k=2, h=4096, bf16:
    4096 x 2 x 4096 x 2 = 67,108,864 B per all-to-all per GPU, of which 7/8 leave at ep=8
    (58,720,256). DeepSeek-V3 s=4096, k=8, h=7168: 469,762,048 B, 63/64 leave at ep=64."""
    assert expert.dispatch_bytes(4096, 2, 4096, 2, 1.0) == 67_108_864
    assert expert.dispatch_bytes(4096, 2, 4096, 2, 1.0) * 7 / 8 == 58_720_256
    assert expert.dispatch_bytes(4096, 8, 7168, 2, 1.0) == 469_762_048
    assert expert.dispatch_bytes(4096, 8, 7168, 2, 1.25) == 587_202_560  # capacity 1.25


def test_ep_group_placement():
    """ep ranks are tp apart: 8-GPU nodes hold 8 ranks at tp=1, 4 at tp=2, 1 at tp=8."""
    assert list(expert.ep_ranks_per_node(np.array([8, 8, 8, 64]), np.array([1, 2, 8, 1]), 8)) == [8, 4, 1, 8]


def test_ep_comm_seconds_by_hand():
    """Mixtral tp=1 pp=1 dp=256 ep=8 (one node per ep group), micro-batch 1, 1 micro-batch:
    S = 67,108,864 B; NVLink part 7/8 S at the node's intra bandwidth + its latency + NCCL's
    ring base latency; 32 MoE layers x 4 all-to-alls (no recompute)."""
    setup = _setup(global_batch=256)
    layout = Layout(tp=1, pp=1, dp=256, ep=8, zero_stage=1, grad_accum=1)
    est = estimate_step(MIXTRAL, H100x32, layout, setup)
    node = H100x32.node
    one = (collectives.NCCL_BASE_LATENCY_S["ring"] + 7 / 8 * 67_108_864 / node.intra_node_bytes_per_s
           + node.intra_node_latency_us * 1e-6)
    assert est.ep_comm_s == pytest.approx(32 * 4 * one, rel=1e-12)
    # full recompute repeats the forward's two: 6 per layer
    full = estimate_step(MIXTRAL, H100x32, layout.model_copy(update={"recompute": "full"}), setup)
    assert full.ep_comm_s == pytest.approx(32 * 6 * one, rel=1e-12)


def test_ep_comm_crosses_nodes():
    """ep=16 at tp=1: two nodes of 8; S splits into 7/16 over NVLink and 8/16 over the NIC
    share (node NIC / 8 GPUs), which is the slower side here."""
    setup = _setup(global_batch=256)
    model = MIXTRAL.model_copy(update={"num_experts": 16})
    layout = Layout(tp=1, pp=1, dp=256, ep=16, zero_stage=1, grad_accum=1)
    r = cluster_rates(H100x32, setup)
    cols = LayoutColumns.from_layout(layout)
    s = 67_108_864
    intra = 7 / 16 * s / r.intra_bw + r.intra_lat
    inter = 8 / 16 * s / r.inter_bw_per_gpu + r.inter_lat
    assert inter > intra
    want = 32 * 4 * (collectives.NCCL_BASE_LATENCY_S["ring"] + inter)
    assert expert.ep_comm_s(model, setup, cols, r)[0] == pytest.approx(want, rel=1e-12)


def test_capacity_and_imbalance_scale_the_all_to_all():
    layout = Layout(tp=1, pp=1, dp=256, ep=8, zero_stage=1, grad_accum=1)
    r = cluster_rates(H100x32, _setup())
    cols = LayoutColumns.from_layout(layout)
    base = expert.ep_comm_s(MIXTRAL, _setup(), cols, r)[0]
    lat = 32 * 4 * (collectives.NCCL_BASE_LATENCY_S["ring"] + H100x32.node.intra_node_latency_us * 1e-6)
    for kw, f in (({"moe_load_imbalance": 1.5}, 1.5), ({"moe_capacity_factor": 2.0}, 2.0)):
        scaled = expert.ep_comm_s(MIXTRAL, _setup(**kw), cols, r)[0]
        assert scaled - lat == pytest.approx(f * (base - lat), rel=1e-12)


def test_dense_model_has_no_all_to_all():
    est = estimate_step(load_model("llama3-8b"), H100x32, Layout(dp=256, zero_stage=1), _setup())
    assert est.ep_comm_s == 0.0


# --------------------------------------------------------------------------- rules


@pytest.mark.parametrize("model, layout, field, words", [
    (MIXTRAL, Layout(dp=256, ep=3), "ep", "must divide num_experts=8"),
    (load_model("llama3-8b"), Layout(dp=256, ep=2), "ep", "needs a mixture-of-experts model"),
    (MIXTRAL, Layout(tp=8, pp=8, dp=4, ep=8), "ep", "ep=8 must divide dp=4"),
    (MIXTRAL, Layout(dp=256, ep=2, zero_stage=2, dp_engine="fsdp2"), "ep", "fsdp2"),
])
def test_rules_refuse(model, layout, field, words):
    setup = _setup(global_batch=layout.dp)
    with pytest.raises(PlanInputError) as err:
        check_layout(Context(model, H100x32, setup), LayoutColumns.from_layout(layout))
    assert err.value.field == field and words in err.value.message


def test_zero3_with_ep_refused_when_the_layout_is_built():
    with pytest.raises(ValueError, match="ep=2 needs zero_stage 0, 1 or 2"):
        Layout(dp=8, ep=2, zero_stage=3)


def test_hf_implementation_refuses_ep():
    setup = _setup(global_batch=256).model_copy(update={"implementation": "hf-sdpa"})
    with pytest.raises(PlanInputError, match="without expert parallelism"):
        check_layout(Context(MIXTRAL, H100x32, setup), LayoutColumns.from_layout(Layout(dp=256, ep=2)))


# --------------------------------------------------------------------------- sweep


def test_sweep_enumerates_ep_and_agrees_with_plan():
    from planner.search.sweep import Constraints, sweep

    setup = _setup(global_batch=256)
    pins = Constraints(tp=(2,), pp=(4,), zero_stage=(1,), micro_batch=(1,), virtual_stages=(1,),
                       recompute=("selective",), sequence_parallel=(True,),
                       offload_optimizer=("none",), offload_params=("none",))
    result = sweep(MIXTRAL, H100x32, setup, pins, top=10, rejected=0)
    eps = sorted(row.layout.ep for row in result.top)
    assert eps == [1, 2, 4, 8]  # divisors of 8 experts that divide dp = 32
    for row in result.top:
        plan = plan_memory(MIXTRAL, H100x32, row.layout, setup)
        assert max(s.total_bytes for s in plan.stages) == row.gpu_peak_bytes
        assert estimate_step(MIXTRAL, H100x32, row.layout, setup).step_s == pytest.approx(
            row.estimate.step_s, rel=1e-12)


def test_sweep_dense_model_keeps_ep_1():
    from planner.search.sweep import ep_options, Constraints

    assert ep_options(load_model("llama3-8b"), 64, Constraints()) == [1]
    assert ep_options(DSV3, 128, Constraints()) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert ep_options(DSV3, 96, Constraints()) == [1, 2, 4, 8, 16, 32]
