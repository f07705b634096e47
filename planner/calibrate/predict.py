"""Predict a training step's time from the measured parts, nothing fitted on the step itself.

The model's operations come from running its forward and backward once on the `meta` device
(shapes, no data, no time) under a dispatch mode that records every aten op:
- `mm` / `addmm` / `bmm` / `baddbmm`: a GEMM of the real shape, timed from the measured
  efficiency-by-shape table through the planner's own formula (`planner.timing.gemm.
  efficiency_from_points`: interpolation in arithmetic intensity, capped by the roofline at the
  measured copy bandwidth), so the predictor checks the formula `fit` and `sweep` use;
- ops returning a view of an input (`t`, `view`, `expand`, ...) and empty allocations: the
  measured dispatch cost of one aliasing op;
- every other op: bytes read + written timed on the measured curve of its kind (`copy`, `norm`,
  `softmax`, `log_softmax` and its backward (the loss), `reduction`, `transcendental` (GELU,
  exp, rsqrt...), `random` (dropout's draw), else `elementwise`): memory-bound on a GPU; on a
  CPU `transcendental`, `random` and the log-softmax pair are bound by arithmetic, which their
  own curves measure.
Communication is the fitted α–β of each collective the engine issues (below), the optimizer the
fitted Adam time of this rank's tensors and elements. Terms add up: on a CPU, gloo's threads run
on the cores the compute uses, so nothing is counted as overlapped (an assumption, stated).
Contention: with N ranks on a node, compute and the optimizer are slowed by the measured
per-rank slowdown of N ranks at once (`HardwareParts.slowdown`, planner.calibrate.contention):
forward and backward by the fixed probe model's (`block`; parts files from before it: GEMMs by
the GEMM probe's, each memory-bound op by the copy probe's at its bytes, dispatch by the
dispatch probe's); the engines' copies and the optimizer step, where the ranks stream memory in
lockstep, by the copy probe's at their bytes; on NCCL the share of compute overlapped by
collectives at the with-collective slowdown (`overlap_share`).

Engines, as torch 2.13 implements them:
- DDP (torch/nn/parallel/distributed.py): gradients all-reduced in buckets of
  `bucket_cap_mb` = 25 MiB, the first one `dist._DEFAULT_FIRST_BUCKET_BYTES` = 1 MiB, in
  reverse parameter order; each gradient copied into its bucket and back (2 copies);
- ZeRO-1 (torch/distributed/optim/zero_redundancy_optimizer.py): DDP's all-reduce, Adam on
  this rank's partition (parameters assigned whole, greedily by size), then every parameter
  broadcast from its owner (one broadcast per tensor, timed as a send/recv of its bytes);
- FSDP2 (torch/distributed/fsdp/_fully_shard): per block an all-gather before forward and
  again before backward (`reshard_after_forward=True`), a reduce-scatter of its gradients; the
  root (embeddings, final norm) gathered once (the root is not resharded after forward); its
  copies (all-gather copy-in and copy-out, reduce-scatter copy-in, casts) with the bytes of
  torch 2.13's code and its four hooks per group at the measured per-hook overhead
  (planner.calibrate.fsdp2_overhead); or, when the parts hold it, FSDP2's per-group cost as
  FSDP2 calls its collectives (planner.calibrate.fsdp2_collectives: collectives, copies, hooks
  and waits measured together) in place of all three.
Each memory-bound op's curve time is multiplied by the reuse part's factor at its bytes and its
inputs' reuse distance in the recorded op order (planner.calibrate.reuse): the curves time
cache-resident operands, the step's were produced megabytes of traffic earlier.
GEMMs measured at the step's own shapes and layouts (planner.calibrate.shape_gemms) replace the
table for those calls; Python + autograd per recorded op (planner.calibrate.dispatch) adds
`dispatch_per_op_s` x the op count to the dispatch term.
Page faults (CPU hosts, planner.calibrate.page_faults): the pages forward + backward take fresh
from the kernel, counted by replaying the step's allocation trace through the host's allocator,
times the measured cost of one (`page_fault_s`, slowed with the other ranks as forward and
backward are).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from planner.calibrate.dispatch import op_count
from planner.calibrate.fsdp2_collectives import group_elements, shapes_key
from planner.calibrate.fsdp2_overhead import hooks_per_step, step_copies
from planner.calibrate.models import build_model
from planner.calibrate.page_faults import step_faults
from planner.calibrate.parts import HardwareParts
from planner.calibrate.reuse import OpTouch, cyclic_distances, op_distance
from planner.calibrate.shape_gemms import GemmCall, call_of, lookup, seconds_by_call
from planner.core.spec import Frozen, ModelSpec
from planner.timing.gemm import efficiency_from_points, gemm_flops

Strategy = Literal["single", "ddp", "zero1", "fsdp2"]
GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm"}
COPY_OPS = {"copy_", "_to_copy", "clone", "cat", "index_select", "embedding", "gather", "scatter_add"}
NORM_OPS = {"native_layer_norm", "native_layer_norm_backward"}
SOFTMAX_OPS = {"_softmax", "_softmax_backward_data"}
LOG_SOFTMAX_OPS = {"_log_softmax": "log_softmax", "_log_softmax_backward_data": "log_softmax_backward"}
TRANSCENDENTAL_OPS = {"gelu", "gelu_backward", "tanh", "tanh_backward", "exp", "log", "erf", "rsqrt",
                      "sqrt", "pow", "sigmoid", "silu", "silu_backward", "sin", "cos"}
RANDOM_OPS = {"bernoulli_", "bernoulli", "native_dropout", "uniform_", "normal_"}
REDUCTION_OPS = {"sum", "mean", "amax", "max", "var", "var_mean", "norm", "nll_loss_forward"}
DDP_BUCKET_BYTES = 25 * 2**20  # torch/nn/parallel/distributed.py bucket_cap_mb default
DDP_FIRST_BUCKET_BYTES = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


class StepConfig(Frozen):
    """One training configuration to predict and measure."""

    name: str
    model: ModelSpec
    seq_len: int
    micro_batch: int
    strategy: Strategy
    nproc: int


class Inventory(Frozen):
    """The ops of one forward + backward on one rank."""

    gemms: tuple[tuple[int, int, int, int], ...]
    """(batch, m, n, k) per GEMM call."""
    kernels: tuple[tuple[str, int], ...]
    """(kind, bytes read + written) per memory-bound op."""
    views: int
    """Aliasing ops and empty allocations."""
    gemm_calls: tuple[GemmCall, ...] = ()
    """The GEMMs again with their op and operand layouts (planner.calibrate.shape_gemms)."""
    kernel_reads: tuple[tuple[tuple[int, int | None], ...], ...] = ()
    """Per memory-bound op (aligned with `kernels`): (bytes, reuse distance in bytes) per input
    storage, the step repeating (planner.calibrate.reuse.cyclic_distances; None only in an
    inventory built without the loop)."""


class Prediction(Frozen):
    """Predicted seconds per term of one step. `gemm_s`, `memory_bound_s`, `dispatch_s` are one
    rank alone; `compute_contention_s` is what the other ranks computing at once add to them
    (planner.calibrate.contention); `optimizer_s` includes `optimizer_contention_s`."""

    gemm_s: float
    memory_bound_s: float
    dispatch_s: float
    communication_s: float
    optimizer_s: float
    compute_contention_s: float = 0.0
    optimizer_contention_s: float = 0.0
    page_fault_s: float = 0.0
    """CPU hosts: forward + backward's first touches of pages the allocator took from the kernel
    (planner.calibrate.page_faults), one rank alone; `compute_contention_s` holds its share of
    the other ranks' slowdown."""

    @property
    def compute_s(self) -> float:
        return self.gemm_s + self.memory_bound_s + self.dispatch_s + self.page_fault_s + self.compute_contention_s

    @property
    def step_s(self) -> float:
        return self.compute_s + self.communication_s + self.optimizer_s


def _tensors(tree) -> Iterator[torch.Tensor]:
    return (t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor))


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _is_view(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


class OpRecorder(TorchDispatchMode):
    """Records each aten op's shape class while the meta forward / backward runs."""

    def __init__(self) -> None:
        super().__init__()
        self.gemms: list[tuple[int, int, int, int]] = []
        self.calls: list[GemmCall] = []
        self.kernels: list[tuple[str, int]] = []
        self.views = 0
        self.touches: list[OpTouch] = []
        """Every GEMM and memory-bound op in order, with the storages it reads and writes."""
        self.kernel_index: list[int] = []
        """Position in `touches` of each memory-bound op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[-1]
        if name in GEMM_OPS:
            call = call_of(name, args)
            self.calls.append(call)
            self.gemms.append((call.batch, call.m, call.n, call.k))
            self.touches.append(_touch((args, kwargs), out))
        elif _is_view(func) or name.startswith("empty") or name in ("detach", "lift_fresh"):
            self.views += 1
        else:
            moved = _nbytes(_tensors((args, kwargs))) + _nbytes(_tensors(out))
            self.kernels.append((_kind(name), moved))
            self.kernel_index.append(len(self.touches))
            self.touches.append(_touch((args, kwargs), out))
        return out

    def kernel_reads(self, between_steps_bytes: int) -> tuple[tuple[tuple[int, int | None], ...], ...]:
        """(bytes, reuse distance) per input of each memory-bound op, in `kernels` order, the
        step repeating with `between_steps_bytes` of optimizer traffic between (reuse.cyclic_distances)."""
        distances = cyclic_distances(self.touches, between_steps_bytes)
        return tuple(tuple((b, d) for (_, b), d in zip(self.touches[i].reads, distances[i], strict=True))
                     for i in self.kernel_index)


def _storages(tree) -> tuple[tuple[int, int], ...]:
    """(storage key, bytes) per distinct storage among the tensors of `tree` (views of one
    storage counted once, at the largest)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    found: dict[int, int] = {}
    for t in _tensors(tree):
        key = StorageWeakRef(t.untyped_storage()).cdata
        found[key] = max(found.get(key, 0), t.numel() * t.element_size())
    return tuple(found.items())


def _touch(inputs, out) -> OpTouch:
    return OpTouch(reads=_storages(inputs), writes=_storages(out))


def _kind(name: str) -> str:
    if name in COPY_OPS:
        return "copy"
    if name in NORM_OPS:
        return "norm"
    if name in SOFTMAX_OPS:
        return "softmax"
    if name in LOG_SOFTMAX_OPS:
        return LOG_SOFTMAX_OPS[name]
    if name in TRANSCENDENTAL_OPS:
        return "transcendental"
    if name in RANDOM_OPS:
        return "random"
    if name in REDUCTION_OPS:
        return "reduction"
    return "elementwise"


def inventory(model: ModelSpec, seq_len: int, micro_batch: int) -> Inventory:
    """Forward + backward of `model` on `micro_batch` sequences, on the meta device."""
    torch.manual_seed(0)
    net = build_model(model, seq_len).to("meta")
    tokens = torch.randint(0, model.vocab_size, (micro_batch, seq_len), device="meta")
    recorder = OpRecorder()
    with recorder:
        net(tokens, tokens).backward()
    adam_bytes = ADAM_BYTES_PER_ELEMENT * sum(p.numel() for p in net.parameters())
    return Inventory(gemms=tuple(recorder.gemms), kernels=tuple(recorder.kernels), views=recorder.views,
                     gemm_calls=tuple(recorder.calls), kernel_reads=recorder.kernel_reads(adam_bytes))


def compute_seconds(inv: Inventory, parts: HardwareParts, dtype: str = "fp32", ranks: int = 1,
                    with_collective: bool = False) -> tuple[float, float, float]:
    """(GEMM, memory-bound, dispatch) seconds of the inventory on the measured parts with `ranks`
    ranks computing at once (1: alone). With a `block` contention point (the fixed probe model's
    forward + backward, planner.calibrate.contention) every term is timed at that one slowdown;
    older parts files without it: each term at its own kind's (GEMM, copy at the op's bytes,
    dispatch)."""
    slow = parts.slowdown
    block = parts.has_contention("block", ranks, with_collective)
    gemm = gemm_total_seconds(inv, parts, dtype)
    memory = sum(parts.kernel(kind).seconds(moved) * reuse
                 * (1.0 if block else slow("memory", ranks, with_collective, moved))
                 for (kind, moved), reuse in zip(inv.kernels, reuse_factors(inv, parts), strict=True))
    dispatch = inv.views * parts.view_op_s + dispatch_overhead_seconds(inv, parts)
    if block:
        factor = slow("block", ranks, with_collective)
        return gemm * factor, memory * factor, dispatch * factor
    return gemm * slow("gemm", ranks, with_collective), memory, dispatch * slow("dispatch", ranks, with_collective)


def reuse_factors(inv: Inventory, parts: HardwareParts) -> list[float]:
    """Per memory-bound op, the reuse part's factor at its bytes and its inputs' byte-weighted
    reuse distance (planner.calibrate.reuse); all 1 without the part or the recorded distances."""
    if not parts.reuse or len(inv.kernel_reads) != len(inv.kernels):
        return [1.0] * len(inv.kernels)
    cold = parts.cold_distance_bytes
    return [parts.reuse_factor(kind, moved, op_distance([b for b, _ in reads], [d for _, d in reads], cold))
            for (kind, moved), reads in zip(inv.kernels, inv.kernel_reads, strict=True)]


def dispatch_overhead_seconds(inv: Inventory, parts: HardwareParts) -> float:
    """Python + autograd per recorded op (planner.calibrate.dispatch) times the op count; 0 for a
    parts file without the measurement."""
    if parts.dispatch_per_op_s is None:
        return 0.0
    return parts.dispatch_per_op_s * op_count(inv)


ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def gemm_total_seconds(inv: Inventory, parts: HardwareParts, dtype: str = "fp32") -> float:
    """The inventory's GEMMs: each call timed at its shape and layout when the parts measured it
    (fp32 only: planner.calibrate.shape_gemms), else the table through the planner's formula."""
    measured = lookup(parts.shape_gemms) if dtype == "fp32" else {}
    if not measured or not inv.gemm_calls:
        return sum(b * gemm_seconds(parts, dtype, m, n, k) for b, m, n, k in inv.gemms)
    return seconds_by_call(inv.gemm_calls, measured,
                           lambda c: c.batch * gemm_seconds(parts, dtype, c.m, c.n, c.k))


def gemm_seconds(parts: HardwareParts, dtype: str, m: int, n: int, k: int) -> float:
    """2·m·n·k FLOPs at the planner's efficiency of the shape on the measured parts."""
    points = [p for p in parts.gemm if p.dtype == dtype]
    if not points:
        raise ValueError(f"no measured GEMM points for {dtype}")
    peak = parts.peak_flops_per_s[dtype]
    eff = efficiency_from_points(points, m, n, k, ELEMENT_BYTES[dtype], peak,
                                 parts.kernel("copy").large_bytes_per_s)
    return float(gemm_flops(m, n, k) / (eff * peak))


def param_sizes(model: ModelSpec, seq_len: int) -> list[int]:
    """Element counts of the model's parameter tensors, in registration order."""
    with torch.device("meta"):
        net = build_model(model, seq_len)
    return [p.numel() for p in net.parameters()]


def block_param_elements(model: ModelSpec, seq_len: int) -> tuple[list[int], int]:
    """(elements of each block, elements outside the blocks: the FSDP2 root's)."""
    blocks, root = fsdp2_group_shapes(model, seq_len)
    return [group_elements(b) for b in blocks], group_elements(root)


def ddp_buckets(sizes_bytes: list[int]) -> list[int]:
    """Bucket bytes as DDP fills them: reverse parameter order, first bucket 1 MiB, then 25 MiB
    (a tensor that overflows a bucket closes it)."""
    buckets, current, cap = [], 0, DDP_FIRST_BUCKET_BYTES
    for size in reversed(sizes_bytes):
        current += size
        if current >= cap:
            buckets.append(current)
            current, cap = 0, DDP_BUCKET_BYTES
    return buckets + ([current] if current else [])


def zero1_partition(sizes: list[int], ranks: int) -> list[list[int]]:
    """ZeroRedundancyOptimizer._partition_parameters: tensors sorted by size (largest first),
    each to the rank holding the fewest elements so far."""
    shards: list[list[int]] = [[] for _ in range(ranks)]
    for size in sorted(sizes, reverse=True):
        min(shards, key=sum).append(size)
    return shards


def communication_seconds(cfg: StepConfig, parts: HardwareParts, elem_bytes: int = 4) -> float:
    """Collectives of one step on `cfg.nproc` ranks from the fitted α–β; ZeRO-1's broadcasts
    after the optimizer step only when the engine optimizer part (which holds them) is absent."""
    seconds = backward_communication_seconds(cfg, parts, elem_bytes)
    if cfg.strategy == "zero1" and cfg.nproc > 1 and engine_optimizer(cfg, parts) is None:
        p2p = parts.collective("send_recv", cfg.nproc).fit
        seconds += sum(p2p.seconds(n * elem_bytes) for n in param_sizes(cfg.model, cfg.seq_len))
    return seconds


def backward_communication_seconds(cfg: StepConfig, parts: HardwareParts, elem_bytes: int = 4) -> float:
    """The collectives issued during forward + backward (the ones an engine can overlap with
    compute): DDP's / ZeRO-1's bucket all-reduces, all of FSDP2's; not ZeRO-1's broadcasts, which
    `ZeroRedundancyOptimizer.step` issues after the backward."""
    if cfg.nproc == 1 or cfg.strategy == "single":
        return 0.0
    if cfg.strategy in ("ddp", "zero1"):
        ar = parts.collective("all_reduce", cfg.nproc).fit
        return sum(ar.seconds(b) for b in ddp_buckets([n * elem_bytes for n in param_sizes(cfg.model, cfg.seq_len)]))
    if fsdp2_as_called(cfg, parts):
        block_shapes, root_shapes = fsdp2_group_shapes(cfg.model, cfg.seq_len)
        return (sum(fsdp2_group_seconds(parts, True, cfg.nproc, shapes, elem_bytes) for shapes in block_shapes)
                + fsdp2_group_seconds(parts, False, cfg.nproc, root_shapes, elem_bytes))
    blocks, root = block_param_elements(cfg.model, cfg.seq_len)
    ag = parts.collective("all_gather", cfg.nproc).fit
    rs = parts.collective("reduce_scatter", cfg.nproc).fit
    seconds = sum(2 * ag.seconds(b * elem_bytes) + rs.seconds(b * elem_bytes) for b in blocks)
    return seconds + ag.seconds(root * elem_bytes) + rs.seconds(root * elem_bytes)


def fsdp2_as_called(cfg: StepConfig, parts: HardwareParts) -> bool:
    """FSDP2 on ranks whose FSDP2-as-called part was measured (planner.calibrate.
    fsdp2_collectives): its per-group cost then holds the collectives, copies, hooks and waits."""
    return (cfg.strategy == "fsdp2" and cfg.nproc > 1 and parts.fsdp2_fit(True, cfg.nproc) is not None
            and parts.fsdp2_fit(False, cfg.nproc) is not None)


def fsdp2_group_seconds(parts: HardwareParts, resharded: bool, ranks: int, shapes, elem_bytes: int = 4) -> float:
    """One FSDP2 group's cost as FSDP2 calls its collectives: measured on a group of exactly these
    parameter shapes when the parts hold it (`HardwareParts.fsdp2_groups`), else the width curve
    at the group's bytes."""
    measured = parts.fsdp2_group_seconds(resharded, ranks, shapes)
    if measured is not None:
        return measured
    return parts.fsdp2_curve(resharded, ranks).seconds(group_elements(shapes) * elem_bytes)


def fsdp2_group_shapes(model: ModelSpec, seq_len: int) -> tuple[list[list[tuple[int, ...]]], list[tuple[int, ...]]]:
    """(each block's parameter shapes, the root's: the parameters outside the blocks)."""
    with torch.device("meta"):
        net = build_model(model, seq_len)
    blocks = [[tuple(p.shape) for p in b.parameters()] for b in net.blocks]
    inside = {id(p) for b in net.blocks for p in b.parameters()}
    return blocks, [tuple(p.shape) for p in net.parameters() if id(p) not in inside]


def engine_copy_seconds(cfg: StepConfig, parts: HardwareParts, elem_bytes: int = 4, ranks: int = 1,
                        with_collective: bool = False) -> float:
    """The engines' own copies, each at the copy curve times the memory contention slowdown of
    its size with `ranks` ranks at once: DDP into and out of buckets (bytes read + written = 2 x
    the tensor's bytes); FSDP2's all-gather copy-in and copy-out, reduce-scatter copy-in (and
    casts under a mixed-precision policy), bytes from torch 2.13's code (fsdp2_overhead.step_copies);
    0 for FSDP2 when the FSDP2-as-called part was measured (it holds them)."""
    if cfg.nproc == 1 or cfg.strategy == "single":
        return 0.0

    def copy(num_bytes: float) -> float:
        return parts.kernel("copy").seconds(num_bytes) * parts.slowdown("memory", ranks, with_collective, num_bytes)

    if cfg.strategy in ("ddp", "zero1"):
        return sum(2 * copy(2 * n * elem_bytes) for n in param_sizes(cfg.model, cfg.seq_len))
    if fsdp2_as_called(cfg, parts):
        return 0.0  # inside the FSDP2-as-called part
    blocks, root = fsdp2_group_shapes(cfg.model, cfg.seq_len)
    return sum(copy(b) for b in step_copies(blocks, root, cfg.nproc, orig_bytes=elem_bytes))


def engine_hook_seconds(cfg: StepConfig, parts: HardwareParts, ranks: int = 1, with_collective: bool = False) -> float:
    """FSDP2's hooks: 4 per parameter group (the blocks and the root) per step, at the measured
    per-hook overhead times the dispatch contention slowdown; 0 for the other engines, for a
    parts file without the measurement, and when the FSDP2-as-called part holds them."""
    if cfg.strategy != "fsdp2" or cfg.nproc == 1 or parts.fsdp2_hook_s is None or fsdp2_as_called(cfg, parts):
        return 0.0
    groups = len(fsdp2_group_shapes(cfg.model, cfg.seq_len)[0]) + 1
    return hooks_per_step(groups) * parts.fsdp2_hook_s * parts.slowdown("dispatch", ranks, with_collective)


ADAM_BYTES_PER_ELEMENT = 7 * 4
"""fp32 Adam reads param, grad, exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq
(torch/optim/adam.py, _single_tensor_adam / _multi_tensor_adam): 7 x 4 bytes per element."""


def optimizer_shard(cfg: StepConfig) -> tuple[int, int]:
    """(tensors, elements) Adam steps on this rank: all (single, DDP), rank 0's ZeRO-1 partition,
    or every tensor's 1/n shard (FSDP2)."""
    sizes = param_sizes(cfg.model, cfg.seq_len)
    if cfg.strategy == "zero1" and cfg.nproc > 1:
        mine = max(zero1_partition(sizes, cfg.nproc), key=sum)
        return len(mine), sum(mine)
    if cfg.strategy == "fsdp2" and cfg.nproc > 1:
        return len(sizes), sum(math.ceil(n / cfg.nproc) for n in sizes)
    return len(sizes), sum(sizes)


def engine_optimizer(cfg: StepConfig, parts: HardwareParts):
    """The engine optimizer part (planner.calibrate.engine_optimizer) for a ZeRO-1 or FSDP2 step
    on ranks it was measured on, else None."""
    if cfg.nproc == 1 or cfg.strategy not in ("zero1", "fsdp2"):
        return None
    return parts.engine_optimizer(cfg.strategy, cfg.nproc)


def optimizer_seconds(cfg: StepConfig, parts: HardwareParts, ranks: int = 1) -> float:
    """ZeRO-1 / FSDP2 with the engine optimizer part: the part at the whole parameter list's
    tensors and elements (every rank stepping at once and ZeRO-1's broadcasts are inside it).
    Otherwise Adam on this rank's shard, at the memory contention slowdown of its bytes with
    `ranks` ranks stepping at once (they leave the last collective together)."""
    engine = engine_optimizer(cfg, parts)
    if engine is not None:
        sizes = param_sizes(cfg.model, cfg.seq_len)
        return engine.seconds(len(sizes), sum(sizes))
    tensors, elements = optimizer_shard(cfg)
    slow = parts.slowdown("memory", ranks, False, ADAM_BYTES_PER_ELEMENT * elements)
    return parts.optimizer.seconds(tensors, elements) * slow


def ranks_at_once(cfg: StepConfig) -> int:
    """Processes computing at the same time on the node."""
    return 1 if cfg.strategy == "single" else cfg.nproc


def overlap_share(cfg: StepConfig, parts: HardwareParts, compute_s: float) -> float:
    """Share of the compute time with a collective in flight. gloo: 0 (the predictor adds the
    communication term whole; the collectives' CPU time on the shared cores is that term, so
    slowing compute by it as well would count it twice). NCCL: the engines overlap their
    forward / backward collectives with compute on their own stream, so compute shares the
    SMs for min(1, communication / compute) of its time (the share cannot exceed either)."""
    if parts.backend != "nccl" or compute_s <= 0:
        return 0.0
    return min(1.0, backward_communication_seconds(cfg, parts) / compute_s)


def fault_seconds(cfg: StepConfig, parts: HardwareParts) -> float:
    """Forward + backward's first touches of fresh pages, one rank alone: the step's allocation
    trace replayed through the host's allocator (planner.calibrate.page_faults) times the measured
    cost per page; 0 without the part (CUDA, an older parts file). The optimizer step's faults are
    left out: its replayed phase faulted 3-8x more than the optimizer time the real steps leave
    room for on four SEEN rows (docs/calibrate.md "Page faults as a part")."""
    if parts.fault_s_per_page is None:
        return 0.0
    return step_faults(cfg.model, cfg.seq_len, cfg.micro_batch)[0] * parts.fault_s_per_page


def contended_compute_seconds(inv: Inventory, cfg: StepConfig, parts: HardwareParts, faults_s: float = 0.0) -> float:
    """Forward + backward compute with every rank of the node computing at once: the measured
    slowdown without a collective, and with one for the overlapped share. `faults_s` (one rank's
    page faults, `fault_seconds`) is slowed as forward and backward are (the block probe's
    factor, 1 without it)."""
    ranks = ranks_at_once(cfg)
    faults = faults_s * parts.slowdown("block", ranks)

    def total(with_collective: bool) -> float:
        return (faults + sum(compute_seconds(inv, parts, ranks=ranks, with_collective=with_collective))
                + engine_copy_seconds(cfg, parts, ranks=ranks, with_collective=with_collective)
                + engine_hook_seconds(cfg, parts, ranks=ranks, with_collective=with_collective))

    quiet = total(False)
    share = overlap_share(cfg, parts, quiet)
    return quiet if share == 0 else (1 - share) * quiet + share * total(True)


def predict_step(cfg: StepConfig, parts: HardwareParts) -> Prediction:
    """Every term of one step of `cfg` on one rank, from the parts only."""
    inv = inventory(cfg.model, cfg.seq_len, cfg.micro_batch)
    gemm, memory, dispatch = compute_seconds(inv, parts)
    copies = engine_copy_seconds(cfg, parts)
    hooks = engine_hook_seconds(cfg, parts)
    faults = fault_seconds(cfg, parts)
    optimizer_alone = optimizer_seconds(cfg, parts)
    optimizer = optimizer_seconds(cfg, parts, ranks_at_once(cfg))
    alone = gemm + memory + dispatch + copies + hooks + faults
    return Prediction(gemm_s=gemm, memory_bound_s=memory + copies, dispatch_s=dispatch + hooks, page_fault_s=faults,
                      compute_contention_s=contended_compute_seconds(inv, cfg, parts, faults) - alone,
                      communication_s=communication_seconds(cfg, parts), optimizer_s=optimizer,
                      optimizer_contention_s=optimizer - optimizer_alone)


def with_fsdp2_groups(parts: HardwareParts, configs: list[StepConfig], timeout_s: float = 600.0) -> HardwareParts:
    """`parts` plus FSDP2's per-group cost on every block and root group of the configurations
    that run FSDP2 on several ranks whose FSDP2-as-called part was measured, each on a probe group
    of the group's parameter shapes (planner.calibrate.fsdp2_collectives.measure_groups), on as
    many spawned ranks as the configuration has."""
    from planner.calibrate.collectives import spawn_fsdp2_groups

    wanted: dict[int, list] = {}  # ranks -> the (resharded, shapes) groups not measured yet
    for cfg in configs:
        if not fsdp2_as_called(cfg, parts):
            continue
        blocks, root = fsdp2_group_shapes(cfg.model, cfg.seq_len)
        groups = wanted.setdefault(cfg.nproc, [])
        for resharded, shapes in [(True, b) for b in blocks] + [(False, root)]:
            key = (resharded, shapes_key(shapes))
            if key not in groups and parts.fsdp2_group_seconds(resharded, cfg.nproc, shapes) is None:
                groups.append(key)
    new = []
    for ranks, groups in wanted.items():
        new += spawn_fsdp2_groups(ranks, {"threads": parts.threads_per_rank, "device": "cuda" if parts.backend == "nccl" else "cpu",
                                          "timeout_s": timeout_s, "clock": parts.clock, "groups": groups})
    return parts.model_copy(update={"fsdp2_groups": parts.fsdp2_groups + tuple(new)})


def with_step_shapes(parts: HardwareParts, configs: list[StepConfig], on_done=lambda: None) -> HardwareParts:
    """`parts` plus every GEMM call of the configurations' forward + backward timed at its shape
    and layout (planner.calibrate.shape_gemms), on rank 0's cores with the parts' threads."""
    from planner.calibrate.procedure import pinned
    from planner.calibrate.shape_gemms import measure

    calls = [c for cfg in configs for c in inventory(cfg.model, cfg.seq_len, cfg.micro_batch).gemm_calls]
    known = {s.call for s in parts.shape_gemms}
    torch.set_num_threads(parts.threads_per_rank)
    with pinned(0, parts.threads_per_rank, "cpu" if parts.backend == "gloo" else "cuda"):
        new = measure([c for c in calls if c not in known], on_done=on_done)
    return parts.model_copy(update={"shape_gemms": parts.shape_gemms + new})
