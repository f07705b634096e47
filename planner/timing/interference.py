"""Compute/communication interference: an overlapped NCCL collective takes SMs from the GEMMs.

NCCL runs every collective as a CUDA kernel of one CTA (thread block) per channel, resident on
its SM for the whole collective (NVIDIA/nccl src/enqueue.cc line 1758 at commit 5067397c:
`dim3 grid = {(unsigned)nChannels, 1, 1}`; MAXCHANNELS 64, src/include/device.h). While it runs, a GEMM on
another stream can use only the other SMs. Measured (NVIDIA developer forum, "Compute-
Communication Overlap Causes Severe GEMM Performance Degradation because of Tail Effect",
thread 337991, Nsight Systems on an H100 with 132 SMs under FSDP-style prefetch): the
`ncclAllGather` kernel held 24 CTAs; a one-wave GEMM of 132 blocks then needed a second wave and
took nearly twice as long (80 % -> 47 % MFU).

The model (named approximation): while a collective overlaps compute, compute proceeds at
(1 - k) of its rate, k = NCCL's CTAs / the GPU's SMs (the SM share lost; the forum's wave-
quantised worst case is larger, many-wave GEMMs lose about k). For a collective of a seconds
overlapping c seconds of compute that starts with it, compute ends at c + k·a if the collective
ends first, else the collective ends last at a:
    T = max(a, c + k·a)        exposed = T - c = max(a - c, k·a).
k = 0 when the GPU profile has no `sm_count` (no interference modelled). HBM-bandwidth
contention of the collective's copies is not modelled.
"""

from __future__ import annotations

import numpy as np

NCCL_COLLECTIVE_CTAS = 24
"""CTAs (one per channel) an inter-node NCCL ring collective occupies: 24 measured for
ncclAllGather on an H100 node (forum thread 337991, Nsight Systems; the companion thread 339078
reports the same 24). NCCL's channel count depends on the node's topology and NCCL version
(bounded by NCCL_MIN_CTAS / NCCL_MAX_CTAS); one figure for every node is a named approximation."""


def sm_share_lost(sm_count: int | None, nccl_ctas: int = NCCL_COLLECTIVE_CTAS) -> float:
    """k: the fraction of the GPU's SMs a running collective holds (0 when sm_count is unknown)."""
    if not sm_count:
        return 0.0
    return min(nccl_ctas / sm_count, 1.0)


def overlapped_exposed_s(comm_s, window_s, interference, floor_s=0.0):
    """Communication time not hidden behind `window_s` of compute, with interference k: the
    `floor_s` part runs after compute (exposed whole, no overlap), the rest overlaps and costs
    max(rest - window, k·rest) (module docstring). k = 0 is plain overlap."""
    comm = np.asarray(comm_s, dtype=float)
    floor = np.minimum(floor_s, comm)
    rest = comm - floor
    return np.maximum(comm - window_s, floor + np.asarray(interference) * rest)
