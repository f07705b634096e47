"""`zplan export` through the CLI, and the round trip: export a layout, check the exported file,
get the same verdict and the same memory numbers as checking the layout itself."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from planner.io.fsdp import accelerate_fsdp_config
from planner.core.errors import PlanInputError
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout, TrainSetup


def job_file(tmp_path: Path, layout: str, setup: str, model: str = "llama2-7b", cluster: str = "dgx-a100") -> str:
    path = tmp_path / "job.yaml"
    path.write_text(f"model: {model}\ncluster: {cluster}\nlayout: {layout}\nsetup: {setup}\n")
    return str(path)


def check_json(zplan, *args: str) -> tuple[int, dict]:
    result = zplan("check", *args, "--json")
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


@pytest.mark.parametrize(
    ("layout", "setup", "extra"),
    [
        ("{dp: 8, zero_stage: 3, micro_batch: 2, recompute: full}",
         "{seq_len: 4096, global_batch: 32, train_tokens: 2e12, precision: bf16-mixed, optimizer: adamw}", []),
        ("{tp: 2, dp: 4, zero_stage: 2, offload_optimizer: cpu, micro_batch: 1}",
         "{seq_len: 2048, global_batch: 16, train_tokens: 1e12, precision: zero-fp16}", ["--tp", "2"]),
        # the user's own bucket sizes (YAML reads 2e8 as a string; the layout takes it)
        (("{dp: 8, zero_stage: 3, micro_batch: 1, recompute: full, buffers: {reduce_bucket_elements: 2e8, "
          "max_live_parameters: 3e8, prefetch_bucket_elements: 2e7, param_persistence_threshold: 40960}}"),
         "{seq_len: 4096, global_batch: 16, train_tokens: 2e12, precision: bf16-mixed, optimizer: adamw}", []),
        ("{dp: 8, zero_stage: 2, micro_batch: 1, buffers: {reduce_bucket_elements: 1e8, allgather_bucket_elements: 1e8}}",
         "{seq_len: 2048, global_batch: 8, train_tokens: 1e12, precision: zero-fp16}", []),
    ],
)
def test_deepspeed_round_trip(zplan, tmp_path, layout, setup, extra):
    job = job_file(tmp_path, layout, setup)
    out = tmp_path / "ds.json"
    exported = zplan("export", "--format", "deepspeed", "--job", job, "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    config = json.loads(out.read_text())
    lay = yaml.safe_load(layout)
    dp = lay["dp"]
    # DeepSpeed's batch rule (runtime/config.py _batch_assertion): micro x gas x dp
    assert config["train_batch_size"] == config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * dp
    for field, key in [("reduce_bucket_elements", "reduce_bucket_size"),
                       ("max_live_parameters", "stage3_max_live_parameters")]:
        if field in lay.get("buffers", {}):  # the file carries the layout's value, as an integer
            assert config["zero_optimization"][key] == int(float(lay["buffers"][field]))
    code_job, direct = check_json(zplan, job)
    tokens = str(yaml.safe_load(setup)["train_tokens"])
    seq = str(yaml.safe_load(setup)["seq_len"])
    args = ["--deepspeed", str(out), "--model", "llama2-7b", "--cluster", "dgx-a100", "--seq-len", seq,
            "--tokens", tokens, "--optimizer", yaml.safe_load(setup).get("optimizer", "adam")]
    code_ds, via_file = check_json(zplan, *args, *extra)  # tp is not a DeepSpeed key: given again
    assert code_ds == code_job
    assert via_file["stages"] == direct["stages"] and via_file["node"] == direct["node"]
    assert via_file["layout"] == direct["layout"]


def test_megatron_round_trip(zplan, tmp_path):
    job = job_file(
        tmp_path,
        "{tp: 2, pp: 2, dp: 2, virtual_stages: 2, zero_stage: 1, sequence_parallel: true, "
        "recompute: selective, flash_attention: true, micro_batch: 1}",
        "{seq_len: 4096, global_batch: 16, train_tokens: 2e12, precision: megatron-bf16, optimizer: adam}",
    )
    out = tmp_path / "launch.sh"
    exported = zplan("export", "--format", "megatron", "--job", job, "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    text = out.read_text()
    assert "--num-layers-per-virtual-pipeline-stage 8" in text  # 32 layers / (pp 2 x 2 chunks)
    assert "--virtual-pipeline-model-parallel-size" not in text
    code_job, direct = check_json(zplan, job)
    code_mg, via_file = check_json(zplan, "--megatron-args", str(out), "--cluster", "dgx-a100")
    assert code_mg == code_job
    assert via_file["stages"] == direct["stages"] and via_file["node"] == direct["node"]
    assert via_file["layout"] == direct["layout"] and via_file["setup"] == direct["setup"]


def test_does_not_fit_round_trip_exit_1(zplan, tmp_path):
    job = job_file(tmp_path, "{dp: 8, zero_stage: 1, micro_batch: 1}",
                   "{seq_len: 4096, global_batch: 8, train_tokens: 2e12, precision: megatron-bf16}",
                   model="llama2-70b")  # ZeRO-1: 6 bytes x 69e9 unsharded = 414 GB per GPU
    out = tmp_path / "launch.sh"
    exported = zplan("export", "--format", "megatron", "--job", job, "-o", str(out))
    assert exported.returncode == 1 and out.exists()  # written, and the verdict says it overflows
    assert "DOES NOT FIT" in exported.stderr
    code_job, direct = check_json(zplan, job)
    code_mg, via_file = check_json(zplan, "--megatron-args", str(out), "--cluster", "dgx-a100")
    assert code_job == code_mg == 1
    assert via_file["overflows"] == direct["overflows"]


def test_torchrun_line(zplan):
    result = zplan("export", "--format", "torchrun", "--model", "llama2-7b", "--cluster", "dgx-a100x128",
                   "--tp", "8", "--pp", "4")
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout)
    # 1024 GPUs of 8-GPU nodes: 128 nodes x 8 processes
    assert words[:5] == ["torchrun", "--nnodes", "128", "--nproc-per-node", "8"]
    assert words[-1] == "train.py"


def test_best_layout_export_fits(zplan):
    result = zplan("export", "--format", "accelerate-fsdp", "--model", "llama2-7b", "--cluster", "dgx-a100",
                   "--precision", "bf16-mixed", "--seq-len", "4096")
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert config["fsdp_config"]["fsdp_version"] == 2 and config["num_processes"] == 8
    assert result.stderr.startswith("FITS:")


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("--format", "xml", "--model", "llama2-7b", "--cluster", "dgx-a100"), "--format: 'xml'"),
        (("--format", "deepspeed", "--model", "llama2-7b", "--cluster", "dgx-a100", "--recompute", "selective"),
         "selective has no DeepSpeed config key"),
        (("--format", "accelerate-fsdp", "--model", "llama2-7b", "--cluster", "dgx-a100", "--tp", "2",
          "--zero", "3"), "FSDP is data parallel only"),
        (("--format", "megatron", "--model", "bert-large", "--cluster", "dgx-a100", "--tp", "2"),
         "encoder models"),
    ],
)
def test_export_bad_input_exit_2(zplan, args, match):
    result = zplan("export", *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0] and "Traceback" not in result.stderr


def _setup(precision: str, batch: int = 8) -> TrainSetup:
    return TrainSetup(seq_len=2048, global_batch=batch, train_tokens=1e9, precision=get_precision(precision),
                      optimizer=get_optimizer("adamw"))


def test_fsdp_mapping():
    from planner.io.loading import load_cluster

    cluster = load_cluster("dgx-a100x128")
    zero2 = accelerate_fsdp_config(cluster, Layout(dp=16, zero_stage=2, micro_batch=1), _setup("zero-fp16", 16))
    assert zero2["fsdp_config"]["fsdp_reshard_after_forward"] is False  # SHARD_GRAD_OP ~ ZeRO-2
    assert (zero2["num_machines"], zero2["num_processes"], zero2["mixed_precision"]) == (2, 16, "fp16")
    offload = Layout(dp=8, zero_stage=3, offload_optimizer="cpu", offload_params="cpu", recompute="full")
    cfg = accelerate_fsdp_config(cluster, offload, _setup("bf16-mixed"))["fsdp_config"]
    assert cfg["fsdp_offload_params"] and cfg["fsdp_activation_checkpointing"] and cfg["fsdp_reshard_after_forward"]
    with pytest.raises(PlanInputError, match="offload both or neither"):
        accelerate_fsdp_config(cluster, Layout(dp=8, zero_stage=3, offload_optimizer="cpu"), _setup("bf16-mixed"))
    with pytest.raises(PlanInputError, match="ZeRO-2 or ZeRO-3"):
        accelerate_fsdp_config(cluster, Layout(dp=8, zero_stage=1), _setup("bf16-mixed"))
