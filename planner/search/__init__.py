"""Search: enumerate layouts, evaluate them all at once, rank them.

- `sweep`: every valid layout of a cluster, evaluated over numpy arrays, ranked, with reasons
  for the rejected ones.
- `strategies`: the minimum GPU count of each memory strategy (DDP, ZeRO-1/2/3, offload, 3D).
- `fitting`: what `zplan fit` and `zplan show` compute, as data.
- `heap`: glibc malloc settings `sweep` applies once per process (freed column memory reused).
"""
