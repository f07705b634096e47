"""Step-time terms, worked by hand one at a time (arithmetic written out in each test)."""

from __future__ import annotations

import math

import pytest

from planner.timing import steptime as st
from planner.timing.bandwidth import offload_efficiency


def approx(x):
    return pytest.approx(x, rel=1e-12)


# --------------------------------------------------------------------------- collectives


def test_ring_all_reduce_moves_2_n_minus_1_over_n():
    # seed 004 §3.4.2: all-reduce moves 2(N-1)/N of the buffer in 2(N-1) steps.
    # 1 GB over 8 GPUs at 100 GB/s, alpha 5 us: 2 * (7/8 * 1e9/1e11 + 7 * 5e-6) = 0.01757 s
    t = st.ring_collective_s(1e9, 8, 100e9, 5e-6, passes=2)
    assert t == approx(2 * (7 / 8 * 0.01 + 7 * 5e-6))
    assert t == approx(0.01757)


def test_ring_one_rank_costs_nothing():
    assert st.ring_collective_s(1e9, 1, 100e9, 5e-6, passes=2) == 0


def test_reduce_scatter_is_half_an_all_reduce():
    rs = st.ring_collective_s(4e8, 4, 50e9, 2e-6, passes=1)
    # 3/4 * 4e8 / 5e10 + 3 * 2e-6 = 0.006 + 0.000006
    assert rs == approx(0.006006)
    assert st.ring_collective_s(4e8, 4, 50e9, 2e-6, passes=2) == approx(2 * rs)


# --------------------------------------------------------------------------- compute, tp, pp


def test_compute_time_gpt3_34_days():
    # EQUATIONS.md §4 / seed 004 §1: GPT-3 175B, 300B tokens, 1024 A100 at 312 TFLOP/s,
    # utilisation 0.45, k=8 (full recompute): 8*300e9*175e9 / (1024*312e12*0.45) s
    # = 2.9214e6 s = 33.81 days, which the seed rounds to "about 34 days"
    flops_per_gpu = 8 * 300e9 * 175e9 / 1024
    days = st.compute_time_s(flops_per_gpu, 312e12, 0.45) / 86400
    assert days == pytest.approx(8 * 300e9 * 175e9 / (1024 * 312e12 * 0.45) / 86400)
    assert round(days) == 34


def test_tp_comm_gpt3_layer_on_nvlink():
    # b=1, s=2048, h=12288, fp16: b*s*h*2 = 50,331,648 bytes per all-reduce.
    # tp=8 ring at 300 GB/s, alpha 0: 2 * 7/8 * 50331648 / 300e9 = 2.936e-4 s each;
    # 2 layers x 4 all-reduces (2 forward, 2 backward) x 3 micro-batches = 24 of them.
    act = 1 * 2048 * 12288 * 2
    assert act == 50_331_648
    one = 2 * 7 / 8 * act / 300e9
    t = st.tp_comm_time_s(layers=2, micro_batches=3, allreduces_per_layer=4, act_bytes=act,
                          tp=8, bw=300e9, lat=0.0)
    assert t == approx(24 * one)
    assert st.tp_allreduces_per_layer("full") == 6  # full recompute repeats the forward's 2
    assert st.tp_allreduces_per_layer("selective") == 4
    # every_k (Megatron --recompute-method uniform): each k-layer segment re-runs its whole
    # forward in backward, so its 2 forward all-reduces per layer run again as under full.
    assert st.tp_allreduces_per_layer("every_k") == 6


def test_pp_comm_two_sends_per_microbatch_per_chunk():
    # 8 micro-batches, 2 chunks: 2*8*2 = 32 sends of 1e8 bytes at 25 GB/s + 10 us each
    t = st.pp_comm_time_s(4, 8, 2, 1e8, 25e9, 10e-6)
    assert float(t) == approx(32 * (10e-6 + 1e8 / 25e9))
    assert float(st.pp_comm_time_s(1, 8, 1, 1e8, 25e9, 10e-6)) == 0


def test_bubble_p_minus_1_over_m_and_interleaving():
    # Narayanan et al. 2021 §2.2: (p-1)/m; interleaved (p-1)/(m*v)
    assert st.bubble_time_s(4, 8, 1, 1.0) == approx(3 / 8)
    assert st.bubble_time_s(4, 8, 2, 1.0) == approx(3 / 16)
    assert st.bubble_time_s(1, 8, 1, 1.0) == 0


# --------------------------------------------------------------------------- data parallel


def test_ddp_all_reduce_hidden_behind_backward_except_last_bucket():
    # DDP: total = 2 passes; with a long backward window only the last bucket's
    # all-reduce (2 passes of the bucket) stays exposed.
    total, exposed = st.dp_comm_times_s(0, 4, grad_half_s=0.1, param_half_s=0.05,
                                        bucket_half_s=0.002, fwd_mb_s=1.0, bwd_mb_s=2.0)
    assert float(total) == approx(0.2)
    assert float(exposed) == approx(0.004)
    # a short window: 0.2 - 0.15 = 0.05 exposed
    _, exposed = st.dp_comm_times_s(0, 4, 0.1, 0.05, 0.002, 1.0, 0.15)
    assert float(exposed) == approx(0.05)


def test_zero_volumes_2phi_2phi():
    # Seed 001 §2 / seed 002: with param and grad halves equal (same bytes), DDP 2 halves,
    # ZeRO-1 2 halves per step; ZeRO-2 reduce-scatters every micro-batch. (ZeRO-3's 3 halves
    # per micro-batch: DeepSpeed's per-layer schedule, tests/test_steptime_wired.py.)
    h, m = 0.1, 1
    totals = [float(st.dp_comm_times_s(z, m, h, h, 0.0, 0.0, 0.0)[0]) for z in range(3)]
    assert totals == [approx(0.2), approx(0.2), approx(0.2)]
    m = 4
    assert float(st.dp_comm_times_s(2, m, h, h, 0.0, 0.0, 0.0)[0]) == approx(4 * 0.1 + 0.1)


# --------------------------------------------------------------------------- offload


def test_cpu_adam_time():
    # 1e9 parameters per GPU shard, 8 GPUs per node, CPU at 2e9 params/s: 8e9 / 2e9 = 4 s
    assert float(st.cpu_adam_s(True, 1e9, 8, 2e9)) == approx(4.0)
    assert float(st.cpu_adam_s(False, 1e9, 8, 2e9)) == 0


def test_optimizer_offload_pcie():
    # 1e9-parameter shard, fp16 grads down (2e9 B) and fp16 params up (2e9 B) at 25 GB/s:
    # down 0.08 s hidden behind a 0.05 s backward leaves 0.03; up 0.08 exposed -> 0.11
    t = st.optimizer_offload_s(True, 1e9, 2, 2, True, 25e9, 0.05)
    assert float(t) == approx(0.03 + 0.08)
    # parameters offloaded too (ZeRO-Infinity): no copy back up
    assert float(st.optimizer_offload_s(True, 1e9, 2, 2, False, 25e9, 0.05)) == approx(0.03)


def test_nvme_optimizer_read_and_write():
    # 1e9 params x K=12 bytes x 8 GPUs = 96 GB per node, read at 24 GB/s and written at 12 GB/s
    t = st.nvme_optimizer_s(True, 1e9, 12, 8, 24e9, 12e9)
    assert float(t) == approx(96e9 / 24e9 + 96e9 / 12e9)


def test_param_offload_prefetch():
    # shard 1e9 fp16 = 2e9 B at 25 GB/s = 0.08 s per fetch; fwd 0.05 -> 0.03, bwd 0.1 -> 0;
    # 3 micro-batches -> 0.09. From NVMe: + 2e9*8/16e9 = 1.0 s per fetch.
    t = st.param_offload_s(1, 3, 1e9, 2, 8, 25e9, 16e9, 0.05, 0.1)
    assert float(t) == approx(0.09)
    t = st.param_offload_s(2, 1, 1e9, 2, 8, 25e9, 16e9, 0.05, 0.1)
    assert float(t) == approx((1.08 - 0.05) + (1.08 - 0.1))


def test_zero_infinity_efficiency_matches_no_overlap_time():
    # seed 000 §4: efficiency = ait*bw/(ait*bw+peak) equals compute/(compute + data/bw)
    # when nothing overlaps. ait = seq*bsz = 2048 FLOPs/byte for params (seed 000 §4),
    # bw 25 GB/s, peak 70 TFLOP/s: 2048*25e9/(2048*25e9 + 70e12) = 0.4224...
    eff = offload_efficiency(2048, 25e9, 70e12)  # planner.bandwidth's, the one formula
    assert eff == approx(51.2e12 / (51.2e12 + 70e12))
    flops = 1e15
    compute = flops / 70e12
    comm = flops / 2048 / 25e9
    assert compute / (compute + comm) == approx(eff)
    assert float(st.exposed_s(comm, 0.0)) == approx(comm)  # no window: all of it stays


def test_exposed_never_negative_and_floor_capped():
    assert float(st.exposed_s(0.1, 1.0)) == 0
    assert float(st.exposed_s(0.1, 1.0, floor_s=0.5)) == approx(0.1)  # floor <= total
    assert math.isclose(float(st.exposed_s(1.0, 0.25)), 0.75)


# --------------------------------------------------------------------------- memory-bound kernels


def _gpt(h: int, a: int, layers: int = 1, **kw):
    from planner.core.spec import ModelSpec

    return ModelSpec(name="g", num_layers=layers, hidden_size=h, num_heads=a,
                     ffn_hidden_size=4 * h, vocab_size=51200, max_seq_len=2048, **kw)


def test_elementwise_bytes_gpt3_layer_tp8():
    # GPT-3 175B block (h=12288, a=96, f=4h), s=2048, b=1, fp16, dropout on, tp=8, no SP.
    # tokens x h = 2048 x 12288 = 25,165,824 = "sbh".
    # 2 LayerNorms read + write 2 B: 2 x 4 sbh; 2 bias-dropout-adds read 2 x 2 B, write 2 B
    # + 1-byte mask: 2 x 7 sbh  -> 22 sbh, replicated on every tp rank (no SP):
    sbh = 2048 * 12288
    replicated = 22 * sbh  # 553,648,128
    # bias-GeLU reads and writes the 4h-wide tensor: 2 x 2 B x 4 sbh = 16 sbh, / tp 8
    gelu = 16 * sbh / 8  # 50,331,648
    # softmax (read + write 2 B) and dropout (read + write 2 B + 1-byte mask) on the
    # a x s x s scores: 9 bytes each, 96/8 = 12 heads per rank: 12 x 2048^2 x 9
    scores = 12 * 2048 * 2048 * 9  # 452,984,832
    tok, sc = st.elementwise_layer_bytes(_gpt(12288, 96), 2048, 1, 8, False, False, 2)
    assert float(tok) == approx(replicated + gelu)
    assert float(sc) == approx(scores)
    # sequence parallel splits the norms and residual adds over tp too
    tok_sp, _ = st.elementwise_layer_bytes(_gpt(12288, 96), 2048, 1, 8, True, False, 2)
    assert float(tok_sp) == approx(replicated / 8 + gelu)
    # flash attention keeps the scores on chip
    _, sc_flash = st.elementwise_layer_bytes(_gpt(12288, 96), 2048, 1, 8, False, True, 2)
    assert float(sc_flash) == 0


def test_elementwise_bytes_without_dropout_and_swiglu():
    # no dropout: no 1-byte masks; SwiGLU reads gate + up (2f) and writes f: 3 x 2 B x f
    # h=64, a=4, f=256, s=16, b=1, tp=1: LN 2 x 4 + BDA 2 x 6 = 20 B per token x h
    m = _gpt(64, 4, dropout=False, mlp="swiglu")  # f = 4h = 256
    tok, sc = st.elementwise_layer_bytes(m, 16, 1, 1, False, False, 2)
    assert float(tok) == approx(16 * 64 * 20 + 16 * 256 * 6)
    assert float(sc) == approx(4 * 16 * 16 * 8)  # softmax 4 B + dropout 4 B per score


def test_elementwise_passes_per_recompute_mode():
    # forward 1 + backward 2 = 3 forward-equivalents; full recompute adds a forward (4);
    # selective recomputes only the attention scores once more.
    assert float(st.elementwise_step_bytes(10.0, 5.0, 0)) == approx(3 * 15)
    assert float(st.elementwise_step_bytes(10.0, 5.0, 2)) == approx(4 * 15)
    assert float(st.elementwise_step_bytes(10.0, 5.0, 1)) == approx(3 * 15 + 5)


def test_pp_scatter_gather_sends_one_tp_slice_and_gathers_on_nvlink():
    # Narayanan et al. 2021 §4.1: each of tp=8 ranks sends 1/8 of b*s*h*2 = 50,331,648 B over
    # its NIC share (25 GB/s), then the receiving group all-gathers over NVLink (one ring pass,
    # 7/8 x 50331648 / 300e9). 4 micro-batches, v=1: 8 transfers.
    act = 2048 * 12288 * 2
    gather = float(st.ring_collective_s(act, 8, 300e9, 0.0, 1))
    assert gather == approx(7 / 8 * act / 300e9)
    t = st.pp_comm_time_s(2, 4, 1, act / 8, 25e9, 0.0, gather)
    assert float(t) == approx(8 * (act / 8 / 25e9 + 7 / 8 * act / 300e9))


def test_gpu_adam_step_reads_and_writes_states():
    # megatron-fp16 Adam: K = 12 (fp32 master + m + v) read and written, fp32 grad read (4),
    # fp16 param written (2): 30 B per parameter; 2e9 parameters at 2039 GB/s
    t = st.gpu_optimizer_s(False, 2e9, 12, 4, 2, 2039e9)
    assert float(t) == approx(2e9 * 30 / 2039e9)
    assert float(st.gpu_optimizer_s(True, 2e9, 12, 4, 2, 2039e9)) == 0  # CPU Adam instead
