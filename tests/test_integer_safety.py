"""Memory figures never wrap: a 10T-parameter model at seq 32768 with a huge global batch.

The sweep's memory columns are float64 (exact below 2^53 bytes = 8 PiB, far above any GPU;
above it the magnitude is kept, never a wrapped negative); fit's length-1 evaluation is exact
Python ints. Before, the int64 peak of this case wrapped (2.74e19 bytes read as 8.97e18).
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.spec import ModelSpec
from planner.io import loading
from planner.io.jobfile import make_setup
from planner.memory.plan import plan_memory
from planner.search import sweep

# 12·L·h² = 12 · 400 · 46080² = 1.02e13 parameters in the blocks (≈ 10T)
DENSE_10T = ModelSpec(name="dense-10t", num_layers=400, hidden_size=46080, num_heads=360,
                      ffn_hidden_size=4 * 46080, vocab_size=51200, max_seq_len=32768)


def test_ten_trillion_parameters_at_seq_32768_do_not_wrap():
    cluster = loading.cluster_for_gpus("a100-80gb", 256)
    setup = make_setup(32768, 2**23, 1e12)
    c = sweep.Constraints(tp=(8,), pp=(8, 16, 32), virtual_stages=(1,),
                          flash_attention=False)  # the s x s scores this test counts
    cands = sweep.enumerate_candidates(DENSE_10T, cluster, setup, c)
    cols = sweep.evaluate(DENSE_10T, cluster, setup, cands, c)
    assert np.all(cols["gpu_peak_bytes"] > 0) and not np.any(cols["headroom_bytes"] >= 0)
    for i in (int(np.argmax(cands["micro_batch"])), int(np.argmin(cands["micro_batch"]))):
        layout = sweep.layout_at(cands, i, c)
        exact = max(s.total_bytes for s in plan_memory(DENSE_10T, cluster, layout, setup).stages)
        assert exact > 0
        assert float(cols["gpu_peak_bytes"][i]) == pytest.approx(exact, rel=1e-15)
    # micro-batch 2^22 means dp = 2^23 / 2^22 = 2, pp = 256 / (8·2) = 16, 400 / 16 = 25 layers on
    # stage 1; the attention scores of one block and one micro-batch alone are
    # 5·a·s²·b/t = 5·360·32768²·2^22/8 bytes (fp16 softmax 2 + mask 1 + dropout 2, Korthikanti
    # §4.1), so the stage keeps more than 25 times that: past 2^63
    # (among the even splits; since session 10 the sweep also enumerates pp 32 as Megatron's
    # uneven 5, 30 x 13, 5 split, whose largest micro-batch is 2^23 at dp 1, checked below)
    even = cands["first_stage_layers"] == 0
    big = int(np.argmax(np.where(even, cands["micro_batch"], 0)))
    assert (int(cands["micro_batch"][big]), int(cands["pp"][big])) == (2**22, 16)
    scores = 5 * 360 * 32768**2 * 2**22 // 8
    assert float(cols["gpu_peak_bytes"][big]) > 25 * scores > 2**63
    # uneven pp 32: stage 2 keeps 13 blocks of one 2^23 micro-batch, 13 x 2 x scores(2^22)
    top = int(np.argmax(cands["micro_batch"]))
    assert (int(cands["micro_batch"][top]), int(cands["pp"][top]),
            int(cands["first_stage_layers"][top])) == (2**23, 32, 5)
    assert float(cols["gpu_peak_bytes"][top]) > 13 * 2 * scores > 2**63


def test_result_rows_carry_exact_python_ints():
    cluster = loading.cluster_for_gpus("a100-80gb", 256)
    setup = make_setup(32768, 2**23, 1e12)
    result = sweep.sweep(DENSE_10T, cluster, setup, sweep.Constraints(tp=(8,), pp=(16,)),
                         top=1, rejected=3)
    assert result.fitting == 0 and result.rejected
    assert all(row.gpu_peak_bytes > 0 and row.headroom_bytes < 0 for row in result.rejected)


# --------------------------------------------------------------------------- property (issue 14)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def _huge_cases(draw):
    """Models up to 100T parameters (12·L·h² = 12 · 2000 · 65536² = 1.03e14 at the largest),
    contexts up to 10M tokens, global batches up to 2^24 sequences, 8 to 2^20 GPUs: the limits
    issue 14 names."""
    heads = draw(st.sampled_from([8, 16, 64, 128]))
    hidden = heads * draw(st.sampled_from([64, 128, 256, 512]))
    layers = draw(st.integers(1, 2000))
    seq = draw(st.sampled_from([2048, 32768, 1 << 20, 10_000_000]))
    gpus = 8 * 2 ** draw(st.integers(0, 17))
    batch = gpus * 2 ** draw(st.integers(0, 24 - min(24, (gpus // 8).bit_length() + 2)))
    model = ModelSpec(name="huge", num_layers=layers, hidden_size=hidden, num_heads=heads,
                      ffn_hidden_size=4 * hidden, vocab_size=128_000, max_seq_len=seq)
    return model, seq, gpus, batch


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_huge_cases())
def test_sizes_up_to_the_limits_give_finite_non_negative_figures_that_fit_and_sweep_share(case):
    model, seq, gpus, batch = case
    cluster = loading.cluster_for_gpus("a100-80gb", gpus)
    setup = make_setup(seq, batch, 1e12)
    c = sweep.Constraints(tp=(1,), pp=(1,), zero_stage=(3,), virtual_stages=(1,), recompute=("full",))
    cands = sweep.enumerate_candidates(model, cluster, setup, c)
    assert len(cands["micro_batch"]) > 0  # batch is a multiple of the GPUs: dp = GPUs always works
    cols = sweep.evaluate(model, cluster, setup, cands, c)
    peak = np.asarray(cols["gpu_peak_bytes"], dtype=float)
    assert np.all(np.isfinite(peak)) and np.all(peak > 0)
    for i in {0, len(peak) - 1}:
        exact = max(s.total_bytes for s in plan_memory(model, cluster, sweep.layout_at(cands, i, c),
                                                       setup).stages)
        assert exact > 0
        assert float(peak[i]) == pytest.approx(exact, rel=1e-12)


# --------------------------------------------------------------------------- layout products
from pydantic import ValidationError  # noqa: E402

from conftest import run_zplan  # noqa: E402
from planner.core.spec import MAX_RANKS, MAX_SEQUENCES, Layout  # noqa: E402
from planner.timing import steptime  # noqa: E402


def test_a_batch_product_that_would_wrap_is_refused_not_matched():
    """(2^63 - 1)^2 = 2^126 - 2^64 + 1, which is 1 modulo 2^64: in int64 columns micro_batch =
    grad_accum = 2^63 - 1 on one GPU 'equal' a global batch of 1. Before the bounds this passed
    the batch rule, printed a negative step time and exited 1 ("does not fit")."""
    big = np.array([2**63 - 1], dtype=np.int64)
    with np.errstate(over="ignore"):
        assert int((big * big * np.int64(1))[0]) == 1  # the wrap the bounds rule out
    with pytest.raises(ValidationError, match="less than or equal to 1073741824"):
        Layout(micro_batch=2**63 - 1, grad_accum=2**63 - 1)
    proc = run_zplan("fit", "--model", "gpt2", "--gpu", "a100-80gb", "--gpus", "1", "--micro-batch",
                     str(2**63 - 1), "--grad-accum", str(2**63 - 1), "--global-batch", "1")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and proc.stdout == ""
    assert proc.stderr.startswith("zplan: error: micro_batch:")


def test_products_of_layout_fields_are_bounded_with_exact_integers():
    """Each field within its bound, their product past it: refused by Python's exact ints before
    the rule table multiplies them in int64."""
    with pytest.raises(ValidationError, match=r"tp\*cp\*pp\*dp = 1048576\*1\*1048576\*2 = "):
        Layout(tp=2**20, pp=2**20, dp=2)
    assert 2**20 * 2**20 * 2 > MAX_RANKS
    with pytest.raises(ValidationError, match=r"micro_batch\*grad_accum\*dp = 32768\*32768\*2 = "):
        Layout(micro_batch=2**15, grad_accum=2**15, dp=2)
    Layout(micro_batch=2**15, grad_accum=2**15, dp=1)  # 2^30 = MAX_SEQUENCES: allowed
    assert 2**30 == MAX_SEQUENCES


def test_the_largest_batch_allowed_gives_a_finite_step_that_scales_linearly():
    """GPT-2 on one A100 at micro-batch = global batch = 2^30 (the bound) and at 2^20: tokens of a
    step are 2^30 x 1024 = 2^40, far from int64's 2^63. The step is compute-bound at both sizes,
    so its time grows 1024-fold (to 1e-3: the optimizer step is paid once per step) and tokens/s
    stays. At 2^54 sequences (2^64 tokens) the step time used to print nan."""
    model, cluster = loading.load_model("gpt2"), loading.cluster_for_gpus("a100-80gb", 1)

    def step(b: int) -> float:
        return steptime.estimate_step(model, cluster, Layout(micro_batch=b), make_setup(1024, b, 1e12)).step_s

    small, large = step(2**20), step(2**30)
    assert np.isfinite(large) and large > 0
    assert large / small == pytest.approx(1024, rel=1e-3)


def test_hardware_rates_are_bounded_below_so_every_time_stays_finite():
    """HBM at 1e-300 GB/s made the step time infinite (`--json` then refused to write it: exit 3).
    At the least rate allowed, 1e-3 GB/s, GPT-2's step is some 1e6 s or more (its bf16 weights
    alone, 2 x 124M bytes, read once at 1e6 B/s take 248 s) and still finite."""
    from planner.core.limits import MIN_RATE_GB_PER_S
    from planner.core.spec import GpuSpec, NodeSpec

    cluster = loading.load_cluster("dgx2x32")
    with pytest.raises(ValidationError, match="hbm_gb_per_s"):
        GpuSpec.model_validate({**cluster.gpu.model_dump(), "hbm_gb_per_s": 1e-300})
    with pytest.raises(ValidationError, match="peak_tflops"):
        GpuSpec.model_validate({**cluster.gpu.model_dump(), "peak_tflops": {"fp16": 1e-300}})
    with pytest.raises(ValidationError, match="nvme_read_gb_per_s=1e-300: 0 .no NVMe figures. or at least"):
        NodeSpec.model_validate({**cluster.node.model_dump(), "nvme_read_gb_per_s": 1e-300})
    NodeSpec.model_validate({**cluster.node.model_dump(), "nvme_read_gb_per_s": 0.0})  # no NVMe: allowed
    slow = cluster.model_copy(update={"gpu": GpuSpec.model_validate(
        {**cluster.gpu.model_dump(), "hbm_gb_per_s": MIN_RATE_GB_PER_S})})
    step = steptime.estimate_step(loading.load_model("gpt2"), slow, Layout(dp=512),
                                  make_setup(1024, 512, 1e12)).step_s
    assert 248 < step < float("inf")
