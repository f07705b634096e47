"""Megatron-LM launch lines: flags -> model + layout (arguments.py defaults), and back."""

from __future__ import annotations

import pytest

from planner.core.errors import PlanInputError
from planner.io.megatron import (
    job_from_megatron,
    megatron_flags,
    megatron_launch,
    parse_megatron_args,
    read_megatron_args,
)
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Cluster, GpuSpec, Layout, ModelSpec, NodeSpec, TrainSetup

# Shape of NVIDIA/Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh (GPT-3 175B)
GPT3_LAUNCH = r"""
GPUS_PER_NODE=8
torchrun --nproc_per_node 8 --nnodes 128 --node_rank $NODE_RANK \
    pretrain_gpt.py \
    --num-layers 96 \
    --hidden-size 12288 \
    --num-attention-heads 96 \
    --seq-length 2048 \
    --max-position-embeddings 2048 \
    --micro-batch-size 1 \
    --global-batch-size 1536 \
    --train-iters 500000 \
    --tensor-model-parallel-size 8 \
    --pipeline-model-parallel-size 16 \
    --vocab-size 50257 \
    --fp16   # mixed precision
"""


def test_gpt3_example_line():
    launcher, args = parse_megatron_args(GPT3_LAUNCH)
    job = job_from_megatron(launcher, args, num_gpus=None)
    model, lay = job.model, job.layout
    assert (model.num_layers, model.hidden_size, model.num_heads) == (96, 12288, 96)
    assert model.ffn_hidden_size == 4 * 12288  # arguments.py default without --swiglu
    # vocab padded to a multiple of make_vocab_size_divisible_by 128 x tp 8 = 1024: 50 x 1024
    assert model.vocab_size == 51200
    assert model.position == "learned" and model.tied_embeddings and model.linear_bias
    # world = 128 nodes x 8 = 1024 GPUs; dp = 1024 / (8 * 16) = 8; grad_accum = 1536 / (1 * 8)
    assert (lay.tp, lay.pp, lay.dp, lay.grad_accum) == (8, 16, 8, 192)
    assert job.precision == "zero-fp16" and job.optimizer == "adam"
    assert job.train_tokens == 500000 * 1536 * 2048  # iters x global batch x seq


LLAMA2_70B_FLAGS = """
--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4
--num-layers-per-virtual-pipeline-stage 5 --sequence-parallel --use-distributed-optimizer
--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64
--group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096
--swiglu --normalization RMSNorm --position-embedding-type rope
--untie-embeddings-and-output-weights --disable-bias-linear --attention-dropout 0 --hidden-dropout 0
--vocab-size 32000 --make-vocab-size-divisible-by 128
--micro-batch-size 1 --global-batch-size 1024 --bf16
--recompute-granularity full --recompute-method uniform --recompute-num-layers 1
"""


def test_llama2_70b_flags_with_gpus_from_the_command_line():
    launcher, args = parse_megatron_args(LLAMA2_70B_FLAGS)
    assert launcher == {}
    job = job_from_megatron(launcher, args, num_gpus=256)
    model, lay = job.model, job.layout
    assert (model.kv_heads, model.mlp, model.norm, model.position) == (8, "swiglu", "rmsnorm", "rotary")
    assert not model.tied_embeddings and not model.linear_bias and not model.dropout
    assert model.vocab_size == 32768  # 32000 -> multiple of 128 x 8 = 1024
    assert lay.virtual_stages == 80 // (4 * 5)  # 4 model chunks per pipeline rank
    assert lay.sequence_parallel and lay.zero_stage == 1 and lay.recompute == "full"
    assert (lay.dp, lay.grad_accum) == (8, 1024 // 8)  # 256 / 32 = 8
    assert job.precision == "megatron-bf16"  # bf16 forces fp32 main grads: 18 bytes/param


def test_recompute_modes():
    base = "--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 100 --micro-batch-size 1 "

    def lay(extra: str, gpus: int = 1) -> Layout:
        return job_from_megatron(*parse_megatron_args(base + extra), num_gpus=gpus).layout

    assert lay("--recompute-activations").recompute == "selective"
    assert lay("--recompute-granularity selective").recompute == "selective"
    every = lay("--recompute-granularity full --recompute-method uniform --recompute-num-layers 2")
    assert (every.recompute, every.recompute_every_k) == ("every_k", 2)
    assert lay("--recompute-granularity full --recompute-method block --recompute-num-layers 8").recompute == "full"
    # issue 10 (t10e): block with n < the chunk's 8 layers is read as partial recompute (was
    # refused before `recompute: block` existed): the first 3 of the 8 recomputed
    part = lay("--recompute-granularity full --recompute-method block --recompute-num-layers 3")
    assert (part.recompute, part.recompute_num_layers) == ("block", 3)
    with pytest.raises(PlanInputError, match="needs uniform or block"):
        lay("--recompute-granularity full")
    assert lay("--tensor-model-parallel-size 1 --sequence-parallel").sequence_parallel is False


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ("--context-parallel-size 2 --cp-comm-type allgather",
         "--cp-comm-type: 'allgather': only p2p \\(ring\\) and a2a are modelled"),
        ("--tensor-model-parallel-size 3", "world size 8 is not divisible by tp\\*pp = 3\\*1"),
        ("--global-batch-size 12 --micro-batch-size 1", "12 is not divisible by micro_batch x dp = 1 x 8"),
        ("--normalization ScaleNorm", "allowed: LayerNorm, RMSNorm"),
        ("--position-embedding-type alibi", "allowed: learned_absolute, rope"),
        ("--bf16 --fp16", "exclusive"),
        ("--make-vocab-size-divisible-by 0", "--make-vocab-size-divisible-by: needs a positive integer, got 0"),
        ("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 0",
         "--num-virtual-stages-per-pipeline-rank: needs a positive integer, got 0"),
        ("--micro-batch-size -1", "needs a positive integer, got -1"),
    ],
)
def test_rejected_flags(extra, match):
    text = "--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 100 --micro-batch-size 1 " + extra
    with pytest.raises(PlanInputError, match=match):
        job_from_megatron(*parse_megatron_args(text), num_gpus=8)


def test_underscore_spelling_of_a_boolean_flag_takes_no_value():
    # argparse accepts --use_distributed_optimizer for --use-distributed-optimizer; being a
    # store_true flag it must not swallow the next token as its value.
    text = ("--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 100 "
            "--micro-batch-size 1 --use_distributed_optimizer --global-batch-size 16")
    job = job_from_megatron(*parse_megatron_args(text), num_gpus=8)
    assert job.layout.zero_stage == 1 and job.global_batch == 16


def test_missing_and_unexpanded_values(tmp_path):
    with pytest.raises(PlanInputError, match="--vocab-size: missing"):
        job_from_megatron(*parse_megatron_args("--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8 --micro-batch-size 1"), num_gpus=1)
    with pytest.raises(PlanInputError, match="expand shell variables"):
        job_from_megatron(*parse_megatron_args("--num-layers $LAYERS --hidden-size 8 --num-attention-heads 2 --seq-length 8 --vocab-size 10 --micro-batch-size 1"), num_gpus=1)
    with pytest.raises(PlanInputError, match=r"--hidden-size: missing .*uses \$DISTRIBUTED_ARGS, \$GPT_MODEL_ARGS: expand"):
        job_from_megatron(*parse_megatron_args("torchrun $DISTRIBUTED_ARGS pretrain_gpt.py $GPT_MODEL_ARGS "
                                               "--micro-batch-size 1"), num_gpus=8)
    with pytest.raises(PlanInputError, match="no such file"):
        read_megatron_args(tmp_path / "none.sh")
    with pytest.raises(PlanInputError, match="cannot split"):
        parse_megatron_args('--num-layers "2')


# --------------------------------------------------------------------------- writer

GPU = GpuSpec(name="g80", memory_gib=80, peak_tflops={"bf16": 989}, hbm_gb_per_s=3350,
              sources={"memory_gib": "t", "peak_tflops": "t", "hbm_gb_per_s": "t", "achieved_efficiency": "t"})
NODE = NodeSpec(name="n8", gpu="g80", gpus_per_node=8, intra_node_gb_per_s=450, intra_node_latency_us=2,
                pcie_gb_per_s=64, cpu_memory_gib=2048,
                sources={k: "t" for k in ("gpus_per_node", "intra_node_gb_per_s", "intra_node_latency_us",
                                          "pcie_gb_per_s", "cpu_memory_gib")})


def cluster(nodes: int) -> Cluster:
    return Cluster(name="c", gpu=GPU, node=NODE, num_nodes=nodes, inter_node_gb_per_s=400, inter_node_latency_us=5)


LLAMA3_8B = ModelSpec(
    name="llama3-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
    ffn_hidden_size=14336, vocab_size=128256, max_seq_len=8192, mlp="swiglu", norm="rmsnorm",
    position="rotary", tied_embeddings=False, linear_bias=False, dropout=False,
)


@pytest.mark.parametrize(
    "layout",
    [
        Layout(tp=4, pp=4, dp=4, virtual_stages=2, zero_stage=1, sequence_parallel=True,
               recompute="selective", flash_attention=True, micro_batch=2, grad_accum=8),
        Layout(tp=8, pp=2, dp=4, recompute="every_k", recompute_every_k=4, micro_batch=1, grad_accum=16),
        Layout(tp=2, pp=1, dp=32, recompute="full", micro_batch=4, grad_accum=1),
    ],
)
def test_launch_line_reads_back(layout):
    setup = TrainSetup(seq_len=8192, global_batch=layout.micro_batch * layout.grad_accum * layout.dp,
                       train_tokens=15e12, precision=get_precision("megatron-bf16"),
                       optimizer=get_optimizer("adamw"))
    text = megatron_launch(cluster(layout.num_gpus // 8), LLAMA3_8B, layout, setup)
    assert text.startswith(f"torchrun --nnodes {layout.num_gpus // 8} --nproc-per-node 8")
    job = job_from_megatron(*parse_megatron_args(text), num_gpus=None)
    assert job.layout == layout
    assert job.model.model_dump(exclude={"name", "source"}) == LLAMA3_8B.model_dump(exclude={"name", "source"})
    assert job.global_batch == setup.global_batch and job.seq_len == 8192
    assert job.precision == "megatron-bf16"


def test_flag_spellings():
    layout = Layout(tp=2, pp=2, dp=2, virtual_stages=4, micro_batch=1, grad_accum=2)
    setup = TrainSetup(seq_len=4096, global_batch=4, train_tokens=1e9,
                       precision=get_precision("megatron-bf16"), optimizer=get_optimizer("adam"))
    flags = megatron_flags(LLAMA3_8B, layout, setup)
    assert "--virtual-pipeline-model-parallel-size" not in flags  # not a Megatron-LM flag
    i = flags.index("--num-layers-per-virtual-pipeline-stage")
    assert flags[i + 1] == str(32 // (2 * 4))  # 4 layers per virtual stage
    j = flags.index("--group-query-attention")
    assert flags[j + 1: j + 3] == ["--num-query-groups", "8"]


def test_bf16_gradients_round_trip():
    setup = TrainSetup(seq_len=4096, global_batch=8, train_tokens=1e9,
                       precision=get_precision("bf16-mixed"), optimizer=get_optimizer("adam"))
    flags = megatron_flags(LLAMA3_8B, Layout(dp=8), setup)
    assert flags[-2:] == ["--bf16", "--grad-reduce-in-bf16"]
    job = job_from_megatron({}, parse_megatron_args(" ".join(flags))[1], num_gpus=8)
    assert job.precision == "bf16-mixed"  # 2-byte gradients, the ZeRO paper's 16 bytes


def test_not_expressible():
    setup = TrainSetup(seq_len=4096, global_batch=8, train_tokens=1e9,
                       precision=get_precision("zero-infinity-fp16"), optimizer=get_optimizer("adam"))
    with pytest.raises(PlanInputError, match="precision: not expressible"):
        megatron_flags(LLAMA3_8B, Layout(dp=8), setup)
    setup = setup.model_copy(update={"precision": get_precision("megatron-bf16")})
    with pytest.raises(PlanInputError, match="zero_stage: not expressible"):
        megatron_flags(LLAMA3_8B, Layout(dp=8, zero_stage=3), setup)


def test_deepseek_v3_mla_and_mtp_flags_round_trip():
    """DeepSeek-V3 (MLA, 1 MTP module, 3 dense then 58 MoE blocks) written as Megatron-LM flags
    and read back: the flag names and defaults are arguments.py `_add_mla_args` at
    NVIDIA/Megatron-LM@d98e8a64 (--kv-lora-rank, --qk-head-dim = the no-rope part,
    --qk-pos-emb-head-dim = the rope part, --v-head-dim, --q-lora-rank) plus the
    --multi-latent-attention and --mtp-num-layers TransformerConfig fields. The values are
    DeepSeek-V3's config.json (kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64,
    v_head_dim 128, q_lora_rank 1536, num_nextn_predict_layers 1); the model read back counts
    the preset's 671,026,404,352 parameters (transformers 5.23.0 on the meta device,
    tests/test_models_modern.py)."""
    from planner.core.params import count_params
    from planner.io.loading import load_model

    model = load_model("deepseek-v3")
    setup = TrainSetup(seq_len=4096, global_batch=1024, train_tokens=1e9,
                       precision=get_precision("megatron-bf16"), optimizer=get_optimizer("adam"))
    layout = Layout(pp=16, dp=64, ep=8, zero_stage=1, micro_batch=1, grad_accum=16)
    flags = megatron_flags(model, layout, setup)
    written = dict(zip(flags, flags[1:]))
    assert "--multi-latent-attention" in flags
    assert (written["--kv-lora-rank"], written["--qk-head-dim"], written["--qk-pos-emb-head-dim"],
            written["--v-head-dim"], written["--q-lora-rank"], written["--mtp-num-layers"]) == \
        ("512", "128", "64", "128", "1536", "1")
    job = job_from_megatron({}, parse_megatron_args(" ".join(flags))[1], num_gpus=1024)
    assert job.layout.ep == 8 and job.layout.pp == 16
    back = job.model
    assert (back.kv_lora_rank, back.q_lora_rank, back.qk_nope_head_dim, back.qk_rope_head_dim,
            back.v_head_dim, back.mtp_modules) == (512, 1536, 128, 64, 128, 1)
    assert count_params(back).total == 671_026_404_352


def test_mla_defaults_are_arguments_py_defaults():
    """--multi-latent-attention alone: --kv-lora-rank 32, --qk-head-dim 128,
    --qk-pos-emb-head-dim 64, --v-head-dim 128, no --q-lora-rank (arguments.py at d98e8a64)."""
    line = ("pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 "
            "--seq-length 128 --max-position-embeddings 128 --vocab-size 1000 "
            "--micro-batch-size 1 --global-batch-size 1 --multi-latent-attention")
    model = job_from_megatron({}, parse_megatron_args(line)[1], num_gpus=1).model
    assert (model.kv_lora_rank, model.q_lora_rank, model.qk_nope_head_dim, model.qk_rope_head_dim,
            model.v_head_dim, model.mtp_modules) == (32, None, 128, 64, 128, 0)
