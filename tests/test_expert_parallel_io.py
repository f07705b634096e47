"""Expert parallelism through the inputs and outputs: Megatron flags, DeepSpeed AutoEP, CLI."""

from __future__ import annotations

import json

import pytest

from planner.core.errors import PlanInputError
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout, TrainSetup
from planner.io.deepspeed import deepspeed_config, layout_from_deepspeed
from planner.io.engines import supported_engines
from planner.io.loading import load_model
from planner.io.megatron import job_from_megatron, megatron_flags, parse_megatron_args

MIXTRAL = load_model("mixtral-8x7b")

# Megatron-LM flags of a Mixtral-shaped MoE run (arguments.py spellings, commit d98e8a64)
LAUNCH = r"""
torchrun --nproc_per_node 8 --nnodes 4 pretrain_gpt.py \
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 14336 \
    --group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 32768 \
    --position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear \
    --untie-embeddings-and-output-weights --vocab-size 32000 --make-vocab-size-divisible-by 1 \
    --num-experts 8 --moe-router-topk 2 \
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 {ep} \
    --micro-batch-size 1 --global-batch-size 64 --train-iters 10 --bf16 --use-distributed-optimizer
"""


def _setup(**kw):
    return TrainSetup(seq_len=4096, global_batch=64, train_tokens=1e9,
                      precision=get_precision("megatron-bf16"), optimizer=get_optimizer("adam"), **kw)


def test_megatron_import_reads_ep():
    job = job_from_megatron(*parse_megatron_args(LAUNCH.format(ep="--expert-model-parallel-size 4")), None)
    assert (job.layout.tp, job.layout.pp, job.layout.dp, job.layout.ep) == (2, 2, 8, 4)


def test_megatron_import_refuses_other_expert_tp():
    text = LAUNCH.format(ep="--expert-model-parallel-size 4 --expert-tensor-parallel-size 1")
    with pytest.raises(PlanInputError) as err:
        job_from_megatron(*parse_megatron_args(text), None)
    assert err.value.field == "--expert-tensor-parallel-size"


def test_megatron_import_accepts_expert_tp_equal_to_tp():
    text = LAUNCH.format(ep="--expert-model-parallel-size 4 --expert-tensor-parallel-size 2")
    assert job_from_megatron(*parse_megatron_args(text), None).layout.ep == 4


def test_megatron_export_round_trip():
    layout = Layout(tp=2, pp=2, dp=8, ep=4, zero_stage=1, grad_accum=8)
    flags = megatron_flags(MIXTRAL, layout, _setup(moe_capacity_factor=1.25))
    i = flags.index("--expert-model-parallel-size")
    assert flags[i + 1] == "4"
    j = flags.index("--moe-expert-capacity-factor")
    assert flags[j + 1] == "1.25" and "--moe-pad-expert-input-to-capacity" in flags
    assert "--expert-model-parallel-size" not in megatron_flags(MIXTRAL, layout.model_copy(update={"ep": 1}), _setup())


def test_deepspeed_autoep_round_trip():
    layout = Layout(dp=32, ep=8, zero_stage=2, grad_accum=2)
    config = deepspeed_config(MIXTRAL, layout, _setup())
    assert config["expert_parallel"] == {"enabled": True, "autoep_size": 8}
    back = layout_from_deepspeed(json.loads(json.dumps(config)), num_gpus=32)
    assert back.layout.ep == 8
    assert "expert_parallel" not in deepspeed_config(MIXTRAL, layout.model_copy(update={"ep": 1}), _setup())


def test_engines_for_ep():
    layout = Layout(dp=32, ep=8, zero_stage=2, grad_accum=2)
    engines = supported_engines(MIXTRAL, layout, get_precision("megatron-bf16"))
    assert "accelerate" not in engines and "deepspeed" in engines


def test_cli_fit_ep(zplan):
    ok = zplan("fit", "-m", "mixtral-8x7b", "-c", "dgx-h100x32", "--tp", "2", "--pp", "4", "--ep", "8",
               "--zero", "1", "--precision", "megatron-bf16", "--seq-len", "4096")
    assert ok.returncode == 0, ok.stderr
    assert "ep=8" in ok.stdout and "expert all-to-all" in ok.stdout
    bad = zplan("fit", "-m", "mixtral-8x7b", "-c", "dgx-h100x32", "--ep", "3")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "ep=3 must divide num_experts=8" in bad.stderr


def test_cli_job_file_ep(zplan, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("model: mixtral-8x7b\ncluster: dgx-h100x32\n"
                   "layout: {tp: 2, pp: 4, dp: 32, ep: 8, zero_stage: 1}\n"
                   "setup: {seq_len: 4096, global_batch: 256, train_tokens: 1e12, "
                   "precision: megatron-bf16, moe_load_imbalance: 1.3}\n")
    out = zplan("check", str(job), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["layout"]["ep"] == 8
