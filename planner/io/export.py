"""`zplan export`: a layout written in the form an engine runs."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Literal, get_args

import yaml

from planner.core.spec import Cluster, Layout, ModelSpec, TrainSetup

if TYPE_CHECKING:
    from planner.search.sweep import Constraints

Format = Literal["deepspeed", "megatron", "accelerate-fsdp", "torchrun"]
FORMATS: tuple[str, ...] = get_args(Format)


def export_text(fmt: Format, model: ModelSpec, cluster: Cluster, layout: Layout, setup: TrainSetup,
                nvme_path: str = "/local_nvme", script: str | None = None) -> str:
    """The file's text: DeepSpeed JSON, a Megatron-LM launch line, accelerate YAML, or torchrun.
    After the format's own checks, a layout the target engine cannot run is refused
    (planner.io.engines)."""
    text = _format_text(fmt, model, cluster, layout, setup, nvme_path, script)
    check_export_engine(fmt, model, layout, setup)
    return text


def _format_text(fmt: Format, model: ModelSpec, cluster: Cluster, layout: Layout, setup: TrainSetup,
                 nvme_path: str, script: str | None) -> str:
    """The text of one format; each writer raises for what its format cannot express."""
    from planner.core.errors import PlanInputError

    if fmt in ("deepspeed", "megatron") and layout.dp_engine == "fsdp2":
        raise PlanInputError("dp_engine", f"dp_engine=fsdp2 cannot be written as --format {fmt}; "
                                          "use --format accelerate-fsdp (FSDP2)")
    if fmt != "megatron" and layout.megatron_overlap:  # () is every overlap off: any engine
        raise PlanInputError("megatron_overlap", f"{','.join(layout.megatron_overlap)} (Megatron-LM "
                             f"overlap flags) not expressible as --format {fmt}; use "
                             "--format megatron")
    if fmt == "accelerate-fsdp" and layout.cp > 1:
        raise PlanInputError("cp", f"cp={layout.cp}: the {fmt} writer has no context-parallel "
                                   "setting yet; use --format megatron (--context-parallel-size)")
    if fmt == "deepspeed":
        from planner.io.deepspeed import deepspeed_config

        return json.dumps(deepspeed_config(model, layout, setup, nvme_path), indent=2) + "\n"
    if fmt == "megatron":
        from planner.io.megatron import megatron_launch

        return megatron_launch(cluster, model, layout, setup, script or "pretrain_gpt.py")
    if fmt == "accelerate-fsdp":
        from planner.io.fsdp import accelerate_fsdp_config, launch_hint

        config = yaml.safe_dump(accelerate_fsdp_config(cluster, layout, setup), sort_keys=False)
        return f"# {launch_hint(cluster, layout, script=script or 'train.py')}\n{config}"
    from planner.io.torchrun import torchrun_command

    return torchrun_command(cluster, layout, script or "train.py") + "\n"


def search_constraints(fmt: Format) -> Constraints:
    """What the best-layout search may choose so that the format can express it and the engine
    behind it can run it (`Constraints.engine`: planner/io/engines.py, its own ZeRO-2/3 model)."""
    from planner.io.engines import EXPORT_ENGINE
    from planner.search.sweep import Constraints

    engine = EXPORT_ENGINE.get(fmt)
    if fmt == "deepspeed":
        return Constraints(recompute=("none", "full"), virtual_stages=(1,), sequence_parallel=(False,),
                           cp_comm_type=("a2a",), engine=engine)
    if fmt == "megatron":
        return Constraints(zero_stage=(0, 1), offload_optimizer=("none",), offload_params=("none",),
                           engine=engine)
    if fmt == "accelerate-fsdp":
        return Constraints(tp=(1,), pp=(1,), recompute=("none", "full"), offload_optimizer=("none",),
                           offload_params=("none",), cp=(1,), engine=engine)
    return Constraints()


def check_export_engine(fmt: str, model: ModelSpec, layout: Layout, setup: TrainSetup) -> None:
    """One-line refusal (exit 2) when the engine `fmt` runs cannot run the layout."""
    from planner.io.engines import EXPORT_ENGINE, check_engine

    engine = EXPORT_ENGINE.get(fmt)
    if engine is not None:
        check_engine(engine, model, layout, setup.precision)

