"""The sweep's `--recompute-num-layers auto` (issue 10, "recompute just enough"): block recompute
searched at every depth n, and each layout shown at its least n that fits.

Megatron-LM `--recompute-method block --recompute-num-layers n` recomputes the first n blocks of
each model chunk (megatron/core/recompute.py, commit d98e8a64); NeMo / Megatron users lower n by
hand until the job fits, since every block not recomputed saves its forward. The search relies
on two monotonicity claims, tested here over random layouts: every stage's memory is
non-increasing and, without CPU offload, the step time non-decreasing in n (with offload the
model's exposed PCIe time can shrink by more than the recompute adds: measured below).

Hand numbers (tests/test_block_recompute.py derives them): one GPT-3-style block at t = 1, fp16,
without flash attention keeps 34sbh + 5as²b + 16sb bytes (Korthikanti et al. 2022 §4.1 plus the
LayerNorms' fp32 mean and rstd); a recomputed block keeps its 2sbh input (Korthikanti §5). So
each extra recomputed block lowers the chunk's activations by the difference.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from planner.core import rules
from planner.core.columns import RECOMPUTE_MODES, LayoutColumns
from planner.core.spec import Layout
from planner.io import loading
from planner.io.jobfile import make_setup
from planner.memory.plan import plan_memory
from planner.search import sweep
from planner.timing import steptime

from test_properties import SETTINGS, _job_file, jobs

BLOCK, NONE, FULL = (RECOMPUTE_MODES.index(m) for m in ("block", "none", "full"))

# GPT-3 1.3B (Brown et al. 2020 Table 2.1: 24 layers, d_model 2048; 16 heads of 128, the preset's
# note), s = 2048, b = 1, fp16, no flash attention
S, H, A, LAYERS = 2048, 2048, 16, 24
KEPT_BLOCK = 34 * S * H + 5 * A * S * S + 16 * S  # 142,606,336 + 335,544,320 + 32,768 = 478,183,424 B
RECOMPUTED_BLOCK = 2 * S * H  # 2 x 4,194,304 = 8,388,608 B
STEP_BYTES = KEPT_BLOCK - RECOMPUTED_BLOCK  # = 469,794,816 B less per extra recomputed block


def _pinned(flash: bool = False, **pins) -> sweep.Constraints:
    """One layout of GPT-3 1.3B on 8 V100 16 GB (tp = pp = 1, dp = 8, ZeRO-1, micro-batch 1, no
    offload, no sequence parallelism) under every recompute mode, block at every depth."""
    return sweep.Constraints(tp=(1,), pp=(1,), dp=(8,), zero_stage=(1,), micro_batch=(1,),
                             offload_optimizer=("none",), offload_params=("none",), cp=(1,),
                             dp_engine=("deepspeed",), sequence_parallel=(False,),
                             recompute=("none", "selective", "full", "block"),
                             recompute_num_layers="auto", flash_attention=flash, dp_shard=(0,), **pins)


def _gpt13():
    model = loading.load_model("gpt3-1.3b")
    cluster = loading.cluster_for_gpus("v100-16gb", 8)
    setup = make_setup(S, 64, 1e12, "megatron-fp16", "adam")
    return model, cluster, setup


def test_hand_counts():
    assert KEPT_BLOCK == 478_183_424 and RECOMPUTED_BLOCK == 8_388_608 and STEP_BYTES == 469_794_816


def test_each_extra_recomputed_block_saves_the_hand_difference():
    """The peak falls by exactly 34sbh + 5as² + 16s - 2sbh per extra recomputed block (the peak
    stays in the same place from n = 1 on)."""
    model, cluster, setup = _gpt13()
    peaks = [max(s.total_bytes for s in plan_memory(model, cluster, Layout(
        dp=8, zero_stage=1, grad_accum=8, flash_attention=False, recompute="block",
        recompute_num_layers=n), setup).stages) for n in (1, 2, 3, 12, 13)]
    assert [a - b for a, b in zip(peaks, peaks[1:])] == [STEP_BYTES, STEP_BYTES, 9 * STEP_BYTES, STEP_BYTES]


def test_enumeration_adds_every_depth_below_the_chunk():
    """pp = 1, v = 1: one chunk of 24 blocks; full is searched, so n = 1 .. 23 (n = 24 is full)."""
    model, cluster, setup = _gpt13()
    cands = sweep.enumerate_candidates(model, cluster, setup, _pinned())
    block = cands["recompute"] == BLOCK
    assert sorted(cands["recompute_num_layers"][block].tolist()) == list(range(1, 24))
    assert set(cands["recompute_num_layers"][~block].tolist()) == {0}
    without_full = sweep.enumerate_candidates(model, cluster, setup,
                                              _pinned().model_copy(update={"recompute": ("block",)}))
    assert sorted(without_full["recompute_num_layers"].tolist()) == list(range(1, 25))


def test_depths_follow_each_chunk():
    """pp = 4 of 24 layers: 6 blocks per stage; v = 2: chunks of 3 -> n = 1, 2 (3 is full)."""
    model = loading.load_model("gpt3-1.3b")
    cluster = loading.cluster_for_gpus("a100-80gb", 32)
    setup = make_setup(S, 64, 1e12)
    c = sweep.Constraints(tp=(1,), pp=(4,), dp=(8,), zero_stage=(1,), micro_batch=(1,), cp=(1,),
                          recompute=("full", "block"), recompute_num_layers="auto", dp_shard=(0,))
    cands = sweep.enumerate_candidates(model, cluster, setup, c)
    block = cands["recompute"] == BLOCK
    for v, depths in ((1, {1, 2, 3, 4, 5}), (2, {1, 2}), (3, {1})):
        at = block & (cands["virtual_stages"] == v)
        assert set(cands["recompute_num_layers"][at].tolist()) == depths, v
    assert not (block & (cands["virtual_stages"] == 6)).any()  # chunks of one block: only full


def test_sweep_shows_the_least_depth_that_fits():
    """On 16 GB V100s no recompute does not fit, full does, and the sweep shows block:k (once)
    with k the least depth the one-layout path (`plan_memory`) fits: k - 1 does not fit. It is
    faster than full (fewer recomputed blocks). (Selective, which drops the attention core's
    s x s tensors, also fits here and is faster still.)"""
    model, cluster, setup = _gpt13()
    result = sweep.sweep(model, cluster, setup, _pinned(), top=10, rejected=10)

    def plan(**rec):
        lay = Layout(dp=8, zero_stage=1, grad_accum=8, flash_attention=False, **rec)
        return plan_memory(model, cluster, lay, setup), steptime.estimate_step(model, cluster, lay, setup)

    assert not plan()[0].fits and plan(recompute="full")[0].fits
    k = next(n for n in range(1, LAYERS) if plan(recompute="block", recompute_num_layers=n)[0].fits)
    assert 1 < k < LAYERS - 1
    assert not plan(recompute="block", recompute_num_layers=k - 1)[0].fits
    blocks = [r for r in result.top if r.layout.recompute == "block"]
    assert [r.layout.recompute_num_layers for r in blocks] == [k]
    full = next(r for r in result.top if r.layout.recompute == "full")
    assert blocks[0].estimate.step_s < full.estimate.step_s
    assert blocks[0].estimate.step_s == pytest.approx(
        plan(recompute="block", recompute_num_layers=k)[1].step_s, rel=1e-12)
    # the rejected rows name no depth of a layout that fits at another depth
    assert all(r.layout.recompute != "block" for r in result.rejected)
    assert result.evaluated == 3 + 23


def test_least_fitting_depths_by_hand():
    """Four layouts (two columns differ): A fits from n = 2, B fits at no n, C's none row fits
    (its block rows are not shown: none is at least as fast), D is not block."""
    tp = np.array([1, 1, 1, 2, 2, 2, 4, 4, 4, 8])
    rec = np.array([BLOCK] * 6 + [BLOCK, BLOCK, NONE, NONE])
    depth = np.array([1, 2, 3, 1, 2, 3, 1, 2, 0, 0])
    fits = np.array([False, True, True, False, False, False, True, True, True, True])
    cands = LayoutColumns(dict(tp=tp, recompute=rec, recompute_num_layers=depth))
    shown = sweep.least_fitting_depths(cands, fits)
    assert shown.tolist() == [False, True, False, False, False, True, False, False, True, True]


@SETTINGS
@given(jobs(), st.data())
def test_memory_never_rises_and_step_time_never_falls_with_depth(job, data):
    """The claims the search rests on, over random layouts the rule table accepts: one more
    block recomputed per chunk never raises any stage's memory and never shortens the step."""
    model, cluster, layout, setup = job
    cols = LayoutColumns({k: np.array([getattr(layout, k)]) for k in ("pp", "virtual_stages")})
    largest = int(rules.largest_chunk_layers(model.num_layers, cols)[0])
    assume(largest >= 2)
    n = data.draw(st.integers(1, largest - 1))
    fewer = layout.model_copy(update={"recompute": "block", "recompute_num_layers": n})
    more = layout.model_copy(update={"recompute": "block", "recompute_num_layers": n + 1})
    low, high = (plan_memory(model, cluster, lay, setup) for lay in (more, fewer))
    for a, b in zip(low.stages, high.stages):
        assert a.total_bytes <= b.total_bytes, (n, layout)
    if layout.offload_optimizer != "none" or layout.offload_params != "none":
        return  # the exception, tested below
    slower, faster = (steptime.estimate_step(model, cluster, lay, setup).step_s for lay in (more, fewer))
    assert slower >= faster * (1 - 1e-12), (n, layout)  # equal terms summed in another order: rounding


def test_offload_bound_steps_may_shorten_with_depth():
    """The exception to the step-time claim, found by the property test above: with the
    optimizer and parameters offloaded to the CPU, the exposed PCIe time is the transfer less the
    compute it overlaps, and a recomputed block adds compute to that window, so the step may
    shorten as n grows. GPT-3 125M, one A100, ZeRO-3, offload cpu/cpu, s = 128, b = 1: the
    recompute term grows by one block's forward per n while the exposed offload shrinks by more
    (under 0.05 % of the step). The sweep still shows the least fitting n (the fewest recomputed
    blocks, what a Megatron user sets), not the model's marginally faster deeper one."""
    model, cluster = loading.load_model("gpt3-125m"), loading.cluster_for_gpus("a100-80gb", 1)
    setup = make_setup(128, 1, 1e12, "zero-fp16", "adam")
    steps = [steptime.estimate_step(model, cluster, Layout(
        zero_stage=3, offload_optimizer="cpu", offload_params="cpu", flash_attention=False,
        recompute="block", recompute_num_layers=n), setup) for n in (1, 2)]
    assert steps[1].recompute_s > steps[0].recompute_s and steps[1].offload_s < steps[0].offload_s
    assert steps[1].step_s < steps[0].step_s
    assert steps[0].step_s / steps[1].step_s - 1 < 5e-4


def test_best_block_layout_round_trips_through_fit_and_check(zplan, tmp_path: Path):
    """Llama 3 405B at 8k tokens on 128 A100 80 GB: with the depth searched the best layout
    recomputes a few blocks per stage (uneven stages); given back to fit as flags and to check
    as a job file, it has the sweep's peak bytes and fits."""
    name, gpu, gpus, seq, batch = "llama3-405b", "a100-80gb", 128, 8192, 128
    model, cluster = loading.load_model(name), loading.cluster_for_gpus(gpu, gpus)
    setup = make_setup(seq, batch, 1e12)
    c = sweep.Constraints(recompute=sweep.PINNABLE_RECOMPUTE, recompute_num_layers="auto", cp=(1,))
    best = sweep.sweep(model, cluster, setup, c, top=1).top[0]
    lay = best.layout
    assert lay.recompute == "block" and lay.recompute_num_layers >= 1
    flags = ["--tp", str(lay.tp), "--pp", str(lay.pp), "--dp", str(lay.dp), "--virtual-stages",
             str(lay.virtual_stages), "--zero", str(lay.zero_stage), "--offload-optimizer",
             lay.offload_optimizer, "--offload-params", lay.offload_params, "--recompute", "block",
             "--recompute-num-layers", str(lay.recompute_num_layers), "--micro-batch",
             str(lay.micro_batch), "--global-batch", str(batch), "--dp-engine", lay.dp_engine,
             "--sequence-parallel" if lay.sequence_parallel else "--no-sequence-parallel"]
    for flag, value in (("--first-stage-layers", lay.first_stage_layers),
                        ("--last-stage-layers", lay.last_stage_layers)):
        if value:
            flags += [flag, str(value)]
    fit = zplan("fit", "--model", name, "--gpu", gpu, "--gpus", str(gpus), "--seq-len", str(seq),
                "--tokens", "1e12", *flags, "--json")
    assert fit.returncode == 0, fit.stderr
    assert max(s["total_bytes"] for s in json.loads(fit.stdout)["memory"]["stages"]) == best.gpu_peak_bytes
    job = _job_file(tmp_path, name, gpu, gpus, lay, seq, batch, precision="bf16-mixed")
    check = zplan("check", str(job), "--json")
    assert check.returncode == 0, check.stderr
    assert max(s["total_bytes"] for s in json.loads(check.stdout)["stages"]) == best.gpu_peak_bytes


def test_cli_auto_adds_block_to_the_default_modes(zplan):
    result = zplan("sweep", "--model", "gpt3-1.3b", "--gpu", "v100-16gb", "--gpus", "8",
                   "--seq-len", "2048", "--global-batch", "64", "--precision", "megatron-fp16",
                   "--tp", "1", "--pp", "1", "--zero", "1", "--micro-batch", "1", "--no-offload",
                   "--no-flash-attention", "--dp-engine", "deepspeed", "--dp-shard", "none",
                   "--recompute-num-layers", "auto", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    runs = doc if isinstance(doc, list) else doc.get("results", [doc])
    labels = {(r["layout"]["recompute"], r["layout"]["recompute_num_layers"]) for r in runs[0]["top"]}
    assert any(mode == "block" and n for mode, n in labels), labels
    # none, selective, full and block n = 1..23; cp > 1 needs flash attention, sp needs tp > 1
    assert runs[0]["evaluated"] == 3 + 23


@pytest.mark.parametrize(("args", "field"), [
    (["sweep", "--recompute-num-layers", "many"], "--recompute-num-layers: 'many'; allowed: auto or a positive integer"),
    (["sweep", "--recompute-num-layers", "0"], "--recompute-num-layers: '0'; allowed"),
    (["sweep", "--recompute", "none,full", "--recompute-num-layers", "auto"],
     "--recompute-num-layers auto is for --recompute block"),
    (["fit", "--recompute", "block", "--recompute-num-layers", "auto"], "--recompute-num-layers"),
])
def test_bad_depth_exits_2_with_one_line(zplan, args, field):
    result = zplan(*args, "--model", "gpt3-13b", "--gpu", "a100-80gb", "--gpus", "32", "--tp", "8",
                   "--pp", "4", "--global-batch", "64")
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert field in lines[0], lines[0]


def test_best_megatron_block_layout_round_trips_through_megatron_flags(zplan, tmp_path: Path):
    """Pinned to what Megatron-LM runs (ZeRO-1 = distributed optimizer, no offload), Llama 3 405B
    at 8k tokens on 128 A100 80 GB: the best layout recomputes some blocks per chunk; exported as
    a Megatron launch line (`--recompute-method block --recompute-num-layers n`) and read back by
    `check --megatron-args`, it has the job file's memory, layout and verdict."""
    name, gpu, gpus, seq, batch = "llama3-405b", "a100-80gb", 128, 8192, 128
    model, cluster = loading.load_model(name), loading.cluster_for_gpus(gpu, gpus)
    setup = make_setup(seq, batch, 1e12)
    c = sweep.Constraints(recompute=sweep.PINNABLE_RECOMPUTE, recompute_num_layers="auto", cp=(1,),
                          zero_stage=(1,), offload_optimizer=("none",), offload_params=("none",),
                          dp_engine=("deepspeed",))
    best = sweep.sweep(model, cluster, setup, c, top=1).top[0]
    assert best.layout.recompute == "block"
    job = _job_file(tmp_path, name, gpu, gpus, best.layout, seq, batch)
    out = tmp_path / "launch.sh"
    exported = zplan("export", "--format", "megatron", "--job", str(job), "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    text = out.read_text()
    assert "--recompute-method block" in text
    assert f"--recompute-num-layers {best.layout.recompute_num_layers}" in text
    direct = zplan("check", str(job), "--json")
    via = zplan("check", "--megatron-args", str(out), "--cluster", "dgx-a100x128", "--json")
    assert direct.returncode == via.returncode == 0, (direct.stderr, via.stderr)
    d, v = json.loads(direct.stdout), json.loads(via.stdout)
    assert max(s["total_bytes"] for s in d["stages"]) == best.gpu_peak_bytes
    assert v["stages"] == d["stages"] and v["layout"] == d["layout"]
