"""Which kernel `F.scaled_dot_product_attention` actually ran, read from the autograd graph.

SDPA picks a fused kernel at run time (torch 2.13 aten/src/ATen/native/transformers/
sdp_utils_cpp.cpp and cuda/sdp_utils.cpp): flash needs fp16/bf16 on CUDA, efficient has no
grouped-query support, cuDNN needs a recent GPU; the CPU runs its flash kernel unless dropout is
on; anything refused falls back to the math composite (plain matmul + softmax ops, which keep
what eager attention keeps). Each fused kernel leaves its own backward node in the graph
(tools/autograd/derivatives.yaml): its name says which ran; an SDPA call with no such node ran
math. The inventory of that backend is then the one to compare with
(planner.memory.implementations.Implementation.sdpa_backend).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

BACKWARD_NODES = {
    "ScaledDotProductFlashAttentionBackward0": "flash",
    "ScaledDotProductFlashAttentionForCpuBackward0": "flash",  # the CPU's flash kernel
    "ScaledDotProductEfficientAttentionBackward0": "efficient",
    "ScaledDotProductCudnnAttentionBackward0": "cudnn",
}
FUSED = ("flash", "efficient", "cudnn")


def graph_nodes(loss) -> Iterator:
    """Every node of the autograd graph of `loss`, once each."""
    todo, seen = [loss.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        todo.extend(fn for fn, _ in node.next_functions)


def fused_kernels(loss) -> dict[str, int]:
    """{kernel: calls} of the fused SDPA kernels in the autograd graph of `loss`."""
    return dict(Counter(BACKWARD_NODES[type(n).__name__] for n in graph_nodes(loss)
                        if type(n).__name__ in BACKWARD_NODES))


def backend_name(kernels: dict[str, int], sdpa_calls: int) -> str:
    """One name for what ran: a fused kernel when every call used it, `math` when none did,
    else `mixed (flash 2, math 1)`."""
    fused = sum(kernels.values())
    if fused == 0:
        return "math"
    if len(kernels) == 1 and fused == sdpa_calls:
        return next(iter(kernels))
    parts = [f"{k} {n}" for k, n in sorted(kernels.items())]
    if sdpa_calls > fused:
        parts.append(f"math {sdpa_calls - fused}")
    return f"mixed ({', '.join(parts)})"
