"""Which configurations a calibration runs: a (scaled-down) model spec and the layout / setup
of each recompute mode and precision. No torch import (the CLI builds these before torch loads)."""

from __future__ import annotations

from planner.core.errors import PlanInputError
from planner.core.params import count_params
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Frozen, Layout, ModelSpec, RecomputeMode, TrainSetup

RECOMPUTE_MODES: tuple[RecomputeMode, ...] = ("none", "full", "every_k", "selective")

NORM_IMPLS = ("fused", "torch")
"""`--norm-impl`: `fused` norms save what the engines' fused kernels save (input + fp32 statistics:
Apex / Transformer Engine in Megatron-LM, torch's `_fused_rms_norm` on CUDA); `torch` runs torch's
own `F.rms_norm` / `nn.LayerNorm` (on the CPU a composite RMSNorm keeping fp32 copies of the input,
and LayerNorm statistics in bf16 under bf16; on CUDA torch's fused kernels)."""

_OVERRIDE_FIELDS = {
    "layers": "num_layers", "hidden": "hidden_size", "heads": "num_heads", "kv_heads": "num_kv_heads",
    "ffn": "ffn_hidden_size", "vocab": "vocab_size", "head_dim": "head_dim",
}


def scaled_model(model: ModelSpec, **overrides: int | None) -> ModelSpec:
    """The spec with dimensions replaced (`layers`, `hidden`, `heads`, `kv_heads`, `ffn`, `vocab`,
    `head_dim`); None leaves a field alone. Validated again (heads must divide hidden, ...)."""
    unknown = set(overrides) - set(_OVERRIDE_FIELDS)
    if unknown:
        raise PlanInputError("model", f"unknown override(s) {sorted(unknown)}; allowed: {sorted(_OVERRIDE_FIELDS)}")
    given = {_OVERRIDE_FIELDS[k]: v for k, v in overrides.items() if v is not None}
    if not given:
        return model
    if "hidden_size" in given and "head_dim" not in given:
        given["head_dim"] = None  # derive the head size from the new width
    tag = ",".join(f"{k}={v}" for k, v in overrides.items() if v is not None)
    data = model.model_dump() | given | {"name": f"{model.name}[{tag}]", "published_params": None}
    return ModelSpec.model_validate(data)


def check_size(model: ModelSpec, max_params: float) -> None:
    """Refuse models too big to train on this machine (scale them down with the overrides)."""
    total = count_params(model).total
    if total > max_params:
        raise PlanInputError(
            "model", f"{model.name} has {total:,} parameters (> --max-params {max_params:,.0f}); "
            "scale it down with --layers/--hidden/--heads/--ffn/--vocab")


def cpu_rank_limit(cpu_cores: int) -> int:
    """Most gloo ranks `--nproc` may start on the CPU: 4 per core, at least 8. Each rank is a
    process that imports torch (~0.4 GB); `--nproc 100000` started them until the machine ran
    out of memory, and past a few ranks per core each one's timings measure the scheduler."""
    return max(8, 4 * cpu_cores)


def check_nproc_devices(nproc: int, device: str, cuda_available: bool, cuda_devices: int,
                        cpu_cores: int = 1) -> None:
    """Refuse `--nproc N` under a CUDA request (`cuda`, `cuda:N`, or `auto` with CUDA present)
    on a machine with fewer than N CUDA devices: one rank per device, never N ranks on one GPU
    (NCCL refuses two ranks on one device; a crash of N processes is not an answer). `--device
    cpu` runs the N ranks on the CPU with gloo instead, at most `cpu_rank_limit` of them."""
    on_cuda = device.startswith("cuda") or (device == "auto" and cuda_available)
    if nproc > 1 and on_cuda and cuda_devices < nproc:
        raise PlanInputError(
            "nproc", f"--nproc {nproc} needs {nproc} CUDA devices (one rank each) but this machine has "
            f"{cuda_devices}; use --nproc {max(cuda_devices, 1)} or --device cpu (gloo on the CPU)")
    if not on_cuda and nproc > cpu_rank_limit(cpu_cores):
        raise PlanInputError(
            "nproc", f"--nproc {nproc} on the CPU: at most {cpu_rank_limit(cpu_cores)} ranks on this "
            f"{cpu_cores}-core machine (4 per core, at least 8; each rank is a process importing torch)")


class RunSpec(Frozen):
    """One configuration to run."""

    model: ModelSpec
    setup: TrainSetup
    layout: Layout

    @property
    def label(self) -> str:
        lay = self.layout
        rec = f"every_k={lay.recompute_every_k}" if lay.recompute == "every_k" else lay.recompute
        return f"{self.model.name} {self.setup.precision.name} {self.setup.optimizer.name} recompute={rec}"


def run_specs(model: ModelSpec, seq_len: int, micro_batch: int, precisions: list[str] | tuple[str, ...],
              optimizer: str, modes: list[RecomputeMode] | tuple[RecomputeMode, ...], every_k: int) -> list[RunSpec]:
    """One run per precision recipe and recompute mode (precision-major), `micro_batch` sequences
    of `seq_len` tokens, one step's worth of tokens."""
    runs = []
    for name in precisions:
        setup = TrainSetup(seq_len=seq_len, global_batch=micro_batch, train_tokens=seq_len * micro_batch,
                           precision=get_precision(name), optimizer=get_optimizer(optimizer))
        for mode in modes:
            # flash_attention=False: what the planner predicted before fused attention became the
            # default (the CPU harness runs unfused attention; planner.calibrate.run)
            layout = Layout(micro_batch=micro_batch, recompute=mode, recompute_every_k=every_k,
                            flash_attention=False)
            runs.append(RunSpec(model=model, setup=setup, layout=layout))
    return runs


def check_norm_impl(norm_impl: str) -> str:
    """`norm_impl` if it is one of NORM_IMPLS, else PlanInputError naming the allowed values."""
    if norm_impl not in NORM_IMPLS:
        raise PlanInputError("norm-impl", f"unknown {norm_impl!r}; allowed: {', '.join(NORM_IMPLS)}")
    return norm_impl


def expand_recompute(modes: list[str]) -> list[RecomputeMode]:
    """`all` means every mode; otherwise each name must be a recompute mode."""
    out: list[RecomputeMode] = []
    for mode in modes:
        if mode == "all":
            out.extend(m for m in RECOMPUTE_MODES if m not in out)
        elif mode in RECOMPUTE_MODES:
            if mode not in out:
                out.append(mode)  # type: ignore[arg-type]
        else:
            raise PlanInputError("recompute", f"unknown mode {mode!r}; allowed: {', '.join(RECOMPUTE_MODES)}, all")
    return out
