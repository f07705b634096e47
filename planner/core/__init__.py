"""Inputs and model arithmetic: what is trained, on what, laid out how, and what it costs.

- `spec`: the typed inputs (`ModelSpec`, `Cluster`, `Layout`, `TrainSetup`) and unit constants.
- `limits`: the bounds on every size a user gives (ranks, sequences, memory, tokens, rates), one
  place for the input models and the command-line options.
- `columns`: `LayoutColumns`, layouts as a structure of arrays (one layout = one row).
- `rules`: the layout rules, once: a mask for the sweep and a one-line error for fit / check.
- `errors`: `PlanInputError`, the one-line bad-input error (exit 2).
- `recipes`: precision recipes and optimizers (bytes per parameter).
- `params`: exact parameter counts, and each pipeline stage's tensor-parallel shard.
- `flops`: training FLOPs per block, per step, per run; MFU / HFU.
- `kvcache`: key/value cache elements per token per block (standard, MLA, local windows).
"""
