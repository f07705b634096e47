"""Published FP8 (and BF16) training throughput against zplan's step model (issue 13, FP8).

    python benchmarks/fp8_runs.py

Every row of benchmarks/data/fp8_runs.yaml is rebuilt (preset model, whole H100 nodes, the
row's layout) and `steptime.estimate_step` predicts its tokens/s per GPU with the shipped
profile (no override, nothing fitted). Printed: predicted vs published and the error per row,
the mean / max |error| for the in-sample and the out-of-sample rows SEPARATELY (the split is
the data file's, committed before any error was computed), and the fp8/bf16 speed-up of each
published pair at one layout against the predicted speed-up.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from planner.core.spec import Layout  # noqa: E402
from planner.io.jobfile import make_setup  # noqa: E402
from planner.io.loading import cluster_for_gpus, load_model  # noqa: E402
from planner.timing.steptime import estimate_step  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "fp8_runs.yaml"


def load_rows(path: Path = DATA) -> list[dict]:
    """The published rows of the data file."""
    return yaml.safe_load(path.read_text(encoding="utf-8"))["runs"]


def layout_of(row: dict) -> Layout:
    """The row's layout; dp = GPUs / (tp x pp), grad_accum = global batch / (dp x micro_batch)."""
    dp = row["num_gpus"] // (row["tp"] * row["pp"])
    return Layout(tp=row["tp"], pp=row["pp"], dp=dp, micro_batch=row["micro_batch"],
                  grad_accum=row["global_batch"] // (dp * row["micro_batch"]),
                  virtual_stages=row.get("virtual_stages", 1),
                  sequence_parallel=row.get("sequence_parallel", False),
                  zero_stage=row["zero_stage"], dp_engine=row.get("dp_engine", "deepspeed"),
                  recompute=row["recompute"], flash_attention=True)


def predict(row: dict) -> tuple[float, float]:
    """(tokens/s per GPU, MFU against the bf16 peak) the step model predicts for the row."""
    model = load_model(row["model"])
    cluster = cluster_for_gpus(row["gpu"], row["num_gpus"])
    setup = make_setup(row["seq_len"], row["global_batch"], 1e12, row["precision"], "adam",
                       implementation="megatron")
    step = estimate_step(model, cluster, layout_of(row), setup)
    return step.tokens_per_s / row["num_gpus"], step.mfu


def error_pct(predicted: float, published: float) -> float:
    return 100.0 * (predicted - published) / published


def _summary(label: str, errors: list[float]) -> str:
    if not errors:
        return f"{label}: no rows"
    mean = sum(abs(e) for e in errors) / len(errors)
    return f"{label}: {len(errors)} rows, mean |error| {mean:.1f} %, max |error| {max(abs(e) for e in errors):.1f} %"


def _pairs(rows: list[dict], predicted: dict[str, float]) -> list[str]:
    """fp8 / bf16 speed-up of each published pair (same name but the precision suffix)."""
    lines = []
    for row in rows:
        if not row["name"].endswith("-bf16"):
            continue
        twin = next((r for r in rows if r["name"].startswith(row["name"][:-5])
                     and r is not row and r["precision"] != row["precision"]), None)
        if twin is None:
            continue
        published = twin["tokens_per_s_per_gpu"] / row["tokens_per_s_per_gpu"]
        model = predicted[twin["name"]] / predicted[row["name"]]
        lines.append(f"  {row['name'][:-5]:44s} speed-up published {published:.3f}  "
                     f"predicted {model:.3f}  error {error_pct(model, published):+.1f} %")
    return lines


def main() -> None:
    rows = load_rows()
    predicted, errors = {}, {"in_sample": [], "out_of_sample": []}
    print(f"{'run':46s} {'split':13s} {'published':>10s} {'predicted':>10s} {'error':>8s} {'MFU(bf16)':>9s}")
    for row in rows:
        tokens, mfu = predict(row)
        predicted[row["name"]] = tokens
        err = error_pct(tokens, row["tokens_per_s_per_gpu"])
        errors[row["split"]].append(err)
        print(f"{row['name']:46s} {row['split']:13s} {row['tokens_per_s_per_gpu']:10.0f} "
              f"{tokens:10.0f} {err:+7.1f}% {100 * mfu:8.1f}%")
    print(_summary("in-sample", errors["in_sample"]))
    print(_summary("out-of-sample", errors["out_of_sample"]))
    print("fp8 / bf16 speed-up at one layout:")
    print("\n".join(_pairs(rows, predicted)))


if __name__ == "__main__":
    main()
