"""Compute/communication interference (planner/timing/interference.py), worked by hand."""

from __future__ import annotations

import pytest

from planner.timing import interference, sharded_dp


def test_sm_share_lost_is_nccl_ctas_over_sms():
    # 24 CTAs (forum thread 337991) over the A100's 108 SMs = 0.2222; H100 132 -> 0.1818.
    assert interference.sm_share_lost(108) == pytest.approx(24 / 108)
    assert interference.sm_share_lost(132) == pytest.approx(0.181818, rel=1e-5)
    assert interference.sm_share_lost(None) == 0.0


def test_overlapped_exposed_short_collective_costs_its_sm_share():
    # a = 10 s of which the last bucket 1 s runs after compute; window 100 s, k = 0.2:
    # exposed = 1 + 0.2 x 9 = 2.8 (the 9 s overlapped slow compute by 1.8 s).
    assert float(interference.overlapped_exposed_s(10.0, 100.0, 0.2, 1.0)) == pytest.approx(2.8)
    # k = 0: only the floor, as before interference was modelled.
    assert float(interference.overlapped_exposed_s(10.0, 100.0, 0.0, 1.0)) == pytest.approx(1.0)


def test_overlapped_exposed_long_collective_is_comm_bound():
    # a = 100 s over a 10 s window: 90 s exposed whatever k (0.2 x 100 = 20 < 90).
    assert float(interference.overlapped_exposed_s(100.0, 10.0, 0.2)) == pytest.approx(90.0)


def test_pipelined_layers_with_interference():
    # a = 2, c = 3 per layer, L = 4, f = 1, k = 0.25: each overlapped layer takes
    # max(3 + 0.25 x 2, 2) = 3.5 -> T = 2 + 3 + 3 x 3.5 = 15.5 (k = 0: 2 + 3 + 3 x 3 = 14).
    assert float(sharded_dp.pipelined_s(2.0, 3.0, 4, 1.0, 0.25)) == pytest.approx(15.5)
    assert float(sharded_dp.pipelined_s(2.0, 3.0, 4, 1.0, 0.0)) == pytest.approx(14.0)
    # comm-bound layer: a = 4, c = 2, k = 0.25: max(2 + 1, 4) = 4 -> T = 4 + 2 + 3 x 4 = 18.
    assert float(sharded_dp.pipelined_s(4.0, 2.0, 4, 1.0, 0.25)) == pytest.approx(18.0)


def test_zero3_step_grows_by_k_times_hidden_gathers():
    # DeepSpeed ZeRO-3, one micro-batch, L = 2, gather 1 s, RS 1 s, fwd 4 s, bwd 8 s per layer,
    # full prefetch. k = 0: fwd = 1 + 4 + max(4, 1) = 9, bwd = 2 + 8 + max(8, 2) = 18 -> 27.
    # k = 0.5: fwd = 1 + 4 + (4 + 0.5) = 9.5, bwd = 2 + 8 + (8 + 1) = 19 -> 28.5.
    base = sharded_dp.zero3_step(1.0, 1.0, 4.0, 8.0, 2, 1, 1.0)
    slowed = sharded_dp.zero3_step(1.0, 1.0, 4.0, 8.0, 2, 1, 1.0, interference=0.5)
    assert float(base.step_s) == pytest.approx(27.0)
    assert float(slowed.step_s) == pytest.approx(28.5)
