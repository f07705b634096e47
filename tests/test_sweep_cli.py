"""`zplan sweep` through the CLI: exit codes 0 / 1 / 2, JSON and CSV."""

from __future__ import annotations

import csv
import io
import json

BASE = ("sweep", "--model", "gpt3-13b", "--gpu", "a100-80gb", "--global-batch", "512")


def test_json_ranked_layouts(zplan):
    proc = zplan(*BASE, "--gpus", "64,128", "--top", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "sweep"
    assert [r["num_gpus"] for r in doc["results"]] == [64, 128]
    for result in doc["results"]:
        assert len(result["top"]) == 3
        steps = [row["estimate"]["step_s"] for row in result["top"]]
        assert steps == sorted(steps)
        for row in result["top"]:
            lay = row["layout"]
            assert lay["tp"] * lay["pp"] * lay["dp"] == result["num_gpus"]
            assert lay["micro_batch"] * lay["grad_accum"] * lay["dp"] == 512
            assert row["fits"] and row["headroom_bytes"] >= 0
        for row in result["rejected"]:
            assert not row["fits"] and row["reason"]


def test_human_tables_on_stdout(zplan):
    proc = zplan(*BASE, "--gpus", "64", "--tp", "8", "--zero", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "layouts evaluated" in proc.stdout
    assert "rejected because" in proc.stdout


def test_ranked_by_gpu_hours_the_table_shows_them(zplan):
    # the table shows days, or GPU-hours when they rank (the sort key's column is the one shown)
    args = (*BASE, "--gpus", "64", "--top", "2", "--rejected", "0")
    days, hours = zplan(*args), zplan(*args, "--sort", "gpu-hours")
    best = json.loads(zplan(*args, "--sort", "gpu-hours", "--json").stdout)["results"][0]["top"][0]
    assert " days " in days.stdout and "GPU-h" not in days.stdout
    assert "GPU-h" in hours.stdout and f"{best['estimate']['gpu_hours']:,.0f}" in hours.stdout


def test_csv_has_every_column(zplan):
    proc = zplan(*BASE, "--gpus", "64", "--top", "2", "--rejected", "1", "--csv", "-")
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert len(rows) == 3
    for column in ("tp", "zero_stage", "micro_batch", "step_s", "mfu", "dp_comm_exposed_s",
                   "gpu_peak_bytes", "node_cpu_bytes", "reason", "fits"):
        assert column in rows[0]


def test_nothing_fits_exits_1_with_the_reason(zplan):
    proc = zplan("sweep", "--model", "gpt3-175b", "--cluster", "rtx4090-x8",
                 "--global-batch", "64", "--no-offload")
    assert proc.returncode == 1, proc.stderr
    assert "no layout fits" in proc.stdout and "GPU memory rules out" in proc.stdout


def test_impossible_constraint_is_named(zplan):
    proc = zplan(*BASE, "--gpus", "64", "--tp", "16")
    assert proc.returncode == 1
    assert "tp=(16,)" in proc.stdout


def test_bad_input_exits_2(zplan):
    for extra in (("--gpus", "64", "--sort", "fastest"), ("--gpus", "lots"),
                  ("--gpus", "64", "--tp", "eight"), ("--gpus", "64", "--recompute", "some")):
        proc = zplan(*BASE, *extra)
        assert proc.returncode == 2, (extra, proc.stderr)
        assert proc.stderr.startswith("zplan: error:") and "Traceback" not in proc.stderr
        assert proc.stdout == ""


PINNED = ("--gpus", "64", "--tp", "8", "--pp", "1", "--cp", "1", "--micro-batch", "1", "--recompute", "full", "--dp-engine", "deepspeed",
          "--no-offload", "--no-sequence-parallel")
DS_BUCKETS = {"train_batch_size": 512, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 2, "reduce_bucket_size": 200_000_000,
                                    "allgather_bucket_size": 300_000_000}}


def test_excluded_rules_rendered_in_json_and_table(zplan):
    # tp 8, pp 1 on 64 GPUs: dp = 8; micro-batches enumerated 1, 2, 4, ..., 512 (10 values);
    # grad_accum = 512 / (8 b) is whole for b <= 64 only, so the batch rule removes exactly
    # b = 128, 256, 512: 3 combinations; ZeRO-0 with the DeepSpeed engine (FSDP2 has no ZeRO-0),
    # no offload, no sequence parallel are pinned, so no other rule removes anything.
    args = (*BASE, "--gpus", "64", "--tp", "8", "--pp", "1", "--cp", "1", "--zero", "0",
            "--dp-engine", "deepspeed",
            "--recompute", "full",
            "--no-offload", "--no-sequence-parallel")
    doc = json.loads(zplan(*args, "--json").stdout)
    excluded = doc["results"][0]["excluded"]
    assert list(excluded.values()) == [3], excluded
    (rule,) = excluded
    assert "global batch" in rule
    table = zplan(*args).stdout
    assert f"excluded by layout rules: {rule} 3" in " ".join(table.split())


def test_deepspeed_buckets_reach_the_sweep(zplan, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(DS_BUCKETS))
    with_ds = json.loads(zplan(*BASE, *PINNED, "--zero", "2", "--json", "--deepspeed-buckets", str(ds)).stdout)
    default = json.loads(zplan(*BASE, *PINNED, "--zero", "2", "--json").stdout)
    (row,) = with_ds["results"][0]["top"]
    (row_default,) = default["results"][0]["top"]
    assert row["layout"]["buffers"]["reduce_bucket_elements"] == 200_000_000
    assert row["layout"]["buffers"]["allgather_bucket_elements"] == 300_000_000
    # ZeRO-2 allocates the reduce bucket whole in the 16-bit dtype (DeepSpeed stage_1_and_2.py
    # setup_buckets); the all-gather bucket allocates nothing. Default 5e8 -> 2e8 elements, bf16:
    # (500,000,000 - 200,000,000) x 2 bytes = 600,000,000 bytes less on the GPU.
    assert row_default["gpu_peak_bytes"] - row["gpu_peak_bytes"] == 600_000_000
    # the same layout from the same config through `check --deepspeed` (issue 9: the config's
    # buckets reached fit/check but not the sweep): the same bytes
    check = json.loads(zplan("check", "--deepspeed", str(ds), "--model", "gpt3-13b", "--gpu",
                             "a100-80gb", "--gpus", "64", "--tp", "8", "--pp", "1",
                             "--recompute", "full", "--json").stdout)
    assert check["layout"] == row["layout"]
    assert check["peak_gpu_bytes"] == row["gpu_peak_bytes"]


def test_deepspeed_bad_config_exits_2(zplan, tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": -5}}))
    proc = zplan(*BASE, *PINNED, "--json", "--deepspeed-buckets", str(ds))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("zplan: error:") and "reduce_bucket_size" in proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr


def test_progress_bar_on_stderr_only_when_asked(zplan):
    args = (*BASE, "--gpus", "64-128", "--tp", "8", "--top", "1", "--json")
    quiet = zplan(*args)
    assert quiet.returncode == 0 and quiet.stderr == ""  # stderr is a pipe: no bar
    shown = zplan(*args, "--progress")
    assert shown.returncode == 0, shown.stderr
    assert "128 GPUs, batch 512" in shown.stderr and "100%" in shown.stderr


    def without_seconds(stdout: str) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads(stdout)["results"]]

    assert without_seconds(shown.stdout) == without_seconds(quiet.stdout)  # stdout untouched
