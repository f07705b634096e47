"""Page faults: the first touch of memory the host's allocator has just taken from the kernel.

On a CPU host the step's tensors come from glibc's malloc (torch's `c10::alloc_cpu`:
`posix_memalign(64, nbytes)`). Large blocks are mmapped and unmapped on free, and the heap top is
trimmed when its free end exceeds the trim threshold, both with thresholds that glibc adjusts at
run time (malloc/malloc.c: a freed mmapped chunk above `mmap_threshold`, up to
`DEFAULT_MMAP_THRESHOLD_MAX` = 32 MiB on 64-bit, raises it to the chunk's size and the trim
threshold to twice that). Every page handed back is faulted in again, zeroed by the kernel, the
next time a tensor lands on it. The device parts never see this (their loops reuse freed
memory); a step does: on this 2-core host, SEEN rows in fresh processes faulted 5-260 MiB per
step at ~2.1 us per 4 KiB page, up to ~10 % of forward + backward (2026-11-28, docs/calibrate.md
"Page faults as a part"). On a GPU the caching allocator keeps its segments: no term there.

Two pieces, neither timed on the configuration predicted:
- `fault_seconds_per_page` (a device part): a fresh anonymous mapping written once (every page
  faulted) minus the same bytes written again (no fault), per page;
- `step_faults`: the step's allocation trace (every storage a forward + backward and an Adam
  step allocate and free, recorded on the `meta` device: sizes and order, no data; `recorder`,
  `allocation_trace`) replayed through torch's CPU allocator in fresh processes that have built
  the model (`replay_faults`), counting the minor faults of each phase (`resource.getrusage`).
  The replay is the allocator's real policy on the step's real sizes; the model's forward and
  backward are never run. Named approximations: allocations inside kernels that meta tensors do
  not make (BLAS packing buffers, reduction scratch; the one found to matter,
  `native_dropout_backward`'s, is added: `KERNEL_SCRATCH`), Python objects, the engines' own
  buffers (DDP buckets, FSDP2's gathered parameters), the data loader, and the state a process
  that ran other work first leaves in glibc's thresholds.
"""

from __future__ import annotations

import functools
import json
import mmap
import statistics
import subprocess
import sys
import time
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PAGE_BYTES = mmap.PAGESIZE
REPLAY_WARM_STEPS = 3
REPLAY_STEPS = 16
REPLAY_PROCESSES = 6
"""The replay settles into one of a few fault patterns per process (2026-11-28, SEEN h232 s276 b8:
medians of 16 steps 26k, 29k, 26k, 58k pages in four processes; the real steps of one
configuration vary alike, 19k-90k per step), and which pattern a training process meets is a
draw; the figure is the mean over the pooled steps of six processes, the expected pages per step.
(Until 2026-11-28 17:41 UTC the median of three: it followed whichever pattern two of three
processes met, so one configuration read 5k or 29k pages from one replay to the next. SEEN
decision, criterion fixed before looking, 77 rows against the measured steps of 16:30-16:51 UTC,
one set of six replays per row: median of 3 -> mean of 6 took the mean |error| 5.54 -> 5.05 %
and the maximum 19.6 -> 15.3 %; docs/calibrate.md.)"""


def fault_seconds_per_page(buffer_bytes: int = 64 * 2**20, repeats: int = 7) -> float:
    """Seconds per page of writing a fresh anonymous mapping once (each page faulted in) beyond
    writing the same mapping again (no fault): the median over `repeats` mappings."""
    import numpy as np

    costs = []
    for _ in range(repeats):
        with mmap.mmap(-1, buffer_bytes) as region:
            view = np.frombuffer(region, dtype=np.uint8)
            start = time.perf_counter()
            view.fill(1)
            fresh = time.perf_counter() - start
            start = time.perf_counter()
            view.fill(2)
            warm = time.perf_counter() - start
            del view
        costs.append(max(fresh - warm, 0.0) / (buffer_bytes // PAGE_BYTES))
    return statistics.median(costs)


KERNEL_SCRATCH = {"native_dropout_backward"}
"""CPU kernels that allocate a tensor of their result's size inside the kernel, where no
dispatch mode sees it: `native_dropout_backward` computes `grad * mask * scale`, a temporary
for `grad * mask`, then the result (aten/src/ATen/native/Dropout.cpp)."""


def recorder(events: list, existing=()):
    """A dispatch mode that appends to `events` [bytes, id] when an op's output lands in a storage
    not seen before and [0, id] when that storage is freed (a weak reference on it: meta storages
    live exactly as long as the CPU ones would, views and autograd's saved tensors included), and
    a [bytes, -1] / [0, -1] pair around the result of a `KERNEL_SCRATCH` op. The storages of the
    `existing` tensors (parameters, inputs) are known already: an in-place op on them allocates
    nothing."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    seen: dict[int, int] = {id(t.untyped_storage()): -2 for t in existing}
    counter = iter(range(1 << 62))

    def freed(key: int, sid: int) -> None:
        seen.pop(key, None)
        events.append([0, sid])

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            scratch = func.__name__.split(".")[0] in KERNEL_SCRATCH and isinstance(out, torch.Tensor)
            if scratch:
                events.append([out.untyped_storage().nbytes(), -1])
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    storage = t.untyped_storage()
                    if id(storage) not in seen and storage.nbytes() > 0:
                        sid = seen[id(storage)] = next(counter)
                        events.append([storage.nbytes(), sid])
                        weakref.finalize(storage, freed, id(storage), sid)
            if scratch:
                events.append([0, -1])
            return out

    return Recorder()


def allocation_trace(model, seq_len: int, micro_batch: int) -> dict:
    """The storages training steps of `model` allocate and free, in order, on the meta device:
    {"first": the events of step 1 (Adam's state is created in it), "step": step 2's, "inputs":
    bytes of tokens + labels, "model", "seq_len"}. Events as `recorder`'s; "|" marks the end of
    forward + backward (then Adam's step and `zero_grad(set_to_none=True)`)."""
    import torch

    from planner.calibrate.models import build_model

    torch.manual_seed(0)
    with torch.device("meta"):
        net = build_model(model, seq_len)
    tokens = torch.randint(0, model.vocab_size, (micro_batch, seq_len), device="meta")
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    events: list = []
    with recorder(events, existing=(*net.parameters(), *net.buffers(), tokens)):
        for _ in range(2):
            net(tokens, tokens).backward()
            events.append("|")
            opt.step()
            opt.zero_grad(set_to_none=True)
            events.append("#")
    end_first = events.index("#")
    first, step = events[:end_first], events[end_first + 1:-1]
    return {"first": first, "step": step, "inputs": 2 * tokens.untyped_storage().nbytes(),
            "model": model.model_dump(mode="json"), "seq_len": seq_len}


REPLAY = r"""
import json, resource, sys
import torch
from planner.calibrate.models import build_model
from planner.core.spec import ModelSpec
torch.set_num_threads(1)
trace = json.load(sys.stdin)
torch.manual_seed(0)
net = build_model(ModelSpec.model_validate(trace["model"]), trace["seq_len"])
live = {}
def alloc(n, key):
    live[key] = torch.empty(n, dtype=torch.uint8).fill_(1)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def run(events, tag):
    counts, start = [], faults()
    for e in events:
        if e == "|":
            counts.append(faults() - start)
            start = faults()
        elif e[0]:
            alloc(e[0], (tag, e[1]))
        else:
            live.pop((tag, e[1]), None)
    counts.append(faults() - start)
    return counts
alloc(trace["inputs"], "inputs")
run(trace["first"], "first")
out = []
for s in range(trace["warm"] + trace["steps"]):
    counts = run(trace["step"], s)
    for key in [k for k in live if k[0] == s]:
        del live[key]
    if s >= trace["warm"]:
        out.append(counts)
print(json.dumps(out))
"""


def replay_faults(trace: dict, warm: int = REPLAY_WARM_STEPS, steps: int = REPLAY_STEPS) -> list[list[int]]:
    """Minor faults of each replayed step after `warm` untimed ones, [forward + backward,
    optimizer], in a fresh process that has built the model on the CPU (as a training process has:
    its parameters and their initialisation are in the heap) and replays every allocation with
    `torch.empty(bytes, dtype=uint8).fill_(1)` (torch's CPU allocator, every page written) and
    every free by dropping it; a storage an event list leaves allocated is freed at its end."""
    payload = json.dumps(trace | {"warm": warm, "steps": steps})
    done = subprocess.run([sys.executable, "-c", REPLAY], input=payload, capture_output=True, text=True,
                          check=True, timeout=600, cwd=ROOT)
    return json.loads(done.stdout)


@functools.lru_cache(maxsize=64)
def step_faults(model, seq_len: int, micro_batch: int) -> tuple[float, float]:
    """(forward + backward, optimizer) pages faulted per step: the means over the replayed steps
    of `REPLAY_PROCESSES` processes."""
    trace = allocation_trace(model, seq_len, micro_batch)
    counts = [c for _ in range(REPLAY_PROCESSES) for c in replay_faults(trace)]
    return (statistics.fmean(c[0] for c in counts), statistics.fmean(c[1] for c in counts))
