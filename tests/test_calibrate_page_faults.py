"""The page-fault part (planner.calibrate.page_faults): the allocation trace recorded on the meta
device, its replay through the host's allocator, the per-page cost, and the predictor's term."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_calibrate_contention import _point, _tiny, _uniform  # noqa: E402
from test_calibrate_hardware import _parts  # noqa: E402


def test_the_recorder_sees_allocations_and_frees_in_order() -> None:
    from planner.calibrate.page_faults import recorder

    x = torch.empty(1000, device="meta")  # made outside: not recorded
    events: list = []
    with recorder(events):
        y = x * 2  # a new storage of 1000 fp32 = 4000 bytes, id 0
        z = y.sum()  # 4 bytes, id 1
        v = z.view(1)  # a view: no storage of its own
        del y  # storage 0 has no other holder: freed
        w = torch.ops.aten.native_dropout_backward(x, torch.ones(1000, dtype=torch.bool, device="meta"), 1.25)
    # the mask (1000 bool = 1000 bytes, id 2), then native_dropout_backward's kernel temporary
    # (grad * mask: 4000 bytes, id -1) around its result (4000 bytes, id 3)
    assert events == [[4000, 0], [4, 1], [0, 0], [1000, 2], [4000, -1], [4000, 3], [0, -1], [0, 2]]
    assert v.shape == (1,) and w.shape == (1000,)


def test_a_step_trace_frees_what_it_allocates() -> None:
    """Step 2 of a training loop (Adam's state made in step 1, gradients set to None after the
    step) ends with nothing of its own alive, so replaying it step after step leaks nothing; its
    first allocation is the token embedding's output, micro-batch x sequence x hidden fp32."""
    from planner.calibrate.page_faults import allocation_trace

    cfg = _tiny("single", 1)
    trace = allocation_trace(cfg.model, cfg.seq_len, cfg.micro_batch)
    step = trace["step"]
    assert step.count("|") == 1
    allocated = {e[1] for e in step if e != "|" and e[0]}
    freed = {e[1] for e in step if e != "|" and not e[0]}
    assert allocated and allocated <= freed
    assert step[0] == [1 * 4 * 8 * 4, step[0][1]]  # b=1, s=4, h=8, 4 bytes
    # what the first step leaves alive is Adam's state: two fp32 moments per parameter element
    # (8888 elements, test_calibrate_hardware's count) and a 4-byte step counter per tensor
    from planner.calibrate.models import build_model

    tensors = len(list(build_model(cfg.model, cfg.seq_len).parameters()))
    kept = {e[1]: e[0] for e in trace["first"] if e != "|" and e[0]}
    for e in trace["first"]:
        if e != "|" and not e[0]:
            kept.pop(e[1], None)
    assert sum(kept.values()) == 2 * 4 * 8888 + 4 * tensors
    assert trace["inputs"] == 2 * 1 * 4 * 8  # tokens + labels, int64


def test_the_replay_counts_the_faults_of_fresh_pages() -> None:
    """A 64 MiB block per step is above glibc's largest dynamic mmap threshold (32 MiB on 64-bit,
    malloc/malloc.c DEFAULT_MMAP_THRESHOLD_MAX), so every step maps it afresh and writing it
    faults every page: 64 MiB / 4 KiB = 16384 faults (plus a few for page tables); a 4 KiB block
    is reused from the heap: no fresh page after the warm-up."""
    import mmap

    from planner.calibrate.page_faults import replay_faults

    cfg = _tiny("single", 1)
    base = {"inputs": 64, "model": cfg.model.model_dump(mode="json"), "seq_len": cfg.seq_len, "first": []}
    pages = 64 * 2**20 // mmap.PAGESIZE
    big = replay_faults(base | {"step": [[64 * 2**20, 0], "|", [0, 0]]}, warm=2, steps=4)
    assert all(pages <= fwd <= pages + 256 and opt <= 64 for fwd, opt in big)
    small = replay_faults(base | {"step": [[4096, 0], [0, 0], "|"]}, warm=2, steps=4)
    assert all(fwd <= 64 and opt <= 64 for fwd, opt in small)


def test_a_fresh_page_costs_more_than_a_warm_one() -> None:
    from planner.calibrate.page_faults import fault_seconds_per_page

    # a minor fault (kernel entry, a zeroed 4 KiB page, the mapping) costs ~0.1-10 us on Linux
    assert 1e-8 < fault_seconds_per_page(8 * 2**20, repeats=3) < 1e-4


def test_the_predictor_adds_faulted_pages_times_their_cost(monkeypatch) -> None:
    """1000 pages at 2 us = 2 ms in forward + backward, one rank alone; with two ranks and a block
    point of x1.1 the faults are slowed as forward and backward are (0.2 ms more). None in the
    parts (CUDA, older files): no term, no replay."""
    from planner.calibrate import predict

    calls = []
    monkeypatch.setattr(predict, "step_faults", lambda *a: calls.append(a) or (1000.0, 50.0))
    cfg = _tiny("ddp", 2)
    bare = predict.predict_step(cfg, _parts())
    assert bare.page_fault_s == 0.0 and calls == []
    with_faults = predict.predict_step(cfg, _parts().model_copy(update={"fault_s_per_page": 2e-6}))
    assert with_faults.page_fault_s == pytest.approx(2e-3, rel=1e-12)
    assert with_faults.compute_s == pytest.approx(bare.compute_s + 2e-3, rel=1e-12)
    assert with_faults.optimizer_s == bare.optimizer_s  # the optimizer's faults are left out
    uniform = _uniform(2.0, 3.0)
    block = uniform.model_copy(update={"contention": (*uniform.contention, _point("block", 1.1)),
                                       "fault_s_per_page": 2e-6})
    slow, slow_bare = (predict.predict_step(cfg, p) for p in (block, block.model_copy(update={"fault_s_per_page": None})))
    assert slow.compute_s - slow_bare.compute_s == pytest.approx(1.1 * 2e-3, rel=1e-9)
    assert slow.compute_contention_s - slow_bare.compute_contention_s == pytest.approx(0.1 * 2e-3, rel=1e-9)


def test_step_faults_is_the_mean_over_the_pooled_steps_of_six_processes(monkeypatch) -> None:
    """Six replay processes of two steps each ([forward + backward, optimizer] pages), alternating
    between a 100-page and a 1000-page pattern: forward + backward (6 x 100 + 6 x 1000) / 12 = 550,
    optimizer (6 x 1 + 6 x 3) / 12 = 2. With three processes (100, 1000, 100) the mean is
    (4 x 100 + 2 x 1000) / 6 = 400 and the optimizer (4 + 6) / 6 = 5/3, where the median
    would say 100."""
    from planner.calibrate import page_faults

    calls = []

    def replay(trace):
        calls.append(trace)
        odd = len(calls) % 2 == 0
        return [[1000, 3], [1000, 3]] if odd else [[100, 1], [100, 1]]

    monkeypatch.setattr(page_faults, "allocation_trace", lambda *a: "trace")
    monkeypatch.setattr(page_faults, "replay_faults", replay)
    page_faults.step_faults.cache_clear()
    try:
        assert page_faults.step_faults("model", 8, 1) == (550.0, 2.0)
        assert calls == ["trace"] * 6 == ["trace"] * page_faults.REPLAY_PROCESSES
        calls.clear()
        monkeypatch.setattr(page_faults, "REPLAY_PROCESSES", 3)
        assert page_faults.step_faults("model", 8, 2) == (400.0, pytest.approx(5 / 3))
    finally:
        page_faults.step_faults.cache_clear()
