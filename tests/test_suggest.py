"""planner.search.suggest: the smallest changes that make a "does not fit" fit (issue 11).

Each suggestion is applied by hand here (the flags it names, on the layout the user gave) and
re-planned through plan_memory: it must fit, and the original must not.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.core.spec import Layout
from planner.io.jobfile import make_setup
from planner.io.loading import cluster_for_gpus, load_model
from planner.memory.plan import plan_memory
from planner.search.strategies import cluster_with_gpus, strategy_minimums
from planner.search.suggest import CHANGE_COST, search_suggestions, suggest_changes


def _apply(layout: Layout, change: str) -> Layout:
    """The layout with the CLI flags of `change` set (independent of suggest's own builder)."""
    words = change.split(" (")[0].split()
    fields = {"--recompute": ("recompute", str), "--zero": ("zero_stage", int),
              "--micro-batch": ("micro_batch", int), "--grad-accum": ("grad_accum", int),
              "--offload-optimizer": ("offload_optimizer", str),
              "--offload-params": ("offload_params", str)}
    update = {}
    for flag, value in zip(words[::2], words[1::2]):
        if flag == "--gpus":
            continue
        name, kind = fields[flag]
        update[name] = kind(value)
    if "(dp " in change:
        dp, accum = change.split("(dp ")[1].rstrip(")").split(", grad-accum ")
        update |= {"dp": int(dp), "grad_accum": int(accum)}
    if "(pp " in change:
        update["pp"] = int(change.split("(pp ")[1].rstrip(")"))
    return layout.model_copy(update=update)


CASES = [  # (model, gpu, gpus, layout, seq_len, global batch): each overflows as given
    ("llama2-7b", "h100-sxm", 8, Layout(dp=8, zero_stage=1, micro_batch=4, grad_accum=1), 4096, 32),
    ("llama2-13b", "a100-80gb", 8, Layout(dp=8, micro_batch=2, grad_accum=2,
                                          recompute="selective", flash_attention=True), 4096, 32),
    ("llama2-70b", "h100-sxm", 8, Layout(tp=8, micro_batch=1, grad_accum=8, recompute="full",
                                         flash_attention=True), 4096, 8),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_suggestion_applied_fits(case):
    name, gpu, gpus, layout, seq_len, batch = case
    model, cluster = load_model(name), cluster_for_gpus(gpu, gpus)
    setup = make_setup(seq_len, batch, 1e9, "bf16-mixed", "adam")
    assert not plan_memory(model, cluster, layout, setup).fits
    found = suggest_changes(model, cluster, layout, setup)
    assert found, "no suggestion for a layout one change from fitting"
    for s in found:
        changed = _apply(layout, s.change)
        assert changed == s.layout
        hardware = cluster if s.num_gpus == cluster.num_gpus else cluster_with_gpus(cluster, s.num_gpus)
        plan = plan_memory(model, hardware, changed, setup)
        assert plan.fits and plan.peak_stage.headroom_bytes == s.headroom_bytes
    costs = [CHANGE_COST[s.kind] for s in found]
    assert costs == sorted(costs)


def test_fitting_layout_has_no_suggestion():
    model, cluster = load_model("gpt3-125m"), cluster_for_gpus("h100-sxm", 8)
    setup = make_setup(2048, 8, 1e9, "bf16-mixed", "adam")
    assert suggest_changes(model, cluster, Layout(dp=8), setup) == []


def test_search_suggestions_are_more_gpus_that_fit():
    model, cluster = load_model("llama2-70b"), cluster_for_gpus("h100-sxm", 1)
    setup = make_setup(4096, 1, 1e9, "bf16-mixed", "adam")
    strategies = strategy_minimums(model, cluster, setup)
    found = search_suggestions(model, cluster, setup, strategies)
    for s in found:
        assert s.kind == "gpus" and s.num_gpus > 1
        assert plan_memory(model, cluster_with_gpus(cluster, s.num_gpus), s.layout, setup).fits


def test_check_json_and_text_carry_suggestions(tmp_path):
    runner = CliRunner()
    args = ["--model", "llama2-7b", "--gpu", "h100-sxm", "--gpus", "8", "--dp", "8", "--zero", "1",
            "--micro-batch", "4", "--grad-accum", "1", "--seq-len", "4096", "--precision", "bf16-mixed",
            "--no-flash-attention"]
    out = runner.invoke(app, ["fit", *args])
    assert out.exit_code == 1 and "fits with one of:" in out.stdout and "--recompute" in out.stdout
    doc = json.loads(runner.invoke(app, ["fit", *args, "--json"]).stdout)
    assert doc["suggestions"] and all(s["headroom_bytes"] >= 0 for s in doc["suggestions"])
