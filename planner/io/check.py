"""`zplan check`: the planner inputs from a job file, a DeepSpeed config or a Megatron-LM
launch line, validated and planned into one result (the CI gate's answer)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from planner.io.jobfile import make_setup
from planner.search.suggest import Suggestion, suggest_changes
from planner.memory.plan import MemoryPlan, plan_memory
from planner.core.errors import PlanInputError
from planner.core.spec import Cluster, Frozen, Layout, ModelSpec, TrainSetup

Source = Literal["job", "deepspeed", "megatron", "accelerate"]


class CheckResult(Frozen):
    """The verdict of one job: its inputs, the memory plan and the assumptions made."""

    source: Source
    """Where the layout came from: a job file, a DeepSpeed config, a Megatron-LM launch line."""
    model: ModelSpec
    cluster: Cluster
    layout: Layout
    setup: TrainSetup
    plan: MemoryPlan
    notes: tuple[str, ...] = ()
    """Assumptions made while reading the file (see EngineJob.notes)."""
    suggestions: tuple[Suggestion, ...] = ()
    """When it does not fit: the smallest changes that make it fit (planner.search.suggest)."""

    @property
    def fits(self) -> bool:
        return self.plan.fits


def check(model: ModelSpec, cluster: Cluster, layout: Layout, setup: TrainSetup,
          source: Source = "job", notes: Sequence[str] = (), *, reserve_gib: float | None = None,
          cpu_mem_gib: float | None = None, implementation: str | None = None,
          host_accounting: str | None = None) -> CheckResult:
    """Plan the memory of validated inputs (plan_memory validates the cross-field rules).
    `reserve_gib` / `cpu_mem_gib` (`--reserve`, `--cpu-mem-gib`) replace the setup's reserve and
    the nodes' host RAM when given; `implementation` (`--implementation`) the setup's."""
    if reserve_gib is not None:
        setup = setup.model_copy(update={"reserve_gib": reserve_gib})
    if implementation is not None:
        from planner.memory.implementations import IMPLEMENTATIONS

        if implementation not in IMPLEMENTATIONS:
            raise PlanInputError("--implementation", f"{implementation!r}; allowed: {', '.join(IMPLEMENTATIONS)}")
        setup = setup.model_copy(update={"implementation": implementation})
    if host_accounting is not None:
        from planner.memory.host import check_accounting

        check_accounting(host_accounting)
        setup = setup.model_copy(update={"host_accounting": host_accounting})
    if cpu_mem_gib is not None:
        from planner.memory.host import with_cpu_memory

        cluster = with_cpu_memory(cluster, cpu_mem_gib)
    plan = plan_memory(model, cluster, layout, setup)
    suggestions = () if plan.fits else tuple(suggest_changes(model, cluster, layout, setup))
    return CheckResult(source=source, model=model, cluster=cluster, layout=layout, setup=setup,
                       plan=plan, notes=tuple(notes), suggestions=suggestions)


def check_deepspeed(path: Path, model: ModelSpec, cluster: Cluster, *, num_gpus: int | None,
                    seq_len: int, tokens: float, optimizer: str, reserve_gib: float | None = None,
                    cpu_mem_gib: float | None = None, implementation: str | None = None,
                    host_accounting: str | None = None, **numbers: Any) -> CheckResult:
    """A DeepSpeed config on `num_gpus` GPUs of the cluster (default: all of them).

    `numbers` are the job's values for "auto" keys and the layout fields the JSON cannot say:
    tp, pp, global_batch, micro_batch, grad_accum, precision, recompute, ... (None = not given).
    """
    from planner.io.deepspeed import layout_from_deepspeed, read_deepspeed_config
    from planner.search.strategies import cluster_with_gpus

    config = read_deepspeed_config(path)
    hardware = cluster_with_gpus(cluster, num_gpus or cluster.num_gpus)
    job = layout_from_deepspeed(config, num_gpus=hardware.num_gpus,
                                tp=numbers.pop("tp", None) or 1, pp=numbers.pop("pp", None) or 1,
                                hidden_size=model.hidden_size, **numbers)
    setup = make_setup(seq_len, job.global_batch, tokens, job.precision, optimizer)
    notes = job.notes
    if implementation is None and _hf_trainer_style(config):
        if job.layout.tp == job.layout.pp == 1 and job.layout.recompute in ("none", "full"):
            implementation = "hf-sdpa"
            notes = (*notes, "the config has \"auto\" values (filled by the HF Trainer): "
                             "implementation=hf-sdpa assumed (transformers' default attention); "
                             "--implementation to change")
    return check(model, hardware, job.layout, setup, "deepspeed", notes,
                 reserve_gib=reserve_gib, cpu_mem_gib=cpu_mem_gib, implementation=implementation,
                 host_accounting=host_accounting)


def check_accelerate(path: Path, model: ModelSpec, cluster: Cluster, *, num_gpus: int | None,
                     seq_len: int, tokens: float, optimizer: str, reserve_gib: float | None = None,
                     cpu_mem_gib: float | None = None, implementation: str | None = None,
                     host_accounting: str | None = None, **numbers: Any) -> CheckResult:
    """An accelerate config (planner.io.accelerate_config) on its `num_processes` GPUs of the
    cluster. The implementation defaults to hf-sdpa: accelerate runs the user's own model,
    nearly always a transformers one, whose default attention is SDPA (modeling_utils.py
    `get_correct_attn_implementation`, transformers 5.23.0)."""
    from planner.io.accelerate_config import job_from_accelerate, num_processes, read_accelerate_config
    from planner.search.strategies import cluster_with_gpus

    config = read_accelerate_config(path)
    processes = num_processes(config, num_gpus)
    hardware = cluster_with_gpus(cluster, processes)
    unused = sorted(k for k, v in numbers.items() if v is not None
                    and k not in ("micro_batch", "grad_accum", "global_batch", "recompute", "dp_shard"))
    if unused:
        raise PlanInputError("--" + unused[0].replace("_", "-"), "not used with --accelerate-config "
                             "(accelerate runs data parallel: tp = pp = 1)")
    job = job_from_accelerate(config, path, num_gpus=processes, hidden_size=model.hidden_size,
                              **{k: numbers.get(k) for k in ("micro_batch", "grad_accum",
                                                             "global_batch", "recompute")})
    setup = make_setup(seq_len, job.global_batch, tokens, job.precision, optimizer)
    notes = job.notes
    layout = job.layout
    if numbers.get("dp_shard") is not None:  # --dp-shard over the file's HSDP shard size
        layout = Layout(**(layout.model_dump() | {"dp_shard": numbers["dp_shard"]}))
    if implementation is None:
        implementation = "hf-sdpa"
        notes = (*notes, "accelerate config: implementation=hf-sdpa assumed (transformers' default "
                         "attention); --implementation to change")
    return check(model, hardware, layout, setup, "accelerate", notes,
                 reserve_gib=reserve_gib, cpu_mem_gib=cpu_mem_gib, implementation=implementation,
                 host_accounting=host_accounting)


def check_megatron(path: Path, cluster: Cluster, *, num_gpus: int | None, tokens: float | None,
                   optimizer: str | None, default_tokens: float, reserve_gib: float | None = None,
                   cpu_mem_gib: float | None = None, implementation: str | None = None,
                   host_accounting: str | None = None) -> CheckResult:
    """A Megatron-LM launch line: the model from its flags, GPUs from torchrun's flags, the
    command line's --gpus, or the whole cluster, in that order. Tokens: `tokens`, else the
    line's --train-samples / --train-iters, else `default_tokens`."""
    from planner.io.megatron import job_from_megatron, read_megatron_args
    from planner.search.strategies import cluster_with_gpus

    launcher, args = read_megatron_args(path)
    gpus_given = bool(num_gpus) or "--nproc-per-node" in launcher
    job = job_from_megatron(launcher, args, num_gpus if gpus_given else cluster.num_gpus, name=path.stem)
    assert job.model is not None and job.seq_len is not None  # job_from_megatron always sets both
    hardware = cluster_with_gpus(cluster, job.layout.num_gpus)
    if tokens is None:
        tokens = job.train_tokens if job.train_tokens is not None else default_tokens
    setup = make_setup(job.seq_len, job.global_batch, tokens, job.precision, optimizer or job.optimizer or "adam")
    notes = job.notes if gpus_given else (
        *job.notes, f"no torchrun --nproc-per-node and no --gpus: all {cluster.num_gpus} GPUs of the cluster")
    if not num_gpus and job.layout.num_gpus != cluster.num_gpus:  # two inputs disagree: say which won
        where = (f"{job.layout.num_gpus} of the {cluster.num_gpus} GPUs of {cluster.name}"
                 if job.layout.num_gpus < cluster.num_gpus else
                 f"{hardware.num_gpus} GPUs, {hardware.num_nodes} nodes like those of {cluster.name}")
        notes = (*notes, f"the launch line runs {job.layout.num_gpus} processes: checked on {where} "
                         "(the launch line wins over the cluster's size)")
    return check(job.model, hardware, job.layout, setup, "megatron", notes,
                 reserve_gib=reserve_gib, cpu_mem_gib=cpu_mem_gib, implementation=implementation,
                 host_accounting=host_accounting)


def _hf_trainer_style(config: Any) -> bool:
    """A DeepSpeed config with an "auto" value anywhere: the HF Trainer fills those from its
    TrainingArguments (transformers 5.23.0 integrations/deepspeed.py,
    `HfTrainerDeepSpeedConfig.fill_match`), so the model is a transformers one, whose default
    attention is SDPA (modeling_utils.py `get_correct_attn_implementation`: "sdpa" when none is
    requested). Megatron-DeepSpeed and hand-written configs carry numbers."""
    if isinstance(config, dict):
        return any(_hf_trainer_style(v) for v in config.values())
    if isinstance(config, list):
        return any(_hf_trainer_style(v) for v in config)
    return config == "auto"
