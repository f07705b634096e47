"""Where a single-process step's time goes, per op class: predicted from the parts, the same ops
timed alone at the step's shapes, and the real step under torch.profiler. A diagnostic for SEEN
configurations (benchmarks/calibrate_hardware.py --attribute); nothing here feeds a prediction.

Classes are the predictor's (`predict._kind`; `gemm` for mm / addmm / bmm / baddbmm; `view` for
aliasing ops and allocations). Three columns per class:
- `predicted_s`: the parts' figure (`predict.compute_seconds` per class);
- `isolated_s`: every non-aliasing aten op of the meta forward + backward replayed alone on real
  tensors of its recorded shapes and strides (so a GEMM's transposed operand is transposed), one
  warm-up then the median of `reps`, times its occurrences: the op's cost with its operands
  warm in cache and no neighbours;
- `in_step_s`: the summed self CPU time of the class's aten ops in one profiled forward +
  backward of the real model (torch.profiler, `key_averages`): the ops as the step runs them.
  The profiler counts nested ops too (clone -> copy_), which self time attributes once.
`wall_s` is the median unprofiled forward + backward; `wall_s - sum(in_step_s)` is the time in
no aten op: Python (the model's modules) and autograd's engine.
Rounds alternate the three measurements so that load from other processes on a shared machine
falls on all of them alike; each figure is the median over the rounds.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from planner.calibrate import predict as P
from planner.calibrate.models import build_model
from planner.calibrate.parts import HardwareParts
from planner.calibrate.run import token_batch
from planner.core.spec import Frozen

ALIAS_NAMES = frozenset({"view", "t", "transpose", "expand", "permute", "reshape", "_unsafe_view", "as_strided",
                         "slice", "select", "unsqueeze", "squeeze", "split", "split_with_sizes", "unbind", "alias",
                         "detach", "empty", "empty_like", "empty_strided", "lift_fresh", "contiguous", "chunk",
                         "narrow", "_reshape_alias", "view_as", "resolve_conj", "resolve_neg", "expand_as"})
"""aten ops the profiler lists that move no data (or only allocate): the `view` class."""


class ClassTimes(Frozen):
    """One op class of one step (seconds; medians over the rounds)."""

    kind: str
    ops: int
    predicted_s: float
    isolated_s: float
    in_step_s: float


class Attribution(Frozen):
    name: str
    wall_s: float
    rounds: int
    classes: tuple[ClassTimes, ...]

    @property
    def outside_aten_s(self) -> float:
        return self.wall_s - sum(c.in_step_s for c in self.classes)


def op_class(name: str) -> str:
    if name in P.GEMM_OPS:
        return "gemm"
    if name in ALIAS_NAMES:
        return "view"
    return P._kind(name)


class _Recorder(TorchDispatchMode):
    """Every data-moving op with its arguments' shapes / strides / dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, str, object]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name.split("::")[-1]
        if not (P._is_view(func) or name.startswith("empty") or name in ("detach", "lift_fresh")):
            meta = tree_map(_describe, (args, kwargs or {}))
            self.calls.append((func, name, meta))
        return out


def _describe(x):
    if isinstance(x, torch.Tensor):
        return _TensorMeta(tuple(x.shape), tuple(x.stride()), x.dtype)
    return x


class _TensorMeta(tuple):
    def __new__(cls, shape, stride, dtype):
        return super().__new__(cls, (shape, stride, dtype))


def _materialize(x):
    if isinstance(x, _TensorMeta):
        shape, stride, dtype = x
        t = torch.empty_strided(shape, stride, dtype=dtype)
        return t.uniform_(0.1, 1.0) if dtype.is_floating_point else t.zero_()  # index 0 is always valid
    return x


def recorded_calls(cfg: P.StepConfig) -> list[tuple[object, str, object]]:
    torch.manual_seed(0)
    net = build_model(cfg.model, cfg.seq_len).to("meta")
    tokens = torch.randint(0, cfg.model.vocab_size, (cfg.micro_batch, cfg.seq_len), device="meta")
    rec = _Recorder()
    with rec:
        net(tokens, tokens).backward()
    return rec.calls


def isolated(calls, reps: int = 5) -> Counter:
    """Seconds per class of every call replayed alone (distinct calls timed once, times their count)."""
    groups: dict[tuple[str, str], list] = {}
    for func, name, meta in calls:
        groups.setdefault((str(func), repr(meta)), []).append((func, name, meta))
    out: Counter = Counter()
    for items in groups.values():
        func, name, meta = items[0]
        args, kwargs = tree_map(_materialize, meta, is_leaf=lambda x: isinstance(x, _TensorMeta))
        func(*args, **kwargs)
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            func(*args, **kwargs)
            times.append(time.perf_counter() - start)
        out[op_class(name)] += statistics.median(times) * len(items)
    return out


def in_step(net, tokens, labels) -> Counter:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        net(tokens, labels).backward()
    for p in net.parameters():
        p.grad = None
    out: Counter = Counter()
    for e in prof.key_averages():
        if e.key.startswith("aten::"):
            out[op_class(e.key.split("::")[-1])] += e.self_cpu_time_total / 1e6
    return out


def predicted(cfg: P.StepConfig, parts: HardwareParts) -> tuple[Counter, Counter]:
    """(seconds, op count) per class from the parts, as predict.compute_seconds adds them up."""
    inv = P.inventory(cfg.model, cfg.seq_len, cfg.micro_batch)
    secs: Counter = Counter({"gemm": P.gemm_total_seconds(inv, parts)})
    counts: Counter = Counter({"gemm": len(inv.gemms), "view": inv.views})
    for kind, moved in inv.kernels:
        secs[kind] += parts.kernel(kind).seconds(moved)
        counts[kind] += 1
    secs["view"] = inv.views * parts.view_op_s + P.dispatch_overhead_seconds(inv, parts)
    return secs, counts


def attribute(cfg: P.StepConfig, parts: HardwareParts, rounds: int = 3, warmup: int = 4) -> Attribution:
    """The three columns of `cfg` (one process, the caller's threads and pinning)."""
    pred, counts = predicted(cfg, parts)
    calls = recorded_calls(cfg)
    torch.manual_seed(0)
    net = build_model(cfg.model, cfg.seq_len)
    tokens, labels = token_batch(cfg.model, cfg.seq_len, cfg.micro_batch, torch.device("cpu"), seed=1000)

    def wall() -> float:
        start = time.perf_counter()
        net(tokens, labels).backward()
        seconds = time.perf_counter() - start
        for p in net.parameters():
            p.grad = None
        return seconds

    for _ in range(warmup):
        wall()
    walls, alone, stepped = [], [], []
    for _ in range(rounds):
        walls.append(statistics.median(wall() for _ in range(3)))
        alone.append(isolated(calls))
        stepped.append(in_step(net, tokens, labels))
    kinds = sorted(set(pred) | {k for c in alone + stepped for k in c}, key=lambda k: -pred.get(k, 0.0))
    med = lambda series, k: statistics.median(c.get(k, 0.0) for c in series)  # noqa: E731
    return Attribution(name=cfg.name, wall_s=statistics.median(walls), rounds=rounds, classes=tuple(
        ClassTimes(kind=k, ops=counts.get(k, 0), predicted_s=pred.get(k, 0.0), isolated_s=med(alone, k),
                   in_step_s=med(stepped, k)) for k in kinds))
