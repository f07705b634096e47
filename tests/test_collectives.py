"""Collective times worked by hand (planner.timing.collectives, planner.timing.sharded_dp).

Hardware numbers are the shipped DGX A100 profiles': NVLink 300 GB/s per GPU per direction with
3.4 us per ring step (hardware_profiles/nodes/dgx-a100.yaml), 8 x 25 GB/s HDR NICs = 200 GB/s
per node with 9.6 us per network step (clusters/dgx-a100x128.yaml). NCCL base latency 8.4 us
(tuning.cc baseLatencies, Simple). Each expected value below is written out from those numbers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.timing import collectives as col
from planner.timing import sharded_dp as sdp

NVLINK = 300e9
A_INTRA = 3.4e-6
NODE_NIC = 200e9
NIC_SHARE = 25e9
A_INTER = 9.6e-6
BASE = 8.4e-6
LEVELS = (NVLINK, A_INTRA, NIC_SHARE, A_INTER)


def test_bus_factors_match_nccl_tests():
    # PERFORMANCE.md: all-reduce 2(n-1)/n, all-gather / reduce-scatter (n-1)/n. n = 8: 1.75, 0.875.
    assert col.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert col.bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert col.bus_factor("reduce_scatter", 8) == pytest.approx(0.875)
    assert col.bytes_per_gpu("all_reduce", 1e9, 4) == pytest.approx(1.5e9)


def test_nic_share_rail_and_spine():
    # 200 GB/s over 8 GPUs = 25 GB/s each; through a 2:1 oversubscribed spine 12.5 GB/s.
    assert col.nic_share_bytes_per_s(NODE_NIC, 8) == pytest.approx(25e9)
    assert col.nic_share_bytes_per_s(NODE_NIC, 8, rail_optimised=False,
                                     spine_oversubscription=2.0) == pytest.approx(12.5e9)


def test_all_gather_inside_one_node_large_message():
    # S = 8 GB over 8 GPUs: 7/8 x 8e9 = 7e9 B at 300 GB/s = 23.333 ms;
    # latency 8.4 + 7 steps x 3.4 = 32.2 us -> 0.0233655 s.
    t = col.flat_ring_s("all_gather", 8e9, 8, 1, *LEVELS)
    assert t == pytest.approx(7e9 / 300e9 + 8.4e-6 + 7 * 3.4e-6, rel=1e-12)
    assert t == pytest.approx(0.02336553, rel=1e-6)


def test_all_gather_flat_ring_four_nodes():
    # 32 GPUs: 31/32 x 8e9 = 7.75e9 B; bus bandwidth min(300, 8 x 25 = 200) GB/s -> 38.75 ms;
    # 31 steps, 3 cross a node boundary: 8.4 + 28 x 3.4 + 3 x 9.6 = 132.4 us -> 0.0388824 s.
    t = col.flat_ring_s("all_gather", 8e9, 8, 4, *LEVELS)
    assert t == pytest.approx(0.03875 + 132.4e-6, rel=1e-9)


def test_hierarchical_all_gather_is_two_phases():
    # network phase: 1e9 B (S/8) over 4 nodes at 25 GB/s: 3/4 x 1e9 / 25e9 = 30 ms, + 8.4 + 3 x 9.6
    # = 37.2 us; NVLink phase: 23.333 ms + 32.2 us. Sum 0.0534027 s: slower than the flat ring
    # (38.9 ms) for a large message, because the phases do not overlap.
    t = col.hierarchical_s("all_gather", 8e9, 8, 4, *LEVELS)
    assert t == pytest.approx(0.03 + 37.2e-6 + 7e9 / 300e9 + 32.2e-6, rel=1e-9)
    assert t > col.flat_ring_s("all_gather", 8e9, 8, 4, *LEVELS)


def test_small_all_reduce_is_latency_bound_and_nccl_picks_tree():
    # 1 MB all-reduce on 1024 GPUs (128 nodes). Bytes 2 x 1023/1024 x 1e6 = 1.998047e6.
    # Ring: 2046 steps, 254 cross nodes: 8.4 + 1792 x 3.4 + 254 x 9.6 = 8539.6 us, + 9.99 us.
    # Tree: 8.4 + 2 x (7 x 3.4 + log2(128) = 7 x 9.6) = 190.4 us, + 1.998047e6 / (0.92 x 200e9)
    # = 10.859 us -> 201.26 us. NCCL takes the tree.
    b = 2 * 1023 / 1024 * 1e6
    ring = col.flat_ring_s("all_reduce", 1e6, 8, 128, *LEVELS)
    tree = col.tree_all_reduce_s(1e6, 8, 128, *LEVELS)
    assert ring == pytest.approx(8539.6e-6 + b / 200e9, rel=1e-9)
    assert tree == pytest.approx(190.4e-6 + b / (0.92 * 200e9), rel=1e-9)
    assert col.nccl_all_reduce_s(1e6, 8, 128, *LEVELS) == pytest.approx(tree)


def test_large_all_reduce_nccl_picks_ring():
    # 4 GB on 32 GPUs: bandwidth terms 2 x 31/32 x 4e9 = 7.75e9 B: ring / 200e9 = 38.75 ms,
    # tree / 184e9 = 42.12 ms; latencies (ring 62 steps, 6 network: 8.4 + 56 x 3.4 + 6 x 9.6
    # = 256.4 us; tree 8.4 + 2 x (7 x 3.4 + 2 x 9.6) = 94.4 us) do not change the order.
    ring = col.flat_ring_s("all_reduce", 4e9, 8, 4, *LEVELS)
    assert ring == pytest.approx(7.75e9 / 200e9 + 256.4e-6, rel=1e-9)
    assert col.nccl_all_reduce_s(4e9, 8, 4, *LEVELS) == pytest.approx(ring)


def test_all_to_all_network_bound():
    # 8 GB, 32 GPUs on 4 nodes: to the 7 node peers 7/32 x 8e9 = 1.75e9 B at 300 GB/s
    # (5.83 ms); to the 24 remote peers 24/32 x 8e9 = 6e9 B at the GPU's 25 GB/s = 240 ms;
    # parallel -> 8.4 + 240 ms + 9.6 us.
    t = col.all_to_all_s(8e9, 8, 4, *LEVELS)
    assert t == pytest.approx(8.4e-6 + 0.24 + 9.6e-6, rel=1e-9)


def test_send_recv_and_single_gpu():
    # One 100 MB message over a 25 GB/s NIC share: 9.6 us + 4 ms.
    assert col.send_recv_s(1e8, 25e9, 9.6e-6) == pytest.approx(4.0096e-3)
    assert col.flat_ring_s("all_gather", 1e9, 1, 1, *LEVELS) == 0.0


def test_functions_broadcast_over_arrays():
    nodes = np.array([1, 4])
    t = col.flat_ring_s("all_gather", 8e9, 8, nodes, *LEVELS)
    assert t.shape == (2,)
    assert t[1] == pytest.approx(col.flat_ring_s("all_gather", 8e9, 8, 4, *LEVELS))


def test_pipelined_two_stream_by_hand():
    # a = 2, c = 3, L = 4, f = 1: 2 + 3 + 3 x max(3, 2) = 14; f = 0: 4 x (2 + 3) = 20;
    # a = 4, c = 1, L = 3, f = 0.5: 4 + 1 + 2 x (2 + max(1, 2)) = 13.
    assert sdp.pipelined_s(2, 3, 4, 1.0) == pytest.approx(14)
    assert sdp.pipelined_s(2, 3, 4, 0.0) == pytest.approx(20)
    assert sdp.pipelined_s(4, 1, 3, 0.5) == pytest.approx(13)


def test_deepspeed_prefetch_fraction():
    # DeepSpeed defaults: prefetch bucket 5e7, max live 1e9 elements.
    # GPT-3 175B layer at tp 1: 12 x 12288^2 = 1.812e9 elements > max live -> no room: 0.
    # A 2e8-element layer: min(1e9 - 2e8, 5e7) / 2e8 = 0.25. A 1e7-element layer: 1 (capped).
    assert sdp.deepspeed_prefetch_fraction(12 * 12288**2, 5e7, 1e9) == 0.0
    assert sdp.deepspeed_prefetch_fraction(2e8, 5e7, 1e9) == pytest.approx(0.25)
    assert sdp.deepspeed_prefetch_fraction(1e7, 5e7, 1e9) == pytest.approx(1.0)


def test_zero3_step_by_hand():
    # a = 1, r = 1, forward 2, backward 4 per layer, L = 2, m = 3, full prefetch:
    # forward 1 + 2 + 1 x max(2, 1) = 5; backward (a + r = 2) 2 + 4 + 1 x max(4, 2) = 10;
    # step 3 x 15 = 45; compute 3 x 2 x 6 = 36 -> exposed 9; total 3 x 2 x (2 + 1) = 18.
    r = sdp.zero3_step(1, 1, 2, 4, 2, 3, 1.0)
    assert (r.step_s, r.exposed_s, r.total_s) == pytest.approx((45, 9, 18))


def test_fsdp2_reshard_and_deferred_reduce_by_hand():
    # a = 1, r = 1, forward 2, backward 4, L = 2, m = 2.
    # reshard_after_forward: forward 1 + 2 + 2 = 5, backward (2) 2 + 4 + 4 = 10, step 2 x 15 = 30;
    # total 2 x 2 x (1 + 1) + 2 x 2 x 1 = 12; exposed 30 - 24 = 6.
    r = sdp.fsdp2_step(1, 1, 2, 4, 2, 2, reshard_after_forward=True)
    assert (r.step_s, r.exposed_s, r.total_s) == pytest.approx((30, 6, 12))
    # keep parameters after forward: backward (r only = 1) 1 + 4 + 4 = 9, step 2 x 14 = 28,
    # total 2 x 2 x 1 + 2 x 2 x 1 = 8.
    r = sdp.fsdp2_step(1, 1, 2, 4, 2, 2, reshard_after_forward=False)
    assert (r.step_s, r.exposed_s, r.total_s) == pytest.approx((28, 4, 8))
    # reduce only on the last micro-batch: 2 x 5 + 10 + (1 + 4 + 4 = 9) = 29; total 8 + 2 = 10.
    r = sdp.fsdp2_step(1, 1, 2, 4, 2, 2, reduce_every_micro_batch=False)
    assert (r.step_s, r.total_s) == pytest.approx((29, 10))


def test_zero3_communication_floor_doubling_gpus_at_fixed_batch():
    # GPT-3 175B (h = 12288, 96 layers), ZeRO-3 without model parallelism on DGX A100, global
    # batch 1536 sequences of 2048, one micro-batch per step: 768 GPUs run b = 2, 1536 GPUs b = 1.
    # Per layer the 16-bit parameters are S = 12 h^2 x 2 = 3,623,878,656 B; DeepSpeed's default
    # max live 1e9 < 1.812e9 elements -> no prefetch (f = 0, test above).
    # Gather (flat ring, 8 GPUs per node): n = 768, 96 nodes: 767/768 S / 200e9 + 8.4 + 672 x 3.4
    # + 95 x 9.6 us; n = 1536, 192 nodes: 1535/1536 S / 200e9 + 8.4 + 1344 x 3.4 + 191 x 9.6 us.
    # Reduce-scatter of the 16-bit gradients: the same size, the same time.
    # Compute per layer per sequence: forward 24 h^2 s = 7.4217e12 FLOPs at an assumed 0.6 x 312e12
    # = 187.2e12 FLOP/s = 39.65 ms; backward twice that.
    s_layer = 12 * 12288**2 * 2
    gather = {768: 767 / 768 * s_layer / 200e9 + (8.4 + 672 * 3.4 + 95 * 9.6) * 1e-6,
              1536: 1535 / 1536 * s_layer / 200e9 + (8.4 + 1344 * 3.4 + 191 * 9.6) * 1e-6}
    fwd_seq = 24 * 12288**2 * 2048 / (0.6 * 312e12)
    steps = {}
    for n, b in ((768, 2), (1536, 1)):
        a = col.flat_ring_s("all_gather", s_layer, 8, n // 8, *LEVELS)
        assert a == pytest.approx(gather[n], rel=1e-9)
        r = sdp.zero3_step(a, a, b * fwd_seq, 2 * b * fwd_seq, 96, 1, 0.0)
        # f = 0: forward 96 (a + c_f), backward 96 (2a + c_b)
        assert r.step_s == pytest.approx(96 * (a + b * fwd_seq) + 96 * (2 * a + 2 * b * fwd_seq))
        steps[n] = r.step_s
    # 768: a = 21.30 ms, step = 96 x (3 x 21.30 + 3 x 79.30) ms = 28.97 s;
    # 1536: a = 24.49 ms, step = 96 x (3 x 24.49 + 3 x 39.65) = 18.47 s: 0.64, not 0.5.
    assert steps[1536] / steps[768] == pytest.approx(0.6376, abs=2e-3)
    # with the whole layer prefetched (f = 1) the gathers hide and doubling nearly halves it
    full = {n: sdp.zero3_step(gather[n], gather[n], b * fwd_seq, 2 * b * fwd_seq, 96, 1, 1.0).step_s
            for n, b in ((768, 2), (1536, 1))}
    assert full[1536] / full[768] < 0.52
