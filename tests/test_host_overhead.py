"""The calibrated node keys the step model reads (planner/timing/host_overhead.py):
`dispatch_per_op_us` and `fsdp2_hook_us` change the step by exactly key x count; absent, nothing
changes. Every expected figure is worked out by hand below."""

from __future__ import annotations

import pytest

from planner.core.spec import Cluster, Layout, NodeSpec
from planner.timing.host_overhead import HOOKS_PER_GROUP, OPS_OUTSIDE_LAYERS, OPS_PER_LAYER
from planner.timing.steptime import estimate_step
from test_sweep_steptime_cases import MODEL, SETUP, cluster


def calibrated(c: Cluster, **keys: float) -> Cluster:
    data = c.node.model_dump()
    node = NodeSpec.model_validate(data | keys | {"sources": data["sources"] | {k: "test" for k in keys}})
    return c.model_copy(update={"node": node})


def test_dispatch_per_op_adds_key_times_ops_times_micro_batches() -> None:
    # MODEL has 2 layers: 219 x 2 + 63 = 501 ops per micro-batch forward + backward.
    assert OPS_PER_LAYER * 2 + OPS_OUTSIDE_LAYERS == 501
    plain = estimate_step(MODEL, cluster(1), Layout(micro_batch=4), SETUP)
    with_key = estimate_step(MODEL, calibrated(cluster(1), dispatch_per_op_us=5.0), Layout(micro_batch=4), SETUP)
    # global batch 4 at micro-batch 4: one micro-batch; 501 x 5 us = 2.505 ms
    assert plain.host_overhead_s == 0.0
    assert with_key.host_overhead_s == pytest.approx(2.505e-3, rel=1e-12)
    assert with_key.step_s - plain.step_s == pytest.approx(2.505e-3, rel=1e-9)
    # micro-batch 1, 4 accumulated: 4 micro-batches, 4 x 2.505 ms = 10.02 ms
    four = estimate_step(MODEL, calibrated(cluster(1), dispatch_per_op_us=5.0), Layout(micro_batch=1, grad_accum=4), SETUP)
    base = estimate_step(MODEL, cluster(1), Layout(micro_batch=1, grad_accum=4), SETUP)
    assert four.step_s - base.step_s == pytest.approx(10.02e-3, rel=1e-9)
    assert four.compute_s == base.compute_s and four.memory_bound_s == base.memory_bound_s


def test_fsdp2_hooks_count_on_fsdp2_rows_only() -> None:
    # dp = 2, micro-batch 1, 2 accumulated (global batch 4): 2 micro-batches per rank. FSDP2 groups: 2 blocks +
    # the root = 3, 4 hooks each per micro-batch: 2 x 4 x 3 = 24 hooks at 250 us = 6 ms.
    assert HOOKS_PER_GROUP == 4
    layout = Layout(dp=2, zero_stage=3, dp_engine="fsdp2", micro_batch=1, grad_accum=2)
    base = estimate_step(MODEL, cluster(2), layout, SETUP)
    hooks = estimate_step(MODEL, calibrated(cluster(2), fsdp2_hook_us=250.0), layout, SETUP)
    assert hooks.step_s - base.step_s == pytest.approx(6e-3, rel=1e-9)
    # both keys: 2 x (501 x 5 us + 12 x 250 us) = 2 x (2.505 + 3) ms = 11.01 ms
    both = estimate_step(MODEL, calibrated(cluster(2), fsdp2_hook_us=250.0, dispatch_per_op_us=5.0), layout, SETUP)
    assert both.host_overhead_s == pytest.approx(11.01e-3, rel=1e-12)
    # DeepSpeed ZeRO-3 has no FSDP2 hooks: the key changes nothing there
    ds = Layout(dp=2, zero_stage=3, micro_batch=1, grad_accum=2)
    assert estimate_step(MODEL, calibrated(cluster(2), fsdp2_hook_us=250.0), ds, SETUP).step_s == \
        estimate_step(MODEL, cluster(2), ds, SETUP).step_s


def test_op_counts_are_the_recorded_ops_of_the_calibration_block() -> None:
    """The constants against the ops torch records for the calibration's GPT-2 (meta device)."""
    from planner.calibrate.config import scaled_model
    from planner.calibrate.dispatch import op_count
    from planner.calibrate.predict import inventory
    from planner.io.loading import load_model

    for layers in (1, 2, 3):
        model = scaled_model(load_model("gpt2"), layers=layers, hidden=64, heads=4, ffn=256, vocab=100, kv_heads=None)
        assert op_count(inventory(model, 8, 1)) == OPS_OUTSIDE_LAYERS + OPS_PER_LAYER * layers
