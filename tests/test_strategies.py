"""strategies.strategy_minimums: the fewest GPUs of each strategy really is the fewest.

Each minimum is checked from both sides with plan_memory: the reported layout fits, and the next
smaller bookable count (half a node below one node, one node fewer above) does not.
"""

from __future__ import annotations

import pytest

from planner.io.loading import load_cluster, load_model
from planner.memory.plan import plan_memory
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout, TrainSetup
from planner.search.strategies import cluster_with_gpus, strategy_minimums


def setup_for(layout: Layout, seq_len: int = 2048) -> TrainSetup:
    return TrainSetup(seq_len=seq_len, global_batch=layout.micro_batch * layout.grad_accum * layout.dp,
                      train_tokens=1e9, precision=get_precision("zero-fp16"), optimizer=get_optimizer("adam"))


def fits(model, cluster, layout: Layout) -> bool:
    return plan_memory(model, cluster_with_gpus(cluster, layout.num_gpus), layout, setup_for(layout)).fits


def smaller_count(count: int, per_node: int) -> int | None:
    if count <= 1:
        return None
    return count // 2 if count <= per_node else count - per_node


@pytest.fixture(scope="module")
def gpt3_on_v100():
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx2x32")
    return model, cluster, strategy_minimums(model, cluster, setup_for(Layout()))


def test_every_strategy_is_listed(gpt3_on_v100):
    _, _, rows = gpt3_on_v100
    assert [r.strategy for r in rows] == [
        "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO-3 + CPU offload", "ZeRO-Infinity (NVMe)",
        "TPxPPxDP (ZeRO-1)"]


def test_ddp_zero1_zero2_never_fit_175b_on_32gb(gpt3_on_v100):
    # Seed 001 §2: per GPU DDP keeps 16Φ, ZeRO-1 at least 4Φ, ZeRO-2 at least 2Φ bytes whatever
    # Nd is; 2 x 174.6e9 = 349 GB > 32 GiB, so none of them fits at any GPU count.
    _, _, rows = gpt3_on_v100
    assert [r.min_gpus for r in rows[:3]] == [None, None, None]


def test_minimums_fit_and_one_step_fewer_does_not(gpt3_on_v100):
    model, cluster, rows = gpt3_on_v100
    per_node = cluster.node.gpus_per_node
    for row in rows[3:]:
        assert row.min_gpus is not None and row.layout is not None, row.strategy
        assert row.layout.num_gpus == row.min_gpus
        assert fits(model, cluster, row.layout), row.strategy
        fewer = smaller_count(row.min_gpus, per_node)
        if fewer is not None and row.layout.tp * row.layout.pp == 1:
            assert not fits(model, cluster, row.layout.model_copy(update={"dp": fewer})), row.strategy


def test_zero3_needs_at_least_its_model_states(gpt3_on_v100):
    # ZeRO-3 keeps (4+K)Φ/Nd = 16Φ/Nd bytes per GPU (seed 001 §2); with Φ = 174,604,259,328 and
    # 32 GiB per GPU, Nd >= 16 x 174,604,259,328 / 34,359,738,368 = 81.3, so at least 82 GPUs,
    # i.e. 6 DGX-2 nodes (96 GPUs) before activations and buffers are even counted.
    _, _, rows = gpt3_on_v100
    zero3 = rows[3].min_gpus
    assert zero3 is not None and zero3 >= 96 and zero3 % 16 == 0


def test_offload_needs_fewer_gpus_than_zero3(gpt3_on_v100):
    _, _, rows = gpt3_on_v100
    zero3, cpu, nvme = rows[3].min_gpus, rows[4].min_gpus, rows[5].min_gpus
    assert nvme <= cpu < zero3


def test_a_small_model_fits_ddp_on_one_gpu():
    model, cluster = load_model("gpt2"), load_cluster("dgx2")
    rows = strategy_minimums(model, cluster, setup_for(Layout(), seq_len=1024))
    assert rows[0].strategy == "DDP" and rows[0].min_gpus == 1
    assert all(r.min_gpus == 1 for r in rows[1:6])


@pytest.mark.parametrize(("name", "hw"), [("mixtral-8x7b", "dgx2x32"), ("llama2-70b", "dgx-h100x32"),
                                          ("gpt3-13b", "rtx4090-x8")])
def test_array_fit_test_agrees_with_plan_memory(name, hw):
    """`_fits_many` (one array evaluation over dp) gives plan_memory's verdict at every dp."""
    import numpy as np

    from planner.io.jobfile import make_setup
    from planner.search.strategies import _fits, _fits_many

    model, cluster = load_model(name), load_cluster(hw)
    setup = make_setup(2048, 1, 1e12)
    bases = [Layout(zero_stage=z, micro_batch=1, grad_accum=1, recompute="full",
                    offload_optimizer=o, offload_params=p)
             for z, o, p in ((1, "none", "none"), (3, "none", "none"), (3, "cpu", "cpu"), (2, "cpu", "none"))]
    bases.append(Layout(tp=2, pp=2, zero_stage=1, micro_batch=1, grad_accum=2, recompute="full",
                        sequence_parallel=True))
    for base in bases:
        dps = np.array([1, 2, 4, 8, 16, 64, 256], dtype=np.int64)
        dps = dps[(base.tp * base.pp * dps < cluster.node.gpus_per_node)
                  | (base.tp * base.pp * dps % cluster.node.gpus_per_node == 0)]
        many = _fits_many(model, cluster, base, setup, dps)
        one = [_fits(model, cluster, base.model_copy(update={"dp": int(d)}), setup) for d in dps]
        assert list(many) == one, base
