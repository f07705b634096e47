"""`zplan calibrate`: real PyTorch training steps measured against the planner.

The only package that imports torch. Importing `planner.calibrate` itself does not import torch,
so `torch_available()` can be asked first; the sub-modules (models, measure, train, run,
distributed) import torch at the top.

`zplan calibrate hardware`: hardware.py (GEMM / kernel / Adam / copy / file micro-benchmarks),
collectives.py (torch.distributed timings, spawn or torchrun), hardware_run.py (one run of all
parts), predict.py (a step predicted from the parts), steps.py (the same step measured),
heldout.py (the configurations predicted), procedure.py (pinning and the robust statistic shared
by parts and steps), fsdp2_overhead.py (FSDP2's copies and hooks), dispatch.py (per-op Python +
autograd overhead), attribution.py (per op class: predicted / alone / in the real step); with
their torch imports inside functions: shape_gemms.py (GEMMs at a step's shapes and layouts),
fsdp2_collectives.py (FSDP2's per-group cost as it calls its collectives: a width curve, and
groups of given parameter shapes), reuse.py (memory-bound ops timed after D bytes of traffic;
reuse distances from the recorded op order), page_faults.py
(the cost of a page fault; a step's allocation trace replayed through the host's allocator). Torch-free: fits.py (α–β fit and log-log interpolation; the bus
factors, table look-ups), parts.py (what was measured), profile_file.py (profile YAML, merge,
lock, atomic write).
"""

from __future__ import annotations

import importlib.util
import sys

INSTALL_HINT = (
    "zplan calibrate needs PyTorch: pip install torch==2.13.0 && pip install 'zplan[calibrate]'"
)


def torch_available() -> bool:
    """True when `import torch` can succeed (a `sys.modules['torch'] = None` block counts as absent)."""
    if "torch" in sys.modules:
        return sys.modules["torch"] is not None
    return importlib.util.find_spec("torch") is not None
