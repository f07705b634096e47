"""`--megatron-overlap` on fit, export, sweep and in job files: shown, written, refused (exit 2)."""

from __future__ import annotations

import json

FIT = ("fit", "--model", "gpt3-13b", "--gpu", "h100-sxm", "--gpus", "32", "--tp", "4",
       "--zero", "1", "--global-batch", "64")


def test_fit_shows_the_overlaps(zplan):
    proc = zplan(*FIT, "--sequence-parallel", "--megatron-overlap", "tp_comm,grad_reduce,param_gather")
    assert proc.returncode == 0, proc.stderr
    assert "megatron_overlap=tp_comm,grad_reduce,param_gather" in proc.stdout
    none = zplan(*FIT, "--megatron-overlap", "none")
    assert none.returncode == 0 and "megatron_overlap=none" in none.stdout


def test_bad_values_exit_2_with_one_line(zplan):
    for extra, text in ((("--megatron-overlap", "everything"), "'everything': allowed tp_comm"),
                        (("--megatron-overlap", "tp_comm"), "needs sequence_parallel"),
                        (("--zero", "0", "--megatron-overlap", "grad_reduce,param_gather"),
                         "needs zero_stage 1")):
        proc = zplan(*FIT, *extra)
        assert proc.returncode == 2, (extra, proc.stderr)
        assert text in proc.stderr and "Traceback" not in proc.stderr
        assert proc.stdout == ""


def test_export_writes_the_flags_and_refuses_other_formats(zplan):
    args = ("export", "--model", "gpt3-13b", "--gpu", "h100-sxm", "--gpus", "32", "--tp", "4",
            "--zero", "1", "--sequence-parallel", "--global-batch", "64",
            "--megatron-overlap", "tp_comm,grad_reduce")
    proc = zplan(*args, "--format", "megatron")
    assert proc.returncode == 0, proc.stderr
    assert "--tp-comm-overlap" in proc.stdout and "--overlap-grad-reduce" in proc.stdout
    assert "--overlap-param-gather" not in proc.stdout
    refused = zplan(*args, "--format", "deepspeed")
    assert refused.returncode == 2 and "use --format megatron" in refused.stderr


def test_job_file_key(zplan, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: gpt3-13b\ncluster: {gpu: h100-sxm, gpus: 32}\n"
                   "layout: {tp: 4, dp: 8, zero_stage: 1, sequence_parallel: true, "
                   "megatron_overlap: [tp_comm, grad_reduce]}\n"
                   "setup: {seq_len: 2048, global_batch: 64, train_tokens: 1e9, "
                   "precision: megatron-bf16, optimizer: adam}\n")
    proc = zplan("check", str(job), "--json")
    assert proc.returncode in (0, 1), proc.stderr
    assert json.loads(proc.stdout)["layout"]["megatron_overlap"] == ["tp_comm", "grad_reduce"]
    job.write_text(job.read_text().replace("[tp_comm, grad_reduce]", "[tp_comm, always]"))
    bad = zplan("check", str(job))
    assert bad.returncode == 2 and "megatron_overlap" in bad.stderr


def test_sweep_pin(zplan):
    proc = zplan("sweep", "--model", "gpt3-13b", "--gpu", "h100-sxm", "--gpus", "32",
                 "--global-batch", "64", "--top", "2", "--json",
                 "--megatron-overlap", "grad_reduce,param_gather")
    assert proc.returncode == 0, proc.stderr
    for row in json.loads(proc.stdout)["results"][0]["top"]:
        assert row["layout"]["megatron_overlap"] == ["grad_reduce", "param_gather"]
        assert row["layout"]["zero_stage"] == 1
    bad = zplan("sweep", "--model", "gpt3-13b", "--gpu", "h100-sxm", "--gpus", "32",
                "--zero", "3", "--megatron-overlap", "grad_reduce")
    assert bad.returncode == 2 and "zero 0/1" in bad.stderr
