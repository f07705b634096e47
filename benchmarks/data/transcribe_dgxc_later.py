"""Transcribe the BF16 pretraining tables of the LATER NVIDIA/dgxc-benchmarking releases (GB200
and current-software H100) into published_runs.yaml rows (split out_of_sample_7). A one-off tool
kept as the record of how the rows were made: every table number (GPUs, TP, PP, CP, VP, DP,
MBS, GBS, GA, step time, tokens/s, MFU) is parsed from the stored README, none typed by hand.

    python benchmarks/data/transcribe_dgxc_later.py /path/to/dgxc-benchmarking.git > block.yaml

Needs a git copy of github.com/NVIDIA/dgxc-benchmarking (the `search` tool's fetch); not run by
tests. Selection (fixed 2026-11-23 before any model error on these rows was computed):

* Releases after v25.01 publish performance tables only up to the v25.05.x line (v25.07 and
  later READMEs give layouts but no step time or throughput). ONE release per model, the latest
  whose README states both the layout and the measured step: v25.05.05 (tag, 2025-10-22) for
  Llama 3.1 405B and Nemotron-4 15B / 340B; v25.04.02 (2025-07-23) for Llama 3.1 8B / 70B and
  GPT-3 175B, which v25.05.x dropped. No release has a B200 or H200 table (searched: every tag,
  every README): no row for those GPUs.
* Every BF16 column of every dense-model pretraining table of those READMEs, on any GPU; the
  Llama 3.1 405B "proxy" columns (7-62 layers, not the model) are not taken, as in v25.01.
  Not taken: FP8 tables (another recipe; benchmarks/fp8_runs.py's conventions), mixture-of-
  experts models (Grok-1, DeepSeek-V3, Llama 4), Nemotron-H (hybrid Mamba), fine-tuning.
* Static fields (model dimensions, recompute, overlaps) as the v25.01 rows (transcribe_dgxc.py)
  where the README's Notes agree; `assumed` names every field the README does not state.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from transcribe_dgxc import COUNTING, FULL, NEMOTRON, RECIPES, print_rows  # noqa: E402

TAGS = {"v25.05.05": "c5c765f2684f983e787eaada4073b63c8287caf6",
        "v25.04.02": "0efdb235ac32cc815084bd84ac8c1d1b722fa13e"}
GPUS = {"GB200": "gb200", "H100": "h100-sxm"}
CLUSTERS = {"gb200": "gb200-nvl72-seg16x8"}
"""Rows on GB200 run on 64-GPU NVLink segments (clusters/gb200-nvl72-seg16x8.yaml: its node and
network, with as many segments as the row uses); H100 rows on
DGX H100 nodes (the loader's default for h100-sxm)."""
LLAMA8B = dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
               ffn_hidden_size=14336, vocab_size=128256, seq_len=8192)
SPLIT_405B = ("126 layers over pp 8 x vp 8 = 64 chunks divide only with Megatron-Core's "
              "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split "
              "((126 + 2) / 64 = 2 per chunk); NeMo's llama31_405b recipe sets both (NVIDIA/NeMo "
              "tests/collections/llm/recipes/test_llama31_405b.py at commit edc0cbf5)")


def _static(v25_01_path: str, **changes) -> dict:
    base = dict(RECIPES[v25_01_path])
    base.update(changes)
    return base


# (tag, README, perf-table title prefix, layout selector) -> static recipe fields
TABLES = [
    ("v25.05.05", "llama3.1/README.md", "Llama3.1 405b BF16", dict(size=None),
     _static("llama3.1/README_405b.md", pipeline_split_accounting=["embedding", "loss"],
             note=RECIPES["llama3.1/README_405b.md"]["note"] + "; " + SPLIT_405B,
             assumed=RECIPES["llama3.1/README_405b.md"]["assumed"]
             + ["pipeline_split_accounting"])),
    ("v25.05.05", "nemotron/README.md", "Nemotron4 15b BF16 H100", dict(size="15b"),
     _static("nemotron/README_15b.md", note=NEMOTRON)),
    ("v25.05.05", "nemotron/README.md", "Nemotron4 340b BF16 H100", dict(size="340b"),
     _static("nemotron/README_340b.md")),
    ("v25.05.05", "nemotron/README.md", "Nemotron 340b BF16 GB200 |", dict(size="340b"),
     _static("nemotron/README_340b.md")),
    ("v25.05.05", "nemotron/README.md", "Nemotron 340b BF16 GB200 Strong Scaling",
     dict(size="340b"), _static("nemotron/README_340b.md", name_suffix="-strong")),
    ("v25.04.02", "llama3.1/README.md", "Llama 3.1 8b BF16", dict(size="8b"),
     dict(name="nemo-llama3.1-8b", model=LLAMA8B, recompute="none", overlap=FULL,
          note="Llama 3.1 8B dimensions (the README's Notes: 32 layers, hidden 4096, 8 of 32 "
               "query groups, FFN 14336, vocabulary 128,256)",
          assumed=["recompute", "megatron_overlap", "sequence_parallel"])),
    ("v25.04.02", "llama3.1/README.md", "Llama 3.1 70b BF16", dict(size="70b"),
     _static("llama3.1/README_70b.md")),
    ("v25.04.02", "nemo_megatron/README_175b.md", "NeMo Megatron BF16", dict(size="175b"),
     _static("nemo_megatron/README_175b.md", overlap=FULL, recompute="none",
             note="vocabulary 51,200 from the README's Notes (GPT2BPETokenizer); the release's "
                  "nemo_megatron/cfg/gpt3_175b_hydra.yaml states no activation checkpointing, "
                  "sequence_parallel true, ub_tp_comm_overlap true, overlap_grad_sync and "
                  "overlap_param_sync true, and no shared-embedding override (NeMo's default: "
                  "tied)",
             assumed=["num_heads"])),
]


def readme(git_dir: str, tag: str, path: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{TAGS[tag]}:{path}"],
                          check=True, capture_output=True, text=True).stdout


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_at(lines: list[str], start: int) -> list[list[str]]:
    """The table whose header is lines[start]: header then data rows (separator skipped); rows
    may lack the leading '|' (some of these READMEs write them so)."""
    rows = [cells(lines[start])]
    for ln in lines[start + 1:]:
        if "|" not in ln:
            break
        if set(ln.replace("|", "").strip()) <= set("-: "):
            continue
        rows.append(cells(ln))
    return rows


def layout_rows(text: str, gpu_label: str) -> list[dict[str, str]]:
    """Every row of every layout table (header with GPUs and TP) in the README section of one
    GPU (headings or bold labels naming it), as {column: cell}."""
    lines = text.splitlines()
    out, current = [], None
    for i, ln in enumerate(lines):
        label = re.match(r"^(?:#+ *|\*\*)(GB200|H100)", ln)
        if label:
            current = label.group(1)
        if current in (gpu_label, None) and ln.startswith("|") and "GPUs" in ln and "| TP" in ln:
            rows = table_at(lines, i)
            out += [dict(zip(rows[0], r)) for r in rows[1:]]
    return out


def perf_tables(text: str, title: str) -> list[tuple[str, list[dict]]]:
    """Every performance table starting with `title` (one per GPU section)."""
    lines = text.splitlines()
    return [perf_columns(table_at(lines, i)) for i, ln in enumerate(lines)
            if ln.startswith("| " + title)]


def perf_columns(rows: list[list[str]]) -> tuple[str, list[dict]]:
    """One performance table: (its full title, one dict per column)."""
    head, body = rows[0], {r[0]: r[1:] for r in rows[1:]}
    cols = []
    for i, h in enumerate(head[1:]):
        if not h:
            continue
        m = re.search(r"(\d+)x? (GB200|H100)", h)
        gbs = re.search(r"GBS=(\d+)", h)
        mfu = body["Model flops utilization"][i].rstrip("%")
        cols.append(dict(gpus=int(m.group(1)), gpu_label=m.group(2),
                         gbs=int(gbs.group(1)) if gbs else None,
                         step_s=float(body["Training step time (seconds per step)"][i]),
                         tokens_per_s=int(body["Throughput in tokens per second"][i]),
                         mfu_pct=float(mfu)))
    return head[0], cols


def match_layout(layouts: list[dict], col: dict, size: str | None) -> dict:
    """The layout row of a performance column: same GPUs, BF16, the model size where the table
    has a Size column, the column's GBS where its header states one."""
    def ok(r: dict) -> bool:
        return (int(r["GPUs"]) == col["gpus"]
                and ("Precision" not in r or "BF16" in r["Precision"])
                and (size is None or r.get("Size", size) == size)
                and (col["gbs"] is None or int(r["GBS"]) == col["gbs"]))
    found = [r for r in layouts if ok(r)]
    if len(found) != 1:
        raise ValueError(f"{col}: {len(found)} layout rows match")
    return found[0]


def _int(cell: str) -> int:
    return 1 if cell in ("NA", "0", "") else int(cell)


def row(tag: str, path: str, title: str, recipe: dict, col: dict, lay: dict) -> dict:
    gpu = GPUS[col["gpu_label"]]
    tp, pp, cp, vp = (_int(lay[k]) for k in ("TP", "PP", "CP", "VP"))
    mbs, dp, ga = int(lay["MBS"]), int(lay["DP"]), int(lay["GA"])
    gbs = mbs * dp * ga
    per_gpu = round(col["tokens_per_s"] / col["gpus"], 1)
    out = dict(
        name=f"dgxc-{recipe['name'].removeprefix('nemo-')}-{gpu}{recipe.get('name_suffix', '')}"
             f"-{col['gpus']}gpu",
        split="out_of_sample_7",
        paper=f"NVIDIA dgxc-benchmarking {path} (release {tag}), BF16 table",
        # no tensor-parallel communication to overlap at tp 1 (NeMo's MegatronCommOverlapCallback
        # turns tp_comm_overlap off below tp 2; zplan's Layout refuses tp_comm without it)
        megatron_overlap=[x for x in recipe["overlap"] if tp > 1 or x != "tp_comm"],
        gpu=gpu, num_gpus=col["gpus"])
    if gpu in CLUSTERS:
        out["cluster"] = CLUSTERS[gpu]
    out.update(
        model=recipe["model"], tp=tp, cp=cp, pp=pp, dp=dp, virtual_stages=vp,
        global_batch=gbs, micro_batch=mbs, recompute=recipe["recompute"],
        sequence_parallel=tp > 1, engine="megatron-core-zero1")
    if "pipeline_split_accounting" in recipe:
        out["pipeline_split_accounting"] = recipe["pipeline_split_accounting"]
    out.update(
        tokens_per_s_per_gpu=per_gpu, iteration_time_s=col["step_s"], mfu=col["mfu_pct"] / 100,
        cross_check=dict(tokens_per_s=col["tokens_per_s"], grad_accum=ga,
                         gbs_printed=int(lay["GBS"]), layers_printed=int(lay["Layers"])),
        counting=COUNTING,
        assumed=recipe["assumed"], checked="stored",
        source=(f"NVIDIA/dgxc-benchmarking {path} at commit {TAGS[tag]} (tag {tag}), table "
                f"'{title}', column {col['gpus']}x {col['gpu_label']}: step {col['step_s']} s, "
                f"{col['tokens_per_s']} tokens/s, MFU {col['mfu_pct']} %; layout from the "
                f"README's {col['gpu_label']} table (GPUs {col['gpus']}, TP {lay['TP']}, PP "
                f"{lay['PP']}, CP {lay['CP']}, VP {lay['VP']}, DP {dp}, MBS {mbs}, GBS "
                f"{lay['GBS']}, GA {ga}); global batch = DP x GA x MBS; static fields as the "
                f"v25.01 rows (benchmarks/data/transcribe_dgxc.py); {recipe['note']}"))
    return out


def main(git_dir: str) -> None:
    rows = []
    for tag, path, title, sel, recipe in TABLES:
        text = readme(git_dir, tag, path)
        for full_title, cols in perf_tables(text, title):
            for col in cols:
                lay = match_layout(layout_rows(text, col["gpu_label"]), col, sel["size"])
                if int(lay["Layers"]) != recipe["model"]["num_layers"]:
                    continue  # a proxy configuration, not the model
                rows.append(row(tag, path, full_title, recipe, col, lay))

    print_rows(rows)


if __name__ == "__main__":
    main(sys.argv[1])
