"""Predicted (the planner's functions) against measured (a real torch run), quantity by quantity.

No torch import here: it compares a `Measured` record with `planner.core.params`, `planner.memory.model_states`,
`planner.memory.activations` and `planner.core.flops`, so the tests and the report can use it on stored runs.
Seed and paper citations: docs/references.md
"""

from __future__ import annotations

import math

from planner.memory.activations import (
    first_stage_extra_bytes,
    last_stage_extra_bytes,
    layer_activation_bytes,
    layer_saved_bytes,
    layers_kept_bytes,
    selective_kept_bytes,
)
from planner.calibrate.partition import (
    fsdp2_local_numels,
    model_tensor_shapes,
    zero1_partition_numels,
)
from planner.core.flops import step_flops
from planner.memory.model_states import model_state_bytes
from planner.core.params import count_params
from planner.core.recipes import get_optimizer, get_precision
from planner.core.spec import Frozen, Layout, ModelSpec, TrainSetup


class Row(Frozen):
    """One compared quantity."""

    quantity: str
    unit: str
    """`params`, `bytes`, `count`, `flops`, `s`, `flops_per_s`."""
    predicted: float | None
    """The planner's value; None for measured-only quantities (time, FLOP/s)."""
    measured: float
    note: str = ""

    @property
    def error_pct(self) -> float | None:
        """(measured - predicted) / predicted x 100; None without a prediction or when both are 0."""
        if self.predicted is None or (self.predicted == 0 and self.measured == 0):
            return None
        if self.predicted == 0:
            return float("inf")
        return (self.measured - self.predicted) / self.predicted * 100


def predicted_layout(layout: Layout, device: str) -> Layout:
    """The layout the planner should assume: SDPA on CUDA saves no s x s tensors (flash)."""
    return layout.model_copy(update={"flash_attention": device != "cpu"})


def state_rows(model: ModelSpec, setup: TrainSetup, measured) -> list[Row]:
    """Parameter count and parameter / gradient / optimizer bytes (one rank, no ZeRO)."""
    states, phi = measured.states, count_params(model).total
    predicted = model_state_bytes(phi, setup.precision, setup.optimizer, Layout())
    return [
        Row(quantity="parameters", unit="params", predicted=phi,
            measured=states.num_params),
        Row(quantity="parameter bytes", unit="bytes", predicted=predicted.params_bytes,
            measured=states.params_bytes),
        Row(quantity="gradient bytes", unit="bytes", predicted=predicted.grads_bytes,
            measured=states.grads_bytes),
        Row(quantity="optimizer-state bytes", unit="bytes", predicted=predicted.optimizer_bytes,
            measured=states.optimizer_bytes,
            note=f"+ {states.step_counter_bytes} B of torch `step` counters (4 B per tensor), not counted"
            if states.step_counter_bytes else ""),
    ]


def activation_rows(model: ModelSpec, setup: TrainSetup, layout: Layout, measured) -> list[Row]:
    """Saved-for-backward bytes: all blocks, the first block, outside the blocks."""
    lay = predicted_layout(layout, measured.device)
    s, b, e = setup.seq_len, layout.micro_batch, setup.precision.activation_bytes
    blocks = sum(sum(layer.values()) for layer in measured.saved_per_layer)
    return [
        Row(quantity=f"saved activations, all {model.num_layers} blocks", unit="bytes",
            predicted=layers_kept_bytes(model, lay, s, b, e, model.num_layers), measured=blocks),
        Row(quantity="saved activations, block 0", unit="bytes",
            predicted=layer_activation_bytes(model, lay, s, b, e),
            measured=sum(measured.saved_per_layer[0].values())),
        Row(quantity="saved activations, outside the blocks", unit="bytes",
            predicted=sum(_outside_blocks_bytes(model, lay, s, b, e).values()),
            measured=sum(measured.saved_outside_layers.values())),
    ]


def class_rows(model: ModelSpec, setup: TrainSetup, layout: Layout, measured) -> list[Row]:
    """Block 0 and the outside extras, tensor class by tensor class (recompute none / selective)."""
    lay = predicted_layout(layout, measured.device)
    s, b, e = setup.seq_len, layout.micro_batch, setup.precision.activation_bytes
    if layout.recompute in ("none", "selective"):
        predicted = layer_saved_bytes(model, lay, s, b, e)
        if layout.recompute == "selective":
            predicted = selective_kept_bytes(model, lay, s, b, e, predicted)
    else:
        predicted = {"checkpoint_input": layer_activation_bytes(model, lay, s, b, e)}
    return (_by_class("block 0: ", predicted, measured.saved_per_layer[0])
            + _by_class("outside: ", _outside_blocks_bytes(model, lay, s, b, e), measured.saved_outside_layers))


def _outside_blocks_bytes(model: ModelSpec, lay: Layout, s: int, b: int, e: int) -> dict[str, int]:
    """Saved bytes outside the blocks, by class: the first stage's embedding and the last stage's
    final norm, head and loss (one device holds both)."""
    return first_stage_extra_bytes(model, lay, s, b, e) | last_stage_extra_bytes(model, lay, s, b, e)


def _by_class(prefix: str, predicted: dict[str, int], measured: dict[str, int]) -> list[Row]:
    names = list(predicted) + [k for k in measured if k not in predicted]
    return [Row(quantity=prefix + name, unit="bytes", predicted=predicted.get(name),
                measured=measured.get(name, 0),
                note="" if name in predicted else "not in the planner's inventory")
            for name in names]


def flop_rows(model: ModelSpec, setup: TrainSetup, layout: Layout, measured) -> list[Row]:
    """FLOPs of one micro-batch step: forward, backward (+ recompute), total."""
    one = setup.model_copy(update={"global_batch": layout.micro_batch})
    predicted = step_flops(model, one, predicted_layout(layout, measured.device))
    return [
        Row(quantity="forward FLOPs", unit="flops", predicted=predicted.forward_flops,
            measured=measured.forward_flops),
        Row(quantity="backward + recompute FLOPs", unit="flops",
            predicted=predicted.backward_flops + predicted.recompute_flops,
            measured=measured.backward_flops),
        Row(quantity="FLOPs per step (hardware)", unit="flops", predicted=predicted.hardware_flops,
            measured=measured.forward_flops + measured.backward_flops),
    ]


def timing_rows(measured) -> list[Row]:
    """Measured only: step time and achieved FLOP/s (and CUDA peak memory)."""
    rows = [Row(quantity="step time", unit="s", predicted=None, measured=measured.step_time_s),
            Row(quantity="achieved FLOP/s", unit="flops_per_s", predicted=None,
                measured=measured.achieved_flops_per_s)]
    if measured.peak_memory_bytes is not None:
        rows.append(Row(quantity="peak memory (CUDA)", unit="bytes", predicted=None,
                        measured=measured.peak_memory_bytes))
    return rows


def compare(model: ModelSpec, setup: TrainSetup, layout: Layout, measured) -> list[Row]:
    """Every summary row of one configuration."""
    return (state_rows(model, setup, measured) + activation_rows(model, setup, layout, measured)
            + flop_rows(model, setup, layout, measured) + timing_rows(measured))


def distributed_rows(model: ModelSpec, ranks: list[dict]) -> list[Row]:
    """Per-rank DDP / ZeRO-1 / FSDP2 measurements (fp32 Adam) against the planner's even ZeRO
    split (seed 001 §2, `model_state_bytes`) and against torch's own partition rules
    (planner.calibrate.partition), which the engines actually follow."""
    world, phi = len(ranks), count_params(model).total
    fp32, adam = get_precision("fp32"), get_optimizer("adam")
    zero1 = model_state_bytes(phi, fp32, adam, Layout(dp=world, zero_stage=1))
    zero3 = model_state_bytes(phi, fp32, adam, Layout(dp=world, zero_stage=3))
    shapes = [shape for _, shape in model_tensor_shapes(model)]
    greedy = zero1_partition_numels([math.prod(s) for s in shapes], world)
    units = model.num_layers + 1  # fully_shard on every block, then the root
    rows: list[Row] = []
    for r, rank in enumerate(ranks):
        ddp, fsdp = rank["ddp"], rank["fsdp2"]
        local, padded = fsdp2_local_numels(shapes, world, r)
        ring = 2 * (world - 1) / world * phi * 4  # seed 004 §3.4.2: ring all-reduce per GPU
        rows += [
            Row(quantity=f"rank {r}: DDP all-reduced gradient bytes", unit="bytes", predicted=phi * 4,
                measured=ddp["allreduce_bytes"],
                note=f"{ddp['buckets']} bucket(s); ring all-reduce sends 2(N-1)/N of it per rank: {ring:,.0f} B"),
            Row(quantity=f"rank {r}: ZeRO-1 optimizer bytes (planner, even split)", unit="bytes",
                predicted=zero1.optimizer_bytes, measured=ddp["zero1_optimizer_bytes"],
                note="ZeroRedundancyOptimizer keeps whole parameters per rank"),
            Row(quantity=f"rank {r}: ZeRO-1 optimizer bytes (whole-parameter rule)", unit="bytes",
                predicted=8 * greedy[r], measured=ddp["zero1_optimizer_bytes"]),
            Row(quantity=f"rank {r}: FSDP2 parameter bytes (planner, even split)", unit="bytes",
                predicted=zero3.params_bytes, measured=fsdp["param_bytes"]),
            Row(quantity=f"rank {r}: FSDP2 parameter bytes (dim-0 chunk rule)", unit="bytes",
                predicted=4 * local, measured=fsdp["param_bytes"],
                note=f"padded storage predicted {4 * padded:,}, measured {fsdp['param_storage_bytes']:,}"),
            Row(quantity=f"rank {r}: FSDP2 gradient bytes (dim-0 chunk rule)", unit="bytes",
                predicted=4 * local, measured=fsdp["grad_bytes"], note=f"planner even split {zero3.grads_bytes:,}"),
            Row(quantity=f"rank {r}: FSDP2 optimizer bytes (dim-0 chunk rule)", unit="bytes",
                predicted=8 * local, measured=fsdp["optimizer_bytes"],
                note=f"planner even split {zero3.optimizer_bytes:,}"),
            Row(quantity=f"rank {r}: FSDP2 all-gathers per step", unit="count",
                predicted=2 * units - 1, measured=fsdp["collectives"].get("allgather_base", 0),
                note="forward + backward per unit; the root is not resharded after forward"),
            Row(quantity=f"rank {r}: FSDP2 reduce-scatters per step", unit="count",
                predicted=units, measured=fsdp["collectives"].get("reduce_scatter_base", 0)),
        ]
    return rows
