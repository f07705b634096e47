"""`zplan sweep --engine E` (Constraints.engine): only layouts engine E can run, their ZeRO-2/3
rows under E's own sharding model (planner/io/engines.py SHARDED_DP_MODEL). The oracle is the
scalar rule table applied to every fitting candidate one Layout at a time, not the sweep's
vectorised mask."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.core.spec import Layout
from planner.io import engines, loading
from planner.io.engines import ENGINES, FIELDS_READ, RULES, SHARDED_DP_MODEL, refusals
from planner.io.jobfile import make_setup
from planner.search import sweep

MODEL = loading.load_model("gpt3-1.3b")
CLUSTER = loading.cluster_for_gpus("a100-80gb", 16)
SETUP = make_setup(2048, 32, 1e12)


def _names_read(code: types.CodeType, seen: set[str]) -> set[str]:
    """Attribute and global names a rule's code reads, following the module's helper functions
    (e.g. `_hsdp`) and nested code objects."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_read(const, seen)
    for name in list(names):
        helper = getattr(engines, name, None)
        if isinstance(helper, types.FunctionType) and name not in seen:
            seen.add(name)
            names |= _names_read(helper.__code__, seen)
    return names


def test_fields_read_lists_every_layout_attribute_a_rule_reads():
    layout_attrs = {name for name in dir(Layout) if not name.startswith("_")} | set(Layout.model_fields)
    for rule in RULES:
        read = _names_read(rule.refuses.__code__, set()) & layout_attrs
        assert read <= set(FIELDS_READ), (rule.engine, rule.why, read - set(FIELDS_READ))
    assert set(FIELDS_READ) <= set(Layout.model_fields)
    # the sharding-model check the sweep groups on too
    assert _names_read(engines.timed_as.__code__, set()) & layout_attrs == {"zero_stage", "dp_engine"}


def _oracle(engine: str, constraints: sweep.Constraints) -> tuple[int, float]:
    """Fitting candidates `engine` runs, and the least step time among them: every candidate of
    the unfiltered search evaluated, then each fitting one checked as a Layout by the scalar
    rules, its ZeRO-2/3 under the engine's sharding model."""
    cands, _, key = sweep.enumerate_product(MODEL, CLUSTER, SETUP, constraints)
    cols = sweep.evaluate(MODEL, CLUSTER, SETUP, cands, constraints, activity_key=key)
    ok = sweep.fit_masks(cols, CLUSTER)
    runs = []
    for i in np.nonzero(ok[0] & ok[1] & ok[2])[0]:
        layout = sweep.layout_at(cands, int(i), constraints)
        if not refusals(engine, MODEL, layout, SETUP.precision) and (
                layout.zero_stage < 2 or layout.dp_engine == SHARDED_DP_MODEL[engine]):
            runs.append(float(cols["step_s"][i]))
    return len(runs), min(runs, default=float("inf"))


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_sweep_matches_the_scalar_rules_on_every_fitting_candidate(engine):
    free = sweep.Constraints()
    pinned = sweep.sweep(MODEL, CLUSTER, SETUP, free.model_copy(update={"engine": engine}), top=50)
    count, best = _oracle(engine, free)
    assert pinned.fitting == count > 0
    assert pinned.top[0].estimate.step_s == best
    for row in pinned.top + pinned.rejected:
        assert not refusals(engine, MODEL, row.layout, SETUP.precision)
        assert row.layout.zero_stage < 2 or row.layout.dp_engine == SHARDED_DP_MODEL[engine]
    everything = sweep.sweep(MODEL, CLUSTER, SETUP, free, top=1)
    assert everything.fitting > count  # no engine runs every layout of the table


def test_deepspeed_never_gets_zero2_or_zero3_with_a_pipeline():
    # DeepSpeed 0.19.8 deepspeed/runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with
    # pipeline parallelism"; pinned to ZeRO-3 with pp = 2, nothing DeepSpeed runs is left
    c = sweep.Constraints(pp=(2,), zero_stage=(3,), engine="deepspeed")
    assert sweep.sweep(MODEL, CLUSTER, SETUP, c).top == []
    c = sweep.Constraints(pp=(2,), zero_stage=(1,), engine="deepspeed")
    assert sweep.sweep(MODEL, CLUSTER, SETUP, c).top


def test_cli_engine_option_and_bad_value():
    runner = CliRunner()
    args = ["sweep", "--model", "gpt3-1.3b", "--gpu", "a100-80gb", "--gpus", "16", "--global-batch", "32"]
    out = runner.invoke(app, args + ["--engine", "accelerate", "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["results"][0]["top"]
    # accelerate 1.15.0 ParallelismConfig: dp_replicate, dp_shard, tp, cp (no pp); FSDP shards
    # like ZeRO-2/3 (reshard_after_forward), timed as torch's fully_shard
    assert rows and all(r["layout"]["pp"] == 1 and r["layout"]["zero_stage"] >= 2
                        and r["layout"]["dp_engine"] == "fsdp2" for r in rows)
    assert {r["layout"]["tp"] for r in rows} == {1, 2}  # transformers' TP is allowed (tp | kv heads)
    bad = runner.invoke(app, args + ["--engine", "colossalai"])
    assert bad.exit_code == 2
    lines = [line for line in bad.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--engine" in lines[0] and "megatron-lm, deepspeed, fsdp2, accelerate" in lines[0]
    assert "Traceback" not in bad.output


def test_nothing_the_engine_runs_fits_says_so():
    # GPT-3 1.3B fits with ZeRO-3 at pp = 2 (the unpinned search finds layouts), but DeepSpeed's
    # pipeline engine refuses ZeRO-2/3: the reason names the engine, not GPU memory
    c = sweep.Constraints(pp=(2,), zero_stage=(3,))
    assert sweep.sweep(MODEL, CLUSTER, SETUP, c).top
    result = sweep.sweep(MODEL, CLUSTER, SETUP, c.model_copy(update={"engine": "deepspeed"}))
    assert result.top == [] and result.fitting == 0
    assert "none that DeepSpeed (HF model, AutoTP) runs" in result.empty_reason


FIT = ["fit", "--model", "gpt3-1.3b", "--gpu", "a100-80gb", "--gpus", "16", "--global-batch", "32"]


@pytest.mark.parametrize("engine", ("megatron-lm", "deepspeed", "fsdp2"))
def test_fit_search_with_engine_is_the_engine_sweeps_first_row(engine):
    out = CliRunner().invoke(app, FIT + ["--engine", engine, "--json"])
    assert out.exit_code == 0, out.output
    layout = Layout.model_validate(json.loads(out.stdout)["layout"])
    best = sweep.sweep(MODEL, CLUSTER, SETUP, sweep.Constraints(engine=engine), top=1).top[0].layout
    assert layout == best
    assert not refusals(engine, MODEL, layout, SETUP.precision)


def test_fit_with_a_layout_and_engine():
    runner = CliRunner()
    # DeepSpeed 0.19.8 pipe/engine.py: no ZeRO-2/3 with pp > 1 -> one line naming --engine, exit 2
    bad = runner.invoke(app, FIT + ["--pp", "2", "--dp", "8", "--zero", "3", "--engine", "deepspeed"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    lines = [line for line in bad.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("zplan: error: --engine:")
    assert "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" in lines[0]
    # ZeRO-3 with --engine fsdp2 and no --dp-engine: timed as FSDP2's fully_shard
    ok = runner.invoke(app, FIT + ["--dp", "16", "--zero", "3", "--engine", "fsdp2", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["layout"]["dp_engine"] == "fsdp2"
    # ... and refused when the user pins the other sharding model
    clash = runner.invoke(app, FIT + ["--dp", "16", "--zero", "3", "--engine", "fsdp2", "--dp-engine", "deepspeed"])
    assert clash.exit_code == 2 and "pass --dp-engine fsdp2" in clash.output


def test_ranked_rows_name_the_engines_that_run_them():
    # ZeRO-3 with pp = 2: DeepSpeed's pipe engine asserts ZeRO < 2, Megatron-LM's FSDP2 path
    # refuses pp (arguments.py), accelerate has no pp; torchtitan runs PP + FSDP2
    c = sweep.Constraints(pp=(2,), zero_stage=(3,))
    rows = sweep.sweep(MODEL, CLUSTER, SETUP, c, top=3).top
    assert rows and all(row.engines == ["fsdp2"] for row in rows)
    out = CliRunner().invoke(app, ["sweep", "--model", "gpt3-1.3b", "--gpu", "a100-80gb", "--gpus", "16",
                                   "--global-batch", "32", "--pp", "2", "--zero", "3", "--top", "3"])
    assert out.exit_code == 0
    assert "engines that can run #1: fsdp2 (--engine E shows only what E runs)" in out.stdout
