"""Published large-scale training runs rebuilt in zplan: calibration and prediction errors.

    python benchmarks/published_runs.py            # calibrate on the designated row, error table
    python benchmarks/published_runs.py --loo      # also leave-one-out (fit on each row in turn)

Then every row of benchmarks/data/published_runs.yaml is evaluated with the shipped model
(no override: each GPU's profile, matmuls at their shapes, the wired collectives), and the
mean / max |error| is printed per category (Megatron-style tp/pp on A100; ZeRO-3/FSDP; other
GPUs) for the in-sample rows, the rows seen since session 8 (the first out-of-sample split),
the rows seen since session 10 (out_of_sample_2), the session-11 rows (out_of_sample_3 and the
MosaicML FSDP rows out_of_sample_4, both seen since s11), and the session-12 held-out splits:
the NeMo H100 rows (out_of_sample_5) and the fms-fsdp FSDP rows (out_of_sample_6), SEPARATELY
(`category_report`, `split_group_report`, `split_family_report`). Each split is
the data file's, fixed before any error on it was computed; out-of-sample errors are reported,
never fitted.

Protocol (docs/accuracy.md): ONE scalar, the matmul efficiency of the A100 in 16-bit, is fitted
on ONE designated row (CALIBRATION_ROW) so that `steptime.estimate_step` reproduces that row's
published throughput exactly. Every other row is then predicted with that scalar and compared
with its published figure, counted the way the paper counts FLOPs.

Sources:
- Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM" (SC21, arXiv 2104.04473), Table 1: model dims, tp, pp, GPUs, global batch,
  achieved teraFLOP/s per GPU; §5: Selene, DGX A100 nodes of 8 x A100 80 GB on NVLink/NVSwitch,
  8 x 200 Gb/s HDR InfiniBand per node, mixed precision, sequence 2048, vocabulary 51,200;
  §5.1 eq. 3: F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) FLOPs per iteration (counts the
  activation-recompute forward), throughput = F / (iteration time x GPUs).
- NVIDIA/Megatron-LM examples/sc21/run_table_1.sh (the scripts the README says produced
  Table 1): micro-batch size (MBS), DDP implementation, `--recompute-method uniform` (full
  recompute) and `--num-layers-per-virtual-pipeline-stage` (interleaving) per row.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import math  # noqa: E402

from benchmarks.published_runs_data import PublicRun, load_runs  # noqa: E402
from planner.core.errors import PlanInputError  # noqa: E402
from planner.io.loading import cluster_for_gpus, load_cluster  # noqa: E402
from planner.core.recipes import get_optimizer, get_precision  # noqa: E402
from planner.core.spec import Cluster, Frozen, Layout, ModelSpec, TrainSetup  # noqa: E402
from planner.timing import stage_placement  # noqa: E402
from planner.timing.steptime import estimate_step  # noqa: E402

NARAYANAN = "Narayanan et al. 2021 (Megatron-LM, SC21) Table 1"
SC21_SCRIPT = "NVIDIA/Megatron-LM examples/sc21/run_table_1.sh"
A100_16BIT_PEAK_TFLOPS = 312.0  # NVIDIA A100 datasheet; Narayanan et al. §5 uses 312


class PublishedRun(Frozen):
    """One published run with everything zplan needs to rebuild it."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    vocab_size: int
    seq_len: int
    global_batch: int
    micro_batch: int
    tp: int
    pp: int
    virtual_stages: int
    num_gpus: int
    recompute: Literal["none", "selective", "full"]
    sequence_parallel: bool = False
    precision: str
    """zplan precision recipe (planner.recipes)."""
    gpu: str
    published_tflops_per_gpu: float
    published_aggregate_pflops: float | None = None
    """The paper's aggregate PFLOP/s, where given (a transcription cross-check)."""
    flops_counting: Literal["megatron-eq3", "model-flops"]
    """How the paper counts FLOPs: 'megatron-eq3' = Narayanan et al. eq. 3 (with recompute);
    'model-flops' = Korthikanti et al. 2022 §6.3 MFU, 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))."""
    source: str

    @property
    def dp(self) -> int:
        return self.num_gpus // (self.tp * self.pp)

    @property
    def grad_accum(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)


def _table1(name, heads, hidden, layers, tp, pp, gpus, batch, tflops, pflops, mbs,
            v) -> PublishedRun:
    """A Table 1 row: all share s=2048, V=51,200, fp16 mixed precision, full recompute."""
    return PublishedRun(
        name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, vocab_size=51200,
        seq_len=2048, global_batch=batch, micro_batch=mbs, tp=tp, pp=pp, virtual_stages=v,
        num_gpus=gpus, recompute="full", precision="megatron-fp16", gpu="a100-80gb",
        published_tflops_per_gpu=tflops, published_aggregate_pflops=pflops,
        flops_counting="megatron-eq3",
        source=f"{NARAYANAN} row {name}; MBS, recompute, interleaving from {SC21_SCRIPT}",
    )


# name, heads, hidden, layers, tp, pp, GPUs, global batch, TFLOP/s per GPU, aggregate PFLOP/s
# (Table 1);
# micro-batch and virtual stages v = (layers / pp) / num-layers-per-virtual-pipeline-stage
# from run_table_1.sh (76B: 15/5 = 3, 145B: 10/5 = 2, 310B: 6/3 = 2, 530B: 3/1 = 3).
NARAYANAN_2021_TABLE1: tuple[PublishedRun, ...] = (
    _table1("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, 4.4, mbs=16, v=1),
    _table1("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138, 8.8, mbs=16, v=1),
    _table1("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142, 18.2, mbs=16, v=1),
    _table1("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135, 34.6, mbs=8, v=1),
    _table1("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138, 70.8, mbs=4, v=1),
    _table1("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140, 143.8, mbs=2, v=3),
    _table1("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148, 227.1, mbs=2, v=2),
    _table1("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155, 297.4, mbs=1, v=2),
    _table1("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163, 410.2, mbs=1, v=3),
    _table1("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163, 502.0, mbs=1, v=1),
)

KORTHIKANTI = "Korthikanti et al. 2022 (arXiv 2205.05198)"
MEGATRON_README = ("NVIDIA/Megatron-LM README MFU/HFU table ('measured using a data parallel "
                   "size of one')")


def _korthikanti(name, heads, hidden, layers, pp, gpus, batch, mfu_pct) -> PublishedRun:
    """Selective recompute + sequence parallel, tp 8, micro-batch 1, dp 1 (Korthikanti Table 3
    as read by this project; not re-checked against a stored copy: see docs/accuracy.md).
    Published: the README's MFU, x 312 TFLOP/s = model TFLOP/s per GPU. Interleaving is not
    stated in what we could check: v = 1 is an assumption."""
    return PublishedRun(
        name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, vocab_size=51200,
        seq_len=2048, global_batch=batch, micro_batch=1, tp=8, pp=pp, virtual_stages=1,
        num_gpus=gpus, recompute="selective", sequence_parallel=True,
        precision="megatron-bf16", gpu="a100-80gb",
        published_tflops_per_gpu=round(mfu_pct / 100 * A100_16BIT_PEAK_TFLOPS, 3),
        flops_counting="model-flops",
        source=f"{MEGATRON_README} row {name} MFU {mfu_pct}%; layout from {KORTHIKANTI} Table 3",
    )


# name, heads, hidden, layers, pp, GPUs (= tp 8 x pp), global batch, MFU % (README)
KORTHIKANTI_2022: tuple[PublishedRun, ...] = (
    _korthikanti("22B", 64, 6144, 48, 1, 8, 4, 41.5),
    _korthikanti("175B", 96, 12288, 96, 8, 64, 64, 51.4),
    _korthikanti("530B", 128, 20480, 105, 35, 280, 280, 56.0),
    _korthikanti("1T", 160, 25600, 128, 64, 512, 512, 56.3),
)

CALIBRATION_ROW = "145.6B"
"""The designated calibration row: the middle of the table (GPT-3 scale, 1536 GPUs)."""


def megatron_eq3_flops(batch: int, seq_len: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021 eq. 3: F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per iteration
    (forward + backward + the recompute forward)."""
    return 96 * batch * seq_len * layers * hidden**2 * (
        1 + seq_len / (6 * hidden) + vocab / (16 * layers * hidden))


def model_flops_korthikanti(batch: int, seq_len: int, layers: int, hidden: int,
                            vocab: int) -> float:
    """Korthikanti et al. 2022 §6.3 model FLOPs (no recompute):
    72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))."""
    return 72 * batch * seq_len * layers * hidden**2 * (
        1 + seq_len / (6 * hidden) + vocab / (12 * layers * hidden))


def counted_flops(run: PublishedRun) -> float:
    """The FLOPs of one iteration the way the run's paper counts them."""
    formula = megatron_eq3_flops if run.flops_counting == "megatron-eq3" \
        else model_flops_korthikanti
    return formula(run.global_batch, run.seq_len, run.num_layers, run.hidden_size,
                   run.vocab_size)


def build(run: PublishedRun) -> tuple[ModelSpec, Cluster, Layout, TrainSetup]:
    """The zplan inputs of a run: a GPT with f = 4h, learned positions, tied embeddings."""
    model = ModelSpec(
        name=run.name, num_layers=run.num_layers, hidden_size=run.hidden_size,
        num_heads=run.num_heads, ffn_hidden_size=4 * run.hidden_size,
        vocab_size=run.vocab_size, max_seq_len=run.seq_len, source=run.source)
    cluster = cluster_for_gpus(run.gpu, run.num_gpus)
    layout = Layout(tp=run.tp, pp=run.pp, dp=run.dp, virtual_stages=run.virtual_stages,
                    recompute=run.recompute, sequence_parallel=run.sequence_parallel,
                    micro_batch=run.micro_batch, grad_accum=run.grad_accum,
                    flash_attention=False)  # 2021-22 Megatron runs: unfused attention (s x s)
    setup = TrainSetup(seq_len=run.seq_len, global_batch=run.global_batch, train_tokens=300e9,
                       precision=get_precision(run.precision), optimizer=get_optimizer("adam"))
    return model, cluster, layout, setup


def predicted_tflops_per_gpu(run: PublishedRun, efficiency: float | None = None) -> float:
    """zplan's step time turned into the paper's metric: counted FLOPs / (step x GPUs)."""
    model, cluster, layout, setup = build(run)
    step_s = estimate_step(model, cluster, layout, setup, efficiency).step_s
    return counted_flops(run) / (step_s * run.num_gpus) / 1e12


def fit_efficiency(run: PublishedRun, lo: float = 0.05, hi: float = 1.0) -> float:
    """The matmul efficiency at which zplan reproduces the run's published throughput
    (bisection: the prediction rises monotonically with the efficiency)."""
    target = run.published_tflops_per_gpu
    if predicted_tflops_per_gpu(run, hi) < target:
        raise ValueError(f"{run.name}: even efficiency {hi} predicts less than {target}")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted_tflops_per_gpu(run, mid) < target else (lo, mid)
    return (lo + hi) / 2


def error_pct(run: PublishedRun, efficiency: float | None = None) -> float:
    """(predicted - published) / published, in percent."""
    pub = run.published_tflops_per_gpu
    return 100 * (predicted_tflops_per_gpu(run, efficiency) / pub - 1)


def calibration_row(runs=NARAYANAN_2021_TABLE1, name: str = CALIBRATION_ROW) -> PublishedRun:
    return next(r for r in runs if r.name == name)


def _table(runs, efficiency: float, calibrated: str) -> list[str]:
    lines = [f"{'row':>9} {'GPUs':>5} {'tp':>2} {'pp':>3} {'v':>1} {'b':>2} {'m':>4} "
             f"{'published':>9} {'predicted':>9} {'error':>7}"]
    for r in runs:
        pred = predicted_tflops_per_gpu(r, efficiency)
        mark = "  (calibration row)" if r.name == calibrated else ""
        lines.append(f"{r.name:>9} {r.num_gpus:>5} {r.tp:>2} {r.pp:>3} {r.virtual_stages:>1} "
                     f"{r.micro_batch:>2} {r.grad_accum:>4} {r.published_tflops_per_gpu:>9.1f} "
                     f"{pred:>9.1f} {error_pct(r, efficiency):>+6.1f}%{mark}")
    return lines


# --------------------------------------------------------------------------- data-file rows

CATEGORIES = ("megatron-a100", "megatron-h100", "zero3-fsdp", "other-gpu", "moe")
"""Megatron-style tp/pp runs on A100; Megatron-style runs on H100 (engine megatron-*, added
with out_of_sample_2 before its errors were computed); sharded data parallel (ZeRO-3 / FSDP)
runs; runs on any other GPU or engine; mixture-of-experts runs (`category: moe`, evaluated with
their ep). A row belongs to the first that applies in the order moe, zero3-fsdp, megatron-a100,
megatron-h100, other-gpu."""


def data_zero_stage(run: PublicRun) -> int:
    """The engine's ZeRO stage as the row's `engine` names it (FSDP full sharding = 3; an FSDP
    that keeps parameters gathered from forward to backward, metaseq's
    `--no-reshard-after-forward`, is named zero2: FSDP2's reshard_after_forward=False)."""
    engine = run.engine
    if "zero2" in engine:
        return 2
    if "zero3" in engine or "fsdp" in engine:
        return 3
    return 1 if "zero1" in engine else 0


def data_dp_engine(run: PublicRun) -> str:
    """The sharded-DP schedule a row is evaluated with: every FSDP flavour (FSDP2, PyTorch FSDP1
    as in Composer, FairScale FSDP as in metaseq) with the FSDP schedule (`sharded_dp.fsdp2_step`:
    one unit prefetched ahead), DeepSpeed rows with DeepSpeed's. FSDP1's one-ahead prefetch:
    torch 2.13 torch/distributed/fsdp/_runtime_utils.py `_pre_forward_unshard` (the unit's
    all-gather on the unshard stream, the CPU running ahead rate-limited by `limit_all_gathers`'
    `_free_event_queue` to two gathers in flight) and `_prefetch_handle` (BACKWARD_PRE prefetch
    of the next unit in backward). Named approximation: FSDP1 all-gathers straight into its flat
    parameter (no copy-out) but divides and casts the unsharded gradient in place; it is given
    FSDP2's copy traffic (`sharded_dp.fsdp2_copy_bytes`), of the same order."""
    return "fsdp2" if "fsdp" in run.engine and "deepspeed" not in run.engine else "deepspeed"


def data_category(run: PublicRun) -> str:
    if run.category == "moe":
        return "moe"
    if run.dp_shard is not None and run.dp_shard < run.dp:
        return "hsdp"  # reported apart: evaluated once, after HSDP was built (session 12, h10)
    if run.recompute == "block":  # reported apart: evaluated once, after partial recompute
        return "block-ac"  # (`recompute: block`) was built (session 13, t10e)
    if data_zero_stage(run) == 3 or "fsdp" in run.engine:
        return "zero3-fsdp"
    if run.gpu.startswith("a100"):
        return "megatron-a100"
    return "megatron-h100" if run.gpu.startswith("h100") and run.engine.startswith("megatron") \
        else "other-gpu"


def _data_model(run: PublicRun) -> ModelSpec:
    """GPT (f = 4h, learned positions, tied embeddings) unless the row gives GQA heads and an
    ffn width: then a Llama block (SwiGLU, RMSNorm, rotary, untied, no biases)."""
    m = run.model
    llama = m.num_kv_heads is not None
    extra = dict(mlp="swiglu", norm="rmsnorm", position="rotary", tied_embeddings=False,
                 linear_bias=False, dropout=False) if llama else {}
    if m.tied_embeddings is not None:  # the row states (or derives) it
        extra["tied_embeddings"] = m.tied_embeddings
    if m.mlp is not None:  # the row states it (Nemotron-4: squared ReLU, two matrices)
        extra["mlp"] = m.mlp
    return ModelSpec(name=run.name, num_layers=m.num_layers, hidden_size=m.hidden_size,
                     num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                     ffn_hidden_size=m.ffn_hidden_size or 4 * m.hidden_size,
                     vocab_size=m.vocab_size, max_seq_len=m.seq_len, source=run.paper, **extra)


UNEVEN_STAGES = {"llama3-405b-8k-8192gpu": (7, 7), "llama3-405b-8k-16384gpu": (7, 7)}
"""(first, last) stage layers of rows whose sources state an uneven split: Dubey et al. 2024
§3.3.2 (Llama 3 405B, 126 layers over 16 stages): "we reduce one Transformer layer each from
the first and the last stages" -> 7, 8 x 14, 7."""


def data_row_error(run: PublicRun, level: float | None = None
                   ) -> tuple[float | None, float | None, str]:
    """(predicted TFLOP/s per GPU, error %, note) of one data-file row, or (None, None, why not).

    Counting: rows with an MFU compare model FLOPs (zplan's `mfu` x peak); the others Megatron's
    eq. 3 (with the recompute forward), as their sources count. Named approximation: when the
    global batch is not a multiple of micro-batch x dp (OPT: 1024 over 124), the step runs
    ceil(batch / (b·dp)) micro-batches and throughput is counted over that batch."""
    if run.category == "moe":
        return moe_row_error(run)
    if run.not_modelled:
        return None, None, f"not modelled: {run.not_modelled}"
    if run.model is None or run.global_batch is None or run.micro_batch is None:
        return None, None, "model dimensions or batch not transcribed"
    model, cluster, layout, setup, note = data_row_build(run, level)
    try:
        est = estimate_step(model, cluster, layout, setup)
    except PlanInputError as exc:
        return None, None, f"refused: {exc}"
    return _compare(run, setup.global_batch, est, note)


def data_row_build(run: PublicRun, level: float | None = None
                   ) -> tuple[ModelSpec, Cluster, Layout, TrainSetup, str]:
    """The (model, cluster, layout, setup, note) a dense data-file row is evaluated with
    (`data_row_error`; `level`: the GPU's in-training GEMM level, shape model kept)."""
    first, last = UNEVEN_STAGES.get(run.name, (None, None))
    if run.pipeline_split_accounting:  # Megatron's account-for-embedding / -loss flags
        first, last = stage_placement.accounted_stage_layers(
            run.model.num_layers, run.pp, "embedding" in run.pipeline_split_accounting,
            "loss" in run.pipeline_split_accounting)
    m = math.ceil(run.global_batch / (run.micro_batch * run.dp))
    batch = m * run.micro_batch * run.dp
    note = "" if batch == run.global_batch else f"batch {batch} (m={m})"
    model = _data_model(run)
    recompute = "selective" if run.recompute == "unknown" else run.recompute
    fused = run.model.num_kv_heads is not None or run.engine.startswith("megatron-core")
    layout = Layout(tp=run.tp, pp=run.pp, dp=run.dp, cp=run.cp, zero_stage=data_zero_stage(run),
                    virtual_stages=run.virtual_stages,
                    dp_engine=data_dp_engine(run), dp_shard=run.dp_shard,
                    recompute=recompute, recompute_num_layers=run.recompute_num_layers,
                    micro_batch=run.micro_batch, grad_accum=m,
                    first_stage_layers=first, last_stage_layers=last,
                    sequence_parallel=(fused and run.tp > 1 if run.sequence_parallel is None
                                       else run.sequence_parallel),
                    flash_attention=fused if run.flash_attention is None
                    else run.flash_attention, megatron_overlap=run.megatron_overlap)
    precision = "megatron-fp16" if run.gpu.startswith("v100") else "megatron-bf16"
    setup = TrainSetup(seq_len=run.model.seq_len, global_batch=batch, train_tokens=300e9,
                       precision=get_precision(precision), optimizer=get_optimizer("adam"))
    cluster = data_row_cluster(run)
    if run.inter_node_gb_per_s is not None:  # the network the source states
        cluster = cluster.model_copy(update=dict(inter_node_gb_per_s=run.inter_node_gb_per_s))
    if level is not None:
        cluster = cluster.model_copy(update=dict(
            gpu=cluster.gpu.model_copy(update=dict(achieved_efficiency=level))))
    return model, cluster, layout, setup, note


def data_row_cluster(run: PublicRun) -> Cluster:
    """The row's `cluster` profile (its node and network) with as many nodes as the row's GPUs
    fill, or the GPU's default node (`cluster_for_gpus`) when the row names none."""
    if run.cluster is None:
        return cluster_for_gpus(run.gpu, run.num_gpus)
    base = load_cluster(run.cluster)
    nodes, rest = divmod(run.num_gpus, base.node.gpus_per_node)
    if rest or base.gpu.name != run.gpu:
        raise ValueError(f"{run.name}: {run.num_gpus} {run.gpu} GPUs do not fill whole "
                         f"{base.node.name} nodes")
    return base.model_copy(update=dict(num_nodes=nodes, name=f"{base.node.name}x{nodes}"))


def _compare(run: PublicRun, batch: int, est, note: str
             ) -> tuple[float, float, str]:
    """(predicted, error %, note) in the row's own metric: tokens per second per GPU; TFLOP/s
    counted by the row's `flops_formula`; else MFU where given; else Megatron's eq. 3."""
    m = run.model
    if run.tokens_per_s_per_gpu is not None:
        pred = batch * m.seq_len / (est.step_s * run.num_gpus)
        return pred, 100 * (pred / run.tokens_per_s_per_gpu - 1), note or "tokens/s"
    if run.flops_formula is None and run.mfu is not None:
        return est.mfu * 100, 100 * (est.mfu / run.mfu - 1), note or "MFU"
    formula = model_flops_korthikanti if run.flops_formula == "model-flops" \
        else megatron_eq3_flops
    flops = formula(batch, m.seq_len, m.num_layers, m.hidden_size, m.vocab_size)
    pred = flops / (est.step_s * run.num_gpus) / 1e12
    return pred, 100 * (pred / run.tflops_per_gpu - 1), note


MOE_ROWS = {"deepseek-v3-671b-2048gpu": ("deepseek-v3", 1, "te-fp8", 37e9)}
"""category moe rows: (the shipped preset built from the row's config.json, the micro-batch
assumed (the report gives none: 1, the planner's default, fixed before the row was evaluated),
the precision recipe the source states (DeepSeek-V3 §3.3: FP8 GEMMs), the activated parameters
its `counting` multiplies by 6)."""


def moe_row_error(run: PublicRun) -> tuple[float | None, float | None, str]:
    """A mixture-of-experts row with its expert-parallel degree (planner.timing.expert):
    predicted TFLOP/s per GPU counted as the row counts it (6 x activated parameters x
    tokens/s per GPU). Never fitted: out-of-sample rows only report their error."""
    if run.name not in MOE_ROWS or run.global_batch is None:
        return None, None, "no preset for this MoE row"
    preset, micro, precision, active = MOE_ROWS[run.name]
    from planner.io.loading import load_model

    model = load_model(preset)
    m = run.global_batch // (micro * run.dp)
    layout = Layout(tp=run.tp, pp=run.pp, dp=run.dp, ep=run.ep, zero_stage=1,
                    recompute="selective" if run.recompute == "unknown" else run.recompute,
                    micro_batch=micro, grad_accum=m)
    setup = TrainSetup(seq_len=run.model.seq_len, global_batch=m * micro * run.dp,
                       train_tokens=300e9, precision=get_precision(precision),
                       optimizer=get_optimizer("adam"))
    try:
        est = estimate_step(model, cluster_for_gpus(run.gpu, run.num_gpus), layout, setup)
    except PlanInputError as exc:
        return None, None, f"refused: {exc}"
    pred = 6 * active * est.tokens_per_s / run.num_gpus / 1e12
    return pred, 100 * (pred / run.tflops_per_gpu - 1), (
        f"ep={run.ep}, micro-batch {micro} assumed, {precision}; all-to-all "
        f"{est.ep_comm_s / est.step_s:.0%} of the step")


def fit_level(run: PublicRun, lo: float = 0.05, hi: float = 1.0) -> float:
    """The GPU's `achieved_efficiency` at which the shipped model reproduces an IN-SAMPLE row
    (bisection; the prediction rises with the level). Used for V100 on Shoeybi et al. 2019."""
    if run.split != "in_sample":
        raise ValueError(f"{run.name} is out of sample: never fitted")
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if data_row_error(run, mid)[1] < 0 else (lo, mid)
    return (lo + hi) / 2


def evaluated_rows() -> list[tuple[str, str, str, float, float | None, float | None, str]]:
    """(name, split, category, published, predicted, error %, note) of every row: Narayanan
    2021 Table 1 and Korthikanti 2022 (in-sample, Megatron-style A100) with the shipped
    default, then every data-file row."""
    out = []
    for r in NARAYANAN_2021_TABLE1 + KORTHIKANTI_2022:
        pred = predicted_tflops_per_gpu(r)
        out.append((r.name, "in_sample", "megatron-a100", r.published_tflops_per_gpu, pred,
                    100 * (pred / r.published_tflops_per_gpu - 1), ""))
    for r in load_runs():
        if r.split not in EVALUATED_SPLITS:
            continue
        pred, err, note = data_row_error(r)
        out.append((r.name, r.split, data_category(r), published_metric(r), pred, err, note))
    return out


EVALUATED_SPLITS = ("in_sample", "out_of_sample", "out_of_sample_2", "out_of_sample_3",
                    "out_of_sample_4", "out_of_sample_5", "out_of_sample_6", "out_of_sample_7")
"""Splits whose model errors are computed. out_of_sample_2 joined after session 10's
structural work; out_of_sample_3 joined once, after session 11's (the Megatron overlaps) was
committed (the YAML's THIRD SPLIT RULE); out_of_sample_4 (MosaicML llm-foundry FSDP tables)
joined once, after session 11's sharded-DP work (FSDP2 copies, the FSDP schedule for FSDP1
rows) was committed (FOURTH SPLIT RULE); out_of_sample_5 (NVIDIA dgxc-benchmarking v25.01) joined once,
after session 12's interleaved data-parallel overlap was committed (FIFTH SPLIT RULE);
out_of_sample_6 (the fms-fsdp table) joined once, after
session 12's work (the loss kernels, one FSDP2 copy-bytes definition, the OPT-175B layout from
metaseq's launcher) was committed (SIXTH SPLIT RULE); no structural change may follow. out_of_sample_7 (the later
dgxc-benchmarking releases: GB200 and current-software H100) joined once, after session 12's
stage placement (t10d, commit 5e1f474) was committed (SEVENTH SPLIT RULE)."""

SPLIT_LABELS = {"in_sample": "in_sample", "out_of_sample": "seen since s8",
                "out_of_sample_2": "seen since s10", "out_of_sample_3": "seen since s11",
                "out_of_sample_4": "seen since s11", "out_of_sample_5": "seen since s12",
                "out_of_sample_6": "seen since s12", "out_of_sample_7": "out_of_sample_7"}
"""How each split is reported: the session-8 out-of-sample rows have been seen since session 8
and the session-10 ones since session 10 (errors looked at while building the model), so they
are no longer clean held-out evidence; out_of_sample_3 (t10b) and out_of_sample_4 (f10c) were
each evaluated once in session 11 and are seen since; out_of_sample_5 (NVIDIA dgxc-benchmarking
v25.01) and out_of_sample_6 (the fms-fsdp table) were each evaluated once in session 12 and then
seen while the stage placement was built (t10d); out_of_sample_7 (the later dgxc-benchmarking
releases) is the held-out split."""


def split_group_report(rows, split: str = "out_of_sample_4", label: str | None = None
                       ) -> list[str]:
    """Mean / max |error| of one split's rows by GPU and by single node (8 GPUs) vs multi-node
    (the grouping fixed with the FOURTH SPLIT RULE, before the split's errors were computed);
    `label` names the rows when they are not the split's label (the HSDP rows)."""
    label = label or SPLIT_LABELS[split]
    runs = {r.name: r for r in load_runs()}
    lines = [f"{'split':<16} {'gpu':<10} {'nodes':<6} {'rows':>4} {'mean |err|':>10} "
             f"{'max |err|':>9} {'mean err':>9}"]
    sel = [(runs[r[0]], r[5]) for r in rows if r[1] == split and r[5] is not None]
    for gpu in sorted({run.gpu for run, _ in sel}):
        for nodes, pick in (("1", lambda n: n <= 8), (">1", lambda n: n > 8), ("all", bool)):
            errs = [e for run, e in sel if run.gpu == gpu and pick(run.num_gpus)]
            if errs:
                lines.append(f"{label:<16} {gpu:<10} {nodes:<6} {len(errs):>4} "
                             f"{sum(map(abs, errs)) / len(errs):>9.1f}% "
                             f"{max(map(abs, errs)):>8.1f}% {sum(errs) / len(errs):>+8.1f}%")
    return lines


def split_family_report(rows, split: str = "out_of_sample_5") -> list[str]:
    """Mean / max |error| of one split's rows by model (the row name without its GPU count:
    one recipe's weak-scaling columns), the grouping fixed with the FIFTH SPLIT RULE before the
    split's errors were computed."""
    lines = [f"{'split':<16} {'model':<22} {'rows':>4} {'mean |err|':>10} {'max |err|':>9} "
             f"{'mean err':>9}"]
    sel = [(r[0].rsplit("-", 1)[0], r[5]) for r in rows if r[1] == split and r[5] is not None]
    for family in dict.fromkeys(f for f, _ in sel):
        errs = [e for f, e in sel if f == family]
        lines.append(f"{SPLIT_LABELS[split]:<16} {family:<22} {len(errs):>4} "
                     f"{sum(map(abs, errs)) / len(errs):>9.1f}% {max(map(abs, errs)):>8.1f}% "
                     f"{sum(errs) / len(errs):>+8.1f}%")
    return lines


def split_gpu_report(rows, split: str = "out_of_sample_7") -> list[str]:
    """Mean / max |error| of one split's rows by GPU (GB200; H100 = the same NeMo recipes on
    newer software than out_of_sample_5) and, within each GPU, by model (the row name without
    its GPU count): the grouping fixed with the SEVENTH SPLIT RULE before the split's errors
    were computed."""
    runs = {r.name: r for r in load_runs()}
    lines = [f"{'split':<16} {'gpu':<10} {'model':<34} {'rows':>4} {'mean |err|':>10} "
             f"{'max |err|':>9} {'mean err':>9}"]
    sel = [(runs[r[0]].gpu, r[0].rsplit("-", 1)[0], r[5]) for r in rows
           if r[1] == split and r[5] is not None]
    for gpu in dict.fromkeys(g for g, _, _ in sel):
        for family in [None] + list(dict.fromkeys(f for g, f, _ in sel if g == gpu)):
            errs = [e for g, f, e in sel if g == gpu and family in (None, f)]
            lines.append(f"{SPLIT_LABELS[split]:<16} {gpu:<10} {family or 'all':<34} "
                         f"{len(errs):>4} {sum(map(abs, errs)) / len(errs):>9.1f}% "
                         f"{max(map(abs, errs)):>8.1f}% {sum(errs) / len(errs):>+8.1f}%")
    return lines


def published_metric(run: PublicRun) -> float:
    """The row's published figure in the unit `_compare` predicts."""
    if run.tokens_per_s_per_gpu is not None:
        return run.tokens_per_s_per_gpu
    if run.flops_formula is None and run.mfu is not None:
        return run.mfu * 100
    return run.tflops_per_gpu


def category_report(rows) -> list[str]:
    """Mean / max |error| per split and category (rows without a prediction are counted apart)."""
    lines = [f"{'split':<16} {'category':<14} {'rows':>4} {'mean |err|':>10} {'max |err|':>9}"
             f" {'not evaluated':>13}"]
    for split in EVALUATED_SPLITS:
        for cat in CATEGORIES:
            sel = [r for r in rows if r[1] == split and r[2] == cat]
            if not sel:
                continue
            errs = [abs(r[5]) for r in sel if r[5] is not None]
            mean = f"{sum(errs) / len(errs):>9.1f}%" if errs else f"{'-':>10}"
            worst = f"{max(errs):>8.1f}%" if errs else f"{'-':>9}"
            lines.append(f"{SPLIT_LABELS[split]:<16} {cat:<14} {len(errs):>4} {mean} {worst}"
                         f" {len(sel) - len(errs):>13}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loo", action="store_true", help="also print leave-one-out fits")
    args = parser.parse_args(argv)
    runs = NARAYANAN_2021_TABLE1
    cal = calibration_row(runs)
    eff = fit_efficiency(cal)
    print(f"{NARAYANAN}: TFLOP/s per GPU counted with eq. 3; A100 peak {A100_16BIT_PEAK_TFLOPS}")
    print(f"matmul efficiency fitted on row {cal.name}: {eff:.4f}\n")
    print("\n".join(_table(runs, eff, cal.name)))
    others = [abs(error_pct(r, eff)) for r in runs if r.name != cal.name]
    print(f"\nother rows: mean |error| {sum(others) / len(others):.1f}%, max {max(others):.1f}%")
    print(f"\nheld out, same efficiency: {KORTHIKANTI} selective recompute + sequence parallel,"
          f" dp 1;\nmodel TFLOP/s per GPU = README MFU x 312")
    print("\n".join(_table(KORTHIKANTI_2022, eff, "")))
    errs = [abs(error_pct(r, eff)) for r in KORTHIKANTI_2022]
    print(f"\nmean |error| {sum(errs) / len(errs):.1f}%, max {max(errs):.1f}%")
    v100 = next(r for r in load_runs() if r.name == "megatron-8.3b-v100")
    print(f"\nV100 in-training GEMM level fitted on in-sample row {v100.name}: "
          f"{fit_level(v100):.4f}")
    rows = evaluated_rows()
    print("\nevery row with the shipped model (profiles' efficiencies, no override)")
    print(f"{'row':<33} {'split':<15} {'category':<13} {'published':>9} {'predicted':>9}"
          f" {'error':>7}  note")
    for name, split, cat, pub, pred, err, note in rows:
        p = f"{pred:>9.1f}" if pred is not None else f"{'-':>9}"
        e = f"{err:>+6.1f}%" if err is not None else f"{'-':>7}"
        print(f"{name:<33} {SPLIT_LABELS[split]:<15} {cat:<13} {pub:>9.1f} {p} {e}  {note}")
    print("\n(note MFU: % MFU; tokens/s: tokens per second per GPU; the others TFLOP/s per GPU,"
          " counted as the source counts)\n")
    print("\n".join(category_report(rows)))
    print("\nout_of_sample_4 (MosaicML llm-foundry MPT, Composer FSDP FULL_SHARD, seen since s11)"
          " by GPU and nodes")
    print("\n".join(split_group_report(rows)))
    print("\nout_of_sample_5 (NVIDIA dgxc-benchmarking v25.01, NeMo BF16 on H100, seen since s12) by model")
    print("\n".join(split_family_report(rows)))
    print("\nout_of_sample_6 (IBM / PyTorch fms-fsdp, FSDP1 FULL_SHARD; no AC / full AC rows)"
          " by GPU and nodes")
    print("\n".join(split_group_report([r for r in rows if r[2] not in ("hsdp", "block-ac")],
                                        "out_of_sample_6")))
    print("\nout_of_sample_6 every-k-th-block rows (fms 'Selective AC', k = 2 derived from the "
          "README's HFU/MFU), evaluated once after partial recompute was built (session 13, t10e)")
    print("\n".join(split_group_report([r for r in rows if r[2] == "block-ac"], "out_of_sample_6",
                                        "oos_6 block AC")))
    print("\nout_of_sample_6 HSDP rows (fms-fsdp HYBRID_SHARD, dp_shard 8), evaluated once after"
          " HSDP was built (session 12, h10), by GPU and nodes")
    print("\n".join(split_group_report([r for r in rows if r[2] == "hsdp"], "out_of_sample_6",
                                        "oos_6 HSDP")))
    print("\nout_of_sample_7 (NVIDIA dgxc-benchmarking v25.05.05 / v25.04.02, NeMo BF16 on GB200 "
          "and current-software H100) by GPU and model")
    print("\n".join(split_gpu_report(rows)))
    if args.loo:
        print("\nleave-one-out: fit on one row, errors on the other nine")
        print(f"{'fit row':>9} {'efficiency':>10} {'mean |err|':>10} {'max |err|':>9}")
        for held in runs:
            e = fit_efficiency(held)
            errs = [abs(error_pct(r, e)) for r in runs if r.name != held.name]
            print(f"{held.name:>9} {e:>10.4f} {sum(errs) / len(errs):>9.1f}% {max(errs):>8.1f}%")


if __name__ == "__main__":
    main()
