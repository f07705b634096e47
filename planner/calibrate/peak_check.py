"""The step's peak measured by PyTorch's own tracker, without hardware: a full training step
(forward, backward, optimizer.step, zero_grad) under `FakeTensorMode` inside
`torch.distributed._tools.mem_tracker.MemTracker` (torch 2.13), against
`planner.memory.peak.step_peak_bytes`.

The first step creates Adam's states inside `step()`; the second is the steady state, so both
are tracked and the larger peak is reported. MemTracker counts every storage alive (CPU fake
tensors: exact bytes, no allocator rounding), by class: parameters, buffers, gradients,
activations, temporaries, optimizer states, and the external inputs (`Other`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

from planner.core.spec import Layout, ModelSpec
from planner.memory import activations as acts
from planner.memory.peak import FP32_BYTES, step_peak_bytes

TOKEN_ID_BYTES = 8
"""int64 token ids (torch.randint's default dtype)."""


def tracked_peak(build: Callable[[], tuple[torch.nn.Module, Callable[[], torch.Tensor]]],
                 foreach: bool | None, steps: int = 2) -> dict[str, int]:
    """MemTracker's peak of `steps` training steps of `build()` -> (module, loss_fn) under
    FakeTensorMode, by class; the step with the highest total."""
    best: dict[str, int] = {}
    with FakeTensorMode():
        torch.manual_seed(0)
        net, loss_fn = build()
        opt = torch.optim.Adam(net.parameters(), lr=1e-3, foreach=foreach)
        for _ in range(steps):
            tracker = MemTracker()
            tracker.track_external(net, opt)
            with tracker:
                loss_fn().backward()
                opt.step()
                opt.zero_grad()
            snap = next(iter(tracker.get_tracker_snapshot("peak").values()))
            named = {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}
            if named["Total"] > best.get("Total", -1):
                best = named
    return best


def harness_builder(spec: ModelSpec, seq_len: int, micro_batch: int):
    """The harness's own GPT/Llama (planner.calibrate.models), fp32, no recompute."""
    from planner.calibrate.models import build_model

    def build():
        net = build_model(spec, seq_len)
        tokens = torch.randint(0, spec.vocab_size, (micro_batch, seq_len))
        return net, lambda: net(tokens, tokens)

    return build


def hf_builder(config: dict, attention: str, seq_len: int, micro_batch: int):
    """A transformers causal LM from `config` (planner.calibrate.hf_models), fp32, its own loss
    (`labels=` -> transformers' ForCausalLMLoss, the unfused cross entropy)."""
    from planner.calibrate import hf_models

    def build():
        net = hf_models.build_model(config, attention, "fp32", device="cpu")
        ids = torch.randint(0, int(config["vocab_size"]), (micro_batch, seq_len))
        return net, lambda: net(input_ids=ids, labels=ids).loss

    return build


def fp32_adam_prediction(net: torch.nn.Module, saved_bytes: int, tokens: int, vocab: int,
                         optimizer: str) -> dict[str, int]:
    """step_peak_bytes for fp32 training with torch Adam on one device. `net` gives the tensor
    sizes only (build it on the meta device): resident = parameters + two fp32 moments + one fp32
    step counter per parameter tensor (torch Adam's `state["step"]`, a 0-d fp32 tensor when not
    capturable) + buffers + the int64 batch; `saved_bytes` the planner's saved activations."""
    numels = [p.numel() for p in net.parameters()]
    params = sum(numels)
    buffers = sum(b.numel() * b.element_size() for b in net.buffers())
    resident = 3 * params * FP32_BYTES + len(numels) * FP32_BYTES + buffers + tokens * TOKEN_ID_BYTES
    return step_peak_bytes(resident, saved_bytes, params * FP32_BYTES, tokens=tokens, vocab_per_gpu=vocab,
                           logits_element_bytes=FP32_BYTES, loss="unfused", optimizer=optimizer,
                           optimizer_state_elements=params, largest_param_elements=max(numels))


def harness_saved_bytes(spec: ModelSpec, seq_len: int, micro_batch: int) -> int:
    """The planner's saved activations of the harness model in fp32 (activations.py: every block,
    embedding and output extras; the int64 token ids are the batch, counted as resident) + the
    fp32 loss scalar."""
    layout = Layout(micro_batch=micro_batch, flash_attention=False)
    e, tokens = FP32_BYTES, seq_len * micro_batch
    return (acts.layers_kept_bytes(spec, layout, seq_len, micro_batch, e, spec.num_layers)
            + sum(acts.first_stage_extra_bytes(spec, layout, seq_len, micro_batch, e).values())
            + sum(acts.last_stage_extra_bytes(spec, layout, seq_len, micro_batch, e).values())
            - tokens * TOKEN_ID_BYTES + FP32_BYTES)


def hf_saved_bytes(config: dict, attention: str, seq_len: int, micro_batch: int) -> int:
    """The implementation inventory's saved activations of the transformers model in fp32
    (planner.memory.implementations: every block and the extras outside them)."""
    from planner.calibrate.hf_run import implementation_for
    from planner.io.hf_config import model_from_hf_dict
    from planner.memory import implementations as impls

    spec = model_from_hf_dict(config, name=str(config.get("model_type")))
    impl = implementation_for(config, attention, "fp32", "cpu")
    return (spec.num_layers * sum(impls.block_saved_bytes(spec, impl, seq_len, micro_batch).values())
            + sum(impls.hf_outside_saved_bytes(spec, impl, seq_len, micro_batch).values()))
