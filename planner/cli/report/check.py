"""Rendering of `zplan check` (and the verdict `zplan export` prints): one line, or JSON.

JSON schema (kind "check", schema_version from planner.cli.report):
  fits: bool                      the verdict (exit code 0 when true, 1 when false)
  verdict: str                    the one human line
  source: "job" | "deepspeed" | "megatron" | "accelerate"
  model: str, cluster: str, num_gpus: int
  layout: {tp, pp, dp, virtual_stages, zero_stage, offload_optimizer, offload_params,
           recompute, recompute_every_k, sequence_parallel, flash_attention, tempo,
           micro_batch, grad_accum}
  setup: {seq_len, global_batch, train_tokens, precision, optimizer}
  peak_stage: int                 the stage with the least headroom (1-based)
  peak_gpu_bytes, gpu_capacity_bytes, headroom_bytes: int  (capacity: HBM - reserve)
  reserve: {part: bytes}          the runtime reserve (planner.memory.reserve)
  overflows: [str]                one phrase per overflowing resource
  stages: [StageMemory]           planner.plan.StageMemory fields, bytes
  node: {cpu_bytes, cpu_capacity_bytes, nvme_bytes, nvme_capacity_bytes}
  notes: [str]                    assumptions made while reading the file
  suggestions: [Suggestion]       when it does not fit: changes that make it fit (search.suggest)
"""

from __future__ import annotations

from typing import Any

from planner.io.check import CheckResult
from planner.cli.report import emit_json, fmt_bytes
from planner.memory.reserve import headroom_warning


def layout_label(result: CheckResult) -> str:
    """tp/pp/dp, ZeRO stage, offload and recompute in a few words."""
    lay = result.layout
    parts = [f"tp{lay.tp} pp{lay.pp} dp{lay.dp}"]
    parts += [f"dp_shard{lay.dp_shard}"] if lay.dp_shard is not None and lay.dp_shard < lay.dp else []
    parts += [f"ep{lay.ep}"] if lay.ep > 1 else []
    parts += [f"cp{lay.cp} {lay.cp_comm_type}"] if lay.cp > 1 else []
    parts += [f"v{lay.virtual_stages}"] if lay.virtual_stages > 1 else []
    parts += [f"zero{lay.zero_stage}"] if lay.zero_stage else []
    parts += [lay.dp_engine] if lay.dp_engine != "deepspeed" else []
    parts += [f"opt->{lay.offload_optimizer}"] if lay.offload_optimizer != "none" else []
    parts += [f"params->{lay.offload_params}"] if lay.offload_params != "none" else []
    parts += [f"recompute={lay.recompute_label}"] if lay.recompute != "none" else []
    parts += [f"mb{lay.micro_batch}x{lay.grad_accum}"]
    if lay.megatron_overlap is not None:
        parts += ["megatron_overlap=" + (",".join(lay.megatron_overlap) or "none")]
    return " ".join(parts)


def transient_note(stage) -> str:
    """The step's transients the peak stage's total includes (planner.memory.peak:
    StageMemory.buffers `loss_backward`, `optimizer_step`), or "" when there are none."""
    parts = [f"{name.replace('_', ' ')} {fmt_bytes(stage.buffers[name])}"
             for name in ("loss_backward", "optimizer_step") if name in stage.buffers]
    return f"; the peak includes the step's transient ({', '.join(parts)})" if parts else ""


def verdict_line(result: CheckResult) -> str:
    """FITS with the peak stage's headroom, or DOES NOT FIT with every overflow."""
    plan = result.plan
    peak = plan.peak_stage
    where = (f"{result.model.name} on {result.layout.num_gpus} x {result.cluster.gpu.name} "
             f"({layout_label(result)}, {result.setup.precision.name})")
    used = f"; {plan.host_accounting_note}" if plan.host_accounting_note else ""
    if plan.fits:
        warning = headroom_warning(peak.headroom_bytes, peak.capacity_bytes)
        return (f"FITS: {where}: peak {fmt_bytes(peak.total_bytes)} of {fmt_bytes(peak.capacity_bytes)} "
                f"on stage {peak.stage}, headroom {fmt_bytes(peak.headroom_bytes)}"
                + (f"; {warning}" if warning else "") + transient_note(peak) + used)
    return f"DOES NOT FIT: {where}: {'; '.join(plan.overflows)}{used}"


def suggestion_lines(suggestions) -> list[str]:
    """The lines under a DOES NOT FIT verdict: each change that makes it fit, with its headroom."""
    if not suggestions:
        return []
    return ["fits with one of:"] + [
        f"  {s.change}: headroom {fmt_bytes(s.headroom_bytes)}" for s in suggestions]


def check_payload(result: CheckResult) -> dict[str, Any]:
    """The JSON document's body (see the module docstring)."""
    plan, peak = result.plan, result.plan.peak_stage
    setup = result.setup
    return {
        "fits": plan.fits,
        "verdict": verdict_line(result),
        "source": result.source,
        "model": result.model.name,
        "cluster": result.cluster.name,
        "num_gpus": result.layout.num_gpus,
        "layout": result.layout.model_dump(mode="json"),
        "setup": {"seq_len": setup.seq_len, "global_batch": setup.global_batch,
                  "train_tokens": setup.train_tokens, "precision": setup.precision.name,
                  "optimizer": setup.optimizer.name},
        "peak_stage": peak.stage,
        "peak_gpu_bytes": peak.total_bytes,
        "gpu_capacity_bytes": peak.capacity_bytes,
        "headroom_bytes": peak.headroom_bytes,
        "reserve": dict(plan.reserve),
        "overflows": list(plan.overflows),
        "stages": [stage.model_dump(mode="json") for stage in plan.stages],
        "node": plan.node.model_dump(mode="json"),
        "notes": list(result.notes),
        "suggestions": [s.model_dump(mode="json") for s in result.suggestions],
    }


def emit(result: CheckResult) -> None:
    """`--json`: the document on stdout."""
    emit_json("check", check_payload(result))
