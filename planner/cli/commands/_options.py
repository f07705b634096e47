"""Every command-line option, defined once (name, type, bounds, default, help), and its resolution.

Commands import the `...Opt` aliases below and never define an option of the same name
themselves; tests/test_cli_options.py checks that an option name means the same thing (type,
default, help) in every command that has it. The sweep takes comma lists for the layout options
(`--tp 4,8` pins the search); those are the `...PinsOpt` aliases, whose help is the single option's
help plus the list syntax.

Defaults that depend on other inputs are `None` here and resolved by one function each:
- `default_seq_len`: min(2048, the model's max_seq_len);
- `default_global_batch`: THE global-batch rule, micro_batch x dp x grad_accum with micro_batch 1,
  dp = GPUs / (tp x pp) and grad_accum = pp (enough micro-batches to fill a 1F1B pipeline,
  Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters", sec. 2.2).
  Without a layout (fit's search, export's search, sweep) tp = pp = 1, so the rule gives one
  sequence per GPU;
- precision `zero-fp16`, optimizer `adam`, tokens 300e9 unless an engine config or launch line
  says otherwise (`check --deepspeed`, `check --megatron-args`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from planner.core.errors import PlanInputError
from planner.core.limits import MAX_MEMORY_GIB, MAX_TOKENS, MIN_EFFICIENCY

if TYPE_CHECKING:
    from planner.core.spec import Cluster, Layout, ModelSpec

LAYOUT = "Layout (any of these selects an explicit layout; without them zplan searches)"
SETUP = "Training setup"
OUTPUT = "Output"

DEFAULT_SEQ_LEN = 2048
DEFAULT_TOKENS = 300e9
DEFAULT_PRECISION = "zero-fp16"
"""planner.core.recipes.DEFAULT_PRECISION (kept here so `--help` needs no recipe import)."""
DEFAULT_OPTIMIZER = "adam"
"""planner.core.recipes.DEFAULT_OPTIMIZER."""

GLOBAL_BATCH_RULE = ("micro-batch x dp x grad-accum, with micro-batch 1, dp = GPUs/(tp x pp) and "
                     "grad-accum = pp; one sequence per GPU when zplan searches")

def finite(value: Optional[float]) -> Optional[float]:
    """Option callback: refuse inf and nan (they would reach `--json` as Infinity / NaN)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, got {value}")
    return value


def int64(value: Optional[int]) -> Optional[int]:
    """Option callback: an integer the model's int64 array columns can hold."""
    if value is not None and abs(value) > 2**63 - 1:
        raise typer.BadParameter(f"{value} does not fit a 64-bit integer")
    return value


# --------------------------------------------------------------------------- inputs

ModelOpt = Annotated[str, typer.Option(
    "--model", "-m", help="Model preset name (see `zplan presets`), a YAML file, or a HF config.json.")]
ModelOrNoneOpt = Annotated[Optional[str], typer.Option(
    "--model", "-m", help="Model preset name (see `zplan presets`), a YAML file, or a HF config.json.")]
ClusterOpt = Annotated[Optional[str], typer.Option(
    "--cluster", "-c", help="Cluster or node preset name, or a YAML file.")]
GpuOpt = Annotated[Optional[str], typer.Option(
    "--gpu", help="GPU preset name or YAML file (e.g. a100-80gb); with --gpus for an ad-hoc cluster.")]
GpusOpt = Annotated[Optional[int], typer.Option(
    "--gpus", min=1, callback=int64, help="Number of GPUs: with --gpu, an ad-hoc cluster (whole nodes above one "
                          "node); with --cluster, that many of its GPUs.")]
GpusRangeOpt = Annotated[Optional[str], typer.Option(
    "--gpus", help="GPU count, list (64,128,256) or doubling range (64-1024); with --cluster it "
                   "resizes the cluster.")]
ProfilesOpt = Annotated[Optional[list[Path]], typer.Option(
    "--profiles", help="Extra directory of your own model / hardware YAML files (repeatable).")]
CalibrationOpt = Annotated[Optional[Path], typer.Option(
    "--calibration", help="Calibration file from `zplan calibrate` (measured efficiency).")]

# --------------------------------------------------------------------------- setup

SeqLenOpt = Annotated[Optional[int], typer.Option(
    "--seq-len", min=1, callback=int64, help="Sequence length in tokens (default: min(2048, the model's max)). `budget` counts "
    "the attention FLOPs 2k·L·d_attn·T per token only when it is given (with --model).",
    rich_help_panel=SETUP)]
GlobalBatchOpt = Annotated[Optional[int], typer.Option(
    "--global-batch", min=1, callback=int64, help=f"Sequences per optimizer step (default: {GLOBAL_BATCH_RULE}).",
    rich_help_panel=SETUP)]
TokensOpt = Annotated[Optional[float], typer.Option(
    "--tokens", min=1, max=MAX_TOKENS, callback=finite, help="Training tokens of the whole run, e.g. 300e9 (default: 300e9, or the "
                            "launch line's).", rich_help_panel=SETUP)]
PrecisionOpt = Annotated[Optional[str], typer.Option(
    "--precision", help="Precision recipe: zero-fp16 (16 B/param), bf16-mixed (16), megatron-bf16 "
                        "(18), zero-infinity-fp16 (20), fp32 (16), autocast-bf16 / autocast-fp16 "
                        "(16: fp32 weights under autocast) (default: zero-fp16, or what the "
                        "engine config says).", rich_help_panel=SETUP)]
ImplementationOpt = Annotated[Optional[str], typer.Option(
    "--implementation",
    help="The code that runs the blocks: megatron (fused kernels), hf-eager or hf-sdpa "
         "(transformers; tp = pp = 1). Its precision mode: --precision autocast-bf16 for fp32 "
         "weights under autocast (default: megatron, or what the engine config implies; "
         "docs/implementations.md).", rich_help_panel=SETUP)]
HostAccountingOpt = Annotated[Optional[str], typer.Option(
    "--host-accounting",
    help="Where offloaded states live: deepspeed (as the engine allocates: a 16-bit gradient "
         "buffer in pinned CPU memory even under NVMe offload) or zero-infinity-paper (default: "
         "deepspeed; docs/host.md).", rich_help_panel=SETUP)]
ReserveOpt = Annotated[Optional[float], typer.Option(
    "--reserve", max=MAX_MEMORY_GIB, callback=finite,
    help="Runtime reserve per GPU, GiB, replacing the GPU profile's parts (CUDA context, NCCL "
         "buffers, cuBLAS workspace; in training plans also fragmentation) (default: the "
         "profile's; docs/reserve.md).", rich_help_panel=SETUP)]
MoeCapacityFactorOpt = Annotated[Optional[float], typer.Option(
    "--moe-capacity-factor", callback=finite,
    help="MoE expert capacity as a multiple of the even share, experts padded to it (Megatron "
         "--moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity) (default: "
         "dropless; docs/moe.md).", rich_help_panel=SETUP)]
MoeLoadImbalanceOpt = Annotated[Optional[float], typer.Option(
    "--moe-load-imbalance", min=1.0, callback=finite,
    help="MoE load imbalance: the busiest expert-parallel rank gets this factor x the average "
         "routed tokens (default: 1.0, balanced; docs/moe.md).", rich_help_panel=SETUP)]
CpuMemOpt = Annotated[Optional[float], typer.Option(
    "--cpu-mem-gib", min=0, max=MAX_MEMORY_GIB, callback=finite,
    help="Host RAM per node this job may use, GiB (default: the node profile's, or its share on "
         "a slice of a node; docs/host.md).", rich_help_panel=SETUP)]
OptimizerOpt = Annotated[Optional[str], typer.Option(
    "--optimizer", help="Optimizer: adam, adamw, sgd-momentum, sgd, adam-8bit (default: adam, or "
                        "the launch line's).", rich_help_panel=SETUP)]

# --------------------------------------------------------------------------- layout

_TP = "Tensor-parallel degree."
_PP = "Pipeline-parallel degree."
_DP = "Data-parallel degree (default: GPUs/(tp*pp)); GPUs/(tp*cp*pp) with --cp."
_CP = ("Context-parallel degree: each sequence split over cp GPUs (Megatron "
       "--context-parallel-size; default 1).")
_CP_COMM = ("Context-parallel attention: p2p (ring, Megatron's default) or a2a (Ulysses-style "
            "all-to-all; tp*cp must divide the heads and kv heads).")
_VP = "Virtual pipeline stages per rank (interleaved 1F1B)."
_ZERO = "ZeRO stage 0-3."
_MICRO = "Sequences per micro-batch per GPU (default: 1, or the engine config's)."
_GRAD_ACCUM = "Micro-batches per optimizer step (default: global-batch/(micro-batch*dp), or pp)."
_RECOMPUTE = "Activation recomputation: none, selective, full, every_k, block."
_RECOMPUTE_NUM_LAYERS = ("For --recompute block: blocks recomputed at the start of each pipeline "
                         "chunk, the rest keep all activations (Megatron-LM --recompute-method block "
                         "--recompute-num-layers; fms-fsdp / torchtitan every k-th of L blocks = "
                         "floor(L/k)); 1 to the blocks of the largest chunk.")
_OFFLOAD_OPT = "Where the optimizer states live: none, cpu, nvme."
_OFFLOAD_PARAMS = "Where the parameters live (ZeRO-3): none, cpu, nvme."
_EP = ("Expert-parallel degree of MoE models (Megatron --expert-model-parallel-size): routed "
       "experts split over ep ranks inside dp; must divide num_experts and dp (default: 1; "
       "the sweep tries every such divisor; docs/moe.md).")
_PINS = " A comma list (e.g. 1,2,4) pins the sweep to those values (default: all)."

TpOpt = Annotated[Optional[int], typer.Option("--tp", min=1, callback=int64, help=_TP, rich_help_panel=LAYOUT)]
PpOpt = Annotated[Optional[int], typer.Option("--pp", min=1, callback=int64, help=_PP, rich_help_panel=LAYOUT)]
DpOpt = Annotated[Optional[int], typer.Option("--dp", min=1, callback=int64, help=_DP, rich_help_panel=LAYOUT)]
EpOpt = Annotated[Optional[int], typer.Option("--ep", min=1, callback=int64, help=_EP, rich_help_panel=LAYOUT)]
CpOpt = Annotated[Optional[int], typer.Option("--cp", min=1, callback=int64, help=_CP, rich_help_panel=LAYOUT)]
CpCommTypeOpt = Annotated[Optional[str], typer.Option(
    "--cp-comm-type", help=_CP_COMM, rich_help_panel=LAYOUT)]
VirtualStagesOpt = Annotated[Optional[int], typer.Option(
    "--virtual-stages", min=1, callback=int64, help=_VP, rich_help_panel=LAYOUT)]
_FIRST = ("Blocks on the first pipeline stage, as Megatron-LM's "
          "--decoder-first-pipeline-num-layers (default: the even split).")
_LAST = ("Blocks on the last pipeline stage, as Megatron-LM's "
         "--decoder-last-pipeline-num-layers (default: the even split).")
FirstStageLayersOpt = Annotated[Optional[int], typer.Option(
    "--first-stage-layers", min=1, callback=int64, help=_FIRST, rich_help_panel=LAYOUT)]
LastStageLayersOpt = Annotated[Optional[int], typer.Option(
    "--last-stage-layers", min=1, callback=int64, help=_LAST, rich_help_panel=LAYOUT)]
_DP_ENGINE = ("Sharded data parallelism engine: deepspeed (ZeRO) or fsdp2 (PyTorch fully_shard; "
              "--zero 3 = reshard_after_forward true, 2 = false).")
_DP_SHARD = ("HSDP shard group size: states sharded over dp_shard ranks, replicated over "
             "dp / dp_shard groups (FSDP2 2-D mesh; FSDP1 HYBRID_SHARD). Must divide dp; needs "
             "--dp-engine fsdp2 --zero 3 or 2 (default: the whole dp group).")
DpShardOpt = Annotated[Optional[int], typer.Option(
    "--dp-shard", min=1, callback=int64, help=_DP_SHARD, rich_help_panel=LAYOUT)]
_SWEEP_DP_SHARD = ("HSDP shard groups searched: auto (default: every FSDP2 ZeRO-2/3 layout also "
                   "with each whole-node shard group below dp, docs/sweep.md), none (every layout "
                   "shards over its whole dp group), or a comma list (e.g. 8,16) pinning dp_shard "
                   "to those values.")
_SWEEP_RECOMPUTE_NUM_LAYERS = (_RECOMPUTE_NUM_LAYERS + " Sweep: N, or auto: block is searched (added to "
                               "the default modes unless --recompute is given) at every N from 1 to "
                               "the largest chunk, and each layout shows its least N that fits "
                               "(the fastest; fewer recomputed blocks never cost time).")
SweepRecomputeNumLayersOpt = Annotated[Optional[str], typer.Option(
    "--recompute-num-layers", help=_SWEEP_RECOMPUTE_NUM_LAYERS, rich_help_panel=LAYOUT)]


def sweep_recompute_num_layers(text: str | None) -> int | str | None:
    """`--recompute-num-layers` of the sweep as `Constraints.recompute_num_layers`: absent None,
    auto "auto", a positive integer that int; else PlanInputError naming the option."""
    if text is None:
        return None
    value = text.strip()
    if value == "auto":
        return value
    if value.isascii() and value.isdigit() and 0 < int(value) < 2**63:
        return int(value)
    raise PlanInputError("--recompute-num-layers", f"{text!r}; allowed: auto or a positive integer")


SweepDpShardOpt = Annotated[Optional[str], typer.Option(
    "--dp-shard", help=_SWEEP_DP_SHARD, rich_help_panel=LAYOUT)]


def sweep_dp_shard(text: str | None) -> tuple[int, ...] | None:
    """`--dp-shard` of the sweep as `Constraints.dp_shard`: auto (or absent) None, none (0,),
    a comma list of positive integers that tuple; else PlanInputError naming the option."""
    if text is None or text.strip() == "auto":
        return None
    if text.strip() == "none":
        return (0,)
    values = [v.strip() for v in text.split(",")]
    if all(v.isascii() and v.isdigit() and 0 < int(v) < 2**63 for v in values):
        return tuple(int(v) for v in values)
    raise PlanInputError("--dp-shard", f"{text!r}; allowed: auto, none, or positive integers "
                                       "like 8,16")


EngineOpt = Annotated[Optional[str], typer.Option(
    "--engine", help="Only layouts this engine runs: megatron-lm, deepspeed, fsdp2 (torchtitan) or "
                     "accelerate (docs/engines.md), their ZeRO-2/3 timed with its own sharding "
                     "(DeepSpeed ZeRO; fully_shard for the others). sweep: the rows shown; fit: "
                     "the layout searched, or the given layout checked (default: any engine).",
    rich_help_panel=LAYOUT)]


def engine_choice(text: str | None) -> str | None:
    """`--engine` (sweep, fit) as `Constraints.engine`; else PlanInputError naming the option
    and the engines (planner.io.engines.ENGINES)."""
    if text is None:
        return None
    from planner.io.engines import ENGINES

    if text.strip() in ENGINES:
        return text.strip()
    raise PlanInputError("--engine", f"{text!r}; allowed: {', '.join(ENGINES)}")


DpEngineOpt = Annotated[Optional[str], typer.Option("--dp-engine", help=_DP_ENGINE, rich_help_panel=LAYOUT)]
ZeroOpt = Annotated[Optional[int], typer.Option("--zero", min=0, max=3, help=_ZERO, rich_help_panel=LAYOUT)]
OffloadOptimizerOpt = Annotated[Optional[str], typer.Option(
    "--offload-optimizer", help=_OFFLOAD_OPT, rich_help_panel=LAYOUT)]
OffloadParamsOpt = Annotated[Optional[str], typer.Option(
    "--offload-params", help=_OFFLOAD_PARAMS, rich_help_panel=LAYOUT)]
RecomputeOpt = Annotated[Optional[str], typer.Option("--recompute", help=_RECOMPUTE, rich_help_panel=LAYOUT)]
RecomputeEveryKOpt = Annotated[Optional[int], typer.Option(
    "--recompute-every-k", min=1, callback=int64, help="Layers per checkpointed segment for every_k.",
    rich_help_panel=LAYOUT)]
RecomputeNumLayersOpt = Annotated[Optional[int], typer.Option(
    "--recompute-num-layers", min=1, callback=int64, help=_RECOMPUTE_NUM_LAYERS,
    rich_help_panel=LAYOUT)]
SequenceParallelOpt = Annotated[Optional[bool], typer.Option(
    "--sequence-parallel/--no-sequence-parallel",
    help="Megatron sequence parallelism (tp > 1) (default: off; the sweep tries both).",
    rich_help_panel=LAYOUT)]
FlashAttentionOpt = Annotated[Optional[bool], typer.Option(
    "--flash-attention/--no-flash-attention",
    help="Fused attention: no s x s tensors saved (default: on, as Megatron/TE and HF SDPA run).",
    rich_help_panel=LAYOUT)]
MegatronOverlapOpt = Annotated[Optional[str], typer.Option(
    "--megatron-overlap",
    help="Megatron-Core overlaps switched on: tp_comm (--tp-comm-overlap), grad_reduce "
         "(--overlap-grad-reduce), param_gather (--overlap-param-gather), comma-separated, or "
         "none (Megatron's defaults, all off). Unset: the generic schedule (gradient reduction "
         "behind backward).", rich_help_panel=LAYOUT)]
TempoOpt = Annotated[Optional[str], typer.Option(
    "--tempo", help="Tempo techniques: gelu,layernorm,dropout or all.", rich_help_panel=LAYOUT)]
MicroBatchOpt = Annotated[Optional[int], typer.Option(
    "--micro-batch", min=1, callback=int64, help=_MICRO, rich_help_panel=LAYOUT)]
GradAccumOpt = Annotated[Optional[int], typer.Option(
    "--grad-accum", min=1, callback=int64, help=_GRAD_ACCUM, rich_help_panel=LAYOUT)]

TpPinsOpt = Annotated[Optional[str], typer.Option("--tp", help=_TP + _PINS, rich_help_panel=LAYOUT)]
PpPinsOpt = Annotated[Optional[str], typer.Option("--pp", help=_PP + _PINS, rich_help_panel=LAYOUT)]
DpPinsOpt = Annotated[Optional[str], typer.Option("--dp", help=_DP + _PINS, rich_help_panel=LAYOUT)]
EpPinsOpt = Annotated[Optional[str], typer.Option("--ep", help=_EP + _PINS, rich_help_panel=LAYOUT)]
CpPinsOpt = Annotated[Optional[str], typer.Option("--cp", help=_CP + _PINS, rich_help_panel=LAYOUT)]
CpCommTypePinsOpt = Annotated[Optional[str], typer.Option(
    "--cp-comm-type", help=_CP_COMM + _PINS, rich_help_panel=LAYOUT)]
VirtualStagesPinsOpt = Annotated[Optional[str], typer.Option(
    "--virtual-stages", help=_VP + _PINS, rich_help_panel=LAYOUT)]
ZeroPinsOpt = Annotated[Optional[str], typer.Option("--zero", help=_ZERO + _PINS, rich_help_panel=LAYOUT)]
MicroBatchPinsOpt = Annotated[Optional[str], typer.Option(
    "--micro-batch", help=_MICRO + _PINS, rich_help_panel=LAYOUT)]
RecomputePinsOpt = Annotated[Optional[str], typer.Option(
    "--recompute", help=_RECOMPUTE + _PINS, rich_help_panel=LAYOUT)]
DpEnginePinsOpt = Annotated[Optional[str], typer.Option(
    "--dp-engine", help=_DP_ENGINE + _PINS, rich_help_panel=LAYOUT)]
OffloadOptimizerPinsOpt = Annotated[Optional[str], typer.Option(
    "--offload-optimizer", help=_OFFLOAD_OPT + _PINS, rich_help_panel=LAYOUT)]
OffloadParamsPinsOpt = Annotated[Optional[str], typer.Option(
    "--offload-params", help=_OFFLOAD_PARAMS + _PINS, rich_help_panel=LAYOUT)]

EfficiencyOpt = Annotated[Optional[float], typer.Option(
    "--efficiency", min=MIN_EFFICIENCY, max=1.0, callback=finite,
    help="Fraction of dense peak FLOP/s the matmuls reach, 0-1 (default: the --calibration file's, "
         "else the GPU profile's achieved_efficiency).")]

# --------------------------------------------------------------------------- output

JsonOpt = Annotated[bool, typer.Option(
    "--json", help="Write a JSON document to stdout instead of tables (schema: docs/schema/).",
    rich_help_panel=OUTPUT)]
OutputOpt = Annotated[Optional[Path], typer.Option(
    "--output", "-o", help="Write the result to this file instead of stdout (refused if it exists, "
                           "unless --force).", rich_help_panel=OUTPUT)]
ForceOpt = Annotated[bool, typer.Option(
    "--force", help="Replace an existing output file (written to a temporary file, then renamed).",
    rich_help_panel=OUTPUT)]
PlotOpt = Annotated[Optional[Path], typer.Option(
    "--plot", help="Also draw a picture to FILE.png or FILE.svg (needs the `plot` extra: "
                   "matplotlib; refused if it exists, unless --force).", rich_help_panel=OUTPUT)]


# --------------------------------------------------------------------------- resolution


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


def with_host_memory(cluster: Cluster, cpu_mem_gib: Optional[float]) -> Cluster:
    """The cluster with `--cpu-mem-gib` GiB of host RAM per node, when given."""
    if cpu_mem_gib is None:
        return cluster
    from planner.memory.host import with_cpu_memory

    return with_cpu_memory(cluster, cpu_mem_gib)


def default_seq_len(model: ModelSpec, seq_len: Optional[int]) -> int:
    """The sequence length asked for, or min(2048, the model's maximum)."""
    return seq_len if seq_len is not None else min(DEFAULT_SEQ_LEN, model.max_seq_len)


def default_global_batch(num_gpus: int, tp: int = 1, pp: int = 1, micro_batch: int = 1,
                         dp: Optional[int] = None, grad_accum: Optional[int] = None) -> int:
    """THE default global batch: micro_batch x dp x grad_accum (module docstring)."""
    data_parallel = dp if dp is not None else max(num_gpus // (tp * pp), 1)
    return micro_batch * data_parallel * (grad_accum if grad_accum is not None else pp)


def tempo_techniques(value: Optional[str]) -> tuple[str, ...]:
    """`--tempo gelu,layernorm` or `--tempo all` as a tuple of techniques."""
    if not value:
        return ()
    if value == "all":
        return ("gelu", "layernorm", "dropout")
    return tuple(part.strip() for part in value.split(",") if part.strip())


def megatron_overlaps(value: Optional[str]) -> Optional[tuple[str, ...]]:
    """`--megatron-overlap tp_comm,grad_reduce` as a tuple; `none` -> (); unset -> None."""
    if value is None:
        return None
    names = tuple(part.strip() for part in value.split(",") if part.strip())
    if names == ("none",):
        return ()
    allowed = ("tp_comm", "grad_reduce", "param_gather")
    for name in names:
        if name not in allowed:
            raise PlanInputError("megatron_overlap",
                                 f"{name!r}: allowed {', '.join(allowed)} or none")
    return names


def layout_from_flags(
    cluster: Cluster, global_batch: Optional[int], **fields: Any
) -> tuple[Layout, int]:
    """The layout the flags describe, with dp and grad_accum derived when not given.

    dp = GPUs / (tp*cp*pp); grad_accum = global_batch / (micro_batch*dp), or pp when no global
    batch is given (`default_global_batch`). Returns the layout and the global batch.
    """
    from planner.core.spec import Layout

    tp, pp, cp = int(fields["tp"] or 1), int(fields["pp"] or 1), int(fields.get("cp") or 1)
    dp = fields.pop("dp")
    if dp is None:
        if cluster.num_gpus % (tp * cp * pp):
            names, values = ("tp*cp*pp", f"{tp}*{cp}*{pp}") if cp > 1 else ("tp*pp", f"{tp}*{pp}")
            raise PlanInputError(
                "dp", f"GPUs {cluster.num_gpus} are not divisible by {names} = {values}"
            )
        dp = cluster.num_gpus // (tp * cp * pp)
    micro = int(fields["micro_batch"] or 1)
    fields["micro_batch"] = micro
    grad_accum = fields.pop("grad_accum")
    if global_batch is None:
        global_batch = default_global_batch(cluster.num_gpus, tp, pp, micro, dp, grad_accum)
    if grad_accum is None:
        if global_batch % (micro * int(dp)):
            raise PlanInputError(
                "global_batch",
                f"global_batch={global_batch} is not divisible by micro_batch*dp = {micro}*{dp}",
            )
        grad_accum = global_batch // (micro * int(dp))
    check_recompute_num_layers(fields.get("recompute"), fields.get("recompute_num_layers"))
    layout = Layout(dp=dp, grad_accum=grad_accum, **{k: v for k, v in fields.items() if v is not None})
    return layout, global_batch


def check_recompute_num_layers(recompute: str | None, num_layers: int | None) -> None:
    """--recompute block needs --recompute-num-layers, which means nothing without it."""
    if recompute == "block" and num_layers is None:
        raise PlanInputError("recompute_num_layers", "--recompute block needs --recompute-num-layers N "
                             "(the first N blocks of each pipeline chunk are recomputed)")
    if num_layers is not None and recompute != "block":
        raise PlanInputError("recompute_num_layers", f"--recompute-num-layers {num_layers} is for "
                             f"--recompute block (got --recompute {recompute})")
