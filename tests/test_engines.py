"""The engine support matrix (planner/io/engines.py) and export's refusal. Each case states the
engine rule it exercises and where the rule comes from (the engine's code or docs)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.core.errors import PlanInputError
from planner.core.recipes import PRECISIONS
from planner.core.spec import Layout
from planner.io.engines import ENGINES, RULES, check_engine, refusals, supported_engines
from planner.io.loading import load_model

LLAMA = load_model("llama2-7b")
BF16 = PRECISIONS["bf16-mixed"]


def test_every_rule_cites_a_source_and_a_known_engine():
    for rule in RULES:
        assert rule.engine in ENGINES and rule.source and rule.why


def test_plain_data_parallel_runs_everywhere_but_fsdp_engines_need_sharding():
    ddp = Layout(dp=8)
    assert supported_engines(LLAMA, ddp, BF16) == ["megatron-lm", "deepspeed", "fsdp2"]  # FSDP2 DDP
    assert [r.engine for r in refusals("accelerate", LLAMA, ddp, BF16)] == ["accelerate"]


def test_deepspeed_pipeline_with_zero2_refused():
    # deepspeed/runtime/pipe/engine.py: assert stage < gradients "ZeRO-2 and ZeRO-3 are
    # incompatible with pipeline parallelism"
    layout = Layout(pp=2, dp=4, zero_stage=2)
    assert "deepspeed" not in supported_engines(LLAMA, layout, BF16)
    assert "deepspeed" in supported_engines(LLAMA, Layout(pp=2, dp=4, zero_stage=1), BF16)


def test_deepspeed_refuses_partial_block_recompute_but_runs_segments():
    # DeepSpeed 0.19.8 deepspeed/runtime/pipe/module.py: activation_checkpoint_interval k
    # checkpoints every segment of k layers, over all layers (zplan's every_k); nothing recomputes
    # only the first n layers of a stage, Megatron's --recompute-method block (torchtitan's
    # every-k-th-block AC and Megatron-LM do).
    block = Layout(dp=8, recompute="block", recompute_num_layers=4)
    assert supported_engines(LLAMA, block, BF16) == ["megatron-lm", "fsdp2"]
    assert "deepspeed" in supported_engines(LLAMA, Layout(dp=8, recompute="every_k", recompute_every_k=2), BF16)
    assert "deepspeed" in supported_engines(LLAMA, Layout(dp=8, recompute="full"), BF16)


def test_pipeline_with_fsdp2_in_accelerate_refused():
    layout = Layout(pp=2, dp=4, zero_stage=3)
    assert "accelerate" not in supported_engines(LLAMA, layout, BF16)
    assert "fsdp2" in supported_engines(LLAMA, layout, BF16)  # torchtitan pipelines FSDP2


def test_megatron_refuses_parameter_offload_and_nvme():
    layout = Layout(dp=8, zero_stage=3, offload_params="cpu", offload_optimizer="cpu")
    assert "megatron-lm" not in supported_engines(LLAMA, layout, BF16)
    assert supported_engines(LLAMA, layout, BF16) == ["deepspeed", "fsdp2", "accelerate"]


def test_export_refuses_with_one_line_naming_the_engine_and_writes_nothing(tmp_path):
    """DeepSpeed 0.19.8 runtime/pipe/engine.py asserts 'ZeRO-2 and ZeRO-3 are incompatible with
    pipeline parallelism': pp = 2 with ZeRO-3 cannot be exported for DeepSpeed."""
    out = tmp_path / "ds.json"
    result = CliRunner().invoke(app, [
        "export", "-f", "deepspeed", "-m", "llama2-7b", "--gpu", "a100-80gb", "--gpus", "8",
        "--pp", "2", "--dp", "4", "--zero", "3", "-o", str(out)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "DeepSpeed" in lines[0] and "pipeline" in lines[0]
    assert not out.exists()


def test_deepspeed_runs_autotp_with_zero3():
    """DeepSpeed 0.19.8 runtime/engine.py _configure_tensor_parallel_states: 'AutoTP + ZeRO stage
    3 is supported for both inference and training' (module_inject/auto_tp.py
    _gather_zero3_params gathers each partitioned weight before the tp slice)."""
    layout = Layout(tp=2, dp=4, zero_stage=3)
    assert "deepspeed" in supported_engines(LLAMA, layout, BF16)
    assert "fsdp2" in supported_engines(LLAMA, layout, BF16)  # torchtitan: TP + FSDP


def test_fit_json_lists_the_engines():
    import json

    result = CliRunner().invoke(app, ["fit", "-m", "llama2-7b", "--gpu", "a100-80gb", "--gpus", "8",
                                      "--tp", "2", "--pp", "2", "--dp", "2", "--zero", "2", "--json"])
    doc = json.loads(result.stdout)
    # pp=2 with ZeRO-2: DeepSpeed (pipe assert) and accelerate (no pp) refuse; Megatron's
    # FSDP2 path refuses pp too (arguments.py); torchtitan runs PP + FSDP2 (reshard off)
    assert doc["engines"] == ["fsdp2"]
