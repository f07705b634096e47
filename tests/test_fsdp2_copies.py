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
