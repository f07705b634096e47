"""plan.validate_layout and plan.plan_memory: the cross-field rules and the composition.

The component formulas are tested in their own modules; here: each rule names every factor,
the per-stage total is the sum of its named parts and equals the component functions, the
node's host bytes follow Megatron's rank order, and an overflow names the stage.
"""

from __future__ import annotations

import pytest

from planner.memory import activations, model_states
from planner.core import params
from planner.core.errors import PlanInputError
from planner.memory.plan import plan_memory, validate_layout
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Cluster, GpuSpec, Layout, ModelSpec, NodeSpec, TrainSetup

GIB = 1024**3

SRC = {k: "test fixture" for k in (
    "memory_gib", "peak_tflops", "hbm_gb_per_s", "achieved_efficiency", "gpus_per_node",
    "intra_node_gb_per_s", "intra_node_latency_us", "pcie_gb_per_s", "cpu_memory_gib")}


def make_cluster(num_nodes: int = 1, gpus_per_node: int = 8, memory_gib: float = 80,
                 cpu_memory_gib: float = 1024, nvme_tb: float = 0) -> Cluster:
    gpu = GpuSpec(name="test-gpu", memory_gib=memory_gib, peak_tflops={"bf16": 312, "fp16": 312},
                  hbm_gb_per_s=2039, sources=SRC)
    node = NodeSpec(name="test-node", gpu="test-gpu", gpus_per_node=gpus_per_node,
                    intra_node_gb_per_s=300, intra_node_latency_us=5, pcie_gb_per_s=32,
                    cpu_memory_gib=cpu_memory_gib, nvme_capacity_tb=nvme_tb,
                    nvme_read_gb_per_s=25 if nvme_tb else 0, nvme_write_gb_per_s=20 if nvme_tb else 0,
                    sources=SRC)
    return Cluster(name="test", gpu=gpu, node=node, num_nodes=num_nodes,
                   inter_node_gb_per_s=200, inter_node_latency_us=10)


TINY = ModelSpec(name="tiny", num_layers=4, hidden_size=64, num_heads=4, ffn_hidden_size=256,
                 vocab_size=1000, max_seq_len=128)


def make_setup(global_batch: int, seq_len: int = 128, precision: str = "zero-fp16") -> TrainSetup:
    return TrainSetup(seq_len=seq_len, global_batch=global_batch, train_tokens=1e9,
                      precision=get_precision(precision), optimizer=get_optimizer("adam"))


def test_gpu_count_rule_names_every_factor():
    with pytest.raises(PlanInputError) as err:
        validate_layout(TINY, make_cluster(), Layout(tp=2, pp=2, dp=1), make_setup(1))
    assert "tp*pp*dp = 2*2*1 = 4" in str(err.value) and "8" in str(err.value)


def test_tp_must_divide_heads():
    with pytest.raises(PlanInputError, match="tp=8 must divide num_heads=4"):
        validate_layout(TINY, make_cluster(), Layout(tp=8), make_setup(1))


def test_pp_not_more_than_layers():
    with pytest.raises(PlanInputError, match="must not exceed num_layers=4"):
        validate_layout(TINY, make_cluster(), Layout(pp=8), make_setup(1))


def test_batch_arithmetic_names_every_factor():
    with pytest.raises(PlanInputError) as err:
        validate_layout(TINY, make_cluster(), Layout(dp=8, micro_batch=2, grad_accum=3), make_setup(50))
    assert "2*3*8 = 48 must equal global_batch=50" in str(err.value)


def test_seq_len_beyond_model_maximum():
    with pytest.raises(PlanInputError, match="seq_len=256 exceeds"):
        validate_layout(TINY, make_cluster(), Layout(dp=8), make_setup(8, seq_len=256))


def test_nvme_offload_needs_nvme():
    layout = Layout(dp=8, zero_stage=3, offload_optimizer="nvme")
    with pytest.raises(PlanInputError, match="no NVMe"):
        validate_layout(TINY, make_cluster(), layout, make_setup(8))


def test_param_offload_needs_zero3():
    with pytest.raises(ValueError, match="needs zero_stage=3"):
        Layout(zero_stage=2, offload_params="cpu")


def test_stage_total_is_the_sum_of_its_parts():
    layout = Layout(tp=2, pp=2, dp=2, zero_stage=1, micro_batch=2, grad_accum=4, recompute="full")
    plan = plan_memory(TINY, make_cluster(), layout, make_setup(16))
    for stage in plan.stages:
        parts = (stage.params_bytes + stage.grads_bytes + stage.optimizer_bytes
                 + stage.activations_bytes + sum(stage.buffers.values()) + sum(stage.working.values()))
        assert stage.total_bytes == parts
        assert stage.headroom_bytes == 80 * GIB - stage.total_bytes
    # 1F1B: stage 1 of 2 holds min(p - i + 1, m) = 2 micro-batches, stage 2 holds 1 (seed 004 §3.5.2)
    assert [s.in_flight_microbatches for s in plan.stages] == [2, 1]


def test_stage_memory_matches_the_component_functions():
    layout = Layout(tp=2, pp=2, dp=2, zero_stage=2, micro_batch=1, grad_accum=2)
    setup = make_setup(4)
    plan = plan_memory(TINY, make_cluster(), layout, setup)
    shards = params.stage_params(TINY, 2, 2)
    acts = activations.stage_activations(TINY, layout, setup, [2, 2])
    for stage, shard, act in zip(plan.stages, shards, acts):
        states = model_states.model_state_bytes(shard.total, setup.precision, setup.optimizer, layout)
        assert stage.num_params == shard.total
        assert (stage.params_bytes, stage.grads_bytes, stage.optimizer_bytes) == (
            states.params_bytes, states.grads_bytes, states.optimizer_bytes)
        assert stage.activations_bytes == act.total_bytes - act.recompute_working_bytes


def test_cpu_offload_bytes_per_node_follow_rank_order():
    # 2 nodes x 4 GPUs, tp=1, pp=2, dp=4: Megatron rank order puts stage 1 on node 1 (ranks 0-3)
    # and stage 2 on node 2 (ranks 4-7); the busiest node holds 4 x the larger stage's CPU bytes.
    layout = Layout(pp=2, dp=4, zero_stage=2, offload_optimizer="cpu", micro_batch=1, grad_accum=2)
    setup = make_setup(8)
    cluster = make_cluster(num_nodes=2, gpus_per_node=4)
    plan = plan_memory(TINY, cluster, layout, setup)
    per_gpu = [model_states.model_state_bytes(s.total, setup.precision, setup.optimizer, layout).cpu_bytes
               for s in params.stage_params(TINY, 1, 2)]
    assert plan.node.cpu_bytes == 4 * max(per_gpu)
    assert plan.node.cpu_bytes > 0


def test_overflow_names_stage_and_amount():
    small = make_cluster(memory_gib=0.001)  # 1 MiB-ish GPUs: nothing fits
    plan = plan_memory(TINY, small, Layout(dp=8), make_setup(8))
    assert not plan.fits
    assert plan.overflows[0].startswith("GPU memory on stage 1 by ")


def test_seed_13b_pipeline_example_per_stage():
    """Seed 004 §3.5.2 (EQUATIONS.md §3): 13B, s=4096, h=5120, 40 layers, 80 GB GPUs, Megatron's
    18 bytes/param, activations 40·s·h·L ≈ 34 GB. PP=4 x ZeRO-1 DP=2 gives 73, 64.5 (the seed
    rounds to 64), 56, 47.5 GB on stages 1-4; PP=8 alone 63.25 GB; PP=4 alone does not fit.
    The seed rounds 40·s·h·L = 33.55 GB up to 34 GB, hence the 0.5 GB tolerance."""
    gb = 1e9
    model = ModelSpec(name="13b", num_layers=40, hidden_size=5120, num_heads=40,
                      ffn_hidden_size=4 * 5120, vocab_size=32000, max_seq_len=4096)
    activations_all = activations.megatron_40shl_bytes(4096, 5120, 40)  # the seed's 34 GB
    layout = Layout(pp=4, dp=2, zero_stage=1, micro_batch=1, grad_accum=8)
    stages = activations.stage_activations(model, layout, make_setup(16, seq_len=4096), [10] * 4)
    in_flight = [s.in_flight_microbatches for s in stages]
    assert in_flight == [4, 3, 2, 1]  # stage i of p holds p - i + 1 micro-batches
    states = model_states.megatron_zero1_bytes(13e9, p=4, nd=2)  # 13e9 x (6/4 + 12/8) = 39 GB
    totals = [(states + activations_all / 4 * n) / gb for n in in_flight]
    assert totals == pytest.approx([73, 64.5, 56, 47.5], abs=0.5)
    pp8 = model_states.megatron_zero1_bytes(13e9, p=8, nd=1) + activations_all / 8 * 8
    assert pp8 / gb == pytest.approx(63.25, abs=0.5)
    pp4_alone = model_states.megatron_zero1_bytes(13e9, p=4, nd=1) + activations_all
    assert pp4_alone / gb > 80  # 58.5 + 34 GB: stage 1 does not fit on an 80 GB GPU


def test_moe_tp_rule_is_the_expert_width_everywhere():
    """Every block of an MoE model is an MoE block, so only the expert width is split by tp
    (params.check_tp); the activations and the sweep use the same rule, so a layout the sweep
    offers is one plan_memory accepts. Here ffn_hidden_size 251 is odd, the expert width 256 is not."""
    moe = ModelSpec(name="tiny-moe", num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=251,
                    vocab_size=1000, max_seq_len=128, num_experts=4, experts_per_token=2,
                    expert_ffn_hidden_size=256, mlp="swiglu", norm="rmsnorm", position="rotary",
                    linear_bias=False, dropout=False, tied_embeddings=False)
    plan = plan_memory(moe, make_cluster(), Layout(tp=2, dp=4), make_setup(4))
    assert plan.stages[0].activations_bytes > 0
    with pytest.raises(PlanInputError, match="expert_ffn_hidden_size"):
        plan_memory(moe.model_copy(update={"expert_ffn_hidden_size": 255}), make_cluster(),
                    Layout(tp=2, dp=4), make_setup(4))
