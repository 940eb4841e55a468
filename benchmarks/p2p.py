"""Point-to-point round trip between two processes on loopback, side by side:
torch_hoplite put/get, gloo send/recv and torch RPC (TensorPipe) rpc_sync.

    python benchmarks/p2p.py [--sizes 1KB,1MB,64MB,256MB] [--trials 10]

One round trip: rank 0's tensor reaches rank 1, which sends it back. One pair
of processes runs hoplite and gloo interleaved trial by trial; torch RPC runs in
a pair of its own (TensorPipe's polling threads would slow the others), and so
do the hoplite-tcp systems (a node's path is fixed when it starts) and the
ones that take fresh memory each trial (beside the others, hoplite-kept would
take the buffers they free).
  hoplite:   put(x) on 0; get on 1, put(reply); get of the reply on 0, all
             with default options (put and get each copy once). On one host
             a get reads the holder's memory (the same-host path).
             "hoplite-zero-copy": the same with put(copy=False) and
             get(copy=False), for tensors the program leaves unmodified.
             "hoplite-tcp", "hoplite-tcp-zero-copy": the same with
             HOPLITE_SAME_HOST=0, every byte through loopback TCP.
             "hoplite-ucx", "hoplite-ucx-zero-copy": the same over the UCX
             transport (HOPLITE_SAME_HOST=0, UCX_TLS=tcp unless set), in a
             pair of their own; listed when this build has UCX.
             "hoplite-ucx-shm", "hoplite-ucx-shm-zero-copy": the same with
             UCX_TLS=sm,self (UCX's shared-memory transports), in a pair of
             their own.
             Objects are deleted after each trial, outside the timed region.
             "hoplite-completer-wait": hoplite with each get's future
             waited for as a plain torch future, which the node's
             completion thread completes: without the hand-off of the
             outcome from the event loop straight to the waiting thread.
             "hoplite-kept": the same without deletes, as in a program that
             keeps its objects: each round trip leaves one more object per
             rank, so each takes one buffer of memory not used before (the
             other reuses a freed get result's).
             Each record's "path" says what carried the bytes (from the
             nodes' counters).
  gloo:      send/recv into preallocated tensors, both directions.
             "gloo-fresh": each recv into a tensor allocated for it, freed
             after the trial. "gloo-kept": the same, every tensor kept until
             the run ends, as hoplite-kept keeps its objects.
  torch-rpc: rpc_sync of an echo function taking and returning the tensor.
With --trace, each hoplite system's last timed trial at each size is traced
on both ranks (torch_hoplite.enable_tracing): the steps go to OUT-trace.json,
and for the UCX systems a per-frame summary of each direction is printed
(when each data frame was handed to UCX, arrived, was received, landed).
Reported: median / min / max round-trip time over the trials after warm-up,
GB/s = 2 * size / median (the ideal is 2 * size / link bandwidth), and the CPU
cores both processes used per trial (CPU seconds per wall second from the
start of a trial to the end of the barrier that closes it; median). Results go to
benchmarks/results/p2p.json and p2p.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

from torch_hoplite.bench import common

SYSTEMS = ["hoplite", "hoplite-zero-copy", "hoplite-completer-wait", "hoplite-kept", "gloo", "gloo-fresh", "gloo-kept", "hoplite-tcp",
           "hoplite-tcp-zero-copy", "torch-rpc"]
TCP_ONLY = ("hoplite-tcp", "hoplite-tcp-zero-copy")  # nodes started with same_host=False
FRESH_MEMORY = ("hoplite-kept", "gloo-fresh", "gloo-kept")  # receive into memory not used before
UCX_TCP = ("hoplite-ucx", "hoplite-ucx-zero-copy")  # nodes started with transport="ucx", same_host=False
UCX_SHM = ("hoplite-ucx-shm", "hoplite-ucx-shm-zero-copy")  # the same, UCX_TLS=sm,self
UCX = UCX_TCP + UCX_SHM


USER_UCX_TLS = os.environ.get("UCX_TLS", "tcp")


def ucx_tls(system: str) -> str:
    """UCX_TLS of a UCX system's processes: sm,self for the -shm ones, the
    user's (tcp if unset) for the others."""
    return "sm,self" if system in UCX_SHM else USER_UCX_TLS


def known_systems() -> list[str]:
    import torch_hoplite as hop

    return SYSTEMS + (list(UCX) if "ucx" in hop.transports() else [])


def trials_for(size: int, minimum: int) -> int:
    return max(minimum, min(100, (256 << 20) // max(size, 1) // 4))


def _echo(t: torch.Tensor) -> torch.Tensor:
    return t


# ---------------------------------------------------------------- one round trip per system


class Hoplite:
    def __init__(self, zero_copy: bool, kept: bool = False, completer_wait: bool = False):
        self.copy = not zero_copy
        self.kept = kept
        self.prefix = "zc" if zero_copy else "kept" if kept else "cw" if completer_wait else "cp"
        # torch's own wait(): the completion thread completes the future (no hand-off to the waiter)
        self.wait = torch.futures.Future.wait if completer_wait else (lambda fut: fut.wait())
        self.i = 0

    def round_trip(self, rank: int, x: torch.Tensor, buf: torch.Tensor) -> Optional[torch.Tensor]:
        import torch_hoplite as hop

        self.i += 1
        ping, pong = f"{self.prefix}-ping-{self.i}", f"{self.prefix}-pong-{self.i}"
        if rank == 0:
            hop.put(x, ping, copy=self.copy)
            return self.wait(hop.get(pong, copy=self.copy))
        y = self.wait(hop.get(ping, copy=self.copy))
        hop.put(y, pong, copy=self.copy)
        return None

    def cleanup(self, rank: int) -> None:
        import torch_hoplite as hop

        if self.kept:
            return
        hop.delete(f"{self.prefix}-{'ping' if rank == 0 else 'pong'}-{self.i}")


class Gloo:
    def __init__(self, fresh: bool = False, kept: bool = False):
        self.fresh = fresh or kept
        self.kept: Optional[list[torch.Tensor]] = [] if kept else None

    def round_trip(self, rank: int, x: torch.Tensor, buf: torch.Tensor) -> Optional[torch.Tensor]:
        if self.fresh:
            buf = torch.empty_like(x)
        if self.kept is not None:
            self.kept.append(buf)
        if rank == 0:
            dist.send(x, 1)
            dist.recv(buf, 1)
            return buf
        dist.recv(buf, 0)
        dist.send(buf, 0)
        return None

    def cleanup(self, rank: int) -> None:
        pass


class TorchRpc:
    def round_trip(self, rank: int, x: torch.Tensor, buf: torch.Tensor) -> Optional[torch.Tensor]:
        return rpc.rpc_sync("w1", _echo, args=(x,)) if rank == 0 else None

    def cleanup(self, rank: int) -> None:
        pass


def worker(rank, port, rpc_port, systems, sizes, warmup, minimum, trace, queue):
    """Both processes run the given systems, interleaved trial by trial, so that
    drift in the machine's speed affects them alike. (torch RPC runs in a pair of
    its own: TensorPipe's threads poll and would slow everything beside them.)"""
    import torch_hoplite as hop

    store = dist.TCPStore("127.0.0.1", port, 2, is_master=(rank == 0), timeout=datetime.timedelta(seconds=600))
    # gloo's process group also provides the barrier between trials.
    dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank, world_size=2)
    if any(s.startswith("hoplite") for s in systems):
        same_host = not any(s in TCP_ONLY + UCX for s in systems)
        transport = "ucx" if any(s in UCX for s in systems) else "tcp"
        hop.init(dist.PrefixStore("hoplite", store), rank=rank, world_size=2, same_host=same_host, transport=transport)
    if "torch-rpc" in systems:
        opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{rpc_port}", rpc_timeout=600)
        rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    impls = {s: Hoplite(zero_copy=s.endswith("-zero-copy"), kept=s == "hoplite-kept",
                        completer_wait=s == "hoplite-completer-wait")
             for s in systems if s.startswith("hoplite")}
    impls.update(gloo=Gloo(), **{"gloo-fresh": Gloo(fresh=True), "gloo-kept": Gloo(kept=True), "torch-rpc": TorchRpc()})
    results, traces = {}, {}
    for size in sizes:
        x = torch.arange(size // 4, dtype=torch.float32)  # a pattern: misplaced bytes show
        buf = torch.empty_like(x)
        trials = warmup + trials_for(size, minimum)
        for trial in range(trials):
            order = systems[trial % len(systems):] + systems[: trial % len(systems)]
            for system in order:
                counted = system.startswith("hoplite")
                traced = trace and counted and trial == trials - 1
                s0 = hop.stats() if counted else None
                buf.fill_(-1.0)  # what a receive that wrote nothing leaves
                if traced:
                    hop.trace_events()  # what earlier trials left
                    hop.enable_tracing()
                dist.barrier()
                c0, t0 = time.process_time(), time.perf_counter()
                got = impls[system].round_trip(rank, x, buf)
                t1 = time.perf_counter()
                dist.barrier()
                c1, t2 = time.process_time(), time.perf_counter()
                if traced:  # after the barrier: rank 1 serves its reply after its own round trip returns
                    hop.enable_tracing(False)
                    traces[(system, size)] = [tuple(step) for step in hop.trace_events()]
                if got is not None and not torch.equal(got, x):  # every trial, outside the timed region
                    raise AssertionError(f"{system}: the {size}-byte round trip came back different")
                del got
                impls[system].cleanup(rank)
                if trial >= warmup:
                    times, cores, moved = results.setdefault((system, size), ([], [], [0, 0]))
                    times.append(t1 - t0)
                    # CPU over the trial and the barrier that closes it, per second of that span.
                    cores.append((c1 - c0) / (t2 - t0))
                    if counted:
                        received, same_host = common.bytes_moved(s0, hop.stats())
                        moved[0] += received
                        moved[1] += same_host
    if "torch-rpc" in systems:
        rpc.shutdown()
    if hop.is_initialized():
        hop.barrier()
        hop.shutdown()
    dist.destroy_process_group()
    queue.put((rank, (results, traces)))


def frame_summary(steps: dict[int, list]) -> list[dict]:
    """Per direction of one traced round trip over UCX: how its data frames
    went, from the frame.* steps of both ranks (rank -> (time, step, id, peer,
    nbytes) tuples; one clock on one host)."""
    frames: dict[tuple[int, str], dict[str, float]] = {}  # (sender, "request/offset") -> step -> time
    progress = {rank: [t for t, step, *_ in events if step == "ucx.progress"] for rank, events in steps.items()}
    for rank, events in steps.items():
        for t, step, frame_id, peer, nbytes in events:
            if step.startswith("frame."):
                sender = rank if step in ("frame.send", "frame.sent") else peer
                frames.setdefault((sender, frame_id), {"bytes": nbytes})[step] = t
    out = []
    for sender in sorted(steps):
        mine = [f for (s, _), f in frames.items() if s == sender and "frame.send" in f and "frame.landed" in f]
        if not mine:
            continue
        start = min(f["frame.send"] for f in mine)
        end = max(f["frame.landed"] for f in mine)

        def median_us(a: str, b: str) -> float | None:
            gaps = [f[b] - f[a] for f in mine if a in f and b in f]
            return statistics.median(gaps) * 1e6 if gaps else None

        receiving = sorted([(f["frame.receive"], 1) for f in mine if "frame.receive" in f] +
                           [(f["frame.landed"], -1) for f in mine if "frame.receive" in f])
        depth = peak = 0
        for _, change in receiving:
            depth += change
            peak = max(peak, depth)
        receiver = 1 - sender
        out.append({
            "sender": sender,
            "frames": len(mine),
            "frame_bytes": statistics.median(f["bytes"] for f in mine),
            "span_ms": (end - start) * 1e3,
            "gbps": sum(f["bytes"] for f in mine) / (end - start) / 1e9,
            "send_to_arrived_us": median_us("frame.send", "frame.arrived"),
            "arrived_to_receive_us": median_us("frame.arrived", "frame.receive"),
            "receive_to_landed_us": median_us("frame.receive", "frame.landed"),
            "landed_to_sent_us": median_us("frame.landed", "frame.sent"),
            "peak_receiving": peak,
            "sender_progress_turns": sum(start <= t <= end for t in progress.get(sender, [])),
            "receiver_progress_turns": sum(start <= t <= end for t in progress.get(receiver, [])),
        })
    return out


def measure(systems: list[str], sizes: list[int], warmup: int, minimum: int,
            trace: bool) -> tuple[list[dict], dict]:
    port = common.free_port()
    rpc_port = common.free_port()
    while rpc_port == port:
        rpc_port = common.free_port()
    outcome = common.run_ranks(worker, 2, (port, rpc_port, systems, sizes, warmup, minimum, trace))
    results = {rank: outcome[rank][0] for rank in (0, 1)}
    traces = {}
    for key in outcome[0][1]:
        steps = {rank: outcome[rank][1][key] for rank in (0, 1)}
        traces[key] = {"steps": steps, "frames": frame_summary(steps) if key[0] in UCX else []}
    records = []
    for system in systems:
        for size in sizes:
            times, cores0, moved0 = results[0][(system, size)]
            _, cores1, moved1 = results[1][(system, size)]
            median = statistics.median(times)
            if system.startswith("hoplite"):
                network = f"UCX ({ucx_tls(system)})" if system in UCX else "loopback TCP"
                path = common.data_path(network, moved0[0] + moved1[0], moved0[1] + moved1[1])
            else:  # TensorPipe picks its own transport and channel (shared memory and CMA where it can)
                path = "loopback TCP" if system.startswith("gloo") else "TensorPipe's choice"
            records.append(
                {
                    "system": system,
                    "op": "roundtrip",
                    "nodes": 2,
                    "path": path,
                    "size_bytes": size,
                    "trials": len(times),
                    "median_s": median,
                    "min_s": min(times),
                    "max_s": max(times),
                    "gbps": 2 * size / median / 1e9,
                    # Both processes, median over trials (the closing barrier included).
                    "cpu_cores": statistics.median(a + b for a, b in zip(cores0, cores1)),
                }
            )
    return records, traces


def measure_with_ucx_tls(systems: list[str], sizes: list[int], warmup: int, minimum: int,
                         trace: bool) -> tuple[list[dict], dict]:
    """measure(), with the UCX_TLS of the group's UCX systems in the
    environment that its processes inherit."""
    if systems[0] not in UCX:
        return measure(systems, sizes, warmup, minimum, trace)
    before = os.environ.get("UCX_TLS")
    os.environ["UCX_TLS"] = ucx_tls(systems[0])
    try:
        return measure(systems, sizes, warmup, minimum, trace)
    finally:
        if before is None:
            del os.environ["UCX_TLS"]
        else:
            os.environ["UCX_TLS"] = before


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
    known = known_systems()
    parser.add_argument("--systems", default=",".join(known))
    parser.add_argument("--trials", type=int, default=10, help="at least this many timed trials per point")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(common.RESULTS, "p2p"))
    parser.add_argument("--trace", action="store_true", help="trace each hoplite system's last trial per size")
    args = parser.parse_args()
    sizes = common.parse_sizes(args.sizes)
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(known)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; this build has {known}")

    records, traces = [], {}
    own_pair = ("torch-rpc",) + TCP_ONLY + UCX + FRESH_MEMORY
    groups = [[s for s in systems if s not in own_pair], [s for s in systems if s in FRESH_MEMORY],
              [s for s in systems if s in TCP_ONLY], [s for s in systems if s in UCX_TCP],
              [s for s in systems if s in UCX_SHM], [s for s in systems if s == "torch-rpc"]]
    for group in filter(None, groups):
        print(f"measuring {', '.join(group)} at {', '.join(map(common.human_size, sizes))} ...", flush=True)
        group_records, group_traces = measure_with_ucx_tls(group, sizes, args.warmup, args.trials, args.trace)
        records += group_records
        traces.update(group_traces)
    gloo = {r["size_bytes"]: r["median_s"] for r in records if r["system"] == "gloo"}
    for r in records:
        r["time_vs_gloo"] = r["median_s"] / gloo[r["size_bytes"]] if r["size_bytes"] in gloo else None
    for r in records:
        r["median_ms"] = r["median_s"] * 1e3
    common.print_table(
        records,
        [("system", "system", ""), ("size", "size_bytes", "d"), ("median ms", "median_ms", ".3f"),
         ("GB/s", "gbps", ".2f"), ("x gloo time", "time_vs_gloo", ".2f"), ("cpu cores", "cpu_cores", ".2f"),
         ("path", "path", "")],
    )
    settings = {"sizes": sizes, "systems": systems, "warmup": args.warmup, "min_trials": args.trials,
                "ucx_env": common.ucx_env(), "ucx_tls": {s: ucx_tls(s) for s in systems if s in UCX}}
    common.write_json(args.out + ".json", "p2p", records, settings)
    plot(records, args.out + ".png")
    print(f"wrote {args.out}.json and {args.out}.png")
    if args.trace:
        write_traces(traces, args.out + "-trace.json")


def write_traces(traces: dict, path: str) -> None:
    frames = [dict(system=system, size_bytes=size, **row) for (system, size), t in traces.items() for row in t["frames"]]
    if frames:
        print("UCX data frames of each traced round trip, per direction (medians):")
        common.print_table(
            frames,
            [("system", "system", ""), ("size", "size_bytes", "d"), ("sender", "sender", "d"), ("frames", "frames", "d"),
             ("GB/s", "gbps", ".2f"), ("send>arr us", "send_to_arrived_us", ".1f"),
             ("arr>recv us", "arrived_to_receive_us", ".1f"), ("recv>land us", "receive_to_landed_us", ".1f"),
             ("land>sent us", "landed_to_sent_us", ".1f"), ("peak recv", "peak_receiving", "d"),
             ("snd turns", "sender_progress_turns", "d"), ("rcv turns", "receiver_progress_turns", "d")],
        )
    with open(path, "w") as f:
        json.dump([{"system": system, "size_bytes": size, "frames": t["frames"],
                    "steps": {str(rank): steps for rank, steps in t["steps"].items()}}
                   for (system, size), t in traces.items()], f)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
