"""What an engine's config file says about a job, in planner terms (shared by the readers)."""

from __future__ import annotations

from planner.core.spec import Frozen, Layout, ModelSpec


class EngineJob(Frozen):
    """A layout and setup parts read from a DeepSpeed or Megatron-LM config."""

    layout: Layout
    """tp, pp, dp, ZeRO stage, offload, recompute, micro-batch and gradient accumulation."""
    global_batch: int
    """Sequences per optimizer step (micro x grad_accum x dp, checked)."""
    precision: str
    """Name of the precision recipe (planner.recipes) the file's dtype settings select."""
    optimizer: str | None = None
    """Optimizer name when the file names one (Megatron `--optimizer`), else None."""
    model: ModelSpec | None = None
    """The model, when the file carries its dimensions (Megatron flags); else None."""
    seq_len: int | None = None
    """Sequence length, when the file gives it (`--seq-length`)."""
    train_tokens: float | None = None
    """Tokens of the run, when the file gives it (`--train-samples` x seq or iters x batch x seq)."""
    notes: tuple[str, ...] = ()
    """Assumptions made while reading (values taken from the command line, ignored keys)."""
