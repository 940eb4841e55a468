"""Collectives, torch_hoplite side by side with gloo (issues #3, #6, #7).

    python -m torch_hoplite.bench [--ops broadcast,reduce,allreduce,gather,allgather]
        [--nodes 2,4,8] [--sizes 1MB,16MB,64MB,256MB] [--rate 1gbit]

What each system runs per op (every rank holds an integer-valued tensor):
  broadcast  hoplite: rank 0 puts, every other rank gets (no broadcast call:
             the directory builds the relay tree on the fly). gloo: dist.broadcast.
  reduce     hoplite: every rank puts, rank 0 calls reduce() and gets the
             result (the streaming tree's degree comes from the cost model).
             gloo: dist.reduce to rank 0.
  allreduce  hoplite: torch_hoplite.allreduce (a streaming reduce whose result
             every rank gets while it is computed). gloo: dist.all_reduce (ring).
  gather     hoplite: every rank puts, rank 0 gets them all concurrently.
             gloo: dist.gather to rank 0.
  allgather  hoplite: every rank puts, every rank gets them all concurrently.
             gloo: dist.all_gather (size = one rank's tensor).
"hoplite-c10d" is the torch.distributed backend "hoplite" (a process group over
the same node, static algorithms): the same dist.* call as gloo's. "mpi" is
Open MPI's MPI_Bcast / MPI_Reduce / MPI_Allreduce (mpi_peer.c, compiled with
mpicc), run after the torch systems of each node count: it busy-polls, each
waiting rank taking a core; "mpi-yield" is the same with mpi_yield_when_idle=1.
"hoplite-zero-copy" puts and gets with copy=False (broadcast, reduce, gather);
"hoplite" allreduce runs its default, the static ring (recursive doubling
under 128 KiB) over the nodes' messages; "hoplite-pieces" is allreduce(degree=1),
the object-store composition: tensors of N MiB or more cut into N pieces (N
reduces of 1/N each, one rooted at every rank, every rank gets every piece,
all around a ring); "hoplite-one-piece" is allreduce(shards=1): one reduce,
whose result every rank gets. Reduce-tree ablation: "hoplite-d1"
(chain), "hoplite-d2" (binary), "hoplite-dn" (flat: one node receives from all)
force the degree that the cost model otherwise picks ("hoplite").
All systems run in the same processes, interleaved trial by trial; time = from
the common start to the slowest participant's end (one monotonic clock per
host; on the emulated cluster the namespaces share the host's clock). Per point:
median / min / max of --trials timed trials after --warmup, algbw = size/time,
busbw = algbw x factor (allreduce 2(N-1)/N, gather and allgather N-1: the bytes
the busiest link carries, as size is one rank's tensor; else 1), CPU cores
used by all processes, the median spread of the ranks' starts (start_skew_s)
and time from the last start to the slowest end (after_last_start_s), and,
with --rate, the ratio to the ideal time (broadcast
and reduce S/B, allreduce 2(N-1)/N S/B, gather and allgather (N-1) S/B). Every trial's
result is checked exactly, outside the timed region, against memory reset to a
value no result has. On loopback the CPU, not a link, is the
bottleneck: --rate runs on the emulated cluster (emulated_cluster.py), after
checking the rate a single TCP flow gets through it; without root or network
namespaces it says so and measures on loopback instead.

--transport ucx runs the torch_hoplite systems over the UCX transport
(UCX_TLS=tcp unless set; on the emulated cluster UCX_NET_DEVICES=eth0, the
node's veth) instead of our TCP; gloo is unchanged, so two runs, one per
transport, compare through their gloo rows and ratios to the ideal.

Asynchrony (the Hoplite paper's Fig. 8): with --arrival-interval T rank r
becomes ready T*r seconds after the common start (for hoplite: rank 0 puts or
starts the reduce at once, rank r puts or gets at its time); each point is then
the time from the last arrival to the slowest participant's end.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from torch_hoplite.bench import common, latency_budget, mpi_peer

OPS = ["broadcast", "reduce", "allreduce", "gather", "allgather"]
SYSTEMS = ["hoplite", "hoplite-zero-copy", "hoplite-pieces", "hoplite-one-piece", "hoplite-d1", "hoplite-d2", "hoplite-dn",
           "hoplite-c10d", "gloo", *mpi_peer.SYSTEMS]
DEFAULT_SYSTEMS = "hoplite,gloo"
ONLY_FOR = {
    "hoplite-zero-copy": {"broadcast", "reduce", "gather"},
    "hoplite-pieces": {"allreduce"},
    "hoplite-one-piece": {"allreduce"},
    "hoplite-d1": {"reduce"},
    "hoplite-d2": {"reduce"},
    "hoplite-dn": {"reduce"},
    **{mpi: set(mpi_peer.OPS) for mpi in mpi_peer.SYSTEMS},
}


def expected(op: str, world: int, x: torch.Tensor) -> torch.Tensor:
    """Rank r holds r+1 everywhere."""
    if op in ("reduce", "allreduce"):
        return torch.full_like(x, world * (world + 1) / 2)
    return torch.ones_like(x)


def run_op(op: str, system: str, rank: int, world: int, x: torch.Tensor, buf: torch.Tensor, outs: list,
           tag: str, groups: dict):
    """One collective; returns what this rank received (None where nothing).
    A process group's gather/allgather write into `outs`, allocated (and
    faulted in) before the timed region, as our results come from a warm pool."""
    import torch_hoplite as hop

    if system in groups:  # a torch.distributed process group
        group = groups[system]
        if op == "broadcast":
            dist.broadcast(x if rank == 0 else buf, src=0, group=group)
            return buf if rank else None
        if op == "reduce":
            dist.reduce(buf, dst=0, group=group)
            return buf if rank == 0 else None
        if op == "allreduce":
            dist.all_reduce(buf, group=group)
            return buf
        if op == "allgather":
            dist.all_gather(outs, x, group=group)
            return outs
        dist.gather(x, outs if rank == 0 else None, dst=0, group=group)
        return outs if rank == 0 else None
    copy = system != "hoplite-zero-copy"
    if op == "broadcast":
        if rank == 0:
            hop.put(x, tag, copy=copy)
            return None
        return hop.get(tag, copy=copy).wait()
    if op == "allreduce":
        composed = {"hoplite-pieces": {"degree": 1}, "hoplite-one-piece": {"shards": 1}}
        return hop.allreduce(x, tag, **composed.get(system, {}))
    hop.put(x, f"{tag}/{rank}", copy=copy)
    ids = [f"{tag}/{r}" for r in range(world)]
    if op == "allgather":
        return hop.gather(ids)
    if rank != 0:
        return None
    if op == "reduce":
        degree = {"hoplite-d1": 1, "hoplite-d2": 2, "hoplite-dn": world - 1}.get(system)
        result, _ = hop.reduce(ids, id=tag, degree=degree)
        return hop.get(result, copy=copy).wait()
    return hop.gather(ids) if copy else [hop.get(i, copy=False).wait() for i in ids]


def cleanup(op: str, system: str, rank: int, tag: str) -> None:
    import torch_hoplite as hop

    if system in ("gloo", "hoplite-c10d") or op == "allreduce":  # allreduce deletes its own objects
        return
    if op == "broadcast":
        if rank == 0:
            hop.delete(tag)
        return
    hop.delete(f"{tag}/{rank}")
    if op == "reduce" and rank == 0:
        hop.delete(tag)


def reset(op: str, rank: int, x: torch.Tensor, buf: torch.Tensor) -> None:
    """Before each trial: the in-place ops' input, and a value no result has
    where a broadcast lands (so a call that wrote nothing fails its check)."""
    if op == "broadcast" and rank != 0:
        buf.fill_(-1.0)
    else:
        buf.copy_(x)


def gather_outputs(op: str, system: str, rank: int, world: int, x: torch.Tensor, groups: dict) -> list:
    """A process group's gather/allgather outputs, made (filled with a value no
    result has, so faulted in) before the timed region; [] for the others."""
    if system not in groups or not (op == "allgather" or (op == "gather" and rank == 0)):
        return []
    return [torch.full_like(x, -1.0) for _ in range(world)]


def check(op: str, rank: int, world: int, x: torch.Tensor, got) -> None:
    if got is None:
        return
    if op in ("gather", "allgather"):
        ok = all(torch.equal(t, torch.full_like(x, r + 1)) for r, t in enumerate(got))
    elif op == "broadcast":
        ok = torch.equal(got, torch.ones_like(x))
    else:
        ok = torch.equal(got, expected(op, world, x))
    if not ok:
        raise AssertionError(f"{op}: wrong result on rank {rank}")


# A timed trial of one rank: (start, end, CPU cores, bytes moved) and, traced, {"tag": ..., "steps": [...]}.
TRACE_FIELD = 4


def worker(rank, world, host, port, ops, sizes, trials, warmup, systems, arrival=0.0, trace=False) -> dict:
    """Every torch system (not MPI's, which run on their own after them).
    arrival > 0: rank r becomes ready (calls its part) r * arrival seconds after the others' start.
    Every rank waits --settle seconds between the barrier and its call, or
    with --common-start until the instant rank 0 sent (plus its arrival offset).
    trace: each timed trial of a torch_hoplite system also keeps the steps this
    rank traced during it (torch_hoplite.trace_events), for latency budgets."""
    settle = common.env_seconds(common.SETTLE_ENV)
    lead = common.env_seconds(common.COMMON_START_ENV)
    import torch_hoplite as hop

    systems = [s for s in systems if s not in mpi_peer.SYSTEMS]
    # N ranks share the host's cores: intra-op threads would spin-wait (OpenMP)
    # after the untimed buffer resets, taking CPU from the timed calls.
    torch.set_num_threads(1)
    store = dist.TCPStore(host, port, world, is_master=(rank == 0), timeout=datetime.timedelta(seconds=900))
    dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank, world_size=world)
    hop.init(dist.PrefixStore("hoplite", store), rank=rank, world_size=world)
    hop.enable_tracing(trace)
    groups = {"gloo": None}
    if "hoplite-c10d" in systems:
        groups["hoplite-c10d"] = dist.new_group(backend="hoplite")
    results = {}
    total = sum(len([s for s in systems if op in ONLY_FOR.get(s, {op})]) for op in ops) * len(sizes) * (warmup + trials)
    bar = _progress(total, f"{world} nodes") if rank == 0 else None
    for op in ops:
        runs = [s for s in systems if op in ONLY_FOR.get(s, {op})]
        for size in sizes:
            x = torch.full((size // 4,), 1.0 if op == "broadcast" else float(rank + 1))
            buf = torch.empty_like(x)
            for trial in range(warmup + trials):
                for system in runs if trial % 2 == 0 else runs[::-1]:
                    tag = f"{op}-{system}-{size}-{trial}"
                    before = hop.stats() if system.startswith("hoplite") else None
                    reset(op, rank, x, buf)
                    outs = gather_outputs(op, system, rank, world, x, groups)
                    dist.barrier()
                    hop.trace_events()  # only this trial's steps are kept
                    if lead:
                        instant = torch.tensor([time.monotonic() + lead], dtype=torch.float64)
                        dist.broadcast(instant, src=0)
                        wait = instant.item() + rank * arrival - time.monotonic()
                        if wait < 0:
                            print(f"rank {rank}: {tag} started {-wait * 1e3:.1f} ms after the common start "
                                  "(raise --common-start)", file=sys.stderr, flush=True)
                        time.sleep(max(0.0, wait))
                    elif settle or arrival:
                        time.sleep(settle + rank * arrival)
                    c0, t0 = time.process_time(), time.monotonic()
                    got = run_op(op, system, rank, world, x, buf, outs, tag, groups)
                    t1 = time.monotonic()
                    dist.barrier()
                    c1, t2 = time.process_time(), time.monotonic()
                    steps = hop.trace_events() if trace and before else []
                    check(op, rank, world, x, got)  # every trial, outside the timed region
                    del got, outs
                    cleanup(op, system, rank, tag)
                    if trial >= warmup:
                        moved = common.bytes_moved(before, hop.stats()) if before else (0, 0)
                        run = (t0, t1, (c1 - c0) / (t2 - t0), moved)
                        if steps:
                            run += ({"tag": tag, "steps": [[t, s, str(i), p, n] for t, s, i, p, n in steps]},)
                        results.setdefault((op, system, size), []).append(run)
                    if bar is not None:
                        bar.update(1)
    if bar is not None:
        bar.close()
    hop.barrier()
    hop.shutdown()
    dist.destroy_process_group()
    return results


def _path(system: str, network: str, hoplite_network: str, runs: list) -> str:
    """What carried a system's bytes (torch_hoplite's: from its nodes'
    counters, summed over its trials on every rank)."""
    if not system.startswith("hoplite"):
        return network
    moved = [trial[3] for run in runs for trial in run]
    return common.data_path(hoplite_network, sum(m[0] for m in moved), sum(m[1] for m in moved))


def _progress(total: int, what: str):
    """A tqdm bar on stderr (a line every 30 s when it is not a terminal); None without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=what, unit="run", mininterval=0.5 if sys.stderr.isatty() else 30)


def _queue_worker(rank, world, port, ops, sizes, trials, warmup, systems, arrival, trace, queue):
    queue.put((rank, worker(rank, world, "127.0.0.1", port, ops, sizes, trials, warmup, systems, arrival, trace)))


def run_loopback(world: int, ops: list[str], sizes: list[int], trials: int, warmup: int, systems: list[str],
                 arrival: float = 0.0, trace: bool = False) -> dict:
    per_rank = common.run_ranks(_queue_worker, world,
                                (world, common.free_port(), ops, sizes, trials, warmup, systems, arrival, trace))
    for mpi in _mpi_systems(systems, ops):
        _merge(per_rank, mpi_peer.run_loopback(world, ops, sizes, trials, warmup, arrival, system=mpi))
    return per_rank


# A link delivering less than this share of the configured rate makes every ratio to the ideal wrong.
MIN_LINK_SHARE = 0.85


def run_emulated(world: int, ops: list[str], sizes: list[int], trials: int, warmup: int, systems: list[str],
                 rate: str, link_checks: dict, arrival: float = 0.0, congestion: Optional[str] = None,
                 congestion_used: Optional[dict] = None, trace: bool = False) -> dict:
    """One process per network namespace, links limited to `rate` each way,
    after checking what one TCP flow gets through them (in link_checks[world]);
    the nodes' kernels default to `congestion` (None: the host's default; what
    they used goes in congestion_used[world])."""
    import json
    import tempfile

    from torch_hoplite.bench.emulated_cluster import EmulatedCluster

    with EmulatedCluster(world, rate=rate, congestion=congestion) as cluster, tempfile.TemporaryDirectory() as tmp:
        if congestion_used is not None:
            congestion_used[world] = cluster.node_congestion()
        if world >= 2:
            achieved = cluster.measure_rate()
            share = achieved / _rate_bps(rate)
            link_checks[world] = achieved
            print(f"link check: one TCP flow gets {achieved / 1e9:.3f} Gbit/s ({share:.1%} of {rate})", flush=True)
            if share < MIN_LINK_SHARE:
                raise RuntimeError(f"the emulated links deliver only {share:.0%} of {rate} "
                                   f"(expected ~95%): the host is too busy to emulate them; not measuring")
        env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", PYTHONUNBUFFERED="1")
        procs = []
        for r in range(world):
            cmd = [sys.executable, "-m", "torch_hoplite.bench", "--worker", str(r), "--nodes", str(world),
                   "--master", cluster.address(0), "--sizes", ",".join(map(str, sizes)), "--ops", ",".join(ops),
                   "--trials", str(trials), "--warmup", str(warmup), "--systems", ",".join(systems),
                   "--arrival-interval", str(arrival), "--out", os.path.join(tmp, f"rank{r}")] + ["--trace"] * trace
            procs.append(cluster.popen(r, cmd, env=env))
        for p in procs:
            if p.wait(timeout=1800) != 0:
                for q in procs:
                    q.kill()
                raise RuntimeError("a benchmark process failed (see its traceback above)")
        per_rank = {}
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                per_rank[r] = {}
                for key, runs in json.load(f).items():
                    op, system, size = key.split("/")
                    per_rank[r][(op, system, int(size))] = runs
        for mpi in _mpi_systems(systems, ops):
            _merge(per_rank, mpi_peer.run_emulated(cluster, world, ops, sizes, trials, warmup, arrival, env=env,
                                                   system=mpi))
        return per_rank


def _mpi_systems(systems: list[str], ops: list[str]) -> list[str]:
    return [s for s in systems if s in mpi_peer.SYSTEMS] if mpi_peer.OPS & set(ops) else []


def _merge(per_rank: dict, more: dict) -> None:
    for r, points in more.items():
        per_rank[r].update(points)


def ideal_and_factor(op: str, world: int) -> tuple[float, float]:
    """(ideal time in units of S/B, busbw factor)."""
    return {
        "broadcast": (1.0, 1.0),
        "reduce": (1.0, 1.0),
        "allreduce": (2 * (world - 1) / world, 2 * (world - 1) / world),
        "gather": (world - 1, world - 1),
        "allgather": (world - 1, world - 1),
    }[op]


def summarize(per_rank: dict, world: int, path: str, rate_bps: float, arrival: float = 0.0,
              hoplite_path: Optional[str] = None) -> list[dict]:
    """Per point: times from the common start (with staggered arrivals: from
    the last arrival) to the slowest participant's end. `path` is the network,
    `hoplite_path` what carried torch_hoplite's bytes over it (default: the same)."""
    records = []
    for key in per_rank[0]:
        op, system, size = key
        runs = [per_rank[r][key] for r in range(world)]
        trials = len(runs[0])
        start = max if arrival else min
        times = [max(run[i][1] for run in runs) - start(run[i][0] for run in runs) for i in range(trials)]
        # The spread of the ranks' starts (what leaving the barrier took; on the
        # emulated cluster every node shares this host's cores; staggered
        # arrivals are taken out) and the time from the last start on: the
        # part of `times` the op itself controls.
        starts = [[run[i][0] - r * arrival for r, run in enumerate(runs)] for i in range(trials)]
        skews = [max(s) - min(s) for s in starts]
        after_last = [max(run[i][1] for run in runs) - max(run[i][0] for run in runs) for i in range(trials)]
        cores = [sum(run[i][2] for run in runs) for i in range(trials)]
        median = statistics.median(times)
        units, factor = ideal_and_factor(op, world)
        ideal = units * size / (rate_bps / 8) if rate_bps and not arrival else None
        traced = all(len(run[i]) > TRACE_FIELD for run in runs for i in range(trials))
        bounds = [(start(run[i][0] for run in runs), max(run[i][1] for run in runs)) for i in range(trials)]
        budget = latency_budget.summarize(
            op, [[(run[i][0], run[i][1], run[i][TRACE_FIELD]["steps"]) for run in runs] for i in range(trials)],
            [runs[0][i][TRACE_FIELD]["tag"] for i in range(trials)], bounds) if traced and trials else None
        records.append(
            {
                "system": system,
                "op": op,
                "nodes": world,
                "path": _path(system, path, hoplite_path or path, runs),
                "size_bytes": size,
                "arrival_interval_s": arrival,
                "ideal_s": ideal,
                "ratio_to_ideal": median / ideal if ideal else None,
                "trials": trials,
                "median_s": median,
                "min_s": min(times),
                "max_s": max(times),
                "algbw_gbps": size / median / 1e9,
                "busbw_gbps": size / median / 1e9 * factor,
                "cpu_cores": statistics.median(cores),
                "times_s": times,
                "start_skew_s": statistics.median(skews),
                "after_last_start_s": statistics.median(after_last),
                **({"budget": budget} if budget else {}),
            }
        )
    return records


# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (normal beyond).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def paired(times: list[float], gloo_times: list[float]) -> dict:
    """Trial i of a torch system ran in the same round as gloo's trial i (same
    processes, order alternating), so their difference cancels what drifts
    between trials: the median of the per-trial ratios, the mean difference
    with its 95% confidence interval (Student's t; None from one trial), and
    in how many trials the system was faster."""
    if len(times) != len(gloo_times):
        raise ValueError(f"{len(times)} trials against gloo's {len(gloo_times)}")
    diffs = [(t - g) * 1e3 for t, g in zip(times, gloo_times)]
    mean = statistics.fmean(diffs)
    n = len(diffs)
    ci = None
    if n > 1:
        half = (_T975[n - 2] if n - 1 <= len(_T975) else 1.96) * statistics.stdev(diffs) / n**0.5
        ci = [mean - half, mean + half]
    return {
        "trials": n,
        "median_ratio": statistics.median(t / g for t, g in zip(times, gloo_times)),
        "mean_diff_ms": mean,
        "ci95_diff_ms": ci,
        "faster_trials": sum(d < 0 for d in diffs),
    }


def peak_bytes(op: str, world: int, size: int) -> int:
    """Roughly the memory all ranks together hold at once for one point: the
    store's copies plus the tensors handed out (gloo needs less)."""
    if op == "allgather":
        return 2 * world * world * size  # every rank: every tensor, in its store and returned
    if op == "gather":
        return 3 * world * size  # every rank its own; rank 0 all of them, stored and returned
    return 4 * world * size  # input, store copy, received copy, result


def _rate_bps(rate: str) -> float:
    """'1gbit' -> 1e9, '500mbit' -> 5e8 (tc's decimal units)."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for suffix, scale in units.items():
        if rate.lower().endswith(suffix):
            return float(rate[: -len(suffix)]) * scale
    raise ValueError(f"rate {rate!r}: use e.g. 1gbit or 500mbit")


def _colors(records: list[dict]) -> dict[str, Any]:
    """One colour per system, the same in every panel."""
    import matplotlib.pyplot as plt

    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in records)]
    return {s: cycle[i % len(cycle)] for i, s in enumerate(systems)}


def _plot_bars(records: list[dict], path: str) -> None:
    """One size and node count: a bar per system and op (time over the ideal,
    or the median time without one)."""
    import matplotlib.pyplot as plt

    colors = _colors(records)
    ops = [op for op in OPS if any(r["op"] == op for r in records)]
    ideal = all(r["ratio_to_ideal"] for r in records)
    key, label = ("ratio_to_ideal", "time / ideal (median)") if ideal else ("median_s", "median time (s)")
    width = 0.8 / len(colors)
    labeled: set[str] = set()
    fig, ax = plt.subplots(figsize=(1.6 + 1.9 * len(ops), 4.2))
    for i, (system, color) in enumerate(colors.items()):
        for j, op in enumerate(ops):
            r = next((r for r in records if r["system"] == system and r["op"] == op), None)
            if r is None:
                continue
            x = j + (i - (len(colors) - 1) / 2) * width
            ax.bar(x, r[key], width, color=color, label=None if system in labeled else system)
            labeled.add(system)
            ax.text(x, r[key], f"{r[key]:.2f}", ha="center", va="bottom", fontsize=7, rotation=90)
    if ideal:
        ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(ops)))
    ax.set_xticklabels(ops)
    ax.set_ylabel(label)
    r0 = records[0]
    ax.set_title(f"{r0['nodes']} processes, {r0['size_bytes'] / 2**20:.0f} MiB, {r0.get('path', '')}", fontsize=9)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def plot(records: list[dict], path: str) -> None:
    """One panel per op and node count: median time vs size, and below it (when
    there is a link to be ideal against) the time over the ideal; bars when
    there is one size and one node count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len({r["size_bytes"] for r in records}) == 1 and len({r["nodes"] for r in records}) == 1:
        return _plot_bars(records, path)
    colors = _colors(records)
    nodes = sorted({r["nodes"] for r in records})
    ops = [op for op in OPS if any(r["op"] == op for r in records)]
    after = "after the last arrival" if any(r.get("arrival_interval_s") for r in records) else "to slowest"
    kinds = [("median_s", f"time {after}, median (ms)", 1e3)]
    if all(r["ratio_to_ideal"] for r in records):
        kinds.append(("ratio_to_ideal", "time / ideal (median)", 1.0))
    rows = [(n, kind) for n in nodes for kind in kinds]
    fig, axes = plt.subplots(len(rows), len(ops), figsize=(4.2 * len(ops), 3.4 * len(rows)), squeeze=False)
    for row, (n, (key, label, scale)) in enumerate(rows):
        for col, op in enumerate(ops):
            ax = axes[row][col]
            for system in dict.fromkeys(r["system"] for r in records):
                rs = [r for r in records if r["nodes"] == n and r["system"] == system and r["op"] == op]
                if rs:
                    ax.plot([r["size_bytes"] for r in rs], [r[key] * scale for r in rs], marker="o", label=system,
                            color=colors[system])
            ax.set_xscale("log", base=2)
            if key == "median_s":
                ax.set_yscale("log")
            ax.set_title(f"{op}, {n} processes")
            ax.set_xlabel("size (bytes)")
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=",".join(OPS), help=f"from {','.join(OPS)}")
    parser.add_argument("--nodes", default="2,4,8")
    parser.add_argument("--sizes", default="1MB,16MB,64MB,256MB")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(common.RESULTS, "collectives"),
                        help="path prefix of the results: OUT.json and OUT.png")
    parser.add_argument("--json", default=None, help="results file (default: OUT.json)")
    parser.add_argument("--plot", default=None, help="plot file (default: OUT.png, or the --json file's name with .png)")
    parser.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"from {','.join(SYSTEMS)}")
    parser.add_argument("--rate", default=None,
                        help="run on an emulated cluster with this per-node rate (e.g. 1gbit); default: loopback")
    parser.add_argument("--tcp-congestion", default=None,
                        help="with --rate: the TCP congestion control every emulated node defaults to, for every "
                             "system alike (e.g. cubic); default: the host's")
    parser.add_argument("--arrival-interval", type=float, default=0.0,
                        help="asynchrony: rank r becomes ready r times this many seconds late; times are then "
                             "from the last arrival to the end (no ratio to the ideal)")
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds every rank of every system waits between the barrier and its timed call, so "
                             "that all have left the barrier before any starts (emulated nodes share this host's "
                             "cores: a rank that starts early slows the others' exit from the barrier); default 0")
    parser.add_argument("--common-start", type=float, default=0.0,
                        help="seconds: after the barrier rank 0 sends every rank the instant this far ahead on the "
                             "host's monotonic clock (shared by loopback ranks and emulated nodes), and every rank "
                             "starts its timed call then, instead of as it leaves the barrier (the emulated nodes "
                             "share this host's cores, so they leave it milliseconds apart); default 0: off")
    parser.add_argument("--transport", default=os.environ.get("HOPLITE_TRANSPORT", "tcp"), choices=["tcp", "ucx"],
                        help="what carries the torch_hoplite systems' bytes (gloo's are always its own TCP)")
    parser.add_argument("--trace", action="store_true",
                        help="trace the torch_hoplite systems' steps and add the latency budget (latency_budget.py) "
                             "of each object-store broadcast and reduce to the results, plotted in OUT-budget.png")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--master", default="127.0.0.1", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.settle < 0:
        parser.error("--settle: seconds, at least 0")
    if args.common_start < 0 or (args.common_start and args.settle):
        parser.error("--common-start: seconds, at least 0, and not with --settle")
    os.environ[common.SETTLE_ENV] = str(args.settle)  # every rank process inherits it
    os.environ[common.COMMON_START_ENV] = str(args.common_start)
    os.environ["HOPLITE_TRANSPORT"] = args.transport  # so does this, read by hop.init
    if args.transport == "ucx":
        os.environ.setdefault("UCX_TLS", "tcp")
        if args.rate:  # a namespace's loopback is its own: only the veth reaches the others
            os.environ.setdefault("UCX_NET_DEVICES", "eth0")
    systems = [s for s in args.systems.split(",") if s]
    if set(systems) - set(SYSTEMS) or ("gloo" not in systems and args.worker is None):
        parser.error(f"--systems: choose from {SYSTEMS}, gloo included (ratios are to it)")
    ops = [o for o in args.ops.split(",") if o]
    if not ops or set(ops) - set(OPS):
        parser.error(f"--ops: choose from {OPS}")
    sizes = common.parse_sizes(args.sizes)
    worlds = [int(n) for n in args.nodes.split(",")]
    memory = common.memory_bytes()
    for op in ops:
        for world in worlds:
            need = peak_bytes(op, world, max(sizes))
            if memory and need > 0.8 * memory:
                parser.error(f"{op} of {max(sizes)} bytes on {world} nodes needs about {need / 2**30:.1f} GiB, more "
                             f"than this machine's {memory / 2**30:.1f} GiB allow: leave it out (--ops) or use smaller --sizes")
    if args.worker is not None:  # one rank inside an emulated node
        import json

        results = worker(args.worker, int(args.nodes), args.master, 29511, ops, sizes, args.trials, args.warmup,
                         systems, args.arrival_interval, args.trace)
        with open(args.out + ".json", "w") as f:
            json.dump({"/".join(map(str, key)): v for key, v in results.items()}, f)
        return
    json_path = args.json or args.out + ".json"
    # A plot follows its results file, never overwriting the default one's.
    plot_path = args.plot or (os.path.splitext(args.json)[0] if args.json else args.out) + ".png"
    rate = args.rate
    if rate:
        _rate_bps(rate)  # refuse a malformed rate before setting anything up
        from torch_hoplite.bench.emulated_cluster import available

        if not available():
            print(f"--rate {rate}: no emulated cluster here (it needs root, iproute2 and network namespaces); "
                  "measuring on loopback instead, without ratios to the ideal", flush=True)
            rate = None
    records, link_checks, congestion_used = [], {}, {}
    for world in worlds:
        if rate:
            print(f"measuring {','.join(ops)} with {world} nodes at {rate} ...", flush=True)
            per_rank = run_emulated(world, ops, sizes, args.trials, args.warmup, systems, rate, link_checks,
                                    args.arrival_interval, args.tcp_congestion, congestion_used, args.trace)
            path, rate_bps = f"emulated cluster, tbf {rate} per node each way", _rate_bps(rate)
        else:
            print(f"measuring {','.join(ops)} with {world} processes ...", flush=True)
            per_rank = run_loopback(world, ops, sizes, args.trials, args.warmup, systems, args.arrival_interval,
                                    args.trace)
            path, rate_bps = "loopback TCP", 0.0
        carrier = path if args.transport == "tcp" else f"{path}, over UCX ({os.environ['UCX_TLS']})"
        records += summarize(per_rank, world, path, rate_bps, args.arrival_interval, carrier)
    gloo = {(r["op"], r["nodes"], r["size_bytes"]): r for r in records if r["system"] == "gloo"}
    for r in records:
        twin = gloo[(r["op"], r["nodes"], r["size_bytes"])]
        r["time_vs_gloo"] = r["median_s"] / twin["median_s"]
        if r["system"] != "gloo" and r["system"] not in mpi_peer.SYSTEMS:
            r["paired_vs_gloo"] = paired(r["times_s"], twin["times_s"])
        r["median_ms"] = r["median_s"] * 1e3
        r["start_skew_ms"] = r["start_skew_s"] * 1e3
        r["after_last_start_ms"] = r["after_last_start_s"] * 1e3
    common.print_table(
        records,
        [("op", "op", ""), ("system", "system", ""), ("nodes", "nodes", "d"), ("size", "size_bytes", "d"),
         ("median ms", "median_ms", ".2f"), ("GB/s", "algbw_gbps", ".2f"), ("busbw GB/s", "busbw_gbps", ".2f"),
         ("x gloo time", "time_vs_gloo", ".3f"), ("x ideal", "ratio_to_ideal", ".3f"), ("cpu cores", "cpu_cores", ".2f"),
         ("skew ms", "start_skew_ms", ".1f"), ("after last ms", "after_last_start_ms", ".2f")],
    )
    for r in records:
        if "paired_vs_gloo" in r:
            p = r["paired_vs_gloo"]
            ci = "n/a" if p["ci95_diff_ms"] is None else "{:+.2f} to {:+.2f}".format(*p["ci95_diff_ms"])
            print(f"{r['op']} {r['system']} N={r['nodes']} {r['size_bytes']} B, trial by trial against gloo: "
                  f"median ratio {p['median_ratio']:.4f}, mean difference {p['mean_diff_ms']:+.2f} ms "
                  f"(95% CI {ci}), faster in {p['faster_trials']} of {p['trials']}")
    settings = {"ops": ops, "sizes": sizes, "nodes": args.nodes, "trials": args.trials, "warmup": args.warmup,
                "rate": rate, "requested_rate": args.rate, "systems": systems, "transport": args.transport,
                "ucx_env": common.ucx_env(),
                "arrival_interval_s": args.arrival_interval, "settle_s": args.settle,
                "common_start_s": args.common_start, "trace": args.trace,
                "link_check_bps": {str(n): bps for n, bps in link_checks.items()},
                "tcp_congestion": {str(n): cc for n, cc in congestion_used.items()}}
    common.write_json(json_path, "collectives", records, settings)
    plot(records, plot_path)
    print(f"wrote {json_path} and {plot_path}")
    if any(r.get("budget") for r in records):
        budget_path = os.path.splitext(plot_path)[0] + "-budget.png"
        latency_budget.plot(records, budget_path)
        print(f"wrote {budget_path}")


if __name__ == "__main__":
    main()
