"""The whole training step's peak per GPU: the resident plan plus the largest transient (issue 11).

A step holds, at different moments (torch 2.13, transformers 5.x; the engines' files cited below):
- **start of backward**: everything resident (parameters, optimizer states, buffers, the batch)
  + the activations saved by the forward + the loss backward's two fp32 tensors of the logits'
  shape: an unfused cross entropy (`F.cross_entropy(logits.float(), ...)`, as transformers'
  `ForCausalLMLoss` in transformers/loss/loss_utils.py and the harness's own GPT do) backs
  through `nll_loss_backward` (a fp32 [T, V] gradient of the log-probabilities) into
  `_log_softmax_backward_data` (a second fp32 [T, V] tensor: the gradient of the logits) while
  the first is still alive (aten/src/ATen/native/SoftMax.cpp: the output is a new tensor).
  Megatron's vocab-parallel cross entropy (megatron/core/tensor_parallel/cross_entropy.py,
  `VocabParallelCrossEntropy.calculate_gradients`) writes the gradient into the softmax it saved
  (`grad_input = softmax`, in-place updates): no fp32 copy; only the cast of the gradient back to
  the logits' dtype (T·V/t·e bytes, 0 when the logits are fp32) — an assumption from the code,
  not measured here (no Megatron run on CPU).
- **optimizer step**: everything resident + every gradient + the optimizer's temporaries. torch
  Adam/AdamW (torch/optim/adam.py, torch 2.13): `foreach` (the default when every parameter is on
  CUDA, `_default_to_fused_or_foreach` in torch/optim/optimizer.py) computes
  `exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)`: one temporary of every state
  element of the group, 4 bytes each for fp32 states; `fused` keeps none (one kernel per tensor
  list); the single-tensor loop computes `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt)` per
  parameter: two temporaries of the current parameter while the previous parameter's `denom`
  is still referenced, three of the largest parameter when two largest tensors are adjacent in
  the parameter order (`for-loop`, the CPU default; an upper bound otherwise).
The peak is the larger of the two moments: in between, the activations are freed as fast as the
gradients arrive (each layer's gradients are no larger than its saved activations for the
sizes the planner serves), so the middle of backward is not counted: an approximation, named.
A layer's own backward workspace (its activation gradients) is not counted either; the check
against PyTorch's MemTracker (benchmarks/real_models.py, tests/test_peak.py) measures the error.
All sizes in bytes; pure functions on Python ints.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

FP32_BYTES = 4

OptimizerImpl = Literal["foreach", "fused", "for-loop", "none"]
LossImpl = Literal["unfused", "vocab-parallel"]


def loss_backward_bytes(tokens: int, vocab_per_gpu: int, logits_element_bytes: int, loss: LossImpl) -> int:
    """The loss backward's transient at the start of backward (module docstring): unfused,
    two fp32 [T, V/t] tensors; vocab-parallel, the gradient cast back to the logits' dtype."""
    if loss == "unfused":
        return 2 * tokens * vocab_per_gpu * FP32_BYTES
    if loss == "vocab-parallel":
        return 0 if logits_element_bytes == FP32_BYTES else tokens * vocab_per_gpu * logits_element_bytes
    raise ValueError(f"loss must be unfused or vocab-parallel, got {loss!r}")


def optimizer_temp_bytes(state_elements: int, largest_param_elements: int, impl: OptimizerImpl,
                         state_element_bytes: int = FP32_BYTES) -> int:
    """Adam's temporaries during `step()` (module docstring): foreach one state-sized copy of the
    whole group, the single-tensor loop three of the largest parameter, fused and none nothing."""
    if impl == "foreach":
        return state_elements * state_element_bytes
    if impl == "for-loop":
        return 3 * largest_param_elements * state_element_bytes
    if impl in ("fused", "none"):
        return 0
    raise ValueError(f"optimizer implementation must be foreach, fused, for-loop or none, got {impl!r}")


def step_peak_bytes(resident_bytes: int, activation_bytes: int, gradient_bytes: int, *,
                    tokens: int, vocab_per_gpu: int, logits_element_bytes: int, loss: LossImpl,
                    optimizer: OptimizerImpl, optimizer_state_elements: int,
                    largest_param_elements: int, state_element_bytes: int = FP32_BYTES) -> dict[str, int]:
    """Named parts of one GPU's step peak and the two moments it is the larger of.

    resident_bytes: parameters, optimizer states, buffers and the batch this GPU keeps all step;
    activation_bytes: saved for backward by the forward of the micro-batches in flight (with the
    loss's saved fp32 log-probabilities); gradient_bytes: the gradients held at the optimizer
    step; tokens: b·s of one micro-batch; vocab_per_gpu: ceil(V/t) on the last stage (0 on
    other stages); optimizer_state_elements: the state elements of one moment (exp_avg) on this
    GPU, i.e. the parameter elements it updates."""
    loss_part = loss_backward_bytes(tokens, vocab_per_gpu, logits_element_bytes, loss)
    temps = optimizer_temp_bytes(optimizer_state_elements, largest_param_elements, optimizer, state_element_bytes)
    backward_start = resident_bytes + activation_bytes + loss_part
    optimizer_step = resident_bytes + gradient_bytes + temps
    return {"resident": resident_bytes, "activations": activation_bytes, "loss_backward": loss_part,
            "gradients": gradient_bytes, "optimizer_temporaries": temps,
            "backward_start": backward_start, "optimizer_step": optimizer_step,
            "peak": max(backward_start, optimizer_step)}


# --------------------------------------------------------------------------- the peak in the plan
#
# In the plan (planner.memory.plan, and the sweep's columns on the same functions) the gradients
# are resident all step (the engines' persistent gradient buffers, model_states), so the step's
# two moments differ from the resident total (states + buffers + kept activations) only by
# their transients: at the start of backward the loss backward (last stage only); during a
# checkpointed layer's backward the recompute working memory (one segment); at the optimizer step
# the optimizer's temporaries while the activations are freed. The loss backward ends (the head's
# backward frees the fp32 gradients) before the first block is recomputed, so the backward's
# transient is the larger of the two, not their sum.


def loss_kind(implementation: str) -> LossImpl:
    """Megatron's vocab-parallel cross entropy for `megatron`; transformers' ForCausalLMLoss
    (`logits.float()` then F.cross_entropy, transformers/loss/loss_utils.py) for hf-*."""
    return "vocab-parallel" if implementation == "megatron" else "unfused"


def gpu_optimizer_temp_bytes(num_params, dp, zero_stage, fsdp2, optimizer_offloaded):
    """The Adam temporaries on one GPU at the optimizer step, for the implementation each engine
    runs by default (ints or numpy arrays):

    - optimizer offloaded: DeepSpeedCPUAdam steps on the host, nothing on the GPU;
    - fsdp2: torch.optim.AdamW over DTensor shards; `foreach` is the default on CUDA
      (`_default_to_fused_or_foreach` in torch/optim/optimizer.py, DTensor registered in
      `_foreach_supported_types` by torch/distributed/tensor/__init__.py, torch 2.13): one fp32
      state-sized temporary of the local shard, ceil(P/dp) elements, `dp` the ranks the states
      are sharded over (dp x cp: `model_states.shard_ranks`). HF Trainer's default
      `adamw_torch_fused` (transformers 5.23 training_args.py, torch >= 2.8) keeps none:
      counting foreach is an upper bound there;
    - otherwise fused, none: Megatron-Core's optimizer is TE / Apex FusedAdam
      (megatron/core/optimizer/__init__.py), DeepSpeed builds FusedAdam
      (deepspeed/runtime/engine.py `_configure_basic_optimizer`), HF Trainer adamw_torch_fused."""
    local = _where(zero_stage >= 1, -(-num_params // dp), num_params)
    foreach = np.logical_and(fsdp2, np.logical_not(optimizer_offloaded))
    return _where(foreach, optimizer_temp_bytes(local, 0, "foreach"), 0)


def stage_loss_bytes(setup, vocab_size: int, tp, micro_batch, cp=1):
    """The loss backward's transient of the last stage (`loss_backward_bytes`) for the setup's
    implementation (`loss_kind`) and logits in the activation dtype, over the s / cp tokens of
    each sequence a context-parallel rank holds; ints or arrays."""
    return loss_backward_bytes(micro_batch * (setup.seq_len // cp), -(-vocab_size // tp),
                               setup.precision.activation_bytes, loss_kind(setup.implementation))


def backward_moment_bytes(kept_bytes, recompute_bytes, loss_bytes):
    """A stage's bytes beyond its resident ones (states, buffers) at the start of backward: the
    kept activations and the backward's transient, the larger of the loss backward's tensors and
    the recompute segment (the two never coexist). Ints and numpy arrays alike."""
    return kept_bytes + _larger(loss_bytes, recompute_bytes)


def above_resident_bytes(backward_moment, optimizer_temps_bytes):
    """A stage's bytes beyond its resident ones at its peak: the larger of the step's two
    moments, the start of backward (`backward_moment_bytes`) and the optimizer step (its
    temporaries; the activations are freed by then). Ints and numpy arrays alike."""
    return _larger(backward_moment, optimizer_temps_bytes)


def plan_transients(kept_bytes, recompute_bytes, loss_bytes, optimizer_temps_bytes) -> dict:
    """The named transients that lift a stage's total (states, buffers, kept activations and
    the recompute segment already in `working`) to the step's peak, as extra buffers:
    `loss_backward`, what the backward's transient exceeds the recompute segment by, and
    `optimizer_step`, what the optimizer's temporaries exceed the start of backward by (0 when
    the backward is the peak). With them the total is the resident bytes plus
    `above_resident_bytes`. Ints and numpy arrays alike."""
    backward = backward_moment_bytes(kept_bytes, recompute_bytes, loss_bytes)
    return {"loss_backward": backward - kept_bytes - recompute_bytes,
            "optimizer_step": above_resident_bytes(backward, optimizer_temps_bytes) - backward}


def _larger(a, b):
    """The element-wise larger of a and b: np.maximum when either is an array (the sweep's
    columns; np.where on a mask costs several times as much), max() on plain Python ints (the
    plan's exact bytes, which may exceed int64)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return max(a, b)


def _where(cond, a, b):
    """np.where on arrays; a plain choice on scalars (the plan's exact Python ints, which may
    exceed int64)."""
    return np.where(cond, a, b) if isinstance(cond, np.ndarray) else (a if cond else b)
