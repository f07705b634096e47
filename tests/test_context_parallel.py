"""Context parallelism (issue 13): hand-worked bytes, traffic and causal balance.

Every expected number is worked out in the comments from the model's dimensions and the
sources named in planner/memory/context.py and planner/timing/context.py (Transformer Engine
context_parallel.py at d0067d0d, Megatron-LM d98e8a64, DeepSpeed edaa7221).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.core import flops, rules
from planner.core.columns import LayoutColumns
from planner.core.errors import PlanInputError
from planner.core.spec import Layout
from planner.io import loading
from planner.io.jobfile import make_setup
from planner.memory import activations, context as mem_cp, model_states, plan
from planner.search import sweep
from planner.timing import collectives, context as time_cp, steptime

LLAMA = loading.load_model("llama3.1-8b")  # h 4096, 32 heads, 8 kv heads, d 128, f 14336, V 128256
S = 131_072


def _setup(seq_len=S, batch=16, precision="bf16-mixed"):
    return make_setup(seq_len, batch, 1e12, precision, "adam")


# --------------------------------------------------------------------------- activations


def test_block_activation_bytes_at_cp_2_and_4_by_hand():
    """One Llama 3.1 8B block, tp 1, b 1, bf16 (2 B), flash attention, no recompute; each cp rank
    keeps T = s/cp tokens of every saved tensor. Per token (planner/memory/activations.py
    inventory): norm1 input 2h = 8192 + RMSNorm rstd 4; qkv input 2h = 8192, q 2·32·128 = 8192,
    k 2·8·128 = 2048, v 2048, lse 32 heads x 4 B = 128, projection input 8192; norm2 8192 + 4;
    fc1 input 8192, SwiGLU gate/act/up/fc2 inputs 4 x 2 x 14336 = 114688.
    Sum: 8196 + 28800 + 8196 + 122880 = 168,072 bytes per token."""
    per_token = 8196 + (8192 + 8192 + 2048 + 2048 + 128 + 8192) + 8196 + (8192 + 4 * 2 * 14336)
    assert per_token == 168_072
    for cp, tokens in ((2, 65_536), (4, 32_768)):
        layout = Layout(cp=cp)
        got = activations.layers_kept_bytes(LLAMA, layout, mem_cp.local_seq_len(S, cp), 1, 2, 1)
        assert got == per_token * tokens  # cp 2: 11,014,766,592 B; cp 4: 5,507,383,296 B
    assert 168_072 * 65_536 == 11_014_766_592 and 168_072 * 32_768 == 5_507_383_296


def test_ring_buffers_by_hand():
    """cp 4, T = 32,768 tokens, tp 1, b 1, bf16. KV chunk = T x (8 + 8) heads x 128 x 2 B =
    134,217,728 B; an output T x 4096 x 2 = 268,435,456 B; a log-sum-exp T x 32 x 4 = 4,194,304 B.
    Forward (TE keeps all cp received chunks, outputs and lse's until the layer ends):
    4 x (134,217,728 + 268,435,456 + 4,194,304) = 1,627,389,952 B. Backward (KV and dKV
    double-buffered, plus dq): 4 x 134,217,728 + 268,435,456 = 805,306,368 B."""
    t = 32_768
    assert mem_cp.kv_chunk_bytes(LLAMA, 1, t, 1, 2) == 134_217_728
    assert mem_cp.ring_buffer_bytes(LLAMA, 1, 4, t, 1, 2) == {
        "cp_ring_forward": 1_627_389_952, "cp_ring_backward": 805_306_368}
    assert mem_cp.cp_working_bytes(LLAMA, Layout(cp=4), S, 1, 2) == 1_627_389_952
    # a2a: one copy of q, k, v: T x (4096 + 1024 + 1024) x 2 = 402,653,184 B
    assert mem_cp.cp_working_bytes(LLAMA, Layout(cp=4, cp_comm_type="a2a"), S, 1, 2) == 402_653_184
    assert mem_cp.cp_working_bytes(LLAMA, Layout(), S, 1, 2) == 0


def test_plan_names_the_cp_buffers_and_splits_the_sequence():
    """64 H100: tp 1, cp 16, dp 4, one stage of 32 blocks, 16 micro-batches of b 1 (1F1B with
    pp 1 holds one). T = 8192 tokens. Kept: 32 x 168,072 x 8192 = 44,059,066,368 B of blocks,
    + token ids 8 T = 65,536, + final norm (input 8192 + rstd 4) T = 67,141,632, + head input
    8192 T = 67,108,864, + fp32 logits 4 x 128,256 x T = 4,202,692,608 B: 48,396,075,008 B.
    Working: ring forward 16 x (8192·2048·2 + 8192·8192 + 8192·128) = 16 x 101,711,872 =
    1,627,389,952 B (the same bytes as cp 4 at T 32,768: the chunk is 4x smaller, 4x as many)."""
    cluster = loading.cluster_for_gpus("h100-sxm", 64)
    layout = Layout(cp=16, dp=4, zero_stage=1, grad_accum=16)
    mem = plan.plan_memory(LLAMA, cluster, layout, _setup(batch=64))
    (stage,) = mem.stages
    t = 8192
    kept = 32 * 168_072 * t + 8 * t + 8196 * t + 8192 * t + 4 * 128_256 * t
    assert kept == 48_396_075_008
    assert stage.activations_bytes == kept
    assert stage.working == {"cp_attention_buffers": 16 * (t * 2048 * 2 + t * 8192 + t * 128)}
    assert stage.working["cp_attention_buffers"] == 1_627_389_952


# --------------------------------------------------------------------------- model states


def test_distributed_optimizer_shards_over_dp_times_cp():
    """Megatron's distributed optimizer (zero 1) over dp x cp = 2 x 4 = 8 ranks: 1000 parameters
    -> ceil(1000 / 8) = 125 per rank; zero-fp16 + Adam keeps K = 4 + 4 + 4 = 12 B per sharded
    parameter: 1500 B; params 2 x 1000 and grads 2 x 1000 stay whole."""
    prec, opt = _setup(precision="zero-fp16").precision, _setup().optimizer
    states = model_states.model_state_bytes(1000, prec, opt, Layout(dp=2, cp=4, zero_stage=1))
    assert states.partition_numel == 125
    assert (states.params_bytes, states.grads_bytes, states.optimizer_bytes) == (2000, 2000, 1500)


# --------------------------------------------------------------------------- causal balance


def test_causal_balance_with_chunk_reordering():
    """2·cp = 8 chunks; query chunk c attends to c full chunks and half of its own: c + 1/2.
    Reordered (rank r holds r and 7 - r): (r + 1/2) + (7 - r + 1/2) = 8 on every rank;
    contiguous (rank r holds 2r, 2r + 1): 4r + 2 = 2, 6, 10, 14, the last rank 14 / 8 = 1.75
    = 2 - 1/cp times the mean. Total 32 = (2cp)^2 / 2 either way."""
    assert time_cp.chunk_owner(4) == [0, 1, 2, 3, 3, 2, 1, 0]
    assert time_cp.causal_rank_work(4) == [8.0, 8.0, 8.0, 8.0]
    assert time_cp.causal_rank_work(4, reorder=False) == [2.0, 6.0, 10.0, 14.0]
    assert sum(time_cp.causal_rank_work(4, reorder=False)) == 32.0


def test_ring_step_flops_add_up_to_the_causal_attention():
    """cp steps per rank x cp ranks x tp ranks x one step = the causal half of the s² core
    (planner.core.flops.attention_core_flops counts the full s²): per step s²-core / (2·tp·cp²).
    Llama 8B at s = 131,072: core = 2 x 131072² x (2 x 32 x 128) = 281,474,976,710,656 FLOPs."""
    core = flops.attention_core_flops(LLAMA, 1, S)
    assert core == 2 * S * S * 2 * 32 * 128 == 281_474_976_710_656
    for tp, cp in ((1, 4), (2, 8), (8, 16)):
        step = time_cp.ring_step_flops(LLAMA, S, 1, tp, cp)
        assert step * cp * cp * tp == pytest.approx(core / 2, rel=1e-15)


# --------------------------------------------------------------------------- traffic


def test_ring_kv_bytes_exchanged_per_layer():
    """Ring, cp 4: 3 forward sends of one KV chunk and 3 backward sends of KV + dKV per layer and
    micro-batch: 3 x 134,217,728 + 3 x 268,435,456 = 1,207,959,552 B. At 1 B/s and no latency
    the time in seconds is the byte count; a recompute adds the forward's 3 sends again."""
    kv = 134_217_728
    assert time_cp.ring_total_s(4, kv, 1.0, 0.0, 1) == 3 * kv + 3 * 2 * kv == 1_207_959_552
    assert time_cp.ring_total_s(4, kv, 1.0, 0.0, 2) == 6 * kv + 3 * 2 * kv
    assert time_cp.ring_total_s(1, kv, 1.0, 0.0, 1) == 0


def test_ring_send_hides_behind_the_step_attention_only_when_faster():
    """Exposed per step = max(0, send - attention step); backward: max(0, send of 2 KV - 2 x step)."""
    # send 1.0 s (1 B at 1 B/s), attention step 0.25 s: forward 0.75 s, backward 2 - 0.5 = 1.5 s
    assert time_cp.ring_exposed_s(3, 1.0, 0.25, 1.0, 0.0, 1) == pytest.approx(2 * (0.75 + 1.5))
    assert time_cp.ring_exposed_s(3, 1.0, 5.0, 1.0, 0.0, 1) == 0.0


def test_ulysses_all_to_all_volume_by_hand():
    """a2a over cp 4 ranks in one node, T = 32,768 tokens, tp 1, bf16: q = T x 4096 x 2 =
    268,435,456 B, k = v = T x 1024 x 2 = 67,108,864 B, out = q. Each all-to-all sends
    (n-1)/n = 3/4 of the tensor (nccl-tests all_to_all), all over NVLink: at 1 B/s and no step
    latency each costs 3/4 S + NCCL's 8.4 us base; 4 in forward + 4 (their gradients) in backward."""
    t = 32_768
    sizes = time_cp.a2a_tensor_bytes(LLAMA, 1, t, 1, 2)
    assert [int(x) for x in sizes] == [268_435_456, 67_108_864, 67_108_864, 268_435_456]
    got = time_cp.a2a_s(LLAMA, 1, 4, t, 1, 2, 8, 1.0, 0.0, 1.0, 0.0, 1)
    base = collectives.NCCL_BASE_LATENCY_S["ring"]
    expected = 2 * sum(0.75 * s + base for s in (268_435_456, 67_108_864, 67_108_864, 268_435_456))
    assert float(got) == pytest.approx(expected, rel=1e-12)


def test_long_context_ring_in_a_node_is_hidden_and_a2a_is_not():
    """8 H100 (one node), Llama 8B, s = 131,072, tp 1, cp 8, b 1. A KV chunk is 16,384 tokens x
    2048 x 2 B = 67,108,864 B: over NVLink at 450 GB/s + 3.4 us, 152.5 us (backward 301.7 us);
    one step's attention is 281,474,976,710,656 / (2 x 64) = 2.2e12 FLOPs, milliseconds at any
    efficiency above 0.01 of 989.5 TFLOP/s: every send hides, cp_comm_s = 0. The a2a layout
    pays its eight all-to-alls per layer, 32 layers, 1 micro-batch."""
    cluster = loading.cluster_for_gpus("h100-sxm", 8)
    setup = _setup(batch=1)
    ring = steptime.estimate_step(LLAMA, cluster, Layout(cp=8), setup)
    assert ring.cp_comm_s == 0.0
    a2a = steptime.estimate_step(LLAMA, cluster, Layout(cp=8, cp_comm_type="a2a"), setup)
    node = cluster.node
    t = S // 8
    per_layer = 2 * sum(
        collectives.all_to_all_s(size, 8, 1, node.intra_node_bytes_per_s,
                                 node.intra_node_latency_us * 1e-6, 1.0, 0.0)
        for size in (t * 8192, t * 2048, t * 2048, t * 8192))
    assert a2a.cp_comm_s == pytest.approx(32 * float(per_layer), rel=1e-12)
    assert a2a.cp_comm_s > 0


# --------------------------------------------------------------------------- rules and the sweep


def _ctx(seq_len=S, implementation=None):
    cluster = loading.cluster_for_gpus("h100-sxm", 64)
    setup = make_setup(seq_len, 64, 1e12, "bf16-mixed", "adam", implementation=implementation)
    return rules.Context(LLAMA, cluster, setup)


@pytest.mark.parametrize(("fields", "seq_len", "implementation", "needle"), [
    (dict(cp=16, dp=4), 131_000, None, "cp=16 needs seq_len (131000) divisible by 2*cp = 32"),
    (dict(cp=16, dp=4, cp_comm_type="a2a"), S, None,
     "tp*cp = 1*16 must divide num_heads=32 and num_kv_heads=8"),
    (dict(cp=2, dp=32), S, "hf-sdpa", "cp=1 (got cp=2)"),
    (dict(cp=2, dp=16), S, None, "tp*cp*pp*dp = 1*2*1*16 = 32 must equal the cluster's GPUs 64"),
])
def test_rules_name_every_factor(fields, seq_len, implementation, needle):
    cols = LayoutColumns.from_layout(Layout(**fields, grad_accum=64 // fields["dp"]))
    with pytest.raises(PlanInputError, match=needle.replace("*", r"\*").replace("(", r"\(")
                       .replace(")", r"\)")):
        rules.check_layout(_ctx(seq_len, implementation), cols)


def test_cp_needs_flash_attention():
    with pytest.raises(ValueError, match="cp=2 needs flash_attention"):
        Layout(cp=2, flash_attention=False)


def test_sweep_cp_rows_equal_plan_and_step_references():
    """The sweep's cp rows (both comm types) to the byte of plan_memory and to 1e-12 of
    estimate_step (the same formulas, vectorised)."""
    cluster = loading.cluster_for_gpus("h100-sxm", 64)
    setup = _setup(batch=64)
    c = sweep.Constraints(cp=(4, 8), tp=(1, 2))
    cands = sweep.enumerate_candidates(LLAMA, cluster, setup, c)
    assert set(cands["cp"].tolist()) == {4, 8} and set(cands["cp_comm_type"].tolist()) == {0, 1}
    cols = sweep.evaluate(LLAMA, cluster, setup, cands, c)
    rng = np.random.default_rng(7)
    for i in rng.choice(len(cands), 25, replace=False):
        layout = sweep.layout_at(cands, int(i), c)
        mem = plan.plan_memory(LLAMA, cluster, layout, setup)
        assert int(cols["gpu_peak_bytes"][i]) == max(s.total_bytes for s in mem.stages), layout
        est = steptime.estimate_step(LLAMA, cluster, layout, setup)
        assert float(cols["cp_comm_s"][i]) == pytest.approx(est.cp_comm_s, rel=1e-12, abs=1e-15)
        assert float(cols["step_s"][i]) == pytest.approx(est.step_s, rel=1e-12)


def test_long_context_sweep_ranks_cp_layouts(zplan):
    """The long-context sweep of the issue: 64 H100, Llama 3.1 8B at 131,072 tokens. Without cp
    one sequence's activations overflow every GPU unless recompute / offload / tp take them; the
    ranking places cp layouts, and the JSON carries cp and the cp term of every row."""
    proc = zplan("sweep", "--model", "llama3.1-8b", "--gpus", "64", "--gpu", "h100-sxm",
                 "--seq-len", "131072", "--json", "--top", "20")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)["results"][0]
    top = result["top"]
    assert any(row["layout"]["cp"] > 1 for row in top)
    assert all("cp_comm_s" in row["estimate"] for row in top)
    if top[0]["layout"]["cp"] > 1:  # the comparison the table's note prints
        plain = result["best_without_cp"]
        assert plain["layout"]["cp"] == 1 and plain["fits"]
        assert plain["estimate"]["step_s"] >= top[0]["estimate"]["step_s"]
        table = zplan("sweep", "--model", "llama3.1-8b", "--gpus", "64", "--gpu", "h100-sxm",
                      "--seq-len", "131072", "--top", "3").stdout
        assert "the best without it" in " ".join(table.split())


def test_bad_cp_input_exits_2(zplan):
    base = ("fit", "--model", "llama3.1-8b", "--gpus", "64", "--gpu", "h100-sxm", "--seq-len", "131072")
    for extra, needle in ((("--cp", "16", "--cp-comm-type", "ring"), "cp_comm_type"),
                          (("--cp", "3"), "not divisible by tp*cp*pp"),
                          (("--cp", "16", "--no-flash-attention"), "needs flash_attention")):
        proc = zplan(*base, *extra)
        assert proc.returncode == 2, (extra, proc.stderr)
        assert proc.stderr.startswith("zplan: error:") and needle in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_megatron_round_trip_of_cp_flags():
    from planner.io.megatron import job_from_megatron, megatron_flags, parse_megatron_args

    text = ("--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --vocab-size 100 "
            "--micro-batch-size 1 --context-parallel-size 2 --cp-comm-type a2a "
            "--tensor-model-parallel-size 2")
    job = job_from_megatron(*parse_megatron_args(text), num_gpus=8)
    assert (job.layout.tp, job.layout.cp, job.layout.dp, job.layout.cp_comm_type) == (2, 2, 2, "a2a")
    assert job.layout.flash_attention  # CP runs in TE attention: assumed without --attention-backend
    flags = megatron_flags(job.model, job.layout, make_setup(128, job.global_batch, 1e9, "zero-fp16"))
    i = flags.index("--context-parallel-size")
    assert flags[i:i + 4] == ["--context-parallel-size", "2", "--cp-comm-type", "a2a"]


def test_engine_matrix_for_cp():
    from planner.io.engines import supported_engines

    prec = _setup().precision
    ring = Layout(cp=2, zero_stage=3)
    ulysses = Layout(cp=2, cp_comm_type="a2a", zero_stage=3)
    assert "deepspeed" not in supported_engines(LLAMA, ring, prec)
    assert "deepspeed" in supported_engines(LLAMA, ulysses, prec)
    assert "fsdp2" in supported_engines(LLAMA, ring, prec)
    assert "fsdp2" not in supported_engines(LLAMA, ulysses, prec)


def test_deepspeed_sequence_parallel_size_is_ulysses_cp():
    """DeepSpeed counts world / sequence_parallel_size data-parallel ranks (runtime/config.py):
    64 GPUs, sp 8 -> dp 8; train_batch_size 16 = 1 x 8 x 2."""
    from planner.io.deepspeed import layout_from_deepspeed

    config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 8,
              "zero_optimization": {"stage": 3}}
    job = layout_from_deepspeed(config, num_gpus=64)
    assert (job.layout.cp, job.layout.cp_comm_type, job.layout.dp, job.layout.grad_accum) == (8, "a2a", 8, 2)
