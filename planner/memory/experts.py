"""Expert parallelism in training memory: routed-expert weights per GPU and their model states.

With expert parallelism of degree ep (Megatron `--expert-model-parallel-size`) every MoE layer's
routed experts are split over ep ranks: a GPU holds num_experts / ep of them, each split by the
expert tensor-parallel degree, which zplan takes equal to tp (Megatron's default,
`expert_tensor_parallel_size = tensor_model_parallel_size`, megatron/training/arguments.py and
megatron/core/parallel_state.py at commit d98e8a64). Everything else (attention, norms, the
router, shared experts, dense MLPs, embeddings) stays as without ep: split by tp, replicated over
the dp ranks.

The ep ranks are carved out of the dp ranks (parallel_state.py: expert dp = world / (etp·ep·pp)
= dp / ep for etp = tp), so a routed expert's weight is replicated over dp / ep ranks: its
gradients and optimizer states are sharded by ZeRO over that expert-data-parallel group, the
dense ones over dp. Megatron's estimator does the same split
(megatron/training/theoretical_memory_usage.py `compute_weight_and_optimizer_memory`:
expert-sharded parameters x bytes per parameter at `expert_data_parallel_size`, the rest at
`data_parallel_size`), and so do Megatron's distributed optimizer (separate expert-parallel
buffers reduced over the expert-dp group, megatron/core/distributed/
distributed_data_parallel.py) and DeepSpeed ZeRO-1/2 (runtime/zero/stage_1_and_2.py: MoE
parameter groups use `expert_dp_process_group`, DeepSpeed 0.19.8).

At ep = 1 the model states are computed over all parameters at once exactly as before (the
expert split would only move the ceil of the partition by at most one element).
"""

from __future__ import annotations

import numpy as np

from planner.core import params
from planner.core.columns import LayoutColumns
from planner.core.spec import Layout, ModelSpec, Optimizer, PrecisionRecipe
from planner.memory import model_states
from planner.memory.model_states import ModelStateBytes, Parts, StateParts


def routed_expert_params_per_rank(model: ModelSpec, tp: int) -> int:
    """The routed experts of ONE MoE layer on one tp rank at ep = 1: num_experts x one expert's
    tensors (`params.layer_tensors_per_rank`, names `experts.0.`); 0 for a dense model."""
    if not model.is_moe:
        return 0
    tensors = params.layer_tensors_per_rank(model, tp, moe=True)
    one = sum(n for name, n in tensors if name.startswith("experts.0."))
    return model.num_experts * one


def moe_layers_per_stage(model: ModelSpec, pp: int, first: int | None = None,
                         last: int | None = None) -> list[int]:
    """MoE blocks on each pipeline stage (`params.layers_per_stage`, `ModelSpec.layer_is_moe`):
    DeepSeek-V3's three dense blocks sit on stage 1."""
    if not model.is_moe:  # no MoE block anywhere
        return [0] * len(params.layers_per_stage(model.num_layers, pp, first, last))
    out, start = [], 0
    for n in params.layers_per_stage(model.num_layers, pp, first, last):
        out.append(sum(model.layer_is_moe(i) for i in range(start, start + n)))
        start += n
    return out


def stage_routed_params(model: ModelSpec, tp: int, pp: int, first: int | None = None,
                        last: int | None = None) -> list[int]:
    """Routed-expert parameters of each stage on one tp rank at ep = 1 (included in
    `params.stage_params(...).total`)."""
    per_layer = routed_expert_params_per_rank(model, tp)
    return [n * per_layer for n in moe_layers_per_stage(model, pp, first, last)]


def params_per_gpu(stage_total, routed, ep):
    """Parameters on one GPU: the stage's tp share with the routed experts divided by ep
    (`stage_total`, `routed` at ep = 1; ep divides num_experts, so the division is exact).
    Integers or integer arrays."""
    return stage_total - routed + routed // ep


def ep_state_parts(num_params, routed, cols: LayoutColumns, precision: PrecisionRecipe,
                   optimizer: Optimizer, accounting: str = "deepspeed") -> StateParts:
    """`model_states.state_parts` with the routed experts apart (module docstring): on rows with
    ep > 1 the dense parameters (num_params - routed) are sharded over dp and the GPU's
    routed experts (routed / ep) over dp / ep; rows with ep = 1 (or no ep column) are
    state_parts of all num_params over dp. `num_params`, `routed`: per row, at ep = 1."""
    if "ep" not in cols or not np.any(np.asarray(cols["ep"]) > 1):
        return model_states.state_parts(num_params, cols, precision, optimizer, accounting)
    ep = cols["ep"]
    split = ep > 1
    total = np.broadcast_to(num_params, ep.shape)
    experts = np.broadcast_to(routed, ep.shape)
    dense = np.where(split, total - experts, total)
    mine = np.where(split, experts // ep, 0)
    edp = np.maximum(cols["dp"] // ep, 1)
    a = model_states.state_parts(dense, cols, precision, optimizer, accounting)
    b = model_states.state_parts(mine, cols.with_columns(dp=edp), precision, optimizer, accounting)
    return StateParts(*(_merge(pa, pb, split) for pa, pb in zip(a[:3], b[:3])),
                      a.partition_numel)


def _merge(a: Parts, b: Parts, split: np.ndarray) -> Parts:
    """Dense parts plus the expert parts of rows with ep > 1, name by name."""
    out: Parts = {}
    for name, (applies, value) in a.items():
        b_applies, b_value = b[name]
        b_applies = b_applies & split
        out[name] = (applies | b_applies,
                     np.where(applies, value, 0) + np.where(b_applies, b_value, 0))
    return out


def model_state_bytes(num_params: int, routed: int, precision: PrecisionRecipe,
                      optimizer: Optimizer, layout: Layout,
                      accounting: str = "deepspeed") -> ModelStateBytes:
    """`ep_state_parts` of one layout as exact integers (`model_states.model_state_bytes`
    with the expert split; identical to it at ep = 1)."""
    if layout.ep == 1:
        return model_states.model_state_bytes(num_params, precision, optimizer, layout, accounting)
    model_states.check_offload(layout)
    cols = model_states.exact_columns(layout)
    parts = ep_state_parts(np.array([num_params], dtype=object), np.array([routed], dtype=object),
                           cols, precision, optimizer, accounting)
    gpu, cpu, nvme = (model_states.parts_row(p) for p in parts[:3])
    p, g, o = (gpu.get(k, 0) for k in ("params", "grads", "optimizer"))
    return ModelStateBytes.computed(
        params_bytes=p, grads_bytes=g, optimizer_bytes=o,
        cpu_bytes=sum(cpu.values()), nvme_bytes=sum(nvme.values()),
        gpu_total_bytes=p + g + o, partition_numel=int(parts.partition_numel[0]),
        cpu_parts=cpu, nvme_parts=nvme)
