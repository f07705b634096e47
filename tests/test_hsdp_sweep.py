"""HSDP in the sweep (issue 10): which shard groups the enumeration proposes, that every such
row is the layout `fit` evaluates alone (memory to the byte, step time to 1e-12), the rule's
mask and message, the `--dp-shard` option, near-identical HSDP rows folded, and DeepSpeed's
MiCS refused as deepspeed 0.19.8 refuses it.

The expected shard groups are worked out here by hand from the node size: the sweep proposes
whole nodes (the node's dp ranks x each divisor of the nodes the dp group spans, below dp),
never a one-rank group; plain FSDP (the whole group) is every row's first entry (dp_shard 0).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.core import rules
from planner.core.columns import DP_ENGINES, LayoutColumns
from planner.core.errors import PlanInputError
from planner.core.recipes import get_optimizer, get_precision
from planner.io import loading
from planner.io.jobfile import make_setup
from planner.memory import model_states, plan
from planner.search import sweep
from planner.timing import steptime

runner = CliRunner()
FSDP2 = DP_ENGINES.index("fsdp2")
LLAMA2_7B_PARAMS = 6_738_415_616
"""Llama 2 7B's parameter count (the model preset; test_params checks it against transformers)."""


def _llama_256():
    model = loading.load_model("llama2-7b")
    cluster = loading.cluster_for_gpus("a100-80gb", 256)  # 32 DGX A100 nodes of 8 GPUs
    return model, cluster, make_setup(4096, 1024, 1e12, "bf16-mixed", "adamw")


def test_options_by_hand():
    # 8 dp ranks per node (tp = cp = 1): dp 256 spans 32 nodes; k | 32 below 32: 1, 2, 4, 8, 16
    assert sweep.dp_shard_options(256, 8) == [8, 16, 32, 64, 128]
    # dp 64 = 8 nodes: k = 1, 2, 4
    assert sweep.dp_shard_options(64, 8) == [8, 16, 32]
    # tp 2: 4 dp ranks per node; dp 128 = 32 nodes
    assert sweep.dp_shard_options(128, 4) == [4, 8, 16, 32, 64]
    # dp 24 = 3 nodes: only one node (k = 1); 3 would be the whole group
    assert sweep.dp_shard_options(24, 8) == [8]
    # tp 8 fills the node: 1 dp rank per node; a shard group of 1 rank (k = 1) is DDP, left out
    assert sweep.dp_shard_options(32, 1) == [2, 4, 8, 16]
    # within one node, or not whole nodes: no HSDP proposed
    assert sweep.dp_shard_options(8, 8) == [] and sweep.dp_shard_options(4, 8) == []
    assert sweep.dp_shard_options(12, 8) == []


def test_enumeration_proposes_whole_node_groups_for_fsdp2_only():
    model, cluster, setup = _llama_256()
    auto = sweep.enumerate_candidates(model, cluster, setup, sweep.Constraints())
    none = sweep.enumerate_candidates(model, cluster, setup, sweep.Constraints(dp_shard=(0,)))
    assert "dp_shard" not in none and "dp_shard" in auto
    fsdp = (auto["dp_engine"] == FSDP2) & (auto["zero_stage"] >= 2)
    assert not auto["dp_shard"][~fsdp].any()  # DeepSpeed and ZeRO-0/1 rows: the whole group

    def shards(tp, pp):
        rows = fsdp & (auto["tp"] == tp) & (auto["pp"] == pp)
        assert rows.any()
        return set(auto["dp_shard"][rows].tolist())
    # by hand, with 8 GPUs per node: tp1 pp1 dp 256 (32 nodes of 8 dp ranks)
    assert shards(1, 1) == {0, 8, 16, 32, 64, 128}
    # tp 2: dp 128, 4 dp ranks per node, 32 nodes
    assert shards(2, 1) == {0, 4, 8, 16, 32, 64}
    # tp 8: dp 32, 1 dp rank per node: 2 .. 16 nodes
    assert shards(8, 1) == {0, 2, 4, 8, 16}
    # the space: every FSDP2 ZeRO-2/3 row of `none` once more per proposed group
    # (1 + 5 on tp1 pp1, and so on): the count `none` plus those extra rows
    nf = (none["dp_engine"] == FSDP2) & (none["zero_stage"] >= 2)
    per_node = 8 // (none["tp"][nf] * none["cp"][nf])
    extra = sum(len(sweep.dp_shard_options(int(d), int(max(k, 1))))
                for d, k in zip(none["dp"][nf], per_node))
    assert len(auto) == len(none) + extra
    # and every enumerated row passes the whole rule table, the dp_shard rule included
    ok, _ = rules.mask(rules.Context(model, cluster, setup), auto)
    assert ok.all()


def test_deepspeed_only_search_has_no_column_and_pins_are_masked_by_the_rule():
    model, cluster, setup = _llama_256()
    ds = sweep.enumerate_candidates(model, cluster, setup, sweep.Constraints(dp_engine=("deepspeed",)))
    assert "dp_shard" not in ds  # no row can have HSDP: the evaluation is unchanged
    cands, rejected = sweep.enumerate_layouts(model, cluster, setup,
                                              sweep.Constraints(dp_shard=(6, 8)))
    assert set(cands["dp_shard"].tolist()) <= {6, 8}
    assert rejected[rules.DP_SHARD_RULE] > 0  # 6 divides no dp (powers of 2); DeepSpeed rows
    assert (cands["dp_engine"][cands["dp_shard"] < cands["dp"]] == FSDP2).all()


def test_the_rule_message_names_the_engine_and_mics():
    cols = LayoutColumns({"dp": np.array([64]), "dp_shard": np.array([8]),
                          "dp_engine": np.array([0]), "zero_stage": np.array([3])})
    with pytest.raises(PlanInputError) as err:
        rules.check_rules(None, cols, rules.named(rules.DP_SHARD_RULE), row=0)
    assert err.value.field == "dp_shard"
    for part in ("dp_shard=8 < dp=64", "dp_engine=deepspeed", "mics_shard_size",
                 "removed in deepspeed 0.19.8"):
        assert part in str(err.value)


def test_hsdp_rows_equal_fit_alone():
    """Sampled HSDP rows (and plain rows among them) of the grouped sweep evaluation against
    `plan_memory` and `estimate_step` of each typed layout alone."""
    model, cluster, setup = _llama_256()
    c = sweep.Constraints()
    cands, _, key = sweep.enumerate_product(model, cluster, setup, c)
    rng = np.random.default_rng(10)
    hsdp = np.flatnonzero(cands["dp_shard"] > 0)
    pick = np.concatenate([rng.choice(hsdp, 40, replace=False),
                           rng.choice(len(cands), 20, replace=False)])
    cols = sweep.evaluate(model, cluster, setup, cands, c, activity_key=key)
    for i in pick.tolist():
        lay = sweep.layout_at(cands, i, c)
        mem = plan.plan_memory(model, cluster, lay, setup)
        assert int(cols["gpu_peak_bytes"][i]) == max(s.total_bytes for s in mem.stages), lay
        assert int(cols["node_cpu_bytes"][i]) == mem.node.cpu_bytes, lay
        est = steptime.estimate_step(model, cluster, lay, setup)
        assert float(cols["step_s"][i]) == pytest.approx(est.step_s, rel=1e-12), lay
        assert float(cols["dp_comm_s"][i]) == pytest.approx(est.dp_comm_s, rel=1e-12), lay


def test_hsdp_rows_with_context_parallelism_equal_fit_alone():
    """HSDP with cp: the states shard over dp_shard x cp ranks, so the cp degrees of one
    (tp, pp) hold different states at the same shard group (Llama 3.1 8B on 128 A100, s 16384,
    tp 1, pp 1: cp 2 -> dp 64, groups 4/8/16/32; cp 4 -> dp 32, groups 2/4/8/16 (8 GPUs per
    node / cp = 4 and 2 dp ranks per node, x each divisor below 16 of the 16 nodes the dp group
    spans): 4, 8 and 16 are shared). Every row of the grouped evaluation equals `plan_memory` of its layout alone
    (until session 23 the sweep grouped them by dp_shard alone and gave one cp's states to the
    other: 20,462,350,336 instead of 28,492,611,584 bytes for dp 64 x cp 2, dp_shard 4)."""
    model = loading.load_model("llama3.1-8b")
    cluster = loading.cluster_for_gpus("a100-80gb", 128)
    setup = make_setup(16384, 128, 1e12, "bf16-mixed", "adamw")  # m > 1 at both cp degrees
    c = sweep.Constraints(tp=(1,), pp=(1,), cp=(2, 4), dp_engine=("fsdp2",), zero_stage=(3,),
                          micro_batch=(1,), recompute=("full",))
    cands, _, key = sweep.enumerate_product(model, cluster, setup, c)
    cols = sweep.evaluate(model, cluster, setup, cands, c, activity_key=key)
    pairs = {(int(cp), int(g)) for cp, g in zip(cands["cp"], cands["dp_shard"])}
    assert {(2, 8), (4, 8)} <= pairs  # one shard group at both cp degrees
    for i in range(len(cands)):
        lay = sweep.layout_at(cands, i, c)
        mem = plan.plan_memory(model, cluster, lay, setup)
        assert int(cols["gpu_peak_bytes"][i]) == max(s.total_bytes for s in mem.stages), lay


def test_states_over_the_shard_group_by_hand_in_columns():
    """The column path the sweep uses (`model_states.state_parts`): Llama 2 7B, bf16-mixed +
    Adam (2 + 2 + 12 = 16 B/param), ZeRO-3 over dp 64 vs a shard group of 8 (one node):
    ceil(6,738,415,616 / 64) = 105,287,744 and / 8 = 842,301,952 elements per rank."""
    cols = LayoutColumns({"dp": np.array([64, 64]), "dp_shard": np.array([0, 8]),
                          "zero_stage": np.array([3, 3]), "offload_optimizer": np.array([0, 0]),
                          "offload_params": np.array([0, 0]), "grad_accum": np.array([1, 1]),
                          "dp_engine": np.array([FSDP2, FSDP2])})
    parts = model_states.state_parts(np.array([LLAMA2_7B_PARAMS] * 2), cols,
                                     get_precision("bf16-mixed"), get_optimizer("adam"))
    gpu = model_states.parts_total(parts[0], np.zeros(2))
    assert gpu.tolist() == [16 * 105_287_744, 16 * 842_301_952]
    assert gpu.tolist() == [1_684_603_904, 13_476_831_232]


def test_no_two_ranked_rows_differ_only_in_the_shard_group_within_the_threshold():
    """HSDP rows of one layout within sweep.SAME_STEP_REL are one answer: each folded
    `dp_shard=N` variant re-evaluated alone fits and is within 0.5 % of its row."""
    model, cluster, setup = _llama_256()
    result = sweep.sweep(model, cluster, setup, sweep.Constraints(dp_engine=("fsdp2",)), top=8)
    shard_variants = [(row, v) for row in result.top for v in row.variants
                      if v.startswith("dp_shard=")]
    assert shard_variants
    for row, variant in shard_variants:
        value = int(variant.removeprefix("dp_shard="))
        lay = row.layout.model_copy(update={"dp_shard": None if value == row.layout.dp else value})
        est = steptime.estimate_step(model, cluster, lay, setup)
        assert abs(est.step_s / row.estimate.step_s - 1) <= sweep.SAME_STEP_REL
        assert plan.plan_memory(model, cluster, lay, setup).fits

    def key(row):
        return row.layout.model_copy(update={"dp_shard": None})
    for i, a in enumerate(result.top):
        for b in result.top[i + 1:]:
            if key(a) == key(b):
                assert abs(b.estimate.step_s / a.estimate.step_s - 1) > sweep.SAME_STEP_REL


def _sweep(*extra):
    return runner.invoke(app, ["sweep", "-m", "llama2-7b", "--gpu", "a100-80gb", "--gpus", "64",
                               "--seq-len", "4096", "--global-batch", "256", "--dp-engine",
                               "fsdp2", "--tp", "1", "--pp", "1", *extra])


def test_cli_option_column_and_json_field():
    shown = _sweep("--top", "3", "--rejected", "0")
    assert shown.exit_code == 0, shown.output
    assert " shard " in shown.output.splitlines()[2]  # the table header
    doc = json.loads(_sweep("--dp-shard", "16", "--json").stdout)
    assert {row["layout"]["dp_shard"] for row in doc["results"][0]["top"]} == {16}
    plain = json.loads(_sweep("--dp-shard", "none", "--json").stdout)
    assert {row["layout"]["dp_shard"] for row in plain["results"][0]["top"]} == {None}


@pytest.mark.parametrize("bad", ["x", "0", "8,-1", "auto,8", ""])
def test_cli_bad_dp_shard_exits_2_in_one_line(bad, tmp_path: Path):
    out = tmp_path / "rows.csv"
    result = _sweep("--dp-shard", bad, "--csv", str(out))
    assert result.exit_code == 2, result.output
    assert "--dp-shard" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_deepspeed_config_with_mics_is_refused(tmp_path: Path):
    """deepspeed 0.19.8 rejects `mics_shard_size` (runtime/config.py _REMOVED_ZERO_CONFIG_KEYS):
    a config carrying it is refused naming the key, exit 2, not planned as plain ZeRO-3."""
    for key, value in (("mics_shard_size", 8), ("mics_hierarchical_params_gather", True)):
        ds = tmp_path / f"{key}.json"
        ds.write_text(json.dumps({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1,
                                  "zero_optimization": {"stage": 3, key: value}}))
        result = runner.invoke(app, ["check", "--deepspeed", str(ds), "-m", "llama2-7b",
                                     "--gpu", "a100-80gb", "--gpus", "64", "--seq-len", "4096"])
        assert result.exit_code == 2, result.output
        assert f"zero_optimization.{key}" in result.output and "0.19.8" in result.output
        assert "Traceback" not in result.output
