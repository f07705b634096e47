"""The vectorised sweep against the scalar references, its properties, and the seeds' rules."""

from __future__ import annotations

import random

import numpy as np
import pytest

from planner.io import loading
from planner.memory import plan
from planner.timing import steptime
from planner.search import sweep
from planner.io.jobfile import make_setup
from planner.core.spec import Layout

# (model, cluster, seq_len, global_batch, precision, optimizer, flash attention)
CASES = [
    ("gpt3-13b", ("a100-80gb", 64), 2048, 512, "zero-fp16", "adam", False),
    ("llama2-7b", "dgx2", 4096, 64, "zero-fp16", "adam-8bit", False),
    ("mixtral-8x7b", "dgx2x32", 4096, 1024, "zero-infinity-fp16", "adam", False),
    ("bert-large", "rtx4090-x8", 512, 256, "fp32", "sgd-momentum", False),
    ("llama3-8b", "dgx-h100x32", 8192, 96, "bf16-mixed", "adam", True),
]


def _load(case):
    name, hw, seq, batch, prec, opt, flash = case
    model = loading.load_model(name)
    cluster = loading.cluster_for_gpus(*hw) if isinstance(hw, tuple) else loading.load_cluster(hw)
    return model, cluster, make_setup(seq, batch, 1e12, prec, opt), sweep.Constraints(flash_attention=flash)


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def evaluated(request):
    model, cluster, setup, c = _load(request.param)
    cands = sweep.enumerate_candidates(model, cluster, setup, c)
    return model, cluster, setup, c, cands, sweep.evaluate(model, cluster, setup, cands, c)


def test_vectorised_equals_scalar_references(evaluated):
    """Memory to the byte vs plan.plan_memory, every step term vs steptime.estimate_step."""
    model, cluster, setup, c, cands, cols = evaluated
    n = len(cands["tp"])
    assert n > 100
    rng = random.Random(3)
    for i in rng.sample(range(n), 60):
        layout = sweep.layout_at(cands, i, c)
        mem = plan.plan_memory(model, cluster, layout, setup)
        assert int(cols["gpu_peak_bytes"][i]) == max(s.total_bytes for s in mem.stages), layout
        assert int(cols["headroom_bytes"][i]) == mem.peak_stage.headroom_bytes, layout
        assert int(cols["node_cpu_bytes"][i]) == mem.node.cpu_bytes, layout
        assert int(cols["node_nvme_bytes"][i]) == mem.node.nvme_bytes, layout
        fits = bool(cols["headroom_bytes"][i] >= 0
                    and cols["node_cpu_bytes"][i] <= mem.node.cpu_capacity_bytes
                    and cols["node_nvme_bytes"][i] <= mem.node.nvme_capacity_bytes)
        assert fits == mem.fits, layout
        est = steptime.estimate_step(model, cluster, layout, setup)
        for name, value in est.model_dump().items():
            assert float(cols[name if name != "compute_efficiency" else "efficiency"][i]) == \
                pytest.approx(value, rel=1e-12, abs=1e-15), (name, layout)


def test_every_candidate_satisfies_the_layout_rules(evaluated):
    """tp*cp*pp*dp = GPUs (cp = 1 before context parallelism), micro_batch*grad_accum*dp =
    global batch, plan.validate_layout passes."""
    model, cluster, setup, c, cands, _ = evaluated
    assert np.all(cands["tp"] * cands["cp"] * cands["pp"] * cands["dp"] == cluster.num_gpus)
    assert np.all(cands["micro_batch"] * cands["grad_accum"] * cands["dp"] == setup.global_batch)
    for i in random.Random(5).sample(range(len(cands["tp"])), 40):
        plan.validate_layout(model, cluster, sweep.layout_at(cands, i, c), setup)


def test_smaller_micro_batch_never_needs_more_gpu_memory(evaluated):
    """A layout that fits GPU memory still fits with half the micro-batch (twice the accumulation).
    (CPU memory can grow: DeepSpeed's ZeRO-Offload adds a gradient-accumulation buffer once
    grad_accum > 1, model_states `accumulated_grads_in_cpu`.)"""
    _, _, _, _, cands, cols = evaluated
    keys = ("tp", "pp", "dp", "cp", "cp_comm_type", "virtual_stages", "zero_stage",
            "offload_optimizer", "offload_params", "recompute", "sequence_parallel")
    index = {tuple(int(cands[k][i]) for k in keys) + (int(cands["micro_batch"][i]),): i
             for i in range(len(cands["tp"]))}
    checked = 0
    for key, i in index.items():
        half = index.get(key[:-1] + (key[-1] // 2,))
        if key[-1] > 1 and half is not None and cols["headroom_bytes"][i] >= 0:
            assert cols["gpu_peak_bytes"][half] <= cols["gpu_peak_bytes"][i], key
            checked += 1
    assert checked > 10


def test_more_gpus_never_raise_zero3_model_states():
    """ZeRO-3 partitions params, grads and optimizer states over dp (seed 001 §2: (4+K)Φ/Nd)."""
    model = loading.load_model("gpt3-13b")
    setup = make_setup(2048, 512, 1e12)
    previous = None
    for gpus in (8, 16, 32, 64, 128, 256):
        cluster = loading.cluster_for_gpus("a100-80gb", gpus)
        layout = Layout(tp=8, dp=gpus // 8, zero_stage=3, micro_batch=1, grad_accum=512 // (gpus // 8))
        stage = plan.plan_memory(model, cluster, layout, setup).stages[0]
        states = stage.params_bytes + stage.grads_bytes + stage.optimizer_bytes
        vec, _, _ = sweep.state_bytes(np.array([stage.num_params]), np.array([gpus // 8]),
                                      np.array([3]), np.array([0]), np.array([0]),
                                      np.array([layout.grad_accum]), setup)
        assert int(vec[0]) == states
        assert previous is None or states <= previous
        previous = states


def test_rejected_layouts_exceed_what_they_name():
    model, cluster, setup, c = _load(CASES[0])
    result = sweep.sweep(model, cluster, setup, c, rejected=20)
    assert result.rejected
    for row in result.rejected:
        mem = plan.plan_memory(model, cluster, row.layout, setup)
        assert not mem.fits
        for phrase in row.reason.split("; "):
            resource = phrase.split(" by ")[0]
            assert any(o.startswith(resource) for o in mem.overflows), (phrase, mem.overflows)


def test_top_layouts_fit_and_are_sorted():
    model, cluster, setup, c = _load(CASES[0])
    for key, column, sign in (("step-time", "step_s", 1), ("mfu", "mfu", -1),
                              ("memory-headroom", "headroom_bytes", -1)):
        result = sweep.sweep(model, cluster, setup, c, sort=key, top=8)
        values = [sign * (getattr(r.estimate, column, None) if column != "headroom_bytes"
                          else r.headroom_bytes) for r in result.top]
        assert values == sorted(values)
        for row in result.top:
            assert plan.plan_memory(model, cluster, row.layout, setup).fits


@pytest.mark.parametrize("case", CASES[:3], ids=[c[0] for c in CASES[:3]])
def test_every_result_row_carries_its_own_layouts_estimate_and_memory(case):
    """Each ranked and rejected row of a sweep holds what `estimate_step` and `plan_memory` give
    for that row's layout: every step field (the compute efficiency too: it differs with tp and
    micro-batch, so a row must not carry another candidate's) and its memory to the byte."""
    model, cluster, setup, c = _load(case)
    result = sweep.sweep(model, cluster, setup, c, top=6, rejected=4)
    assert result.top and result.rejected
    for row in result.top + result.rejected:
        est = steptime.estimate_step(model, cluster, row.layout, setup)
        for name, value in est.model_dump().items():
            assert getattr(row.estimate, name) == pytest.approx(value, rel=1e-12, abs=1e-15), \
                (name, row.layout)
        mem = plan.plan_memory(model, cluster, row.layout, setup)
        assert row.gpu_peak_bytes == max(s.total_bytes for s in mem.stages)
        assert row.headroom_bytes == mem.peak_stage.headroom_bytes
        assert row.fits == mem.fits


def test_best_layout_returns_the_scalar_estimate():
    model, cluster, setup, c = _load(CASES[0])
    layout, est = sweep.best_layout(model, cluster, setup, c)
    assert est == steptime.estimate_step(model, cluster, layout, setup)
    assert plan.plan_memory(model, cluster, layout, setup).fits


def test_nothing_fits_says_why():
    model = loading.load_model("gpt3-175b")
    cluster = loading.load_cluster("rtx4090-x8")
    setup = make_setup(2048, 64, 1e12)
    result = sweep.sweep(model, cluster, setup, sweep.Constraints(offload_optimizer=("none",),
                                                                   offload_params=("none",)))
    assert not result.top and result.evaluated > 0
    assert "GPU memory rules out" in result.empty_reason
    assert sweep.best_layout(model, cluster, setup, sweep.Constraints(offload_params=("none",),
                                                                      offload_optimizer=("none",))) is None


def test_empty_enumeration_names_the_constraint():
    model, cluster, setup, _ = _load(CASES[0])
    # gpt3-13b has 40 heads: tp=16 is not allowed within an 8-GPU node and does not divide 40
    result = sweep.sweep(model, cluster, setup, sweep.Constraints(tp=(16,)))
    assert result.evaluated == 0
    assert "tp=(16,)" in result.empty_reason


def test_gpu_count_parsing():
    assert sweep.parse_gpu_counts("64-1024") == [64, 128, 256, 512, 1024]
    assert sweep.parse_gpu_counts("256,64,128") == [64, 128, 256]
    with pytest.raises(sweep.PlanInputError):
        sweep.parse_gpu_counts("many")


# --------------------------------------------------------------------------- seeds' rules of thumb


def _best_step(model, cluster, setup, **pins):
    result = sweep.sweep(model, cluster, setup, sweep.Constraints(**pins), top=1, rejected=0)
    return result.top[0].estimate.step_s if result.top else float("inf")


def test_rtx4090_without_nvlink_prefers_low_tp():
    """Seed 004 §3.4 / seed 002: TP needs a fast interconnect; the 4090 has none (PCIe,
    31.5 GB/s, ~10 us). The best tp=8 layout is slower than the best tp=1 layout."""
    model = loading.load_model("gpt3-1.3b")
    cluster = loading.load_cluster("rtx4090-x8")
    setup = make_setup(2048, 64, 1e12)
    assert _best_step(model, cluster, setup, tp=(8,)) > 1.1 * _best_step(model, cluster, setup, tp=(1,))
    best = sweep.sweep(model, cluster, setup, top=5).top
    assert all(row.layout.tp <= 2 for row in best)


def test_nvlink_makes_tp_much_cheaper_than_pcie():
    """Same tp=8 layout: TP communication on an NVSwitch DGX A100 (300 GB/s) costs a small
    fraction of what it costs on PCIe 4090s (31.5 GB/s): bandwidth ratio 300/31.51 = 9.5."""
    model = loading.load_model("gpt3-1.3b")
    setup = make_setup(2048, 64, 1e12)
    layout = Layout(tp=8, micro_batch=1, grad_accum=64)
    dgx = loading.cluster_for_gpus("a100-80gb", 8)
    pcie = steptime.estimate_step(model, loading.load_cluster("rtx4090-x8"), layout, setup)
    nvlink = steptime.estimate_step(model, dgx, layout, setup)
    assert pcie.tp_comm_s > 5 * nvlink.tp_comm_s


def test_cross_node_tp_is_slower_than_tp_within_a_node():
    """Seed 002: TP stays within a node (<= 8 GPUs). GPT-3 175B (96 heads) on 256 A100:
    the best tp=16 layout (over the network) is slower than the best tp=8 layout."""
    model = loading.load_model("gpt3-175b")
    cluster = loading.cluster_for_gpus("a100-80gb", 256)
    setup = make_setup(2048, 256, 1e12)
    cross = _best_step(model, cluster, setup, tp=(16,), allow_cross_node_tp=True)
    within = _best_step(model, cluster, setup, tp=(8,))
    assert cross > within


def test_zero1_costs_what_ddp_costs_and_zero3_half_more():
    """Seed 002 Summary / seed 001 §2: ZeRO-1 and DDP move 2Φ per step, ZeRO-3 3Φ."""
    model = loading.load_model("gpt3-1.3b")
    cluster = loading.cluster_for_gpus("a100-80gb", 16)
    setup = make_setup(2048, 16, 1e12)
    comm = {z: steptime.estimate_step(model, cluster, Layout(dp=16, zero_stage=z, micro_batch=1),
                                      setup).dp_comm_s for z in (0, 1, 3)}
    assert comm[1] == pytest.approx(comm[0], rel=1e-12)
    # ZeRO-3 runs its 3 passes per layer (DeepSpeed's per-sub-module gathers), so it pays each
    # collective's latency 24 x 3 times instead of 2: 16 ranks on 2 nodes of 8 is a ring of 15
    # steps, 1 crossing the network (NCCL tuning.cc), + NCCL's 8.4 us base latency.
    alpha = 8.4e-6 + 14 * cluster.node.intra_node_latency_us * 1e-6 \
        + cluster.inter_node_latency_us * 1e-6
    assert comm[3] - 24 * 3 * alpha == pytest.approx(1.5 * (comm[0] - 2 * alpha), rel=1e-9)


def test_interleaved_candidates_match_plan_memory():
    """Interleaved 1F1B (v > 1), including the largest micro-batch counts (where the replay is
    capped), to the byte against plan.plan_memory."""
    model, cluster, setup, c = _load(CASES[0])
    cands = sweep.enumerate_candidates(model, cluster, setup, c)
    cols = sweep.evaluate(model, cluster, setup, cands, c)
    inter = np.nonzero(cands["virtual_stages"] > 1)[0]
    by_m = inter[np.argsort(-cands["grad_accum"][inter], kind="stable")]
    picked = list(by_m[:15]) + random.Random(7).sample(list(by_m[15:]), 25)
    for i in picked:
        layout = sweep.layout_at(cands, int(i), c)
        mem = plan.plan_memory(model, cluster, layout, setup)
        assert int(cols["gpu_peak_bytes"][i]) == max(s.total_bytes for s in mem.stages), layout


def test_interleaved_front_peak_equals_the_activations_replay():
    """max(held*c + extra*e) over the front = the peak of activations.interleaved_in_flight for
    chunk weights c (every chunk) + e (the embedding chunk on rank 0 / head chunk on rank p-1)."""
    from planner.memory.activations import interleaved_in_flight

    for p in (2, 3, 4, 6):
        for v in (2, 3, 4):
            for m in (p, 2 * p, 3 * p, 5 * p):
                for rank, chunk in ((0, 0), (p - 1, v - 1)):
                    front = sweep.interleaved_front(p, rank, v, m, chunk)
                    for c, e in ((1000, 0), (1000, 1), (1000, 700), (1, 5000)):
                        weights = [c] * v
                        weights[chunk] += e
                        counts = interleaved_in_flight(p, rank, v, m, weights)
                        peak = sum(n * w for n, w in zip(counts, weights))
                        assert max(h * c + x * e for h, x in front.tolist()) == peak, (p, v, m, rank)


def test_node_stage_counts_equal_a_rank_by_rank_walk():
    """Rows per node from the boundary nodes only = walking every rank (stage = rank // (tp*dp),
    node = rank // gpus_per_node, Megatron's order as plan._busiest_node uses it)."""
    def walk(tp, dp, pp, g, nodes):
        per, rows = tp * dp, set()
        for n in range(nodes):
            stages = [r // per for r in range(n * g, (n + 1) * g)]
            first = stages.count(0)
            last = stages.count(pp - 1) if pp > 1 else 0
            rows.add((first, g - first - last, last))
        return sorted(rows)

    for g in (1, 2, 8, 16):
        for tp in (1, 2, 8):
            for dp in (1, 3, 4, 12):
                for pp in (1, 2, 3, 5, 8):
                    n = tp * dp * pp
                    if n % g == 0:
                        assert sweep.node_stage_counts(tp, dp, pp, g, n // g) == walk(tp, dp, pp, g, n // g)


def test_near_identical_layouts_collapse_into_one_row_with_their_variants():
    """Issue 10: the same layout with an offload that changes neither fit nor step time (within
    sweep.SAME_STEP_REL) is one answer: one ranked row naming its variants. Each variant is
    re-evaluated here by estimate_step: it fits, and its step is within 0.5 % of the row's."""
    from planner.memory.plan import plan_memory

    model = loading.load_model("gpt3-1.3b")
    cluster = loading.cluster_for_gpus("a100-80gb", 8)
    setup = make_setup(2048, 8, 1e12)
    result = sweep.sweep(model, cluster, setup, sweep.Constraints(zero_stage=(3,)), top=5)
    folded = [row for row in result.top if row.variants]
    assert folded, "expected at least one offload variant folded into a ranked row"
    for row in folded:
        for variant in row.variants:
            opt, par = variant.split("/")
            lay = row.layout.model_copy(update=dict(offload_optimizer=opt, offload_params=par))
            est = steptime.estimate_step(model, cluster, lay, setup)
            assert abs(est.step_s / row.estimate.step_s - 1) <= sweep.SAME_STEP_REL
            assert plan_memory(model, cluster, lay, setup).fits
    # no two ranked rows differ only in the offload placement within the threshold
    def key(row):
        return row.layout.model_copy(update=dict(offload_optimizer="none", offload_params="none"))
    for i, a in enumerate(result.top):
        for b in result.top[i + 1:]:
            if key(a) == key(b):
                assert abs(b.estimate.step_s / a.estimate.step_s - 1) > sweep.SAME_STEP_REL
