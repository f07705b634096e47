"""Time: how long a training step and a whole run take.

- `steptime`: compute, communication, pipeline bubble and offload terms of one optimizer step.
- `bandwidth`: arithmetic intensity and offload efficiency (ZeRO-Infinity's bandwidth analysis).
- `budget`: compute budgets, compute-optimal model/data size, predicted loss, days of training.
"""
