"""The loss at the vocabulary: memory-bound passes over the [T, V/tp] logits (issue 10).

The logits GEMM is counted with the block's matmuls (planner.core.flops); what it leaves is a
chain of element-wise kernels over T·V/tp elements per micro-batch, each of which reads its
inputs and writes its output once (the convention of `steptime.elementwise_layer_bytes`):

forward
- the cast of the e-byte logits to fp32 (f = 4 bytes): read e, write f. torchtitan
  `torchtitan/components/loss.py` `cross_entropy_loss` (commit b5bcd76c): `F.cross_entropy(
  pred.float(), ...)`; under autocast (Composer / llm-foundry amp_bf16) the same cast happens
  because `log_softmax` autocasts to float32 (torch 2.13.0
  `torch/testing/_internal/autocast_test_lists.py`, list `torch_fp32`);
- `log_softmax`: read f, write f (`F.cross_entropy` = log_softmax + nll_loss; nll_loss reads one
  element per row: neglected);
backward
- `nll_loss_backward`: the gradient is a zero-filled [T, V] tensor with one element per row set
  (torch 2.13.0 `torch/_decomp/decompositions.py` `_nll_loss_backward`: `torch.zeros_like`,
  `scatter`): write f;
- `_log_softmax_backward_data`: grad_output - exp(output)·sum(grad_output) (same file): read f
  (gradient) + f (output), write f;
- the cast back to the logits' dtype: read f, write e.
Total 2(e + f) + 2f + f + 3f = 2e + 8f bytes per logit element: 36 for bf16 logits;
fp32 logits skip both casts: 6f = 24.
Named approximations: a row of 50k-128k fp32 logits (200-500 KB) is reduced in several passes
by torch's softmax kernel; the repeated reads are taken to hit L2, so HBM sees each tensor once.
Megatron's vocab-parallel cross entropy makes more passes (a lower bound there).
"""

from __future__ import annotations

import numpy as np

LOSS_DTYPE_BYTES = 4
"""fp32: the loss runs in float32 (see the module docstring)."""


def loss_bytes_per_logit(logit_bytes: int = 2) -> tuple[int, int]:
    """(forward, forward + backward) HBM bytes per logit element: e + 3f and 2e + 8f; fp32
    logits need no casts (`.float()` of a float32 tensor returns it): 2f and 6f."""
    f = LOSS_DTYPE_BYTES
    cast = logit_bytes + f if logit_bytes != f else 0  # each way
    forward = cast + 2 * f  # cast, log_softmax
    return forward, forward + f + 3 * f + cast  # nll_loss_backward, log_softmax backward, cast


def loss_kernel_bytes(tokens, vocab_size, tp, logit_bytes: int = 2):
    """(forward, forward + backward) bytes the loss kernels move per micro-batch on one GPU: T
    tokens x V/tp logits (the vocabulary split over the tp ranks) x `loss_bytes_per_logit`.
    Arrays broadcast."""
    logits = np.asarray(tokens, dtype=float) * vocab_size / np.asarray(tp, dtype=float)
    forward, total = loss_bytes_per_logit(logit_bytes)
    return logits * forward, logits * total
