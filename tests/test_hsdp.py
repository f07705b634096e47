"""HSDP (`Layout.dp_shard`, issue 10): states over the shard group, the collectives per level,
the rule, and the round trips through the CLI and accelerate's config files.

Every expected number is worked out here by hand from its inputs (the parameter count of
Llama 2 7B, the recipe's bytes per parameter, the profile's bandwidths and NCCL's latency
constants); the placement follows torch 2.13's 2-D mesh (replicate, shard), shard innermost.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from planner.cli.app import app
from planner.core import rules
from planner.core.columns import LayoutColumns
from planner.core.errors import PlanInputError
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout
from planner.memory.model_states import model_state_bytes
from planner.timing import collectives, sharded_dp

LLAMA2_7B_PARAMS = 6_738_415_616
"""Llama 2 7B's parameter count (the model preset; test_params checks it against transformers)."""

runner = CliRunner()


def _states(dp_shard, dp=128):
    layout = Layout(dp=dp, dp_shard=dp_shard, dp_engine="fsdp2", zero_stage=3)
    return model_state_bytes(LLAMA2_7B_PARAMS, get_precision("bf16-mixed"), get_optimizer("adam"),
                             layout)


def test_states_are_sharded_over_the_shard_group_not_dp():
    # bf16-mixed + Adam: 2 (bf16 param) + 2 (bf16 grad) + 12 (fp32 master, m, v) = 16 B/param;
    # ZeRO-3 splits all of it. 6,738,415,616 / 8 = 842,301,952 exactly; / 128 = 52,643,872.
    hsdp, full = _states(8), _states(None)
    assert hsdp.partition_numel == 842_301_952 and full.partition_numel == 52_643_872
    assert hsdp.gpu_total_bytes == 16 * 842_301_952 == 13_476_831_232
    assert full.gpu_total_bytes == 16 * 52_643_872 == 842_301_952
    assert (hsdp.params_bytes, hsdp.grads_bytes, hsdp.optimizer_bytes) == (
        2 * 842_301_952, 2 * 842_301_952, 12 * 842_301_952)
    # dp_shard = dp is the whole group: the same as None
    assert _states(128).gpu_total_bytes == full.gpu_total_bytes


def test_rule_mask_and_message():
    cols = LayoutColumns({"dp": np.array([128, 128, 128, 128, 128, 16]),
                          "dp_shard": np.array([0, 8, 6, 8, 8, 32]),
                          "dp_engine": np.array([0, 1, 1, 0, 1, 1]),
                          "zero_stage": np.array([3, 3, 3, 3, 1, 3])})
    ok, rejected = rules.mask(None, cols, rules.named(rules.DP_SHARD_RULE))
    # none; fsdp2 z3 8 | 128; 6 does not divide 128; deepspeed; ZeRO-1; 32 > 16
    assert ok.tolist() == [True, True, False, False, False, False]
    assert rejected == {rules.DP_SHARD_RULE: 4}
    with pytest.raises(PlanInputError) as err:
        rules.check_rules(None, cols, rules.named(rules.DP_SHARD_RULE), row=2)
    assert err.value.field == "dp_shard"
    assert "dp_shard=6 must divide dp=128" in str(err.value)
    with pytest.raises(PlanInputError) as err:
        rules.check_rules(None, cols, rules.named(rules.DP_SHARD_RULE), row=3)
    text = str(err.value)
    for factor in ("dp_shard=8", "dp=128", "dp_engine=deepspeed", "zero_stage=3", "mics_shard_size"):
        assert factor in text


def test_groups_placement_by_hand():
    # 8 dp ranks per node (8 GPUs, tp = 1): shard 8 = one node, 16 replicas one per node
    assert tuple(sharded_dp.hsdp_groups(128, 8, 8)) == (8, 1, 1, 16)
    # shard 4: two shard groups per node, so a replica group has 2 ranks on each of 16 nodes
    assert tuple(sharded_dp.hsdp_groups(128, 4, 8)) == (4, 1, 2, 16)
    # shard 16 spans 2 nodes; 8 replicas, one rank per node on 8 nodes
    assert tuple(sharded_dp.hsdp_groups(128, 16, 8)) == (8, 2, 1, 8)
    # tp = 2 on 8 GPUs: 4 dp ranks per node, shard 8 spans 2 nodes
    assert tuple(sharded_dp.hsdp_groups(64, 8, 4)) == (4, 2, 1, 8)


def test_collective_times_per_level_by_hand():
    # One Llama-2-7B block: 202,383,360 parameters (4 h^2 attention + 3 h f MLP + 2 h norms,
    # h = 4096, f = 11008), bf16: 404,766,720 bytes of parameters and of gradients.
    block = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert block == 202_383_360
    size = 2 * block
    intra, nic = 300e9, 25e9       # NVLink bytes/s per GPU, one NIC share per GPU (inputs)
    a_intra, a_inter = 3e-6, 10e-6  # per-step latencies (inputs)
    base = collectives.NCCL_BASE_LATENCY_S["ring"]  # 8.4 us, NCCL tuning.cc
    # level 1: all-gather over the shard group (8 GPUs in one node): 7 steps at NVLink latency,
    # 7/8 of the unit's bytes per GPU over NVLink
    gather = collectives.flat_ring_s("all_gather", size, 8, 1, intra, a_intra, nic, a_inter)
    assert float(gather) == pytest.approx(base + 7 * a_intra + 7 / 8 * size / intra, rel=1e-12)
    # level 2: the replica all-reduce of the 1/8 shard over 16 replicas, one per node
    groups = sharded_dp.hsdp_groups(128, 8, 8)
    assert float(sharded_dp.replica_all_reduce_bytes(size, 8)) == size / 8 == 50_595_840
    t = sharded_dp.replica_all_reduce_layer_s(size, 8, groups, intra, a_intra, nic, a_inter)
    shard = size / 8
    ring = base + 2 * 15 * a_inter + 2 * 15 / 16 * shard / min(intra, 1 * nic)
    tree = (collectives.NCCL_BASE_LATENCY_S["tree"] + 2 * (0 * a_intra + math.ceil(math.log2(16))
                                                             * a_inter)
            + 2 * 15 / 16 * shard / (min(intra, nic) * 0.92))
    assert float(t) == pytest.approx(min(ring, tree), rel=1e-12)
    # ring: 8.4 us + 30 x 10 us + 1.875 x 50,595,840 B / 25e9 B/s = 0.3084 ms + 3.794688 ms;
    # tree: 8.4 us + 80 us + 94,867,200 B / 23e9 B/s = 4.2130 ms: NCCL takes the ring
    assert ring == pytest.approx(4.103088e-3, rel=1e-9)
    assert float(t) == pytest.approx(ring, rel=1e-12)
    # one replica: nothing to all-reduce
    one = sharded_dp.hsdp_groups(8, 8, 8)
    assert float(sharded_dp.replica_all_reduce_layer_s(size, 8, one, intra, a_intra, nic,
                                                       a_inter)) == 0.0


def test_fsdp2_step_feeds_the_replica_all_reduce_every_reducing_micro_batch():
    # no compute: the step is the sum of the communication; per layer a = 1, r = 2, ar = 3;
    # 4 layers, 2 micro-batches, reshard_after_forward: per micro-batch 4 (a) forward +
    # 4 (a + r + ar) backward = 4 + 24 = 28, x 2 = 56
    t = sharded_dp.fsdp2_step(1.0, 2.0, 0.0, 0.0, 4, 2, replica_all_reduce_layer_s=3.0)
    assert float(t.step_s) == 56.0 and float(t.total_s) == 56.0
    # set_requires_gradient_sync(False) on the first: its backward only re-gathers (4):
    # 2 x 4 forward + 4 + 24 = 36
    t = sharded_dp.fsdp2_step(1.0, 2.0, 0.0, 0.0, 4, 2, reduce_every_micro_batch=False,
                              replica_all_reduce_layer_s=3.0)
    assert float(t.step_s) == 36.0


def _fit(*extra):
    return runner.invoke(app, ["fit", "-m", "llama2-7b", "--gpus", "128", "--gpu", "a100-80gb",
                               "--dp-engine", "fsdp2", "--zero", "3", "--micro-batch", "1",
                               "--global-batch", "128", "--seq-len", "4096", *extra])


def test_fit_shows_the_mesh_and_bad_values_exit_2():
    ok = _fit("--dp-shard", "8")
    assert ok.exit_code == 0, ok.output
    assert "dp_shard=8 (HSDP 16x8)" in ok.output
    bad = _fit("--dp-shard", "6")
    assert bad.exit_code == 2
    assert "dp_shard=6 must divide dp=128" in bad.output and "Traceback" not in bad.output


def _hsdp_job(tmp_path: Path, setup: str) -> Path:
    """Llama 2 7B on 128 A100 as dp 128 with 8-GPU shard groups (FSDP2, ZeRO-3), `setup` added."""
    job = tmp_path / "job.yaml"
    job.write_text("model: llama2-7b\ncluster: {gpu: a100-80gb, gpus: 128}\n"
                   "layout: {dp: 128, dp_shard: 8, dp_engine: fsdp2, zero_stage: 3, micro_batch: 1}\n"
                   f"setup: {{seq_len: 4096, global_batch: 128, train_tokens: 1e9, {setup}}}\n")
    return job


def test_round_trips_job_file_and_export_to_check(tmp_path: Path):
    job = _hsdp_job(tmp_path, "precision: bf16-mixed")
    checked = runner.invoke(app, ["check", str(job)])
    assert checked.exit_code == 0, checked.output
    assert "dp128 dp_shard8 zero3 fsdp2" in checked.output
    out = tmp_path / "acc.yaml"
    exported = runner.invoke(app, ["export", "-f", "accelerate-fsdp", "--job", str(job), "-o", str(out)])
    assert exported.exit_code == 0, exported.output
    text = out.read_text()
    assert "parallelism_config_dp_replicate_size: 16" in text
    assert "parallelism_config_dp_shard_size: 8" in text
    back = runner.invoke(app, ["check", "--accelerate-config", str(out), "-m", "llama2-7b",
                               "--gpu", "a100-80gb", "--micro-batch", "1", "--seq-len", "4096"])
    assert back.exit_code in (0, 1), back.output
    assert "dp128 dp_shard8 zero3 fsdp2" in back.output
    # DeepSpeed cannot write it: one line, exit 2, nothing written
    ds = tmp_path / "ds.json"
    refused = runner.invoke(app, ["export", "-f", "deepspeed", "--job", str(job), "-o", str(ds)])
    assert refused.exit_code == 2 and not ds.exists()


def test_accelerate_fsdp1_hybrid_shard_is_read_with_the_node_as_shard_group(tmp_path: Path):
    from accelerate.commands.config.config_args import ClusterConfig

    from planner.io.check import check_accelerate
    from planner.io.loading import load_cluster, load_model

    path = tmp_path / "acc.yaml"
    ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="FSDP",
                  mixed_precision="bf16", use_cpu=False, debug=False, num_processes=32,
                  num_machines=4, fsdp_config={"fsdp_version": 1,
                                               "fsdp_sharding_strategy": "HYBRID_SHARD"}
                  ).to_yaml_file(str(path))
    result = check_accelerate(path, load_model("llama2-7b"), load_cluster("dgx-h100x32"),
                              num_gpus=None, seq_len=4096, tokens=1e9, optimizer="adamw",
                              micro_batch=1)
    lay = result.layout
    # 32 processes on 4 machines: 8 per machine shard, 4 replicas
    assert (lay.dp, lay.dp_shard, lay.dp_engine, lay.zero_stage) == (32, 8, "fsdp2", 3)
    path2 = tmp_path / "acc2.yaml"
    ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="FSDP",
                  mixed_precision="bf16", use_cpu=False, debug=False, num_processes=32,
                  num_machines=4, fsdp_config={"fsdp_version": 1, "fsdp_sharding_strategy": 5}
                  ).to_yaml_file(str(path2))
    lay = check_accelerate(path2, load_model("llama2-7b"), load_cluster("dgx-h100x32"),
                           num_gpus=None, seq_len=4096, tokens=1e9, optimizer="adamw",
                           micro_batch=1).layout
    assert (lay.dp_shard, lay.zero_stage) == (8, 2)  # HYBRID_SHARD_ZERO2 = SHARD_GRAD_OP per node


def test_accelerate_export_of_an_autocast_plan_reads_back_with_the_same_memory(tmp_path: Path):
    """accelerate's `mixed_precision: bf16` for FSDP is fp32 parameters under torch.autocast,
    the autocast-bf16 recipe (planner/io/accelerate_config.py). Exporting an autocast-bf16 plan
    and checking the file must give the same recipe, layout and peak (the same printed line); the
    plan names transformers' SDPA blocks, which the accelerate reader assumes."""
    job = _hsdp_job(tmp_path, "precision: autocast-bf16, implementation: hf-sdpa")
    checked = runner.invoke(app, ["check", str(job)])
    assert checked.exit_code == 0, checked.output
    out = tmp_path / "acc.yaml"
    exported = runner.invoke(app, ["export", "-f", "accelerate-fsdp", "--job", str(job), "-o", str(out)])
    assert exported.exit_code == 0, exported.output
    assert "mixed_precision: bf16" in out.read_text()
    back = runner.invoke(app, ["check", "--accelerate-config", str(out), "-m", "llama2-7b",
                               "--gpu", "a100-80gb", "--micro-batch", "1", "--seq-len", "4096"])
    assert back.exit_code == 0, back.output
    verdict = [line for line in checked.output.splitlines() if line.startswith("FITS")]
    assert verdict and verdict[0] in back.output
    assert "autocast-bf16" in verdict[0]
