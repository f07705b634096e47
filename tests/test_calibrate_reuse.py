"""The reuse-distance part (planner/calibrate/reuse.py): distances from an op order, the curve
lookup, the last-level cache read from sysfs, and the predictor's use of it. Every expected
value is worked out by hand in the test."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from planner.calibrate.predict import Inventory, OpRecorder, compute_seconds
from planner.calibrate.reuse import (OpTouch, ReuseCurve, last_level_cache_bytes, op_distance, parse_cache_size,
                                     cyclic_distances, reuse_distances)
from test_calibrate_hardware import _parts  # tests/ is on sys.path (rootdir conftest)


def test_reuse_distances_of_a_made_up_op_order() -> None:
    # A writes x (100 B). B reads x, writes y (50 B). C reads y, writes z (10 B).
    # D reads x and z and the never-written p (8 B), writes w (20 B).
    ops = [OpTouch(reads=(), writes=(("x", 100),)),
           OpTouch(reads=(("x", 100),), writes=(("y", 50),)),
           OpTouch(reads=(("y", 50),), writes=(("z", 10),)),
           OpTouch(reads=(("x", 100), ("z", 10), ("p", 8)), writes=(("w", 20),))]
    # bytes touched: A 100, B 150, C 60 -> running totals 100, 250, 310 at the ends of A, B, C.
    # B reads x last touched at the end of A: 100 - 100 = 0.  C reads y (end of B): 250 - 250 = 0.
    # D reads x, last touched by B (a read counts): 310 - 250 = 60 (C's 60 bytes in between);
    # z written by C: 0; p touched by no earlier op: None.
    assert reuse_distances(ops) == [(), (0,), (0,), (60, 0, None)]
    # The step repeated with 1000 B of optimizer traffic between: D touches 100 + 10 + 8 + 20 = 138
    # -> the step ends at 448. p was last touched by D itself (end 448), D starts at 310:
    # 448 - 448 (the tail after p's last touch) + 1000 + 310 (the head before D) = 1310.
    assert cyclic_distances(ops, 1000) == [(), (0,), (0,), (60, 0, 1310)]


def test_op_distance_is_the_byte_weighted_mean_with_cold_inputs_at_cold_bytes() -> None:
    # (100 x 1000 + 300 x 40) / 400 = (100000 + 12000) / 400 = 280
    assert op_distance([100, 300], [None, 40], cold_bytes=1000) == pytest.approx(280)
    assert op_distance([], [], cold_bytes=1000) == 1000


def test_reuse_curve_lookup_bilinear_in_log_bytes_and_distance_held_at_the_edges() -> None:
    curve = ReuseCurve(kind="copy", bytes_moved=(100.0, 10000.0), distances_bytes=(0.0, 100.0),
                       ratios=((1.0, 3.0), (1.0, 5.0)))
    # D = 50: rows 1 + 0.5 x 2 = 2 and 1 + 0.5 x 4 = 3; 1000 B is halfway between 100 and 10000 in log
    assert curve.factor(1000, 50) == pytest.approx(2.5)
    assert curve.factor(10, 500) == pytest.approx(3.0)  # below the smallest size, beyond the largest D
    assert curve.factor(1e6, 0) == pytest.approx(1.0)
    assert curve.factor(1e6, 25) == pytest.approx(2.0)  # 1 + 0.25 x 4, largest size held


def test_last_level_cache_is_the_highest_level_data_or_unified_cache(tmp_path: Path) -> None:
    for index, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"),
                                                 (2, "Unified", "512K"), (3, "Unified", "32768K")]):
        d = tmp_path / f"index{index}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    size, source = last_level_cache_bytes("cpu", tmp_path)
    assert size == 32768 * 1024 == 33554432 and "level 3" in source
    assert parse_cache_size("2M") == 2097152 and parse_cache_size("4096") == 4096


def test_recorder_reuse_distances_on_meta_tensors() -> None:
    a, b = torch.empty(4, device="meta"), torch.empty(4, device="meta")  # 16 bytes each
    recorder = OpRecorder()
    with recorder:
        x = a + b         # reads a, b (never touched: None); touches 16 + 16 + 16 = 48
        y = x * x         # reads x (one storage, 16 B): 0; touches 16 + 16 = 32 -> running 80
        (a + y).sum()     # add reads a (last touched at 48: 80 - 48 = 32) and y (0); touches 48 -> 128
                          # sum reads the add's output (0)
    kinds = [k for k, _ in recorder.kernels]
    assert kinds == ["elementwise", "elementwise", "elementwise", "reduction"]
    # The loop (cyclic_distances, 10 B between steps): sum reads 16 and writes a 4-byte scalar, 20 B ->
    # the step ends at 148. a was last touched by the second add (ends at 128): 148 - 128 + 10 + 0 = 30;
    # b only by the first (ends at 48): 148 - 48 + 10 + 0 = 110.
    assert recorder.kernel_reads(10) == (((16, 30), (16, 110)), ((16, 0),), ((16, 32), (16, 0)), ((16, 0),))


def test_predictor_multiplies_each_memory_bound_op_by_its_reuse_factor() -> None:
    plain = _parts(collectives=False)
    # elementwise and copy: ratio 1 at D = 0, 3 at D = 1000 B and beyond, at every size
    curves = tuple(ReuseCurve(kind=k, bytes_moved=(8192.0, 1e9), distances_bytes=(0.0, 1000.0),
                              ratios=((1.0, 3.0), (1.0, 3.0))) for k in ("elementwise", "copy"))
    parts = plain.model_copy(update={"reuse": curves})
    # op 1: elementwise 8192 B, one input 4096 B cold -> D = the largest distance, 1000 -> x3
    # op 2: copy 8192 B, inputs 4096 B at D 0 and 4096 B at D 500 -> mean 250 -> 1 + 0.25 x 2 = 1.5
    inv = Inventory(gemms=(), kernels=(("elementwise", 8192), ("copy", 8192)), views=0,
                    kernel_reads=(((4096, None),), ((4096, 0), (4096, 500))))
    base = plain.kernel("elementwise").seconds(8192)  # 1e-6 s (the curves' first point)
    assert compute_seconds(inv, plain)[1] == pytest.approx(2 * base)
    assert compute_seconds(inv, parts)[1] == pytest.approx(3 * base + 1.5 * base)
