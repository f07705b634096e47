"""The implementation profile as an input of the memory model (issue 11 phase 2, item 1).

The activation term of a transformers run (hf-eager / hf-sdpa) is the phase-1 inventory
(planner.memory.implementations, measured against transformers in test_hf_implementations.py)
composed by hand here; the autocast recipe's bytes per parameter are worked out by hand.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.core.columns import LayoutColumns
from planner.core.errors import PlanInputError
from planner.core.spec import Layout
from planner.io.jobfile import make_setup
from planner.io.loading import cluster_for_gpus, load_model
from planner.memory import implementations as impls
from planner.memory.plan import plan_memory
from planner.search import sweep


def _setup(precision: str, implementation: str, global_batch: int = 2):
    return make_setup(2048, global_batch, 1e9, precision, "adam", None, implementation)


@pytest.mark.parametrize("name", ["hf-eager", "hf-sdpa"])
@pytest.mark.parametrize("precision,mode", [("bf16-mixed", "bf16"), ("autocast-bf16", "autocast-bf16"),
                                            ("fp32", "fp32")])
def test_plan_activations_are_the_transformers_inventory(name, precision, mode):
    model, cluster = load_model("llama3-8b"), cluster_for_gpus("h100-sxm", 1)
    layout = Layout(micro_batch=2, grad_accum=1)
    plan = plan_memory(model, cluster, layout, _setup(precision, name))
    impl = impls.Implementation(name=name, precision=mode)
    by_hand = (model.num_layers * sum(impls.block_saved_bytes(model, impl, 2048, 2).values())
               + sum(impls.hf_outside_saved_bytes(model, impl, 2048, 2).values()))
    assert by_hand == impls.model_saved_bytes(model, impl, 2048, 2)
    assert plan.stages[0].activations_bytes == by_hand
    assert plan.stages[0].working == {}


def test_full_recompute_keeps_block_inputs_and_rebuilds_one_block():
    model, cluster = load_model("llama3-8b"), cluster_for_gpus("h100-sxm", 1)
    plan = plan_memory(model, cluster, Layout(micro_batch=1, recompute="full"), _setup("bf16-mixed", "hf-sdpa", 1))
    impl = impls.Implementation(name="hf-sdpa", precision="bf16")
    inputs = model.num_layers * 2048 * model.hidden_size * 2        # bf16 block inputs, b = 1
    outside = sum(impls.hf_outside_saved_bytes(model, impl, 2048, 1).values())
    assert plan.stages[0].activations_bytes == inputs + outside
    assert plan.stages[0].working == {
        "recompute_segment": sum(impls.hf_block_saved_bytes(model, impl, 2048, 1).values())}


def test_autocast_model_states_by_hand():
    """fp32 weights 4 + fp32 grads 4 + Adam m, v 8 = 16 bytes per parameter, no master copy."""
    model, cluster = load_model("gpt2"), cluster_for_gpus("h100-sxm", 1)
    setup = make_setup(1024, 2, 1e9, "autocast-bf16", "adam", None, "hf-sdpa")
    plan = plan_memory(model, cluster, Layout(micro_batch=2), setup)
    stage = plan.stages[0]
    n = stage.num_params                       # 124,439,808 for GPT-2 (tied head)
    assert n == 124_439_808
    assert (stage.params_bytes, stage.grads_bytes, stage.optimizer_bytes) == (4 * n, 4 * n, 8 * n)


def test_transformers_runs_refuse_tp_pp_and_selective():
    model, cluster = load_model("llama3-8b"), cluster_for_gpus("h100-sxm", 2)
    for layout in (Layout(tp=2, micro_batch=2), Layout(pp=2, grad_accum=2),
                   Layout(dp=2, recompute="selective")):
        with pytest.raises(PlanInputError, match="implementation=hf-sdpa runs transformers' modules"):
            plan_memory(model, cluster, layout, _setup("bf16-mixed", "hf-sdpa"))


@pytest.mark.parametrize("precision", ["bf16-mixed", "autocast-bf16"])
def test_sweep_and_plan_agree_for_transformers_runs(precision):
    model, cluster = load_model("llama3-8b"), cluster_for_gpus("h100-sxm", 8)
    setup = _setup(precision, "hf-sdpa", 32)
    for layout in (Layout(dp=8, zero_stage=3, micro_batch=4, grad_accum=1),
                   Layout(dp=8, zero_stage=2, micro_batch=1, grad_accum=4, recompute="full")):
        cols = sweep.evaluate(model, cluster, setup, LayoutColumns.from_layout(layout))
        assert int(cols["headroom_bytes"][0]) == plan_memory(model, cluster, layout, setup).peak_stage.headroom_bytes
    result = sweep.sweep(model, cluster, setup, top=5, rejected=0)
    assert result.top and all(r.layout.tp == 1 and r.layout.pp == 1 for r in result.top)
    assert all(r.layout.recompute in ("none", "full") for r in result.top)


def test_cli_implementation_option():
    runner = CliRunner()
    base = ["fit", "--model", "gpt2", "--gpu", "h100-sxm", "--gpus", "1", "--micro-batch", "2",
            "--seq-len", "1024"]
    assert runner.invoke(app, [*base, "--implementation", "hf-sdpa", "--precision", "autocast-bf16"]).exit_code == 0
    bad = runner.invoke(app, [*base, "--implementation", "hf-flash"])
    assert bad.exit_code == 2 and "implementation" in bad.stderr


def _ds(tmp_path, config):
    import json

    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    return path


def test_engine_configs_select_the_implementation(tmp_path):
    """HF Trainer style DeepSpeed config ("auto" values) -> hf-sdpa; a numeric one (Megatron-
    DeepSpeed, zplan export) -> megatron; a Megatron launch line -> megatron (the default)."""
    from planner.io.check import check_deepspeed

    model, cluster = load_model("llama2-7b"), cluster_for_gpus("a100-80gb", 8)
    hf = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
          "zero_optimization": {"stage": 3}}
    numeric = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
               "gradient_accumulation_steps": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}
    kw = dict(num_gpus=None, seq_len=4096, tokens=1e9, optimizer="adam", precision="bf16-mixed",
              micro_batch=1, grad_accum=1)
    a = check_deepspeed(_ds(tmp_path, hf), model, cluster, **kw)
    assert a.setup.implementation == "hf-sdpa" and any("hf-sdpa assumed" in n for n in a.notes)
    impl = impls.Implementation(name="hf-sdpa", precision="bf16")
    assert a.plan.stages[0].activations_bytes == impls.model_saved_bytes(model, impl, 4096, 1)
    b = check_deepspeed(_ds(tmp_path, numeric), model, cluster, **kw)
    assert b.setup.implementation == "megatron" and not any("hf-sdpa" in n for n in b.notes)
    c = check_deepspeed(_ds(tmp_path, hf), model, cluster, implementation="megatron", **kw)
    assert c.setup.implementation == "megatron"
