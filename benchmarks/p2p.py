"""Point-to-point round trip between two processes on loopback, side by side:
torch_hoplite put/get, gloo send/recv and torch RPC (TensorPipe) rpc_sync.

    python benchmarks/p2p.py [--sizes 1KB,1MB,64MB,256MB] [--trials 5]

One round trip: rank 0's tensor reaches rank 1, which sends it back.
  hoplite:   put(x) on 0; get on 1, put(reply); get of the reply on 0.
             ("hoplite-zero-copy": the same with get(copy=False)). Objects are
             deleted after each trial, outside the timed region.
  gloo:      send/recv into preallocated tensors, both directions.
  torch-rpc: rpc_sync of an echo function taking and returning the tensor.
Reported: median / min / max round-trip time over the trials after warm-up,
GB/s = 2 * size / median (the ideal is 2 * size / link bandwidth), and the CPU
cores both processes used during the timed trials. Results go to
benchmarks/results/p2p.json and p2p.png.
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
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SYSTEMS = ["hoplite", "hoplite-zero-copy", "gloo", "torch-rpc"]


def trials_for(size: int, minimum: int) -> int:
    return max(minimum, min(100, (256 << 20) // max(size, 1) // 4))


def _echo(t: torch.Tensor) -> torch.Tensor:
    return t


# ---------------------------------------------------------------- one system per pair of processes


def run_hoplite(rank, store, sizes, warmup, minimum, zero_copy):
    import torch_hoplite as hop

    hop.init(store, rank=rank, world_size=2)
    out = []
    for size in sizes:
        x = torch.ones(size // 4, dtype=torch.float32)
        times, cpu = [], 0.0
        for i in range(warmup + trials_for(size, minimum)):
            hop.barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            if rank == 0:
                hop.put(x, f"ping-{size}-{i}")
                y = hop.get(f"pong-{size}-{i}", copy=not zero_copy).wait()
            else:
                y = hop.get(f"ping-{size}-{i}", copy=not zero_copy).wait()
                hop.put(y, f"pong-{size}-{i}")
            t1, c1 = time.perf_counter(), time.process_time()
            if rank == 0:
                assert y.numel() == x.numel()
            hop.barrier()  # both sides are done with the objects
            if i >= warmup:
                times.append(t1 - t0)
                cpu += c1 - c0
            del y
            hop.delete(f"ping-{size}-{i}" if rank == 0 else f"pong-{size}-{i}")
        out.append((size, times, cpu))
    hop.barrier()
    hop.shutdown()
    return out


def run_gloo(rank, store, sizes, warmup, minimum):
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    out = []
    for size in sizes:
        x = torch.ones(size // 4, dtype=torch.float32)
        buf = torch.empty_like(x)
        times, cpu = [], 0.0
        for i in range(warmup + trials_for(size, minimum)):
            dist.barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            if rank == 0:
                dist.send(x, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            t1, c1 = time.perf_counter(), time.process_time()
            if i >= warmup:
                times.append(t1 - t0)
                cpu += c1 - c0
        out.append((size, times, cpu))
    dist.barrier()
    dist.destroy_process_group()
    return out


def run_rpc(rank, port, sizes, warmup, minimum):
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=300)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    out = []
    if rank == 0:
        for size in sizes:
            x = torch.ones(size // 4, dtype=torch.float32)
            times, cpu = [], 0.0
            for i in range(warmup + trials_for(size, minimum)):
                c0, t0 = time.process_time(), time.perf_counter()
                y = rpc.rpc_sync("w1", _echo, args=(x,))
                t1, c1 = time.perf_counter(), time.process_time()
                assert y.numel() == x.numel()
                if i >= warmup:
                    times.append(t1 - t0)
                    cpu += c1 - c0
            out.append((size, times, cpu))
    rpc.shutdown()
    if rank == 1:
        # The echo side's CPU is not split per size; report it as a whole.
        out = [("total", [], time.process_time())]
    return out


def worker(rank, system, port, sizes, warmup, minimum, queue):
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=(rank == 0), timeout=datetime.timedelta(seconds=600))
    if system.startswith("hoplite"):
        result = run_hoplite(rank, store, sizes, warmup, minimum, system == "hoplite-zero-copy")
    elif system == "gloo":
        result = run_gloo(rank, store, sizes, warmup, minimum)
    else:
        result = run_rpc(rank, port + 1, sizes, warmup, minimum)
    queue.put((rank, result))


def measure(system: str, sizes: list[int], warmup: int, minimum: int) -> list[dict]:
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = common.free_port()
    procs = [ctx.Process(target=worker, args=(r, system, port, sizes, warmup, minimum, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"{system}: rank exited with {p.exitcode}")
    records = []
    for idx, (size, times, cpu0) in enumerate(results[0]):
        median = statistics.median(times)
        wall = sum(times)
        cpu1 = results[1][idx][2] if system != "torch-rpc" else None
        records.append(
            {
                "system": system,
                "op": "roundtrip",
                "nodes": 2,
                "path": "loopback",
                "size_bytes": size,
                "trials": len(times),
                "median_s": median,
                "min_s": min(times),
                "max_s": max(times),
                "gbps": 2 * size / median / 1e9,
                # CPU of both processes over the timed trials (RPC: only the caller's is per size).
                "cpu_cores": (cpu0 + (cpu1 or 0.0)) / wall,
                "cpu_cores_note": None if cpu1 is not None else "caller only",
            }
        )
    return records


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for system in dict.fromkeys(r["system"] for r in records):
        rs = [r for r in records if r["system"] == system]
        xs = [r["size_bytes"] for r in rs]
        ax_t.plot(xs, [r["median_s"] * 1e3 for r in rs], marker="o", label=system)
        ax_b.plot(xs, [r["gbps"] for r in rs], marker="o", label=system)
    for ax in (ax_t, ax_b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tensor size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("round-trip time, median (ms)")
    ax_b.set_ylabel("GB/s (2 x size / time)")
    ax_b.legend()
    fig.suptitle("point-to-point round trip, 2 processes, loopback")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1KB,1MB,64MB,256MB")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--trials", type=int, default=5, help="at least this many timed trials per point")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(common.RESULTS, "p2p"))
    args = parser.parse_args()
    sizes = common.parse_sizes(args.sizes)
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")

    records = []
    for system in systems:
        print(f"measuring {system} ...", flush=True)
        records += measure(system, sizes, args.warmup, args.trials)
    gloo = {r["size_bytes"]: r["median_s"] for r in records if r["system"] == "gloo"}
    for r in records:
        r["time_vs_gloo"] = r["median_s"] / gloo[r["size_bytes"]] if r["size_bytes"] in gloo else None
    for r in records:
        r["median_ms"] = r["median_s"] * 1e3
    common.print_table(
        records,
        [("system", "system", ""), ("size", "size_bytes", "d"), ("median ms", "median_ms", ".3f"),
         ("GB/s", "gbps", ".2f"), ("x gloo time", "time_vs_gloo", ".2f"), ("cpu cores", "cpu_cores", ".2f")],
    )
    settings = {"sizes": sizes, "systems": systems, "warmup": args.warmup, "min_trials": args.trials}
    common.write_json(args.out + ".json", "p2p", records, settings)
    plot(records, args.out + ".png")
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
