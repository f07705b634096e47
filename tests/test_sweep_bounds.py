"""The sweep times the state-dependent step terms only where the ranking needs them
(`sweep.StepTimes`, `steptime.step_bounds`): its bounds hold on every candidate, and its answer
is the one of a sweep that times every candidate."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.spec import NodeSpec
from planner.io import loading
from planner.io.jobfile import make_setup
from planner.search import sweep
from planner.timing import steptime


def _calibrated(cluster, **keys):
    """The cluster with calibrated node keys (a host overhead term > 0 on every row)."""
    data = cluster.node.model_dump()
    node = NodeSpec.model_validate(data | keys | {"sources": data["sources"] | {k: "test" for k in keys}})
    return cluster.model_copy(update={"node": node})


# (model, gpu, GPUs, seq, global batch, setup keywords, constraint keywords)
SPACES = [
    ("gpt3-13b", "a100-80gb", 64, 2048, 512, {}, {}),
    ("llama2-7b", "a100-80gb", 128, 2048, 512, {}, {"dp_shard": (8, 16, 0)}),  # HSDP, FSDP2
    ("mixtral-8x7b", "a100-80gb", 64, 4096, 256, {"precision": "zero-infinity-fp16"}, {}),
    ("llama2-7b", "h100-sxm", 64, 4096, 256, {"precision": "te-fp8"}, {}),
    ("llama3.1-8b", "h100-sxm", 64, 32768, 64, {}, {}),  # context parallel ranks first
    ("gpt3-6.7b", "a100-80gb", 64, 2048, 256, {},
     {"megatron_overlap": ("grad_reduce", "param_gather"), "zero_stage": (1,),
      "dp_engine": ("deepspeed",)}),
]
IDS = ["gpt3-13b", "hsdp", "zero-infinity", "te-fp8", "long-context", "megatron-overlap"]


def _space(case, calibrated=False):
    name, gpu, gpus, seq, batch, skw, ckw = case
    cluster = loading.cluster_for_gpus(gpu, gpus)
    if calibrated:
        cluster = _calibrated(cluster, dispatch_per_op_us=6.0, fsdp2_hook_us=250.0)
    return (loading.load_model(name), cluster, make_setup(seq, batch, 300e9, **skw),
            sweep.Constraints(**ckw))


@pytest.fixture(scope="module", params=[(c, False) for c in SPACES] + [(SPACES[1], True)],
                ids=IDS + ["hsdp-calibrated-host"])
def space(request):
    model, cluster, setup, c = _space(*request.param)
    cands, _, key = sweep.enumerate_product(model, cluster, setup, c)
    full = sweep.evaluate(model, cluster, setup, cands, c, activity_key=key)
    cols, times = sweep.memory_all(model, cluster, setup, cands, c, activity_key=key)
    return model, cluster, setup, c, cands, full, cols, times


def test_no_candidate_undercuts_its_groups_bound(space):
    """Step time >= bound; tokens/s, MFU at most theirs; GPU-hours at least theirs."""
    *_, full, _, times = space
    assert (times.bound("step_s") <= full["step_s"]).all()
    assert (times.bound("tokens_per_s") >= full["tokens_per_s"]).all()
    assert (times.bound("mfu") >= full["mfu"]).all()
    assert (times.bound("gpu_hours") <= full["gpu_hours"]).all()


def test_the_bound_is_the_step_without_its_state_terms(space):
    """By hand from the full columns: step_s less the six state terms, less the margin."""
    *_, full, _, times = space
    state = sum(full[name] for name in steptime.STATE_TERMS if name != "dp_comm_s")
    expected = (full["step_s"] - state) * (1 - steptime.BOUND_MARGIN)
    assert times.bound("step_s") == pytest.approx(expected, rel=1e-9)


def test_the_timed_rows_hold_the_full_evaluations_values_byte_for_byte(space):
    model, cluster, setup, c, cands, full, cols, times = space
    cols = cols | {"opt": cands["offload_optimizer"], "par": cands["offload_params"]}
    ok = sweep.fit_masks(cols, cluster)
    fits = ok[0] & ok[1] & ok[2]
    times.rank(cols, [(np.nonzero(fits)[0], "step-time", 90), (np.nonzero(~fits)[0], "mfu", 5)])
    kept = np.flatnonzero(times.kept)
    assert len(kept) and times.timed[kept].all()
    for name, column in times.cols.items():
        assert np.array_equal(column[kept], full[name][kept]), name


def _loose(g):
    """A bound that rules nothing out (1 ns): every candidate is timed."""
    step = np.full(np.shape(g.terms["compute_s"]), 1e-9)
    return {"step_s": step} | steptime.rate_terms(g.rates, step, g.tokens_per_step, g.model_flops,
                                                  g.hardware_flops, g.train_tokens)


@pytest.mark.parametrize("case", SPACES, ids=IDS)
def test_the_answer_is_the_one_of_timing_every_candidate(case, monkeypatch):
    model, cluster, setup, c = _space(case)
    answers = {}
    for label in ("bounded", "every candidate timed"):
        if label != "bounded":
            monkeypatch.setattr(steptime, "step_bounds", _loose)
        answers[label] = [sweep.sweep(model, cluster, setup, c, sort=sort, top=10, rejected=5)
                          .model_dump(exclude={"seconds"}) for sort in sweep.SORT_KEYS]
    timed = {label: [a.pop("timed") for a in answers[label]] for label in answers}
    assert answers["bounded"] == answers["every candidate timed"]
    assert any(a["top"] for a in answers["bounded"])
    for sort, bounded, loose, answer in zip(sweep.SORT_KEYS, timed["bounded"],
                                            timed["every candidate timed"], answers["bounded"]):
        assert 0 < bounded <= loose <= answer["evaluated"]
        if sort != "memory-headroom":  # the step time's keys: the loose bound times them all
            assert loose == answer["evaluated"]


@pytest.mark.parametrize("case", SPACES[:2], ids=IDS[:2])
def test_chunked_evaluation_gives_the_same_answer(case, monkeypatch):
    """Spaces larger than `sweep.CHUNK` are evaluated chunk by chunk (their activity groups and
    bounds per chunk, `StepTimes` over all): the same answer as one chunk, and progress is
    reported after each chunk."""
    model, cluster, setup, c = _space(case)
    whole = sweep.sweep(model, cluster, setup, c, top=10, rejected=5).model_dump(exclude={"seconds"})
    monkeypatch.setattr(sweep, "CHUNK", 3000)
    reports = []
    chunked = sweep.sweep(model, cluster, setup, c, top=10, rejected=5,
                          progress=lambda done, total: reports.append((done, total)))
    assert len(reports) == -(-whole["evaluated"] // 3000) >= 3
    assert reports[-1] == (whole["evaluated"], whole["evaluated"])
    assert chunked.model_dump(exclude={"seconds"}) == whole


@pytest.mark.parametrize("case", SPACES[:2], ids=IDS[:2])
def test_the_answer_does_not_depend_on_the_first_margin(case, monkeypatch):
    """`StepTimes.rank` first times the candidates within `FIRST_MARGIN` of the limit-th best
    bound, then, only where the limit-th best exact key lies beyond, the candidates up to that
    key: with no margin (a second evaluation for each space here), the default and a margin
    that takes in every candidate (one evaluation), the answer is the one of timing them all."""
    model, cluster, setup, c = _space(case)
    monkeypatch.setattr(steptime, "step_bounds", _loose)
    expected = [sweep.sweep(model, cluster, setup, c, sort=sort, top=10, rejected=5)
                .model_dump(exclude={"seconds", "timed"}) for sort in ("step-time", "mfu")]
    monkeypatch.undo()
    evaluations = []
    original = sweep.StepTimes.evaluate

    def counted(self, idx):
        evaluations.append(len(idx))
        return original(self, idx)

    monkeypatch.setattr(sweep.StepTimes, "evaluate", counted)
    for margin in (0.0, sweep.FIRST_MARGIN, 1e6):
        monkeypatch.setattr(sweep, "FIRST_MARGIN", margin)
        for sort, answer in zip(("step-time", "mfu"), expected):
            evaluations.clear()
            result = sweep.sweep(model, cluster, setup, c, sort=sort, top=10, rejected=5)
            assert result.model_dump(exclude={"seconds", "timed"}) == answer
            assert sum(evaluations) == result.timed  # no candidate timed twice
            if margin == 0.0:
                assert len(evaluations) == 2
            if margin == 1e6:
                assert len(evaluations) == 1


@pytest.mark.parametrize("margin", [0.0, 0.1])
def test_every_candidate_that_could_rank_is_timed(space, margin, monkeypatch):
    """The invariant behind the answer: after `StepTimes.rank`, every candidate whose bound is
    at most the limit-th best exact key of its query (from the full evaluation, `evaluate`) has
    been timed; any one left out could have ranked."""
    model, cluster, setup, c, cands, full, cols, _ = space
    monkeypatch.setattr(sweep, "FIRST_MARGIN", margin)
    cols, times = sweep.memory_all(model, cluster, setup, cands, c,
                                   activity_key=sweep.enumerate_product(model, cluster, setup, c)[2])
    cols |= {"opt": cands["offload_optimizer"], "par": cands["offload_params"]}
    ok = sweep.fit_masks(cols, cluster)
    fits = ok[0] & ok[1] & ok[2]
    queries = [(np.nonzero(fits)[0], "step-time", 90), (np.nonzero(~fits)[0], "step-time", 5)]
    times.rank(cols, queries)
    bound = times.bound("step_s")
    for idx, _, limit in queries:
        if len(idx) <= limit:
            assert times.timed[idx].all()
            continue
        true_cut = np.partition(full["step_s"][idx], limit - 1)[limit - 1]
        could = idx[bound[idx] <= true_cut]
        assert len(could) >= limit and times.timed[could].all()
