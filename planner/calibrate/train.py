"""A training step with the plan's precision recipe and optimizer, and its model-state bytes.

Precision recipes (planner.recipes) map onto real tensors:
- `param_bytes` 2: the model's parameters are bf16/fp16; `master_param_bytes` 4: the optimizer
  steps an fp32 master copy, copied back after each step (Micikevicius et al. 2018, mixed precision);
- `grad_bytes` 4 with 2-byte params (Megatron `main_grad`): the bf16 gradient is accumulated into
  the master's fp32 `.grad` and dropped, so the resident gradient is fp32;
- `optimizer_grad_copy_bytes` 4 (ZeRO-Infinity): the master's fp32 `.grad` is kept next to the
  model's fp16 gradient;
- fp16 compute: dynamic loss scaling with `torch.amp.GradScaler` on the fp32 master gradients.
Seed and paper citations: docs/references.md
"""

from __future__ import annotations

import torch
from torch import nn

from planner.calibrate.measure import tensor_bytes
from planner.calibrate.results import StateBytes
from planner.core.errors import PlanInputError
from planner.core.spec import Optimizer, PrecisionRecipe

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def param_dtype(precision: PrecisionRecipe) -> torch.dtype:
    """The dtype of the model's working parameters."""
    if precision.param_bytes == 4:
        return torch.float32
    if precision.compute_dtype not in ("bf16", "fp16"):
        raise PlanInputError("precision", f"{precision.name}: calibrate supports fp32, bf16 and fp16 compute")
    return TORCH_DTYPES[precision.compute_dtype]


def make_torch_optimizer(optimizer: Optimizer, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The torch optimizer of a planner optimizer name (Adam, AdamW, SGD with or without momentum)."""
    name = optimizer.name
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    if name in ("sgd", "sgd-momentum"):
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9 if name == "sgd-momentum" else 0.0)
    raise PlanInputError("optimizer", f"{name}: calibrate supports adam, adamw, sgd, sgd-momentum")


class Trainer:
    """Holds the model, the (master) parameters the optimizer steps, and the loss scaler."""

    def __init__(self, model: nn.Module, precision: PrecisionRecipe, optimizer: Optimizer,
                 device: torch.device) -> None:
        self.model = model.to(device=device, dtype=param_dtype(precision))
        self.precision = precision
        self.params = [p for p in self.model.parameters()]
        self.mixed = precision.master_param_bytes > 0 and precision.param_bytes < 4
        self.masters = ([p.detach().float().clone().requires_grad_() for p in self.params]
                        if self.mixed else self.params)
        self.optimizer = make_torch_optimizer(optimizer, self.masters)
        self.main_grads = self.mixed and precision.grad_bytes == 4  # Megatron main_grad
        self.keep_master_grads = precision.optimizer_grad_copy_bytes > 0 or self.main_grads
        fp16 = precision.compute_dtype == "fp16"
        self.scaler = torch.amp.GradScaler(device.type) if fp16 else None

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        if self.mixed:
            for m in self.masters:
                m.grad = None

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def optimizer_step(self) -> None:
        """Move gradients to the masters, step, copy the masters back into the model."""
        if self.mixed:
            for p, m in zip(self.params, self.masters):
                m.grad = p.grad.float() if p.grad is not None else None
                if self.main_grads:
                    p.grad = None  # the fp32 main grad replaces the 2-byte gradient
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.mixed:
            with torch.no_grad():
                for p, m in zip(self.params, self.masters):
                    p.copy_(m)
            if not self.keep_master_grads:
                for m in self.masters:
                    m.grad = None  # a transient fp32 copy, not a resident state

    def state_bytes(self) -> StateBytes:
        """Bytes of parameters, gradients and optimizer state as they are now."""
        states = [v for s in self.optimizer.state.values() for k, v in s.items()
                  if torch.is_tensor(v) and k != "step"]
        steps = [v for s in self.optimizer.state.values() for k, v in s.items()
                 if torch.is_tensor(v) and k == "step"]
        master_grads = tensor_bytes(m.grad for m in self.masters) if self.mixed else 0
        grads = tensor_bytes(p.grad for p in self.params) + (master_grads if self.main_grads else 0)
        optimizer = tensor_bytes(states) + (tensor_bytes(self.masters) if self.mixed else 0)
        if self.mixed and not self.main_grads:
            optimizer += master_grads  # ZeRO-Infinity's fp32 gradient copy (0 when dropped)
        return StateBytes(
            num_params=sum(p.numel() for p in self.params), params_bytes=tensor_bytes(self.params),
            grads_bytes=grads, optimizer_bytes=optimizer, step_counter_bytes=tensor_bytes(steps),
            num_tensors=len(self.params))
