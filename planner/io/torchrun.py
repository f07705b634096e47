"""The torchrun launch line for a layout (flags as torch/distributed/run.py spells them)."""

from __future__ import annotations

import shlex

from planner.core.errors import PlanInputError
from planner.core.spec import Cluster, Layout


def nodes_and_procs(cluster: Cluster, layout: Layout) -> tuple[int, int]:
    """(--nnodes, --nproc-per-node): whole nodes above one node, one process per GPU."""
    gpus, per_node = layout.num_gpus, cluster.node.gpus_per_node
    if gpus <= per_node:
        return 1, gpus
    if gpus % per_node:
        raise PlanInputError(
            "layout", f"tp*pp*dp{'*cp' if layout.cp > 1 else ''} = {gpus} GPUs is not a whole number of {per_node}-GPU nodes"
        )
    return gpus // per_node, per_node


def torchrun_command(cluster: Cluster, layout: Layout, script: str = "train.py",
                     script_args: tuple[str, ...] = ()) -> str:
    """`torchrun --nnodes N --nproc-per-node G [rendezvous] SCRIPT ARGS` (run on every node)."""
    nnodes, nproc = nodes_and_procs(cluster, layout)
    parts = ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc)]
    if nnodes > 1:  # c10d rendezvous on the first node; MASTER_ADDR is set by the scheduler
        parts += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "$MASTER_ADDR:29500", "--rdzv-id", "zplan"]
    quoted = [p if p.startswith("$") else shlex.quote(p) for p in parts]
    return " ".join(quoted + [shlex.quote(script)] + [shlex.quote(a) for a in script_args])
