"""Saved activations of a `torch.compile`d transformers model (issue 11, item 3).

`torch.compile` (Dynamo + AOTAutograd + Inductor, torch 2.13) turns each captured graph into one
autograd Function (`CompiledFunction`, torch/_functorch/_aot_autograd/runtime_wrappers.py) whose
forward saves what the joint graph's partitioner kept for backward
(`ctx.save_for_backward`); the default partitioner for Inductor,
`min_cut_rematerialization_partition` (torch/_functorch/partitioners.py), recomputes cheap
pointwise ops in backward instead of saving them. The per-op `_saved_*` attributes the eager
harness reads (planner.calibrate.hf_models) do not exist inside it, so the saves are read from
the graph's nodes: `node.saved_tensors` of every `CompiledFunctionBackward` (and the `_saved_*` of
any eager node around a graph break), deduplicated by storage, parameters and buffers excluded
— the same accounting as `hf_models.measure` (saved-tensor hooks), which this walk reproduces on
an eager Llama / Qwen2 to the byte (tests/test_compiled.py; GPT-2: 48 B more, a few scalars the
hooks do not see).
"""

from __future__ import annotations

import torch
from torch import nn

from planner.calibrate.sdpa_backend import graph_nodes


def _node_tensors(node) -> list[torch.Tensor]:
    """Tensors an autograd node keeps: `saved_tensors` of a Python Function's node (a compiled
    graph), `_saved_*` attributes of a built-in node."""
    out: list[torch.Tensor] = []
    if hasattr(node, "saved_tensors"):
        out += [t for t in node.saved_tensors if isinstance(t, torch.Tensor)]
    for attr in dir(node):
        if not attr.startswith("_saved_"):
            continue
        try:
            value = getattr(node, attr)
        except RuntimeError:  # already freed
            continue
        out += [t for t in (value if isinstance(value, (tuple, list)) else (value,))
                if isinstance(t, torch.Tensor)]
    return out


def saved_bytes_by_node(loss: torch.Tensor, excluded: set[int]) -> dict[str, int]:
    """{autograd node name: bytes of the storages it is the first to keep} over `loss`'s graph."""
    seen: set[int] = set(excluded)
    out: dict[str, int] = {}
    for node in graph_nodes(loss):
        for t in _node_tensors(node):
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in seen or not storage.nbytes():
                continue
            seen.add(key)
            out[node.name()] = out.get(node.name(), 0) + storage.nbytes()
    return out


def measure_saved(model: nn.Module, seq_len: int, micro_batch: int, precision: str = "fp32",
                  seed: int = 0) -> dict[str, int]:
    """One forward + loss of `model` (compiled or not) on random ids: {node: saved bytes}.
    `precision` autocast-bf16 / autocast-fp16 runs the forward under torch.autocast (CPU)."""
    excluded = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (micro_batch, seq_len), generator=torch.Generator().manual_seed(seed))
    context = (torch.autocast("cpu", dtype=torch.bfloat16 if precision == "autocast-bf16" else torch.float16)
               if precision.startswith("autocast") else torch.autocast("cpu", enabled=False))
    with context:
        loss = model(input_ids=ids, labels=ids).loss
    return saved_bytes_by_node(loss, excluded)


def compiled_saved(model: nn.Module, seq_len: int, micro_batch: int, precision: str = "fp32") -> dict[str, int]:
    """`measure_saved` of `torch.compile(model)` (Inductor, the default backend; on CPU it needs a
    C++ compiler). Compilation takes tens of seconds per model."""
    torch._dynamo.reset()
    return measure_saved(torch.compile(model), seq_len, micro_batch, precision)
