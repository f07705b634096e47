"""The JSON Schema of every `--json` document, generated from the pydantic models that make it.

Each document is `{"schema_version": 1, "kind": KIND, ...body}` (`planner.cli.report.emit_json`);
the models below add the envelope to the result models the commands already build, so the schema
is the code's own description, not a second copy. The published files are docs/schema/KIND.json
(draft 2020-12, pydantic's serialization mode); tests/test_json_schema.py checks that they are
up to date and that each command's actual output validates against its schema.

Regenerate after changing a result model:  python -m planner.cli.report.schema docs/schema
`zplan calibrate` (model, hardware, --hf-config) is covered too: its modules are torch-free.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict

from planner.calibrate.config import RunSpec
from planner.calibrate.parts import HardwareParts
from planner.calibrate.results import HFRow, Measured
from planner.core.spec import Layout
from planner.io.calibration import Calibration
from planner.memory.infer import InferPlan
from planner.memory.plan import NodeMemory, StageMemory
from planner.search.fitting import FitResult, ModelSummary
from planner.search.suggest import Suggestion
from planner.search.sweep import SweepResult
from planner.timing.budget import ComputeBudget, ModelBudget


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1]
    """Bumped when a field is renamed or removed (adding fields keeps the version)."""


class FitDocument(FitResult):
    """`zplan fit --json`."""

    schema_version: Literal[1]
    kind: Literal["fit"]
    verdict: str
    """The one verdict line the table output ends with."""
    engines: list[str]
    """Engines that can run the layout shown (planner/io/engines.py; docs/engines.md); empty
    when no layout is shown."""


class ModelDocument(ModelSummary):
    """`zplan show --json`."""

    schema_version: Literal[1]
    kind: Literal["model"]


class InferDocument(InferPlan):
    """`zplan infer --json`."""

    schema_version: Literal[1]
    kind: Literal["infer"]


class ComputeBudgetDocument(ComputeBudget):
    """`zplan budget --json` with GPUs and --days / --gpu-hours."""

    schema_version: Literal[1]
    kind: Literal["budget"]
    mode: Literal["compute"]
    gpu: str


class ModelBudgetDocument(ModelBudget):
    """`zplan budget --json` with --model / --params and --tokens."""

    schema_version: Literal[1]
    kind: Literal["budget"]
    mode: Literal["model"]
    gpu: Optional[str]


class SweepDocument(_Envelope):
    """`zplan sweep --json`: one result per GPU count."""

    kind: Literal["sweep"]
    results: list[SweepResult]


class PresetsDocument(_Envelope):
    """`zplan presets --json`: every loadable name by kind."""

    kind: Literal["presets"]
    models: list[str]
    gpus: list[str]
    nodes: list[str]
    clusters: list[str]


class CheckSetup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq_len: int
    global_batch: int
    train_tokens: float
    precision: str
    optimizer: str


class CheckDocument(_Envelope):
    """`zplan check --json` (planner.cli.report.check.check_payload)."""

    kind: Literal["check"]
    fits: bool
    """The verdict: exit code 0 when true, 1 when false."""
    verdict: str
    source: Literal["job", "deepspeed", "megatron"]
    model: str
    cluster: str
    num_gpus: int
    layout: Layout
    setup: CheckSetup
    peak_stage: int
    """The stage with the least headroom, 1-based."""
    peak_gpu_bytes: int
    gpu_capacity_bytes: int
    """Nominal HBM minus the runtime reserve."""
    headroom_bytes: int
    reserve: dict[str, int]
    """The runtime reserve's named parts, bytes (planner.memory.reserve); empty when unknown."""
    overflows: list[str]
    stages: list[StageMemory]
    node: NodeMemory
    notes: list[str]
    suggestions: list[Suggestion]
    """When it does not fit: the smallest changes that make it fit (planner.search.suggest)."""


class CalibrateRow(BaseModel):
    """One compared quantity (planner.calibrate.compare.Row) with its error."""

    model_config = ConfigDict(extra="forbid")

    quantity: str
    unit: str
    predicted: Optional[float]
    measured: float
    note: str
    error_pct: Optional[float]
    """(measured - predicted) / predicted x 100; null without a prediction (or infinite)."""


class CalibrateConfiguration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str
    run: RunSpec
    measured: Measured
    rows: list[CalibrateRow]
    classes: list[CalibrateRow]


class CalibrateDistributed(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nproc: int
    ranks: list[dict[str, Any]]
    """Raw per-rank measurements (bytes, bucket counts) as the ranks reported them."""
    rows: list[CalibrateRow]


class CalibrateDocument(_Envelope):
    """`zplan calibrate [model] --json` (planner.cli.report.calibrate.render_json)."""

    kind: Literal["calibrate"]
    configurations: list[CalibrateConfiguration]
    calibration: Optional[Calibration] = None
    distributed: Optional[CalibrateDistributed] = None


class HardwareStepRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    strategy: str
    nproc: int
    micro_batch: int
    seq_len: int
    layers: int
    hidden: int
    predicted: dict[str, float]
    """Seconds per term: step_s, compute_s, gemm_s, memory_bound_s, dispatch_s, page_fault_s (CPU hosts),
    communication_s, optimizer_s."""
    measured: dict[str, Optional[float]]
    """Seconds per term: step_s, forward_backward_s, compute_s (null when not attributed), communication_s, optimizer_s."""
    step_error_pct: float


class CalibrateHardwareDocument(_Envelope):
    """`zplan calibrate hardware --json` (planner.cli.report.calibrate_hardware.render_json)."""

    kind: Literal["calibrate-hardware"]
    parts: HardwareParts
    profiles_written: list[str]
    steps: list[HardwareStepRow]


class HFRowDocument(HFRow):
    """One row of `zplan calibrate --hf-config` with its error."""

    block_error_pct: float
    """(predicted / measured - 1) x 100 for one block."""


class CalibrateHFDocument(_Envelope):
    """`zplan calibrate --hf-config PATH --json` (planner.cli.report.calibrate.render_hf_json)."""

    kind: Literal["calibrate-hf"]
    config: str
    rows: list[HFRowDocument]


DOCUMENTS: dict[str, type[BaseModel]] = {
    "fit": FitDocument, "model": ModelDocument, "infer": InferDocument, "sweep": SweepDocument,
    "presets": PresetsDocument, "check": CheckDocument,
    "budget-compute": ComputeBudgetDocument, "budget-model": ModelBudgetDocument,
    "calibrate": CalibrateDocument, "calibrate-hardware": CalibrateHardwareDocument,
    "calibrate-hf": CalibrateHFDocument,
}
"""File stem in docs/schema -> document model."""


def schema_of(document: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema (serialization mode) with the draft named."""
    schema = document.model_json_schema(mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def schema_texts() -> dict[str, str]:
    """docs/schema/NAME.json -> its text."""
    return {f"{name}.json": json.dumps(schema_of(doc), indent=2, sort_keys=True) + "\n"
            for name, doc in DOCUMENTS.items()}


def main(argv: list[str]) -> None:
    target = Path(argv[0] if argv else "docs/schema")
    target.mkdir(parents=True, exist_ok=True)
    for name, text in schema_texts().items():
        (target / name).write_text(text, encoding="utf-8")
        print(target / name)


if __name__ == "__main__":
    main(sys.argv[1:])
