"""FSDP2 as its own strategy next to DeepSpeed ZeRO-3 (Layout.dp_engine): rules, the step model's
schedule by hand, the sweep's enumeration and the exports."""

from __future__ import annotations

import pytest

from planner.core import rules
from planner.core.columns import LayoutColumns
from planner.core.params import count_params
from planner.core.spec import Layout
from planner.io.export import export_text, search_constraints
from planner.core.errors import PlanInputError
from planner.search import sweep
from planner.timing.steptime import estimate_step
from test_sweep_steptime_cases import MODEL, NCCL_BASE, SETUP, cluster


def _rejected(layout: Layout) -> list[str]:
    ctx = rules.Context(MODEL, cluster(layout.num_gpus), SETUP)
    return list(rules.mask(ctx, LayoutColumns.from_layout(layout))[1])


def test_rules():
    assert _rejected(Layout(dp=2, zero_stage=3, dp_engine="fsdp2", micro_batch=2)) == []
    assert _rejected(Layout(dp=2, zero_stage=2, dp_engine="fsdp2", micro_batch=2)) == []
    assert _rejected(Layout(dp=2, zero_stage=1, dp_engine="fsdp2", micro_batch=2)) == [
        "FSDP2 shards like ZeRO-2 or ZeRO-3"]
    assert _rejected(Layout(dp=2, zero_stage=3, dp_engine="fsdp2", offload_params="cpu",
                            micro_batch=2)) == ["FSDP2 offload is not modelled"]


def test_fsdp2_schedule_by_hand_with_no_compute_to_hide_behind():
    # dp = 2 in one node at 100 GB/s, alpha 0 + NCCL base 8.4 us; per layer (Φ/2, 2 layers)
    # AG = RS = 8.4 us + 1/2 x 2·Φ/2 B / 100e9. 2 micro-batches.
    # reshard_after_forward (zero 3): per micro-batch forward AG, backward AG + RS:
    #   total = 2 x 2 x (2 AG + RS) = 12 collectives, as DeepSpeed's.
    # kept gathered (zero 2): the backward gathers go: 2 x 2 x (AG + RS) = 8 collectives.
    phi = count_params(MODEL).total
    one = NCCL_BASE + 0.5 * 2 * (phi / 2) / 100e9
    z3 = estimate_step(MODEL, cluster(2), Layout(dp=2, zero_stage=3, dp_engine="fsdp2",
                                                 micro_batch=1, grad_accum=2), SETUP)
    z2 = estimate_step(MODEL, cluster(2), Layout(dp=2, zero_stage=2, dp_engine="fsdp2",
                                                 micro_batch=1, grad_accum=2), SETUP)
    assert z3.dp_comm_s == pytest.approx(12 * one, rel=1e-12)
    assert z2.dp_comm_s == pytest.approx(8 * one, rel=1e-12)
    # FSDP2 prefetches a whole unit ahead, DeepSpeed only what its prefetch bucket allows:
    # with the defaults (5e7-element bucket) the tiny model's layers fit whole, so both hide
    # the same collectives; exposed = step - compute is never negative. FSDP2 adds its copies
    # on the compute stream (planner/timing/sharded_dp.py fsdp2_copy_bytes, torch 2.13
    # _fsdp_collectives.py): zero-fp16 (2-byte params and grads), per micro-batch copy-out
    # 2 gathers x 2 (read + write) x 2 B x phi = 8 phi, reduce copy-in phi x (2 + 2) = 4 phi;
    # 2 micro-batches: 24 phi bytes at the test GPU's 1000 GB/s.
    ds = estimate_step(MODEL, cluster(2), Layout(dp=2, zero_stage=3, micro_batch=1,
                                                 grad_accum=2), SETUP)
    copies_s = 24 * phi / 1000e9
    assert z3.dp_comm_exposed_s - copies_s == pytest.approx(ds.dp_comm_exposed_s, rel=1e-9)
    assert z3.dp_comm_exposed_s >= 0


def test_sweep_enumerates_fsdp2_and_exports_keep_engines_apart():
    from planner.io import loading
    from planner.io.jobfile import make_setup

    model = loading.load_model("gpt3-1.3b")
    cl = loading.cluster_for_gpus("a100-80gb", 8)
    setup = make_setup(2048, 8, 1e12)
    result = sweep.sweep(model, cl, setup, sweep.Constraints(zero_stage=(3,)), top=20)
    engines = {row.layout.dp_engine for row in result.top}
    assert engines == {"deepspeed", "fsdp2"}
    only = sweep.sweep(model, cl, setup, search_constraints("accelerate-fsdp"), top=5)
    assert {row.layout.dp_engine for row in only.top} == {"fsdp2"}
    fsdp_row = next(r for r in result.top if r.layout.dp_engine == "fsdp2")
    with pytest.raises(PlanInputError, match="dp_engine=fsdp2"):
        export_text("deepspeed", model, cl, fsdp_row.layout, setup)
