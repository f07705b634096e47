"""Transcribe the BF16 H100 pretraining tables of NVIDIA/dgxc-benchmarking (release v25.01) into
published_runs.yaml rows (split out_of_sample_5). A one-off tool kept as the record of how the
rows were made: every table number is parsed from the stored README, none typed by hand.

    python benchmarks/data/transcribe_dgxc.py /path/to/dgxc-benchmarking.git > block.yaml

Needs a git copy of github.com/NVIDIA/dgxc-benchmarking (the `search` tool's fetch); not run by
tests. Selection (fixed before any model error on these rows was computed): every column of the
BF16 table of the five Megatron-style (tp > 1 or pp > 1) pretraining recipes below, except the
Llama 3.1 405B "proxy configs" (fewer than 126 layers: "not realistic", the README says).
The static fields (model dimensions, overlaps, recompute) come from the README's own notes and
NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/* at commit 26e42fa9 (the configs
the README links); `assumed` names those the README itself does not state.
"""

from __future__ import annotations

import re
import subprocess
import sys

COMMIT = "143b90dd91f9be958fed4773ae95d941a3356a82"  # tag v25.01 of NVIDIA/dgxc-benchmarking
LAUNCHER = "NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/{} at commit 26e42fa9"
FULL = ["tp_comm", "grad_reduce", "param_gather"]
NEMOTRON = ("config: activation squared-relu (two matrices, evaluated as the non-gated MLP, "
            "mlp: gelu: the same GEMMs), layernorm1p, rope, no bias, untied embeddings, "
            "num_query_groups 8; vocabulary 256,000 from the README's Notes")

RECIPES = {
    "nemotron/README_340b.md": dict(
        name="nemo-nemotron4-340b", config="nemotron/nemotron_340b.yaml",
        model=dict(num_layers=96, hidden_size=18432, num_heads=96, num_kv_heads=8,
                   ffn_hidden_size=73728, vocab_size=256000, seq_len=4096,
                   tied_embeddings=False, mlp="gelu"),
        tp=8, pp=8, cp=1, virtual_stages=12, micro_batch=1, recompute="selective",
        overlap=FULL, note=NEMOTRON,
        assumed=["num_heads", "num_kv_heads", "ffn_hidden_size", "tied_embeddings", "mlp",
                 "recompute", "megatron_overlap", "sequence_parallel"]),
    "nemotron/README_15b.md": dict(
        name="nemo-nemotron4-15b", config="nemotron/nemotron_15b.yaml",
        model=dict(num_layers=32, hidden_size=6144, num_heads=48, num_kv_heads=8,
                   ffn_hidden_size=24576, vocab_size=256000, seq_len=4096,
                   tied_embeddings=False, mlp="gelu"),
        tp=4, pp=1, cp=1, virtual_stages=1, micro_batch=4, recompute="none", overlap=FULL,
        note=NEMOTRON + "; micro-batch 4 as the README's table (the launcher config says 2)",
        assumed=["num_heads", "num_kv_heads", "ffn_hidden_size", "tied_embeddings", "mlp",
                 "recompute", "megatron_overlap", "sequence_parallel"]),
    "nemo_megatron/README_175b.md": dict(
        name="nemo-gpt3-175b", config="gpt3/175b.yaml",
        model=dict(num_layers=96, hidden_size=12288, num_heads=96, vocab_size=51200,
                   seq_len=2048),
        tp=4, pp=8, cp=1, virtual_stages=12, micro_batch=1, recompute="none",
        overlap=["grad_reduce", "param_gather"],
        note="vocabulary 51,200 from the README's Notes (GPT2BPETokenizer); the launcher config "
             "sets ub_tp_comm_overlap False (no tp_comm) and no shared-embedding override (NeMo's "
             "default: tied)",
        assumed=["num_heads", "recompute", "megatron_overlap", "sequence_parallel"]),
    "llama3.1/README_405b.md": dict(
        name="nemo-llama3.1-405b", config="llama/llama3_1_405b.yaml",
        model=dict(num_layers=126, hidden_size=16384, num_heads=128, num_kv_heads=16,
                   ffn_hidden_size=53248, vocab_size=128256, seq_len=8192),
        tp=8, pp=9, cp=2, virtual_stages=7, micro_batch=1, recompute="none", overlap=FULL,
        note="num_query_groups 16 as the launcher config and the README's Notes (16/128) state "
             "(not the released model's 8); the README says the recipe tokenizes with the "
             "GPT2BPETokenizer as a proxy while its Notes and the config count 128,256: 128,256 "
             "assumed; SwiGLU (fast-swiglu), rope, untied as the config",
        assumed=["vocab_size", "recompute", "megatron_overlap", "sequence_parallel"]),
    "llama3.1/README_70b.md": dict(
        name="nemo-llama3.1-70b", config="llama/llama3_1_70b.yaml",
        model=dict(num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                   ffn_hidden_size=28672, vocab_size=128256, seq_len=8192),
        tp=4, pp=4, cp=2, virtual_stages=5, micro_batch=1, recompute="none", overlap=FULL,
        note="VP 5 as the README's table (the launcher config says 10); Llama 3 tokenizer "
             "(128,256)",
        assumed=["recompute", "megatron_overlap", "sequence_parallel"]),
}


def readme(git_dir: str, path: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{COMMIT}:{path}"],
                          check=True, capture_output=True, text=True).stdout


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def bf16_table(text: str) -> dict[str, list[str]]:
    """The BF16 table: {row label: cells}, with 'header' the column headers."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|") and "BF16" in ln)
    table = {"header": cells(lines[start])}
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        row = cells(ln)
        table[row[0]] = row[1:]
    return table


def columns(table: dict[str, list[str]], num_layers: int) -> list[dict]:
    """One dict per column (GPUs, GBS, step time, tokens/s), skipping the columns whose 'Layers'
    row (where the table has one) is not the full model's: the proxy configs."""
    out = []
    for i, head in enumerate(table["header"][1:]):
        if "Layers" in table and int(table["Layers"][i]) != num_layers:
            continue
        gpus = int(re.search(r"(\d+)x H100", head).group(1))
        gbs = re.search(r"GBS=(\d+)", head)
        col = dict(gpus=gpus,
                   gbs=int(gbs.group(1)) if gbs else int(table["GBS"][i]),
                   step_s=float(table["Training step time (seconds per step)"][i]),
                   tokens_per_s=int(table["Throughput in tokens per second"][i]))
        out.append(col)
    return out


def row(path: str, title: str, recipe: dict, col: dict) -> dict:
    tp, pp, cp, mbs = recipe["tp"], recipe["pp"], recipe["cp"], recipe["micro_batch"]
    dp = col["gpus"] // (tp * pp * cp)
    per_gpu = round(col["tokens_per_s"] / col["gpus"], 1)
    m = recipe["model"]
    return dict(
        name=f"{recipe['name']}-{col['gpus']}gpu",
        split="out_of_sample_5",
        paper=f"NVIDIA dgxc-benchmarking {path} (release v25.01), BF16 table",
        megatron_overlap=recipe["overlap"],
        gpu="h100-sxm", num_gpus=col["gpus"], model=m, tp=tp, cp=cp, pp=pp, dp=dp,
        virtual_stages=recipe["virtual_stages"], global_batch=col["gbs"], micro_batch=mbs,
        recompute=recipe["recompute"], sequence_parallel=True, engine="megatron-core-zero1",
        tokens_per_s_per_gpu=per_gpu, iteration_time_s=col["step_s"],
        cross_check=dict(tokens_per_s=col["tokens_per_s"],
                         grad_accum=col["gbs"] // (dp * mbs)),
        counting=COUNTING,
        assumed=recipe["assumed"], checked="stored",
        source=(f"NVIDIA/dgxc-benchmarking {path} at commit {COMMIT} (tag v25.01), table "
                f"'{title}', column {col['gpus']}x H100 (GBS={col['gbs']}): step "
                f"{col['step_s']} s, {col['tokens_per_s']} tokens/s; layout from the table "
                f"title and the README's 'maintain these values' list; model dimensions from "
                f"the README's Notes and {LAUNCHER.format(recipe['config'])} (recompute, "
                f"sequence parallelism, overlaps: that config; DGX H100, NeMo container); "
                f"{recipe['note']}"),
    )


COUNTING = ("table row 'Throughput in tokens per second' (= sequence x GBS / step time, "
            "the README's formula) / GPUs")
"""How every dgxc-benchmarking row's tokens_per_s_per_gpu is read (both transcription scripts)."""


def print_rows(rows: list[dict]) -> None:
    """The rows as a YAML block on stdout, every row written out in full (no anchors)."""
    import yaml

    class NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    print(yaml.dump(rows, Dumper=NoAliases, sort_keys=False, width=100, allow_unicode=True),
          end="")


def main(git_dir: str) -> None:
    rows = []
    for path, recipe in RECIPES.items():
        table = bf16_table(readme(git_dir, path))
        for col in columns(table, recipe["model"]["num_layers"]):
            rows.append(row(path, table["header"][0], recipe, col))
    print_rows(rows)


if __name__ == "__main__":
    main(sys.argv[1])
