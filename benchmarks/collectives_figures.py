"""Collective times per level and message size, and the ZeRO-3 communication floor (figures only).

    python benchmarks/collectives_figures.py

Hardware from the shipped profiles (dgx-a100 node, dgx-a100x128 network); formulas from
planner/timing/collectives.py and sharded_dp.py (docs/collectives.md). Phase 1 of issue 10:
these are the new pieces on their own, not yet the step model, and no published row's error is
computed here.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.io.loading import load_cluster  # noqa: E402
from planner.timing import collectives as col  # noqa: E402
from planner.timing import sharded_dp as sdp  # noqa: E402

US = 1e-6


def levels(cluster):
    node = cluster.node
    nic = col.nic_share_bytes_per_s(cluster.inter_node_bytes_per_s, node.gpus_per_node)
    return (node.intra_node_bytes_per_s, node.intra_node_latency_us * US, nic,
            cluster.inter_node_latency_us * US)


def message_table(cluster) -> None:
    lv = levels(cluster)
    g = cluster.node.gpus_per_node
    print(f"{cluster.name}: NVLink {lv[0] / 1e9:.0f} GB/s, NIC share {lv[2] / 1e9:.0f} GB/s per GPU")
    print(f"{'collective':<14} {'size':>7} {'nodes':>5} {'flat ring ms':>12} {'hierarch. ms':>12} "
          f"{'NCCL AR ms':>10}")
    for coll in ("all_gather", "all_reduce"):
        for size in (1e6, 64e6, 1e9):
            for nodes in (1, 4, 32, 128):
                flat = col.flat_ring_s(coll, size, g, nodes, *lv)
                hier = col.hierarchical_s(coll, size, g, nodes, *lv)
                ar = col.nccl_all_reduce_s(size, g, nodes, *lv) if coll == "all_reduce" else float("nan")
                print(f"{coll:<14} {size / 1e6:>5.0f}MB {nodes:>5} {1e3 * flat:>12.3f} "
                      f"{1e3 * hier:>12.3f} {1e3 * ar:>10.3f}")


def zero3_floor(cluster) -> None:
    """GPT-3 175B, ZeRO-3 at tp 1, global batch 1536 x 2048 tokens, micro-batch = 1536 / GPUs."""
    h, layers, s, batch = 12288, 96, 2048, 1536
    lv = levels(cluster)
    gpu = cluster.gpu
    rate = gpu.peak_flops_per_s("bf16") * gpu.achieved_efficiency
    layer_bytes = 12 * h * h * 2
    print(f"\nGPT-3 175B ZeRO-3 tp 1, batch {batch}: matmul at {gpu.name} achieved_efficiency "
          f"{gpu.achieved_efficiency}, attention + 24·h²·s per layer-sequence forward")
    print(f"{'GPUs':>5} {'b':>2} {'gather ms':>9} {'prefetch f':>10} {'step s':>7} {'exposed s':>9} "
          f"{'step x2 GPUs':>12} {'FSDP2 step s':>12}")
    prev = None
    for gpus in (384, 768, 1536):
        b = batch // gpus
        a = float(col.flat_ring_s("all_gather", layer_bytes, 8, gpus // 8, *lv))
        fwd = b * (24 * h * h * s + 4 * s * s * h) / rate
        f = float(sdp.deepspeed_prefetch_fraction(12 * h * h, 5e7, 1e9))
        z = sdp.zero3_step(a, a, fwd, 2 * fwd, layers, 1, f)
        fs = sdp.fsdp2_step(a, a, fwd, 2 * fwd, layers, 1)
        ratio = "" if prev is None else f"{float(z.step_s) / prev:.2f}"
        print(f"{gpus:>5} {b:>2} {1e3 * a:>9.2f} {f:>10.2f} {float(z.step_s):>7.2f} "
              f"{float(z.exposed_s):>9.2f} {ratio:>12} {float(fs.step_s):>12.2f}")
        prev = float(z.step_s)


def main() -> None:
    cluster = load_cluster("dgx-a100x128")
    message_table(cluster)
    zero3_floor(cluster)


if __name__ == "__main__":
    main()
