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
