"""FSDP2's buffers (planner.memory.fsdp2) against torch's own FSDPMemTracker (issue 11, item 2).

The harness (planner.calibrate.fsdp2_check) runs two real training steps of a small model,
`fully_shard` per block and at the root, on a fake process group; the tracker's peak snapshot
is split by category. Every expected figure below is worked by hand from the shapes:
blocks of 2·h·4h = 8h² parameters, a root of embedding + untied head = 2·V·h parameters.
"""

from __future__ import annotations

import pytest

from planner.memory import fsdp2

pytest.importorskip("torch.distributed._tools.fsdp2_mem_tracker")
from planner.calibrate.fsdp2_check import tracked_peak  # noqa: E402

BACKWARD_CASES = [  # (world, h, L, V, s, b, reshard, param dtype bytes)
    (4, 256, 4, 1024, 64, 2, True, 2),
    (4, 256, 4, 1024, 64, 2, False, 2),
    (4, 256, 4, 1024, 64, 2, True, 4),
    (8, 128, 6, 512, 32, 1, True, 2),
]


@pytest.mark.parametrize("world,h,layers,vocab,s,b,reshard,pbytes", BACKWARD_CASES)
def test_backward_peak_buffers_match_fsdp_mem_tracker(world, h, layers, vocab, s, b, reshard, pbytes):
    got = tracked_peak(world, h, layers, vocab, s, b, reshard_after_forward=reshard,
                       param_dtype="bf16" if pbytes == 2 else "fp32")
    block, root = 8 * h * h, 2 * vocab * h
    parts = fsdp2.backward_parts(root, block, layers, world, param_bytes=pbytes, reduce_bytes=4,
                                 reshard_after_forward=reshard)
    # by hand, world 4, h 256, L 4, V 1024, bf16, resharding: P = 4*524,288 + 524,288
    # = 2,621,440; sharded fp32 2,621,440 B; root 524,288 x 2 + one block 524,288 x 2 unsharded;
    # the next block's all-gather 524,288 x 2; the reduce-scatter input 524,288 x 4
    if (world, h, reshard, pbytes) == (4, 256, True, 2):
        assert parts == {"sharded_params": 2_621_440, "root_unsharded_params": 1_048_576,
                         "block_unsharded_params": 1_048_576, "all_gather_output": 1_048_576,
                         "reduce_scatter_input": 2_097_152}
    assert got["Sharded Param"] == parts["sharded_params"]
    assert got["Unsharded Param"] == parts["root_unsharded_params"] + parts["block_unsharded_params"]
    assert got["All Gather"] == parts["all_gather_output"]
    assert got["Reduce Scatter"] == parts["reduce_scatter_input"]
    tensors = 2 * layers + 2  # two linears per block, embedding, head: one fp32 `step` each
    assert got["OptState"] == 2 * (root + layers * block) // world * 4 + tensors * 4


def test_optimizer_step_peak_matches_fsdp_mem_tracker():
    # world 2: the shard is large against the activations, the peak is the optimizer step:
    # P = 2,621,440, shard 1,310,720 elements: params 5,242,880 + grads 5,242,880 + exp_avg and
    # exp_avg_sq 10,485,760 + 10 step tensors 40 + the foreach sqrt temporary 5,242,880
    got = tracked_peak(2, 256, 4, 1024, 64, 2)
    parts = fsdp2.optimizer_step_parts(2_621_440, 2, num_tensors=10)
    assert parts == {"sharded_params": 5_242_880, "sharded_grads": 5_242_880,
                     "adam_states": 10_485_800, "foreach_temporary": 5_242_880}
    assert got["Sharded Param"] + got["Sharded Grad"] + got["OptState"] == sum(parts.values())
    assert got["Unsharded Param"] == got["All Gather"] == got["Reduce Scatter"] == 0


def test_plan_counts_fully_shard_buffers_not_deepspeed_buckets():
    # llama3-8b on 8 GPUs, FSDP2 ZeRO-3 (reshard_after_forward=True), bf16 parameters:
    # root = embedding 128,256 x 4,096 + head 128,256 x 4,096 + final norm 4,096
    #      = 1,050,677,248 parameters, x 2 B unsharded;
    # one block = attention 4096*4096*2 + 4096*1024*2 (GQA k, v) + MLP 3*4096*14336 + 2 norms
    #           = 33,554,432 + 8,388,608 + 176,160,768 + 8,192 = 218,112,000 parameters
    from planner.core.spec import Layout
    from planner.io.jobfile import make_setup
    from planner.io.loading import cluster_for_gpus, load_model
    from planner.memory.plan import plan_memory

    model, cluster = load_model("llama3-8b"), cluster_for_gpus("h100-sxm", 8)
    setup = make_setup(4096, 8, 1e9, "bf16-mixed", "adam")
    z3 = plan_memory(model, cluster, Layout(dp=8, zero_stage=3, dp_engine="fsdp2"), setup).stages[0]
    assert {k: v for k, v in z3.buffers.items() if k.startswith("fsdp2_")} == {
        "fsdp2_root_unsharded_params": 1_050_677_248 * 2,
        "fsdp2_block_unsharded_params": 218_112_000 * 2,
        "fsdp2_all_gather_output": 218_112_000 * 2,
        "fsdp2_reduce_scatter_input": 218_112_000 * 4}
    assert not any(k.startswith(("zero_", "zero3_")) for k in z3.buffers)
    # ZeRO-2 (reshard_after_forward=False): the unsharded groups are the 16-bit replica the
    # states already count; only the reduce-scatter input is added
    z2 = plan_memory(model, cluster, Layout(dp=8, zero_stage=2, dp_engine="fsdp2"), setup).stages[0]
    assert {k: v for k, v in z2.buffers.items() if k.startswith(("fsdp2_", "zero"))} == {
        "fsdp2_reduce_scatter_input": 218_112_000 * 4}
    # DeepSpeed keeps its buckets
    ds = plan_memory(model, cluster, Layout(dp=8, zero_stage=3), setup).stages[0]
    assert "zero_reduce_bucket" in ds.buffers and not any(k.startswith("fsdp2_") for k in ds.buffers)
