"""What `zplan sweep --recompute-num-layers auto` costs and finds (issue 10, "recompute just
enough"): per case, the default space against the space with block recompute searched at every
depth, layouts evaluated, sweep() CPU time (median of 5, one core) and the best layout.

    python benchmarks/sweep_depth_search.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.io import loading  # noqa: E402
from planner.io.jobfile import make_setup  # noqa: E402
from planner.search import sweep  # noqa: E402

CASES = [  # (model, gpu, GPUs, sequence, global batch)
    ("gpt3-175b", "a100-80gb", 1024, 2048, 1536),
    ("llama3-70b", "a100-80gb", 64, 8192, 64),
    ("llama3-405b", "a100-80gb", 128, 8192, 128),
]
AUTO = sweep.Constraints(recompute=sweep.PINNABLE_RECOMPUTE, recompute_num_layers=sweep.AUTO_DEPTH)


def _timed(model, cluster, setup, c):
    times, result = [], None
    for _ in range(5):
        start = time.process_time()
        result = sweep.sweep(model, cluster, setup, c, top=1, rejected=0)
        times.append(time.process_time() - start)
    return result, statistics.median(times)


def _label(result) -> str:
    if not result.top:
        return "nothing fits"
    row = result.top[0]
    lay = row.layout
    rec = lay.recompute + (f":{lay.recompute_num_layers}" if lay.recompute == "block" else "")
    return (f"tp {lay.tp} pp {lay.pp} dp {lay.dp} v {lay.virtual_stages} z{lay.zero_stage} "
            f"{lay.dp_engine} off {lay.offload_optimizer}/{lay.offload_params} rc {rec} "
            f"mb {lay.micro_batch}: {row.estimate.step_s:.2f} s")


def main() -> None:
    for name, gpu, gpus, seq, batch in CASES:
        model, cluster = loading.load_model(name), loading.cluster_for_gpus(gpu, gpus)
        setup = make_setup(seq, batch, 1e12)
        print(f"{name} on {gpus} x {gpu}, seq {seq}, global batch {batch}")
        for label, c in (("default", sweep.Constraints()), ("auto", AUTO)):
            result, cpu_s = _timed(model, cluster, setup, c)
            print(f"  {label:8s} {result.evaluated:9,d} layouts  sweep() {cpu_s * 1e3:7.1f} ms CPU  "
                  f"best: {_label(result)}")


if __name__ == "__main__":
    main()
