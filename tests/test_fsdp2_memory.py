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
