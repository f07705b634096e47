"""Memory: bytes per GPU, per pipeline stage, per node, for training and inference.

- `model_states`: parameters, gradients and optimizer states under ZeRO 0-3 and offload; buffers.
- `activations`: the saved-tensor inventory of a block, recompute, pipeline in-flight counts.
- `plan`: layout rules and the per-stage / per-node memory plan of one layout.
- `infer`: inference memory (serving engine's account or seed's 20 %) and roofline speed bounds.
- `reserve`: the runtime reserve per GPU (driver, CUDA context, NCCL, cuBLAS, fragmentation) and
  the headroom margin.
- `host`: host memory per GPU (a node's share), --cpu-mem-gib, the ZeRO-Infinity accountings.
"""
