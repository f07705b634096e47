"""Time: how long a training step and a whole run take.

- `steptime`: compute, communication, pipeline bubble and offload terms of one optimizer step.
- `bandwidth`: arithmetic intensity and offload efficiency (ZeRO-Infinity's bandwidth analysis).
- `budget`: compute budgets, compute-optimal model/data size, predicted loss, days of training.
- `collectives`: bytes per GPU and α–β time of each collective per network level (NCCL ring/tree).
- `sharded_dp`: what DeepSpeed ZeRO-3 and FSDP2 overlap in a step; exposed vs total DP time.
- `gemm`: GEMM efficiency by shape (measured points, roofline) and a block's GEMM shapes.
"""
