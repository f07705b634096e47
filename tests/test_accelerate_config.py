"""`zplan check --accelerate-config FILE` (issue 11, item 4): accelerate's YAML as the layout.

The files are written by accelerate's own `ClusterConfig.to_yaml_file` (accelerate 1.15.0), the
class `accelerate launch` reads them with, and the key lists are compared with accelerate's own
dataclass and argument parser; the expected layouts follow the mapping cited in
planner/io/accelerate_config.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

accelerate_config_args = pytest.importorskip("accelerate.commands.config.config_args")
from accelerate.commands.launch import launch_command_parser  # noqa: E402

from planner.core.errors import PlanInputError  # noqa: E402
from planner.io import accelerate_config as ac  # noqa: E402
from planner.io.check import check_accelerate  # noqa: E402
from planner.io.loading import load_cluster, load_model  # noqa: E402

ClusterConfig = accelerate_config_args.ClusterConfig
BASE = dict(compute_environment="LOCAL_MACHINE", mixed_precision="bf16", use_cpu=False, debug=False,
            num_processes=8, num_machines=1)


def _write(tmp_path: Path, name: str = "acc.yaml", **fields) -> Path:
    path = tmp_path / name
    ClusterConfig(**(BASE | fields)).to_yaml_file(str(path))
    return path


def _check(path: Path, **numbers):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100")
    return check_accelerate(path, model, cluster, num_gpus=None, seq_len=4096, tokens=1e9,
                            optimizer="adamw", **numbers)


def test_key_lists_are_accelerates_own():
    assert ac.CLUSTER_CONFIG_KEYS == {f.name for f in dataclasses.fields(ClusterConfig)}
    groups = {g.title: {a.dest for a in g._group_actions} for g in launch_command_parser()._action_groups}
    assert ac.FSDP_KEYS == groups["FSDP Arguments"]
    assert ac.DEEPSPEED_KEYS == groups["DeepSpeed Arguments"]


def test_fsdp2_full_shard_with_checkpointing(tmp_path):
    path = _write(tmp_path, distributed_type="FSDP", fsdp_config={
        "fsdp_version": 2, "fsdp_reshard_after_forward": True, "fsdp_offload_params": False,
        "fsdp_activation_checkpointing": True, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"})
    result = _check(path, micro_batch=2, grad_accum=4)
    lay = result.layout
    assert (lay.dp, lay.zero_stage, lay.dp_engine, lay.recompute) == (8, 3, "fsdp2", "full")
    assert (lay.micro_batch, lay.grad_accum, result.setup.global_batch) == (2, 4, 2 * 4 * 8)
    assert result.setup.precision.name == "autocast-bf16"
    assert result.setup.implementation == "hf-sdpa" and result.source == "accelerate"


def test_fsdp2_without_reshard_is_zero2_and_prefix_may_be_dropped(tmp_path):
    # accelerate's launch copies fsdp_config.x to args.fsdp_x (launch.py _validate_launch_command)
    path = _write(tmp_path, distributed_type="FSDP", fsdp_config={"version": 2, "reshard_after_forward": False})
    assert _check(path, micro_batch=1).layout.zero_stage == 2


def test_fsdp1_sharding_strategy_is_planned_as_zero_with_a_note(tmp_path):
    path = _write(tmp_path, distributed_type="FSDP", fsdp_config={"fsdp_sharding_strategy": "SHARD_GRAD_OP"})
    result = _check(path, micro_batch=1)
    assert (result.layout.zero_stage, result.layout.dp_engine) == (2, "deepspeed")
    assert any("fsdp_version 1" in n for n in result.notes)


def test_multi_gpu_is_ddp_and_mixed_precision_no_is_fp32(tmp_path):
    path = _write(tmp_path, distributed_type="MULTI_GPU", mixed_precision="no", num_processes=4)
    result = _check(path, micro_batch=1, global_batch=16)
    assert (result.layout.dp, result.layout.zero_stage, result.layout.grad_accum) == (4, 0, 4)
    assert result.setup.precision.name == "fp32" and result.cluster.num_gpus == 4


def test_deepspeed_section_builds_the_deepspeed_config(tmp_path):
    path = _write(tmp_path, distributed_type="DEEPSPEED", deepspeed_config={
        "zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "none",
        "gradient_accumulation_steps": 4, "zero3_init_flag": True})
    result = _check(path, micro_batch=2)
    lay = result.layout
    assert (lay.zero_stage, lay.offload_optimizer, lay.offload_params) == (3, "cpu", "none")
    assert (lay.grad_accum, result.setup.global_batch) == (4, 2 * 4 * 8)
    assert result.setup.precision.name == "bf16-mixed"  # DeepSpeed's bf16: 16-bit model, fp32 master


def test_deepspeed_config_file_is_read_relative_to_the_yaml(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 2}, "fp16": {"enabled": True}}))
    path = _write(tmp_path, distributed_type="DEEPSPEED", deepspeed_config={"deepspeed_config_file": "ds.json"})
    result = _check(path)
    assert (result.layout.zero_stage, result.layout.grad_accum, result.setup.global_batch) == (2, 2, 16)
    assert result.setup.precision.name == "zero-fp16"


def test_unknown_top_level_key_is_refused_like_accelerate(tmp_path, zplan):
    path = _write(tmp_path, distributed_type="MULTI_GPU")
    path.write_text(path.read_text() + "num_gpus: 8\n")
    with pytest.raises(ValueError, match="unknown keys"):
        ClusterConfig.from_yaml_file(str(path))  # accelerate refuses it too
    result = zplan("check", "--accelerate-config", str(path), "--model", "llama3-8b",
                   "--cluster", "dgx-h100", "--micro-batch", "1")
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "accelerate-config.num_gpus: unknown key" in lines[0]


def test_misspelt_fsdp_key_is_refused(tmp_path, zplan):
    # accelerate would set args.fsdp_reshard_after_foward and ignore it: the run would reshard
    path = _write(tmp_path, distributed_type="FSDP", fsdp_config={"fsdp_version": 2,
                                                                   "fsdp_reshard_after_foward": False})
    result = zplan("check", "--accelerate-config", str(path), "--model", "llama3-8b",
                   "--cluster", "dgx-h100", "--micro-batch", "1")
    assert result.returncode == 2 and result.stdout == ""
    assert "fsdp_config.fsdp_reshard_after_foward: unknown key" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("fields,numbers,match", [
    (dict(distributed_type="FSDP", fsdp_config={"fsdp_offload_params": "yes"}), {"micro_batch": 1},
     "fsdp_offload_params"),
    (dict(distributed_type="MULTI_GPU"), {}, "--micro-batch"),
    (dict(distributed_type="MULTI_GPU"), {"micro_batch": 1, "global_batch": 12}, "--global-batch"),
    (dict(distributed_type="XLA"), {"micro_batch": 1}, "distributed_type"),
    (dict(distributed_type="MULTI_GPU", mixed_precision="fp8"), {"micro_batch": 1}, "mixed_precision"),
    (dict(distributed_type="MULTI_GPU", num_processes=-1), {"micro_batch": 1}, "num_processes"),
])
def test_bad_values_name_the_field(tmp_path, fields, numbers, match):
    path = _write(tmp_path, **fields)
    with pytest.raises(PlanInputError) as err:
        _check(path, **numbers)
    assert match in str(err.value) and "\n" not in str(err.value)


def test_cli_exit_codes_fit_and_not_fit(tmp_path, zplan):
    path = _write(tmp_path, distributed_type="FSDP", fsdp_config={"fsdp_version": 2})
    ok = zplan("check", "--accelerate-config", str(path), "--model", "llama3-8b",
               "--cluster", "dgx-h100", "--micro-batch", "1", "--seq-len", "4096")
    assert ok.returncode == 0 and ok.stdout.startswith("FITS:"), ok.stderr
    ddp = _write(tmp_path, "ddp.yaml", distributed_type="MULTI_GPU")  # llama3-8b x 16 B/param on 80 GB
    bad = zplan("check", "--accelerate-config", str(ddp), "--model", "llama3-8b",
                "--cluster", "dgx-h100", "--micro-batch", "1", "--seq-len", "4096")
    assert bad.returncode == 1 and bad.stdout.startswith("DOES NOT FIT"), bad.stderr
    both = zplan("check", "--accelerate-config", str(ddp), "--model", "llama3-8b",
                 "--cluster", "dgx-h100", "--micro-batch", "1", "--precision", "bf16-mixed")
    assert both.returncode == 2 and "--precision" in both.stderr
