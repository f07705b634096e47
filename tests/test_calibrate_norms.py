"""The calibration models' norms: what the engines' fused kernels save (`--norm-impl fused`, the
default) against torch's own ops on the CPU (`--norm-impl torch`).

Fused RMSNorm saves (x, rstd fp32) and fused LayerNorm (x, mean fp32, rstd fp32), plus the
weights (parameters, not activations): Apex `apex/normalization/fused_layer_norm.py`
(`FusedRMSNormAffineFunction`, `FusedLayerNormAffineFunction`: `save_for_backward(input_, weight_,
[bias_, mean,] invvar)`, invvar / mean fp32 for 16-bit input) and torch `tools/autograd/
derivatives.yaml` `_fused_rms_norm` (backward reads input, weight and result1 = rstd). The
planner's inventory: norm*.input e·s·b·h, norm*.stats 4·s·b per statistic.
Tiny models on the CPU (a few seconds in all).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from planner.memory.activations import layer_saved_bytes
from planner.calibrate.config import check_norm_impl, scaled_model
from planner.calibrate.models import FusedLayerNorm, FusedRMSNorm
from planner.calibrate.run import run_configuration
from planner.core.errors import PlanInputError
from planner.io.loading import load_model
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout, TrainSetup

pytestmark = pytest.mark.torch

L, H, A, F, V = 2, 64, 4, 256, 100   # layers, hidden, heads, ffn, vocab
S, B = 16, 2                         # sequence length, micro-batch
EPS = 1e-5


def run(name: str, precision: str, norm_impl: str, **extra: int):
    model = scaled_model(load_model(name), layers=L, hidden=H, heads=A, ffn=F, vocab=V, **extra)
    setup = TrainSetup(seq_len=S, global_batch=B, train_tokens=S * B,
                       precision=get_precision(precision), optimizer=get_optimizer("adam"))
    layout = Layout(micro_batch=B, flash_attention=False)
    return model, layout, run_configuration(model, setup, layout, steps=1, warmup=0, norm_impl=norm_impl)


def reference_rms_norm(x, w):
    """Llama's RMSNorm written with autograd ops (the composite the Function replaces)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def reference_layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt((x - mean).pow(2).mean(-1, keepdim=True) + EPS) * w + b


def _inputs(*shapes):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True) for s in shapes]


def test_fused_rms_norm_gradcheck_and_matches_the_composite() -> None:
    x, w = _inputs((2, 3, 8), (8,))
    assert torch.autograd.gradcheck(lambda a, b: FusedRMSNorm.apply(a, b, EPS), (x, w))
    y, ref = FusedRMSNorm.apply(x, w, EPS), reference_rms_norm(x, w)
    torch.testing.assert_close(y, ref)
    dy = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, (x, w), dy), torch.autograd.grad(ref, (x, w), dy)):
        torch.testing.assert_close(got, want)


def test_fused_layer_norm_gradcheck_and_matches_the_composite() -> None:
    x, w, b = _inputs((2, 3, 8), (8,), (8,))
    assert torch.autograd.gradcheck(lambda a, c, d: FusedLayerNorm.apply(a, c, d, EPS), (x, w, b))
    y, ref = FusedLayerNorm.apply(x, w, b, EPS), reference_layer_norm(x, w, b)
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (8,), w, b, EPS))
    dy = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, (x, w, b), dy), torch.autograd.grad(ref, (x, w, b), dy)):
        torch.testing.assert_close(got, want)


def test_fused_rms_norm_saves_input_fp32_rstd_and_weight() -> None:
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(8, dtype=torch.bfloat16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        FusedRMSNorm.apply(x, w, EPS)
    assert [(tuple(t.shape), t.dtype) for t in saved] == [
        ((2, 3, 8), torch.bfloat16), ((2, 3, 1), torch.float32), ((8,), torch.bfloat16)]
    assert saved[0] is x  # the input itself, not a copy


@pytest.mark.parametrize("precision, e", [("fp32", 4), ("bf16-mixed", 2)])
def test_llama_fused_saves_the_planner_inventory_class_by_class(precision: str, e: int) -> None:
    model, layout, measured = run("llama3-8b", precision, "fused", kv_heads=2)
    block = measured.saved_per_layer[0]
    for norm in ("norm1", "norm2"):
        assert block[f"{norm}.input"] == S * B * H * e   # 16·2·64·e: 8,192 B fp32, 4,096 B bf16
        assert block[f"{norm}.stats"] == S * B * 4       # fp32 rstd per token: 16·2·4 = 128 B
    assert block == layer_saved_bytes(model, layout, S, B, e)
    assert measured.norm_impl == "fused"


def test_llama_torch_impl_measures_the_cpu_composite() -> None:
    """torch 2.13's CPU `F.rms_norm` is a composite: in fp32 it keeps x (pow, mul) and the
    normalised x for the weight multiply, 4 + 4 bytes per element, plus the fp32 rstd."""
    if torch.cuda.is_available():
        pytest.skip("on CUDA F.rms_norm is torch's fused kernel")
    _model, _layout, measured = run("llama3-8b", "fp32", "torch", kv_heads=2)
    block = measured.saved_per_layer[0]
    for norm in ("norm1", "norm2"):
        assert block[f"{norm}.input"] == 8 * S * B * H   # 8·16·2·64 = 16,384 B, not 4·s·b·h = 8,192
        assert block[f"{norm}.stats"] == 4 * S * B       # 128 B
    assert measured.norm_impl == "torch"


@pytest.mark.parametrize("norm_impl, stat_bytes", [("fused", 4), ("torch", 2)])
def test_gpt_bf16_layer_norm_statistics(norm_impl: str, stat_bytes: int) -> None:
    """Fused LayerNorm keeps mean and rstd in fp32 (Apex; CUDA native_layer_norm); CPU
    `native_layer_norm` returns them in bf16. Everything else in the block is the same."""
    if torch.cuda.is_available() and norm_impl == "torch":
        pytest.skip("CPU-only behaviour")
    model, layout, measured = run("gpt2", "bf16-mixed", norm_impl)
    block = measured.saved_per_layer[0]
    predicted = layer_saved_bytes(model, layout, S, B, 2)
    for norm in ("norm1", "norm2"):
        assert block[f"{norm}.stats"] == 2 * S * B * stat_bytes   # mean + rstd: 2·16·2·4 = 256 B or 128 B
        assert block[f"{norm}.input"] == S * B * H * 2             # bf16 input: 16·2·64·2 = 4,096 B
    assert predicted["norm1.stats"] == 2 * S * B * 4
    others = {k: v for k, v in block.items() if not k.endswith(".stats")}
    assert others == {k: v for k, v in predicted.items() if not k.endswith(".stats")}


def test_unknown_norm_impl_is_refused() -> None:
    with pytest.raises(PlanInputError) as err:
        check_norm_impl("apex")
    assert err.value.field == "norm-impl"


def test_cli_unknown_norm_impl_exits_2(zplan) -> None:
    result = zplan("calibrate", "--model", "gpt2", "--layers", "1", "--norm-impl", "apex")
    assert result.returncode == 2
    assert "norm-impl" in result.stderr and "Traceback" not in result.stderr


def test_calibration_file_names_the_norms_that_ran() -> None:
    from planner.calibrate.compare import class_rows, compare
    from planner.calibrate.config import RunSpec
    from planner.calibrate.results import ConfigResult, build_calibration

    model, layout, measured = run("llama3-8b", "fp32", "torch", kv_heads=2)
    setup = TrainSetup(seq_len=S, global_batch=B, train_tokens=S * B,
                       precision=get_precision("fp32"), optimizer=get_optimizer("adam"))
    result = ConfigResult(label="x", run=RunSpec(model=model, setup=setup, layout=layout), measured=measured,
                          rows=compare(model, setup, layout, measured),
                          classes=class_rows(model, setup, layout, measured))
    overheads = build_calibration([result], "cpu", None, "now", "2.13.0", None).overheads
    key = f"saved_activation_ratio[{model.name},none,fp32,norms=torch]"
    # the CPU composite: each of the 2 blocks keeps 4·s·b·h more per norm, 2 norms per block
    blocks = next(r for r in result.rows if r.quantity.startswith("saved activations, all"))
    assert blocks.measured - blocks.predicted == L * 2 * 4 * S * B * H
    assert overheads[key] == blocks.measured / blocks.predicted
