"""Collectives through torch.distributed, timed over message sizes and fitted to α–β.

Ops: all-reduce, all-gather (into one tensor), reduce-scatter (from one tensor), all-to-all
(single tensor) and send/recv (each rank sends to the next and receives from the previous, as
nccl-tests' sendrecv does). Sizes are nccl-tests' (NVIDIA/nccl-tests doc/PERFORMANCE.md).
After the collectives, the contention probes (planner.calibrate.contention) run on each node's
ranks. Levels: `intra` is the ranks of one node (every node's group runs at once, node 0's is timed);
`inter` is one rank per node (the ranks of local rank 0; timed when there are >= 2 nodes).

Two launchers, no other: a single machine is `torch.multiprocessing.spawn` meeting through a
FileStore in a temporary directory; a cluster is `torchrun`, read from the environment it sets
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; torch/distributed/run.py).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from planner.calibrate.fits import fit_alpha_beta
from planner.calibrate.engine_optimizer import EngineOptimizerFit
from planner.calibrate.engine_optimizer import measure as measure_engine_optimizers
from planner.calibrate.fsdp2_collectives import Fsdp2CollectiveFit, Fsdp2GroupCost, measure_groups
from planner.calibrate.fsdp2_collectives import measure as measure_fsdp2
from planner.calibrate.contention import measure_contention
from planner.calibrate.hardware import use_clock
from planner.calibrate.parts import CollectiveFit, ContentionPoint
from planner.calibrate.procedure import pin
from planner.core.errors import PlanInputError

CPU_MESSAGE_BYTES = tuple(1024 * 4**i for i in range(9))  # 1 KiB .. 64 MiB
CUDA_MESSAGE_BYTES = tuple(1024 * 4**i for i in range(11))  # 1 KiB .. 1 GiB


def message_sizes(max_bytes: int, device_type: str) -> tuple[int, ...]:
    sizes = CUDA_MESSAGE_BYTES if device_type == "cuda" else CPU_MESSAGE_BYTES
    chosen = tuple(s for s in sizes if s <= max_bytes)
    if len(chosen) < 2:
        raise PlanInputError("max-message-bytes", f"must be at least {sizes[1]} (two sizes to fit), got {max_bytes}")
    return chosen


def _op(op: str, num_bytes: int, group, device: torch.device):
    """A closure running `op` once on a message of nccl-tests size `num_bytes` (fp32)."""
    n = dist.get_world_size(group)
    rank = dist.get_rank(group)
    numel = max(num_bytes // 4 // n * n, n)
    buf = torch.ones(numel, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(buf, group=group)
    if op == "all_gather":
        shard = torch.ones(numel // n, device=device)
        return lambda: dist.all_gather_into_tensor(buf, shard, group=group)
    if op == "reduce_scatter":
        shard = torch.empty(numel // n, device=device)
        return lambda: dist.reduce_scatter_tensor(shard, buf, group=group)
    if op == "all_to_all":
        out = torch.empty_like(buf)
        return lambda: dist.all_to_all_single(out, buf, group=group)
    if op == "send_recv":
        peers = dist.get_process_group_ranks(group)
        nxt, prv = peers[(rank + 1) % n], peers[(rank - 1) % n]
        inbox = torch.empty_like(buf)

        def sendrecv():
            ops = [dist.P2POp(dist.isend, buf, nxt, group), dist.P2POp(dist.irecv, inbox, prv, group)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        return sendrecv
    raise ValueError(f"unknown collective {op!r}")


def time_op(op: str, num_bytes: int, group, device: torch.device, reps: int) -> float:
    """Median seconds of `op` (after a warm-up and a barrier), as this rank saw it."""
    fn = _op(op, num_bytes, group, device)
    fn()
    times = []
    for _ in range(reps):
        dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _reps(num_bytes: int) -> int:
    """Timings per point (median): 5 from 16 MiB up, 10 below (planner.calibrate.procedure)."""
    return 5 if num_bytes >= 2**24 else 10


def measure_group(level: str, group, sizes: tuple[int, ...], ops: tuple[str, ...],
                  device: torch.device, progress=None) -> list[CollectiveFit]:
    """Every op at every size on `group`, fitted on the group's first rank (None elsewhere);
    `progress(op, size)` after each point."""
    ranks = dist.get_world_size(group)
    fits = []
    for op in ops:
        times = []
        for size in sizes:
            _guard(op, size, lambda: times.append(time_op(op, size, group, device, _reps(size))))
            if progress:
                progress(op, size)
        if dist.get_rank(group) == 0:
            fits.append(_fitted(op, level, ranks, sizes, times))
    return fits


def _fitted(op: str, level: str, ranks: int, sizes, times) -> CollectiveFit:
    try:
        fit = fit_alpha_beta(sizes, times)
    except ValueError:
        raise PlanInputError("max-message-bytes", f"{op} times do not grow with size over {sizes[0]}-{sizes[-1]} B "
                             "(latency-bound or noisy): measure larger messages") from None
    return CollectiveFit(op=op, level=level, ranks=ranks, sizes_bytes=tuple(map(float, sizes)),
                         times_s=tuple(times), fit=fit)


class CollectiveFailed(RuntimeError):
    """A collective raised (timed out, peer gone); carries which op and size."""

    def __init__(self, op: str, size: int, message: str) -> None:
        super().__init__(f"{op} of {size} bytes: {message}")
        self.op, self.size, self.message = op, size, message


def _guard(op: str, size: int, fn) -> None:
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - c10d raises RuntimeError / DistBackendError
        raise CollectiveFailed(op, size, " ".join(str(err).split())[:300]) from None


def node_groups(world: int, local_world: int, timeout_s: float):
    """Every rank creates every group (torch.distributed.new_group's rule); returns this rank's
    intra-node group (the default group on one node) and, with >= 2 nodes, the inter-node group of
    its local rank (else None). new_group does not inherit the default group's timeout (torch's
    default is 30 min), so it is passed on."""
    rank = dist.get_rank()
    nodes = world // local_world
    if nodes == 1:
        return dist.group.WORLD, None
    timeout = timedelta(seconds=timeout_s)
    intra = inter = None
    for node in range(nodes):
        group = dist.new_group(list(range(node * local_world, (node + 1) * local_world)), timeout=timeout)
        if rank // local_world == node:
            intra = group
    if nodes >= 2:
        for local in range(local_world):
            group = dist.new_group([node * local_world + local for node in range(nodes)], timeout=timeout)
            if rank % local_world == local:
                inter = group
    return intra, inter


def measure_all_levels(sizes, ops, device, world: int, local_world: int, timeout_s: float,
                       progress=None, stall_s: float = 0.0,
                       copy_max_bytes: int | None = None) -> tuple[list[CollectiveFit], list[ContentionPoint]]:
    """Intra-node on every node at once (node 0 reports), then inter-node on local rank 0's group;
    then the contention probes on the ranks of each node (planner.calibrate.contention).
    `stall_s`: this rank sleeps before the first collective (a straggler, for the timeout test)."""
    rank = dist.get_rank()
    intra, inter = node_groups(world, local_world, timeout_s)
    time.sleep(stall_s)
    fits, contention = [], []
    if local_world >= 2:
        fits += measure_group("intra", intra, sizes, ops, device, progress)
    dist.barrier()
    if inter is not None and rank % local_world == 0:
        fits += measure_group("inter", inter, sizes, ops, device, progress)
    dist.barrier()
    if local_world >= 2:
        contention = _guarded_contention(device, intra, copy_max_bytes)
    dist.barrier()
    return (fits, contention) if rank == 0 else ([], [])


def _guarded_contention(device, group, copy_max_bytes: int | None) -> list[ContentionPoint]:
    def tick(done: int, total: int, what: str) -> None:
        if dist.get_rank() == 0:
            print(f"\rcontention {done}/{total}: {what}      ", end="\n" if done == total else "",
                  file=sys.stderr, flush=True)

    try:
        return measure_contention(device, group, copy_max_bytes, progress=tick)
    except Exception as err:  # noqa: BLE001 - c10d raises RuntimeError / DistBackendError
        raise CollectiveFailed("all_reduce", 0, "during the contention probes: " + " ".join(str(err).split())[:300]) from None


# --------------------------------------------------------------------------- launch


def torchrun_env() -> dict[str, int] | None:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE as torchrun sets them, or None when not
    under torchrun. Bad values are input errors naming the variable."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    env = {}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        raw = os.environ.get(key, os.environ["WORLD_SIZE"] if key == "LOCAL_WORLD_SIZE" else "0")
        try:
            env[key] = int(raw)
        except ValueError:
            raise PlanInputError(key, f"must be a whole number, got {raw!r}") from None
    if env["WORLD_SIZE"] < 1:
        raise PlanInputError("WORLD_SIZE", f"must be at least 1, got {env['WORLD_SIZE']}")
    if env["LOCAL_WORLD_SIZE"] < 1 or env["WORLD_SIZE"] % env["LOCAL_WORLD_SIZE"]:
        raise PlanInputError("LOCAL_WORLD_SIZE", f"must divide WORLD_SIZE ({env['WORLD_SIZE']}), "
                             f"got {env['LOCAL_WORLD_SIZE']}")
    return env


def init(backend: str, timeout_s: float, rank: int, world: int, store_dir: str | None) -> None:
    """A FileStore in `store_dir` (spawned ranks) or torchrun's env:// rendezvous."""
    method = f"file://{store_dir}/store" if store_dir else "env://"
    dist.init_process_group(backend, init_method=method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def close(finished: bool) -> None:
    """Leave the process group. gloo aborts a rank ('terminate called without an active
    exception', SIGABRT) when a peer closes its connections while this rank's last collective
    is still draining them (seen under torchrun and spawn in CI); so when every rank finished its
    work (`finished`) they meet in a barrier first. After a failure no barrier: a peer may be
    gone, and the barrier would hang until the timeout. Garbage is collected first: FSDP2's module
    states hold reference cycles, and collected after the group is gone they made gloo abort the
    rank the same way (the FSDP2 group probe, every time in a script)."""
    gc.collect()
    if finished:
        dist.barrier()
    dist.destroy_process_group()


def rank_device(local_rank: int, want: str) -> torch.device:
    if want != "cpu" and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _start_rank(rank: int, world: int, store_dir: str, cfg: dict) -> torch.device:
    """A spawned rank's set-up: its device, pinned to its cores with the parts' threads and clock,
    in the process group."""
    import warnings

    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's rename notice
    device = rank_device(rank, cfg["device"])
    pin(rank, cfg["threads"], device.type)  # before gloo starts its threads: they inherit the mask
    torch.set_num_threads(cfg["threads"])
    use_clock(cfg.get("clock", "wall"))  # the probes time with the parts' clock
    init("nccl" if device.type == "cuda" else "gloo", cfg["timeout_s"], rank, world, store_dir)
    return device


def spawned_worker(rank: int, world: int, store_dir: str, cfg: dict) -> None:
    """One spawned rank: time the collectives; rank 0 writes `fits.json`, a failing rank writes
    `error-rank{r}.json`."""
    device = _start_rank(rank, world, store_dir, cfg)
    finished = False
    try:
        stall = cfg["stall_s"] if rank == cfg.get("stall_rank") else 0.0
        fits, contention = measure_all_levels(tuple(cfg["sizes"]), tuple(cfg["ops"]), device, world, world,
                                              cfg["timeout_s"], _stderr_progress(rank, len(cfg["ops"]) * len(cfg["sizes"])), stall,
                                              cfg.get("copy_max_bytes"))
        fsdp2 = fsdp2_on_node(device, world, world)
        optimizers = engine_optimizers_on_node(device, world, world)
        if rank == 0:
            Path(store_dir, "fits.json").write_text(json.dumps({"collectives": [f.model_dump() for f in fits],
                                                                "contention": [c.model_dump() for c in contention],
                                                                "fsdp2": [f.model_dump() for f in fsdp2],
                                                                "engine_optimizers": [f.model_dump() for f in optimizers]}))
        finished = True
    except CollectiveFailed as err:
        _report(store_dir, rank, {"op": err.op, "size": err.size, "message": err.message})
    except PlanInputError as err:
        _report(store_dir, rank, {"field": err.field, "message": err.message})
    except Exception as err:  # noqa: BLE001 - reported to the parent, which raises
        _report(store_dir, rank, {"message": f"{type(err).__name__}: {err}"})
    finally:
        close(finished)


def fsdp2_on_node(device: torch.device, world: int, local_world: int) -> list[Fsdp2CollectiveFit]:
    """FSDP2 as it calls its collectives (planner.calibrate.fsdp2_collectives) on the ranks of a
    single node (every rank calls it; none with one rank or several nodes, not measured there)."""
    if world < 2 or world != local_world:
        return []
    try:
        return measure_fsdp2(dist.group.WORLD, device)
    except Exception as err:  # noqa: BLE001 - c10d raises RuntimeError / DistBackendError
        raise CollectiveFailed("fsdp2", 0, "during the FSDP2 probe: " + " ".join(str(err).split())[:300]) from None


def engine_optimizers_on_node(device: torch.device, world: int, local_world: int) -> list[EngineOptimizerFit]:
    """ZeRO-1's and FSDP2's optimizer steps as the engines call them (planner.calibrate.
    engine_optimizer) on the ranks of a single node (none with one rank or several nodes)."""
    if world < 2 or world != local_world:
        return []
    try:
        return measure_engine_optimizers(dist.group.WORLD, device)
    except Exception as err:  # noqa: BLE001 - c10d raises RuntimeError / DistBackendError
        raise CollectiveFailed("optimizer", 0, "during the engine optimizer probe: "
                               + " ".join(str(err).split())[:300]) from None


def _report(store_dir: str, rank: int, error: dict) -> None:
    Path(store_dir, f"error-rank{rank}.json").write_text(json.dumps(error))
    raise SystemExit(3)


def _stderr_progress(rank: int, total: int):
    """Rank 0 prints one progress line per measured point on stderr (the ranks are separate
    processes; rich's live display belongs to the parent)."""
    if rank != 0 or total <= 0:
        return None
    done = [0]

    def tick(op: str, size: int) -> None:
        done[0] += 1
        print(f"\rcollectives {done[0]}/{total}: {op} {size} B      ", end="", file=sys.stderr, flush=True)
        if done[0] == total:
            print(file=sys.stderr)
    return tick


def spawn_collectives(nproc: int, cfg: dict) -> tuple[list[CollectiveFit], list[ContentionPoint],
                                                     list[Fsdp2CollectiveFit], list[EngineOptimizerFit]]:
    """Run the collectives, the contention probes, the FSDP2 probe and the engine optimizer probe
    on `nproc` local processes;
    a failed collective is an input error naming the op, or a timeout naming --timeout-s."""
    if nproc < 2:
        return [], [], [], []
    out = _spawn(spawned_worker, nproc, cfg, "fits.json")
    return ([CollectiveFit.model_validate(f) for f in out["collectives"]],
            [ContentionPoint.model_validate(c) for c in out["contention"]],
            [Fsdp2CollectiveFit.model_validate(f) for f in out.get("fsdp2", [])],
            [EngineOptimizerFit.model_validate(f) for f in out.get("engine_optimizers", [])])


def _spawn(worker, nproc: int, cfg: dict, result_name: str) -> dict:
    """`worker(rank, nproc, store_dir, cfg)` on `nproc` spawned processes meeting in a temporary
    directory; the JSON rank 0 wrote there as `result_name`, or the failure a rank reported."""
    import tempfile

    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    with tempfile.TemporaryDirectory(prefix="zplan-ranks-") as tmp:
        try:
            mp.spawn(worker, args=(nproc, tmp, cfg), nprocs=nproc, join=True)
        except ProcessException:
            raise _failure(Path(tmp), cfg["timeout_s"]) from None
        return json.loads(Path(tmp, result_name).read_text())


def fsdp2_groups_worker(rank: int, world: int, store_dir: str, cfg: dict) -> None:
    """One spawned rank of `spawn_fsdp2_groups`: rank 0 writes `groups.json`."""
    device = _start_rank(rank, world, store_dir, cfg)
    finished = False
    try:
        costs = measure_groups(dist.group.WORLD, device, cfg["groups"])
        if rank == 0:
            Path(store_dir, "groups.json").write_text(json.dumps([c.model_dump() for c in costs]))
        finished = True
    except Exception as err:  # noqa: BLE001 - reported to the parent, which raises
        _report(store_dir, rank, {"op": "fsdp2", "size": 0, "message": "during the FSDP2 group probe: "
                                  + " ".join(str(err).split())[:300]})
    finally:
        close(finished)


def spawn_fsdp2_groups(nproc: int, cfg: dict) -> list[Fsdp2GroupCost]:
    """FSDP2's per-group cost on the (resharded, shapes) groups `cfg["groups"]`
    (fsdp2_collectives.measure_groups) on `nproc` local processes."""
    if nproc < 2 or not cfg["groups"]:
        return []
    return [Fsdp2GroupCost.model_validate(c) for c in _spawn(fsdp2_groups_worker, nproc, cfg, "groups.json")]


def _failure(tmp: Path, timeout_s: float) -> Exception:
    errors = [json.loads(p.read_text()) for p in sorted(tmp.glob("error-rank*.json"))]
    if not errors:
        return RuntimeError("a calibration process died without reporting an error")
    for e in errors:
        if "field" in e:
            return PlanInputError(e["field"], e["message"])
        if "op" not in e:
            return RuntimeError(e["message"])
    timed_out = [e for e in errors if "timed out" in e["message"].lower() or "timeout" in e["message"].lower()]
    first = (timed_out or errors)[0]
    if timed_out:
        return PlanInputError("timeout-s", f"{first['op']} of {first['size']} bytes did not finish within "
                              f"{timeout_s:g} s (a rank stalled or a link is down); raise --timeout-s or check the ranks")
    return PlanInputError("collectives", f"{first['op']} of {first['size']} bytes failed: {first['message']}")
