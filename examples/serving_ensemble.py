"""Ensemble serving (the Hoplite paper's serving case), with a replica killed
and replaced while queries flow.

    python examples/serving_ensemble.py                     # 1 frontend + 4 replicas, 400 queries
    python examples/serving_ensemble.py --quorum 3          # answer with the first 3 of 4 votes
    python examples/serving_ensemble.py --host 10.0.0.1 --rank-prefix "ip netns exec node{rank}"

The frontend puts each query batch once; every replica gets it (the store
relays it, so the frontend's link carries it about once), classifies it with
its own model, and puts its votes (one-hot, int32). The frontend sums the
first `--quorum` replicas' votes with the streaming reduce and answers with
the majority. Every `--check-every`-th answer is compared exactly with the
votes the frontend computes itself.

After `--kill-at` of the queries, the launcher SIGKILLs replica 2 and starts a
new process in its place, which rejoins the cluster (``rejoin=True``), loads
the same model and goes on from the query the frontend is serving. With
quorum = replicas, the frontend waits for it (the latency around the kill is
the replacement's start-up); with a smaller quorum it never waits. The script
reports queries/s and p50/p99 latency before, around and after the kill, and
plots latency against time.

The launcher hosts the rendezvous store (as torchrun's agent does) and starts
each rank as a process of this script; `--rank-prefix` puts a command in front
of each (e.g. entering a network namespace: benchmarks/workloads.py runs it so
on the emulated cluster), `--host` is the store's address the ranks reach.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

import torch_hoplite as hop

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")  # PNG + JSON

CLASSES = 10
TIMEOUT = 120
KILLED = 2  # the replica that is killed and replaced


def model_of(replica: int) -> nn.Module:
    """Replica r's model: a small CNN with weights of its own (seeded)."""
    torch.manual_seed(1000 + replica)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, CLASSES))
    net.eval()
    return net


def votes(net: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        choice = net(batch).argmax(dim=1)
    return nn.functional.one_hot(choice, CLASSES).to(torch.int32)


def query(i: int, batch: int) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(i))


def control_store(rank: int, world: int) -> dist.TCPStore:
    """The rendezvous store (hosted by the frontend): where the frontend says
    which query it serves, for a replacement replica to start from."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                         timeout=datetime.timedelta(seconds=TIMEOUT))


def replica(rank: int, world: int, args, rejoin: bool) -> None:
    hop.init(timeout=TIMEOUT, rejoin=rejoin, heartbeat_timeout=2)
    net = model_of(rank)
    store = control_store(rank, world)
    i = 0
    if rejoin:
        store.set("serving/rejoined", "1")
        i = int(store.get("serving/current"))
    while i < args.queries:
        try:
            batch = hop.get(f"q/{i}", timeout=TIMEOUT).wait()
            hop.put(votes(net, batch), f"a/{i}/{rank}")
        except (hop.ObjectDeletedError, hop.ObjectNotFoundError, hop.ObjectExistsError):
            pass  # answered without us: a quorum below the replicas, or our predecessor's vote
        i += 1
    store.add("serving/replicas_done", 1)
    hop.barrier(timeout=TIMEOUT)
    hop.shutdown()


def frontend(world: int, args) -> None:
    hop.init(timeout=TIMEOUT, heartbeat_timeout=2)
    store = control_store(0, world)
    replicas = list(range(1, world))
    nets = {r: model_of(r) for r in replicas}
    records = []
    for i in range(args.queries):
        batch = query(i, args.batch)
        store.set("serving/current", str(i))
        if i == int(args.kill_at * args.queries):
            store.set("serving/kill_index", str(i))
            store.set("serving/kill", "1")
        t0 = time.monotonic()
        hop.put(batch, f"q/{i}")
        answers = [f"a/{i}/{r}" for r in replicas]
        total, unused = hop.reduce(answers, num_objects=args.quorum, timeout=TIMEOUT)
        counts = hop.get(total, timeout=TIMEOUT).wait()
        answer = counts.argmax(dim=1)
        latency = time.monotonic() - t0
        records.append((t0, latency))
        late = set(unused)
        if i % args.check_every == 0:
            used = [int(a.rsplit("/", 1)[1]) for a in answers if a not in late]
            expected = sum(votes(nets[r], batch) for r in used)
            if not torch.equal(counts, expected):
                raise AssertionError(f"query {i}: the summed votes differ from replicas {used}' own")
            if not torch.equal(answer, expected.argmax(dim=1)):
                raise AssertionError(f"query {i}: wrong majority")
        hop.delete(total)
        hop.delete(f"q/{i}")
        for a in answers:
            if a not in late:
                hop.delete(a)
        _late.extend(unused)  # late votes: deleted once they are there
        flush_late()
    # Every replica has answered or moved past the last query; then the rest goes.
    store.wait(["serving/all_done"], datetime.timedelta(seconds=TIMEOUT))
    flush_late(final=True)
    current_at_kill = int(store.get("serving/kill_index"))
    for i in range(max(0, current_at_kill - 2), current_at_kill + 3):
        _delete_if_there(f"a/{i}/{KILLED}")  # a vote the replacement gave again for an answered query
    store.set("serving/records", json.dumps(records))
    hop.barrier(timeout=TIMEOUT)
    hop.shutdown()


_late: list[str] = []


def flush_late(final: bool = False) -> None:
    """Deletes the late votes that have been put by now; at the end, every one
    there is (a killed replica's may never come)."""
    for obj_id in list(_late):
        if _delete_if_there(obj_id) or final:
            _late.remove(obj_id)


def _delete_if_there(obj_id: str) -> bool:
    try:
        hop.delete(obj_id)
    except hop.ObjectNotFoundError:
        return False
    except hop.ObjectDeletedError:
        pass
    return True


def rank_main(rank: int, world: int, args) -> None:
    """One rank, started by the launcher with torchrun's environment."""
    torch.set_num_threads(1)
    if rank == 0:
        frontend(world, args)
    else:
        replica(rank, world, args, args.rejoin)


def start_rank(rank: int, world: int, port: int, args, rejoin: bool) -> subprocess.Popen:
    env = dict(os.environ, MASTER_ADDR=args.host, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
               TORCHELASTIC_USE_AGENT_STORE="True", PYTHONUNBUFFERED="1")
    prefix = shlex.split(args.rank_prefix.format(rank=rank)) if args.rank_prefix else []
    cmd = [*prefix, sys.executable, os.path.abspath(__file__), "--rank", str(rank), "--replicas", str(args.replicas),
           "--quorum", str(args.quorum), "--queries", str(args.queries), "--batch", str(args.batch),
           "--kill-at", str(args.kill_at), "--check-every", str(args.check_every)]
    return subprocess.Popen(cmd + (["--rejoin"] if rejoin else []), env=env)


def summarize(records: list[tuple[float, float]], kill_s: float, back_s: float) -> dict:
    def stats(rows):
        lat = sorted(l for _, l in rows)
        if not lat:
            return None
        return {"queries": len(lat), "p50_ms": 1e3 * statistics.median(lat),
                "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], "max_ms": 1e3 * lat[-1]}
    total_s = records[-1][0] + records[-1][1]
    return {
        "queries_per_s": len(records) / total_s,
        "before_kill": stats([r for r in records if r[0] + r[1] < kill_s]),
        "around_kill": stats([r for r in records if r[0] + r[1] >= kill_s and r[0] < back_s]),
        "after_replacement": stats([r for r in records if r[0] >= back_s]),
        "kill_s": kill_s, "replacement_ready_s": back_s,
    }


def wait_for(done, what: str, procs: dict[int, subprocess.Popen]) -> None:
    """Polls done() until it holds; raises at once if a rank failed instead,
    or after the timeout."""
    deadline = time.monotonic() + TIMEOUT
    while not done():
        failed = {r: p.returncode for r, p in procs.items() if p.poll() not in (None, 0)}
        if failed:
            raise SystemExit(f"ranks failed (exit codes {failed}) while the launcher waited for {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no {what} within {TIMEOUT} s")
        time.sleep(0.005)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--quorum", type=int, default=None, help="votes per answer (default: every replica)")
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--kill-at", type=float, default=0.4, help="fraction of the queries served before the kill")
    parser.add_argument("--check-every", type=int, default=10)
    parser.add_argument("--out-dir", default=RESULTS)
    parser.add_argument("--host", default="127.0.0.1", help="address of the store the launcher hosts")
    parser.add_argument("--rank-prefix", default=None,
                        help='command put before each rank\'s, {rank} replaced (e.g. "ip netns exec node{rank}")')
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)  # a rank the launcher started
    parser.add_argument("--rejoin", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.quorum = args.quorum or args.replicas
    if not 1 <= args.quorum <= args.replicas or args.replicas < KILLED:
        parser.error(f"need --replicas >= {KILLED} and 1 <= --quorum <= --replicas")
    world = args.replicas + 1
    if args.rank is not None:
        rank_main(args.rank, world, args)
        return
    with socket.socket() as s:
        s.bind((args.host, 0))
        port = s.getsockname()[1]
    store = dist.TCPStore(args.host, port, world, is_master=True, wait_for_workers=False, multi_tenant=True)
    procs = {r: start_rank(r, world, port, args, rejoin=False) for r in range(world)}
    try:
        start = time.monotonic()
        wait_for(lambda: store.check(["serving/kill"]), "kill signal from the frontend", procs)
        kill_s = time.monotonic() - start
        procs[KILLED].kill()  # SIGKILL: no goodbye to its peers
        procs[KILLED].wait(10)
        print(f"launcher: killed replica {KILLED} at {kill_s:.2f} s; starting its replacement", flush=True)
        procs[KILLED] = start_rank(KILLED, world, port, args, rejoin=True)
        # Its hop.init(rejoin=True) returned:
        wait_for(lambda: store.check(["serving/rejoined"]), "rejoin of the replacement", procs)
        back_s = time.monotonic() - start
        wait_for(lambda: store.add("serving/replicas_done", 0) >= args.replicas, "end of every replica", procs)
        store.set("serving/all_done", "1")
        wait_for(lambda: store.check(["serving/records"]), "the frontend's latencies", procs)
        records = [(t0 - start, latency) for t0, latency in json.loads(store.get("serving/records"))]
        codes = {r: p.wait(TIMEOUT) for r, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    if any(codes.values()):
        raise SystemExit(f"ranks exited with {codes}")
    summary = summarize(records, kill_s, back_s)
    print(json.dumps({k: v for k, v in summary.items()}, indent=1))
    if args.out_dir:
        write_results(records, summary, args)


def write_results(records, summary, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(args.out_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot([t for t, _ in records], [1e3 * l for _, l in records], ".", markersize=3)
    ax.axvline(summary["kill_s"], color="C3", linestyle="--", label=f"replica {KILLED} killed")
    ax.axvline(summary["replacement_ready_s"], color="C2", linestyle="--", label="replacement rejoined")
    ax.set_yscale("log")
    ax.set_xlabel("seconds")
    ax.set_ylabel("query latency (ms)")
    ax.set_title(f"ensemble of {args.replicas}, answers from the first {args.quorum}, batch {args.batch}")
    ax.legend()
    fig.tight_layout()
    base = os.path.join(args.out_dir, f"serving_ensemble_q{args.quorum}of{args.replicas}")
    fig.savefig(base + ".png", dpi=100)
    with open(base + ".json", "w") as f:
        json.dump({"replicas": args.replicas, "quorum": args.quorum, "batch": args.batch, "queries": args.queries,
                   **summary, "latency_s": records}, f)
    print(f"wrote {base}.png and {base}.json")


if __name__ == "__main__":
    main()
