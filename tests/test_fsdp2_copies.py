"""FSDP2's copies on the compute stream (planner/timing/sharded_dp.py `fsdp2_copy_bytes`,
`fsdp2_copy_s`), worked by hand from torch 2.13 torch/distributed/fsdp/_fully_shard/
_fsdp_collectives.py: `foreach_all_gather_copy_out` (split_with_sizes_copy of the all-gather
output into each unsharded parameter) and `foreach_reduce_scatter_copy_in` (torch._chunk_cat of
the unsharded gradients into the reduce-scatter input, in reduce_dtype)."""

from __future__ import annotations

import numpy as np
import pytest

from planner.timing.sharded_dp import fsdp2_copy_bytes, fsdp2_copy_s


def test_small_unit_by_hand():
    # P = 1,000,000 parameters, bf16 parameters and gradients (2 bytes), fp32 reduce (4 bytes).
    # copy-out: 2 gathers (forward + backward re-gather) x (read 2 MB + write 2 MB) = 8,000,000 B
    # reduce copy-in: read 1e6 x 2 + write 1e6 x 4 = 6,000,000 B
    c = fsdp2_copy_bytes(1_000_000, 2, 2, 4, reshard_after_forward=True)
    assert c.gather_copy_out_bytes == 8_000_000
    assert c.reduce_copy_in_bytes == 6_000_000
    # Without resharding after forward only the forward gather is copied out: 4,000,000 B.
    assert fsdp2_copy_bytes(1_000_000, 2, 2, 4, reshard_after_forward=False
                            ).gather_copy_out_bytes == 4_000_000
    # 4 micro-batches all reducing at 2e12 B/s: (4 x 8e6 + 4 x 6e6) / 2e12 = 56e6 / 2e12 = 28 us.
    assert fsdp2_copy_s(c, 4, 4, 2e12) == pytest.approx(28e-6)
    # Gradient sync deferred to the last micro-batch: (4 x 8e6 + 1 x 6e6) / 2e12 = 19 us.
    assert fsdp2_copy_s(c, 4, 1, 2e12) == pytest.approx(19e-6)


def test_llama3_8b_block_by_hand():
    # One Llama 3 8B block (dim 4096, 8 KV heads of 128, ffn 14,336, no biases):
    # q, o 4096^2 = 16,777,216 each; k, v 4096 x 1024 = 4,194,304 each; MLP 3 x 4096 x 14,336
    # = 176,160,768; two RMSNorms 2 x 4096 = 8,192. P = 218,112,000.
    p = 2 * 16_777_216 + 2 * 4_194_304 + 176_160_768 + 8_192
    assert p == 218_112_000
    c = fsdp2_copy_bytes(p, 2, 2, 4)
    # copy-out 2 x 2 x 2 x 218,112,000 = 1,744,896,000 B; copy-in 6 x 218,112,000 = 1,308,672,000
    assert c.gather_copy_out_bytes == 1_744_896_000
    assert c.reduce_copy_in_bytes == 1_308_672_000
    # 32 blocks, one micro-batch, 3.35e12 B/s (H100 SXM datasheet HBM3):
    # 32 x 3,053,568,000 = 97,714,176,000 B / 3.35e12 = 29.17 ms.
    t = 32 * fsdp2_copy_s(c, 1, 1, 3.35e12)
    assert t == pytest.approx(97_714_176_000 / 3.35e12)
    assert t == pytest.approx(0.029168, rel=1e-4)


def test_arrays_broadcast():
    c = fsdp2_copy_bytes(np.array([1e6, 2e6]), 2, 2, 2)
    np.testing.assert_allclose(c.reduce_copy_in_bytes, [4e6, 8e6])
    np.testing.assert_allclose(fsdp2_copy_s(c, np.array([1, 2]), 1, 1e12),
                               [(8e6 + 4e6) / 1e12, (2 * 16e6 + 8e6) / 1e12])


def test_one_exact_definition_with_padding_by_hand():
    # fsdp2_group_copy_bytes (planner/timing/sharded_dp.py) is the one definition: the step
    # model's fsdp2_copy_bytes and planner.calibrate.fsdp2_overhead.group_copy_bytes read it.
    # A unit of 10 elements as one tensor on 4 ranks, bf16 params and grads, fp32 reduce:
    # shard S = ceil(10 / 4) = 3 rows; copy-out 2 x 4 x 3 x 2 = 48 B per gather (40 unpadded);
    # reduce copy-in 10 x 2 (unpadded grads read) + 4 x 3 x 4 (padded fp32 input) = 68 B.
    c = fsdp2_copy_bytes(10, 2, 2, 4, reshard_after_forward=True, world=4)
    assert c.gather_copy_out_bytes == 2 * 48
    assert c.reduce_copy_in_bytes == 68
    from planner.calibrate.fsdp2_overhead import group_copy_bytes
    from planner.timing.sharded_dp import fsdp2_group_copy_bytes

    g = fsdp2_group_copy_bytes([(10,)], 4, orig_bytes=2, reduce_bytes=4)
    assert g.all_gather_copy_out_bytes == 48 and g.reduce_scatter_copy_in_bytes == 68
    assert g.all_gather_copy_in_bytes == 2 * 3 * 2  # the shard read + written (copy-in stream)
    assert g.grad_cast_bytes == 3 * (4 + 2)  # fp32 output shard cast back to bf16
    assert group_copy_bytes([(10,)], 4, orig_bytes=2, reduce_bytes=4).all_gather_copy_out == 48


def test_padding_broadcasts_over_world_arrays():
    # 10 elements on 1, 3 and 5 ranks: S = 10, 4, 2 -> n·S = 10, 12, 10; fp32 copy-out 2·n·S·4.
    c = fsdp2_copy_bytes(10, 4, 4, 4, reshard_after_forward=False, world=np.array([1, 3, 5]))
    np.testing.assert_array_equal(c.gather_copy_out_bytes, [80, 96, 80])
