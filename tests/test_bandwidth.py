"""ZeRO-Infinity §4 arithmetic intensity and efficiency (seed 000 §4, docs/equations.md §5).

The seed stops after the efficiency definition; the intensities seq·bsz, seq·bsz/4 and 24·hd·ci
(docs/equations.md §5) are checked against the ratios of computation to data movement they
come from, and the efficiencies are worked by hand. V100-class peak 70e12 FLOP/s and seq 1024
are the setting of the paper's Figure 3.
"""

from __future__ import annotations

import math

import pytest

from planner.timing import bandwidth as bw
from planner.core.errors import PlanInputError

PEAK = 70e12


def test_params_grads_intensity_is_seq_bsz():
    params = 12 * 96 * 12288**2  # seed 000 eq.1, GPT-3-like
    flops = bw.iteration_flops(2, 1024, params)  # 2·4·bsz·seq·params
    ait = bw.arithmetic_intensity(flops, bw.params_grads_moved_bytes(params))
    assert ait == bw.arithmetic_intensity_params_grads(2, 1024) == 2048


def test_optimizer_intensity_is_quarter():
    params = 1e9
    ait = bw.arithmetic_intensity(bw.iteration_flops(2, 1024, params), bw.optimizer_moved_bytes(params))
    assert ait == bw.arithmetic_intensity_optimizer(2, 1024) == 512


def test_checkpoint_intensity_is_24_hd_ci():
    bsz, seq, hd, nl, ci = 4, 1024, 8192, 64, 2
    params = 12 * nl * hd**2
    moved = bw.checkpoints_moved_bytes(bsz, seq, hd, nl, ci)  # 2 x (2·bsz·seq·hd·nl/ci)
    assert moved == 2 * 2 * bsz * seq * hd * nl / ci
    ait = bw.arithmetic_intensity(bw.iteration_flops(bsz, seq, params), moved)
    assert math.isclose(ait, bw.arithmetic_intensity_checkpoints(hd, ci), rel_tol=1e-12)
    assert bw.arithmetic_intensity_checkpoints(hd, ci) == 24 * 8192 * 2 == 393_216


def test_efficiency_params_grads_70_gb_per_s_batch_1():
    # ait = 1024 x 1; 1024 x 70e9 = 7.168e13 -> 7.168e13 / (7.168e13 + 7e13) = 0.50593...
    eff = bw.offload_efficiency(1024, 70e9, PEAK)
    assert math.isclose(eff, 7.168e13 / 14.168e13, rel_tol=1e-12)
    assert eff > 0.5


def test_efficiency_checkpoints_2_gb_per_s_hidden_2k():
    # ait = 24 x 2048 x 1 = 49,152; x 2e9 = 9.8304e13 -> 9.8304e13 / 16.8304e13 = 0.5841
    eff = bw.offload_efficiency(bw.arithmetic_intensity_checkpoints(2048, 1), 2e9, PEAK)
    assert math.isclose(eff, 9.8304e13 / 16.8304e13, rel_tol=1e-12)


def test_efficiency_is_compute_over_compute_plus_movement():
    total, ait, link = 1e18, 512, 25e9
    compute = bw.compute_time_s(total, PEAK)            # 1e18 / 7e13 = 14,285.7 s
    comm = bw.communication_time_s(total, ait, link)    # 1e18 / (512 x 25e9) = 78,125 s
    assert math.isclose(bw.offload_efficiency(ait, link, PEAK), compute / (compute + comm))


def test_required_bandwidth_inverts_efficiency():
    # 50 % needs ait·bw = peak: bw = 7e13 / 1024 = 68.36 GB/s
    assert math.isclose(bw.required_bandwidth_bytes_per_s(1024, PEAK, 0.5), 7e13 / 1024)
    # optimizer states (ait / 4) need exactly 4x the bandwidth of parameters and gradients
    p_g = bw.required_bandwidth_bytes_per_s(2048, PEAK, 0.9)
    opt = bw.required_bandwidth_bytes_per_s(512, PEAK, 0.9)
    assert math.isclose(opt, 4 * p_g)
    assert math.isclose(bw.offload_efficiency(512, opt, PEAK), 0.9)


def test_bad_inputs():
    with pytest.raises(PlanInputError, match="efficiency"):
        bw.required_bandwidth_bytes_per_s(1024, PEAK, 1.0)
    with pytest.raises(PlanInputError, match="total_bytes"):
        bw.arithmetic_intensity(1e12, 0)
