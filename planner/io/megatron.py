"""Megatron-LM launch line <-> ModelSpec + Layout + setup.

Flags are spelled as NVIDIA/Megatron-LM `megatron/training/arguments.py` defines them, and the
defaults it fills are applied the same way (`validate_args`): ffn_hidden_size 4h, or
int(4h*2/3/64)*64 with --swiglu; kv_channels hidden/heads; global batch micro x dp;
sequence parallelism switched off when tp = 1; bf16 accumulates and all-reduces gradients in
fp32 (accumulate_allreduce_grads_in_fp32 forced on) -> the 18-byte megatron-bf16 recipe, unless
--grad-reduce-in-bf16 (newer Megatron-LM) keeps them in bf16 -> bf16-mixed (16 bytes);
--recompute-activations means selective recompute. The vocabulary is padded to a multiple of
make_vocab_size_divisible_by (default 128) x tp (megatron/training/tokenizer
`_vocab_size_with_padding`); `--padded-vocab-size` (Megatron-DeepSpeed and other forks) is taken as is.
Context parallelism: `--context-parallel-size` and a single `--cp-comm-type` p2p or a2a
(world = tp x cp x pp x dp); Megatron runs it only in Transformer Engine's fused attention, so a
cp > 1 launch without `--attention-backend` is read as flash attention.
Not modelled, rejected with a clear line: expert parallelism > 1, `--cp-comm-type` allgather or
a2a+p2p (hierarchical), MoE layer frequency != 1, `--recompute-method block` recomputing only
part of a stage.
"""

from __future__ import annotations

import ast

import difflib
import functools
import math
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.core.errors import PlanInputError, format_validation_error
from planner.io.engine import EngineJob
from planner.core.spec import Cluster, Layout, ModelSpec, TrainSetup, ceil_div
from planner.timing.stage_placement import accounted_stage_layers

Args = dict[str, Any]

# Flags that take no value (store_true in arguments.py); every other recognised flag takes one.
BOOL_FLAGS = {
    "--sequence-parallel", "--use-distributed-optimizer", "--recompute-activations", "--swiglu",
    "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--add-qkv-bias",
    "--group-query-attention", "--bf16", "--fp16", "--use-flash-attn",
    "--accumulate-allreduce-grads-in-fp32", "--use-rotary-position-embeddings", "--standalone",
    "--grad-reduce-in-bf16", "--optimizer-cpu-offload",
    "--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather",
}

UNEXPANDED = "$unexpanded"
"""Key of the shell-variable tokens (`$GPT_ARGS`) found on the line, for error hints."""

# --------------------------------------------------------------------------- parse


def read_megatron_args(path: str | Path) -> tuple[Args, Args]:
    """(launcher flags, Megatron flags) of a launch line or args file."""
    path = Path(path)
    from planner.io.strict import read_text

    return parse_megatron_args(read_text(path, "--megatron-args"))


def parse_megatron_args(text: str) -> tuple[Args, Args]:
    """Split `torchrun ... pretrain_gpt.py --flags` (or bare flags) into two flag dicts.

    Backslash-newline continuations and `#` comments are allowed. A token ending in `.py`
    separates the launcher's flags from Megatron's; without one every flag is Megatron's.
    """
    try:
        tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as err:
        raise PlanInputError("--megatron-args", f"cannot split the command line: {err}") from None
    script = next((i for i, tok in enumerate(tokens) if tok.endswith(".py")), None)
    launcher, flags = ({}, _flags(tokens)) if script is None else (
        _flags(tokens[:script]), _flags(tokens[script + 1:]))
    _refuse_unknown(flags)
    variables = [tok for tok in tokens if tok.startswith("$")]
    if variables:  # e.g. `$GPT_MODEL_ARGS`: flags zplan cannot see
        flags[UNEXPANDED] = variables
    return launcher, flags


@functools.cache
def known_flags() -> frozenset[str]:
    """Every flag Megatron-LM's parser defines (planner/data/megatron_flags.txt says which commits)."""
    text = resources.files("planner.data").joinpath("megatron_flags.txt").read_text(encoding="utf-8")
    return frozenset(line for line in text.splitlines() if line.startswith("--"))


def _refuse_unknown(flags: Args) -> None:
    """An unknown flag (a typo such as --tensor-model-paralel-size) is an error naming the nearest
    known one: Megatron's argparse (allow_abbrev=False) would refuse it too, and ignoring it would
    plan a different job."""
    known = known_flags()
    for flag in flags:
        if flag != UNEXPANDED and flag not in known:
            near = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else ""
            raise PlanInputError("--megatron-args", f"unknown Megatron-LM flag {flag}{hint}")


ZERO_ALLOWED = {"--recompute-num-layers", "--mtp-num-layers", "--moe-shared-expert-intermediate-size", "--num-experts",
                "--train-iters", "--train-samples"}
"""Integer flags for which 0 means "none"; every other integer flag is a size or a divisor."""


def _flags(tokens: list[str]) -> Args:
    """`--flag value`, `--flag=value` and boolean `--flag` into {flag: value or True}."""
    out: Args = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("--"):
            continue  # the launcher's program name, env assignments, positional values
        if "=" in tok:
            key, value = tok.split("=", 1)
            out[key.replace("_", "-")] = value
            continue
        flag = tok.replace("_", "-")  # argparse accepts --use_distributed_optimizer too
        if flag in BOOL_FLAGS or i >= len(tokens) or tokens[i].startswith("--"):
            out[flag] = True
        else:
            out[flag] = tokens[i]
            i += 1
    return out


def _int(args: Args, flag: str, default: int | None = None) -> int:
    """An integer flag; a missing required one or a shell variable is a one-line error."""
    value = args.get(flag)
    if value is None:
        if default is None:
            hint = f" (the line uses {', '.join(args[UNEXPANDED])}: expand shell variables first)" \
                if UNEXPANDED in args else ""
            raise PlanInputError(flag, f"missing from the Megatron-LM arguments{hint}")
        return default
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise PlanInputError(flag, f"needs an integer, got {value!r} (expand shell variables first)") from None
    if number < 0 or (number == 0 and flag not in ZERO_ALLOWED):
        allowed = "a non-negative" if flag in ZERO_ALLOWED else "a positive"
        raise PlanInputError(flag, f"needs {allowed} integer, got {number}")
    return number


def _float(args: Args, flag: str, default: float) -> float:
    value = args.get(flag, default)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise PlanInputError(flag, f"needs a number, got {value!r}") from None


# --------------------------------------------------------------------------- model


def _padded_vocab(args: Args, tp: int) -> int:
    """--padded-vocab-size, or --vocab-size padded to make_vocab_size_divisible_by x tp."""
    if "--padded-vocab-size" in args:
        return _int(args, "--padded-vocab-size")
    if "--vocab-size" not in args:
        raise PlanInputError(
            "--vocab-size", "missing: zplan cannot read the tokenizer; add --vocab-size (or --padded-vocab-size)"
        )
    multiple = _int(args, "--make-vocab-size-divisible-by", 128) * tp
    return ceil_div(_int(args, "--vocab-size"), multiple) * multiple


def _position(args: Args) -> str:
    kind = args.get("--position-embedding-type", "learned_absolute")
    if args.get("--use-rotary-position-embeddings"):
        kind = "rope"
    if kind not in ("learned_absolute", "rope"):
        raise PlanInputError("--position-embedding-type", f"{kind!r}; allowed: learned_absolute, rope")
    return "learned" if kind == "learned_absolute" else "rotary"


def _moe_fields(args: Args, ffn: int) -> dict[str, Any]:
    """--num-experts, --moe-router-topk (default 2), --moe-ffn-hidden-size, shared experts."""
    if "--num-experts" not in args:
        return {}
    expert = _int(args, "--moe-ffn-hidden-size", ffn)
    shared = _int(args, "--moe-shared-expert-intermediate-size", 0)
    if shared % expert:
        raise PlanInputError("--moe-shared-expert-intermediate-size", f"{shared} is not a multiple of {expert}")
    return {"num_experts": _int(args, "--num-experts"), "experts_per_token": _int(args, "--moe-router-topk", 2),
            "expert_ffn_hidden_size": expert, "num_shared_experts": shared // expert,
            **_moe_placement(args)}


def _moe_placement(args: Args) -> dict[str, int]:
    """--moe-layer-freq: 1, or a literal list of 0 (dense) / 1 (MoE) per block that the spec's
    first_dense_layers + moe_layer_step can place ((i + 1) % step == 0 after the dense prefix).
    An integer N > 1 puts MoE on blocks i % N == 0 (transformer_block.py), which the spec's
    (i + 1) % step rule cannot place; list expressions other than a plain literal are refused."""
    value = str(args.get("--moe-layer-freq", "1")).strip()
    if value == "1":
        return {}
    try:
        pattern = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        pattern = None
    if not (isinstance(pattern, list) and pattern and set(pattern) <= {0, 1} and 1 in pattern):
        raise PlanInputError("--moe-layer-freq", f"{value}: only 1 or a literal list of 0/1 per layer is read")
    n = len(pattern)
    placements = ((first, step) for step in range(1, n + 1) for first in range(n)
                  if [int(i >= first and (i + 1) % step == 0) for i in range(n)] == pattern)
    found = next(placements, None)
    if found is None:
        raise PlanInputError("--moe-layer-freq", f"{value}: not a dense prefix followed by MoE every n-th layer")
    first, step = found
    return {"first_dense_layers": first, "moe_layer_step": step}


def _mla_fields(args: Args) -> dict[str, Any]:
    """--multi-latent-attention (a TransformerConfig field) with --q-lora-rank (default None: a
    full-rank query projection), --kv-lora-rank (32), --qk-head-dim (128), --qk-pos-emb-head-dim
    (64), --v-head-dim (128): arguments.py `_add_mla_args` defaults at NVIDIA/Megatron-LM@d98e8a64;
    --mtp-num-layers (multi-token prediction modules, default none)."""
    fields: dict[str, Any] = {"mtp_modules": _int(args, "--mtp-num-layers", 0)}
    if not args.get("--multi-latent-attention"):
        return fields
    return fields | {
        "q_lora_rank": _int(args, "--q-lora-rank") if "--q-lora-rank" in args else None,
        "kv_lora_rank": _int(args, "--kv-lora-rank", 32),
        "qk_nope_head_dim": _int(args, "--qk-head-dim", 128),
        "qk_rope_head_dim": _int(args, "--qk-pos-emb-head-dim", 64),
        "v_head_dim": _int(args, "--v-head-dim", 128)}


def model_from_megatron(args: Args, tp: int, name: str = "megatron-model") -> ModelSpec:
    """The model the network-size flags describe, with arguments.py's defaults."""
    hidden, heads = _int(args, "--hidden-size"), _int(args, "--num-attention-heads")
    swiglu = bool(args.get("--swiglu"))
    default_ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden  # validate_args
    ffn = _int(args, "--ffn-hidden-size", default_ffn)
    seq = _int(args, "--seq-length")
    norm = args.get("--normalization", "LayerNorm")
    if norm not in ("LayerNorm", "RMSNorm"):
        raise PlanInputError("--normalization", f"{norm!r}; allowed: LayerNorm, RMSNorm")
    dropout = _float(args, "--hidden-dropout", 0.1) > 0 or _float(args, "--attention-dropout", 0.1) > 0
    fields: dict[str, Any] = dict(
        name=name, num_layers=_int(args, "--num-layers"), hidden_size=hidden, num_heads=heads,
        num_kv_heads=_int(args, "--num-query-groups", 1) if args.get("--group-query-attention") else None,
        head_dim=_int(args, "--kv-channels") if "--kv-channels" in args else None, ffn_hidden_size=ffn,
        vocab_size=_padded_vocab(args, tp), max_seq_len=_int(args, "--max-position-embeddings", seq),
        mlp="swiglu" if swiglu else "gelu", norm="rmsnorm" if norm == "RMSNorm" else "layernorm",
        position=_position(args), tied_embeddings=not args.get("--untie-embeddings-and-output-weights"),
        linear_bias=not args.get("--disable-bias-linear"), qkv_bias=bool(args.get("--add-qkv-bias")),
        dropout=dropout, source="Megatron-LM arguments", **_moe_fields(args, ffn),
        **_mla_fields(args),
    )
    try:
        return ModelSpec(**fields)
    except ValidationError as err:
        raise PlanInputError("megatron", format_validation_error(err)) from None


# --------------------------------------------------------------------------- layout


def _recompute(args: Args, layers_per_chunk: int) -> dict[str, Any]:
    """--recompute-granularity full|selective, --recompute-method uniform|block, --recompute-num-layers."""
    granularity = args.get("--recompute-granularity")
    if args.get("--recompute-activations"):
        granularity = "selective"  # arguments.py: --recompute-activations sets selective
    if granularity is None:
        return {"recompute": "none"}
    if granularity == "selective":
        return {"recompute": "selective"}
    if granularity != "full":
        raise PlanInputError("--recompute-granularity", f"{granularity!r}; allowed: full, selective")
    method, layers = args.get("--recompute-method"), _int(args, "--recompute-num-layers", 1)
    if method == "uniform":  # checkpoint the input of every chunk of `layers` layers
        return {"recompute": "full"} if layers == 1 else {"recompute": "every_k", "recompute_every_k": layers}
    if method == "block":  # recompute the first `layers` layers of each chunk, keep the rest
        # (megatron/core/recompute.py checkpointed_forward, method "block", commit d98e8a64);
        # as many as the largest chunk holds: every chunk recomputed whole, full recompute
        if layers >= layers_per_chunk:
            return {"recompute": "full"}
        return {"recompute": "block", "recompute_num_layers": layers}
    raise PlanInputError("--recompute-method", f"{method!r}: full granularity needs uniform or block")


def _largest_chunk(num_layers: int, pp: int, virtual: int, uneven: dict[str, Any]) -> int:
    """Blocks of the largest model chunk (a stage's blocks / virtual stages; uneven stages as
    Megatron builds them, `params.layers_per_stage`)."""
    from planner.core.params import layers_per_stage

    stages = layers_per_stage(num_layers, pp, uneven.get("first_stage_layers"),
                              uneven.get("last_stage_layers"))
    return max(stages) // virtual


def world_size(launcher: Args, num_gpus: int | None) -> int:
    """GPUs of the job: torchrun's --nnodes x --nproc-per-node, else the command line's count."""
    if "--nproc-per-node" in launcher:
        nnodes = launcher.get("--nnodes", "1")
        if not str(nnodes).isdigit():
            raise PlanInputError("--nnodes", f"{nnodes!r}: elastic ranges are not supported, give one number")
        world = int(nnodes) * _int(launcher, "--nproc-per-node")
        if num_gpus is not None and num_gpus != world:
            raise PlanInputError("--gpus", f"{num_gpus} but the launch line runs {nnodes} x "
                                 f"{launcher['--nproc-per-node']} = {world} processes")
        return world
    if num_gpus is None:
        raise PlanInputError("--gpus", "the launch line has no torchrun --nproc-per-node; give --gpus")
    return num_gpus


def _precision(args: Args) -> str:
    if args.get("--bf16") and args.get("--fp16"):
        raise PlanInputError("--bf16", "--bf16 and --fp16 are exclusive")
    if args.get("--bf16"):  # fp32 main_grad forced for bf16 (validate_args) unless bf16 reduce
        return "bf16-mixed" if args.get("--grad-reduce-in-bf16") else "megatron-bf16"
    if args.get("--fp16"):
        return "megatron-fp16" if args.get("--accumulate-allreduce-grads-in-fp32") else "zero-fp16"
    return "fp32"


def _unsupported(args: Args) -> None:
    """Axes and features the Layout has no field for."""
    if args.get("--optimizer-cpu-offload"):
        raise PlanInputError("--optimizer-cpu-offload", "Megatron's optimizer CPU offload is not modelled")
    for flag in ():  # every parallel axis Megatron has is modelled (tp, pp, dp, ep, cp)
        if _int(args, flag, 1) > 1:
            raise PlanInputError(flag, f"{args[flag]}: only 1 is modelled (the layout has no such axis)")
    tp = _int(args, "--tensor-model-parallel-size", 1)
    if "--expert-tensor-parallel-size" in args and _int(args, "--expert-tensor-parallel-size") != tp:
        raise PlanInputError("--expert-tensor-parallel-size", (
            f"{args['--expert-tensor-parallel-size']}: only the default (= --tensor-model-parallel-"
            f"size {tp}) is modelled; expert weights are split by tp (docs/moe.md)"))


def _context_parallel(args: Args) -> tuple[int, str]:
    """(cp, cp_comm_type) of `--context-parallel-size` and `--cp-comm-type` (default p2p,
    arguments.py); allgather and a2a+p2p are not modelled."""
    cp = _int(args, "--context-parallel-size", 1)
    comm = str(args.get("--cp-comm-type", "p2p"))
    if comm not in ("p2p", "a2a"):
        raise PlanInputError("--cp-comm-type", f"{comm!r}: only p2p (ring) and a2a are modelled")
    return cp, comm


ACCOUNT_FLAGS = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")


def _accounted_stages(args: Args, num_layers: int, pp: int) -> dict[str, int | None]:
    """The account-for-embedding / -loss flags as the first / last stage block counts Megatron
    builds: (L [+1] [+1]) / pp per rank, one block fewer on the first (last) rank (Megatron-LM
    d98e8a64 megatron/core/transformer/transformer_block.py get_num_layers_to_build; the
    refusals mirror transformer_config.py __post_init__)."""
    given = [flag for flag in ACCOUNT_FLAGS if args.get(flag)]
    uneven = [flag for flag in ("--decoder-first-pipeline-num-layers",
                                "--decoder-last-pipeline-num-layers") if flag in args]
    if uneven:
        raise PlanInputError(given[0], f"cannot be set with {uneven[0]} (Megatron-LM "
                             "transformer_config.py refuses the combination)")
    if "--pipeline-model-parallel-layout" in args:
        raise PlanInputError(given[0], "cannot be set with --pipeline-model-parallel-layout "
                             "(Megatron-LM transformer_config.py refuses the combination)")
    if "--num-layers-per-virtual-pipeline-stage" in args or "--num-virtual-stages-per-pipeline-rank" in args:
        raise PlanInputError(given[0], "with interleaving Megatron removes the block from the first "
                             "(last) model chunk only, which the planner's uneven stages (spread "
                             "over all chunks) cannot represent; use --decoder-first/last-pipeline-num-layers")
    try:
        first, last = accounted_stage_layers(num_layers, pp, bool(args.get(ACCOUNT_FLAGS[0])),
                                             bool(args.get(ACCOUNT_FLAGS[1])))
    except ValueError as error:
        raise PlanInputError(given[0], f"{error} (Megatron-LM asserts the same)") from None
    return {"first_stage_layers": first if first is not None and pp > 1 and args.get(ACCOUNT_FLAGS[0]) else None,
            "last_stage_layers": last if last is not None and pp > 1 and args.get(ACCOUNT_FLAGS[1]) else None}


def _uneven_stages(args: Args, num_layers: int = 0, pp: int = 1) -> dict[str, int | None]:
    """`--decoder-first/last-pipeline-num-layers` (or the account-for flags, read as those layer
    counts) as Layout fields (None when not given)."""
    if any(args.get(flag) for flag in ACCOUNT_FLAGS):
        return _accounted_stages(args, num_layers, pp)
    return {"first_stage_layers": _int(args, "--decoder-first-pipeline-num-layers")
            if "--decoder-first-pipeline-num-layers" in args else None,
            "last_stage_layers": _int(args, "--decoder-last-pipeline-num-layers")
            if "--decoder-last-pipeline-num-layers" in args else None}


def _virtual_stages(args: Args, num_layers: int, pp: int) -> int:
    """Model chunks per pipeline rank: layers / (pp x --num-layers-per-virtual-pipeline-stage).
    With uneven stages Megatron-LM takes only --num-virtual-stages-per-pipeline-rank
    (arguments.py `validate_args`, commit d98e8a64)."""
    virtual = 1
    if "--num-layers-per-virtual-pipeline-stage" in args and any(_uneven_stages(args).values()):
        raise PlanInputError("--num-layers-per-virtual-pipeline-stage",
                             "with --decoder-first/last-pipeline-num-layers use "
                             "--num-virtual-stages-per-pipeline-rank (Megatron-LM arguments.py)")
    if "--num-layers-per-virtual-pipeline-stage" in args:
        per_virtual = _int(args, "--num-layers-per-virtual-pipeline-stage")
        if num_layers % (pp * per_virtual):
            raise PlanInputError("--num-layers-per-virtual-pipeline-stage",
                                 f"num_layers {num_layers} is not divisible by pp*{per_virtual}")
        virtual = num_layers // (pp * per_virtual)
    return _int(args, "--num-virtual-stages-per-pipeline-rank", virtual)


def _batches(args: Args, dp: int) -> tuple[int, int]:
    """(micro, global): global defaults to micro x dp and must be a multiple of it."""
    micro = _int(args, "--micro-batch-size")
    batch = _int(args, "--global-batch-size", micro * dp)  # validate_args default
    if batch % (micro * dp):
        raise PlanInputError("--global-batch-size",
                             f"{batch} is not divisible by micro_batch x dp = {micro} x {dp} (num_microbatches)")
    return micro, batch


def _train_tokens(args: Args, batch: int, seq: int) -> float | None:
    """--train-samples x seq, or --train-iters x global batch x seq."""
    if "--train-samples" in args:
        return float(_int(args, "--train-samples") * seq)
    if "--train-iters" in args:
        return float(_int(args, "--train-iters") * batch * seq)
    return None


def _optimizer(args: Args) -> str:
    optimizer = {"adam": "adam", "sgd": "sgd-momentum"}.get(str(args.get("--optimizer", "adam")))
    if optimizer is None:
        raise PlanInputError("--optimizer", f"{args['--optimizer']!r}; allowed: adam, sgd")
    return optimizer


def _overlaps(args: Args) -> tuple[str, ...]:
    """Megatron-Core's communication overlaps the line switches on (all off by default:
    megatron/training/arguments.py, store_true flags; planner/timing/megatron_overlap.py)."""
    from planner.timing.megatron_overlap import FLAGS

    on = tuple(name for name, flag in FLAGS.items() if args.get(flag))
    return on or None  # no overlap flag: zplan's generic schedule (see `job_from_megatron` note)


def job_from_megatron(launcher: Args, args: Args, num_gpus: int | None, name: str = "megatron-model") -> EngineJob:
    """Model, layout and setup parts of a Megatron-LM launch."""
    _unsupported(args)
    tp, pp = _int(args, "--tensor-model-parallel-size", 1), _int(args, "--pipeline-model-parallel-size", 1)
    cp, cp_comm = _context_parallel(args)
    world = world_size(launcher, num_gpus)
    if world % (tp * cp * pp):
        names, values = ("tp*cp*pp", f"{tp}*{cp}*{pp}") if cp > 1 else ("tp*pp", f"{tp}*{pp}")
        raise PlanInputError("--gpus", f"world size {world} is not divisible by {names} = {values}")
    dp = world // (tp * cp * pp)
    model = model_from_megatron(args, tp, name)
    virtual = _virtual_stages(args, model.num_layers, pp)
    micro, batch = _batches(args, dp)
    flash = bool(args.get("--use-flash-attn")) or args.get("--attention-backend") in ("flash", "fused")
    flash = flash or (cp > 1 and "--attention-backend" not in args)  # CP runs in TE attention only
    uneven = _uneven_stages(args, model.num_layers, pp)
    try:
        layout = Layout(
            tp=tp, pp=pp, dp=dp, ep=_int(args, "--expert-model-parallel-size", 1), cp=cp,
            cp_comm_type=cp_comm, virtual_stages=virtual, **uneven,
            zero_stage=1 if args.get("--use-distributed-optimizer") else 0,
            sequence_parallel=bool(args.get("--sequence-parallel")) and tp > 1,  # off at tp=1
            flash_attention=flash, micro_batch=micro, grad_accum=batch // (micro * dp),
            megatron_overlap=_overlaps(args),
            **_recompute(args, _largest_chunk(model.num_layers, pp, virtual, uneven)),
        )
    except ValidationError as err:
        raise PlanInputError("megatron", format_validation_error(err)) from None
    notes = []
    if "--attention-backend" not in args and not args.get("--use-flash-attn") and cp > 1:
        notes.append(f"no --attention-backend with --context-parallel-size {cp}: flash_attention="
                     "true assumed (Megatron runs context parallelism in Transformer Engine's "
                     "fused attention only)")
    elif "--attention-backend" not in args and not args.get("--use-flash-attn"):
        notes.append("no --attention-backend: flash_attention=false assumed (Megatron's default "
                     "auto may pick a fused kernel that saves no s x s tensors)")
    if layout.megatron_overlap is None:
        notes.append("no --overlap-grad-reduce / --overlap-param-gather / --tp-comm-overlap: "
                     "megatron_overlap left unset (zplan's generic schedule: gradient reduction "
                     "behind backward); Megatron's own default is all off, which "
                     "megatron_overlap: [] models")
    seq, precision = _int(args, "--seq-length"), _precision(args)
    return EngineJob(
        layout=layout, global_batch=batch, model=model, seq_len=seq, train_tokens=_train_tokens(args, batch, seq),
        precision=precision, optimizer=_optimizer(args),
        notes=tuple(notes),
    )


# --------------------------------------------------------------------------- write

_PRECISION_FLAGS = {
    "megatron-bf16": ["--bf16"],  # fp32 main_grad is forced for bf16
    "bf16-mixed": ["--bf16", "--grad-reduce-in-bf16"],  # bf16 gradients (newer Megatron-LM)
    "zero-fp16": ["--fp16"],
    "megatron-fp16": ["--fp16", "--accumulate-allreduce-grads-in-fp32"],
    "fp32": [],
}


def _check_exportable(model: ModelSpec, layout: Layout, setup: TrainSetup) -> None:
    """Raise for what Megatron-LM's GPT flags cannot say."""
    problems = [
        (model.arch != "decoder", "model", "encoder models use pretrain_bert.py, not written here"),
        (model.sliding_window is not None, "sliding_window", "no sliding-window flag is written"),
        (model.lm_head_bias or not model.final_norm, "model", "lm_head bias / no final norm"),
        (model.qk_norm or model.sandwich_norms, "qk_norm",
         "q/k norms and sandwich norms: no flag is written yet"),
        (model.gate_activation != "silu", "gate_activation", f"{model.gate_activation}: --swiglu is SiLU"),
        (model.local_window is not None, "local_window", "no local/global attention flag is written yet"),
        (model.shared_expert_gate, "shared_expert_gate", "no shared-expert gate flag is written yet"),
        (layout.zero_stage > 1, "zero_stage", f"{layout.zero_stage}: Megatron's distributed optimizer is ZeRO-1"),
        (layout.offload_optimizer != "none" or layout.offload_params != "none", "offload",
         "offload is a DeepSpeed feature here; use --format deepspeed"),
        (bool(layout.tempo), "tempo", "Tempo techniques have no Megatron-LM flag"),
        (setup.precision.name not in _PRECISION_FLAGS, "precision",
         f"{setup.precision.name}; use one of {', '.join(_PRECISION_FLAGS)}"),
        (setup.optimizer.name not in ("adam", "adamw", "sgd-momentum"), "optimizer",
         f"{setup.optimizer.name}: Megatron-LM has adam and sgd (with momentum)"),
    ]
    for bad, field, why in problems:
        if bad:
            raise PlanInputError(field, f"not expressible as Megatron-LM flags: {why}")


def _model_flags(model: ModelSpec) -> list[str]:
    flags = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
             "--num-attention-heads", str(model.num_heads), "--ffn-hidden-size", str(model.ffn_hidden_size)]
    if model.kv_heads != model.num_heads:
        flags += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if model.head_size != model.hidden_size // model.num_heads or model.hidden_size % model.num_heads:
        flags += ["--kv-channels", str(model.head_size)]
    flags += ["--max-position-embeddings", str(model.max_seq_len),
              "--position-embedding-type", "rope" if model.position == "rotary" else "learned_absolute",
              "--normalization", "RMSNorm" if model.norm == "rmsnorm" else "LayerNorm",
              "--vocab-size", str(model.vocab_size), "--make-vocab-size-divisible-by", "1"]
    flags += ["--swiglu"] if model.mlp == "swiglu" else []
    flags += [] if model.tied_embeddings else ["--untie-embeddings-and-output-weights"]
    flags += [] if model.linear_bias else ["--disable-bias-linear"]
    flags += ["--add-qkv-bias"] if model.qkv_bias and not model.linear_bias else []
    flags += [] if model.dropout else ["--attention-dropout", "0", "--hidden-dropout", "0"]
    if model.is_mla:  # _mla_fields reads them back
        flags += ["--multi-latent-attention", "--kv-lora-rank", str(model.kv_lora_rank),
                  "--qk-head-dim", str(model.qk_nope_head_dim),
                  "--qk-pos-emb-head-dim", str(model.qk_rope_head_dim),
                  "--v-head-dim", str(model.v_head_dim)]
        flags += ["--q-lora-rank", str(model.q_lora_rank)] if model.q_lora_rank else []
    flags += ["--mtp-num-layers", str(model.mtp_modules)] if model.mtp_modules else []
    if model.is_moe:
        flags += ["--num-experts", str(model.num_experts), "--moe-router-topk", str(model.experts_per_token),
                  "--moe-ffn-hidden-size", str(model.expert_ffn_size)]
        if model.num_shared_experts:
            flags += ["--moe-shared-expert-intermediate-size", str(model.num_shared_experts * model.expert_ffn_size)]
        if model.num_moe_layers < model.num_layers:  # 0 dense, 1 MoE per block (arguments.py moe_freq_type)
            pattern = ",".join("1" if model.layer_is_moe(i) else "0" for i in range(model.num_layers))
            flags += ["--moe-layer-freq", f"[{pattern}]"]
    return flags


def _layout_flags(model: ModelSpec, layout: Layout) -> list[str]:
    flags = ["--tensor-model-parallel-size", str(layout.tp), "--pipeline-model-parallel-size", str(layout.pp)]
    flags += ["--expert-model-parallel-size", str(layout.ep)] if layout.ep > 1 else []
    uneven = layout.first_stage_layers is not None or layout.last_stage_layers is not None
    if layout.virtual_stages > 1 and uneven:  # arguments.py: uneven stages take this flag only
        flags += ["--num-virtual-stages-per-pipeline-rank", str(layout.virtual_stages)]
    elif layout.virtual_stages > 1:  # there is no --virtual-pipeline-model-parallel-size flag
        per_virtual = model.num_layers // (layout.pp * layout.virtual_stages)
        flags += ["--num-layers-per-virtual-pipeline-stage", str(per_virtual)]
    for flag, value in (("--decoder-first-pipeline-num-layers", layout.first_stage_layers),
                        ("--decoder-last-pipeline-num-layers", layout.last_stage_layers)):
        flags += [flag, str(value)] if value is not None else []
    flags += ["--sequence-parallel"] if layout.sequence_parallel else []
    if layout.cp > 1:
        flags += ["--context-parallel-size", str(layout.cp), "--cp-comm-type", layout.cp_comm_type]
    flags += ["--use-distributed-optimizer"] if layout.zero_stage == 1 else []
    flags += _overlap_flags(layout)
    if layout.recompute == "selective":
        flags += ["--recompute-granularity", "selective"]
    elif layout.recompute in ("full", "every_k"):
        k = layout.recompute_every_k if layout.recompute == "every_k" else 1
        flags += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                  "--recompute-num-layers", str(k)]
    elif layout.recompute == "block":
        flags += ["--recompute-granularity", "full", "--recompute-method", "block",
                  "--recompute-num-layers", str(layout.recompute_num_layers)]
    flags += ["--attention-backend", "flash" if layout.flash_attention else "unfused"]
    return flags


def _overlap_flags(layout: Layout) -> list[str]:
    """`--tp-comm-overlap` / `--overlap-grad-reduce` / `--overlap-param-gather` as the layout
    pins them (none when it is not modelled as Megatron or all are off, Megatron's default)."""
    from planner.timing.megatron_overlap import FLAGS

    return [FLAGS[name] for name in FLAGS if name in (layout.megatron_overlap or ())]


def megatron_flags(model: ModelSpec, layout: Layout, setup: TrainSetup) -> list[str]:
    """pretrain_gpt.py flags for the model, layout and setup (arguments.py spellings)."""
    _check_exportable(model, layout, setup)
    batch = layout.micro_batch * layout.grad_accum * layout.dp
    return (
        _model_flags(model) + _layout_flags(model, layout)
        + ["--micro-batch-size", str(layout.micro_batch), "--global-batch-size", str(batch),
           "--seq-length", str(setup.seq_len),
           "--train-samples", str(math.ceil(setup.train_tokens / setup.seq_len)),
           "--optimizer", "sgd" if setup.optimizer.name == "sgd-momentum" else "adam"]
        + _PRECISION_FLAGS[setup.precision.name] + _capacity_flags(model, setup)
    )


def _capacity_flags(model: ModelSpec, setup: TrainSetup) -> list[str]:
    """An MoE capacity factor as Megatron's padded capacity (planner.timing.expert); none:
    dropless, Megatron's default."""
    if not model.is_moe or setup.moe_capacity_factor is None:
        return []
    return ["--moe-expert-capacity-factor", f"{setup.moe_capacity_factor:g}",
            "--moe-pad-expert-input-to-capacity"]


def megatron_launch(cluster: Cluster, model: ModelSpec, layout: Layout, setup: TrainSetup,
                    script: str = "pretrain_gpt.py") -> str:
    """The torchrun line and the flags, one flag per line with backslash continuations."""
    from planner.io.torchrun import torchrun_command

    flags = megatron_flags(model, layout, setup)
    lines = [torchrun_command(cluster, layout, script)]
    i = 0
    while i < len(flags):  # a flag and its value on one line
        takes_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
        lines.append("  " + " ".join(flags[i:i + 2] if takes_value else flags[i:i + 1]))
        i += 2 if takes_value else 1
    return " \\\n".join(lines) + "\n"
