"""Training with tensor parallelism wider than the kv heads (issue 13), hand-worked.

What is modelled (Megatron-LM at commit d98e8a64): transformer_config.py accepts
num_query_groups a multiple or a divisor of tp; attention.py `get_query_key_value_tensors`
splits the fused QKV weight evenly over tp, all-gathers its output over the tp group
(tensor_parallel/mappings.py: forward all-gather, backward reduce-scatter), keeps its group's
slice and a / tp query heads, one K and one V head per rank.

Llama-3-70B (model_presets/llama3-70b.yaml): h = 8192, a = 64, kv = 8, d = 128, f = 28672,
SwiGLU, RMSNorm, no biases. At tp = 16 each kv head is replicated on 16 / 8 = 2 ranks.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from planner.core import params, rules
from planner.core.columns import LayoutColumns
from planner.core.errors import PlanInputError
from planner.core.spec import Layout, ModelSpec
from planner.io import engines, loading
from planner.io.jobfile import make_setup
from planner.memory import activations, plan
from planner.search import sweep
from planner.timing import collectives, steptime

H, A, KV, D, F = 8192, 64, 8, 128, 28672


@pytest.fixture(scope="module")
def llama70b():
    model = loading.load_model("llama3-70b")
    assert (model.hidden_size, model.num_heads, model.kv_heads, model.head_size,
            model.ffn_hidden_size) == (H, A, KV, D, F)
    return model


def _tp_rule(model, tp):
    ctx = rules.Context(model, seq_len_tokens=4096)
    rules.check_rules(ctx, LayoutColumns({"tp": np.array([tp])}), rules.named(rules.TP_RULE_NAME))


# --------------------------------------------------------------------------- (1) the rule


def test_tp_a_multiple_of_the_kv_heads_is_allowed(llama70b):
    for tp in (1, 2, 4, 8, 16, 32, 64):  # divisors of 8, or multiples of 8 dividing 64 heads
        _tp_rule(llama70b, tp)
        params.check_tp(llama70b, tp)


def test_tp_neither_multiple_nor_divisor_is_refused_in_one_line():
    # 24 heads, 8 kv heads, tp = 12: 12 divides 24 heads and the QKV width (24 + 16) x 96 =
    # 3840, but 12 is neither a multiple nor a divisor of 8 (Megatron raises ValueError)
    odd = ModelSpec(name="odd", num_layers=2, hidden_size=2304, num_heads=24, num_kv_heads=8,
                    head_dim=96, ffn_hidden_size=9216, vocab_size=1000, max_seq_len=128)
    with pytest.raises(PlanInputError) as err:
        _tp_rule(odd, 12)
    assert err.value.field == "tp"
    assert "num_kv_heads=8" in str(err.value) and "multiple" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(PlanInputError, match="multiple or a divisor"):
        params.check_tp(odd, 12)
    _tp_rule(odd, 24)  # 24 = 3 x 8 and divides 24 heads and 3840: allowed


def test_qkv_width_must_divide_too():
    # 4 heads of 3 (odd head_dim), 1 kv head, tp = 4: 4 divides the heads and is a multiple of
    # 1 kv head, but the fused QKV width (4 + 2) x 3 = 18 is not divisible by 4: Megatron's
    # ColumnParallelLinear divide() asserts, so the rule refuses
    model = ModelSpec(name="thin", num_layers=1, hidden_size=12, num_heads=4, num_kv_heads=1,
                      head_dim=3, ffn_hidden_size=16, vocab_size=64, max_seq_len=16)
    with pytest.raises(PlanInputError, match="fused QKV width"):
        _tp_rule(model, 4)


# --------------------------------------------------------------------------- (2) parameters


def test_llama70b_layer_per_rank_at_tp16_by_hand(llama70b):
    tensors = dict(params.layer_tensors_per_rank(llama70b, 16))
    assert tensors["linear_qkv.weight"] == 8192 * (64 + 2 * 8) * 128 // 16 == 5_242_880
    assert tensors["linear_proj.weight"] == 64 * 128 * 8192 // 16 == 4_194_304
    assert tensors["mlp.fc1.weight"] == 8192 * 2 * 28672 // 16 == 29_360_128
    assert tensors["mlp.fc2.weight"] == 28672 * 8192 // 16 == 14_680_064
    # 5,242,880 + 4,194,304 + 29,360,128 + 14,680,064 + 2 RMSNorms of 8192
    assert params.layer_params_per_rank(llama70b, 16) == 53_493_760


def test_sum_over_ranks_is_the_model_count(llama70b):
    # whole layer: q 8192^2 + k, v 2 x 8192 x 1024 + o 8192^2 + MLP 3 x 8192 x 28672 + 2 x 8192
    whole = 67_108_864 + 16_777_216 + 67_108_864 + 704_643_072 + 16_384
    assert whole == 855_654_400 == params.layer_params(llama70b).total
    for tp in (16, 32, 64):
        tensors = params.layer_tensors_per_rank(llama70b, tp)
        replicated = sum(n for name, n in tensors if "norm" in name)
        split = sum(n for name, n in tensors if "norm" not in name)
        assert replicated == 2 * 8192
        assert tp * split + replicated == whole
    # the whole model: embedding and lm_head vocab-parallel (128256 = 16 x 8016), final norm
    # replicated; 80 layers; untied
    total = params.count_params(llama70b).total
    stage = params.stage_params(llama70b, tp=16, pp=1)[0]
    vocab = 128256 * 8192
    layer_split = (53_493_760 - 16_384) * 16
    assert 16 * (stage.total - 80 * 16_384 - 8192) + 80 * 16_384 + 8192 == total
    assert total == 80 * (layer_split + 16_384) + 2 * vocab + 8192 == 70_553_706_496


# --------------------------------------------------------------------------- (3) activations


def test_flash_saves_one_kv_head_per_rank(llama70b):
    lay = Layout(tp=16, flash_attention=True, sequence_parallel=True)
    inv = activations.layer_saved_bytes(llama70b, lay, 8192, 1, 2)
    one_head = 8192 * 1 * 1 * 128 * 2  # s x b x 1 head x d x bf16
    assert inv["attn.k"] == inv["attn.v"] == one_head == 2_097_152
    assert inv["attn.q"] == 8192 * (64 // 16) * 128 * 2 == 8_388_608
    # at tp = 8 (= kv) each rank also has one kv head: the same K, V bytes
    at8 = activations.layer_saved_bytes(llama70b, lay.model_copy(update={"tp": 8}), 8192, 1, 2)
    assert at8["attn.k"] == one_head
    kept = activations.selective_kept_bytes(llama70b, lay.model_copy(update={"recompute": "selective"}),
                                            8192, 1, 2, inv)
    assert kept["attn.k"] == kept["attn.v"] == one_head


def test_without_flash_kv_are_at_the_query_heads(llama70b):
    lay = Layout(tp=16, flash_attention=False)
    inv = activations.layer_saved_bytes(llama70b, lay, 1024, 1, 2)
    assert inv["attn.k"] == 1024 * 4 * 128 * 2  # repeated to the 64 / 16 = 4 query heads
    assert activations.replicated_kv_saved_bytes(llama70b, lay, 1024, 1, 2) == {}


# --------------------------------------------------------------------------- (4) step time


def test_qkv_gather_time_by_hand():
    # S = s x b x (a + 2kv) x d x 2 bytes = 8192 x 10240 x 2 = 167,772,160 B; ring all-gather
    # over 16 ranks: 15/16 S = 157,286,400 B at 900 GB/s = 174.7626... us, 15 steps of 1 us,
    # NCCL base 8.4 us; forward all-gather + backward reduce-scatter: 2 passes
    size = 8192 * (64 + 16) * 128 * 2
    one = 157_286_400 / 900e9 + 15 * 1e-6 + 8.4e-6
    assert collectives.qkv_gather_s(size, 16, 8, 2, 900e9, 1e-6) == pytest.approx(2 * one, rel=1e-12)
    assert 2 * one == pytest.approx(396.3253e-6, rel=1e-6)
    assert collectives.qkv_gather_s(size, 8, 8, 2, 900e9, 1e-6) == 0.0  # tp = kv: no gather


def test_step_time_adds_the_gather_to_tp_comm(llama70b):
    cluster = loading.load_cluster("gb200-nvl72x8")
    setup = make_setup(8192, 576, 1e12, "bf16-mixed", "adam")
    for recompute, passes in (("none", 2), ("full", 3)):
        lay = Layout(tp=16, pp=1, dp=36, zero_stage=1, micro_batch=1, grad_accum=16,
                     recompute=recompute, flash_attention=True)
        est = steptime.estimate_step(llama70b, cluster, lay, setup)
        r = steptime.cluster_rates(cluster, setup)
        act = 8192 * 8192 * 2  # b s h bytes
        allreduces = steptime.tp_comm_time_s(80, 16, 2 * passes, act, 16, r.intra_bw, r.intra_lat)
        gather = collectives.qkv_gather_s(8192 * 10240 * 2, 16, 8, passes, r.intra_bw, r.intra_lat)
        assert est.tp_comm_s == pytest.approx(allreduces + 16 * 80 * gather, rel=1e-12)
        assert gather > 0


# --------------------------------------------------------------------------- (5) the sweep


SWEEPS = [("llama3-70b", "gb200-nvl72x8", 8192, 576), ("qwen3-30b-a3b", "dgx-h100x32", 4096, 256)]


@pytest.mark.parametrize(("name", "hw", "seq", "batch"), SWEEPS, ids=[s[0] for s in SWEEPS])
def test_sweep_enumerates_wide_tp_and_equals_the_scalar_models(name, hw, seq, batch):
    model, cluster = loading.load_model(name), loading.load_cluster(hw)
    setup = make_setup(seq, batch, 1e12, "bf16-mixed", "adam")
    c = sweep.Constraints(flash_attention=True)
    cands = sweep.enumerate_candidates(model, cluster, setup, c)
    wide = np.flatnonzero(cands["tp"] > model.kv_heads)
    assert len(wide) > 100  # e.g. llama3-70b tp 16, 32, 64 in a 72-GPU node; qwen3 tp 8
    cols = sweep.evaluate(model, cluster, setup, cands, c)
    for i in random.Random(13).sample(list(wide), 25):
        layout = sweep.layout_at(cands, i, c)
        mem = plan.plan_memory(model, cluster, layout, setup)
        assert int(cols["gpu_peak_bytes"][i]) == max(s.total_bytes for s in mem.stages), layout
        est = steptime.estimate_step(model, cluster, layout, setup)
        for key, value in est.model_dump().items():
            assert float(cols[key if key != "compute_efficiency" else "efficiency"][i]) == \
                pytest.approx(value, rel=1e-12, abs=1e-15), (key, layout)


# --------------------------------------------------------------------------- engines


def test_engines_megatron_runs_it_the_others_refuse(llama70b):
    from planner.core.recipes import get_precision
    lay = Layout(tp=16, dp=36, zero_stage=2, micro_batch=1, grad_accum=16)
    prec = get_precision("bf16-mixed")
    refused = {e: [r.source for r in engines.refusals(e, llama70b, lay, prec)] for e in engines.ENGINES}
    assert refused["megatron-lm"] == []
    assert any("tp_shard.py" in s for s in refused["deepspeed"])
    assert any("torchtitan" in s for s in refused["fsdp2"])
    assert any("get_kv_heads_per_rank" in s for s in refused["accelerate"])
    at8 = lay.model_copy(update={"tp": 8, "dp": 72})
    assert not any("kv" in r.why for e in engines.ENGINES
                   for r in engines.refusals(e, llama70b, at8, prec))
