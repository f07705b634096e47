"""The training configurations `zplan calibrate hardware` and benchmarks/calibrate_hardware.py
predict from the parts and then measure: held apart from the calibration (none of their times is
used to fit anything), two model sizes, other micro-batches, 1 and 2 processes, DDP, ZeRO-1 and
FSDP2. Chosen before any of them was run; GPT-2's architecture scaled down so a CPU step takes
well under a second.
"""

from __future__ import annotations

from planner.calibrate.config import scaled_model
from planner.calibrate.predict import StepConfig
from planner.core.spec import ModelSpec

SMALL = {"layers": 2, "hidden": 256, "heads": 4, "ffn": 1024, "vocab": 2048}
LARGE = {"layers": 4, "hidden": 512, "heads": 8, "ffn": 2048, "vocab": 4096}


def step_configs(base: ModelSpec, nproc: int) -> list[StepConfig]:
    """Four configurations; with nproc = 1 the distributed ones run on one process (no collective)."""
    small = scaled_model(base, **SMALL, kv_heads=None)
    large = scaled_model(base, **LARGE, kv_heads=None)
    two = min(nproc, 2)
    return [
        StepConfig(name="small b4 x1", model=small, seq_len=128, micro_batch=4, strategy="single", nproc=1),
        StepConfig(name=f"large b2 DDP x{two}", model=large, seq_len=128, micro_batch=2, strategy="ddp", nproc=two),
        StepConfig(name=f"large b1 FSDP2 x{two}", model=large, seq_len=128, micro_batch=1, strategy="fsdp2", nproc=two),
        StepConfig(name=f"small b8 ZeRO-1 x{two}", model=small, seq_len=128, micro_batch=8, strategy="zero1", nproc=two),
    ]
