"""Readers and writers for the formats people already have.

- `hf_config`: a Hugging Face `config.json` -> `ModelSpec`.
- `deepspeed`: a DeepSpeed JSON config <-> `Layout` + precision + batch.
- `megatron`: a Megatron-LM launch line / args file <-> `ModelSpec` + `Layout` + setup.
- `fsdp`: an accelerate FSDP (FSDP2) YAML written from a `Layout`.
- `torchrun`: the `torchrun --nnodes --nproc-per-node` line for a layout.
- `engine`: `EngineJob`, what a DeepSpeed or Megatron-LM file says, shared by their readers.
- `check`: `zplan check`'s inputs validated and planned into a `CheckResult`.
- `loading`: model presets and hardware profiles (YAML) by name or path.
- `jobfile`: the job file of `zplan check JOB.yaml`.
- `calibration`: calibration files written by `zplan calibrate --out`.
- `export`: `zplan export`'s text per format and the search constraints each format allows.
"""
