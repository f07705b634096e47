"""Calibration files written by `zplan calibrate --out FILE` and read by `--calibration FILE`.

A calibration file records what real training steps achieved per GPU type and dtype, as two
figures that mean different things:

- `efficiency`: the matmul-level fraction of dense peak, the quantity `GpuSpec.achieved_efficiency`
  and `planner.timing.steptime.estimate_step(efficiency=...)` mean. It is found by inverting the
  step-time model on the measured single-device run: the e for which the model's step
  (planner FLOPs / (peak x e) + memory-bound kernels + optimizer step) equals the measured step
  time (`planner.calibrate.results.invert_step_model`). `zplan fit/sweep --calibration` use it.
- `end_to_end_utilisation`: measured FLOPs per step / (step time x dense peak), the whole-step
  figure (an HFU); what `zplan budget/infer` want, which have no step-time model to add costs with.

Plus measured overheads (bytes the planner does not model, as ratios or byte counts). No torch
here: `zplan fit` and `zplan sweep` load these files without it.

    calibration = load_calibration(Path("calib.yaml"))
    eff = efficiency_for(calibration, "a100-80gb", "bf16")   # None when nothing was measured

Schema 2 (this file). Schema 1 files (whose `efficiency` was the whole-step figure) still load:
their figure becomes `end_to_end_utilisation`, and `efficiency_for` refuses them with a request
to re-run `zplan calibrate` rather than double-count the non-matmul time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from planner.core.errors import PlanInputError, format_validation_error
from planner.core.limits import MIN_EFFICIENCY
from planner.core.spec import Dtype, Frozen

CALIBRATION_SCHEMA_VERSION = 2

EfficiencySource = Literal["step_model", "end_to_end_fallback", "schema_1"]
"""How `efficiency` was derived: `step_model` = the step-time model inverted on the measured run
(matmul-level); `end_to_end_fallback` = no inversion possible, the whole-step figure stands in
(flagged, see the entry's note); `schema_1` = an old file, only the whole-step figure is known."""


class EfficiencyEntry(Frozen):
    """One measured configuration on one device type and dtype."""

    gpu: str
    """GPU profile name the run was measured on (e.g. `a100-80gb`), or `cpu`."""
    dtype: Dtype
    """Compute dtype of the matmuls."""
    achieved_flops_per_s: float = Field(ge=0)
    """FlopCounterMode FLOPs of one step (forward + backward + recompute) / step time."""
    peak_flops_per_s: float | None = Field(default=None, gt=0)
    """Dense peak of the device for `dtype` (from the GPU profile or `--peak-tflops`); None if unknown."""
    efficiency: float | None = Field(default=None, ge=MIN_EFFICIENCY, le=1)
    """Matmul-level fraction of the GPU profile's dense peak (what `achieved_efficiency` means):
    matmul_s_at_peak / (step_time_s - non_matmul_s), so that the step-time model reproduces the
    measured step. When `efficiency_source` is `end_to_end_fallback` it is the whole-step figure
    instead (see `note`). None when no peak is known or for schema-1 entries."""
    efficiency_source: EfficiencySource | None = None
    end_to_end_utilisation: float | None = Field(default=None, gt=0, le=1)
    """achieved_flops_per_s / peak_flops_per_s: the whole step (matmuls, element-wise kernels,
    optimizer) as one fraction of peak, measured FLOPs; None when the peak is unknown."""
    matmul_s_at_peak: float | None = Field(default=None, ge=0)
    """The step-time model's matmul time of this run at 100 % of the profile's peak: planner
    FLOPs (forward + backward + recompute) / dense peak. None without a GPU profile."""
    non_matmul_s: float | None = Field(default=None, ge=0)
    """The step-time model's other terms for this run on one GPU of the profile (memory-bound
    element-wise kernels + GPU optimizer step at HBM bandwidth). None without a GPU profile."""
    note: str = ""
    """How `efficiency` was derived, and why when it had to fall back."""
    model: str
    """The (scaled) model that was run, e.g. `gpt2[layers=2,hidden=64]`."""
    recompute: str = "none"
    tokens_per_step: int = Field(gt=0)
    step_time_s: float = Field(gt=0)
    device: str = ""
    """torch's device name (`cpu`, `NVIDIA A100-SXM4-80GB`)."""


class Calibration(Frozen):
    """A calibration file."""

    schema_version: int = CALIBRATION_SCHEMA_VERSION
    created: str = ""
    """UTC time of the measurement (ISO 8601)."""
    torch_version: str = ""
    entries: list[EfficiencyEntry] = Field(default_factory=list)
    overheads: dict[str, float] = Field(default_factory=dict)
    """Measured overheads, units in the key: e.g. `optimizer_step_counter_bytes_per_tensor`,
    `saved_activation_ratio` (measured / predicted saved bytes over all blocks)."""


def load_calibration(path: Path) -> Calibration:
    """Read a calibration YAML file; a bad file raises PlanInputError naming the field."""
    path = Path(path)
    if not path.is_file():
        raise PlanInputError("calibration", f"{path}: no such file")
    from planner.io.strict import read_yaml

    data = read_yaml(path, "calibration")
    if not isinstance(data, dict):
        raise PlanInputError("calibration", f"{path}: expected a mapping with `entries`")
    if data.get("schema_version") == 1:
        data = upgrade_schema_1(data)
    try:
        calibration = Calibration.model_validate(data)
    except ValidationError as err:
        raise PlanInputError("calibration", f"{path}: {format_validation_error(err)}") from None
    if calibration.schema_version != CALIBRATION_SCHEMA_VERSION:
        raise PlanInputError("calibration", f"{path}: schema_version {calibration.schema_version} "
                             f"not supported (this zplan reads {CALIBRATION_SCHEMA_VERSION})")
    return calibration


SCHEMA_1_NOTE = ("schema 1 file: `efficiency` was the whole-step figure, kept here as "
                 "end_to_end_utilisation; re-run zplan calibrate for the matmul-level efficiency")


def upgrade_schema_1(data: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 document as schema 2: each entry's whole-step `efficiency` moves to
    `end_to_end_utilisation` (its meaning); the matmul-level efficiency is unknown (the file
    lacks the model and layout needed to invert the step-time model)."""
    entries = []
    for entry in data.get("entries") or []:
        if not isinstance(entry, dict):
            entries.append(entry)  # validation names the problem
            continue
        whole_step = entry.get("efficiency")
        entries.append({**entry, "efficiency": None, "end_to_end_utilisation": whole_step,
                        "efficiency_source": "schema_1" if whole_step is not None else None,
                        "note": SCHEMA_1_NOTE})
    return {**data, "schema_version": CALIBRATION_SCHEMA_VERSION, "entries": entries}


def _flops_per_step(entry: EfficiencyEntry) -> float:
    return entry.achieved_flops_per_s * entry.step_time_s


def efficiency_for(calibration: Calibration, gpu_name: str, dtype: str) -> float | None:
    """Matmul-level efficiency for a GPU profile and dtype (what `estimate_step` means by
    `efficiency`): of the matching entries derived by inverting the step-time model, the one
    with the most FLOPs per step (the largest run is the most representative); failing those,
    a flagged whole-step fallback entry; None when nothing matches, so the caller keeps the
    profile's default. Schema-1 entries alone raise PlanInputError: their figure is whole-step
    and would count the element-wise and optimizer time twice."""
    matches = [e for e in calibration.entries if e.gpu == gpu_name and e.dtype == dtype]
    known = [e for e in matches if e.efficiency is not None]
    inverted = [e for e in known if e.efficiency_source != "end_to_end_fallback"]
    for found in (inverted, known):
        if found:
            return max(found, key=_flops_per_step).efficiency
    if any(e.efficiency_source == "schema_1" for e in matches):
        raise PlanInputError("calibration", f"the entries for {gpu_name} {dtype} come from a schema-1 "
                             "file, whose efficiency is the whole-step figure, not the matmul-level one "
                             "the step-time model needs; re-run `zplan calibrate --out FILE`")
    return None


def end_to_end_utilisation_for(calibration: Calibration, gpu_name: str, dtype: str) -> float | None:
    """Whole-step utilisation (measured FLOPs / (step time x peak)) for a GPU profile and dtype,
    for callers without a step-time model (`zplan budget/infer`): the matching entry with the
    most FLOPs per step; None when nothing matches."""
    found = [e for e in calibration.entries
             if e.gpu == gpu_name and e.dtype == dtype and e.end_to_end_utilisation is not None]
    return max(found, key=_flops_per_step).end_to_end_utilisation if found else None


def calibration_text(calibration: Calibration) -> str:
    """The file's YAML text, keys in schema order."""
    return yaml.safe_dump(calibration.model_dump(mode="json"), sort_keys=False)


def write_calibration(calibration: Calibration, path: Path) -> None:
    """Write the file atomically (temporary file in the same directory, then a rename)."""
    from planner.io.safe_write import write_atomic

    write_atomic(Path(path), calibration_text(calibration), force=True, field="--out")


def append_calibration(new: Calibration, path: Path) -> Calibration:
    """Add `new`'s entries to the file at `path` (created if missing) under an exclusive lock, so
    concurrent runs appending to one file lose nothing; returns what the file now holds."""
    from planner.io.safe_write import append_locked
    from planner.io.strict import parse_yaml

    merged: list[Calibration] = []

    def update(old_text: str | None) -> str:
        calibration = new
        if old_text is not None:
            data = parse_yaml(old_text, str(path), "calibration")
            if isinstance(data, dict) and data.get("schema_version") == 1:
                data = upgrade_schema_1(data)
            try:
                old = Calibration.model_validate(data)
            except ValidationError as err:
                raise PlanInputError("calibration", f"{path}: {format_validation_error(err)}") from None
            calibration = merge_calibrations(old, new)
        merged.append(calibration)
        return calibration_text(calibration)

    append_locked(Path(path), update)
    return merged[0]


def merge_calibrations(old: Calibration, new: Calibration) -> Calibration:
    """Append `new`'s entries to `old`'s (a file accumulates runs on several GPUs); new overheads win."""
    return new.model_copy(update={"entries": [*old.entries, *new.entries],
                                  "overheads": {**old.overheads, **new.overheads}})
