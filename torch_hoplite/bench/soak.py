"""The soak run: N ranks run a mixed, checked workload (object-store
operations, and rounds of c10d collectives every few seconds) for minutes
while a seeded nemesis kills, restarts, pauses and pesters them; the report counts
operations, faults, errors by type, wrong bytes and hangs, and follows each
rank's memory and file descriptors.

    python -m torch_hoplite.bench.soak --nodes 4 --minutes 2 --seed 1
    python -m torch_hoplite.bench.soak --nodes 4 --minutes 2 --cluster emulated

Ranks are local processes (the store's host is this driver, so any rank may
die), over loopback or, with `--cluster emulated`, each in its own network
namespace of the emulated cluster (bench/emulated_cluster.py; root and nft),
where the store is reached over a management link that faults leave alone.
The nemesis's faults, at exponential intervals drawn from the seed, overlapping:

- kill: SIGKILL a rank, restart it after a pause; it rejoins (a new incarnation)
  (never the rank of `--keep`, by default 0, so one process lives throughout);
- leave: SIGTERM a rank, which ends its operation and shuts down (a graceful
  leave), then restart it as after a kill;
- pause: SIGSTOP a rank for longer than the heartbeat timeout, then SIGCONT;
- stranger: connections to a rank that send garbage, or a hello of another
  cluster, or nothing at all;
- partition (emulated cluster only): cut a rank's link, both ways, for longer
  than the heartbeat timeout, then heal it;
- loss (emulated cluster only): the switch drops 2-10% of a rank's frames for
  a few seconds;
- delay (emulated cluster only): a rank's packets, both ways, arrive 20-100 ms
  late, with a jitter of half that, which reorders them, for 3-15 s
  (EmulatedCluster.delay: this kernel has no netem).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import torch.distributed as dist

from torch_hoplite import _C
from torch_hoplite.bench import soak_report, soak_workload
from torch_hoplite.bench.common import RESULTS, machine
from torch_hoplite.bench.emulated_cluster import MANAGEMENT_HOST, EmulatedCluster, enter_namespace, links_can_be_delayed
from torch_hoplite.config import Config

OPTIONS = {"timeout": 10.0, "connect_timeout": 3.0, "heartbeat_interval": 0.25, "heartbeat_timeout": 2.0,
           "same_host": False}
# Each rank's store (--capacity): copies of objects whose owner died stay
# until the capacity evicts them, so this bounds the store.
CAPACITY = "512MiB"
GRACE = 5.0  # past an operation's timeout: a hang
FAULTS = ("kill", "leave", "pause", "stranger")


@dataclass
class Rank:
    rank: int
    incarnation: int = 0
    process: Optional[mp.Process] = None
    busy_until: float = 0.0  # a fault is under way until then (wall clock)
    address: Optional[tuple[str, int]] = None


@dataclass
class Soak:
    nodes: int
    seconds: float
    seed: int
    workdir: str
    mean_fault_interval: float
    cluster: Optional[EmulatedCluster] = None
    kept: Optional[int] = None  # a rank never killed nor made to leave: one process lives the whole run
    capacity: str = CAPACITY
    faults: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.store = dist.TCPStore("127.0.0.1", 0, self.nodes, is_master=True, wait_for_workers=False)
        self.ranks = [Rank(r) for r in range(self.nodes)]
        self.ctx = mp.get_context("spawn")
        self.kinds = FAULTS
        if self.cluster:
            self.kinds += tuple(k for k in soak_report.NETWORK if k != "delay" or links_can_be_delayed())
            if "delay" not in self.kinds:
                print("no delay faults: they need iptables, cc and libnetfilter_queue (make bench installs them)")

    def log_path(self, rank: int, kind: str = "jsonl") -> str:
        """The rank's operations (jsonl), or its extension's log (log)."""
        return os.path.join(self.workdir, f"rank{rank}.{kind}")

    def start(self, r: Rank) -> None:
        r.address = None
        options, store_host, namespace = dict(OPTIONS, capacity_bytes=self.capacity), "127.0.0.1", None
        if self.cluster:
            options["host"] = self.cluster.address(r.rank)
            store_host, namespace = MANAGEMENT_HOST, self.cluster.ns(r.rank)
        r.process = self.ctx.Process(
            target=run_rank,
            args=(namespace, self.log_path(r.rank, "log"), r.rank, self.nodes, store_host, self.store.port, self.seed,
                  r.incarnation, self.stop_at, self.log_path(r.rank), options, OPTIONS["timeout"], GRACE),
            daemon=True,
        )
        r.process.start()

    def address_of(self, r: Rank) -> Optional[tuple[str, int]]:
        """Where the rank's current incarnation listens (from its log's "up" line)."""
        if r.address is None:
            with open(self.log_path(r.rank)) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # being written, or cut short by a kill
                    if rec.get("event") == "up" and rec["inc"] == r.incarnation:
                        r.address = tuple(rec["address"])
        return r.address

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.clean_up()

    def clean_up(self) -> None:
        """No rank outlives the driver, stopped ones included. (A cut link
        goes with the emulated cluster.)"""
        for r in self.ranks:
            if r.process is not None and r.process.is_alive():
                os.kill(r.process.pid, signal.SIGCONT)
                r.process.kill()
                r.process.join(10)

    def _run(self) -> None:
        os.makedirs(self.workdir, exist_ok=True)
        for r in range(self.nodes):
            open(self.log_path(r), "w").close()
        self.began = time.time()
        self.stop_at = self.began + 20 + self.seconds  # 20 s to start
        for r in self.ranks:
            self.start(r)
        while not all(self.address_of(r) for r in self.ranks):
            if time.time() > self.began + 60:
                raise RuntimeError("the soak's ranks did not start within 60 s")
            time.sleep(0.2)
        self.began = time.time()  # faults and figures count from here
        next_fault = self.began + self.rng.expovariate(1 / self.mean_fault_interval)
        # No fault in the last seconds: what a fault breaks gets time to recover.
        last_fault = self.stop_at - OPTIONS["heartbeat_timeout"] - 3 * GRACE
        while time.time() < self.stop_at:
            now = time.time()
            self.restart_due(now)
            if now >= next_fault and now < last_fault:
                self.inject(now)
                next_fault = now + self.rng.expovariate(1 / self.mean_fault_interval)
            time.sleep(0.05)
        deadline = self.stop_at + OPTIONS["timeout"] + 3 * GRACE + 30
        for r in self.ranks:
            r.process.join(max(1.0, deadline - time.time()))
            if r.process.is_alive():
                self.faults.append({"t": time.time(), "kind": "not-exited", "rank": r.rank})
            elif r.process.exitcode != 0:  # e.g. a restart whose rejoin failed
                self.faults.append({"t": time.time(), "kind": "failed-exit", "rank": r.rank,
                                    "exitcode": r.process.exitcode})

    def restart_due(self, now: float) -> None:
        for fault in self.faults:
            if fault.get("restart_at") and fault["restart_at"] <= now and not fault.get("restarted"):
                r = self.ranks[fault["rank"]]
                if fault["kind"] == "leave" and r.process.is_alive():
                    continue  # still finishing its operation, or shutting down
                if fault["kind"] in ("kill", "leave"):
                    r.incarnation += 1
                    self.start(r)
                elif fault["kind"] in soak_report.NETWORK:
                    self.cluster.heal(r.rank)
                else:
                    os.kill(r.process.pid, signal.SIGCONT)
                fault["restarted"] = now

    def inject(self, now: float) -> None:
        kind = self.rng.choice(self.kinds)
        calm = [r for r in self.ranks if r.busy_until <= now and r.process.is_alive() and self.address_of(r)]
        # At most half the ranks are down at once (a reduce needs inputs).
        down = sum(1 for r in self.ranks if r.busy_until > now)
        if kind not in ("stranger", "loss", "delay") and down + 1 > self.nodes // 2:
            kind = "stranger"
        if not calm:
            return
        if kind in soak_report.ENDS_PROCESS:
            calm = [r for r in calm if r.rank != self.kept]
            if not calm:
                return
        r = self.rng.choice(calm)
        fault = {"t": now, "kind": kind, "rank": r.rank, "incarnation": r.incarnation}
        if kind == "kill":
            r.process.kill()
            fault["restart_at"] = now + self.rng.uniform(0.5, 3.0)
            r.busy_until = fault["restart_at"] + 10
        elif kind == "leave":
            os.kill(r.process.pid, signal.SIGTERM)
            fault["restart_at"] = now + self.rng.uniform(0.5, 3.0)
            r.busy_until = fault["restart_at"] + OPTIONS["timeout"] + 10
        elif kind == "pause":
            os.kill(r.process.pid, signal.SIGSTOP)
            fault["restart_at"] = now + OPTIONS["heartbeat_timeout"] + self.rng.uniform(0.5, 3.0)
            r.busy_until = fault["restart_at"] + 5
        elif kind == "partition":
            self.cluster.cut(r.rank)
            fault["restart_at"] = now + OPTIONS["heartbeat_timeout"] + self.rng.uniform(0.5, 3.0)
            r.busy_until = fault["restart_at"] + 10
        elif kind == "loss":
            fault["fraction"] = self.rng.choice((0.02, 0.05, 0.1))
            self.cluster.lose(r.rank, fault["fraction"])
            fault["restart_at"] = now + self.rng.uniform(2.0, 6.0)
            r.busy_until = fault["restart_at"] + 5
        elif kind == "delay":
            fault["delay_ms"] = self.rng.choice((20, 50, 100))
            fault["jitter_ms"] = fault["delay_ms"] / 2
            self.cluster.delay(r.rank, fault["delay_ms"], fault["jitter_ms"], seed=self.rng.randrange(1 << 32))
            fault["restart_at"] = now + self.rng.uniform(3.0, 15.0)
            r.busy_until = fault["restart_at"] + 5
        else:
            namespace = self.cluster.ns(r.rank) if self.cluster else None
            fault["sent"] = pester(self.address_of(r), self.rng, namespace)
        self.faults.append(fault)
        print(f"[{now - self.began:7.1f} s] {kind} rank {r.rank}", flush=True)


def foreign_hello() -> bytes:
    """A well-formed hello (csrc/wire) of rank 0 of another cluster."""
    def string(b: bytes) -> bytes:
        return struct.pack("<I", len(b)) + b

    version = _C.wire_version
    body = struct.pack("<Ii", version, 0) + string(b"another-cluster") + string(b"n" * 16) + string(b"127.0.0.1")
    body += struct.pack("<IQ", 1, 0)
    return struct.pack("<IBBHQ", 0x544C5048, version, 1, 0, len(body)) + body


def pester(address: tuple[str, int], rng: random.Random, namespace: Optional[str] = None) -> str:
    """Opens a connection to a rank (from inside `namespace`, if given: the
    rank's own) and misbehaves on it; says how."""
    if namespace:
        said = []

        def in_namespace() -> None:
            enter_namespace(namespace)
            said.append(pester(address, rng))

        thread = threading.Thread(target=in_namespace)  # setns moves only the calling thread
        thread.start()
        thread.join()
        return said[0]
    how = rng.choice(("garbage", "other-cluster", "silent"))
    try:
        with socket.create_connection(address, timeout=2) as s:
            if how == "garbage":
                s.sendall(rng.randbytes(rng.randrange(1, 4096)))
            elif how == "other-cluster":
                s.sendall(foreign_hello())
                s.recv(1)  # it closes on us
            else:
                time.sleep(rng.uniform(0.1, 1.0))
    except OSError as e:
        return f"{how} ({e})"
    return how


def run_rank(namespace: Optional[str], log_path: str, *args) -> None:
    """A rank's process (soak_workload.run), inside `namespace` if given.

    The extension's log, at level info, goes to `log_path` (all of the
    rank's processes in turn): what a report cannot explain is looked up there.
    """
    os.environ["HOPLITE_LOG_LEVEL"] = "info"
    with open(log_path, "a") as log:
        os.dup2(log.fileno(), 2)
    if namespace:
        enter_namespace(namespace)
    soak_workload.run(*args)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fault-interval", type=float, default=8.0, help="mean seconds between faults")
    parser.add_argument("--cluster", choices=("loopback", "emulated"), default="loopback",
                        help="ranks over loopback, or on the emulated cluster (adds partitions, loss and delay)")
    parser.add_argument("--rate", default="1gbit", help="the emulated cluster's link rate")
    parser.add_argument("--keep", type=int, default=0,
                        help="a rank never killed nor made to leave (still paused, cut and pestered), so that one "
                             "process lives the whole run and its memory can be followed; -1: none")
    parser.add_argument("--capacity", default=CAPACITY,
                        help="each rank's store capacity (HOPLITE_STORE_CAPACITY's format); a smaller one fills "
                             "within the run, so the memory plot shows where it levels off")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/soak_nN_Mmin.json)")
    parser.add_argument("--workdir", default=None, help="where the ranks' logs go (default: next to --out)")
    args = parser.parse_args(argv)
    if args.nodes < 3:
        parser.error("--nodes must be at least 3 (a reduce needs inputs while a rank is down)")
    emulated = args.cluster == "emulated"
    name = f"soak_n{args.nodes}_{args.minutes:g}min" + (f"_emulated_{args.rate}" if emulated else "")
    out = args.out or os.path.join(RESULTS, name + ".json")
    workdir = args.workdir or os.path.splitext(out)[0] + "_logs"
    with contextlib.ExitStack() as stack:
        cluster = None
        if emulated:
            cluster = stack.enter_context(EmulatedCluster(args.nodes, rate=args.rate, name="hplsoak", management=True))
        soak = Soak(args.nodes, args.minutes * 60, args.seed, workdir, args.fault_interval, cluster,
                    kept=args.keep if args.keep >= 0 else None, capacity=args.capacity)
        soak.run()
    settings = {"nodes": args.nodes, "minutes": args.minutes, "seed": args.seed,
                "cluster": f"emulated {args.rate}" if emulated else "loopback",
                "mean_fault_interval_s": args.fault_interval, "kept_rank": soak.kept,
                # The allocator's settings, or another allocator preloaded, where the run set them.
                "allocator_env": {k: v for k, v in os.environ.items()
                                  if k.startswith("MALLOC_") or k in ("GLIBC_TUNABLES", "LD_PRELOAD")},
                # Every rank's (HOPLITE_HEAP_TRIM_INTERVAL or the default; runs before 791f72a never trimmed).
                "heap_trim_interval_s": Config.resolve({}).heap_trim_interval,
                "options": dict(OPTIONS, capacity_bytes=args.capacity),
                "grace_s": GRACE, "round_seconds": soak_workload.ROUND_SECONDS,
                "sizes_bytes": [n * 4 for n in soak_workload.SIZES], "weights": soak_workload.WEIGHTS}
    report = soak_report.summarize(workdir, soak.faults, soak.began, settings, machine())
    soak_report.write(report, out)
    soak_report.print_summary(report)
    if report["wrong_bytes"] or report["hangs"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
