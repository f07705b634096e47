"""Where the output layer sits in a pipeline, and which stage sets the step (issue 10).

Megatron-Core builds the output layer (the [h, V/tp] logits GEMM) and the loss only on the last
pipeline stage (in its last model chunk under interleaving) and the word embedding only on the
first: NVIDIA/Megatron-LM commit d98e8a64, megatron/training/training.py `build_model`
(`post_process = is_pp_last_stage and is_vp_last_stage`, `pre_process = is_pp_first_stage and
is_vp_first_stage`) and megatron/core/models/gpt/gpt_model.py (`self.output_layer` built only
`if self.post_process`). So the last stage does its blocks' work plus the head's, and in the
1F1B steady state the slowest stage sets the pace: the step is m times the slowest stage's
per-micro-batch time plus the fill and drain through the others (Narayanan et al. 2021 §2.2).

The head is measured in "layer equivalents": lambda = (the head's time per micro-batch) / (one
block's time per micro-batch), both on one GPU of a stage (matmuls at the row's efficiency,
element-wise kernels at HBM bandwidth: `steptime.step_columns`). The slowest stage is the last
(its blocks + lambda) or the largest stage without the head, whichever is longer.

Megatron's `--account-for-embedding-in-pipeline-split` / `--account-for-loss-in-pipeline-split`
count the embedding (loss) as one layer of the first (last) chunk: the first (last) pipeline
stage builds one block fewer (transformer_block.py `get_num_layers_to_build`, same commit):
`accounted_stage_layers`.

Named approximations: the word-embedding lookup (a gather, no matmul) is not counted on the
first stage; the head's tensor-parallel collectives (the sequence-parallel all-gather before
the logits GEMM, the vocab-parallel cross entropy's three small all-reduces) are not counted;
the TP and context-parallel communication of the slowest stage is taken at the largest stage's
layer count.
"""

from __future__ import annotations

import numpy as np


def last_stage_layers(num_layers: int, pp, first=0, last=0):
    """Blocks of the last pipeline stage (params.layers_per_stage's split): `last` when given
    (Megatron `--decoder-last-pipeline-num-layers`); with only `first` given the middle stages'
    (num_layers - first) / (pp - 1); else the even split, whose extra layers go to the last
    stages: ceil(num_layers / pp). 0 = not given. Arrays broadcast."""
    pp, first, last = (np.asarray(x) for x in (pp, first, last))
    middle = (num_layers - first) // np.maximum(pp - 1, 1)
    even = -(-num_layers // pp)
    return np.where(last > 0, last, np.where(first > 0, middle, even))


def head_layer_equivalents(head_s, layer_s):
    """lambda: the head's time (logits GEMM forward + backward, loss kernels) per micro-batch in
    units of one block's time per micro-batch (forward + backward + recompute + element-wise)."""
    return np.asarray(head_s, dtype=float) / np.asarray(layer_s, dtype=float)


def slowest_stage(largest_layers, last_layers, head_units):
    """(blocks of the slowest stage, 1.0 if it is the last stage carrying the head else 0.0):
    the last stage when its blocks + the head take at least the largest stage's blocks."""
    on_last = np.asarray(last_layers) + head_units >= np.asarray(largest_layers)
    return np.where(on_last, last_layers, largest_layers), on_last.astype(float)


def fill_units(num_layers: int, head_units, blocks, on_last):
    """The pipeline fill and drain in units of the slowest stage's time: the work of every other
    stage, (L + lambda - slowest) / slowest with slowest = its blocks + lambda if it holds the
    head (`steptime.bubble_time_s`'s `fill_stages`; (pp - 1) for even stages without a head)."""
    slowest = np.asarray(blocks) + np.asarray(on_last) * head_units
    return (num_layers + head_units - slowest) / slowest


def accounted_stage_layers(num_layers: int, pp: int, embedding: bool, loss: bool
                           ) -> tuple[int | None, int | None]:
    """(first, last) stage blocks under Megatron's account-for-embedding / -loss flags: the
    L (+1 embedding) (+1 loss) layers split evenly over pp stages, then the first (last) stage
    builds one block fewer. (None, None) without either flag. Raises ValueError when the
    accounted layers do not divide by pp (Megatron asserts the same)."""
    if not (embedding or loss):
        return None, None
    total = num_layers + int(embedding) + int(loss)
    if total % pp:
        raise ValueError(f"{total} accounted layers do not divide over pp={pp}")
    per = total // pp
    return (per - 1 if embedding else per), (per - 1 if loss else per)
