"""The one rule table (planner.core.rules): the same rule gives fit's error and the sweep's mask."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core import rules
from planner.core.columns import LayoutColumns
from planner.core.errors import PlanInputError
from planner.core.spec import Layout
from planner.memory.plan import plan_memory
from planner.search import sweep
from planner.search.strategies import strategy_minimums
from tests.test_plan import TINY, make_cluster, make_setup


def _nvme_without_bandwidth():
    """A node with 2 TB of NVMe but no read/write bandwidth figures."""
    cluster = make_cluster(nvme_tb=2)
    node = cluster.node.model_copy(update={"nvme_read_gb_per_s": 0, "nvme_write_gb_per_s": 0})
    return cluster.model_copy(update={"node": node})


def test_nvme_without_bandwidth_is_refused_by_fit_and_by_the_sweep_alike():
    """Divergence 1 of issue 9: fit timed such NVMe offload at 0 s, the sweep dropped it
    silently. One rule now: fit refuses with the reason, the sweep names the same reason."""
    cluster, setup = _nvme_without_bandwidth(), make_setup(8)
    layout = Layout(dp=8, zero_stage=3, offload_optimizer="nvme", micro_batch=1, grad_accum=1)
    with pytest.raises(PlanInputError, match="has no NVMe bandwidth: nvme_capacity_tb=2"):
        plan_memory(TINY, cluster, layout, setup)
    result = sweep.sweep(TINY, cluster, setup)
    assert all("nvme" not in (r.layout.offload_optimizer, r.layout.offload_params)
               for r in result.top + result.rejected)
    assert "NVMe offload needs a node with NVMe capacity and bandwidth" in result.excluded
    names = [row.strategy for row in strategy_minimums(TINY, cluster, setup)]
    assert "ZeRO-Infinity (NVMe)" not in names


def test_interleaved_needs_micro_batches_divisible_by_pp():
    """Megatron-LM arguments.py: the interleaved schedule needs num_microbatches % pp == 0.
    tiny: 4 layers, pp=2, v=2 (4 = 2·2 chunks); dp=2 on 4 GPUs; global batch 6 = 1·3·2 gives
    m = 3, not a multiple of 2 -> refused; global batch 8 = 1·4·2 gives m = 4 -> accepted."""
    cluster = make_cluster(gpus_per_node=4)
    layout = Layout(pp=2, dp=2, virtual_stages=2, micro_batch=1, grad_accum=3)
    with pytest.raises(PlanInputError, match="grad_accum=3 .* divisible by pp=2"):
        plan_memory(TINY, cluster, layout, make_setup(6))
    ok = layout.model_copy(update={"grad_accum": 4})
    assert plan_memory(TINY, cluster, ok, make_setup(8)).stages


def test_mask_and_error_come_from_the_same_rule():
    """Every rule's mask agrees with check_layout on each row: allowed rows raise nothing,
    a rejected row raises that rule's field."""
    cluster, setup = make_cluster(gpus_per_node=4), make_setup(8)
    ctx = rules.Context(TINY, cluster, setup)
    grid = np.array(np.meshgrid([1, 2, 3, 4], [1, 2, 4], [1, 2], [1, 2], [1, 2, 8], [1, 4, 8],
                                indexing="ij")).reshape(6, -1)
    cols = LayoutColumns(dict(
        tp=grid[0], pp=grid[1], dp=grid[2], virtual_stages=grid[3], micro_batch=grid[4],
        grad_accum=grid[5], zero_stage=np.zeros(grid.shape[1], dtype=np.int64),
        offload_optimizer=np.zeros(grid.shape[1], dtype=np.int64),
        offload_params=np.zeros(grid.shape[1], dtype=np.int64),
        recompute=np.zeros(grid.shape[1], dtype=np.int64),
        recompute_every_k=np.ones(grid.shape[1], dtype=np.int64),
        sequence_parallel=np.zeros(grid.shape[1], dtype=bool)))
    ok, rejected = rules.mask(ctx, cols)
    assert 0 < ok.sum() < len(cols) and sum(rejected.values()) == int((~ok).sum())
    for i in range(len(cols)):
        if ok[i]:
            rules.check_layout(ctx, cols, i)
        else:
            with pytest.raises(PlanInputError):
                rules.check_layout(ctx, cols, i)
