"""What torch's FSDP2 (`fully_shard`) keeps on one GPU (issue 11, item 2).

From torch 2.13's torch/distributed/fsdp/_fully_shard/ (one FSDP group per `fully_shard` call:
every transformer block, then the root holding what is left: embedding, final norm, head):
- **sharded parameters** (`_fsdp_param.py` `FSDPParam._init_sharded_param`): each parameter is a
  DTensor holding dim-0 chunk `ceil(d0 / world)` of it in the original dtype (fp32 under a
  `MixedPrecisionPolicy`); with every d0 divisible by the world size, ceil(P / world) elements
  (the padding of indivisible tensors is not counted: an approximation, below one row per tensor);
- **unsharded parameters while in use** (`FSDPParamGroup.unshard` / `reshard`): a group's
  parameters all-gathered in `param_dtype`. `reshard_after_forward=True` frees them after the
  group's forward and gathers them again in backward; the root's are never resharded after
  forward (`_fsdp_state.py` `_lazy_init`: the root's `post_forward_mesh_info` is None);
  `False` keeps every group's unsharded parameters from its forward to its backward;
- **all-gather output** (`_fsdp_collectives.py` `foreach_all_gather`): the next group's
  all-gather buffer in `param_dtype`, issued while the current group computes (implicit
  prefetch in backward, `FSDPParamGroup._prefetch_unshard`), freed after the copy-out;
- **reduce-scatter input** (`foreach_reduce`): one group's unsharded gradients in
  `reduce_dtype` (the flat input of `reduce_scatter_tensor`), while the group's unsharded
  parameters are already freed; the output accumulates into the sharded fp32 gradient.
At the backward's peak (measured: `planner.calibrate.fsdp2_check`, torch's FSDPMemTracker) a GPU
holds the sharded parameters, the root's unsharded parameters, the reduce-scatter input of the
group just finished and, with resharding, one group unsharded plus the next group's all-gather
output; without resharding, every other group unsharded. The optimizer step holds the sharded
parameters, every sharded gradient (fp32), the Adam states and torch AdamW's `foreach`
temporary (one state-sized copy, planner.memory.peak).
All sizes in bytes; pure functions on Python ints.
"""

from __future__ import annotations

import numpy as np

from planner.core.spec import ceil_div

FP32_BYTES = 4


def unsharded_parts(root_params, block_params, layers, reshard_after_forward, *, param_bytes: int,
                    reduce_bytes: int = FP32_BYTES) -> dict:
    """The buffers beyond the shards at the backward's peak (module docstring): the root's
    unsharded parameters, `block_params` of one block group unsharded (every other one without
    resharding), the next group's all-gather output (with resharding) and one group's
    reduce-scatter input. Ints or numpy arrays (the plan's rows and the sweep's columns)."""
    in_use = np.where(reshard_after_forward, 1, np.maximum(layers - 1, 0))
    return {
        "fsdp2_root_unsharded_params": root_params * param_bytes,
        "fsdp2_block_unsharded_params": in_use * block_params * param_bytes,
        "fsdp2_all_gather_output": np.where(reshard_after_forward, block_params * param_bytes, 0),
        "fsdp2_reduce_scatter_input": block_params * reduce_bytes,
    }


def backward_parts(root_params: int, block_params: int, layers: int, world: int, *,
                   param_bytes: int, reduce_bytes: int, reshard_after_forward: bool = True,
                   sharded_bytes: int = FP32_BYTES) -> dict[str, int]:
    """The FSDP2 bytes one GPU holds at the backward's peak (module docstring): `block_params`
    of the largest group (one block), `root_params` of the root group, `layers` block groups,
    `param_bytes` / `reduce_bytes` of the MixedPrecisionPolicy's param_dtype / reduce_dtype,
    `sharded_bytes` of the original parameters."""
    parts = unsharded_parts(root_params, block_params, layers, reshard_after_forward,
                            param_bytes=param_bytes, reduce_bytes=reduce_bytes)
    total = root_params + layers * block_params
    return {"sharded_params": ceil_div(total, world) * sharded_bytes,
            "root_unsharded_params": int(parts["fsdp2_root_unsharded_params"]),
            "block_unsharded_params": int(parts["fsdp2_block_unsharded_params"]),
            "all_gather_output": int(parts["fsdp2_all_gather_output"]),
            "reduce_scatter_input": int(parts["fsdp2_reduce_scatter_input"])}


def optimizer_step_parts(total_params: int, world: int, *, num_tensors: int,
                         sharded_bytes: int = FP32_BYTES) -> dict[str, int]:
    """The optimizer step's bytes on one GPU under torch AdamW (`foreach`, the CUDA default):
    sharded parameters and fp32 gradients, exp_avg and exp_avg_sq of the shard, the foreach
    temporary of one state (planner.memory.peak) and one fp32 `step` tensor per parameter tensor
    (torch/optim/adam.py `_init_group`: `torch.tensor(0.0, dtype=_get_scalar_dtype())`)."""
    shard = ceil_div(total_params, world)
    return {"sharded_params": shard * sharded_bytes, "sharded_grads": shard * FP32_BYTES,
            "adam_states": 2 * shard * FP32_BYTES + num_tensors * FP32_BYTES,
            "foreach_temporary": shard * FP32_BYTES}
