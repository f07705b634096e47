"""The grouped evaluation (issue 9's sweep speed) against the one-row references.

The sweep evaluates each quantity once per distinct combination of the columns it reads and
gathers it back (`columns.on_distinct`), and the ZeRO-3 / FSDP2 / offload terms only on their
rows (`columns.piecewise`). Each row must still be what `plan_memory` and `estimate_step` give
for that layout alone. The rows here are shuffled, repeated and mixed (every recompute mode,
uneven first/last stages, both data-parallel engines) so that a wrong key or a wrong gather
shows; the references are the length-1 evaluations of each typed layout.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.core.columns import LayoutColumns, group_rows, on_distinct, piecewise
from planner.core.errors import PlanInputError
from planner.core.params import layers_per_stage
from planner.io import loading
from planner.io.jobfile import make_setup
from planner.memory import plan
from planner.search import sweep
from planner.timing import steptime

# (model, (gpu, GPUs), seq_len, global batch, precision, optimizer, flash attention)
CASES = [
    ("gpt3-175b", ("a100-80gb", 1024), 2048, 1536, "megatron-fp16", "adam", True),
    ("gpt3-13b", ("a100-80gb", 64), 2048, 512, "zero-fp16", "adam", False),
    ("llama2-7b", ("a100-80gb", 32), 4096, 64, "zero-fp16", "adam-8bit", True),
    ("mixtral-8x7b", ("a100-80gb", 64), 4096, 256, "zero-infinity-fp16", "adam", False),
    ("llama3-8b", ("h100-sxm", 32), 8192, 96, "bf16-mixed", "adam", True),
    # long sequences: context parallelism, also under HSDP shard groups (dp_shard x cp ranks)
    ("llama3.1-8b", ("a100-80gb", 128), 16384, 32, "bf16-mixed", "adamw", True),
]


def _load(case):
    name, (gpu, gpus), seq, batch, prec, opt, flash = case
    model = loading.load_model(name)
    cluster = loading.cluster_for_gpus(gpu, gpus)
    return model, cluster, make_setup(seq, batch, 1e12, prec, opt), sweep.Constraints(flash_attention=flash)


def _check_step(cols: dict, i: int, est: steptime.StepEstimate, what) -> None:
    for name, value in est.model_dump().items():
        got = float(cols[name if name != "compute_efficiency" else "efficiency"][i])
        assert got == pytest.approx(value, rel=1e-12, abs=1e-15), (name, what)


def _check_row(cols: dict, i: int, model, cluster, setup, layout) -> None:
    """Row i of the sweep's columns against the one-layout references: memory to the byte
    (plan_memory), every step figure to 1e-12 (estimate_step)."""
    mem = plan.plan_memory(model, cluster, layout, setup)
    assert int(cols["gpu_peak_bytes"][i]) == max(s.total_bytes for s in mem.stages), layout
    assert int(cols["headroom_bytes"][i]) == mem.peak_stage.headroom_bytes, layout
    assert int(cols["node_cpu_bytes"][i]) == mem.node.cpu_bytes, layout
    assert int(cols["node_nvme_bytes"][i]) == mem.node.nvme_bytes, layout
    _check_step(cols, i, steptime.estimate_step(model, cluster, layout, setup), layout)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_shuffled_repeated_candidates_equal_the_one_row_references(case):
    """`sweep.evaluate` over a shuffled sample in which every row appears twice: each row to
    the byte against plan_memory and to 1e-12 against estimate_step."""
    model, cluster, setup, c = _load(case)
    cands = sweep.enumerate_candidates(model, cluster, setup, c)
    rng = np.random.default_rng(9)
    sample = rng.choice(len(cands), size=min(len(cands), 150), replace=False)
    order = rng.permutation(np.concatenate([sample, sample]))
    rows = cands.take(order)
    cols = sweep.evaluate(model, cluster, setup, rows, c)
    for i in range(0, len(order), 3):
        _check_row(cols, i, model, cluster, setup, sweep.layout_at(rows, i, c))
    # a row and its repeat are the same figures
    first = {int(j): k for k, j in enumerate(order)}
    for k, j in enumerate(order):
        for name in ("step_s", "gpu_peak_bytes", "dp_comm_exposed_s", "offload_s"):
            assert cols[name][k] == cols[name][first[int(j)]]


def _mixed_layouts(model, cands, c, n: int, seed: int):
    """n layouts drawn from the sweep's candidates with every recompute mode (every_k with
    k = 1..3) and, where the split is valid, uneven first / last stages."""
    rnd = random.Random(seed)
    out = []
    for i in rnd.sample(range(len(cands)), n):
        lay = sweep.layout_at(cands, i, c)
        update: dict = {"recompute": rnd.choice(("none", "selective", "full", "every_k")),
                        "recompute_every_k": rnd.choice((1, 2, 3))}
        if lay.pp >= 3 and rnd.random() < 0.5:
            base = model.num_layers // lay.pp
            first, last = max(base - 1, 1), base + 1
            try:
                layers_per_stage(model.num_layers, lay.pp, first, last)
                update |= {"first_stage_layers": first, "last_stage_layers": last}
            except PlanInputError:
                pass
        out.append(lay.model_copy(update=update))
    return out


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_step_columns_of_mixed_layouts_without_stage_rows(case):
    """`step_columns` on many layouts at once, the stage groups found by step_columns itself
    (no `stage_rows`), equals `estimate_step` of each layout alone."""
    model, cluster, setup, c = _load(case)
    cands = sweep.enumerate_candidates(model, cluster, setup, c)
    layouts = _mixed_layouts(model, cands, c, 80, seed=len(case[0]))
    shapes = [steptime.stage_layers_and_params(model, lay.tp, lay.pp, lay.first_stage_layers,
                                               lay.last_stage_layers, lay.ep) for lay in layouts]
    cols = steptime.step_columns(
        model, cluster, setup, LayoutColumns.from_layouts(layouts),
        np.array([s[0] for s in shapes]), np.array([s[1] for s in shapes]),
        flash_attention=c.flash_attention)
    for i, lay in enumerate(layouts):
        _check_step(cols, i, steptime.estimate_step(model, cluster, lay, setup), lay)


def test_matmul_efficiency_grouped_equals_every_row():
    """Per distinct (tp, micro_batch) and gathered, or on every row: the same efficiencies."""
    model, cluster, setup, _ = _load(CASES[0])
    rng = np.random.default_rng(2)
    tp = rng.choice([1, 2, 4, 8], size=500)
    b = rng.choice([1, 2, 4, 16], size=500)
    level = cluster.gpu.achieved_efficiency
    grouped = steptime.matmul_efficiency(model, cluster, setup, level, b, tp, True)
    each = steptime.block_matmul_efficiency(model, cluster, setup, level, b, tp, True)
    np.testing.assert_array_equal(grouped, each)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.lists(st.sampled_from([1, 2, 7, 300, 10**6, 2**40]),
                                     min_size=1, max_size=7), st.integers(0, 2**32 - 1))
def test_group_rows_equals_numpy_unique(n, ranges, seed):
    """Narrow, wide and very wide key columns: np.unique(axis=0)'s rows and inverse."""
    rng = np.random.default_rng(seed)
    keys = [rng.integers(0, r, size=n) for r in ranges]
    uniq, inverse = group_rows(*keys)
    want, want_inverse = np.unique(np.stack(keys, axis=1), axis=0, return_inverse=True)
    np.testing.assert_array_equal(uniq, want)
    np.testing.assert_array_equal(inverse, want_inverse.reshape(-1))


def test_on_distinct_and_piecewise_equal_the_direct_evaluation():
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 5, 1000), rng.integers(0, 3, 1000)
    x = rng.random(1000)
    got = on_distinct(lambda rows: {"f": a[rows] * 10.0 + b[rows], "k": 2.0}, a, b)
    np.testing.assert_array_equal(got["f"], a * 10.0 + b)
    np.testing.assert_array_equal(got["k"], np.full(1000, 2.0))
    one, two = piecewise(x.shape, 2, [(a == 0, lambda rows: (x[rows] * 2, x[rows] + 1)),
                                      (a == 3, lambda rows: (x[rows] * 3, 7.0))])
    np.testing.assert_array_equal(one, np.where(a == 0, x * 2, np.where(a == 3, x * 3, 0.0)))
    np.testing.assert_array_equal(two, np.where(a == 0, x + 1, np.where(a == 3, 7.0, 0.0)))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_evaluation_by_enumeration_groups_equals_the_one_row_references(case):
    """`sweep.evaluate` with the enumeration's group key (`enumerate_product`: candidates that
    differ only in ZeRO / offload / engine share it, and their activations and compute terms
    are evaluated once) on every candidate of a dozen groups, shuffled: each row to the byte
    against plan_memory and to 1e-12 against estimate_step."""
    model, cluster, setup, c = _load(case)
    cands, _, key = sweep.enumerate_product(model, cluster, setup, c)
    rng = np.random.default_rng(11)
    chosen = rng.choice(np.unique(key), size=min(12, len(np.unique(key))), replace=False)
    order = rng.permutation(np.flatnonzero(np.isin(key, chosen)))
    assert len(order) > len(chosen)  # groups of several candidates
    rows = cands.take(order)
    cols = sweep.evaluate(model, cluster, setup, rows, c, activity_key=key[order])
    for i in range(0, len(order), max(1, len(order) // 40)):
        _check_row(cols, i, model, cluster, setup, sweep.layout_at(rows, i, c))


STATE_VARIANTS = [dict(zero_stage=0), dict(zero_stage=1, offload_optimizer="cpu"),
                  dict(zero_stage=2, dp_engine="fsdp2"),
                  dict(zero_stage=3, offload_optimizer="cpu", offload_params="cpu"),
                  dict(zero_stage=3, dp_engine="fsdp2"), dict(zero_stage=3)]
"""ZeRO / offload / engine settings given to one layout (those the activity groups ignore)."""


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_step_columns_by_activity_groups_equals_estimate_step(case):
    """`step_columns` with `activity` (its compute terms once per group of rows that differ only
    in ZeRO / offload / engine, groups found by `columns.activity_groups` from the columns) on
    mixed layouts, each in several state variants, shuffled: each row equals `estimate_step`."""
    from pydantic import ValidationError

    from planner.core.columns import activity_groups
    from planner.core.spec import Layout

    model, cluster, setup, c = _load(case)
    cands = sweep.enumerate_candidates(model, cluster, setup, c)
    layouts = []
    for lay in _mixed_layouts(model, cands, c, 25, seed=3 + len(case[0])):
        for update in STATE_VARIANTS:
            fields = lay.model_dump() | {"offload_optimizer": "none", "offload_params": "none",
                                         "dp_engine": "deepspeed"} | update
            if fields["ep"] > 1 and fields["dp_engine"] == "fsdp2":
                continue
            try:
                layouts.append(Layout(**fields))
            except (ValidationError, PlanInputError):
                continue
    random.Random(5).shuffle(layouts)
    shapes = [steptime.stage_layers_and_params(model, lay.tp, lay.pp, lay.first_stage_layers,
                                               lay.last_stage_layers, lay.ep) for lay in layouts]
    cols = LayoutColumns.from_layouts(layouts)
    groups = activity_groups(cols)
    assert len(groups[0]) < len(layouts)  # layouts share groups
    out = steptime.step_columns(
        model, cluster, setup, cols, np.array([s[0] for s in shapes]),
        np.array([s[1] for s in shapes]), flash_attention=c.flash_attention, activity=groups)
    for i, lay in enumerate(layouts):
        _check_step(out, i, steptime.estimate_step(model, cluster, lay, setup), lay)


@pytest.mark.parametrize("overlap", [("tp_comm", "grad_reduce", "param_gather"), ("grad_reduce",),
                                     ()])
def test_megatron_overlap_pinned_sweep_rows_equal_estimate_step(overlap):
    """Megatron's overlaps pinned on a sweep (the TP term in the grouped compute terms, the
    bucket terms in the grouped data-parallel collectives) with the pins `sweep_pins` narrows
    to, evaluated by enumeration groups: each sampled row equals `estimate_step` of its layout
    alone (which carries the same `megatron_overlap`)."""
    from planner.timing.megatron_overlap import sweep_pins

    model, cluster, setup, c = _load(CASES[0])
    zero, engine, sp = sweep_pins(overlap, None, None, None)
    c = c.model_copy(update=dict(megatron_overlap=overlap, zero_stage=zero, dp_engine=engine,
                                 sequence_parallel=sp))
    cands, _, key = sweep.enumerate_product(model, cluster, setup, c)
    rng = np.random.default_rng(13)
    order = rng.permutation(len(cands))[:160]
    rows = cands.take(order)
    cols = sweep.evaluate(model, cluster, setup, rows, c, activity_key=key[order])
    for i in range(0, len(order), 4):
        layout = sweep.layout_at(rows, i, c)
        assert layout.megatron_overlap == overlap
        _check_step(cols, i, steptime.estimate_step(model, cluster, layout, setup), layout)


SPLIT_CASES = [
    # (model, gpu, GPUs, seq_len, global batch, constraints, fields the space must vary):
    # long sequences with context parallelism and HSDP shard groups; MoE with expert
    # parallelism; block depths searched
    ("llama3.1-8b", "a100-80gb", 128, 16384, 32, {}, ("cp", "dp", "dp_shard", "dp_engine")),
    ("mixtral-8x7b", "h100-sxm", 64, 32768, 64, {}, ("cp", "dp", "ep", "zero_stage")),
    ("gpt3-13b", "a100-80gb", 64, 2048, 512, {"recompute": ("block", "none"),
                                               "recompute_num_layers": "auto"},
     ("recompute", "recompute_num_layers")),
]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_every_grouping_key_reads_what_its_function_reads(case):
    """The grouped evaluation gives a row the figures of its group's representative, so a key
    that leaves out a field its function reads gives a row another row's figures. Split the
    whole space on any one field and evaluate each part alone: rows that differed in that field
    can no longer share a group, so every output must equal the whole evaluation's, bit for bit.
    (Session 23's HSDP x cp bug — states grouped by dp_shard, not by dp_shard x cp — fails
    this on the first two spaces through the dp, cp, micro_batch and grad_accum splits.)"""
    name, gpu, gpus, seq, batch, kw, varied = case
    model = loading.load_model(name)
    cluster = loading.cluster_for_gpus(gpu, gpus)
    setup = make_setup(seq, batch, 1e12)
    c = sweep.Constraints(**kw)
    cands, _, key = sweep.enumerate_product(model, cluster, setup, c)
    whole = sweep.evaluate(model, cluster, setup, cands, c, activity_key=key)
    split_fields = [f for f in cands if len(np.unique(cands[f])) > 1]
    assert set(varied) <= set(split_fields)
    for field in split_fields:
        for value in np.unique(cands[field]):
            rows = np.flatnonzero(cands[field] == value)
            part = sweep.evaluate(model, cluster, setup, cands.take(rows), c, activity_key=key[rows])
            for out in whole:
                assert np.array_equal(np.asarray(whole[out])[rows], np.asarray(part[out])), \
                    (field, int(value), out)
