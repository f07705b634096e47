"""Collective communication time from first principles: bytes per GPU, per network level, α–β.

Every function is pure and works on Python scalars and numpy arrays alike (broadcasting), so the
sweep can call it on candidate arrays. Units: bytes, seconds, bytes/s. Sources (docs/collectives.md):

- Bytes each GPU moves (bus-bandwidth factors): NVIDIA/nccl-tests doc/PERFORMANCE.md
  (commit a0b82b22): all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n of the full
  array size S (S = per-rank count x n for the last two).
- Latency per algorithm step: NVIDIA/nccl src/graph/tuning.cc (commit 5067397c): ring steps
  nsteps = 2(n-1) for all-reduce, n-1 for all-gather / reduce-scatter; of those, the steps that
  cross a node boundary (2(N-1) resp. N-1 for N nodes) pay the network latency and the others
  the intra-node (NVLink) latency; a tree all-reduce pays 2((g-1)·α_intra + log2(N)·α_inter);
  time = latency + bytes / bus bandwidth (`ncclTopoGetAlgoTime`). The per-step latencies come
  from the node and cluster profiles (`intra_node_latency_us`, `inter_node_latency_us`), the
  per-collective base latency is NCCL's constant below.
- Bandwidth a GPU has at each level: NVLink/NVSwitch per GPU per direction
  (`NodeSpec.intra_node_gb_per_s`); across nodes, its share of the node's NICs
  (`ClusterSpec.inter_node_gb_per_s / gpus_per_node` on a rail-optimised fabric, divided by the
  spine's oversubscription otherwise).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]

NCCL_BASE_LATENCY_S = {"ring": 8.4e-6, "tree": 8.4e-6}
"""NCCL's per-collective base latency, Simple protocol (large messages): tuning.cc
`baseLatencies` {Tree, Ring} x {LL, LL128, Simple} = {6.8, 14.0, 8.4}, {6.6, 14.0, 8.4} us
(NVIDIA/nccl commit 5067397c). A library constant, not a hardware number."""

NCCL_TREE_BANDWIDTH_FACTOR = 0.92
"""tuning.cc: `if (a == NCCL_ALGO_TREE && coll == ncclFuncAllReduce) busBw = min(busBw * .92, ...)`
(commit 5067397c): NCCL's own model of the tree all-reduce's bandwidth loss."""


def bus_factor(collective: Collective, n):
    """Bytes each GPU sends per byte of the full array S (nccl-tests PERFORMANCE.md):
    all-reduce 2(n-1)/n; all-gather, reduce-scatter and all-to-all (n-1)/n; send/recv 1."""
    n = np.asarray(n, dtype=float)
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "send_recv":
        return np.ones_like(n)
    raise ValueError(f"collective must be one of {Collective.__args__}, got {collective!r}")


def bytes_per_gpu(collective: Collective, size_bytes, n):
    """Bytes each of the n GPUs sends (and receives) for a collective over an S-byte array."""
    return bus_factor(collective, n) * np.asarray(size_bytes, dtype=float)


def ring_steps(collective: Collective, n):
    """Algorithm steps of a ring (tuning.cc nsteps): 2(n-1) all-reduce, n-1 all-gather /
    reduce-scatter; all-to-all is n-1 concurrent peer exchanges counted as one step; send/recv 1."""
    n = np.asarray(n, dtype=float)
    if collective == "all_reduce":
        return 2 * (n - 1)
    if collective in ("all_gather", "reduce_scatter"):
        return n - 1
    if collective in ("all_to_all", "send_recv"):
        return np.ones_like(n)
    raise ValueError(f"collective must be one of {Collective.__args__}, got {collective!r}")


def nic_share_bytes_per_s(node_nic_bytes_per_s, gpus_per_node, rail_optimised: bool = True,
                          spine_oversubscription=1.0):
    """Network bandwidth one GPU has: its share of the node's NICs. On a rail-optimised fabric
    GPU i's NIC sits on leaf (rail) i and same-rail traffic takes one switch hop (NVIDIA DGX
    SuperPOD reference architecture); otherwise traffic crosses the spine and shares its
    oversubscription (1.0 = non-blocking fat tree)."""
    share = np.asarray(node_nic_bytes_per_s, dtype=float) / gpus_per_node
    return share if rail_optimised else share / np.asarray(spine_oversubscription, dtype=float)


def alpha_beta_s(bytes_moved, bytes_per_s, steps, step_latency_s, base_latency_s=0.0):
    """α–β time (NCCL's `ncclTopoGetAlgoTime`): base + steps · α + bytes / bandwidth."""
    return base_latency_s + steps * np.asarray(step_latency_s, dtype=float) \
        + np.asarray(bytes_moved, dtype=float) / bytes_per_s


def single_level_ring_s(collective: Collective, size_bytes, n, bytes_per_s, step_latency_s):
    """A ring over n GPUs that all sit on one level (one node's NVLink, or one GPU per node on
    the network). n = 1 costs nothing."""
    t = alpha_beta_s(bytes_per_gpu(collective, size_bytes, n), bytes_per_s,
                     ring_steps(collective, n), step_latency_s, NCCL_BASE_LATENCY_S["ring"])
    return np.where(np.asarray(n) > 1, t, 0.0)


def flat_ring_s(collective: Collective, size_bytes, gpus_per_node, num_nodes, intra_bytes_per_s,
                intra_latency_s, nic_bytes_per_s, inter_latency_s):
    """NCCL's ring over g GPUs per node on N nodes (n = g·N), all-reduce / all-gather /
    reduce-scatter. Bus bandwidth is the slowest link of the ring: NVLink, or the g NICs the
    group's rings leave each node through (each ring crosses each node boundary once, one ring
    per NIC): min(intra, g · nic share). Latency: the 2(N-1) resp. N-1 boundary-crossing steps
    at the network latency, the rest at the NVLink latency (tuning.cc)."""
    g = np.asarray(gpus_per_node, dtype=float)
    nodes = np.asarray(num_nodes, dtype=float)
    n = g * nodes
    steps = ring_steps(collective, n)
    inter_steps = np.where(nodes > 1, ring_steps(collective, nodes), 0.0)
    bus_bw = np.where(nodes > 1, np.minimum(intra_bytes_per_s, g * nic_bytes_per_s),
                      intra_bytes_per_s)
    latency = NCCL_BASE_LATENCY_S["ring"] + (steps - inter_steps) * intra_latency_s \
        + inter_steps * inter_latency_s
    t = latency + bytes_per_gpu(collective, size_bytes, n) / bus_bw
    return np.where(n > 1, t, 0.0)


def tree_all_reduce_s(size_bytes, gpus_per_node, num_nodes, intra_bytes_per_s, intra_latency_s,
                      nic_bytes_per_s, inter_latency_s):
    """NCCL's tree all-reduce (chain inside the node, double binary tree across nodes):
    latency 2((g-1)·α_intra + ceil(log2 N)·α_inter), bandwidth the ring's x 0.92 (tuning.cc)."""
    g = np.asarray(gpus_per_node, dtype=float)
    nodes = np.asarray(num_nodes, dtype=float)
    n = g * nodes
    bus_bw = np.where(nodes > 1, np.minimum(intra_bytes_per_s, g * nic_bytes_per_s),
                      intra_bytes_per_s) * NCCL_TREE_BANDWIDTH_FACTOR
    depth = np.ceil(np.log2(np.maximum(nodes, 1.0)))
    latency = NCCL_BASE_LATENCY_S["tree"] + 2 * ((g - 1) * intra_latency_s + depth * inter_latency_s)
    t = latency + bytes_per_gpu("all_reduce", size_bytes, n) / bus_bw
    return np.where(n > 1, t, 0.0)


def nccl_all_reduce_s(size_bytes, gpus_per_node, num_nodes, intra_bytes_per_s, intra_latency_s,
                      nic_bytes_per_s, inter_latency_s):
    """NCCL picks the faster of ring and tree for each message size (tuning.cc selects the
    algorithm with the smallest modelled time)."""
    args = (size_bytes, gpus_per_node, num_nodes, intra_bytes_per_s, intra_latency_s,
            nic_bytes_per_s, inter_latency_s)
    return np.minimum(flat_ring_s("all_reduce", *args), tree_all_reduce_s(*args))


def hierarchical_s(collective: Collective, size_bytes, gpus_per_node, num_nodes,
                   intra_bytes_per_s, intra_latency_s, nic_bytes_per_s, inter_latency_s):
    """Two-level schedule (intra-node then inter-node rings, as in torch HSDP or NCCL's
    2D algorithms): the network phase moves only 1/g of the array per GPU, each GPU on its own
    rail; the phases run one after the other.
    all-gather: network all-gather of S/g over N nodes, then NVLink all-gather of S over g;
    reduce-scatter: the reverse; all-reduce: NVLink reduce-scatter, network all-reduce of S/g,
    NVLink all-gather."""
    s = np.asarray(size_bytes, dtype=float)
    g = np.asarray(gpus_per_node, dtype=float)

    def intra(c):
        return single_level_ring_s(c, s, g, intra_bytes_per_s, intra_latency_s)

    def inter(c):
        return single_level_ring_s(c, s / g, num_nodes, nic_bytes_per_s, inter_latency_s)

    if collective == "all_gather":
        return inter("all_gather") + intra("all_gather")
    if collective == "reduce_scatter":
        return intra("reduce_scatter") + inter("reduce_scatter")
    if collective == "all_reduce":
        return intra("reduce_scatter") + inter("all_reduce") + intra("all_gather")
    raise ValueError(f"hierarchical schedule is for all_reduce/all_gather/reduce_scatter, got {collective!r}")


def all_to_all_s(size_bytes, gpus_per_node, num_nodes, intra_bytes_per_s, intra_latency_s,
                 nic_bytes_per_s, inter_latency_s):
    """All-to-all as NCCL implements it (grouped ncclSend/ncclRecv to every peer, concurrently):
    of the (n-1)/n·S bytes a GPU sends, (g-1)/n·S go over NVLink and (n-g)/n·S over its NIC
    share; the two run in parallel, the slower one plus one step latency is the time."""
    s = np.asarray(size_bytes, dtype=float)
    g = np.asarray(gpus_per_node, dtype=float)
    n = g * np.asarray(num_nodes, dtype=float)
    intra_t = (g - 1) / n * s / intra_bytes_per_s + intra_latency_s
    inter_t = np.where(n > g, (n - g) / n * s / nic_bytes_per_s + inter_latency_s, 0.0)
    t = NCCL_BASE_LATENCY_S["ring"] + np.maximum(intra_t, inter_t)
    return np.where(n > 1, t, 0.0)


def send_recv_s(size_bytes, bytes_per_s, latency_s):
    """Point-to-point: one message of S bytes, one latency (pipeline stage boundaries)."""
    return alpha_beta_s(size_bytes, bytes_per_s, 1.0, latency_s)


def qkv_gather_s(qkv_bytes, tp, kv_heads, passes, bytes_per_s, step_latency_s):
    """The all-gather of the fused QKV output over the tp group when tp is wider than the kv
    heads, one layer and one micro-batch: `passes` ring collectives over the S = `qkv_bytes`
    array (s·b·(a + 2kv)·head_dim·bytes, the whole gathered output), each (tp-1)/tp·S on the
    tp link in tp-1 steps; 0 where tp <= kv_heads. Megatron-LM attention.py
    `get_query_key_value_tensors` (commit d98e8a64) calls
    `all_gather_last_dim_from_tensor_parallel_region`, whose backward is the reduce-scatter of
    the same array (tensor_parallel/mappings.py `_AllGatherFromTensorParallelRegion`), so a
    layer pays one all-gather per forward pass (two under full recompute) and one
    reduce-scatter in backward, the same ring time each."""
    one = single_level_ring_s("all_gather", qkv_bytes, tp, bytes_per_s, step_latency_s)
    return np.where(np.asarray(tp) > kv_heads, np.asarray(passes, dtype=float) * one, 0.0)
