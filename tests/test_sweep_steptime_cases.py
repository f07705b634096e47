"""estimate_step on tiny hand-made clusters: each term worked out by hand."""

from __future__ import annotations

import pytest

from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Cluster, GpuSpec, Layout, ModelSpec, NodeSpec, TrainSetup
from planner.timing.steptime import estimate_step

SRC = {k: "test value" for k in ("memory_gib", "peak_tflops", "hbm_gb_per_s", "achieved_efficiency",
                                 "gpus_per_node", "intra_node_gb_per_s", "intra_node_latency_us",
                                 "pcie_gb_per_s", "cpu_memory_gib")}

# A tiny GPT: L=2, h=64, a=4, f=4h, V=100, s=16 (the seed 004 §1.3 formulas apply as written).
MODEL = ModelSpec(name="tiny", num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=256,
                  vocab_size=100, max_seq_len=16)
SETUP = TrainSetup(seq_len=16, global_batch=4, train_tokens=6.4e9,
                   precision=get_precision("zero-fp16"), optimizer=get_optimizer("adam"))

# Seed 004 §1.3: forward = L(24·B·s·h² + 4·B·s²·h) + 2·B·s·h·V with B=4, s=16, h=64, V=100
FORWARD = 2 * (24 * 4 * 16 * 64**2 + 4 * 4 * 16**2 * 64) + 2 * 4 * 16 * 64 * 100
assert FORWARD == 13_926_400
MODEL_FLOPS = 3 * FORWARD  # backward = 2 x forward (seed 004 §1.1)

# Element-wise HBM bytes of one block's forward (steptime.elementwise_layer_bytes), b=4, s=16,
# h=64, f=256, a=4, 2-byte activations, dropout on (1-byte masks):
#   2 LayerNorms read + write h, 2 bias-dropout-adds read 2h write h + mask: s·b·h·(8 + 14)
#   bias-GeLU reads and writes f: s·b·f·4;  softmax + dropout on the scores: b·a·s²·(4·2 + 1)
LN_BDA = 16 * 4 * 64 * (2 * 2 * 2 + 2 * (3 * 2 + 1))  # 90,112 (replicated over tp)
GELU = 16 * 4 * 256 * 2 * 2  # 65,536 (split by tp)
SCORES = 4 * 4 * 16 * 16 * (4 * 2 + 1)  # 36,864 (split by tp)
assert LN_BDA + GELU + SCORES == 192_512
# The loss over the logits (planner/timing/logits.py): T = 64 tokens x V = 100 logits, fp16
# logits cast to fp32 and back (2 x (2 + 4)), log_softmax (4 + 4), nll_loss backward (4),
# log_softmax backward (3 x 4): 36 B each -> 6,400 x 36 = 230,400 B per micro-batch
LOSS = 4 * 16 * 100 * 36
assert LOSS == 230_400
# forward 1 + backward 2 passes, 2 layers, plus the loss, at the GPU's 1000 GB/s
MEMORY_S = (3 * 2 * (LN_BDA + GELU + SCORES) + LOSS) / 1000e9
# GPU Adam step (zero-fp16, K = 12): read + write K, read the fp16 gradient, write the fp16 param
ADAM_BYTES_PER_PARAM = 2 * 12 + 2 + 2


NCCL_BASE = 8.4e-6  # NVIDIA/nccl src/graph/tuning.cc baseLatencies, Ring Simple (commit 5067397c)


def adam_s(params: int) -> float:
    return params * ADAM_BYTES_PER_PARAM / 1000e9


def cluster(gpus_per_node: int, nodes: int = 1, intra_gb: float = 100.0, lat_us: float = 0.0,
            inter_gb: float = 100.0) -> Cluster:
    gpu = GpuSpec(name="g", memory_gib=80, peak_tflops={"fp16": 1.0}, hbm_gb_per_s=1000,
                  achieved_efficiency=0.5, sources=SRC)
    node = NodeSpec(name="n", gpu="g", gpus_per_node=gpus_per_node, intra_node_gb_per_s=intra_gb,
                    intra_node_latency_us=lat_us, pcie_gb_per_s=25, cpu_memory_gib=512,
                    cpu_adam_params_per_s=1e9, sources=SRC)
    return Cluster(name="c", gpu=gpu, node=node, num_nodes=nodes, inter_node_gb_per_s=inter_gb,
                   inter_node_latency_us=lat_us)


def test_one_gpu_is_pure_compute_and_mfu_equals_efficiency():
    est = estimate_step(MODEL, cluster(1), Layout(flash_attention=False, micro_batch=4), SETUP)
    # 41,779,200 FLOPs at 1e12 x 0.5 FLOP/s
    assert est.compute_s == pytest.approx(MODEL_FLOPS / 0.5e12, rel=1e-12)
    from planner.core.params import count_params

    opt = adam_s(count_params(MODEL).total)
    assert est.memory_bound_s == pytest.approx(MEMORY_S, rel=1e-12)  # 1.385472e-6 s
    assert est.gpu_optimizer_s == pytest.approx(opt, rel=1e-12)
    assert est.step_s == pytest.approx(est.compute_s + MEMORY_S + opt, rel=1e-12)
    assert est.tokens_per_s == pytest.approx(4 * 16 / est.step_s, rel=1e-12)
    # matmuls, element-wise kernels and Adam: MFU = efficiency x matmul share of the step
    step = MODEL_FLOPS / 0.5e12 + MEMORY_S + opt
    assert est.mfu == pytest.approx(0.5 * (MODEL_FLOPS / 0.5e12) / step, rel=1e-12)
    assert est.days == pytest.approx(6.4e9 / 64 * step / 86400, rel=1e-12)


def test_calibrated_efficiency_replaces_the_profile():
    est = estimate_step(MODEL, cluster(1), Layout(flash_attention=False, micro_batch=4), SETUP, efficiency=0.25)
    assert est.compute_s == pytest.approx(MODEL_FLOPS / 0.25e12, rel=1e-12)


def test_tensor_parallel_adds_four_all_reduces_per_layer():
    # tp=2 in one node at 100 GB/s, alpha 0: each all-reduce of b*s*h*2 = 4*16*64*2 = 8192 B
    # moves 2 * 1/2 * 8192 B = 8192 B -> 8.192e-8 s; 2 layers x 4 x 1 micro-batch = 8 of them.
    est = estimate_step(MODEL, cluster(2), Layout(flash_attention=False, tp=2, micro_batch=4), SETUP)
    assert est.tp_comm_s == pytest.approx(8 * 8192 / 100e9, rel=1e-12)
    assert est.compute_s == pytest.approx(MODEL_FLOPS / 2 / 0.5e12, rel=1e-12)
    # norms and residual adds stay whole on each tp rank; GeLU and scores are halved
    memory = (3 * 2 * (LN_BDA + GELU / 2 + SCORES / 2) + LOSS / 2) / 1000e9  # V split by tp
    assert est.memory_bound_s == pytest.approx(memory, rel=1e-12)
    from planner.core.params import stage_params

    opt = adam_s(stage_params(MODEL, 2, 1)[0].total)  # Adam on this tp rank's half
    assert est.gpu_optimizer_s == pytest.approx(opt, rel=1e-12)
    assert est.step_s == pytest.approx(est.compute_s + memory + est.tp_comm_s + opt, rel=1e-12)


def test_pipeline_bubble_and_sends():
    # pp=2, m=4 micro-batches of b=1, one block per stage. The output layer and loss sit on the
    # last stage only (Megatron-Core gpt_model.py `post_process`; planner/timing/stage_placement):
    # the last stage runs its block (FORWARD - HEAD) / 2 = 6,553,600 forward FLOPs and the head
    # 2·B·s·h·V = 819,200, x 3 with the backward: 22,118,400 FLOPs at 0.5e12.
    c = cluster(2, lat_us=1.0)
    est = estimate_step(MODEL, c, Layout(flash_attention=False, pp=2, micro_batch=1, grad_accum=4), SETUP)
    head = 2 * 4 * 16 * 64 * 100
    block = (FORWARD - head) // 2
    assert (block, head) == (6_553_600, 819_200)
    assert est.compute_s == pytest.approx(3 * (block + head) / 0.5e12, rel=1e-12)
    # memory-bound: its 1 block, 4 micro-batches of b=1 (a quarter of the b=4 bytes), 3 passes,
    # and the whole loss (4 micro-batches x LOSS / 4) on this stage
    memory = (4 * 3 * (LN_BDA + GELU + SCORES) / 4 + LOSS) / 1000e9
    assert est.memory_bound_s == pytest.approx(memory, rel=1e-12)
    # the fill and drain run through the other stage: its one block's step time, / m
    other = 3 * block / 0.5e12 + 3 * (LN_BDA + GELU + SCORES) / 1000e9
    assert est.bubble_s == pytest.approx(other / 4, rel=1e-12)
    # 2 sends per micro-batch of b*s*h*2 = 2048 B at 100 GB/s with 1 us latency
    assert est.pp_comm_s == pytest.approx(2 * 4 * (1e-6 + 2048 / 100e9), rel=1e-12)


def test_ddp_gradient_all_reduce_total():
    # dp=2, ZeRO-0: all-reduce of the fp16 gradients, 2 x 1/2 x 2·Φ bytes at 100 GB/s, with
    # Φ the exact parameter count (params module; one stage, tp=1, so the GPU holds all of it).
    from planner.core.params import count_params

    phi = count_params(MODEL).total
    est = estimate_step(MODEL, cluster(2), Layout(flash_attention=False, dp=2, micro_batch=2), SETUP)
    # plus NCCL's base latency per collective (tuning.cc, 8.4 us, Simple protocol), once per
    # ring pass (reduce-scatter + all-gather): a library constant, present at alpha = 0
    assert est.dp_comm_s == pytest.approx(2 * (NCCL_BASE + 0.5 * 2 * phi / 100e9), rel=1e-12)
    # the model is tiny: the whole all-reduce is one DDP bucket (25 MiB), exposed
    assert est.dp_comm_exposed_s == pytest.approx(est.dp_comm_s, rel=1e-12)


def test_cross_node_dp_uses_the_nic_share():
    # 2 nodes x 1 GPU, dp=2: the all-reduce runs on the inter-node link, 50 GB/s per node,
    # 1 GPU per node -> 50 GB/s per GPU: 2 x 1/2 x 2Φ / 50e9
    from planner.core.params import count_params

    phi = count_params(MODEL).total
    est = estimate_step(MODEL, cluster(1, nodes=2, inter_gb=50.0), Layout(flash_attention=False, dp=2, micro_batch=2), SETUP)
    assert est.dp_comm_s == pytest.approx(2 * (NCCL_BASE + 0.5 * 2 * phi / 50e9), rel=1e-12)


def test_cpu_offload_adds_cpu_adam_and_pcie():
    # ZeRO-2 + cpu optimizer, dp=2 in one node: each GPU owns Φ/2 parameters; the node's CPU
    # updates 2 x Φ/2 = Φ parameters at 1e9/s. PCIe: fp16 shard up (exposed) 2·Φ/2 / 25e9,
    # gradient shard down hidden or not behind the backward of the micro-batch.
    from planner.core.params import count_params

    phi = count_params(MODEL).total
    lay = Layout(flash_attention=False, dp=2, zero_stage=2, offload_optimizer="cpu", micro_batch=2)
    est = estimate_step(MODEL, cluster(2), lay, SETUP)
    assert est.cpu_optimizer_s == pytest.approx(phi / 1e9, rel=1e-12)
    up = 2 * phi / 2 / 25e9
    down = 2 * phi / 2 / 25e9
    backward = 2 * FORWARD / 2 / 0.5e12  # this GPU's half of the batch
    assert est.offload_s == pytest.approx(up + max(0.0, down - backward), rel=1e-12)


def test_the_layouts_own_ddp_bucket_sets_the_exposed_all_reduce():
    """A user's DDP bucket (Layout.buffers, e.g. from a DeepSpeed/PyTorch config) sets what stays
    exposed: the backward of a micro-batch (≈ 2.8e-5 s here) hides the all-reduce (≈ 2.2e-6 s)
    except the last bucket. With a 1,000-byte bucket on 2 GPUs at 100 GB/s, alpha 0, its ring
    all-reduce is 2 passes x (8.4 us NCCL base latency + 1/2 x 1000 B / 100e9 B/s)."""
    from planner.core.spec import EngineBuffers

    layout = Layout(flash_attention=False, dp=2, micro_batch=2, buffers=EngineBuffers(ddp_bucket_bytes=1000))
    est = estimate_step(MODEL, cluster(2), layout, SETUP)
    assert est.dp_comm_exposed_s == pytest.approx(2 * (NCCL_BASE + 0.5 * 1000 / 100e9), rel=1e-12)
    default = estimate_step(MODEL, cluster(2), Layout(flash_attention=False, dp=2, micro_batch=2), SETUP)
    assert default.dp_comm_exposed_s == pytest.approx(default.dp_comm_s, rel=1e-12)  # 25 MiB > 2Φ
