"""Own regression check for sweep speed work (not a test): run `zplan sweep --json` (and `zplan fit`
without a layout) on a handful of cases and write each output, with its wall-clock `seconds` fields
removed, under a directory; diff two such directories (before / after a change) byte for byte.

Usage: python benchmarks/sweep_regression.py OUTDIR
The outputs are the code's own figures: they check that a performance change changed nothing,
never what the figures should be (the differential tests against plan_memory / estimate_step do).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CASES = {
    "gpt3-175b-1024-a100": ["sweep", "-m", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "1024",
                            "--global-batch", "1536", "--top", "30", "--rejected", "20"],
    "gpt-1t-3072-a100": ["sweep", "-m", "gpt-1t", "--gpu", "a100-80gb", "--gpus", "3072",
                         "--global-batch", "3072", "--top", "30", "--rejected", "20"],
    "llama3.1-8b-131k-64h100-cp": ["sweep", "-m", "llama3.1-8b", "--gpu", "h100-sxm", "--gpus", "64",
                                   "--seq-len", "131072", "--global-batch", "64", "--top", "30",
                                   "--rejected", "20"],
    "mixtral-ep-64h100": ["sweep", "-m", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64",
                          "--seq-len", "4096", "--global-batch", "512", "--top", "30",
                          "--rejected", "20"],
    "deepseek-v3-256h100": ["sweep", "-m", "deepseek-v3", "--gpu", "h100-sxm", "--gpus", "256",
                            "--seq-len", "4096", "--global-batch", "1024", "--top", "30",
                            "--rejected", "20"],
    "deepseek-v3-256h100-fp8": ["sweep", "-m", "deepseek-v3", "--gpu", "h100-sxm", "--gpus", "256",
                                "--seq-len", "4096", "--global-batch", "1024", "--precision",
                                "te-fp8", "--top", "30", "--rejected", "20"],
    "zero3-offload-rtx4090": ["sweep", "-m", "llama2-13b", "--gpu", "rtx-4090", "--gpus", "8",
                              "--global-batch", "64", "--top", "30", "--rejected", "20"],
    "zero-infinity-v100": ["sweep", "-m", "gpt3-13b", "--gpu", "v100-32gb", "--gpus", "16",
                           "--global-batch", "128", "--host-accounting", "zero-infinity-paper",
                           "--top", "30", "--rejected", "20"],
    "v100-gpt2xl-multi": ["sweep", "-m", "gpt2-xl", "--gpu", "v100-16gb", "--gpus", "8,16,32",
                          "--global-batch", "256", "--top", "30", "--rejected", "20"],
    "hf-sdpa-llama3-8b": ["sweep", "-m", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "8",
                          "--implementation", "hf-sdpa", "--global-batch", "64",
                          "--top", "30", "--rejected", "20"],
    "llama3-405b-uneven": ["sweep", "-m", "llama3-405b", "--gpu", "h100-sxm", "--gpus", "2048",
                           "--seq-len", "8192", "--global-batch", "2048", "--precision",
                           "megatron-bf16", "--top", "30", "--rejected", "20"],
    "fit-gpt3-175b-1024": ["fit", "-m", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "1024",
                           "--global-batch", "1536", "--json"],
    "fit-llama2-70b-noLayout": ["fit", "-m", "llama2-70b", "--gpu", "a100-80gb", "--gpus", "64", "--json"],
    "fit-mixtral-noLayout": ["fit", "-m", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "16", "--seq-len", "4096", "--json"],
}


def scrub(value):
    """Drop wall-clock fields (`seconds`, `*_seconds` of the run itself)."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in ("seconds", "elapsed_s")}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, args in CASES.items():
        cmd = [sys.executable, "-m", "planner", *args]
        if args[0] == "sweep":
            cmd.append("--json")
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        try:
            text = json.dumps(scrub(json.loads(proc.stdout)), indent=1, sort_keys=True)
        except json.JSONDecodeError:
            text = proc.stdout
        (out / f"{name}.out").write_text(f"exit {proc.returncode}\n{text}\n--stderr--\n{proc.stderr}")
        print(f"{name}: exit {proc.returncode}, {len(proc.stdout)} bytes", flush=True)


if __name__ == "__main__":
    main()
