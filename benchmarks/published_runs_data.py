"""Public training runs beyond Narayanan 2021 Table 1 / Korthikanti 2022: layout, throughput,
citation, and the in-sample / out-of-sample split (benchmarks/data/published_runs.yaml).

    python benchmarks/published_runs_data.py      # list the rows by split

The split rule is written at the top of the YAML and in docs/accuracy.md (by paper, fixed
2026-11-23 before any model error on these rows was computed). This module only loads and
validates; it computes no model error.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, model_validator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.core.spec import Frozen  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "published_runs.yaml"


class RunModel(Frozen):
    """The model dimensions a run states."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int | None = None
    ffn_hidden_size: int | None = None
    """None: 4 x hidden_size (GPT)."""
    vocab_size: int
    seq_len: int
    tied_embeddings: bool | None = None
    """None: the evaluator's default for the block (GPT tied, Llama untied)."""
    mlp: Literal["gelu", "swiglu"] | None = None
    """gelu: the non-gated two-matrix MLP (GELU, squared ReLU: the same GEMMs); swiglu: gated.
    None: the evaluator's default (gated for rows with GQA heads, else non-gated)."""


class PublicRun(Frozen):
    """One published run: layout, measured throughput, citation, split."""

    name: str
    split: Literal["in_sample", "out_of_sample", "out_of_sample_2", "out_of_sample_3",
                   "out_of_sample_4", "out_of_sample_5", "out_of_sample_6",
                   "out_of_sample_7"]
    """out_of_sample_2: sources added in session 10 (the YAML's NEW SPLIT RULE);
    out_of_sample_3: session 11 (THIRD SPLIT RULE); out_of_sample_4: session 11, the MosaicML
    llm-foundry FSDP tables (FOURTH SPLIT RULE); out_of_sample_5: session 12, NVIDIA
    dgxc-benchmarking v25.01 BF16 H100 tables (FIFTH SPLIT RULE); out_of_sample_6: session 12,
    the fms-fsdp FSDP table (SIXTH SPLIT RULE, above its block at the end of the runs list);
    out_of_sample_7: session 12, the later dgxc-benchmarking releases' BF16 GB200 and
    current-software H100 tables (SEVENTH SPLIT RULE, above its block at the end)."""
    category: Literal["dense", "moe"] = "dense"
    """`moe`: a mixture-of-experts run (an evaluator without expert parallelism skips it)."""
    paper: str
    gpu: str
    num_gpus: int
    cluster: str | None = None
    """A cluster profile (hardware_profiles/clusters/) whose node and network the run used,
    taken with as many nodes as num_gpus needs; None: the GPU's default node
    (planner.io.loading.cluster_for_gpus)."""
    model: RunModel | None
    """None when the dimensions were not transcribed from the source."""
    tp: int
    cp: int = 1
    pp: int
    virtual_stages: int = 1
    """Interleaved pipeline chunks per stage (Megatron --num-virtual-stages-per-pipeline-rank,
    NeMo virtual_pipeline_model_parallel_size) where the source states it; 1 otherwise."""
    dp: int
    ep: int = 1
    """Expert-parallel degree; the experts are split over `ep` ranks inside the `dp` ranks."""
    global_batch: int | None
    micro_batch: int | None
    recompute: Literal["none", "selective", "full", "block", "unknown"]
    recompute_num_layers: int | None = Field(default=None, gt=0)
    """For recompute `block` (`Layout.recompute_num_layers`): the blocks of each pipeline chunk
    recomputed (Megatron --recompute-num-layers with --recompute-method block; fms-fsdp /
    torchtitan every k-th of L blocks: floor(L / k))."""
    megatron_overlap: tuple[Literal["tp_comm", "grad_reduce", "param_gather"], ...] | None = None
    """Megatron-Core overlaps the source states (--tp-comm-overlap, --overlap-grad-reduce,
    --overlap-param-gather); None: the row is not evaluated as a Megatron-Core run."""
    pipeline_split_accounting: tuple[Literal["embedding", "loss"], ...] = ()
    """Megatron-Core's --account-for-embedding-in-pipeline-split / --account-for-loss-in-
    pipeline-split as the row states or assumes: the embedding (loss) counts as one layer of
    the first (last) pipeline chunk when the layers are divided."""
    sequence_parallel: bool | None = None
    """Megatron sequence parallelism as the row states or assumes; None: on for Megatron-Core
    rows with tp > 1 (benchmarks/published_runs.py data_row_error)."""
    flash_attention: bool | None = None
    """The row's attention kernel is fused (flash); None: fused for rows with GQA heads or a
    megatron-core engine (benchmarks/published_runs.py data_row_build)."""
    engine: str
    tflops_per_gpu: float | None = None
    """The published TFLOP/s per GPU; None when the source publishes tokens per second."""
    tokens_per_s_per_gpu: float | None = None
    """The published tokens per second per GPU, where that is the source's metric."""
    flops_formula: Literal["megatron-eq3", "model-flops"] | None = None
    """How tflops_per_gpu counts (benchmarks/published_runs.py); None: as `counting` says."""
    aggregate_pflops: float | None = None
    """The source's aggregate PFLOP/s, where given (a transcription cross-check)."""
    iteration_time_s: float | None = None
    """The published iteration time, where given."""
    mfu: float | None = None
    num_params: int | None = None
    """The parameter count the source states, where given (a transcription cross-check)."""
    cross_check: dict[str, float] | None = None
    """Other columns of the source's row (grad_accum, samples_per_s, tokens_per_s, ...), kept
    only so tests can check the transcription's internal consistency."""
    inter_node_gb_per_s: float | None = Field(default=None, gt=0)
    """The node's inter-node network bandwidth the source states (GB/s per node per direction);
    None: the shipped cluster profile's."""
    dp_shard: int | None = Field(default=None, gt=0)
    """The HSDP shard group size the source's configuration gives (`Layout.dp_shard`); None:
    sharded over the whole data-parallel group."""
    not_modelled: str | None = None
    """Why the planner cannot rebuild this row (fixed with the row, before any error): the row is
    listed but never evaluated."""
    counting: str
    assumed: tuple[str, ...]
    """Fields not stated in the cited source."""
    checked: Literal["stored", "transcribed"]
    """'stored': read in a stored copy of the source this session; 'transcribed': from the paper,
    to be re-checked."""
    source: str

    @model_validator(mode="after")
    def _one_metric(self) -> "PublicRun":
        if (self.tflops_per_gpu is None) == (self.tokens_per_s_per_gpu is None):
            raise ValueError(f"{self.name}: give exactly one of tflops_per_gpu, "
                             "tokens_per_s_per_gpu")
        return self


def load_runs(path: Path = DATA) -> tuple[PublicRun, ...]:
    """All rows of the YAML, validated."""
    data = yaml.safe_load(path.read_text())
    return tuple(PublicRun(**row) for row in data["runs"])


def by_split(runs: tuple[PublicRun, ...], split: str) -> tuple[PublicRun, ...]:
    return tuple(r for r in runs if r.split == split)


def main() -> None:
    runs = load_runs()
    for split in ("in_sample", "out_of_sample", "out_of_sample_2", "out_of_sample_3",
                  "out_of_sample_4", "out_of_sample_5", "out_of_sample_6",
                  "out_of_sample_7"):
        print(f"{split}:")
        for r in by_split(runs, split):
            metric = (f"{r.tflops_per_gpu:>6.1f} TFLOP/s/GPU" if r.tflops_per_gpu is not None
                      else f"{r.tokens_per_s_per_gpu:>6.0f} tokens/s/GPU")
            print(f"  {r.name:<28} {r.gpu:<10} {r.num_gpus:>6} GPUs  tp {r.tp} cp {r.cp} pp {r.pp}"
                  f" dp {r.dp}  {metric}  ({r.checked})")


if __name__ == "__main__":
    main()
