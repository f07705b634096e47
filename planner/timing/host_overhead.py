"""Host-side overhead a calibrated node profile measures: per-op dispatch and FSDP2's hooks.

`zplan calibrate hardware` writes two node keys (planner/calibrate/profile_file.py):
- `dispatch_per_op_us`: Python + autograd per aten op of a real forward + backward
  (planner/calibrate/dispatch.py: a tiny GPT-2 step minus the parts' prediction of it, over its
  op count);
- `fsdp2_hook_us`: FSDP2's overhead per hook (planner/calibrate/fsdp2_overhead.py: a tiny
  `fully_shard`-ed model minus the same model unsharded, over its hook count).
The step model (planner/timing/steptime.py, `host_overhead_s` in the step sum) adds

    m x (dispatch_per_op_s x (OPS_PER_LAYER x layers + OPS_OUTSIDE_LAYERS)
         + [FSDP2] fsdp2_hook_s x HOOKS_PER_GROUP x (layers + 1))

per step on the slowest stage's GPU (m micro-batches, `layers` of that stage, one FSDP2 group
per block plus the root). Both keys absent (every shipped profile): 0, figures unchanged.

Named approximations: the op counts are those of the GPT-2 block the calibration runs
(planner/calibrate/models.py), recorded on the meta device with torch 2.13 (the predictor's
`inventory`; tests/test_host_overhead.py records them again): 219 aten ops per block and 63
outside the blocks (embeddings, final norm, head, loss) per micro-batch forward + backward at a
tiny shape (a micro-batch above 1 adds a few reshapes: 506 instead of 501 ops for two blocks at
3 sequences); another implementation's blocks issue a different count. The whole outside count
is charged to every pipeline stage (an upper bound).
"""

from __future__ import annotations

import numpy as np

OPS_PER_LAYER = 219
"""aten ops of one GPT-2 block's forward + backward, one micro-batch (meta-device record, torch 2.13)."""
OPS_OUTSIDE_LAYERS = 63
"""aten ops outside the blocks (embeddings, final norm, head, loss), forward + backward, one micro-batch."""
HOOKS_PER_GROUP = 4
"""FSDP2 pre_forward, post_forward, pre_backward, post_backward per parameter group and
forward + backward (torch 2.13.0 torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py)."""


def host_overhead_s(dispatch_per_op_s: float, fsdp2_hook_s: float, layers, micro_batches, fsdp2):
    """Dispatch of every op and, on FSDP2 rows (`fsdp2` true), its hooks, for one step; 0 when
    both per-unit costs are 0 (arrays or scalars; then the scalar 0.0, whatever the shapes:
    every shipped profile, so the step sum skips the term)."""
    if dispatch_per_op_s == 0 and fsdp2_hook_s == 0:
        return 0.0
    ops = OPS_PER_LAYER * np.asarray(layers) + OPS_OUTSIDE_LAYERS
    hooks = np.where(fsdp2, HOOKS_PER_GROUP * (np.asarray(layers) + 1), 0)
    return micro_batches * (dispatch_per_op_s * ops + fsdp2_hook_s * hooks)
