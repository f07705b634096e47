"""`zplan calibrate` wiring (issues 11 and 12 follow-ups): `--hf-config` runs the transformers
harness, `--json` documents validate against their published schemas, `--nproc` under a CUDA
request is refused without enough devices (simulated device counts), bad input is one line and
exit 2.

The tiny Llama config and its 9,088 saved bytes per block (bf16, s = 8, b = 2, h = 16, a = 4,
kv = 2, d = 4, f = 24, V = 32) are the hand calculation of tests/test_hf_implementations.py
(derivation in docs/implementations.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import run_zplan
from planner.calibrate.config import check_nproc_devices
from planner.cli.app import app
from planner.core.errors import PlanInputError

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "docs" / "schema"
LLAMA = dict(model_type="llama", hidden_size=16, intermediate_size=24, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=2, vocab_size=32, max_position_embeddings=16)
TINY = ["--model", "gpt2", "--layers", "1", "--hidden", "32", "--heads", "2", "--ffn", "64", "--vocab", "64",
        "--seq-len", "8", "--micro-batch", "2", "--steps", "1", "--warmup", "0"]


def _validate(kind: str, document: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads((SCHEMA_DIR / f"{kind}.json").read_text()))
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:3]]


# --------------------------------------------------------------------------- --nproc vs devices


def test_nproc_on_the_cpu_is_bounded_by_the_cores() -> None:
    """4 ranks per core, at least 8: --nproc 100000 used to start processes importing torch
    until the machine ran out of memory."""
    check_nproc_devices(8, "cpu", False, 0, cpu_cores=1)      # at least 8
    check_nproc_devices(64, "auto", False, 0, cpu_cores=16)   # 4 x 16
    with pytest.raises(PlanInputError) as err:
        check_nproc_devices(65, "cpu", True, 8, cpu_cores=16)
    assert err.value.field == "nproc" and "at most 64 ranks on this 16-core machine" in str(err.value)
    with pytest.raises(PlanInputError):
        check_nproc_devices(100_000, "auto", False, 0, cpu_cores=2)
    check_nproc_devices(100_000, "cuda", True, 100_000, cpu_cores=2)  # one rank per GPU: the GPUs bound it


def test_nproc_needs_one_cuda_device_per_rank() -> None:
    check_nproc_devices(2, "cuda", True, 2)          # enough devices
    check_nproc_devices(4, "cpu", True, 1)           # the CPU with gloo: up to 8 ranks on 1 core
    check_nproc_devices(4, "auto", False, 0)         # auto without CUDA is the CPU
    check_nproc_devices(1, "cuda", True, 1)          # one rank
    for device, available, count in (("cuda", True, 1), ("cuda:0", True, 3), ("auto", True, 1)):
        with pytest.raises(PlanInputError) as err:
            check_nproc_devices(4 if count == 3 else 2, device, available, count)
        assert err.value.field == "nproc" and "--device cpu" in str(err.value)


@pytest.mark.parametrize("args", [["calibrate", "model", *TINY, "--nproc", "2", "--device", "cuda"],
                                  ["calibrate", "hardware", "--nproc", "4", "--device", "auto"]])
def test_cli_refuses_more_ranks_than_gpus(monkeypatch, args) -> None:
    """One GPU simulated: torch.cuda says available with 1 device; nothing is run or spawned."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "nproc" in lines[0] and "this machine has 1" in lines[0], result.stderr


# --------------------------------------------------------------------------- --hf-config


@pytest.mark.torch
@pytest.mark.cli
def test_hf_config_runs_the_transformers_harness(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    args = ["calibrate", "--hf-config", str(tmp_path / "config.json"), "--seq-len", "8", "--micro-batch", "2",
            "--precision", "bf16", "--layers", "1"]
    human = run_zplan(*args, cwd=tmp_path)
    assert human.returncode == 0, human.stderr
    assert "cpu, 1 layers" in human.stdout and "9,088" in human.stdout
    doc = run_zplan(*args, "--json", cwd=tmp_path)
    assert doc.returncode == 0, doc.stderr
    document = json.loads(doc.stdout)
    _validate("calibrate-hf", document)
    cpu, meta = document["rows"]
    assert cpu["measured_block_bytes"] == 9088 and cpu["mismatched_classes"] == []
    assert meta["where"] == "meta, 2 layers" and meta["measured_params"] == 4944


@pytest.mark.torch
@pytest.mark.cli
@pytest.mark.parametrize("extra, field", [
    (["--hf-config", "missing/config.json"], "hf_config"),
    (["--hf-config", "CFG", "--model", "gpt2"], "hf_config"),
    (["--hf-config", "CFG", "--attention", "magic"], "attention"),
    (["--hf-config", "CFG", "--precision", "int3"], "precision"),
    ([], "model"),
])
def test_hf_config_bad_input_is_one_line_exit_2(tmp_path: Path, extra, field) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    args = [str(tmp_path / "config.json") if a == "CFG" else a for a in extra]
    result = run_zplan("calibrate", "model", *args, "--seq-len", "8", "--layers", "1", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "config.json"]  # nothing written


def test_hf_config_without_transformers_is_one_line(monkeypatch, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from planner.calibrate import hf_models

    monkeypatch.setattr(hf_models, "transformers_available", lambda: False)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    result = CliRunner().invoke(app, ["calibrate", "--hf-config", str(tmp_path)])
    assert result.exit_code == 2
    assert "pip install 'zplan[hf]'" in result.stderr and len(result.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- --json and --out


@pytest.mark.torch
@pytest.mark.cli
def test_calibrate_json_validates_and_out_appends(tmp_path: Path) -> None:
    """Two runs with one --out file: the second appends (locked, atomic) and loses nothing."""
    out = tmp_path / "cal.yaml"
    first = run_zplan("calibrate", *TINY, "--out", str(out), "--json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    document = json.loads(first.stdout)
    _validate("calibrate", document)
    assert document["configurations"][0]["rows"][0]["quantity"] == "parameters"
    second = run_zplan("calibrate", *TINY, "--recompute", "full", "--out", str(out), "--json", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    from planner.io.calibration import load_calibration

    entries = load_calibration(out).entries
    assert [e.recompute for e in entries] == ["none", "full"]
    assert json.loads(second.stdout)["calibration"]["entries"] == [e.model_dump(mode="json") for e in entries]


def test_hardware_json_validates(capsys) -> None:
    from planner.calibrate.fits import AlphaBeta
    from planner.calibrate.parts import HardwareParts, KernelCurve, OptimizerFit
    from planner.cli.report.calibrate_hardware import render_json
    from planner.core.spec import GemmPoint

    parts = HardwareParts(
        host="h", date="2026-11-23", zplan_version="0.1.0", torch_version="2.13.0", device="cpu",
        backend="gloo", threads_per_rank=1, world_size=1, num_nodes=1, peak_flops_per_s={"fp32": 1e11},
        peak_source="best measured", gemm=(GemmPoint(dtype="fp32", m=8, n=8, k=8, efficiency=0.5, source=""),),
        kernels=(KernelCurve(kind="copy", bytes_moved=(1.0, 2.0), times_s=(1.0, 2.0)),), view_op_s=1e-6,
        optimizer=OptimizerFit(latency_s=0.0, per_tensor_s=1e-5, per_element_s=1e-9), cpu_memory_bytes=2**30)
    assert AlphaBeta(latency_s=1e-6, bytes_per_s=1e9).seconds(1e9) == pytest.approx(1 + 1e-6)
    render_json(parts, ["gpus/x.yaml"], [])
    _validate("calibrate-hardware", json.loads(capsys.readouterr().out))


# --------------------------------------------------------------------------- which SDPA kernel ran


@pytest.mark.torch
def test_sdpa_backend_is_read_from_the_graph() -> None:
    """CPU SDPA without dropout runs its flash kernel (the inventory compared); with dropout in
    training it falls back to math (torch 2.13 sdp_utils_cpp.cpp: the CPU flash kernel takes no
    dropout), which the row flags as not modelled instead of comparing a wrong inventory."""
    pytest.importorskip("transformers")
    from planner.calibrate import hf_models
    from planner.calibrate.hf_run import measure_row
    from planner.calibrate.sdpa_backend import backend_name

    row = measure_row(LLAMA, "sdpa", "fp32", 8, 2, 1, "cpu")
    assert row.attention_backend == "flash" and row.mismatched_classes == ()
    dropped = hf_models.build_model({**LLAMA, "attention_dropout": 0.5}, "sdpa", "fp32", num_layers=1)
    got = hf_models.measure(dropped, 8, 2, "fp32", flops=False)
    assert got.sdpa_kernels == {} and backend_name(got.sdpa_kernels, 1) == "math"
    eager = measure_row(LLAMA, "eager", "fp32", 8, 2, 1, "cpu")
    assert eager.attention_backend == ""
    assert backend_name({"flash": 1}, 2) == "mixed (flash 1, math 1)"


# --------------------------------------------------------------------------- a run too big for the machine


def test_an_allocation_the_device_cannot_make_is_one_line_exit_2_not_a_bug(tmp_path: Path) -> None:
    """One block of width 32 at 1,000,000 tokens: the unfused attention scores alone are
    1e6 x 1e6 x 4 bytes = 4e12 bytes (torch asks the allocator for 1e12 bytes first), past this
    process's address-space limit of 16 GB. torch's CPU allocator refuses with a RuntimeError;
    that used to print "internal error (a bug in zplan)" and exit 3."""
    import resource
    import subprocess
    import sys

    pytest.importorskip("torch")
    from conftest import PACKAGE_PARENT

    (tmp_path / "small.yaml").write_text(
        "name: small\narch: decoder\nnum_layers: 1\nhidden_size: 32\nnum_heads: 2\nffn_hidden_size: 64\n"
        "vocab_size: 64\nmax_seq_len: 100000000\nmlp: gelu\nnorm: layernorm\nposition: rotary\n"
        "tied_embeddings: true\nlinear_bias: true\nfinal_norm: true\ndropout: false\n")
    limit = 16 * 10**9
    proc = subprocess.run(
        [sys.executable, "-m", "planner", "calibrate", "model", "--model", "small.yaml", "--seq-len",
         "1000000", "--micro-batch", "1", "--steps", "1", "--device", "cpu"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={"PATH": "", "PYTHONPATH": str(PACKAGE_PARENT)},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""
    assert proc.stderr.startswith("zplan: error: memory: the run needs more memory than this device has")


def test_other_runtime_errors_of_a_run_stay_bugs() -> None:
    from planner.cli.commands.calibrate_cmd import _within_memory

    with pytest.raises(PlanInputError) as err, _within_memory():
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert err.value.field == "memory"
    with pytest.raises(RuntimeError, match="shape mismatch"), _within_memory():
        raise RuntimeError("shape mismatch")
