"""The sweep enumerates Megatron's uneven first / last pipeline stages (issue 10) and evaluates
them exactly as `zplan fit` does (plan_memory to the byte, estimate_step to the float)."""

from __future__ import annotations

import pytest

from planner.core.spec import ModelSpec
from planner.memory.plan import plan_memory
from planner.search import sweep
from planner.timing import steptime
from test_plan import make_cluster, make_setup

# 28 layers: pp 8 does not divide them. Middle stages k = ceil(28 / 8) = 4 layers, the first and
# last share 28 - 6 x 4 = 4 -> 2 and 2 (2, 4, 4, 4, 4, 4, 4, 2); every count even, so v = 2
# (Megatron: first, last and middle counts multiples of v) is allowed too.
UNEVEN = ModelSpec(name="uneven", num_layers=28, hidden_size=64, num_heads=4,
                   ffn_hidden_size=256, vocab_size=1000, max_seq_len=128)


@pytest.mark.parametrize("layers, pp, expected", [
    (126, 16, (7, 7)),   # Llama 3 405B (Dubey et al. 2024 §3.3.2): 7 + 14 x 8 + 7 = 126
    (28, 8, (2, 2)),     # 2 + 6 x 4 + 2 = 28
    (36, 8, (3, 3)),     # k = 5: 36 - 30 = 6 -> 3 + 6 x 5 + 3
    (29, 2, (14, 15)),   # two stages: the first the smaller half
    (96, 64, None),      # k = 2: 96 - 62 x 2 < 2, no stage left for the first and last
    (96, 8, None),       # pp divides the layers: the even split
])
def test_uneven_split_by_hand(layers, pp, expected):
    assert sweep.uneven_split(layers, pp) == expected


@pytest.fixture(scope="module")
def evaluated():
    cluster, setup = make_cluster(num_nodes=2), make_setup(32)
    c = sweep.Constraints(pp=(8,))
    cands = sweep.enumerate_candidates(UNEVEN, cluster, setup, c)
    return cluster, setup, c, cands, sweep.evaluate(UNEVEN, cluster, setup, cands, c)


def test_sweep_enumerates_the_uneven_split_with_interleaving(evaluated):
    _, _, _, cands, _ = evaluated
    assert set(cands["first_stage_layers"].tolist()) == {2}
    assert set(cands["last_stage_layers"].tolist()) == {2}
    assert set(cands["virtual_stages"].tolist()) == {1, 2}


def test_uneven_rows_equal_fit_to_the_byte(evaluated):
    cluster, setup, c, cands, cols = evaluated
    n = len(cands)
    for i in range(0, n, max(1, n // 80)):
        layout = sweep.layout_at(cands, i, c)
        assert (layout.first_stage_layers, layout.last_stage_layers) == (2, 2)
        mem = plan_memory(UNEVEN, cluster, layout, setup)
        assert int(cols["gpu_peak_bytes"][i]) == max(s.total_bytes for s in mem.stages), layout
        assert int(cols["headroom_bytes"][i]) == mem.peak_stage.headroom_bytes, layout
        est = steptime.estimate_step(UNEVEN, cluster, layout, setup)
        assert float(cols["step_s"][i]) == pytest.approx(est.step_s, rel=1e-12), layout


def test_uneven_bubble_counts_the_slowest_stage(evaluated):
    # Stages 2, 4 x 6, 2 blocks; the head (logits GEMM + loss) on the last stage
    # (planner/timing/stage_placement). The head's forward 2·B·s·h·V = 2 x 32 x 128 x 64 x 1000
    # = 524,288,000 FLOPs (whole job) x pp / GPUs = 8 / 16, x 3 with the backward; its loss
    # kernels 36 B per logit (fp16 logits, logits.py) over B·s·V / (dp·tp) logits per GPU. With
    # V = 1000 against h = 64 the head outweighs two blocks (lambda >= 2): the last stage
    # (2 blocks + head) is the slowest, its matmul, recompute and element-wise time = 2 blocks
    # + head; the fill runs through the other 26 blocks: 26 / (2 + lambda) units of it.
    cluster, setup, c, cands, cols = evaluated
    i = next(j for j in range(len(cands)) if cands["virtual_stages"][j] == 1)
    layout = sweep.layout_at(cands, i, c)
    est = steptime.estimate_step(UNEVEN, cluster, layout, setup)
    speed = 312e12 * est.compute_efficiency
    head_s = 3 * 524_288_000 * 8 / 16 / speed + \
        32 * 128 * 1000 / (layout.dp * layout.tp) * 36 / 2039e9
    block_s = (est.compute_s + est.recompute_s + est.memory_bound_s - head_s) / 2
    lam = head_s / block_s
    assert lam >= 2
    ideal = est.compute_s + est.recompute_s + est.memory_bound_s + est.tp_comm_s
    assert est.bubble_s == pytest.approx(26 / (2 + lam) / layout.grad_accum * ideal, rel=1e-9)
