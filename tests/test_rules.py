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
from test_plan import TINY, make_cluster, make_setup


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


def test_mask_of_a_table_gives_each_rows_verdict_and_counts_rows():
    """`rules.mask(..., rows=...)`: the rules run on a table of distinct combinations, and the
    verdicts and rejection counts are those of the rows pointing into it. Hand-built table:
    (zero 0, offload_params cpu) breaks "offload_params needs ZeRO-3"; (zero 0, offload
    optimizer cpu, offload_params cpu) breaks it first and also "offload_optimizer needs ZeRO
    >= 1" (counted under the first); (zero 3, cpu, cpu) breaks nothing."""
    table = LayoutColumns(dict(zero_stage=np.array([0, 0, 3]),
                               offload_optimizer=np.array([0, 1, 1]),
                               offload_params=np.array([1, 1, 1])))
    rows = np.array([2, 0, 0, 1, 2, 0, 1])  # 3 rows of entry 0, 2 of entry 1, 2 of entry 2
    ok, rejected = rules.mask(None, table, rules.LAYOUT_RULES, rows)
    assert ok.tolist() == [True, False, False, False, True, False, False]
    assert rejected == {"offload_params needs ZeRO-3": 5}
    # the same as masking the rows themselves
    every_ok, every_rejected = rules.mask(None, table.take(rows), rules.LAYOUT_RULES)
    assert every_ok.tolist() == ok.tolist() and every_rejected == rejected
    ok, rejected = rules.mask(None, table, rules.LAYOUT_RULES, np.array([2, 2]))
    assert ok.tolist() == [True, True] and rejected == {}


def test_one_layouts_rules_on_scalars_match_the_columns():
    """`rules.first_broken` (one layout's coded fields as numpy scalars: Layout's validator, the
    activation inventory's tp check) names the rule `rules.mask` rejects the same row under,
    on every row of a grid over the fields the layout-only and tp rules read (TINY: 4 heads,
    seq_len 8; 2 x 3 x 4 x 3 x 3 x 2 x 2 x 2 x 2 = 6,912 rows)."""
    cluster, setup = make_cluster(gpus_per_node=4), make_setup(8)
    ctx = rules.Context(TINY, cluster, setup)
    checked = rules.LAYOUT_RULES + rules.named(rules.TP_RULE_NAME,
                                                "sequence parallel needs tp to divide seq_len")
    grid = np.array(np.meshgrid([1, 3], [1, 2, 4], [0, 1, 2, 3], [0, 1, 2], [0, 1, 2], [0, 1],
                                [0, 1], [1, 2], [1, 2], indexing="ij")).reshape(9, -1)
    names = ("tp", "pp", "zero_stage", "offload_optimizer", "offload_params", "dp_engine",
             "sequence_parallel", "virtual_stages", "ep")
    cols = LayoutColumns(dict(zip(names, grid)))
    broken = [rule.name for rule in checked]
    seen = set()
    for i in range(len(cols)):
        row = cols.row(i)
        rule = rules.first_broken(ctx, row, checked)
        ok, rejected = rules.mask(ctx, cols.take([i]), checked)
        assert bool(ok[0]) == (rule is None)
        assert rejected == ({} if rule is None else {rule.name: 1})
        seen.add(None if rule is None else broken.index(rule.name))
    assert len(seen) >= 6  # the grid breaks most of the rules, and passes some rows


def test_sweep_counts_the_layouts_bucket_sizes():
    """Divergence 2 of issue 9: a DeepSpeed config's bucket sizes (Layout.buffers) reached fit's
    memory and step time but not the sweep's. With non-default buckets the sweep's columns equal
    plan_memory / estimate_step of the same Layout (buffers included) and differ from the
    defaults' by the hand-counted bucket bytes."""
    from planner.core.spec import EngineBuffers
    from planner.timing.steptime import estimate_step

    cluster, setup = make_cluster(), make_setup(8)
    buffers = EngineBuffers(reduce_bucket_elements=1_000_000, ddp_bucket_bytes=1_048_576,
                            max_live_parameters=0, prefetch_bucket_elements=0,
                            param_persistence_threshold=0)
    c = sweep.Constraints(buffers=buffers)
    cands = sweep.enumerate_candidates(TINY, cluster, setup, c)
    cols = sweep.evaluate(TINY, cluster, setup, cands, c)
    default_cols = sweep.evaluate(TINY, cluster, setup, cands, sweep.Constraints())
    zero1 = [i for i in range(len(cands)) if cands["zero_stage"][i] == 1
             and cands["offload_optimizer"][i] == 0]
    assert zero1
    for i in zero1[:5] + list(range(0, len(cands), max(1, len(cands) // 40))):
        layout = sweep.layout_at(cands, i, c)
        assert layout.buffers == buffers
        mem = plan_memory(TINY, cluster, layout, setup)
        assert int(cols["gpu_peak_bytes"][i]) == max(s.total_bytes for s in mem.stages)
        assert float(cols["step_s"][i]) == estimate_step(TINY, cluster, layout, setup).step_s
    # ZeRO-1 without offload: the reduce bucket is allocated whole in the 16-bit dtype
    # (model_states.buffer_bytes): 5e8 x 2 bytes by default, 1e6 x 2 bytes here
    i = zero1[0]
    assert int(default_cols["gpu_peak_bytes"][i]) - int(cols["gpu_peak_bytes"][i]) == \
        (500_000_000 - 1_000_000) * 2
