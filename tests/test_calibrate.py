"""Real torch training steps on tiny models, measured against hand calculations and the planner.

Tiny models on the CPU; the whole file runs in well under a minute on 2 cores.
Hand-calculated numbers follow seed 004 §2.2.3 (saved tensors of one GPT block: 34sbh + 5as²b
in fp16, i.e. per element: activations e bytes, dropout masks 1 byte) and seed 004 §1.2
(FLOPs: 24Bsh² + 4Bs²h per block forward at f = 4h, logits 2BshV, backward = 2 x forward).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from planner.memory.activations import layer_activation_bytes, layer_saved_bytes, selective_kept_bytes
from planner.calibrate.compare import compare
from planner.calibrate.config import scaled_model
from planner.calibrate.run import run_configuration
from planner.io.loading import load_model
from planner.core.params import count_params
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Layout, TrainSetup
from conftest import PACKAGE_PARENT  # tests/ is on sys.path (rootdir conftest), also for plain `pytest`

pytestmark = pytest.mark.torch

L, H, A, F, V = 2, 64, 4, 256, 100   # layers, hidden, heads, ffn (= 4h), vocab
S, B = 16, 2                         # sequence length, micro-batch
SBH = S * B * H                      # 2048 elements
AS2B = A * S * S * B                 # 2048 elements


def tiny(name: str, **extra: int):
    dims = {"layers": L, "hidden": H, "heads": A, "ffn": F, "vocab": V} | extra
    return scaled_model(load_model(name), **dims)


def setup(precision: str = "fp32", optimizer: str = "adam") -> TrainSetup:
    return TrainSetup(seq_len=S, global_batch=B, train_tokens=S * B,
                      precision=get_precision(precision), optimizer=get_optimizer(optimizer))


def run(name: str, precision: str = "fp32", recompute: str = "none", k: int = 2, **extra: int):
    model = tiny(name, **extra)
    st = setup(precision)
    layout = Layout(micro_batch=B, recompute=recompute, recompute_every_k=k, flash_attention=False)
    return model, st, layout, run_configuration(model, st, layout, steps=1, warmup=0)


@pytest.fixture(scope="module")
def gpt_fp32():
    return run("gpt2")


def test_parameter_count_gpt_by_hand(gpt_fp32) -> None:
    model, _, _, measured = gpt_fp32
    # embeddings V*h + learned positions 1024*h (gpt2 max_seq_len) = 6,400 + 65,536
    # block: q,k,v,o 4*(h*h + h) = 16,640; fc1 h*f + f = 16,640; fc2 f*h + h = 16,448; 2 LN 4h = 256
    # 2 blocks + final LN 2h = 128, tied head
    by_hand = 6_400 + 65_536 + 2 * (16_640 + 16_640 + 16_448 + 256) + 128
    assert measured.states.num_params == by_hand == count_params(model).total


@pytest.mark.parametrize("name, extra", [("llama3-8b", {"kv_heads": 2}), ("bert-large", {})])
def test_parameter_count_matches_planner(name: str, extra: dict) -> None:
    from planner.calibrate.models import build_model

    model = tiny(name, **extra)
    net = build_model(model, S)
    assert sum(p.numel() for p in net.parameters()) == count_params(model).total


def test_model_states_bf16_mixed_exact() -> None:
    model, st, _, measured = run("gpt2", precision="bf16-mixed")
    phi = count_params(model).total
    # ZeRO paper (seed 001 §1.3): bf16 param 2 + bf16 grad 2 + fp32 master, m, v 12 bytes
    assert (measured.states.params_bytes, measured.states.grads_bytes,
            measured.states.optimizer_bytes) == (2 * phi, 2 * phi, 12 * phi)
    rows = {r.quantity: r for r in compare(model, st, Layout(micro_batch=B, flash_attention=False), measured)}
    for q in ("parameters", "parameter bytes", "gradient bytes", "optimizer-state bytes"):
        assert rows[q].error_pct == 0


def test_model_states_megatron_main_grad_exact() -> None:
    model, _, _, measured = run("gpt2", precision="megatron-bf16")
    phi = count_params(model).total
    # seed 004 §3.5.1: bf16 param 2 + fp32 main_grad 4 + fp32 param, m, v 12 = 18 bytes
    assert (measured.states.params_bytes, measured.states.grads_bytes,
            measured.states.optimizer_bytes) == (2 * phi, 4 * phi, 12 * phi)


def test_saved_bytes_gpt_fp32_no_recompute_by_hand(gpt_fp32) -> None:
    model, _st, layout, measured = gpt_fp32
    # fp32 (4 bytes) everywhere but the 1-byte dropout masks (two sbh masks, one as²b mask):
    # seed's 34sbh = 32sbh of 2-byte tensors + 2sbh of masks -> 64sbh + 2sbh = 66sbh;
    # seed's 5as²b = softmax 2 + mask 1 + dropout output 2 -> 4 + 1 + 4 = 9as²b;
    # + LayerNorm mean and rstd, fp32, per token, two norms: 2 * 2 * s*b * 4
    by_hand = 66 * SBH + 9 * AS2B + 2 * 2 * S * B * 4
    assert sum(measured.saved_per_layer[0].values()) == by_hand
    assert layer_activation_bytes(model, layout, S, B, 4) == pytest.approx(by_hand, rel=0.02)


@pytest.mark.parametrize("recompute, by_hand_all_blocks", [
    ("full", L * 4 * SBH),                                   # each block keeps its fp32 input
    ("every_k", 4 * SBH),                                     # k = 2 = L: one checkpoint
    ("selective", L * (66 * SBH + 2 * 2 * S * B * 4)),       # the 9as²b core is recomputed
])
def test_saved_bytes_gpt_recompute_modes(recompute: str, by_hand_all_blocks: int) -> None:
    model, st, layout, measured = run("gpt2", recompute=recompute)
    blocks = sum(sum(layer.values()) for layer in measured.saved_per_layer)
    assert blocks == by_hand_all_blocks
    row = next(r for r in compare(model, st, layout, measured) if r.quantity.startswith("saved activations, all"))
    assert abs(row.error_pct) <= 2.0, f"planner inventory off by {row.error_pct:.2f} % ({recompute})"


def test_saved_bytes_bert_matches_inventory_per_class() -> None:
    model, _st, layout, measured = run("bert-large")
    predicted = layer_saved_bytes(model, layout, S, B, 4)
    assert measured.saved_per_layer[0] == predicted  # post-LN encoder: same classes, same bytes


def test_flops_gpt_by_hand(gpt_fp32) -> None:
    model, st, layout, measured = gpt_fp32
    block = 24 * B * S * H * H + 4 * B * S * S * H   # seed 004 §1.2.3 at f = 4h
    forward = L * block + 2 * B * S * H * V          # + logits, seed 004 §1.2.4
    assert measured.forward_flops == forward == 6_963_200
    assert measured.backward_flops == 2 * forward
    row = next(r for r in compare(model, st, layout, measured) if r.quantity == "FLOPs per step (hardware)")
    assert abs(row.error_pct) <= 1.0


def test_flops_full_recompute_adds_one_forward_of_the_blocks() -> None:
    _model, _st, _layout, measured = run("gpt2", recompute="full")
    block = 24 * B * S * H * H + 4 * B * S * S * H
    forward = L * block + 2 * B * S * H * V
    assert measured.backward_flops == 2 * forward + L * block   # seed 004 §1.4: the 8PD rule


def test_two_process_gloo_ddp_zero1_fsdp2() -> None:
    from planner.calibrate.distributed import run_distributed

    model = tiny("gpt2")
    phi = count_params(model).total
    out = run_distributed(model, S, B, nproc=2, device="cpu")
    ranks = out["ranks"]
    assert [r["ddp"]["allreduce_bytes"] for r in ranks] == [4 * phi, 4 * phi]   # fp32 gradients
    assert sum(r["ddp"]["zero1_numel"] for r in ranks) == phi                   # a partition
    # fully_shard on 2 blocks + root = 3 units: all-gather forward 3 + backward 2 (root kept), RS 3
    assert all(r["fsdp2"]["collectives"] == {"allgather_base": 5, "reduce_scatter_base": 3} for r in ranks)
    exact = [r for r in out["rows"] if "even split" not in r.quantity]
    assert all(r.measured == r.predicted for r in exact), [r for r in exact if r.measured != r.predicted]


def _run_cli(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=PACKAGE_PARENT, check=False)


def test_cli_json_and_calibration_file(tmp_path) -> None:
    out = tmp_path / "calib.yaml"
    proc = _run_cli(
        "from planner.cli.app import main; main(['calibrate', '--model', 'gpt2', '--layers', '1', '--hidden', '32', "
        "'--heads', '2', '--ffn', '128', '--vocab', '50', '--seq-len', '8', '--steps', '1', "
        f"'--peak-tflops', '1', '--json', '--out', '{out}'])")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "calibrate"
    rows = {r["quantity"]: r for r in doc["configurations"][0]["rows"]}
    assert rows["parameters"]["error_pct"] == 0
    assert doc["configurations"][0]["measured"]["norm_impl"] == "fused"  # the default, reported
    from planner.io.calibration import efficiency_for, load_calibration

    assert efficiency_for(load_calibration(out), "cpu", "fp32") is not None


def test_without_torch_prints_install_hint_and_exits_2() -> None:
    proc = _run_cli("import sys; sys.modules['torch'] = None; from planner.cli.app import main; "
                    "main(['calibrate', '--model', 'gpt2'])")
    assert proc.returncode == 2
    assert "pip install torch==2.13.0" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_without_torch_the_rest_of_zplan_works() -> None:
    proc = _run_cli("import sys; sys.modules['torch'] = None; from planner.cli.app import main; main(['version'])")
    assert proc.returncode == 0, proc.stderr


def test_saved_bytes_llama_selective_gqa_kv() -> None:
    model, _st, layout, measured = run("llama3-8b", recompute="selective", kv_heads=2)
    d = H // A
    # kept K (and V): s*b*kv*d elements x 4 bytes = 16*2*2*16*4 = 4,096 bytes, measured by torch
    assert measured.saved_per_layer[0]["attn.k"] == S * B * 2 * d * 4
    # selective recompute repeats K, V to the query heads inside the recomputed core (Megatron
    # DotProductAttention.forward), so the kept K, V have kv heads (docs/calibrate.md, finding 1)
    kept = selective_kept_bytes(model, layout, S, B, 4, layer_saved_bytes(model, layout, S, B, 4))
    assert kept["attn.k"] == measured.saved_per_layer[0]["attn.k"]
    assert kept["attn.v"] == measured.saved_per_layer[0]["attn.v"]


def test_moe_parameters_flops_and_routed_classes() -> None:
    """Mixtral-style tiny MoE (E = 8 experts, top-2, SwiGLU experts of width 96), fp32."""
    model, _st, layout, measured = run("mixtral-8x7b", kv_heads=2, ffn=96)
    assert measured.states.num_params == count_params(model).total
    t, k, e, h, f, d = S * B, 2, 8, H, 96, H // A
    # seed 004 §1.2: attention Q,O 2*T*h*h each + K,V 2*T*h*(kv*d) each + core 4*B*s²*h;
    # router 2*T*h*E; each token through k SwiGLU experts, 3 matrices: 2*3*k*T*h*f; logits 2*T*h*V
    attention = 2 * 2 * t * h * h + 2 * 2 * t * h * (2 * d) + 4 * B * S * S * h
    block = attention + 2 * t * h * e + 2 * 3 * k * t * h * f
    assert measured.forward_flops == L * block + 2 * t * h * V
    saved = measured.saved_per_layer[0]
    assert saved["moe.router_probs"] == t * e * 4           # fp32 softmax over all experts
    assert saved["moe.expert_input"] == k * t * h * 4        # each token copied to its k experts
    assert saved["moe.expert.fc2_input"] == k * t * f * 4
    assert saved["moe.routing_weights"] == k * t * 4
    predicted = layer_saved_bytes(model, layout, S, B, 4)
    for name, n in predicted.items():
        if name.startswith(("moe.", "attn.")) or name == "mlp.fc1_input":
            assert saved[name] == n, name
