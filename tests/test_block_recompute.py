"""Partial recompute, `recompute: block` (issue 10): Megatron-LM `--recompute-method block
--recompute-num-layers n` recomputes the first n blocks of each model chunk and keeps every
activation of the others (megatron/core/recompute.py `checkpointed_forward`, method "block",
commit d98e8a64); fms-fsdp's and torchtitan's every-k-th-block AC is the same with n = L // k.

Hand numbers: one GPT-3 block at t = 1, fp16, without flash attention keeps
34sbh + 5as²b bytes (Korthikanti et al. 2022 §4.1, seed 004 §2.2.3) plus the two LayerNorms'
fp32 mean and rstd, 16 bytes per token; a recomputed block keeps its 2sbh input (Korthikanti §5).
Its forward costs 24Bsh² + 4Bs²h FLOPs (seed 004 §1.2.3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from planner.core import flops, rules
from planner.core.columns import RECOMPUTE_MODES, LayoutColumns
from planner.core.errors import PlanInputError
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout, ModelSpec, TrainSetup
from planner.io import loading
from planner.io.megatron import job_from_megatron, megatron_flags, parse_megatron_args
from planner.memory import activations as act
from planner.memory import plan
from planner.search import sweep
from planner.timing import steptime

GPT3 = ModelSpec(  # Brown et al. 2020 Table 2.1: 96 layers, d_model 12288, 96 heads, f = 4h
    name="gpt3-175b", num_layers=96, hidden_size=12288, num_heads=96, ffn_hidden_size=49152,
    vocab_size=50257, max_seq_len=2048,
)
S, H, A = 2048, 12288, 96
SBH = S * H  # b = 1
INVENTORY = 34 * SBH + 5 * A * S * S + 16 * S  # one block keeps everything (fp16, b = 1)
INPUT = 2 * SBH  # one recomputed block keeps its input


def block(n: int, **layout) -> Layout:
    return Layout(flash_attention=False, recompute="block", recompute_num_layers=n, **layout)


def _setup(batch: int = 8, precision: str = "megatron-fp16") -> TrainSetup:
    return TrainSetup(seq_len=S, global_batch=batch, train_tokens=1e9,
                      precision=get_precision(precision), optimizer=get_optimizer("adam"))


# --------------------------------------------------------------------------- memory


def test_inventory_is_the_hand_count():
    assert sum(act.layer_saved_bytes(GPT3, Layout(flash_attention=False), S, 1, 2).values()) == INVENTORY


def test_a_chunk_keeps_n_inputs_and_the_rest_whole():
    # 10 blocks, the first 3 recomputed: 3 x 2sbh + 7 x (34sbh + 5as² + 16s)
    assert act.layers_kept_bytes(GPT3, block(3), S, 1, 2, 10) == 3 * INPUT + 7 * INVENTORY
    # n of the chunk's 10 = full recompute; n of 0 does not exist (rule, Field gt=0)
    assert act.layers_kept_bytes(GPT3, block(10), S, 1, 2, 10) == 10 * INPUT
    # a chunk smaller than n recomputes all its blocks (Megatron: layer_idx < n over the chunk)
    assert act.layers_kept_bytes(GPT3, block(12), S, 1, 2, 10) == 10 * INPUT
    # the working set during backward: one recomputed block's whole inventory
    assert act.recompute_working_bytes(GPT3, block(3), S, 1, 2, 10) == INVENTORY


def test_uneven_stages_apply_n_per_stage():
    """pp = 4 with 12 blocks on the first and last stage, 36 on each middle one (96 = 12 + 2 x 36
    + 12), n = 20, m = 8 micro-batches, 1F1B: stage i holds min(4 - i + 1, 8) micro-batches."""
    layout = block(20, pp=4, dp=1, first_stage_layers=12, last_stage_layers=12, grad_accum=8)
    stages = act.stage_activations(GPT3, layout, _setup(), [12, 36, 36, 12])
    first_extras = SBH * 1 + 8 * S  # embedding dropout mask (1 byte) + int64 token ids
    assert stages[0].total_bytes == 4 * (12 * INPUT + first_extras) + INVENTORY  # all 12 recomputed
    assert stages[1].total_bytes == 3 * (20 * INPUT + 16 * INVENTORY) + INVENTORY
    assert stages[2].total_bytes == 2 * (20 * INPUT + 16 * INVENTORY) + INVENTORY


def test_interleaved_chunks_each_recompute_n():
    """v = 2 chunks of 12 blocks per stage (96 / (4 x 2)), n = 5 in each chunk."""
    layout = block(5, pp=4, dp=1, virtual_stages=2, grad_accum=8)
    stages = act.stage_activations(GPT3, layout, _setup(), [24] * 4)
    assert stages[1].per_microbatch_bytes == 2 * (5 * INPUT + 7 * INVENTORY)


# --------------------------------------------------------------------------- FLOPs and time


@pytest.mark.parametrize(("layout", "recomputed"), [
    (dict(pp=4), 4 * 10),                                             # 10 of each stage's 24
    (dict(pp=4, virtual_stages=2, n=5), 4 * 2 * 5),                   # 5 of each chunk of 12
    (dict(pp=4, first_stage_layers=12, last_stage_layers=12, n=20), 12 + 20 + 20 + 12),
    (dict(pp=1, n=48), 48),                                          # every 2nd of 96: fms k = 2
])
def test_recompute_flops_are_the_forward_of_the_recomputed_blocks(layout, recomputed):
    layout = dict(layout)
    n = layout.pop("n", 10)
    B = 8
    per_block = 24 * B * S * H**2 + 4 * B * S**2 * H
    got = flops.step_flops(GPT3, _setup(B), block(n, **layout)).recompute_flops
    assert got == pytest.approx(recomputed * per_block, rel=1e-12)


def test_step_time_recompute_is_the_share_of_full():
    """recompute_s is the recompute FLOPs at the matmul rate: 40 of 96 blocks -> 40/96 of full
    recompute's (flash off: no other recompute work)."""
    cluster = loading.cluster_for_gpus("a100-80gb", 32)
    setup = _setup(64)
    common = dict(tp=8, pp=4, dp=1, grad_accum=64, flash_attention=False)
    full = steptime.estimate_step(GPT3, cluster, Layout(recompute="full", **common), setup)
    part = steptime.estimate_step(GPT3, cluster, Layout(recompute="block", recompute_num_layers=10,
                                                        **common), setup)
    none = steptime.estimate_step(GPT3, cluster, Layout(**common), setup)
    assert none.recompute_s == 0
    assert part.recompute_s == pytest.approx(40 / 96 * full.recompute_s, rel=1e-12)
    assert none.step_s < part.step_s < full.step_s


# --------------------------------------------------------------------------- the rule


def test_rule_mask_and_message():
    """n must not exceed the largest chunk: 96 / 4 = 24 blocks per stage, 12 per chunk at v = 2."""
    ctx = rules.Context(GPT3, seq_len_tokens=S)
    code = RECOMPUTE_MODES.index("block")
    cols = LayoutColumns(dict(pp=np.array([4, 4, 4, 4, 4]), virtual_stages=np.array([1, 1, 2, 2, 1]),
                              recompute=np.array([code, code, code, code, 0]),
                              recompute_num_layers=np.array([24, 25, 12, 13, 0])))
    ok, _ = rules.mask(ctx, cols, rules.named(rules.BLOCK_RULE))
    assert ok.tolist() == [True, False, True, False, True]
    with pytest.raises(PlanInputError) as err:
        rules.check_rules(ctx, cols, rules.named(rules.BLOCK_RULE), row=3)
    assert err.value.field == "recompute_num_layers"
    assert str(err.value.message) == (
        "recompute_num_layers=13 exceeds the 12 blocks of the largest model chunk (num_layers=96, "
        "pp=4, virtual_stages=2, first_stage_layers=None, last_stage_layers=None); allowed: 1 to 12 "
        "(Megatron-LM recompute.py, method block: the first n blocks of each chunk)")


def test_layout_needs_n_with_block_only():
    with pytest.raises(ValueError, match="block needs it"):
        Layout(recompute="block")
    with pytest.raises(ValueError, match="the other modes take none"):
        Layout(recompute="full", recompute_num_layers=3)


# --------------------------------------------------------------------------- the sweep's columns


@pytest.mark.parametrize(("name", "gpu", "gpus", "seq", "batch", "prec", "n"), [
    ("gpt3-175b", "a100-80gb", 1024, 2048, 1536, "megatron-fp16", 3),
    ("llama3-8b", "h100-sxm", 32, 8192, 96, "bf16-mixed", 2),
    ("mixtral-8x7b", "a100-80gb", 64, 4096, 256, "zero-fp16", 1),
])
def test_sweep_rows_equal_the_one_layout_references(name, gpu, gpus, seq, batch, prec, n):
    """A sweep pinned to block n: each row's memory to the byte (plan_memory) and step figures
    to 1e-12 (estimate_step), as tests/test_grouped_evaluation checks the other modes."""
    from planner.io.jobfile import make_setup

    model, cluster = loading.load_model(name), loading.cluster_for_gpus(gpu, gpus)
    setup = make_setup(seq, batch, 1e12, prec, "adam")
    c = sweep.Constraints(recompute=("block", "full"), recompute_num_layers=n)
    cands = sweep.enumerate_candidates(model, cluster, setup, c)
    assert set(cands["recompute_num_layers"][cands["recompute"] == RECOMPUTE_MODES.index("block")]) == {n}
    rng = np.random.default_rng(10)
    rows = cands.take(rng.choice(len(cands), size=min(len(cands), 60), replace=False))
    cols = sweep.evaluate(model, cluster, setup, rows, c)
    for i in range(len(rows)):
        layout = sweep.layout_at(rows, i, c)
        mem = plan.plan_memory(model, cluster, layout, setup)
        assert int(cols["gpu_peak_bytes"][i]) == max(s.total_bytes for s in mem.stages), layout
        est = steptime.estimate_step(model, cluster, layout, setup)
        assert float(cols["step_s"][i]) == pytest.approx(est.step_s, rel=1e-12), layout
        assert float(cols["hfu"][i]) == pytest.approx(est.hfu, rel=1e-12), layout


# --------------------------------------------------------------------------- Megatron


BASE = ("--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 100 "
        "--micro-batch-size 1 --global-batch-size 8 --pipeline-model-parallel-size 2 ")


def test_megatron_block_round_trip():
    """block 3 of 4 layers per stage -> layout -> the same flags -> the same layout."""
    job = job_from_megatron(*parse_megatron_args(
        BASE + "--recompute-granularity full --recompute-method block --recompute-num-layers 3"),
        num_gpus=2)
    assert (job.layout.recompute, job.layout.recompute_num_layers) == ("block", 3)
    flags = megatron_flags(job.model, job.layout, TrainSetup(
        seq_len=128, global_batch=8, train_tokens=128 * 8, precision=get_precision("megatron-fp16"),
        optimizer=get_optimizer("adam")))
    i = flags.index("--recompute-method")
    assert flags[i - 2:i + 4] == ["--recompute-granularity", "full", "--recompute-method", "block",
                                  "--recompute-num-layers", "3"]
    again = job_from_megatron(*parse_megatron_args(" ".join(flags)), num_gpus=2)
    assert again.layout == job.layout
    # n of at least the chunk's 4 layers: every block recomputed, read as full
    full = job_from_megatron(*parse_megatron_args(
        BASE + "--recompute-granularity full --recompute-method block --recompute-num-layers 4"),
        num_gpus=2)
    assert full.layout.recompute == "full"


# --------------------------------------------------------------------------- CLI


JOB = """\
model: gpt3-13b
cluster: dgx-a100x128
layout: {tp: 8, pp: 4, dp: 32, micro_batch: 1, recompute: block, recompute_num_layers: 5}
setup: {seq_len: 2048, global_batch: 64, train_tokens: 3e11, precision: zero-fp16, optimizer: adam}
"""


def test_fit_flags_job_file_and_check_agree(zplan, tmp_path: Path):
    """`fit` with the flags and `check` of the job file saying the same layout: the same layout
    and the same peak bytes (the defaults of fit: zero-fp16, adam, 3e11 tokens)."""
    import json

    fit = zplan("fit", "--model", "gpt3-13b", "--cluster", "dgx-a100x128", "--tp", "8", "--pp", "4",
                "--micro-batch", "1", "--global-batch", "64", "--seq-len", "2048", "--recompute",
                "block", "--recompute-num-layers", "5", "--json")
    assert fit.returncode == 0, fit.stderr
    doc = json.loads(fit.stdout)
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    check = zplan("check", str(job), "--json")
    assert check.returncode == 0, check.stderr
    verdict = json.loads(check.stdout)
    assert verdict["layout"] == doc["layout"]
    assert (verdict["layout"]["recompute"], verdict["layout"]["recompute_num_layers"]) == ("block", 5)
    assert verdict["peak_gpu_bytes"] == max(s["total_bytes"] for s in doc["memory"]["stages"])


@pytest.mark.parametrize(("args", "field"), [
    (["fit", "--recompute", "block"], "recompute_num_layers: --recompute block needs"),
    (["fit", "--recompute", "full", "--recompute-num-layers", "2"], "recompute_num_layers: --recompute-num-layers 2 is for"),
    (["fit", "--recompute", "block", "--recompute-num-layers", "11"], "recompute_num_layers: recompute_num_layers=11 exceeds the 10 blocks"),
    (["fit", "--recompute", "block", "--recompute-num-layers", "0"], "--recompute-num-layers"),
    (["sweep", "--recompute", "block"], "recompute_num_layers: --recompute block needs"),
    (["export", "--format", "deepspeed", "--recompute", "block", "--recompute-num-layers", "2"],
     "recompute: block has no DeepSpeed config key"),
])
def test_bad_input_exits_2_with_one_line(zplan, tmp_path: Path, args, field):
    common = ["--model", "gpt3-13b", "--gpu", "a100-80gb", "--gpus", "32", "--tp", "8", "--pp", "4",
              "--global-batch", "64"]
    if args[0] == "export":
        common = common + ["--output", str(tmp_path / "ds.json")]
    result = zplan(*args, *common)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert field in lines[0]
    assert not (tmp_path / "ds.json").exists()
