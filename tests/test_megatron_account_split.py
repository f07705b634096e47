"""Megatron's --account-for-embedding/-loss-in-pipeline-split read as first/last stage layer counts.

Megatron-LM d98e8a64 megatron/core/transformer/transformer_block.py get_num_layers_to_build: the
L layers plus one for the embedding (plus one for the loss) are split evenly over pp ranks and the
first (last) rank builds one block fewer; transformer_config.py refuses these flags together with
num_layers_in_first/last_pipeline_stage and asserts (L+1[+1]) % pp == 0."""
import pytest

from planner.core.errors import PlanInputError
from planner.io.megatron import job_from_megatron, parse_megatron_args

LINE = ("--num-layers 30 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
        "--max-position-embeddings 2048 --vocab-size 51200 --micro-batch-size 1 "
        "--global-batch-size 64 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --bf16 ")


def _job(extra: str):
    return job_from_megatron(*parse_megatron_args(LINE + extra), num_gpus=32)


def test_both_flags_equal_the_explicit_first_last_line():
    # (30 + 1 + 1) / 4 = 8 per rank; first 8 - 1 = 7, last 8 - 1 = 7, middle (30 - 14) / 2 = 8
    job = _job("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split")
    explicit = _job("--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 7")
    assert (job.layout.first_stage_layers, job.layout.last_stage_layers) == (7, 7)
    assert job == explicit  # same model, layout and setup, so the same memory and step


def test_embedding_only_is_first_stage_only():
    # 31 layers + 1 = 32 / 4 = 8: first rank 7, the other three 8 each (7 + 3 * 8 = 31)
    text = LINE.replace("--num-layers 30", "--num-layers 31")
    job = job_from_megatron(*parse_megatron_args(text + "--account-for-embedding-in-pipeline-split"), num_gpus=32)
    explicit = job_from_megatron(*parse_megatron_args(text + "--decoder-first-pipeline-num-layers 7"), num_gpus=32)
    assert (job.layout.first_stage_layers, job.layout.last_stage_layers) == (7, None)
    assert job.layout == explicit.layout


@pytest.mark.parametrize("extra, named", [
    ("--account-for-loss-in-pipeline-split", "--account-for-loss-in-pipeline-split"),  # 31 % 4 != 0
    ("--account-for-embedding-in-pipeline-split --decoder-first-pipeline-num-layers 7",
     "--account-for-embedding-in-pipeline-split"),
    ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
     "--num-virtual-stages-per-pipeline-rank 2", "--account-for-embedding-in-pipeline-split"),
])
def test_refusals_name_the_flag(extra, named):
    with pytest.raises(PlanInputError) as error:
        _job(extra)
    assert named in str(error.value)
