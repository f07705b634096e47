"""Parts measured, whole predicted: `zplan calibrate hardware` on this CPU machine.

1. Calibrate the parts (GEMM table, kernel curves, Adam, gloo collectives on 2 processes, and
   the contention probes: GEMM / copies / dispatch with both ranks at once, and with an
   all-reduce in flight; the reuse part: each memory-bound kind timed after D bytes of traffic).
2. Predict, from the parts only, the step time of the held-apart configurations of
   planner/calibrate/heldout.py, then run them for real and print predicted vs measured per term:
   the SEEN set (every configuration whose errors were looked at in earlier sessions) and the NEW
   set (five configurations committed before any of them was run) in separate tables.
No efficiency or time of any of these steps is used to fit anything. Goal: step within 15 %.
The machine load (`uptime`'s 1-minute load average) is printed with every row, `uptime` with
every run; the "spread" column is the measured steps' interquartile range over their median.
Parts and steps follow one procedure (planner/calibrate/procedure.py: each rank pinned to its
own cores, the same threads, 10 timed steps after 3 warm-up, median). `--runs N` repeats the
whole thing (fresh parts each time) and ends with one `SUMMARY` line per run to quote.

    python benchmarks/calibrate_hardware.py --runs 3         # wall clock (a quiet machine)
    python benchmarks/calibrate_hardware.py --clock thread   # each rank's CPU time (a shared machine)
    python benchmarks/calibrate_hardware.py --parts parts.json   # reuse saved parts, steps only
    python benchmarks/calibrate_hardware.py --set new        # only the NEW held-out set
    python benchmarks/calibrate_hardware.py --no-shapes      # GEMMs from the table, FSDP2 from the width curve
    python benchmarks/calibrate_hardware.py --attribute 3    # no prediction table: the SEEN one-process
                                                             # steps per op class (predicted / alone / in step)
    python benchmarks/calibrate_hardware.py --stability 4    # no prediction: three SEEN steps measured
                                                             # 4 times each, pinned and not (alternating)

Not a test: nothing asserts; a shared machine makes every figure noisy. Runtime ~4 min per run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.calibrate.fsdp2_collectives import group_elements  # noqa: E402
from planner.calibrate.hardware_run import HardwareConfig, calibrate_local  # noqa: E402
from planner.calibrate.heldout import new_heldout_configs, seen_configs  # noqa: E402
from planner.calibrate.parts import HardwareParts  # noqa: E402
from planner.calibrate.predict import predict_step, with_fsdp2_groups, with_step_shapes  # noqa: E402
from planner.calibrate.steps import measure_step  # noqa: E402
from planner.core.params import count_params  # noqa: E402
from planner.io.loading import load_model  # noqa: E402


def _parts(args) -> HardwareParts:
    if args.parts and Path(args.parts).exists():
        return HardwareParts.model_validate_json(Path(args.parts).read_text())
    start = time.perf_counter()
    parts = calibrate_local(HardwareConfig(device="cpu", nproc=2, clock=args.clock), lambda _what: None)
    print(f"\nparts calibrated in {time.perf_counter() - start:.0f} s ({parts.threads_per_rank} thread/rank, "
          f"clock={parts.clock}, host {parts.host}, {parts.date})")
    if args.parts:
        Path(args.parts).write_text(parts.model_dump_json(indent=1))
    return parts


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.1f}"


def _us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:.1f} us"


def _load() -> str:
    """The 1-minute load average (as `uptime` prints it)."""
    return f"{os.getloadavg()[0]:.2f}"


def _contention(parts: HardwareParts) -> None:
    if not parts.contention:
        print("no contention probes in these parts (one rank, or an older parts file)")
        return
    print("contention: slowdown with 2 ranks at once, mean over the ranks (alone ms -> together ms, per rank):")
    for c in parts.contention:
        alone = "/".join(f"{t * 1e3:.3g}" for t in c.alone_s)
        together = "/".join(f"{t * 1e3:.3g}" for t in c.together_s)
        print(f"  {c.probe:<36} {'with all-reduce' if c.with_collective else 'quiet':<15} "
              f"x{c.slowdown:.2f}  ({alone} -> {together} ms)")


class Split:
    """One table's errors: with every part, without the contention part, without the page-fault
    part, with FSDP2's width curve only (no group measured at its shapes), and the steps' spreads (%)."""

    def __init__(self) -> None:
        self.errors: list[float] = []
        self.bare: list[float] = []
        self.no_faults: list[float] = []
        self.curve: list[float] = []
        self.spreads: list[float] = []

    def figures(self) -> str:
        if not self.errors:
            return "not run"
        return (f"mean {statistics.fmean(self.errors):.1f} % / max {max(self.errors):.1f} % "
                f"(no contention {statistics.fmean(self.bare):.1f} / {max(self.bare):.1f} %; "
                f"no page faults {statistics.fmean(self.no_faults):.1f} / {max(self.no_faults):.1f} %; "
                f"FSDP2 width curve only {statistics.fmean(self.curve):.1f} / {max(self.curve):.1f} %; "
                f"step spread median {statistics.median(self.spreads):.1f} %, max {max(self.spreads):.1f} %)")


def _table(title: str, configs, parts: HardwareParts) -> Split:
    bare = parts.model_copy(update={"contention": ()})
    no_faults = parts.model_copy(update={"fault_s_per_page": None})
    curve = parts.model_copy(update={"fsdp2_groups": ()})
    print(f"\n{title}\n\n| configuration | params | step pred ms | (no contention) | step meas ms | spread | error | "
          "(no contention) | (no page faults) | (FSDP2 width curve) | compute p / m | page faults p ms | comm p / m | "
          "optimizer p / m | load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    split = Split()
    for cfg in configs:
        p, p0, pf, pc = (predict_step(cfg, x) for x in (parts, bare, no_faults, curve))
        before = _load()
        m = measure_step(cfg, parts.threads_per_rank, clock=parts.clock)
        err, err0, err_f, err_c = ((x.step_s - m.step_s) / m.step_s * 100 for x in (p, p0, pf, pc))
        split.errors.append(abs(err))
        split.bare.append(abs(err0))
        split.no_faults.append(abs(err_f))
        split.curve.append(abs(err_c))
        split.spreads.append(m.step_spread * 100)
        print(f"| {cfg.name} | {count_params(cfg.model).total / 1e6:.1f} M | {_ms(p.step_s)} | {_ms(p0.step_s)} | "
              f"{_ms(m.step_s)} | {m.step_spread * 100:.0f} % | {err:+.1f} % | {err0:+.1f} % | {err_f:+.1f} % | {err_c:+.1f} % | {_ms(p.compute_s)} / {_ms(m.compute_s)} | "
              f"{_ms(p.page_fault_s)} | "
              f"{_ms(p.communication_s)} / {_ms(m.communication_s)} | {_ms(p.optimizer_s)} / {_ms(m.optimizer_s)} | "
              f"{before} -> {_load()} |", flush=True)
    print(f"\n{title}: |error| {split.figures()} (goal 15 %)")
    return split


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"load average {_load()}"


def one_run(args, number: int) -> str:
    """Parts, SEEN, NEW; the run's SUMMARY line."""
    start, up = time.strftime("%H:%M", time.gmtime()), _uptime()
    print(f"\n=== run {number}/{args.runs} start {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; uptime: {up}")
    parts = _parts(args)
    base = load_model("gpt2")
    seen_rows = seen_configs(base, 2) if args.which in ("seen", "both") else []
    new_rows = new_heldout_configs(base, 2) if args.which in ("new", "both") else []
    configs = seen_rows + new_rows
    if not args.no_shapes:
        start_shapes = time.perf_counter()
        parts = with_step_shapes(parts, configs)
        print(f"GEMMs at the steps' shapes and layouts: {len(parts.shape_gemms)} distinct calls timed alone in "
              f"{time.perf_counter() - start_shapes:.0f} s (planner/calibrate/shape_gemms.py)")
        start_groups = time.perf_counter()
        parts = with_fsdp2_groups(parts, configs)
        print(f"FSDP2 groups at the steps' parameter shapes: {len(parts.fsdp2_groups)} distinct groups timed in "
              f"{time.perf_counter() - start_groups:.0f} s (planner/calibrate/fsdp2_collectives.py measure_groups)")
        for g in parts.fsdp2_groups:
            group_bytes = 4 * group_elements(g.shapes)
            print(f"  {'block' if g.resharded else 'root '} group of {len(g.shapes)} tensors, {group_bytes / 2**20:.2f} MiB: "
                  f"{g.seconds * 1e3:.1f} ms at its shapes, {parts.fsdp2_curve(g.resharded, g.ranks).seconds(group_bytes) * 1e3:.1f} "
                  "ms on the width curve")
    ar = parts.collective("all_reduce", 2).fit
    hook = "n/a" if parts.fsdp2_hook_s is None else f"{parts.fsdp2_hook_s * 1e6:.0f} us"
    print(f"GEMM peak (best on grid) {parts.peak_flops_per_s['fp32'] / 1e9:.1f} GFLOP/s; copy "
          f"{parts.kernel('copy').large_bytes_per_s / 1e9:.2f} GB/s; Adam {1 / parts.optimizer.per_element_s:.3g} "
          f"params/s; all-reduce x2 alpha {ar.latency_s * 1e6:.0f} us, busbw {ar.bytes_per_s / 1e9:.2f} GB/s; "
          f"FSDP2 hook {hook}; dispatch per op {_us(parts.dispatch_per_op_s)}; page fault "
          f"{_us(parts.fault_s_per_page)}; load {_load()}")
    if parts.reuse:
        print(f"reuse part: last-level cache {parts.last_level_cache_bytes / 2**20:.0f} MiB "
              f"({parts.last_level_cache_source}); ratio t(D) / t(0) at D = "
              + ", ".join(f"{d / 2**20:.0f}" for d in parts.reuse[0].distances_bytes) + " MiB, smallest / largest size: "
              + "; ".join(f"{c.kind} {'/'.join(f'{r:.2f}' for r in c.ratios[0])} | "
                          f"{'/'.join(f'{r:.2f}' for r in c.ratios[-1])}" for c in parts.reuse))
    for f in parts.fsdp2_collectives:
        print(f"FSDP2 as called ({'block, resharded' if f.resharded else 'root, not resharded'}) x{f.ranks}: per group "
              f"alpha {f.fit.latency_s * 1e3:.2f} ms, {f.fit.bytes_per_s / 1e9:.2f} GB/s of group bytes; points "
              + ", ".join(f"{b / 2**20:.2f} MiB {t * 1e3:.1f} ms" for b, t in zip(f.sizes_bytes, f.times_s)))
    for f in parts.engine_optimizers:
        print(f"{f.engine} optimizer step as called x{f.ranks}: latency {f.fit.latency_s * 1e3:.2f} ms, "
              f"{f.fit.per_tensor_s * 1e6:.0f} us per tensor, {f.fit.per_element_s * 1e9:.2f} ns per element "
              "(planner/calibrate/engine_optimizer.py)")
    _contention(parts)
    seen = _table("SEEN (every configuration of the earlier sessions)", seen_rows, parts) if seen_rows else Split()
    new = _table("NEW held-out (committed before they were first run)", new_rows, parts) if new_rows else Split()
    end_up = _uptime()
    print(f"uptime at the end of run {number}: {end_up}")
    return (f"SUMMARY run {number}/{args.runs} {start}-{time.strftime('%H:%M', time.gmtime())} UTC "
            f"(load {up.rsplit('average:', 1)[-1].strip()} -> {end_up.rsplit('average:', 1)[-1].strip()}): "
            f"SEEN {seen.figures()}; NEW {new.figures()}")


def _args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall")
    parser.add_argument("--parts", help="JSON file of calibrated parts: read if it exists, else written")
    parser.add_argument("--set", choices=("seen", "new", "both"), default="both", dest="which")
    parser.add_argument("--runs", type=int, default=1, help="repeat parts + steps this many times (>= 1)")
    parser.add_argument("--no-shapes", action="store_true",
                        help="predict GEMMs from the table and FSDP2 groups from the width curve only "
                             "(nothing timed at the steps' shapes)")
    parser.add_argument("--attribute", type=int, default=0, metavar="ROUNDS",
                        help="only attribute the SEEN single-process steps per op class (parts, then ROUNDS rounds)")
    parser.add_argument("--stability", type=int, default=0, metavar="N",
                        help="only measure three SEEN steps N times, pinned and not (no parts, no prediction)")
    args = parser.parse_args()
    if args.stability < 0:
        parser.exit(2, f"calibrate_hardware.py: error: --stability must be at least 0, got {args.stability}\n")
    if args.attribute < 0:
        parser.exit(2, f"calibrate_hardware.py: error: --attribute must be at least 0, got {args.attribute}\n")
    if args.runs < 1:
        parser.exit(2, f"calibrate_hardware.py: error: --runs must be at least 1, got {args.runs}\n")
    if args.parts and Path(args.parts).exists():
        try:
            HardwareParts.model_validate_json(Path(args.parts).read_text())
        except (OSError, ValueError) as err:
            first = str(err).splitlines()[0]
            parser.exit(2, f"calibrate_hardware.py: error: --parts {args.parts}: not a parts file ({first})\n")
    return args


def stability(repeats: int) -> None:
    """Why runs differ: three SEEN steps measured `repeats` times with the ranks pinned and left to
    the scheduler, alternating; per step and placement the run-to-run range of the medians."""
    configs = [c for c in seen_configs(load_model("gpt2"), 2)
               if c.name in ("small b4 x1", "large b2 DDP x2", "large b1 FSDP2 x2")]
    threads = max(1, (os.cpu_count() or 1) // 2)
    print(f"stability: {repeats} repeats, {threads} thread/rank; uptime: {_uptime()}")
    print("\n| repeat | placement | configuration | step median ms | spread | load |\n|---:|---|---|---:|---:|---:|")
    medians: dict[tuple[str, str], list[float]] = {}
    for rep in range(1, repeats + 1):
        for placement in ("scheduler", "pinned"):
            for cfg in configs:
                m = measure_step(cfg, threads, pin_ranks=placement == "pinned")
                medians.setdefault((cfg.name, placement), []).append(m.step_s)
                print(f"| {rep} | {placement} | {cfg.name} | {_ms(m.step_s)} | {m.step_spread * 100:.0f} % | {_load()} |",
                      flush=True)
    print("\nrun-to-run (max - min) / median of the medians:")
    for (name, placement), values in medians.items():
        spread = (max(values) - min(values)) / statistics.median(values) * 100
        print(f"  STABILITY {name:<20} {placement:<9} median {statistics.median(values) * 1e3:7.1f} ms, "
              f"range {spread:5.1f} % over {len(values)} ({', '.join(f'{v * 1e3:.0f}' for v in values)} ms)")
    print(f"uptime: {_uptime()}")


def attribute(args) -> None:
    """Per op class of each SEEN single-process step: the parts' prediction, the ops timed alone at
    the step's shapes, the real step's profiler self time (planner/calibrate/attribution.py)."""
    from planner.calibrate.attribution import attribute as attribute_step
    from planner.calibrate.procedure import pinned

    print(f"attribution; uptime: {_uptime()}")
    parts = _parts(args)
    configs = [c for c in seen_configs(load_model("gpt2"), 2) if c.strategy == "single"]
    parts = parts if args.no_shapes else with_step_shapes(parts, configs)
    with pinned(0, parts.threads_per_rank):
        for cfg in configs:
            a = attribute_step(cfg, parts, rounds=args.attribute)
            total = lambda field: sum(getattr(c, field) for c in a.classes) * 1e3  # noqa: E731
            print(f"\n{a.name}: forward+backward {a.wall_s * 1e3:.1f} ms (median); predicted {total('predicted_s'):.1f}, "
                  f"ops alone {total('isolated_s'):.1f}, in-step aten self {total('in_step_s'):.1f}, outside aten ops "
                  f"{a.outside_aten_s * 1e3:.1f} ms; load {_load()}\n\n| class | ops | predicted ms | alone ms | in step ms |\n"
                  "|---|---:|---:|---:|---:|")
            for c in a.classes:
                print(f"| {c.kind} | {c.ops} | {c.predicted_s * 1e3:.2f} | {c.isolated_s * 1e3:.2f} | {c.in_step_s * 1e3:.2f} |",
                      flush=True)
    print(f"\nuptime: {_uptime()}")


def main() -> None:
    args = _args()
    if args.attribute:
        attribute(args)
        return
    if args.stability:
        stability(args.stability)
        return
    t0 = time.perf_counter()
    summaries = [one_run(args, n) for n in range(1, args.runs + 1)]
    print(f"\ntotal runtime {time.perf_counter() - t0:.0f} s; end load average {_load()}")
    print("measured comm: summed gloo records of torch.profiler (busy time on gloo's threads, may overlap "
          "compute); measured compute = forward+backward - comm (n/a when the records add up to more); "
          "(no contention): the same prediction without the contention part; spread: interquartile range "
          "of the 10 timed steps over their median")
    if args.clock == "thread":
        print("clock=thread: each rank's main-thread CPU time; a rank blocked waiting for a collective uses "
              "none, so measured distributed steps leave out exposed communication (compare them with care)")
    print()
    for line in summaries:
        print(line)


if __name__ == "__main__":
    main()
