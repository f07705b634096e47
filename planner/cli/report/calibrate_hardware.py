"""`zplan calibrate hardware`: a one-screen summary (stderr) or JSON (stdout)."""

from __future__ import annotations

from rich.table import Table

from planner.cli.report import emit_json, human_console, print_table


def _pct(predicted: float, measured: float) -> str:
    return f"{(predicted - measured) / measured * 100:+.1f} %" if measured > 0 else "n/a"


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.1f}"


def step_rows(steps: list[dict]) -> list[dict]:
    """Per configuration: predicted and measured seconds per term, and the step's error."""
    rows = []
    for s in steps:
        cfg, p, m = s["config"], s["predicted"], s["measured"]
        rows.append({
            "name": cfg.name, "strategy": cfg.strategy, "nproc": cfg.nproc, "micro_batch": cfg.micro_batch,
            "seq_len": cfg.seq_len, "layers": cfg.model.num_layers, "hidden": cfg.model.hidden_size,
            "predicted": {"step_s": p.step_s, "compute_s": p.compute_s, "gemm_s": p.gemm_s,
                          "memory_bound_s": p.memory_bound_s, "dispatch_s": p.dispatch_s,
                          "page_fault_s": p.page_fault_s,
                          "communication_s": p.communication_s, "optimizer_s": p.optimizer_s},
            "measured": {"step_s": m.step_s, "forward_backward_s": m.forward_backward_s,
                         "compute_s": m.compute_s, "communication_s": m.communication_s,
                         "optimizer_s": m.optimizer_s},
            "step_error_pct": (p.step_s - m.step_s) / m.step_s * 100,
        })
    return rows


def render_json(parts, written: list[str], steps: list[dict]) -> None:
    emit_json("calibrate-hardware", {"parts": parts.model_dump(mode="json"), "profiles_written": written,
                                     "steps": step_rows(steps)})


def parts_table(parts) -> Table:
    table = Table(title=f"{parts.device} on {parts.host}, {parts.date}, {parts.threads_per_rank} thread(s)/rank, "
                        f"{parts.world_size} rank(s), clock={parts.clock}, zplan {parts.zplan_version}",
                  title_justify="left")
    table.add_column("part")
    table.add_column("measured", justify="right")
    for dtype, peak in parts.peak_flops_per_s.items():
        points = [p for p in parts.gemm if p.dtype == dtype]
        big = max(points, key=lambda p: p.m * p.n * p.k)
        small = min(points, key=lambda p: p.m * p.n * p.k)
        table.add_row(f"GEMM {dtype} peak (TFLOP/s)", f"{peak / 1e12:.3f}")
        table.add_row(f"GEMM {dtype} efficiency {big.m}^3 / {small.m}^3", f"{big.efficiency:.2f} / {small.efficiency:.3f}")
    for curve in parts.kernels:
        table.add_row(f"{curve.kind} at {curve.bytes_moved[-1] / 2**20:.0f} MiB moved (GB/s)",
                      f"{curve.large_bytes_per_s / 1e9:.2f}")
    if parts.fault_s_per_page is not None:
        table.add_row("page fault, first touch of a fresh page (us)", f"{parts.fault_s_per_page * 1e6:.2f}")
    opt = parts.optimizer
    table.add_row("Adam (params/s; us per tensor)", f"{1 / opt.per_element_s:.3g}; {opt.per_tensor_s * 1e6:.1f}")
    for engine in parts.engine_optimizers:
        fit = engine.fit
        table.add_row(f"{engine.engine} optimizer step x{engine.ranks} (us per tensor; ns per element)",
                      f"{fit.per_tensor_s * 1e6:.1f}; {fit.per_element_s * 1e9:.2f}")
    if parts.host_to_device_bytes_per_s:
        table.add_row("host->device / device->host (GB/s)",
                      f"{parts.host_to_device_bytes_per_s / 1e9:.2f} / {parts.device_to_host_bytes_per_s / 1e9:.2f}")
    if parts.file:
        table.add_row(f"file write / read in {parts.file.path} (GB/s)",
                      f"{parts.file.write_bytes_per_s / 1e9:.3f} / {parts.file.read_bytes_per_s / 1e9:.3f}")
    return table


def collectives_table(parts) -> Table:
    table = Table(title=f"collectives ({parts.backend}), t = latency + bytes / algbw; busbw as nccl-tests",
                  title_justify="left")
    for col in ("op", "level", "ranks", "latency us", "algbw GB/s", "busbw GB/s"):
        table.add_column(col, justify="right" if col not in ("op", "level") else "left")
    for c in parts.collectives:
        table.add_row(c.op, c.level, str(c.ranks), f"{c.fit.latency_s * 1e6:.1f}",
                      f"{c.fit.bytes_per_s / 1e9:.3f}", f"{c.bus_bytes_per_s / 1e9:.3f}")
    return table


def steps_table(steps: list[dict]) -> Table:
    table = Table(title="held-apart steps: predicted from the parts / measured (ms)", title_justify="left")
    for col in ("config", "step pred", "step meas", "error", "compute p/m", "comm p/m", "optimizer p/m"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for r in step_rows(steps):
        p, m = r["predicted"], r["measured"]
        table.add_row(r["name"], f"{p['step_s'] * 1e3:.1f}", f"{m['step_s'] * 1e3:.1f}",
                      f"{r['step_error_pct']:+.1f} %",
                      f"{p['compute_s'] * 1e3:.1f} / {_ms(m['compute_s'])}",
                      f"{p['communication_s'] * 1e3:.1f} / {m['communication_s'] * 1e3:.1f}",
                      f"{p['optimizer_s'] * 1e3:.1f} / {m['optimizer_s'] * 1e3:.1f}")
    return table


def render_human(parts, written: list[str], steps: list[dict]) -> None:
    console = human_console()
    print_table(console, parts_table(parts))
    if parts.collectives:
        print_table(console, collectives_table(parts))
    if steps:
        print_table(console, steps_table(steps))
        console.print("measured comm = summed gloo/nccl records of torch.profiler (they run on the backend's "
                      "threads and may overlap compute); compute = forward+backward - comm")
    for path in written:
        console.print(f"wrote {path}")
