"""Options shared by several commands (model, hardware, training setup) and their resolution."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from planner.core.errors import PlanInputError
from planner.core.spec import Cluster, ModelSpec

ModelOpt = Annotated[
    str,
    typer.Option("--model", "-m", help="Model preset name (see `zplan presets`), a YAML file, or a HF config.json."),
]
ClusterOpt = Annotated[
    Optional[str],
    typer.Option("--cluster", "-c", help="Cluster or node preset name, or a YAML file."),
]
GpuOpt = Annotated[
    Optional[str], typer.Option("--gpu", help="GPU preset for an ad-hoc cluster, with --gpus (e.g. a100-80gb).")
]
GpusOpt = Annotated[
    Optional[int], typer.Option("--gpus", min=1, help="Number of GPUs of --gpu (whole nodes above one node).")
]
ProfilesOpt = Annotated[
    Optional[list[Path]],
    typer.Option("--profiles", help="Extra directory of your own model / hardware YAML files (repeatable)."),
]
SeqLenOpt = Annotated[
    Optional[int], typer.Option("--seq-len", min=1, help="Sequence length in tokens [default: min(2048, model max)].")
]
GlobalBatchOpt = Annotated[
    Optional[int],
    typer.Option("--global-batch", min=1, help="Sequences per optimizer step [default: micro-batch x grad-accum x dp with a layout; one per GPU when searching]."),
]
TokensOpt = Annotated[
    float, typer.Option("--tokens", min=1, help="Training tokens of the whole run (e.g. 300e9).")
]
PrecisionOpt = Annotated[
    str,
    typer.Option("--precision", help="Precision recipe: zero-fp16 (16 B/param), bf16-mixed (16), megatron-bf16 (18), zero-infinity-fp16 (20), fp32 (16)."),
]
OptimizerOpt = Annotated[
    str, typer.Option("--optimizer", help="Optimizer: adam, adamw, sgd-momentum, sgd, adam-8bit.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Write a JSON document to stdout instead of tables.")]
CalibrationOpt = Annotated[
    Optional[Path],
    typer.Option("--calibration", help="Calibration file from `zplan calibrate` (measured efficiency)."),
]

DEFAULT_SEQ_LEN = 2048
DEFAULT_TOKENS = 300e9


def extra_dirs(profiles: Optional[list[Path]]) -> tuple[Path, ...]:
    """The user's extra profile directories; each must exist."""
    dirs = tuple(profiles or ())
    for directory in dirs:
        if not directory.is_dir():
            raise PlanInputError("--profiles", f"{directory} is not a directory")
    return dirs


def resolve_model(name: str, profiles: Optional[list[Path]]) -> ModelSpec:
    """A model from a preset name or a path."""
    from planner.io.loading import load_model

    return load_model(name, extra_dirs(profiles))


def resolve_cluster(
    cluster: Optional[str], gpu: Optional[str], gpus: Optional[int], profiles: Optional[list[Path]]
) -> Cluster:
    """Hardware from `--cluster NAME` or from `--gpu NAME --gpus N` (exactly one of the two)."""
    from planner.io.loading import cluster_for_gpus, load_cluster

    dirs = extra_dirs(profiles)
    if cluster is not None:
        if gpu is not None or gpus is not None:
            raise PlanInputError("--cluster", "give either --cluster or --gpu with --gpus, not both")
        return load_cluster(cluster, dirs)
    if gpu is None or gpus is None:
        raise PlanInputError("--cluster", "give --cluster NAME, or --gpu NAME with --gpus N")
    return cluster_for_gpus(gpu, gpus, dirs)


def default_seq_len(model: ModelSpec, seq_len: Optional[int]) -> int:
    """The sequence length asked for, or min(2048, the model's maximum)."""
    return seq_len if seq_len is not None else min(DEFAULT_SEQ_LEN, model.max_seq_len)
