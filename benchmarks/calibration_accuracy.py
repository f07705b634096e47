"""Accuracy of the planner against real torch training steps (CPU, small models).

Prints a markdown table: for each architecture x recompute mode x precision, the error of the
parameter count, the model-state bytes, the saved-activation bytes (all blocks) and the FLOPs
per step, and the tensor classes that account for any activation difference. Then the
per-rank DDP / ZeRO-1 / FSDP2 table of a 3-process gloo run (3 does not divide the
widths, so torch's whole-parameter and dim-0 rules differ from the planner's even split).

    python benchmarks/calibration_accuracy.py                 # print the tables
    python benchmarks/calibration_accuracy.py --update-docs   # also rewrite them in docs/calibrate.md and README.md
    python benchmarks/calibration_accuracy.py --norm-impl torch --nproc 0   # torch's own norm ops (CPU composite)

Not a test: nothing here asserts; timing figures are printed for information only.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.calibrate.config import RunSpec, run_specs, scaled_model
from planner.io.loading import load_model

ARCHS = {  # name: overrides (GQA for Llama: 4 query heads share 2 K/V heads)
    "gpt2": {"layers": 4, "hidden": 128, "heads": 4, "ffn": 512, "vocab": 256},
    "llama3-8b": {"layers": 4, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn": 352, "vocab": 256},
    "bert-large": {"layers": 4, "hidden": 128, "heads": 4, "ffn": 512, "vocab": 256},
    "mixtral-8x7b": {"layers": 4, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn": 176, "vocab": 256},
}
MODES = ("none", "full", "every_k", "selective")
PRECISIONS = ("fp32", "bf16-mixed")
SEQ_LEN, MICRO_BATCH, EVERY_K = 64, 2, 2
MARK_START, MARK_END = "<!-- calibration-accuracy:start -->", "<!-- calibration-accuracy:end -->"


def runs() -> list[RunSpec]:
    out = []
    for name, overrides in ARCHS.items():
        model = scaled_model(load_model(name), **overrides)
        out += run_specs(model, SEQ_LEN, MICRO_BATCH, PRECISIONS, "adam", MODES, EVERY_K)
    return out


def _err(rows, quantity: str) -> str:
    row = next(r for r in rows if r.quantity.startswith(quantity))
    return "-" if row.error_pct is None else f"{row.error_pct:+.2f}"


def _culprits(result) -> str:
    """Block-0 tensor classes whose bytes differ, largest difference first."""
    diffs = [(r.measured - (r.predicted or 0), r.quantity.removeprefix("block 0: "))
             for r in result.classes if r.quantity.startswith("block 0: ") and r.measured != r.predicted]
    diffs.sort(key=lambda d: -abs(d[0]))
    return "; ".join(f"{name} {diff:+,.0f} B" for diff, name in diffs) or "-"


def accuracy_table(results) -> str:
    header = ("| model | precision | recompute | params | states | saved, all blocks | FLOPs/step | step ms | "
              "classes that differ (block 0, measured - predicted) |")
    lines = [header, "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        states = max((abs(row.error_pct) for row in r.rows if row.quantity.endswith("bytes")
                      and row.quantity.split()[0] in ("parameter", "gradient", "optimizer-state")), default=0)
        lines.append(
            f"| {r.run.model.name.split('[')[0]} | {r.run.setup.precision.name} | {r.run.layout.recompute} "
            f"| {_err(r.rows, 'parameters')} | {states:+.2f} | {_err(r.rows, 'saved activations, all')} "
            f"| {_err(r.rows, 'FLOPs per step')} | {r.measured.step_time_s * 1e3:.1f} | {_culprits(r)} |")
    return "\n".join(lines)


def distributed_table(distributed) -> str:
    lines = ["| quantity | predicted | measured | error % | note |", "|---|---|---|---|---|"]
    for row in distributed["rows"]:
        err = "-" if row.error_pct is None else f"{row.error_pct:+.2f}"
        lines.append(f"| {row.quantity} | {row.predicted:,.0f} | {row.measured:,.0f} | {err} | {row.note} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update-docs", action="store_true", help="rewrite the tables in docs/calibrate.md and README.md")
    parser.add_argument("--nproc", type=int, default=3, help="processes of the distributed run (0: skip)")
    parser.add_argument("--norm-impl", choices=("fused", "torch"), default="fused",
                        help="norms that save what the fused GPU kernels save (default) or torch's own ops")
    args = parser.parse_args()

    import torch

    from planner.calibrate.distributed import run_distributed
    from planner.calibrate.run import run_all

    torch.set_num_threads(2)
    start = time.perf_counter()
    results = run_all(runs(), steps=2, warmup=1, device="cpu", norm_impl=args.norm_impl)
    intro = (f"Measured with torch {torch.__version__} on {results[0].measured.device}, "
             f"s={SEQ_LEN}, b={MICRO_BATCH}, every_k={EVERY_K}, Adam, `--norm-impl {args.norm_impl}`; errors in % "
             "((measured - predicted) / predicted); `states` is the largest error of the parameter, "
             "gradient and optimizer-state bytes.")
    text = [intro, "", accuracy_table(results)]
    if args.nproc > 1:
        model = results[0].run.model
        dist = run_distributed(model, SEQ_LEN, MICRO_BATCH, args.nproc, "cpu")
        text += ["", f"Distributed, {args.nproc} gloo processes, {model.name}, fp32 Adam, one step:", "",
                 distributed_table(dist)]
    body = "\n".join(text)
    print(body)
    print(f"\n({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    if args.update_docs:
        replace_between_marks(ROOT / "docs" / "calibrate.md", body)
        replace_between_marks(ROOT / "README.md", "\n".join([intro, "", accuracy_table(results)]))


def replace_between_marks(path: Path, body: str) -> None:
    """Rewrite the text between MARK_START and MARK_END in `path` (README and docs/calibrate.md)."""
    old = path.read_text()
    if MARK_START not in old:
        raise SystemExit(f"{path}: no {MARK_START} marker to write the table at")
    new = re.sub(f"{re.escape(MARK_START)}.*{re.escape(MARK_END)}",
                 lambda _m: f"{MARK_START}\n{body}\n{MARK_END}", old, flags=re.DOTALL)
    path.write_text(new)

if __name__ == "__main__":
    main()
