"""GEMMs timed at the shapes and operand layouts a training step calls them with: a part.

Why (docs/calibrate.md "Where a single-process step's time goes"): the GEMM table is measured
on a power-of-two grid (32, 128, 512, 2048 per dimension) with contiguous operands and
interpolated in arithmetic intensity. A step's GEMMs have other dimensions (widths 192-768,
576 tokens, head size 64 ...) and transposed operands (`nn.Linear`'s `W.t()`, the backward's
`x.t() @ dy`). Measured back to back on this CPU (torch 2.13, one thread, 2026-11-23, load ~1):
the table's time for the SEEN step `small b4 x1` was 103.6 ms against 77.7 ms for its 51 calls
timed alone at their shapes and layouts (+33 %; single shapes +0 to +88 %), for `narrow s192 b3
x1` 335.2 against 285.7 ms (+17 %). Against the same GEMMs' self time inside the real step
(torch.profiler, planner.calibrate.attribution, alternating rounds): 562 vs 554 ms (narrow) and
81 vs 85 ms (small), but 420 vs 521 ms (mid) at load ~2; 13-25 % apart either way at load ~4 (a
shared 2-core machine: these are noisy figures). So each distinct call of a model's forward +
backward — op (`mm`, `addmm`, `bmm`, `baddbmm`), batch, m, n, k, and which operand is
column-major — is timed alone, on tensors laid out the same way, with the threads and pinning
of the parts (planner.calibrate.procedure). That is a micro-benchmark of the op at the step's
shapes; nothing in it is taken from the step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

from planner.core.spec import Frozen

GemmOp = Literal["mm", "addmm", "bmm", "baddbmm"]


class GemmCall(Frozen):
    """One GEMM call as the step issues it: C (batch x m x n) = A (m x k) @ B (k x n)."""

    op: GemmOp
    batch: int
    m: int
    n: int
    k: int
    a_col_major: bool
    """A's last dimension is not its contiguous one (a transposed view)."""
    b_col_major: bool

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


class ShapeGemm(Frozen):
    """The measured median seconds of one call (fp32)."""

    call: GemmCall
    seconds: float


def col_major(t) -> bool:
    """True when a matrix operand's last dimension is not unit-stride (torch strides)."""
    return t.dim() >= 2 and t.stride(-1) != 1 and t.shape[-1] > 1


def call_of(name: str, args) -> GemmCall:
    """The GemmCall of an aten `mm` / `addmm` / `bmm` / `baddbmm` call (its tensor arguments)."""
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
    batch = a.shape[0] if a.dim() == 3 else 1
    return GemmCall(op=name, batch=batch, m=a.shape[-2], n=b.shape[-1], k=a.shape[-1],
                    a_col_major=col_major(a), b_col_major=col_major(b))


def _operand(torch, batch: int, rows: int, cols: int, col_major_: bool, device):
    """A (batch x) rows x cols fp32 operand, column-major as a transposed contiguous tensor."""
    shape = (cols, rows) if col_major_ else (rows, cols)
    t = torch.randn(*((batch,) if batch > 1 else ()), *shape, device=device)
    return t.transpose(-1, -2) if col_major_ else t


def runner(call: GemmCall, device=None) -> Callable[[], object]:
    """The call on real tensors laid out as in the step (a bias of n for addmm, as nn.Linear's;
    a batch x m x n addend for baddbmm)."""
    import torch

    a = _operand(torch, call.batch, call.m, call.k, call.a_col_major, device)
    b = _operand(torch, call.batch, call.k, call.n, call.b_col_major, device)
    if call.op == "mm":
        return lambda: torch.mm(a, b)
    if call.op == "addmm":
        bias = torch.randn(call.n, device=device)
        return lambda: torch.addmm(bias, a, b)
    if call.batch == 1:  # a 3-d bmm of batch 1 keeps its batch dimension
        a, b = a.unsqueeze(0), b.unsqueeze(0)
    if call.op == "bmm":
        return lambda: torch.bmm(a, b)
    c = torch.randn(call.batch, call.m, call.n, device=device)
    return lambda: torch.baddbmm(c, a, b)


def measure(calls: Iterable[GemmCall], device=None, reps: int = 7,
            on_done: Callable[[], None] = lambda: None) -> tuple[ShapeGemm, ...]:
    """Median seconds of each distinct call (one warm-up run, then `reps`), in first-seen order."""
    from planner.calibrate.hardware import median_seconds

    import torch

    dev = torch.device("cpu") if device is None else device
    out = []
    for call in dict.fromkeys(calls):
        out.append(ShapeGemm(call=call, seconds=median_seconds(runner(call, dev), dev, reps)))
        on_done()
    return tuple(out)


def lookup(measured: Iterable[ShapeGemm]) -> dict[GemmCall, float]:
    return {s.call: s.seconds for s in measured}


def seconds_by_call(calls: Iterable[GemmCall], measured: dict[GemmCall, float],
                    table: Callable[[GemmCall], float]) -> float:
    """Total seconds of `calls`: the measured time of a call timed at its shape, else `table`'s."""
    return sum(measured[c] if c in measured else table(c) for c in calls)
