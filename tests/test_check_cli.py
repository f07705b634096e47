"""`zplan check` through the CLI: job files, DeepSpeed configs, Megatron-LM launch lines.

Exit 0 fits / 1 does not fit / 2 bad input, one verdict or error line on stderr, JSON on stdout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

LLAMA2_7B_PARAMS = 6_738_415_616  # Llama-2-7b-hf safetensors total (tests/test_io_hf_config.py)

FITS_JOB = """\
model: llama2-7b
cluster: dgx-a100
layout: {tp: 1, pp: 1, dp: 8, zero_stage: 3, micro_batch: 1, recompute: full}
setup: {seq_len: 4096, global_batch: 64, train_tokens: 2e12, precision: bf16-mixed, optimizer: adamw}
"""
# ZeRO-3 over 8 GPUs: 16 bytes x 6.74e9 / 8 = 13.5 GB of model states per GPU, and full recompute
# keeps 2*s*b*h bytes per layer (32 x 2 x 4096 x 4096 = 1.07 GB): far below 80 GiB.

NO_FIT_JOB = """\
model: llama2-70b
cluster: dgx-a100
layout: {tp: 1, pp: 1, dp: 8, zero_stage: 0, micro_batch: 1}
setup: {seq_len: 4096, global_batch: 8, train_tokens: 2e12, precision: zero-fp16}
"""
# DDP keeps all 16 bytes x ~69e9 parameters on every GPU: ~1.1 TB > 80 GiB.


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_job_fits_exit_0(zplan, tmp_path):
    result = zplan("check", write(tmp_path, "job.yaml", FITS_JOB))
    assert result.returncode == 0, result.stderr
    assert one_line(result.stdout).startswith("FITS: llama2-7b on 8 x a100-80gb")
    assert result.stderr == ""


def test_job_does_not_fit_exit_1(zplan, tmp_path):
    result = zplan("check", write(tmp_path, "job.yaml", NO_FIT_JOB))
    assert result.returncode == 1, result.stderr
    line = one_line(result.stdout)
    assert line.startswith("DOES NOT FIT: llama2-70b") and "GPU memory on stage 1 by" in line


def test_json_schema(zplan, tmp_path):
    result = zplan("check", write(tmp_path, "job.yaml", FITS_JOB), "--json")
    assert result.returncode == 0
    doc = json.loads(result.stdout)
    assert doc["kind"] == "check" and doc["schema_version"] == 1 and doc["fits"] is True
    assert doc["source"] == "job" and doc["num_gpus"] == 8
    assert doc["layout"]["zero_stage"] == 3 and doc["setup"]["precision"] == "bf16-mixed"
    stage = doc["stages"][0]
    states = stage["params_bytes"] + stage["grads_bytes"] + stage["optimizer_bytes"]
    # ZeRO-3, 16 bytes/param over dp=8 (ZeRO paper, seed 001 §2: (4+K)Φ/Nd); DeepSpeed pads
    # partitions, so compare to 0.01 %
    assert states == pytest.approx(16 * LLAMA2_7B_PARAMS / 8, rel=1e-4)
    assert doc["headroom_bytes"] == doc["gpu_capacity_bytes"] - doc["peak_gpu_bytes"]
    assert set(doc) >= {"verdict", "overflows", "node", "notes", "peak_stage", "cluster", "model"}


DS_ZERO3 = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
            "zero_optimization": {"stage": 3}, "activation_checkpointing": {}}


def test_deepspeed_same_verdict_and_bytes_as_the_job(zplan, tmp_path):
    ds = write(tmp_path, "ds.json", json.dumps(DS_ZERO3))
    from_ds = zplan("check", "--deepspeed", ds, "--model", "llama2-7b", "--cluster", "dgx-a100",
                    "--seq-len", "4096", "--tokens", "2e12", "--optimizer", "adamw", "--json")
    from_job = zplan("check", write(tmp_path, "job.yaml", FITS_JOB), "--json")
    assert from_ds.returncode == from_job.returncode == 0, from_ds.stderr
    a, b = json.loads(from_ds.stdout), json.loads(from_job.stdout)
    assert a["stages"] == b["stages"] and a["node"] == b["node"]
    assert a["notes"] == ["activation_checkpointing section present: recompute=full assumed"]


def test_deepspeed_smaller_buckets_need_less_memory(zplan, tmp_path):
    # the same ZeRO-3 job with reduce_bucket_size 1e8 and stage3_max_live_parameters 2e8 instead of
    # DeepSpeed's 5e8 and 1e9 (bf16, 2 bytes per element; Llama-2-7B holds more than 1e9 parameters
    # on its one stage, and its largest tensor, 32000 x 4096 = 131,072,000, is below 2e8):
    # reduce bucket (5e8 - 1e8) x 2 + gathered parameters (1e9 - 2e8) x 2 = 2.4e9 bytes less
    small = dict(DS_ZERO3, zero_optimization={"stage": 3, "reduce_bucket_size": 1e8,
                                              "stage3_max_live_parameters": 2e8})
    runs = []
    for name, config in (("default.json", DS_ZERO3), ("small.json", small)):
        ds = write(tmp_path, name, json.dumps(config))
        result = zplan("check", "--deepspeed", ds, "--model", "llama2-7b", "--cluster", "dgx-a100",
                       "--seq-len", "4096", "--tokens", "2e12", "--optimizer", "adamw", "--json")
        assert result.returncode == 0, result.stderr  # both fit: exit 0
        runs.append(json.loads(result.stdout))
    default, tuned = runs
    assert tuned["stages"][0]["buffers"]["zero_reduce_bucket"] == 100_000_000 * 2
    assert tuned["stages"][0]["buffers"]["zero3_gathered_params"] == 200_000_000 * 2
    assert default["peak_gpu_bytes"] - tuned["peak_gpu_bytes"] == (4e8 + 8e8) * 2
    assert tuned["notes"] == default["notes"]  # no "defaults used" note any more


def test_deepspeed_auto_names_the_missing_flag(zplan, tmp_path):
    hf = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"},
          "zero_optimization": {"stage": 2}}
    ds = write(tmp_path, "ds.json", json.dumps(hf))
    result = zplan("check", "--deepspeed", ds, "--model", "llama2-7b", "--cluster", "dgx-a100",
                   "--precision", "bf16-mixed")
    assert result.returncode == 2
    assert "give --micro-batch" in one_line(result.stderr)
    ok = zplan("check", "--deepspeed", ds, "--model", "llama2-7b", "--cluster", "dgx-a100",
               "--precision", "bf16-mixed", "--micro-batch", "1", "--grad-accum", "1", "--json")
    assert json.loads(ok.stdout)["setup"]["global_batch"] == 8  # 1 x 1 x 8 GPUs


MEGATRON_LINE = r"""torchrun --nproc-per-node 8 --nnodes 1 pretrain_gpt.py \
  --tensor-model-parallel-size 8 --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \
  --ffn-hidden-size 11008 --swiglu --normalization RMSNorm --position-embedding-type rope \
  --untie-embeddings-and-output-weights --disable-bias-linear --seq-length 4096 \
  --max-position-embeddings 4096 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 --bf16
"""


def test_megatron_line(zplan, tmp_path):
    result = zplan("check", "--megatron-args", write(tmp_path, "llama.sh", MEGATRON_LINE),
                   "--cluster", "dgx-a100", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["source"] == "megatron" and doc["layout"]["tp"] == 8 and doc["layout"]["grad_accum"] == 8
    assert doc["setup"]["precision"] == "megatron-bf16"


def test_a_launch_line_larger_than_the_cluster_says_how_it_was_checked(zplan, tmp_path):
    # 2 nodes x 8 processes on dgx-a100 (one 8-GPU node): checked on 16 GPUs, two such nodes;
    # the note said "16 of the 8 GPUs of dgx-a100" before
    line = MEGATRON_LINE.replace("--nnodes 1", "--nnodes 2").replace("--global-batch-size 8",
                                                                     "--global-batch-size 16")
    result = zplan("check", "--megatron-args", write(tmp_path, "llama.sh", line), "--cluster", "dgx-a100")
    assert result.returncode == 0, result.stderr
    assert "checked on 16 GPUs, 2 nodes like those of dgx-a100" in result.stderr
    small = zplan("check", "--megatron-args", write(tmp_path, "llama.sh", MEGATRON_LINE), "--cluster",
                  "dgx-a100x128")
    assert "checked on 8 of the 1024 GPUs of dgx-a100x128" in small.stderr


@pytest.mark.parametrize(
    ("args", "files", "match"),
    [
        ((), {}, "give exactly one of JOB"),
        (("--deepspeed", "{d}/ds.json", "--model", "llama2-7b", "--cluster", "dgx-a100"),
         {"ds.json": '{"train_batch_size": 8, "zero_optimization": {"stage": 3,}}'}, "malformed JSON at line 1"),
        (("--deepspeed", "{d}/ds.json", "--model", "llama2-7b", "--cluster", "dgx-a100"),
         {"ds.json": '{"train_batch_size": 8, "zero_optimization": {"stage": 5}}'}, "zero_optimization.stage: 5"),
        (("--deepspeed", "{d}/ds.json", "--cluster", "dgx-a100"), {"ds.json": "{}"}, "needs --model"),
        (("--megatron-args", "{d}/m.sh", "--cluster", "dgx-a100"),
         {"m.sh": MEGATRON_LINE.replace("--bf16", "--bf16 --context-parallel-size 2 --cp-comm-type allgather")},
         "--cp-comm-type: 'allgather': only p2p (ring) and a2a are modelled"),
        (("{d}/job.yaml",), {"job.yaml": "model: llama2-7b\ncluster: [oops\n"}, "malformed YAML"),
        (("--deepspeed", "{d}/ds.json", "--model", "{d}/config.json", "--cluster", "dgx-a100"),
         {"ds.json": '{"train_batch_size": 8}', "config.json": '{"model_type": "t5", "d_model": 512}'},
         "model_type: 't5' is not supported"),
        (("{d}/job.yaml", "--tp", "2"), {"job.yaml": FITS_JOB}, "drop --tp"),
    ],
)
def test_bad_input_exit_2(zplan, tmp_path, args, files, match):
    for name, text in files.items():
        write(tmp_path, name, text)
    result = zplan("check", *(a.format(d=tmp_path) for a in args))
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert line.startswith("zplan: error:") and match in line
    assert result.stdout == ""


def test_hf_config_as_the_model(zplan, tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({  # the published config.json's size keys
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False}))
    ds = write(tmp_path, "ds.json", json.dumps(DS_ZERO3))
    result = zplan("check", "--deepspeed", ds, "--model", str(folder / "config.json"), "--cluster", "dgx-a100",
                   "--seq-len", "8192", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["model"] == "Meta-Llama-3-8B"
    # tp = pp = 1: the one stage holds the whole model, 8,030,261,248 (Meta-Llama-3-8B safetensors total)
    assert doc["stages"][0]["num_params"] == 8_030_261_248
