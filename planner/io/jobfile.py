"""The job file of `zplan check JOB.yaml`: model, cluster, layout and setup in one YAML.

```yaml
model: gpt3-175b        # preset name, a path (YAML or HF config.json), or a mapping of ModelSpec fields
cluster: dgx2x32        # cluster/node name, a path, or {gpu: a100-80gb, gpus: 256}
layout: {tp: 8, pp: 8, dp: 8, zero_stage: 1, micro_batch: 1, recompute: full}
                        # long context: add cp: 16, cp_comm_type: p2p (world = tp x cp x pp x dp)
setup: {seq_len: 2048, global_batch: 1536, train_tokens: 300e9, precision: zero-fp16, optimizer: adam}
```
`layout.grad_accum` may be left out: it is global_batch / (micro_batch * dp) when that divides.
HSDP adds `layout.dp_shard` (shard group size, dividing dp; dp_engine fsdp2 at zero_stage 2 or 3).
MoE runs add `layout.ep` (expert parallelism) and, in `setup`, `moe_capacity_factor` /
`moe_load_imbalance` (docs/moe.md).
Relative paths are taken from the job file's folder. Errors name the job file and the field.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from planner.core.errors import PlanInputError
from planner.io.loading import (
    cluster_for_gpus,
    load_cluster,
    load_model,
    read_yaml_mapping,
    validate_spec,
)
from planner.core.recipes import DEFAULT_OPTIMIZER, DEFAULT_PRECISION, get_optimizer, get_precision
from planner.core.limits import MAX_MEMORY_GIB, MAX_SEQ_LEN, MAX_SEQUENCES, MAX_TOKENS
from planner.core.spec import Cluster, Frozen, Layout, ModelSpec, TrainSetup


class GpuCount(Frozen):
    """`cluster: {gpu: a100-80gb, gpus: 256}`: whole nodes of the shipped node with that GPU."""

    gpu: str
    """GPU profile name (a file stem in hardware_profiles/gpus/)."""
    gpus: int = Field(gt=0)
    """Total GPUs."""


class SetupSection(Frozen):
    """The `setup:` mapping; precision and optimizer by name (planner.recipes)."""

    seq_len: int = Field(gt=0, le=MAX_SEQ_LEN)
    """Tokens per sequence."""
    global_batch: int = Field(gt=0, le=MAX_SEQUENCES)
    """Sequences per optimizer step across all data-parallel ranks."""
    train_tokens: float = Field(gt=0, le=MAX_TOKENS)
    """Tokens of the whole run; `300e9` (a YAML string) is accepted."""
    precision: str = DEFAULT_PRECISION
    """A recipe name of planner.recipes.PRECISIONS."""
    optimizer: str = DEFAULT_OPTIMIZER
    """An optimizer name of planner.recipes.OPTIMIZERS."""
    reserve_gib: float | None = Field(default=None, ge=0, le=MAX_MEMORY_GIB)
    """Runtime reserve per GPU, GiB (TrainSetup.reserve_gib); omitted: the GPU profile's parts."""
    implementation: Literal["megatron", "hf-eager", "hf-sdpa"] = "megatron"
    """TrainSetup.implementation: the code that runs the blocks."""
    host_accounting: Literal["deepspeed", "zero-infinity-paper"] = "deepspeed"
    """TrainSetup.host_accounting: where offloaded states live."""
    moe_capacity_factor: float | None = Field(default=None, gt=0, le=1000)
    """TrainSetup.moe_capacity_factor: MoE expert capacity (None: dropless)."""
    moe_load_imbalance: float = Field(default=1.0, ge=1.0, le=1000)
    """TrainSetup.moe_load_imbalance: the busiest ep rank's factor on the average tokens."""


class JobFile(Frozen):
    """One job: what is trained, on what, laid out how, with which setup."""

    model: str | dict[str, Any]
    """Preset name, a path (YAML or HF config.json), or an inline mapping of ModelSpec fields."""
    cluster: str | dict[str, Any]
    """Cluster or node name, a path, or `{gpu: NAME, gpus: N}` (see GpuCount)."""
    layout: dict[str, Any] = Field(default_factory=dict)
    """Layout fields (planner.spec.Layout); `grad_accum` may be left out."""
    setup: SetupSection
    """Sequence length, global batch, tokens, precision and optimizer."""

    @field_validator("model", "cluster", mode="before")
    @classmethod
    def _name_or_mapping(cls, value: Any) -> Any:
        if not isinstance(value, (str, dict)):
            raise ValueError(f"must be a name, a path or a mapping (got {value!r})")
        return value


def make_setup(
    seq_len: int, global_batch: int, train_tokens: float | str, precision: str = DEFAULT_PRECISION,
    optimizer: str = DEFAULT_OPTIMIZER, reserve_gib: float | None = None,
    implementation: str | None = None, host_accounting: str | None = None,
    moe_capacity_factor: float | None = None, moe_load_imbalance: float | None = None,
) -> TrainSetup:
    """A TrainSetup from plain values and recipe names (used by the job file and the CLI flags)."""
    section = validate_spec(
        SetupSection, {"seq_len": seq_len, "global_batch": global_batch,
                       "train_tokens": train_tokens, "precision": precision,
                       "optimizer": optimizer, "reserve_gib": reserve_gib,
                       "implementation": implementation or "megatron",
                       "host_accounting": host_accounting or "deepspeed",
                       "moe_capacity_factor": moe_capacity_factor,
                       "moe_load_imbalance": 1.0 if moe_load_imbalance is None else moe_load_imbalance})
    return TrainSetup(
        seq_len=section.seq_len, global_batch=section.global_batch,
        train_tokens=section.train_tokens, precision=get_precision(section.precision),
        optimizer=get_optimizer(section.optimizer), reserve_gib=section.reserve_gib,
        implementation=section.implementation, host_accounting=section.host_accounting,
        moe_capacity_factor=section.moe_capacity_factor,
        moe_load_imbalance=section.moe_load_imbalance,
    )


def default_grad_accum(global_batch: int, micro_batch: int, dp: int) -> int:
    """grad_accum = global_batch / (micro_batch * dp), which must divide exactly."""
    per_step = micro_batch * dp  # sequences one micro-batch round covers
    if global_batch % per_step:
        raise PlanInputError(
            "layout.grad_accum",
            f"global_batch ({global_batch}) is not divisible by micro_batch ({micro_batch}) x "
            f"dp ({dp}) = {per_step}; change one of them or give grad_accum",
        )
    return global_batch // per_step


def resolve_layout(layout: dict[str, Any], global_batch: int, where: str = "layout") -> Layout:
    """Validate the layout mapping; fill in grad_accum and check the batch arithmetic."""
    base = validate_spec(Layout, layout, prefix=where)
    if "grad_accum" not in layout:
        grad_accum = default_grad_accum(global_batch, base.micro_batch, base.dp)
        return base.model_copy(update={"grad_accum": grad_accum})
    if base.micro_batch * base.dp * base.grad_accum != global_batch:
        raise PlanInputError(
            "layout.grad_accum",
            f"micro_batch ({base.micro_batch}) x dp ({base.dp}) x grad_accum "
            f"({base.grad_accum}) = {base.micro_batch * base.dp * base.grad_accum} must equal "
            f"setup.global_batch ({global_batch})",
        )
    return base


@contextmanager
def _in_job(job: Path, section: str) -> Iterator[None]:
    """Prefix any input error with the job file and the section it came from."""
    try:
        yield
    except PlanInputError as err:
        if err.field == section or err.field.startswith(f"{section}."):
            raise PlanInputError(f"{job}: {err.field}", err.message) from None
        if err.field.isidentifier():  # a key inside the section, e.g. setup.precision
            raise PlanInputError(f"{job}: {section}.{err.field}", err.message) from None
        raise PlanInputError(f"{job}: {section}", str(err)) from None


def _relative_to(job: Path, value: str) -> str:
    """A path written in the job file is relative to the job file's folder."""
    path = Path(value)
    looks_like_path = value.endswith((".yaml", ".yml", ".json")) or "/" in value
    if path.is_absolute() or not looks_like_path:
        return value
    return str(job.parent / path)


def _model(job: Path, spec: str | dict[str, Any], extra_dirs: Sequence[Path]) -> ModelSpec:
    if isinstance(spec, dict):
        return validate_spec(ModelSpec, spec, str(job), prefix="model")
    with _in_job(job, "model"):
        return load_model(_relative_to(job, spec), extra_dirs)


def _cluster(job: Path, spec: str | dict[str, Any], extra_dirs: Sequence[Path]) -> Cluster:
    if isinstance(spec, dict):
        count = validate_spec(GpuCount, spec, str(job), prefix="cluster")
        with _in_job(job, "cluster"):
            return cluster_for_gpus(count.gpu, count.gpus, extra_dirs)
    with _in_job(job, "cluster"):
        return load_cluster(_relative_to(job, spec), extra_dirs)


def load_job(
    path: Path, extra_dirs: Sequence[Path] = (),
) -> tuple[ModelSpec, Cluster, Layout, TrainSetup]:
    """Read a job file into the four planner inputs."""
    path = Path(path)
    if not path.is_file():
        raise PlanInputError("job", f"file not found: {path}")
    job = validate_spec(JobFile, read_yaml_mapping(path, "job"), str(path))
    model = _model(path, job.model, extra_dirs)
    cluster = _cluster(path, job.cluster, extra_dirs)
    with _in_job(path, "setup"):
        setup = make_setup(**job.setup.model_dump())
    with _in_job(path, "layout"):
        layout = resolve_layout(job.layout, setup.global_batch, where="layout")
    return model, cluster, layout, setup
