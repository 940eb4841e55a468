"""Collectives on loopback, torch_hoplite side by side with gloo (issue #3).

    python benchmarks/collectives.py [--ops broadcast] [--nodes 2,4,8] [--sizes 1MB,16MB,64MB,256MB]

So far: broadcast. torch_hoplite: rank 0 puts, every other rank gets (no
broadcast call: the directory builds the relay tree on the fly). gloo:
dist.broadcast. Both run in the same processes, interleaved trial by trial;
time = from rank 0's start to the slowest receiver's end (one host, one
monotonic clock). Per point: median / min / max of >= --trials timed trials after
--warmup, algbw = size / time, and CPU cores used by all processes. Results go
to benchmarks/results/collectives.json and .png. On loopback the CPU, not a
link, is the bottleneck: the emulated cluster (issue #6) gives ratios to ideal.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SYSTEMS = ["hoplite", "hoplite-zero-copy", "gloo"]
DEFAULT_SYSTEMS = "hoplite,gloo"


def broadcast_once(system: str, rank: int, x: torch.Tensor, buf: torch.Tensor, tag: str) -> None:
    import torch_hoplite as hop

    if system == "gloo":
        dist.broadcast(x if rank == 0 else buf, src=0)
    elif rank == 0:
        hop.put(x, tag)
    else:
        hop.get(tag, copy=system != "hoplite-zero-copy").wait()


def worker(rank, world, host, port, sizes, trials, warmup, systems) -> dict:
    import torch_hoplite as hop

    store = dist.TCPStore(host, port, world, is_master=(rank == 0), timeout=datetime.timedelta(seconds=900))
    dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank, world_size=world)
    hop.init(dist.PrefixStore("hoplite", store), rank=rank, world_size=world)
    results = {}
    for size in sizes:
        x = torch.ones(size // 4)
        buf = torch.empty_like(x)
        for trial in range(warmup + trials):
            for system in systems if trial % 2 == 0 else systems[::-1]:
                tag = f"{system}-{size}-{trial}"
                dist.barrier()
                c0, t0 = time.process_time(), time.monotonic()
                broadcast_once(system, rank, x, buf, tag)
                t1 = time.monotonic()
                dist.barrier()
                c1, t2 = time.process_time(), time.monotonic()
                if system.startswith("hoplite") and rank == 0:
                    hop.delete(tag)
                if trial >= warmup:
                    results.setdefault((system, size), []).append((t0, t1, (c1 - c0) / (t2 - t0)))
    hop.barrier()
    hop.shutdown()
    dist.destroy_process_group()
    return results


def _queue_worker(rank, world, port, sizes, trials, warmup, systems, queue):
    queue.put((rank, worker(rank, world, "127.0.0.1", port, sizes, trials, warmup, systems)))


def run_loopback(world: int, sizes: list[int], trials: int, warmup: int, systems: list[str]) -> dict:
    return common.run_ranks(_queue_worker, world, (world, common.free_port(), sizes, trials, warmup, systems))


def run_emulated(world: int, sizes: list[int], trials: int, warmup: int, systems: list[str], rate: str) -> dict:
    """One process per network namespace, links limited to `rate` each way."""
    import json
    import tempfile

    from emulated_cluster import EmulatedCluster

    with EmulatedCluster(world, rate=rate) as cluster, tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", PYTHONUNBUFFERED="1")
        procs = []
        for r in range(world):
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(r), "--nodes", str(world),
                   "--master", cluster.address(0), "--sizes", ",".join(map(str, sizes)),
                   "--trials", str(trials), "--warmup", str(warmup), "--systems", ",".join(systems),
                   "--out", os.path.join(tmp, f"rank{r}")]
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
                    system, size = key.rsplit("/", 1)
                    per_rank[r][(system, int(size))] = runs
        return per_rank


def summarize(per_rank: dict, world: int, sizes: list[int], trials: int, systems: list[str], path: str,
              rate_bps: float) -> list[dict]:
    records = []
    for system in systems:
        for size in sizes:
            runs = [per_rank[r][(system, size)] for r in range(world)]
            times = [max(run[i][1] for run in runs) - runs[0][i][0] for i in range(trials)]
            cores = [sum(run[i][2] for run in runs) for i in range(trials)]
            median = statistics.median(times)
            ideal = size / (rate_bps / 8) if rate_bps else None
            records.append(
                {
                    "system": system,
                    "op": "broadcast",
                    "nodes": world,
                    "path": path,
                    "size_bytes": size,
                    "ideal_s": ideal,
                    "ratio_to_ideal": median / ideal if ideal else None,
                    "trials": trials,
                    "median_s": median,
                    "min_s": min(times),
                    "max_s": max(times),
                    "algbw_gbps": size / median / 1e9,
                    "busbw_gbps": size / median / 1e9,
                    "cpu_cores": statistics.median(cores),
                }
            )
    return records


def _rate_bps(rate: str) -> float:
    """'1gbit' -> 1e9, '500mbit' -> 5e8 (tc's decimal units)."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}
    for suffix, scale in units.items():
        if rate.lower().endswith(suffix):
            return float(rate[: -len(suffix)]) * scale
    raise ValueError(f"rate {rate!r}: use e.g. 1gbit or 500mbit")


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = sorted({r["nodes"] for r in records})
    fig, axes = plt.subplots(1, len(nodes), figsize=(4.5 * len(nodes), 4), squeeze=False)
    for ax, n in zip(axes[0], nodes):
        for system in dict.fromkeys(r["system"] for r in records):
            rs = [r for r in records if r["nodes"] == n and r["system"] == system]
            ax.plot([r["size_bytes"] for r in rs], [r["median_s"] * 1e3 for r in rs], marker="o", label=system)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"broadcast, {n} processes")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("time to slowest receiver, median (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default="broadcast", help="only 'broadcast' so far")
    parser.add_argument("--nodes", default="2,4,8")
    parser.add_argument("--sizes", default="1MB,16MB,64MB,256MB")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(common.RESULTS, "collectives"))
    parser.add_argument("--systems", default=DEFAULT_SYSTEMS, help=f"from {','.join(SYSTEMS)}")
    parser.add_argument("--rate", default=None,
                        help="run on an emulated cluster with this per-node rate (e.g. 1gbit); default: loopback")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--master", default="127.0.0.1", help=argparse.SUPPRESS)
    args = parser.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    if set(systems) - set(SYSTEMS) or "gloo" not in systems:
        parser.error(f"--systems: choose from {SYSTEMS}, gloo included (ratios are to it)")
    if args.worker is not None:  # one rank inside an emulated node
        import json

        results = worker(args.worker, int(args.nodes), args.master, 29511, common.parse_sizes(args.sizes),
                         args.trials, args.warmup, systems)
        with open(args.out + ".json", "w") as f:
            json.dump({f"{s}/{z}": v for (s, z), v in results.items()}, f)
        return
    if args.ops != "broadcast":
        parser.error("only --ops broadcast is implemented so far")
    sizes = common.parse_sizes(args.sizes)
    records = []
    for world in (int(n) for n in args.nodes.split(",")):
        if args.rate:
            from emulated_cluster import available

            if not available():
                parser.error("--rate needs root and iproute2 (network namespaces)")
            print(f"measuring broadcast with {world} nodes at {args.rate} ...", flush=True)
            per_rank = run_emulated(world, sizes, args.trials, args.warmup, systems, args.rate)
            path, rate_bps = f"emulated cluster, tbf {args.rate} per node each way", _rate_bps(args.rate)
        else:
            print(f"measuring broadcast with {world} processes ...", flush=True)
            per_rank = run_loopback(world, sizes, args.trials, args.warmup, systems)
            path, rate_bps = "loopback TCP", 0.0
        records += summarize(per_rank, world, sizes, args.trials, systems, path, rate_bps)
    gloo = {(r["nodes"], r["size_bytes"]): r["median_s"] for r in records if r["system"] == "gloo"}
    for r in records:
        r["time_vs_gloo"] = r["median_s"] / gloo[(r["nodes"], r["size_bytes"])]
        r["median_ms"] = r["median_s"] * 1e3
    common.print_table(
        records,
        [("system", "system", ""), ("nodes", "nodes", "d"), ("size", "size_bytes", "d"), ("median ms", "median_ms", ".2f"),
         ("GB/s", "algbw_gbps", ".2f"), ("x gloo time", "time_vs_gloo", ".2f"), ("x ideal", "ratio_to_ideal", ".2f"),
         ("cpu cores", "cpu_cores", ".2f")],
    )
    settings = {"sizes": sizes, "nodes": args.nodes, "trials": args.trials, "warmup": args.warmup, "rate": args.rate,
                "systems": systems}
    common.write_json(args.out + ".json", "collectives", records, settings)
    plot(records, args.out + ".png")
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
