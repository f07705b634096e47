"""Calibration files (planner.calibration): schema, loader, efficiency lookup. No torch needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.calibrate.partition import fsdp2_local_numels, zero1_partition_numels
from planner.io.calibration import (
    Calibration,
    EfficiencyEntry,
    efficiency_for,
    load_calibration,
    merge_calibrations,
    write_calibration,
)
from planner.core.errors import PlanInputError


def _entry(gpu: str, dtype: str, eff: float | None, flops_per_s: float, step_s: float) -> EfficiencyEntry:
    return EfficiencyEntry(gpu=gpu, dtype=dtype, achieved_flops_per_s=flops_per_s,
                           peak_flops_per_s=312e12 if eff else None, efficiency=eff, model="m",
                           tokens_per_step=128, step_time_s=step_s)


def test_roundtrip_and_lookup(tmp_path: Path) -> None:
    cal = Calibration(entries=[
        _entry("a100-80gb", "bf16", 0.40, 124.8e12, 0.1),   # 12.48e12 FLOPs per step
        _entry("a100-80gb", "bf16", 0.45, 140.4e12, 1.0),   # 140.4e12 FLOPs per step: the largest run
        _entry("a100-80gb", "fp32", None, 10e12, 1.0),       # peak unknown
    ])
    path = tmp_path / "calib.yaml"
    write_calibration(cal, path)
    loaded = load_calibration(path)
    assert loaded == cal
    assert efficiency_for(loaded, "a100-80gb", "bf16") == 0.45
    assert efficiency_for(loaded, "a100-80gb", "fp32") is None   # no efficiency without a peak
    assert efficiency_for(loaded, "h100-sxm", "bf16") is None


def test_merge_appends_entries() -> None:
    a = Calibration(entries=[_entry("cpu", "fp32", None, 1e9, 1.0)], overheads={"x": 1.0})
    b = Calibration(entries=[_entry("a100-80gb", "bf16", 0.4, 1e14, 1.0)], overheads={"y": 2.0})
    merged = merge_calibrations(a, b)
    assert [e.gpu for e in merged.entries] == ["cpu", "a100-80gb"]
    assert merged.overheads == {"x": 1.0, "y": 2.0}


@pytest.mark.parametrize("text, field", [
    ("entries: [{gpu: a, dtype: bf17}]", "dtype"),
    ("- just a list", "mapping"),
    (("entries: [{gpu: a, dtype: bf16, achieved_flops_per_s: 1, model: m, tokens_per_step: 1, "
      "step_time_s: 1, efficiency: 1.5}]"), "efficiency"),
    ("schema_version: 9", "schema_version"),
])
def test_bad_files_name_the_problem(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PlanInputError) as err:
        load_calibration(path)
    assert err.value.field == "calibration" and field in err.value.message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PlanInputError, match="no such file"):
        load_calibration(tmp_path / "nope.yaml")


def test_zero1_whole_parameter_rule_by_hand() -> None:
    # torch ZeroRedundancyOptimizer: largest first, each to the rank with the fewest elements:
    # 10 -> r0 (0,0); 7 -> r1 (10,0); 5 -> r1 (10,7); 3 -> r0 (10,12) => r0 13, r1 12
    assert zero1_partition_numels([3, 10, 5, 7], 2) == [13, 12]
    # ties go to the lowest rank: 4 -> r0, 4 -> r1, 4 -> r0
    assert zero1_partition_numels([4, 4, 4], 2) == [8, 4]


def test_fsdp2_dim0_chunks_by_hand() -> None:
    # (5, 2): chunks of ceil(5/2) = 3 rows -> r0 3x2 = 6, r1 2x2 = 4, both padded to 6
    # (3,):   chunks of 2 rows            -> r0 2,         r1 1,        both padded to 2
    assert fsdp2_local_numels([(5, 2), (3,)], 2, 0) == (6 + 2, 6 + 2)
    assert fsdp2_local_numels([(5, 2), (3,)], 2, 1) == (4 + 1, 6 + 2)
    # 3 ranks over 2 rows: chunks of 1 row, rank 2 holds nothing but still pads one row
    assert fsdp2_local_numels([(2, 4)], 3, 2) == (0, 4)
