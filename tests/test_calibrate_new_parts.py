"""The parts added for issue 12's 15 % goal: GEMMs at the step's shapes, the per-op dispatch
overhead, FSDP2's collectives as FSDP2 calls them; their node-profile keys. Every expected value
is worked by hand in the test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")

import torch  # noqa: E402
from test_calibrate_hardware import GIB_, _parts  # noqa: E402

from planner.calibrate import dispatch, fsdp2_collectives, shape_gemms  # noqa: E402
from planner.calibrate.collectives import spawn_fsdp2_groups  # noqa: E402
from planner.calibrate.config import scaled_model  # noqa: E402
from planner.calibrate.fits import AlphaBeta  # noqa: E402
from planner.calibrate.predict import (Inventory, StepConfig, communication_seconds,  # noqa: E402
                                       dispatch_overhead_seconds, engine_copy_seconds, engine_hook_seconds,
                                       fsdp2_group_shapes, gemm_seconds, gemm_total_seconds)
from planner.calibrate.profile_file import merge_with_collectives, write_profiles  # noqa: E402
from planner.core.spec import NodeSpec  # noqa: E402
from planner.io.loading import load_model, load_node  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- GEMMs at the step's shapes


def test_call_of_reads_the_layout_of_linear_and_its_backward() -> None:
    x, w = torch.randn(6, 4), torch.randn(5, 4)  # nn.Linear(4, 5) on 6 rows: addmm(bias, x, W.t())
    call = shape_gemms.call_of("addmm", (torch.randn(5), x, w.t()))
    assert (call.op, call.batch, call.m, call.n, call.k) == ("addmm", 1, 6, 5, 4)
    assert call.a_col_major is False and call.b_col_major is True  # W.t(): strides (1, 4)
    assert call.flops == 2 * 6 * 5 * 4  # 240
    # the weight gradient dy.t() @ x: A = dy.t() (5 x 6) column-major, B = x (6 x 4) row-major
    dw = shape_gemms.call_of("mm", (torch.randn(6, 5).t(), x))
    assert (dw.m, dw.n, dw.k, dw.a_col_major, dw.b_col_major) == (5, 4, 6, True, False)
    q, k = torch.randn(3, 7, 2), torch.randn(3, 7, 2)  # scores: q @ k.transpose
    sc = shape_gemms.call_of("bmm", (q, k.transpose(1, 2)))
    assert (sc.batch, sc.m, sc.n, sc.k, sc.b_col_major) == (3, 7, 7, 2, True)


@pytest.mark.parametrize("op,batch", [("mm", 1), ("addmm", 1), ("bmm", 3), ("baddbmm", 2), ("bmm", 1)])
def test_runner_runs_the_call_with_its_layout(op: str, batch: int) -> None:
    call = shape_gemms.GemmCall(op=op, batch=batch, m=5, n=3, k=4, a_col_major=True, b_col_major=False)
    out = shape_gemms.runner(call)()
    assert tuple(out.shape[-2:]) == (5, 3) and (out.dim() == 3) == (op in ("bmm", "baddbmm"))


def test_measured_calls_replace_the_table_and_the_rest_keep_it() -> None:
    fast = shape_gemms.GemmCall(op="mm", batch=1, m=64, n=64, k=64, a_col_major=False, b_col_major=False)
    other = fast.model_copy(update={"b_col_major": True})
    parts = _parts().model_copy(update={"shape_gemms": (shape_gemms.ShapeGemm(call=fast, seconds=1e-3),)})
    inv = Inventory(gemms=((1, 64, 64, 64),) * 3, kernels=(), views=0, gemm_calls=(fast, fast, other))
    # the table (every point 0.5 of 1e11 FLOP/s): 2·64³ / 5e10 = 10.48576 µs for `other`
    table = 2 * 64**3 / (0.5 * 1e11)
    assert gemm_seconds(_parts(), "fp32", 64, 64, 64) == pytest.approx(table)
    assert gemm_total_seconds(inv, parts) == pytest.approx(2 * 1e-3 + table)
    assert gemm_total_seconds(inv, _parts()) == pytest.approx(3 * table)  # no shapes measured: the table


def test_measure_times_each_distinct_call_once() -> None:
    a = shape_gemms.GemmCall(op="mm", batch=1, m=8, n=8, k=8, a_col_major=False, b_col_major=False)
    b = a.model_copy(update={"op": "addmm"})
    out = shape_gemms.measure([a, b, a], reps=3)
    assert [s.call for s in out] == [a, b] and all(s.seconds > 0 for s in out)


# --------------------------------------------------------------------------- per-op dispatch


def test_per_op_seconds_by_hand() -> None:
    # a tiny step of 10 ms, 4 ms of it predicted by the other parts, 1000 ops: 6 µs per op
    assert dispatch.per_op_seconds(10e-3, 4e-3, 1000) == pytest.approx(6e-6)
    assert dispatch.per_op_seconds(3e-3, 4e-3, 1000) == 0.0  # faster than the parts: no overhead, never negative
    with pytest.raises(ValueError):
        dispatch.per_op_seconds(1e-3, 0.0, 0)


def test_dispatch_term_is_per_op_times_every_recorded_op() -> None:
    inv = Inventory(gemms=((1, 2, 2, 2),) * 2, kernels=(("copy", 8),) * 3, views=4)
    assert dispatch.op_count(inv) == 2 + 3 + 4
    parts = _parts().model_copy(update={"dispatch_per_op_s": 5e-6})
    assert dispatch_overhead_seconds(inv, parts) == pytest.approx(9 * 5e-6)  # 45 µs
    assert dispatch_overhead_seconds(inv, _parts()) == 0.0  # an older parts file: no term


# --------------------------------------------------------------------------- FSDP2 as called


def test_fsdp2_probe_formulas_by_hand() -> None:
    assert fsdp2_collectives.group_bytes(128) == 128 * 128 * 4 == 65536
    # 4 groups: (50 ms sharded - 10 ms plain) / 4 = 10 ms per group
    assert fsdp2_collectives.per_group_seconds(50e-3, 10e-3, 4) == pytest.approx(10e-3)
    assert fsdp2_collectives.per_group_seconds(9e-3, 10e-3, 4) == 0.0
    # synthetic points t = 2 ms + B / 1 GB/s are recovered by the fit
    widths = (128, 256, 512)
    times = [2e-3 + fsdp2_collectives.group_bytes(w) / 1e9 for w in widths]
    fit = fsdp2_collectives.fitted(True, 2, widths, times)
    assert fit.fit.latency_s == pytest.approx(2e-3, rel=1e-6) and fit.fit.bytes_per_s == pytest.approx(1e9, rel=1e-6)
    assert fit.sizes_bytes == (65536.0, 262144.0, 1048576.0)


def _fsdp2_parts():
    """Measured points: a block group 3 ms at 1,000 B and 7 ms at 5,000 B (1 µs per byte between
    them), the root 2 ms at 10,000 B and 4 ms at 50,000 B (0.05 µs per byte); their α–β fits
    (the node profile's keys) 2 ms + B / 1 GB/s and 1 ms + B / 2 GB/s."""
    block = fsdp2_collectives.Fsdp2CollectiveFit(resharded=True, ranks=2, sizes_bytes=(1000.0, 5000.0),
                                                 times_s=(3e-3, 7e-3), fit=AlphaBeta(latency_s=2e-3, bytes_per_s=1e9))
    root = fsdp2_collectives.Fsdp2CollectiveFit(resharded=False, ranks=2, sizes_bytes=(10000.0, 50000.0),
                                                times_s=(2e-3, 4e-3), fit=AlphaBeta(latency_s=1e-3, bytes_per_s=2e9))
    return _parts().model_copy(update={"fsdp2_collectives": (block, root), "fsdp2_hook_s": 250e-6})


def test_fsdp2_part_is_read_on_its_points_by_hand() -> None:
    block, root = _fsdp2_parts().fsdp2_collectives
    assert block.seconds(3000) == pytest.approx(3e-3 + 2000 * 1e-6)  # between the points: 5 ms
    assert block.seconds(9000) == pytest.approx(7e-3 + 4000 * 1e-6)  # above: along the last segment, 11 ms
    assert block.seconds(10) == pytest.approx(3e-3)  # below: the smallest group's time
    assert root.seconds(30000) == pytest.approx(2e-3 + 20000 * 5e-8)  # 3 ms


def test_fsdp2_communication_from_the_as_called_part_by_hand() -> None:
    spec = scaled_model(load_model("gpt2"), layers=2, hidden=8, heads=2, ffn=32, vocab=10, kv_heads=None)
    cfg = StepConfig(name="t", model=spec, seq_len=4, micro_batch=1, strategy="fsdp2", nproc=2)
    # a block: Q, K, V, O 4·(8·8 + 8) = 288; fc1 32·8 + 32 = 288, fc2 8·32 + 8 = 264; two LayerNorms 4·8 = 32
    block_bytes = (288 + 288 + 264 + 32) * 4  # 872 parameters, 3488 bytes
    # the root: word 10·8 = 80, positions 1024·8 = 8192 (GPT-2's n_positions), final LayerNorm 16
    root_bytes = (80 + 8192 + 16) * 4  # 8288 parameters, 33152 bytes
    # read on the measured points (not the α–β fit): block 3 ms + (3488 - 1000) B x 1 µs/B = 5.488 ms,
    # root 2 ms + (33152 - 10000) B x 0.05 µs/B = 3.1576 ms
    expected = 2 * (3e-3 + (block_bytes - 1000) * 1e-6) + (2e-3 + (root_bytes - 10000) * 5e-8)
    assert expected == pytest.approx(2 * 5.488e-3 + 3.1576e-3)
    parts = _fsdp2_parts()
    assert communication_seconds(cfg, parts) == pytest.approx(expected)
    # copies and hooks are inside the as-called part: not added again
    assert engine_copy_seconds(cfg, parts) == 0.0 and engine_hook_seconds(cfg, parts) == 0.0
    # without the part: the bare all-gather twice + reduce-scatter per block (α 100 µs, 2 GB/s), the root once each
    bare = 2 * (3 * 100e-6 + 3 * block_bytes / 2e9) + 2 * 100e-6 + 2 * root_bytes / 2e9
    assert communication_seconds(cfg, _parts()) == pytest.approx(bare)


def test_fsdp2_groups_measured_at_their_shapes_replace_the_curve_by_hand() -> None:
    spec = scaled_model(load_model("gpt2"), layers=2, hidden=8, heads=2, ffn=32, vocab=10, kv_heads=None)
    cfg = StepConfig(name="t", model=spec, seq_len=4, micro_batch=1, strategy="fsdp2", nproc=2)
    block_bytes, root_bytes = (288 + 288 + 264 + 32) * 4, (80 + 8192 + 16) * 4  # as in the test above
    blocks, root = fsdp2_group_shapes(spec, 4)
    assert blocks[0] == blocks[1] and fsdp2_collectives.group_elements(blocks[0]) * 4 == block_bytes
    assert fsdp2_collectives.group_elements(root) * 4 == root_bytes
    assert fsdp2_collectives.group_elements([(3, 4), (5,)]) == 17
    # the block measured at its shapes (40 ms); the root not measured: the curve at its bytes (3.1576 ms)
    cost = fsdp2_collectives.Fsdp2GroupCost(resharded=True, ranks=2, shapes=tuple(blocks[0]), seconds=40e-3)
    parts = _fsdp2_parts().model_copy(update={"fsdp2_groups": (cost,)})
    assert communication_seconds(cfg, parts) == pytest.approx(2 * 40e-3 + 2e-3 + (root_bytes - 10000) * 5e-8)
    # measured for another schedule or rank count: not used (both blocks back on the curve, 5.488 ms each)
    for other in (cost.model_copy(update={"resharded": False}), cost.model_copy(update={"ranks": 4})):
        assert communication_seconds(cfg, _fsdp2_parts().model_copy(update={"fsdp2_groups": (other,)})) == \
            pytest.approx(2 * 5.488e-3 + 3.1576e-3)
    assert parts.fsdp2_group_seconds(True, 2, [list(s) for s in blocks[0]]) == 40e-3  # lists or tuples
    assert parts.fsdp2_group_seconds(True, 2, root) is None


def test_with_fsdp2_groups_asks_for_each_unmeasured_group_once(monkeypatch) -> None:
    """Two FSDP2 rows of one model and a DDP row: the model's two identical blocks are one group
    on the block schedule, its root one on the root's; a group the parts already hold is not
    asked for again; the DDP row asks for nothing."""
    from planner.calibrate import collectives, predict

    spec = scaled_model(load_model("gpt2"), layers=2, hidden=8, heads=2, ffn=32, vocab=10, kv_heads=None)
    rows = [StepConfig(name=n, model=spec, seq_len=4, micro_batch=1, strategy=s, nproc=2)
            for n, s in (("a", "fsdp2"), ("b", "fsdp2"), ("c", "ddp"))]
    blocks, root = fsdp2_group_shapes(spec, 4)
    asked = []

    def spawn(ranks, cfg):
        asked.append((ranks, cfg["groups"]))
        return [fsdp2_collectives.Fsdp2GroupCost(resharded=r, ranks=ranks, shapes=sh, seconds=1.0) for r, sh in cfg["groups"]]

    monkeypatch.setattr(collectives, "spawn_fsdp2_groups", spawn)
    parts = predict.with_fsdp2_groups(_fsdp2_parts(), rows)
    assert asked == [(2, [(True, tuple(blocks[0])), (False, tuple(root))])]
    assert len(parts.fsdp2_groups) == 2
    asked.clear()
    again = predict.with_fsdp2_groups(parts.model_copy(update={"fsdp2_groups": parts.fsdp2_groups[:1]}), rows)
    assert asked == [(2, [(False, tuple(root))])] and len(again.fsdp2_groups) == 2


def test_fsdp2_group_probe_on_two_real_ranks() -> None:
    """Two spawned gloo ranks time a probe group of given shapes on both schedules (every rank
    runs FSDP2 itself); the figures are positive and the shapes come back as asked."""
    groups = [(True, ((64, 32), (32,))), (False, ((16, 16),))]
    costs = spawn_fsdp2_groups(2, {"threads": 1, "device": "cpu", "timeout_s": 120, "clock": "wall", "groups": groups})
    assert [(c.resharded, c.shapes, c.ranks) for c in costs] == [(True, ((64, 32), (32,)), 2), (False, ((16, 16),), 2)]
    assert all(0 < c.seconds < 1 for c in costs)


def test_parts_fsdp2_fit_lookup() -> None:
    parts = _fsdp2_parts()
    assert parts.fsdp2_fit(True, 2).latency_s == 2e-3 and parts.fsdp2_fit(False, 2).latency_s == 1e-3
    assert parts.fsdp2_fit(True, 4) is None and _parts().fsdp2_fit(True, 2) is None


# --------------------------------------------------------------------------- the node profile keys


def test_node_profile_carries_the_new_parts_and_round_trips(tmp_path: Path) -> None:
    parts = _fsdp2_parts().model_copy(update={"dispatch_per_op_s": 6e-6})
    write_profiles(parts, tmp_path, "cpu-testhost", 16 * GIB_)
    node = load_node("cpu-testhost-node2", [tmp_path])
    assert node.fsdp2_hook_us == pytest.approx(250.0) and node.dispatch_per_op_us == pytest.approx(6.0)
    block = next(g for g in node.fsdp2_groups if g.schedule == "block")
    root = next(g for g in node.fsdp2_groups if g.schedule == "root")
    assert (block.ranks, block.latency_us, block.group_gb_per_s) == (2, pytest.approx(2000.0), pytest.approx(1.0))
    assert (root.latency_us, root.group_gb_per_s) == (pytest.approx(1000.0), pytest.approx(2.0))
    assert all(node.sources[k].startswith("measured on testhost") for k in ("fsdp2_hook_us", "dispatch_per_op_us"))
    assert block.source.startswith("measured on testhost")
    text = (tmp_path / "nodes" / "cpu-testhost-node2.yaml").read_text()
    assert node.model_dump(mode="json") == NodeSpec.model_validate(yaml.safe_load(text)).model_dump(mode="json")
    # a rerun without the FSDP2 probe (one rank's parts) keeps the measured entries
    merged = merge_with_collectives(yaml.safe_load(text), {"sources": {}, "fsdp2_groups": []})
    assert len(merged["fsdp2_groups"]) == 2


def test_node_profile_without_the_new_parts_has_no_new_keys(tmp_path: Path) -> None:
    write_profiles(_parts(), tmp_path, "cpu-old", 16 * GIB_)
    data = yaml.safe_load((tmp_path / "nodes" / "cpu-old-node2.yaml").read_text())
    assert not {"fsdp2_hook_us", "dispatch_per_op_us", "fsdp2_groups"} & set(data)


def test_node_keys_need_a_source_and_a_sane_value(tmp_path: Path) -> None:
    write_profiles(_fsdp2_parts(), tmp_path, "cpu-y", 16 * GIB_)
    data = yaml.safe_load((tmp_path / "nodes" / "cpu-y-node2.yaml").read_text())
    del data["sources"]["fsdp2_hook_us"]
    with pytest.raises(ValueError, match="fsdp2_hook_us"):
        NodeSpec.model_validate(data)
    data["sources"]["fsdp2_hook_us"] = "x"
    with pytest.raises(ValueError):
        NodeSpec.model_validate(data | {"fsdp2_hook_us": -1})
    with pytest.raises(ValueError):
        NodeSpec.model_validate(data | {"fsdp2_groups": [data["fsdp2_groups"][0] | {"schedule": "leaf"}]})


def test_bad_node_key_through_fit_is_one_line_and_exit_2(tmp_path: Path) -> None:
    write_profiles(_fsdp2_parts(), tmp_path, "cpu-z", 16 * GIB_)
    path = tmp_path / "nodes" / "cpu-z-node2.yaml"
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump(data | {"dispatch_per_op_us": -3.0}))
    proc = subprocess.run([sys.executable, "-m", "planner", "fit", "--model", "gpt2", "--cluster", "cpu-z-node2",
                           "--profiles", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "dispatch_per_op_us" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- the benchmark's new flag


def test_benchmark_attribute_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "calibrate_hardware.py"), "--attribute", "-1"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "--attribute" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []
