"""Result records of calibration runs (no torch: the report, the JSON and the tests read them)."""

from __future__ import annotations

from planner.calibrate.compare import Row, predicted_layout
from planner.calibrate.config import RunSpec
from planner.io.calibration import Calibration, EfficiencyEntry, EfficiencySource
from planner.core.spec import Cluster, Frozen, Layout, ModelSpec, TrainSetup
from planner.timing.steptime import estimate_step


class StateBytes(Frozen):
    """Model-state bytes held by the real tensors after an optimizer step (before zero_grad)."""

    num_params: int
    params_bytes: int
    """The model's parameters as the forward pass uses them."""
    grads_bytes: int
    """Resident gradients (the model's `.grad`, or Megatron-style fp32 main grads)."""
    optimizer_bytes: int
    """fp32 master copy + optimizer states (+ the fp32 gradient copy of the recipe)."""
    step_counter_bytes: int
    """torch Adam's per-tensor `step` scalars: 4 bytes per parameter tensor (an overhead)."""
    num_tensors: int
    """Parameter tensors the optimizer steps."""


class Measured(Frozen):
    """What one configuration measured on the real tensors."""

    device: str
    """`cpu` or the CUDA device name."""
    norm_impl: str = "fused"
    """Which norms ran (`--norm-impl`): `fused` = Functions that save what the engines' fused
    kernels save (input + fp32 statistics); `torch` = torch's own norm ops (on the CPU,
    `F.rms_norm` is a composite keeping fp32 copies, LayerNorm keeps bf16 statistics under bf16)."""
    states: StateBytes
    saved_per_layer: list[dict[str, int]]
    """Per block: {tensor class: bytes saved for backward}, deduplicated by storage."""
    saved_outside_layers: dict[str, int]
    """Embedding, final norm, head and loss tensors saved for backward."""
    forward_flops: int
    backward_flops: int
    """Backward including the recompute forward (FlopCounterMode, one micro-batch)."""
    step_time_s: float
    """Mean wall time of one training step (forward, backward, optimizer) after warm-up."""
    achieved_flops_per_s: float
    """(forward + backward FLOPs) / step time."""
    peak_memory_bytes: int | None
    """torch.cuda.max_memory_allocated over the timed steps; None on CPU."""


class ConfigResult(Frozen):
    """One configuration: what ran, what it measured, and the comparison rows."""

    label: str
    run: RunSpec
    measured: Measured
    rows: list[Row]
    """Summary quantities (states, activations, FLOPs, time)."""
    classes: list[Row]
    """Saved bytes tensor class by tensor class (block 0 and outside the blocks)."""


class Inversion(Frozen):
    """The matmul-level efficiency of one measured run, and how it was derived."""

    efficiency: float | None
    source: EfficiencySource | None
    matmul_s_at_peak: float | None
    """Planner FLOPs (forward + backward + recompute) / the profile's dense peak."""
    non_matmul_s: float | None
    """The step-time model's other terms: memory-bound kernels + GPU optimizer step."""
    note: str


def invert_step_model(model: ModelSpec, cluster: Cluster | None, layout: Layout, setup: TrainSetup,
                      measured_step_s: float, end_to_end: float | None) -> Inversion:
    """The efficiency e for which `estimate_step(model, cluster, layout, setup, efficiency=e)`
    equals the measured step time, on a one-GPU cluster of the calibrated profile.

    With tp = pp = dp = 1 the model's step is linear in 1/e (docs/accuracy.md; planner.steptime):
    step = matmul_s_at_peak / e + non_matmul_s, with matmul_s_at_peak = (compute + recompute) at
    e = 1 and non_matmul_s = memory-bound kernels + GPU optimizer step (the other terms are 0 on
    one GPU). Closed form: e = matmul_s_at_peak / (measured - non_matmul_s). When that is not a
    fraction of peak (the measured step is not longer than the non-matmul terms, or e > 1), or
    there is no GPU profile, the whole-step figure `end_to_end` stands in, flagged.
    """
    if cluster is None:
        return _fallback(end_to_end, None, None, "no one-GPU cluster of a GPU profile (run without "
                         "--gpu, or no node profile uses it), so the step-time model cannot be inverted")
    at_peak = estimate_step(model, cluster, layout, setup, efficiency=1.0)
    matmul_s = at_peak.compute_s + at_peak.recompute_s
    non_matmul_s = at_peak.step_s - matmul_s
    spare_s = measured_step_s - non_matmul_s  # the measured time left for the matmuls
    terms = (f"measured step {measured_step_s * 1e3:.4g} ms, non-matmul terms {non_matmul_s * 1e3:.4g} ms "
             f"(memory-bound {at_peak.memory_bound_s * 1e3:.4g} ms + optimizer "
             f"{at_peak.gpu_optimizer_s * 1e3:.4g} ms at the {cluster.gpu.name} HBM bandwidth)")
    if spare_s <= 0:
        return _fallback(end_to_end, matmul_s, non_matmul_s, f"{terms}: the measured step is not longer "
                         "than the non-matmul terms alone (e.g. a CPU run against a GPU profile)")
    efficiency = matmul_s / spare_s
    if efficiency > 1:
        return _fallback(end_to_end, matmul_s, non_matmul_s, f"{terms}: the matmuls would need "
                         f"{efficiency:.3g} x the dense peak")
    return Inversion(efficiency=efficiency, source="step_model", matmul_s_at_peak=matmul_s,
                     non_matmul_s=non_matmul_s,
                     note=f"step-time model inverted: efficiency = matmul time at peak "
                          f"{matmul_s * 1e3:.4g} ms / (measured step - non-matmul terms); {terms}")


def _fallback(end_to_end: float | None, matmul_s: float | None, non_matmul_s: float | None,
              why: str) -> Inversion:
    if end_to_end is None:
        return Inversion(efficiency=None, source=None, matmul_s_at_peak=matmul_s,
                         non_matmul_s=non_matmul_s, note=f"no efficiency: {why}; no peak known")
    return Inversion(efficiency=end_to_end, source="end_to_end_fallback", matmul_s_at_peak=matmul_s,
                     non_matmul_s=non_matmul_s,
                     note=f"FALLBACK to the whole-step figure (it double-counts the non-matmul "
                          f"time in fit/sweep): {why}")


def build_calibration(results: list[ConfigResult], gpu: str, peak_flops_per_s: float | None,
                      created: str, torch_version: str, cluster: Cluster | None = None) -> Calibration:
    """The calibration file of a set of runs: one efficiency entry per configuration, and the
    measured overheads (torch's Adam step counters; measured / predicted saved bytes).

    `cluster`: one GPU of the calibrated profile (`cluster_for_gpus(gpu, 1)`), the hardware the
    step-time model is inverted on; the matmul-level efficiency is relative to its dense peak,
    the one `zplan fit/sweep --gpu` multiply it by. `end_to_end_utilisation` uses `peak_flops_per_s`.
    """
    entries = []
    for r in results:
        m, setup = r.measured, r.run.setup
        whole = m.achieved_flops_per_s / peak_flops_per_s if peak_flops_per_s else None
        end_to_end = min(whole, 1.0) if whole else None
        inv = invert_step_model(r.run.model, cluster, predicted_layout(r.run.layout, m.device), setup,
                                m.step_time_s, end_to_end)
        entries.append(EfficiencyEntry(
            gpu=gpu, dtype=setup.precision.compute_dtype, achieved_flops_per_s=m.achieved_flops_per_s,
            peak_flops_per_s=peak_flops_per_s, efficiency=inv.efficiency, efficiency_source=inv.source,
            end_to_end_utilisation=end_to_end, matmul_s_at_peak=inv.matmul_s_at_peak,
            non_matmul_s=inv.non_matmul_s, note=inv.note,
            model=r.run.model.name, recompute=r.run.layout.recompute,
            tokens_per_step=r.run.layout.micro_batch * setup.seq_len, step_time_s=m.step_time_s,
            device=m.device))
    overheads: dict[str, float] = {}
    for r in results:
        states = r.measured.states
        if states.step_counter_bytes:
            overheads["optimizer_step_counter_bytes_per_tensor"] = states.step_counter_bytes / states.num_tensors
    for r in results:
        blocks = next(row for row in r.rows if row.quantity.startswith("saved activations, all"))
        if blocks.predicted:
            key = (f"saved_activation_ratio[{r.run.model.name},{r.run.layout.recompute},"
                   f"{r.run.setup.precision.name},norms={r.measured.norm_impl}]")
            overheads[key] = blocks.measured / blocks.predicted
    return Calibration(created=created, torch_version=torch_version, entries=entries, overheads=overheads)


class HFRow(Frozen):
    """One `zplan calibrate --hf-config` measurement against its prediction (bytes of one block
    and of the extras outside); planner.calibrate.hf_run builds it."""

    where: str
    """`cpu, 2 layers` or `meta, full size`."""
    attention: str
    precision: str
    predicted_block_bytes: int
    measured_block_bytes: int
    predicted_outside_bytes: int
    measured_outside_bytes: int
    predicted_params: int
    measured_params: int
    predicted_forward_flops: float
    measured_forward_flops: int
    mismatched_classes: tuple[str, ...]
    """Tensor classes whose bytes differ (empty when every class agrees to the byte)."""
    attention_backend: str = ""
    """The SDPA kernel that ran (planner.calibrate.sdpa_backend: flash, efficient, cudnn, math or
    mixed), whose inventory the prediction uses; empty for eager attention."""

    @property
    def block_error(self) -> float:
        return self.predicted_block_bytes / self.measured_block_bytes - 1
