"""The runtime reserve wired into the memory plan, the sweep and the strategy table (issue 11).

Every number is worked out by hand from the H100 SXM profile (hardware_profiles/gpus/
h100-sxm.yaml: memory_gib 80, usable_memory_gib 79.11, cuda_context_mib 300,
cublas_workspace_kib 32768) and NCCL's buffer sizes (planner.memory.reserve docstring:
9,633,792 bytes per connection, 16 channels x 2 connections per communicator).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.core.columns import LayoutColumns
from planner.core.spec import Layout
from planner.io.jobfile import make_setup
from planner.io.loading import cluster_for_gpus, load_model
from planner.memory.plan import plan_memory
from planner.search import sweep

GIB = 1024**3

# H100 SXM, a tp=8 pp=2 dp=2 layout (three communicators), by hand:
NOMINAL = 80 * GIB                                   # 85,899,345,920
USABLE = round(79.11 * GIB)                          # 84,943,715,697 (79.11 x 2^30 = ...696.64)
DRIVER = NOMINAL - USABLE                            # 955,630,223
CONTEXT = 300 * 1024**2                              # 314,572,800
NCCL = 3 * 16 * 2 * (8 * 512 * 8 * 16 + 120 * 640 * 8 * 8 + 4 * 1024**2)  # 3 x 32 x 9,633,792
CUBLAS = 32768 * 1024                                # 33,554,432
FRAGMENTATION = 4_247_185_785                        # ceil(0.05 x 84,943,715,697 = 4,247,185,784.85)
HAND = {"driver_unavailable": 955_630_223, "cuda_context": 314_572_800,
        "nccl_buffers": 924_844_032, "cublas_workspace": 33_554_432, "fragmentation": FRAGMENTATION}


def _case(reserve_gib=None, gpu="h100-sxm"):
    model = load_model("llama2-13b")
    cluster = cluster_for_gpus(gpu, 32)
    layout = Layout(tp=8, pp=2, dp=2, micro_batch=1, grad_accum=4, recompute="selective")
    setup = make_setup(4096, 8, 1e9, "bf16-mixed", "adam", reserve_gib)
    return model, cluster, layout, setup


def test_hand_figures_agree_with_each_other():
    assert USABLE == 84_943_715_697 and DRIVER == 955_630_223
    assert NCCL == 924_844_032 and CONTEXT == 314_572_800 and CUBLAS == 33_554_432


def test_reserve_row_by_hand():
    plan = plan_memory(*_case())
    assert plan.reserve == HAND
    capacity = NOMINAL - sum(HAND.values())          # 85,899,345,920 - 6,475,787,272
    assert capacity == 79_423_558_648
    for stage in plan.stages:
        assert stage.capacity_bytes == capacity
        assert stage.headroom_bytes == capacity - stage.total_bytes


def test_reserve_override_keeps_the_driver_shortfall():
    plan = plan_memory(*_case(reserve_gib=2.5))
    assert plan.reserve == {"driver_unavailable": 955_630_223, "user_reserve": 2_684_354_560}
    assert plan.stages[0].capacity_bytes == NOMINAL - 955_630_223 - 2_684_354_560


def test_profile_without_reserve_fields_says_so():
    model, cluster, layout, setup = _case(gpu="b200")
    plan = plan_memory(model, cluster, layout, setup)
    assert plan.reserve == {} and "no usable_memory_gib" in plan.reserve_note
    assert plan.stages[0].capacity_bytes == cluster.gpu.memory_bytes


def test_sweep_uses_the_same_capacity_as_the_plan():
    model, cluster, layout, setup = _case()
    cols = sweep.evaluate(model, cluster, setup, LayoutColumns.from_layout(layout))
    plan = plan_memory(model, cluster, layout, setup)
    assert int(cols["headroom_bytes"][0]) == plan.peak_stage.headroom_bytes


def test_reserve_column_counts_communicators():
    model, cluster, _, setup = _case()
    from planner.memory.reserve import reserve_column

    got = reserve_column(cluster.gpu, None, np.array([1, 8, 8, 1]), np.array([1, 1, 2, 1]),
                         np.array([1, 1, 2, 4]))
    base = sum(HAND.values()) - NCCL
    per_comm = NCCL // 3
    assert got.tolist() == [base, base + per_comm, base + 3 * per_comm, base + per_comm]


def test_fit_prints_reserve_row_and_check_json_has_it():
    runner = CliRunner()
    args = ["--model", "llama2-13b", "--gpu", "h100-sxm", "--gpus", "32", "--tp", "8", "--pp", "2",
            "--micro-batch", "1", "--grad-accum", "4", "--seq-len", "4096", "--precision", "bf16-mixed",
            "--recompute", "selective"]
    out = runner.invoke(app, ["fit", *args])
    assert out.exit_code in (0, 1), out.output
    assert "runtime reserve per GPU 6.03 GiB" in out.output     # 6,475,787,272 / 2^30 = 6.031
    assert any(line.strip().startswith("reserve") for line in out.output.splitlines())
    job = runner.invoke(app, ["fit", *args, "--json"])
    doc = json.loads(job.stdout)
    assert doc["memory"]["reserve"] == HAND


@pytest.mark.parametrize("reserve", ["-1", "nan"])
def test_bad_reserve_is_exit_2(reserve):
    out = CliRunner().invoke(app, ["fit", "--model", "gpt2", "--gpu", "h100-sxm", "--gpus", "1",
                                   "--reserve", reserve])
    assert out.exit_code == 2
