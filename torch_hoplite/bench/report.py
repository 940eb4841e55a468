"""The performance figures of README.md and the tables of benchmarks/README.md,
generated from the committed results.

    python -m torch_hoplite.bench.report            # print every block
    python -m torch_hoplite.bench.report --write    # put them into the files
    python -m torch_hoplite.bench.report --check    # exit 1 if a file differs

Every figure in a block is read from a JSON file in benchmarks/results/
(which the block names, with the date and commit of its run), so the prose
around it cannot drift from the data. Each block sits between
``<!-- report:begin NAME ... -->`` and ``<!-- report:end NAME -->``.
tests/test_report.py checks that the files hold what this prints.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from typing import Any, Callable, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
README = os.path.join(ROOT, "README.md")
BENCH_README = os.path.join(ROOT, "benchmarks", "README.md")

MiB = 1 << 20
PEERS = "peers_n8_emulated_1gbit.json"  # all systems at N = 8, 256 MB, one run
ISSUE6_TARGETS = "issue6_targets_n8_emulated_1gbit.json"
ASYNCHRONY = "asynchrony_emulated_1gbit.json"  # ranks ready 0.1 s apart
SAME_HOST = "collectives_same_host.json"
P2P = "p2p.json"
P2P_UCX = "p2p_ucx.json"  # the UCX transport against ours, loopback, UCX_TLS=tcp
P2P_UCX_H100 = "p2p_ucx_h100.json"  # the same on the 16 cores of the GPU machine, UCX 1.22, without gloo
P2P_UCX_H100_BEFORE = "p2p_ucx_h100_dc298f9.json"  # that, before frames were delivered between progress calls
P2P_UCX_H200_BEFORE = "p2p_ucx_h200_a5bc0e1.json"  # 16 cores of an H200 machine, before tcp segments of 1 MiB
P2P_UCX_NOW = "p2p_ucx_2026-11-29.json"  # the same pairs again, with the segments of 3da759b and f1f8945
P2P_UCX_SHM = "p2p_ucx_shm.json"  # UCX's shared memory against our same-host reads, loopback
# The emulated cluster, the same command with --transport tcp and then ucx ({} = the transport).
UCX_EMULATED = "ucx_vs_tcp_{}_emulated_1gbit.json"
RPC = "rpc_emulated_1gbit.json"
WORKLOADS = "workloads_emulated_1gbit.json"
DLRM_SERVING = "workloads-dlrm-serving_emulated_1gbit.json"
LOOPBACK_TCP = "collectives.json"  # one host, every byte over loopback TCP, with the reduce-tree ablation
RING = "allreduce_ring_emulated_1gbit.json"
# allreduce on the static ring (its default between hosts) beside the composition it replaced there
ALLREDUCE_RING = "allreduce-ring_n8_emulated_1gbit.json"  # 1 and 16 MB, N = 8, with broadcast and reduce
ALLREDUCE_RING_256MB = "allreduce-ring_256mb_emulated_1gbit.json"  # N = 4 and 8
ALLREDUCE_RING_ARRIVALS = "allreduce-ring_asynchrony_emulated_1gbit.json"  # 64 MB, ranks ready 0.1 s apart
PEERS_N4_N8 = "peers_emulated_1gbit.json"
C10D = "c10d_emulated_1gbit.json"
C10D_ALLGATHER = "c10d_allgather_emulated_1gbit.json"
C10D_LOOPBACK = "c10d_loopback.json"
C10D_CUBIC = "c10d_n8_emulated_1gbit_cubic.json"  # the committed chains, 10 trials
# Earlier runs of that command, every node on CUBIC and on the host's default BBR, by the commit that ran them
# ({} = the commit): later runs reused their names, so their files were restored from git under these.
CONGESTION = [("c10d_n8_emulated_1gbit_cubic_{}.json", "CUBIC", "CUBIC"),
              ("c10d_n8_emulated_1gbit_bbr_{}.json", "BBR (host default)", "BBR")]  # (file, first row, rest)
# The backend's allreduce against gloo's, trial by trial: (file, what ran).
PAIRED_RUNS = [("c10d_allreduce_n8_paired_cubic.json", "CUBIC, allreduce only"), (C10D_CUBIC, "CUBIC, the run above")]
GPU = "gpu.json"
EMULATED = "collectives_emulated_1gbit.json"
OPS = ("broadcast", "reduce", "allreduce", "gather", "allgather")
# Issue #28's split of Node: the same harness with the extension before ({} = before) and after it,
# back to back, and what each pair ran.
NODE_SPLIT_PAIRS = [
    ("node-split-{}_n8_emulated_1gbit.json", "All three operations, 5 trials, before then after"),
    ("node-split-broadcast-{}_n8_emulated_1gbit.json", "Broadcast again, 9 trials, before then after"),
    ("node-split-broadcast2-{}_n8_emulated_1gbit.json", "Broadcast a third time, 9 trials, after then before"),
]
# Issue #30's frame sizes: the harness with 256 KiB frames (what the old rule chose at 1 and 16 MB), then the new rule.
FRAMES_PAIRS = [("frames-{}_n8_emulated_1gbit.json", "1 and 16 MB, N = 8, 1 Gbit/s, 7 trials, before then after")]
# Issue #30's latency budget (--trace --common-start 0.05): before and after reduce steps follow the chunk.
BUDGET_PAIRS = [("budget-{}_n8_emulated_1gbit.json", "1 MB, N = 8, 1 Gbit/s, common start, 15 trials, before then after")]
BUDGET_CUBIC = "budget-cubic_n8_emulated_1gbit.json"  # the same with CUBIC, at 1 and 16 MB, N = 2 and 8
BUDGET = "budget_n8_emulated_1gbit.json"  # again, with frames of 1/128 and the budget's final cut
# Frames of 1/128 of an object: the budget's CUBIC run again, and 64 MB (N = 4) and 256 MB (N = 8), before and after.
FRAMES128_AFTER = "frames128-after_n8_emulated_1gbit.json"
FRAMES128_PAIRS = [
    ((BUDGET_CUBIC, FRAMES128_AFTER), "1 and 16 MB, N = 8, 15 trials, before then after"),
    ("frames128-{}_n4_64mb_emulated_1gbit.json", "64 MB reduce, N = 4, 7 trials, before then after"),
    ("frames128-{}_n8_256mb_emulated_1gbit.json", "256 MB, N = 8, 5 trials, before then after"),
]
SCALE_16MB_FRAMES128 = "scale_16mb-frames128_emulated_250mbit.json"  # the same with frames of 1/128
SCALE_64MB = "scale_64mb_emulated_250mbit.json"
SCALE_16MB = "scale_16mb_emulated_250mbit.json"  # N = 4, 8, 16 at 250 Mbit/s (256 MB did not fit in memory at N = 16)
# The same on loopback (one host, 2 cores; every hoplite byte read from a peer's memory).
NODE_SPLIT_LOOPBACK_PAIRS = [
    ("node-split-loopback-{}.json", "Loopback, 5 trials, before then after"),
    ("node-split-loopback-reduce-{}.json", "Loopback reduce again, 9 trials, after then before"),
]


class Result:
    """One committed result file."""

    def __init__(self, name: str):
        self.name = name
        with open(os.path.join(RESULTS, name)) as f:
            data = json.load(f)
        self.records: list[dict] = data["records"]
        self.machine: dict = data.get("machine", {})
        self.settings: dict = data.get("settings", {})

    def source(self) -> str:
        return f"`results/{self.name}` ({self.machine.get('date', '?')[:10]}, {self.machine.get('commit', '?')})"

    def where(self, **match: Any) -> list[dict]:
        """The records with these fields, in the file's order."""
        return [r for r in self.records if all(r.get(k) == v for k, v in match.items())]

    def find(self, **match: Any) -> Optional[dict]:
        """The one record with these fields; None if there is none."""
        found = self.where(**match)
        if len(found) > 1:
            raise ValueError(f"{self.name}: {len(found)} records match {match}")
        return found[0] if found else None

    def one(self, **match: Any) -> dict:
        """The one record with these fields; ValueError naming the file if there is none."""
        r = self.find(**match)
        if r is None:
            raise ValueError(f"{self.name}: no record for {match}")
        return r

    def value(self, key: str, **match: Any) -> float:
        r = self.one(**match)
        if r.get(key) is None:
            raise ValueError(f"{self.name}: no {key} for {match}")
        return r[key]


_read: dict[str, Result] = {}


def result(name: str) -> Result:
    """The committed result file `name`, read once."""
    if name not in _read:
        _read[name] = Result(name)
    return _read[name]


def result_files() -> list[str]:
    """Every result file the blocks read (rendering them reads each)."""
    render()
    return list(_read)


def _x(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.2f}×"


def emulated_table() -> list[str]:
    peers = result(PEERS)
    systems = [("hoplite", "hoplite"), ("hoplite-zero-copy", "hoplite `copy=False`"),
               ("hoplite-c10d", "backend `\"hoplite\"`"), ("gloo", "gloo"), ("mpi", "Open MPI, busy-polling"),
               ("mpi-yield", "Open MPI, yielding")]
    lines = [f"Emulated cluster: N = 8 nodes, 1 Gbit/s per node each way, 256 MB; time over the ideal "
             f"(1.00× is the link limit), CPU cores of all ranks in brackets. {peers.source()}:", ""]
    lines += _ratio_rows(peers, systems)
    lines += ["", "Open MPI busy-polls by default: its 8 ranks use both of this machine's 2 cores while they "
              "wait; the yielding run sets `mpi_yield_when_idle` (see benchmarks/README.md for what that changed)."]
    return lines


def same_host_lines() -> list[str]:
    p2p, coll = result(P2P), result(SAME_HOST)

    def rt(system: str, size: int) -> str:
        return _x(p2p.value("time_vs_gloo", system=system, size_bytes=size))

    ratios = [(r["time_vs_gloo"], r) for r in coll.records if r["system"] == "hoplite"]
    lo, lo_r = min(ratios, key=lambda t: t[0])
    hi, hi_r = max(ratios, key=lambda t: t[0])

    def point(r: dict) -> str:
        return f"{r['op']}, N = {r['nodes']}, {r['size_bytes'] // MiB} MB"

    return [
        "One host (objects read from each other's memory, gloo over loopback TCP), time over gloo's:",
        f"point-to-point round trips (default copies) {rt('hoplite', MiB)} at 1 MB, {rt('hoplite', 64 * MiB)} at "
        f"64 MB, {rt('hoplite', 256 * MiB)} at 256 MB; with `copy=False` {rt('hoplite-zero-copy', 64 * MiB)} and "
        f"{rt('hoplite-zero-copy', 256 * MiB)} from {p2p.source()}. Broadcast, reduce, allreduce and gather "
        f"among 4 and 8 processes of 16 and 256 MB: {lo:.2f}× ({point(lo_r)}) to {hi:.2f}× ({point(hi_r)}), "
        f"{coll.source()}.",
    ]


def rpc_lines() -> list[str]:
    rpc = result(RPC)

    def ratio(case: str, system: str, size: int) -> str:
        return _x(rpc.value("ratio_to_ideal", case=case, system=system, nodes=8, size_bytes=size))

    return [
        f"`torch.distributed.rpc` at N = 8 on the emulated cluster, time over the ideal, {rpc.source()}: a server "
        f"returning 64 / 256 MB of weights to its 7 callers takes {ratio('fanout', 'offload', 64 * MiB)} / "
        f"{ratio('fanout', 'offload', 256 * MiB)} with `torch_hoplite.rpc.enable()` against plain TensorPipe's "
        f"{ratio('fanout', 'rpc', 64 * MiB)} / {ratio('fanout', 'rpc', 256 * MiB)}; the first-k reduce takes 7 "
        f"callers' gradients in {ratio('fanin', 'reduce', 64 * MiB)} / {ratio('fanin', 'reduce', 256 * MiB)} "
        f"(plain RPC {ratio('fanin', 'rpc', 64 * MiB)} / {ratio('fanin', 'rpc', 256 * MiB)}).",
    ]


def workload_lines() -> list[str]:
    ps, ds = result(WORKLOADS), result(DLRM_SERVING)

    def ps_value(key: str, straggler: bool) -> float:
        return ps.value(key, workload="async_ps", system="hoplite", straggler=straggler)

    serving = ds.find(workload="serving", network="emulated 1gbit")
    dlrm = ds.value("rows_per_s_vs_rpc", workload="dlrm", system="hoplite")
    return [
        f"Workloads at N = 8 on the emulated cluster. Asynchronous PS training ({ps.source()}): "
        f"{ps_value('samples_per_s_vs_rpc', False):.2f}× the samples/s of an RPC parameter server "
        f"({ps_value('samples_per_s_vs_rpc', True):.2f}× with a straggler), and with the straggler "
        f"{ps_value('time_to_target_vs_ddp_gloo', True):.2f}× DDP-gloo's time to the target loss. From "
        f"{ds.source()}: DLRM embedding push/pull at {dlrm:.2f}× RPC's rows/s (the 2× target is out of reach "
        f"there, see benchmarks/README.md); serving with {serving['replicas']} replicas answers at p99 "
        f"{serving['before_kill']['p99_ms']:.0f} ms before and {serving['after_replacement']['p99_ms']:.0f} ms "
        f"after a replica is killed and replaced.",
    ]


def _ms(seconds: float, two_places_below: float = 10, one_place_below: float = float("inf")) -> str:
    """Milliseconds: two decimal places below `two_places_below` ms, one below `one_place_below`, else none."""
    ms = seconds * 1000
    places = 2 if ms < two_places_below else 1 if ms < one_place_below else 0
    return f"{ms:.{places}f} ms"


def _size(size: int) -> str:
    return f"{size // MiB} MB" if size >= MiB else f"{size // 1024} KB"


def p2p_table() -> list[str]:
    p2p = result(P2P)
    columns = [("gloo", "gloo"), ("hoplite", "hoplite (copies)"), ("hoplite-zero-copy", "hoplite-zero-copy"),
               ("hoplite-tcp", "hoplite-tcp (copies)"), ("hoplite-tcp-zero-copy", "hoplite-tcp-zero-copy"),
               ("torch-rpc", "torch-rpc")]
    lines = _head(["size"] + [label for _, label in columns])
    for size in sorted({r["size_bytes"] for r in p2p.records}):
        cells = []
        for system, _ in columns:
            r = p2p.find(system=system, size_bytes=size)
            if r is None:
                cells.append("—")
            elif system == "gloo":
                cells.append(_ms(r["median_s"]))
            else:
                cells.append(f"{_ms(r['median_s'])} ({_x(r['time_vs_gloo'])})")
        lines.append(_row([_size(size)] + cells))
    return lines


def p2p_fresh_memory_table() -> list[str]:
    """Round trips that take memory not used before: hoplite keeping its objects, gloo receiving into new tensors."""
    p2p = result(P2P)
    lines = _head(["size", "gloo, reused tensor", "gloo-fresh", "gloo-kept", "hoplite-kept",
                   "hoplite-kept / gloo-fresh", "hoplite-kept / gloo-kept"])
    systems = ("gloo", "gloo-fresh", "gloo-kept", "hoplite-kept")
    for size in sorted({r["size_bytes"] for r in p2p.records if r["system"] == "hoplite-kept"}):
        t = {s: p2p.one(system=s, size_bytes=size)["median_s"] for s in systems}
        lines.append(_row([_size(size)] + [_ms(t[s]) for s in systems] +
                          [_x(t["hoplite-kept"] / t["gloo-fresh"]), _x(t["hoplite-kept"] / t["gloo-kept"])]))
    return lines


def ucx_p2p_table(name: str) -> list[str]:
    """UCX's round trip against our TCP's, copying and zero-copy, with gloo's for scale where it ran."""
    run = result(name)
    lines = _head(["size", "gloo", "hoplite-tcp", "hoplite-ucx (x tcp)", "hoplite-tcp-zero-copy",
                   "hoplite-ucx-zero-copy (x tcp)"])
    for size in sorted({r["size_bytes"] for r in run.records}):
        gloo = run.find(system="gloo", size_bytes=size)
        cells = [_ms(gloo["median_s"]) if gloo else "—"]
        for ours, theirs in (("hoplite-tcp", "hoplite-ucx"), ("hoplite-tcp-zero-copy", "hoplite-ucx-zero-copy")):
            tcp = run.one(system=ours, size_bytes=size)["median_s"]
            ucx = run.one(system=theirs, size_bytes=size)["median_s"]
            cells += [_ms(tcp), f"{_ms(ucx)} ({_x(ucx / tcp)})"]
        lines.append(_row([_size(size)] + cells))
    return _sourced(run, lines, ", round trip, median")


def ucx_shm_table() -> list[str]:
    """UCX's shared memory (UCX_TLS=sm,self) against our same-host path, copying and zero-copy, with gloo's and UCX over tcp for scale."""
    run = result(P2P_UCX_SHM)
    lines = _head(["size", "gloo", "hoplite (same-host)", "hoplite-ucx-shm (x same-host)", "hoplite-ucx (tcp)",
                   "hoplite-zero-copy (same-host)", "hoplite-ucx-shm-zero-copy (x same-host)"])
    for size in sorted({r["size_bytes"] for r in run.records}):
        t = {r["system"]: r["median_s"] for r in run.records if r["size_bytes"] == size}
        lines.append(_row([_size(size), _ms(t["gloo"]), _ms(t["hoplite"]),
                           f"{_ms(t['hoplite-ucx-shm'])} ({_x(t['hoplite-ucx-shm'] / t['hoplite'])})",
                           _ms(t["hoplite-ucx"]), _ms(t["hoplite-zero-copy"]),
                           f"{_ms(t['hoplite-ucx-shm-zero-copy'])} ({_x(t['hoplite-ucx-shm-zero-copy'] / t['hoplite-zero-copy'])})"]))
    return _sourced(run, lines, ", round trip, median")


def ucx_emulated_table() -> list[str]:
    """Time over the ideal of torch_hoplite over our TCP and over UCX, by op, N and size, each with its run's gloo."""
    tcp, ucx = result(UCX_EMULATED.format("tcp")), result(UCX_EMULATED.format("ucx"))
    for run, transport in ((tcp, "tcp"), (ucx, "ucx")):
        if run.settings.get("transport") != transport:
            raise ValueError(f"{run.name}: ran over {run.settings.get('transport')}, not {transport}")
    sizes = sorted({r["size_bytes"] for r in tcp.records})
    lines = _head(["op", "N"] + [f"{_size(s)}: {col}" for s in sizes
                                for col in ("our TCP", "UCX", "UCX / TCP time", "gloo (TCP run / UCX run)")])
    for op in dict.fromkeys(r["op"] for r in tcp.records):
        for n in sorted({r["nodes"] for r in tcp.records}):
            cells = [op, str(n)]
            for size in sizes:
                ours, theirs = (run.one(system="hoplite", op=op, nodes=n, size_bytes=size) for run in (tcp, ucx))
                gloo = [run.one(system="gloo", op=op, nodes=n, size_bytes=size)["ratio_to_ideal"] for run in (tcp, ucx)]
                cells += [_x(ours["ratio_to_ideal"]), _x(theirs["ratio_to_ideal"]),
                          f"{theirs['median_s'] / ours['median_s']:.2f}", f"{_x(gloo[0])} / {_x(gloo[1])}"]
            lines.append(_row(cells))
    return _sourced([tcp, ucx], lines, ", time over the ideal (median)")


def same_host_table() -> list[str]:
    coll = result(SAME_HOST)
    return _size_table(coll, *_op_rows(coll, "hoplite"), _time_vs_gloo)


def issue6_targets_table() -> list[str]:
    targets = result(ISSUE6_TARGETS)
    systems = [("hoplite", "hoplite"), ("hoplite-zero-copy", "hoplite-zero-copy"),
               ("hoplite-c10d", "hoplite-c10d"), ("gloo", "gloo")]
    return _sourced(targets, _ratio_rows(targets, systems), ": time over the ideal (CPU cores of all eight ranks)")


def asynchrony_table() -> list[str]:
    arrivals = result(ASYNCHRONY)
    systems = [("hoplite", "hoplite"), ("hoplite-c10d", "hoplite-c10d"), ("gloo", "gloo"), ("mpi", "Open MPI")]
    lines = _head(["op"] + [label for _, label in systems])
    for op in ("broadcast", "reduce", "allreduce"):
        cells = [f"{arrivals.value('median_s', op=op, system=system):.3g} s" for system, _ in systems]
        lines.append(_row([op] + cells))
    return _sourced(arrivals, lines, ": time from the last arrival to the slowest participant's end, median")


def parameter_server_table() -> list[str]:
    ps = result(WORKLOADS)
    lines = _head(["mode", "samples/s", "× RPC PS", "to MSE 0.006", "samples/s, straggler", "× RPC PS",
                   "to target, straggler", "× DDP-gloo"])
    for system in ("rpc", "ddp-gloo", "ddp-hoplite", "hoplite"):
        even = ps.one(workload="async_ps", system=system, straggler=False)
        slow = ps.one(workload="async_ps", system=system, straggler=True)
        lines.append(_row([system, f"{even['samples_per_s']:.0f}", f"{even['samples_per_s_vs_rpc']:.2f}",
                           f"{even['time_to_target_s']:.1f} s", f"{slow['samples_per_s']:.0f}",
                           f"{slow['samples_per_s_vs_rpc']:.2f}", f"{slow['time_to_target_s']:.1f} s",
                           f"{slow['time_to_target_vs_ddp_gloo']:.2f}"]))
    return lines


def dlrm_table() -> list[str]:
    ds = result(DLRM_SERVING)
    lines = _head(["system", "rows/s", "× rpc", "pull p50", "pull p99", "bytes sent per step", "step",
                   "of which compute"])
    for r in ds.where(workload="dlrm"):
        # The store's bytes are what its nodes counted; the others send the rows' payload.
        counted = "measured by the nodes" if r["system"] == "hoplite" else "payload"
        rows = f"{r['rows_per_s']:,.0f}".replace(",", " ")
        lines.append(_row([r["system"], rows, f"{r['rows_per_s_vs_rpc']:.2f}", _ms(r["pull_p50_ms"] / 1000, 0),
                           _ms(r["pull_p99_ms"] / 1000, 0), f"{r['bytes_per_step'] / 1e6:.0f} MB ({counted})",
                           _ms(r["step_ms"] / 1000, 0, 0), _ms(r["compute_ms"] / 1000, 0, 0)]))
    return _sourced(ds, lines)


def serving_table() -> list[str]:
    serving = result(DLRM_SERVING).one(workload="serving")
    lines = _head(["phase", "queries", "p50", "p99"])
    for key, phase in (("before_kill", "before the kill"), ("around_kill", "around the kill"),
                       ("after_replacement", "after the replacement")):
        p = serving[key]
        lines.append(_row([phase, str(p["queries"])] + [_ms(p[q] / 1000, 0, 1000) for q in ("p50_ms", "p99_ms")]))
    return lines + ["", f"{serving['queries_per_s']:.1f} queries/s overall."]


def rpc_table() -> list[str]:
    rpc = result(RPC)
    lines = _head(["case", "N", "S", "plain RPC", "offload", "refs / reduce"])
    for case, label, third in (("fanout", "fan-out", "refs"), ("fanin", "fan-in", "reduce")):
        for nodes in (4, 8):
            for size in (64 * MiB, 256 * MiB):
                at = dict(case=case, nodes=nodes, size_bytes=size)
                plain, offload = rpc.one(system="rpc", **at), rpc.one(system="offload", **at)
                cell = _x(offload["ratio_to_ideal"])
                if case == "fanout" and nodes == 8:  # issue #26's target: at least 5× faster than plain RPC
                    cell += f" ({plain['median_s'] / offload['median_s']:.1f}× faster)"
                lines.append(_row([label, str(nodes), _size(size), _x(plain["ratio_to_ideal"]), cell,
                                   _x(rpc.value("ratio_to_ideal", system=third, **at))]))
    return lines


def peers_table() -> list[str]:
    peers = result(PEERS)
    systems = [("hoplite", "hoplite"), ("hoplite-zero-copy", "`copy=False`"), ("hoplite-c10d", "hoplite-c10d"),
               ("gloo", "gloo"), ("mpi", "mpi"), ("mpi-yield", "mpi-yield")]
    return _ratio_rows(peers, systems)


def _ratio_rows(res: Result, systems: list[tuple[str, str]]) -> list[str]:
    present = [(s, label) for s, label in systems if res.where(system=s)]
    lines = _head(["op"] + [label for _, label in present])
    for op in OPS:
        cells = []
        for system, _ in present:
            r = res.find(op=op, system=system, nodes=8, size_bytes=256 * MiB)
            cells.append("—" if r is None else f"{_x(r['ratio_to_ideal'])} ({r['cpu_cores']:.2f})")
        if any(c != "—" for c in cells):
            lines.append(_row([op] + cells))
    return lines


def _pair_tables(pairs: list[tuple[str | tuple[str, str], str]], caption: str, header: list[str],
                 keep: Callable[[dict], bool], row: Callable[[dict, dict], str]) -> list[str]:
    """One table per before/after pair of result files (a name pattern with {} for "before" and "after", or
    the two names): a row for each kept record of "before" and its match in "after"."""
    lines = []
    for names, what in pairs:
        if isinstance(names, str):
            names = (names.format("before"), names.format("after"))
        before, after = result(names[0]), result(names[1])
        lines += [f"{what}: {before.source()} against {after.source()}. {caption}", ""] + _head(header)
        for r in filter(keep, before.records):
            a = after.one(op=r["op"], system=r["system"], nodes=r["nodes"], size_bytes=r["size_bytes"])
            lines.append(row(r, a))
        lines.append("")
    return lines


_KEY_CELLS: dict[str, Callable[[dict], str]] = {
    "op": lambda r: r["op"], "N": lambda r: str(r["nodes"]), "size": lambda r: _size(r["size_bytes"]),
    "system": lambda r: r["system"],
}


def _ideal_pair_tables(pairs: list[tuple[str | tuple[str, str], str]], keys: list[str],
                       keep: Callable[[dict], bool] = lambda r: True) -> list[str]:
    """_pair_tables of time over the ideal, with the `keys` columns (of _KEY_CELLS) naming each row."""
    def row(b: dict, a: dict) -> str:
        return _row([_KEY_CELLS[k](b) for k in keys] + [_spread(b), _spread(a)])

    return _pair_tables(pairs, "Time over the ideal, median (fastest–slowest trial):", keys + ["before", "after"],
                        keep, row)[:-1]


def node_split_table() -> list[str]:
    def loopback(b: dict, a: dict) -> str:
        cells = [f"{_ms(x['median_s'])} ({_x(x['time_vs_gloo'])})" for x in (b, a)]
        return _row([b["op"], str(b["nodes"]), _size(b["size_bytes"])] + cells)

    lines = _ideal_pair_tables(NODE_SPLIT_PAIRS, ["op", "system"]) + [""]
    lines += _pair_tables(NODE_SPLIT_LOOPBACK_PAIRS, "Median time, and time over gloo's in the same run:",
                          ["op", "N", "size", "before", "after"], lambda r: r["system"] == "hoplite", loopback)
    return lines[:-1]


def frames_table() -> list[str]:
    return _ideal_pair_tables(FRAMES_PAIRS, ["op", "size", "system"])


def budget_table() -> list[str]:
    """A table per traced op: each phase's mean over the trials (median) in ms, a column per node count and size."""
    res = result(BUDGET)
    lines = []
    for op in OPS:
        runs = sorted((r for r in res.where(op=op, system="hoplite") if r.get("budget")),
                      key=lambda r: (r["nodes"], r["size_bytes"]))
        if not runs:
            continue
        lines += _head([f"{op}: phase, mean (median) ms"] + [f"N = {r['nodes']}, {_size(r['size_bytes'])}" for r in runs])
        for phase in runs[0]["budget"]["phases"]:
            lines.append(_row([phase] + [f"{r['budget']['mean_ms'][phase]:.2f} ({r['budget']['median_ms'][phase]:.2f})"
                                         for r in runs]))
        lines.append(_row(["**sum: mean trial time**"] + [f"**{sum(r['budget']['mean_ms'].values()):.2f}**" for r in runs]))
        lines.append(_row(["median trial time (× ideal)"] + [f"{_ms3(r['median_s'])} ({_x(r['ratio_to_ideal'])})"
                                                            for r in runs]))
        lines.append(_row(["ideal: size / link rate"] + [_ms3(r["ideal_s"]) for r in runs]))
        lines.append("")
    return _sourced(res, lines[:-1])


def budget_targets_table() -> list[str]:
    return _ideal_pair_tables(BUDGET_PAIRS, ["op", "N", "system"])


def frames128_table() -> list[str]:
    return _ideal_pair_tables(FRAMES128_PAIRS, ["op", "N", "size", "system"], lambda r: r["nodes"] > 2)


def scale_table(name: str) -> list[str]:
    return _ideal_grid(name, [("hoplite", "torch_hoplite"), ("gloo", "gloo")],
                       ("hoplite", "hoplite time / gloo time"), ("cores (hoplite / gloo)", ["hoplite", "gloo"]))


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _head(labels: list[str]) -> list[str]:
    """A table's header and the line under it."""
    return [_row(labels), "|" + "---|" * len(labels)]


def _ms3(seconds: float) -> str:
    """Milliseconds to three significant digits, whole ones from 1000 ms (where :.3g would write 1.01e+03)."""
    ms = seconds * 1000
    return f"{ms:.3g} ms" if ms < 999.5 else f"{ms:.0f} ms"


def _time_vs_gloo(r: dict) -> str:
    return f"{_ms3(r['median_s'])} ({_x(r['time_vs_gloo'])})"


def _spread(r: dict) -> str:
    """Time over the ideal, median (fastest–slowest trial)."""
    return f"{r['ratio_to_ideal']:.3f}× ({r['min_s'] / r['ideal_s']:.3f}–{r['max_s'] / r['ideal_s']:.3f})"


def _signed(value: float, places: int) -> str:
    return f"{value:+.{places}f}".replace("-", "−")


def _paired_diff(paired: dict, places: int) -> str:
    """A `paired_vs_gloo`'s mean difference from gloo's time and its 95% interval."""
    low, high = paired["ci95_diff_ms"]
    return f"{_signed(paired['mean_diff_ms'], places)} ms ({_signed(low, places)} to {_signed(high, places)})"


def _op_rows(res: Result, system: str) -> tuple[str, list[tuple[str, dict]]]:
    """The head of the key columns ("op | N", or "N" for a file of one op) and a row (label, match) for each op
    and node count `system` ran."""
    runs = res.where(system=system)
    ops = [op for op in OPS if any(r["op"] == op for r in runs)]
    rows = [((f"{op} | " if len(ops) > 1 else "") + str(nodes), dict(op=op, nodes=nodes, system=system))
            for op in ops for nodes in sorted({r["nodes"] for r in runs if r["op"] == op})]
    return ("op | N" if len(ops) > 1 else "N"), rows


def _size_table(res: Result, head: str, rows: list[tuple[str, dict]], cell: Callable[[dict], str]) -> list[str]:
    """A column per size: for each (label, match) of `rows`, `cell` of the record that matches at each size
    that any row ran. `head` names the label's columns ("op | N")."""
    sizes = sorted({r["size_bytes"] for _, match in rows for r in res.where(**match)})
    lines = _head(head.split(" | ") + [_size(size) for size in sizes])
    for label, match in rows:
        lines.append(_row([label] + [cell(res.one(size_bytes=size, **match)) for size in sizes]))
    return lines


def _sourced(res: Result | list[Result], lines: list[str], what: str = "") -> list[str]:
    """`lines` under the names of their file or files (and `what` they show)."""
    sources = " and ".join(r.source() for r in (res if isinstance(res, list) else [res]))
    return [f"{sources}{what}:", ""] + lines


def _ideal_grid(name: str, systems: list[tuple[str, str]], timed: Optional[tuple[str, str]],
                cores: tuple[str, list[str]], spread: bool = False) -> list[str]:
    """The emulated-cluster run `name` by op (where it ran more than one), N and size: each of `systems`' time
    over the ideal (median; with `spread`, the fastest–slowest trial too; "—" where it did not run), the
    `timed` system's time over gloo's, and the CPU cores of all ranks of each `cores` system, under the
    file's name."""
    res = result(name)
    cell = _spread if spread else (lambda r: _x(r["ratio_to_ideal"]))
    ops = [op for op in OPS if res.where(op=op)]
    keys = (["op"] if len(ops) > 1 else []) + ["N", "size"]
    lines = _head(keys + [label for _, label in systems] + ([timed[1]] if timed else []) + [cores[0]])
    for op in ops:
        runs = res.where(op=op)
        for nodes in sorted({r["nodes"] for r in runs}):
            for size in sorted({r["size_bytes"] for r in runs}):
                at = {r["system"]: r for r in res.where(op=op, nodes=nodes, size_bytes=size)}
                cells = ([op] if len(ops) > 1 else []) + [str(nodes), _size(size)]
                cells += [cell(at[system]) if system in at else "—" for system, _ in systems]
                if timed:
                    cells.append(f"{at[timed[0]]['time_vs_gloo']:.2f}")
                lines.append(_row(cells + [" / ".join(f"{at[system]['cpu_cores']:.2f}" for system in cores[1])]))
    return _sourced(res, lines)


def loopback_tcp_table() -> list[str]:
    coll = result(LOOPBACK_TCP)
    return _sourced(coll, _size_table(coll, *_op_rows(coll, "hoplite"), _time_vs_gloo))


def reduce_tree_table() -> list[str]:
    coll = result(LOOPBACK_TCP)
    degrees = [("hoplite", "auto"), ("hoplite-d1", "d = 1"), ("hoplite-d2", "d = 2"), ("hoplite-dn", "d = N−1")]
    lines = _head(["N", "size"] + [label for _, label in degrees])
    for nodes in (4, 8):  # at N = 2 every degree is the same single hop
        for size in sorted({r["size_bytes"] for r in coll.records}):
            lines.append(_row([str(nodes), _size(size)] + [
                f"{coll.value('time_vs_gloo', op='reduce', system=system, nodes=nodes, size_bytes=size):.2f}"
                for system, _ in degrees]))
    return _sourced(coll, lines)


def ring_table() -> list[str]:
    systems = [("hoplite", "hoplite (N pieces)"), ("hoplite-one-piece", "hoplite-one-piece"), ("gloo", "gloo")]
    return _ideal_grid(RING, systems, ("hoplite", "hoplite / gloo time"),
                       ("cores (hoplite / gloo)", ["hoplite", "gloo"]))


def allreduce_ring_table() -> list[str]:
    systems = [("hoplite", "hoplite"), ("hoplite-pieces", "hoplite-pieces (composition)"),
               ("hoplite-c10d", "hoplite-c10d"), ("gloo", "gloo")]
    cores = ("cores (hoplite / composition / gloo)", ["hoplite", "hoplite-pieces", "gloo"])
    lines = _ideal_grid(ALLREDUCE_RING, systems, None, ("cores (hoplite / gloo)", ["hoplite", "gloo"]), spread=True)
    lines += [""] + _ideal_grid(ALLREDUCE_RING_256MB, systems, None, cores, spread=True)
    arrivals = result(ALLREDUCE_RING_ARRIVALS)
    after = ", ".join(f"{label} {arrivals.value('median_s', op='allreduce', system=system):.3g} s"
                      for system, label in systems)
    return lines + ["", f"Ranks ready 0.1 s apart (64 MB, N = 8), {arrivals.source()}: time from the last "
                        f"arrival to the slowest participant's end, median: {after}."]


def peers_n4_n8_table() -> list[str]:
    systems = [("hoplite", "hoplite"), ("hoplite-c10d", "hoplite-c10d"), ("gloo", "gloo"), ("mpi", "Open MPI")]
    return _ideal_grid(PEERS_N4_N8, systems, None, ("cores", [system for system, _ in systems]))


def c10d_table() -> list[str]:
    systems = [("hoplite-c10d", "hoplite-c10d"), ("hoplite", "hoplite"), ("gloo", "gloo")]
    return _ideal_grid(C10D, systems, ("hoplite-c10d", "c10d / gloo time"), ("cores", ["hoplite-c10d", "gloo"]))


def c10d_allgather_table() -> list[str]:
    allgather = result(C10D_ALLGATHER)
    return _sourced(allgather, _size_table(allgather, *_op_rows(allgather, "hoplite-c10d"),
                                           lambda r: f"{_x(r['ratio_to_ideal'])} ({_x(r['time_vs_gloo'])})"),
                    ": the backend's time over the ideal (over gloo's time)")


def c10d_loopback_table() -> list[str]:
    loopback = result(C10D_LOOPBACK)
    return _sourced(loopback, _size_table(loopback, *_op_rows(loopback, "hoplite-c10d"), _time_vs_gloo))


def _against_gloo(res: Result, lead: Callable[[int], list[str]] = lambda i: [],
                  paired: Callable[[dict], list[str]] = lambda c10d: []) -> list[str]:
    """A row per op of the backend's in `res`: the op, `lead`'s cells for the row's index, the backend's and
    gloo's time over the ideal (fastest–slowest trial) and the ratio of their times, `paired`'s cells for the
    backend's record, and the CPU cores of both."""
    lines = []
    for i, c10d in enumerate(res.where(system="hoplite-c10d")):
        gloo = res.one(op=c10d["op"], system="gloo")
        lines.append(_row([c10d["op"]] + lead(i) + [_spread(c10d), _spread(gloo), f"{c10d['time_vs_gloo']:.3f}"] +
                          paired(c10d) + [f"{c10d['cpu_cores']:.2f} / {gloo['cpu_cores']:.2f}"]))
    return lines


def c10d_cubic_table() -> list[str]:
    def trial_by_trial(c10d: dict) -> list[str]:
        paired = c10d["paired_vs_gloo"]
        return [f"{paired['median_ratio']:.3f}; {_paired_diff(paired, 1)}; "
                f"{paired['faster_trials']} of {paired['trials']}"]

    cubic = result(C10D_CUBIC)
    lines = _head(["op", "hoplite-c10d", "gloo", "time ratio",
                   "trial by trial (median ratio; mean difference, 95% CI; faster)", "cores"])
    return _sourced(cubic, lines + _against_gloo(cubic, paired=trial_by_trial))


def congestion_table(run: str) -> list[str]:
    """The run of the commit `run` on CUBIC and on BBR: the backend against gloo at N = 8, 256 MB."""
    runs = [(result(pattern.format(run)), first, rest) for pattern, first, rest in CONGESTION]
    lines = _head(["op", "congestion control", "hoplite-c10d", "gloo", "time ratio", "cores"])
    for res, first, rest in runs:
        lines += _against_gloo(res, lambda i: [rest if i else first])
    return _sourced([res for res, _, _ in runs], lines)


def paired_table() -> list[str]:
    runs = [(result(name), what) for name, what in PAIRED_RUNS]
    lines = _head(["run", "trials", "hoplite-c10d − gloo, mean (95% CI)", "median ratio", "faster"])
    for res, what in runs:
        paired = res.one(op="allreduce", system="hoplite-c10d")["paired_vs_gloo"]
        lines.append(_row([what, str(paired["trials"]), _paired_diff(paired, 2), f"{paired['median_ratio']:.4f}",
                           f"{paired['faster_trials']} of {paired['trials']}"]))
    return _sourced([res for res, _ in runs], lines)


def gpu_table() -> list[str]:
    gpu = result(GPU)
    rows = [(label, dict(op=op, system="hoplite-cuda"))
            for op, label in (("p2p", "p2p round trip"), ("broadcast", "broadcast"), ("allreduce", "allreduce"))]
    return _sourced(gpu, _size_table(gpu, "op (cuda / cpu time)", rows, lambda r: f"{r['time_vs_cpu']:.2f}"))


def gpu_c10d_table() -> list[str]:
    gpu = result(GPU)
    rows = [(f"{device}: hoplite / gloo", dict(system=f"c10d-hoplite-{device}")) for device in ("cpu", "cuda")]
    return _sourced(gpu, _size_table(gpu, "tensors", rows, lambda r: f"{r['time_vs_gloo']:.2f}"))


def emulated_collectives_table() -> list[str]:
    return _ideal_grid(EMULATED, [("hoplite", "torch_hoplite"), ("gloo", "gloo")],
                       ("hoplite", "hoplite time / gloo time"), ("cores (hoplite / gloo)", ["hoplite", "gloo"]))


def small_objects_line() -> list[str]:
    """The object store at 1 and 16 MB, N = 8, beside gloo: time over the ideal."""
    res = result(ALLREDUCE_RING)
    cells = []
    for size in (MiB, 16 * MiB):
        at = ", ".join(f"{op} {_x(res.value('ratio_to_ideal', op=op, system='hoplite', nodes=8, size_bytes=size))} "
                       f"(gloo {_x(res.value('ratio_to_ideal', op=op, system='gloo', nodes=8, size_bytes=size))})"
                       for op in ("broadcast", "reduce", "allreduce"))
        cells.append(f"{_size(size)}: {at}")
    return [f"Smaller objects, same cluster (CUBIC, ranks started at one instant), time over the ideal, "
            f"{res.source()}: " + "; ".join(cells) + ". Where the rest goes: the latency budget in benchmarks/README.md."]


def readme_lines() -> list[str]:
    lines = []
    for paragraph in (emulated_table(), small_objects_line(), same_host_lines(), rpc_lines(), workload_lines()):
        lines += ([""] if lines else []) + paragraph
    return lines


def _congestion_block(run: str) -> tuple[str, str, Callable[[], list[str]]]:
    return "BENCH_README", f"congestion-{run}", functools.partial(congestion_table, run)


# (the file, by its attribute here; the block's name; what goes into it)
BLOCKS: list[tuple[str, str, Callable[[], list[str]]]] = [
    ("README", "how-fast", readme_lines),
    ("BENCH_README", "p2p", p2p_table),
    ("BENCH_README", "p2p-fresh-memory", p2p_fresh_memory_table),
    ("BENCH_README", "ucx-p2p", functools.partial(ucx_p2p_table, P2P_UCX)),
    ("BENCH_README", "ucx-p2p-now", functools.partial(ucx_p2p_table, P2P_UCX_NOW)),
    ("BENCH_README", "ucx-p2p-h100-before", functools.partial(ucx_p2p_table, P2P_UCX_H100_BEFORE)),
    ("BENCH_README", "ucx-p2p-h100", functools.partial(ucx_p2p_table, P2P_UCX_H100)),
    ("BENCH_README", "ucx-p2p-h200-before", functools.partial(ucx_p2p_table, P2P_UCX_H200_BEFORE)),
    ("BENCH_README", "ucx-shm", ucx_shm_table),
    ("BENCH_README", "ucx-emulated", ucx_emulated_table),
    ("BENCH_README", "same-host", same_host_table),
    ("BENCH_README", "loopback-tcp", loopback_tcp_table),
    ("BENCH_README", "reduce-tree", reduce_tree_table),
    ("BENCH_README", "ring", ring_table),
    ("BENCH_README", "allreduce-ring", allreduce_ring_table),
    ("BENCH_README", "issue6-targets", issue6_targets_table),
    ("BENCH_README", "peers-n4-n8", peers_n4_n8_table),
    ("BENCH_README", "peers", peers_table),
    ("BENCH_README", "asynchrony", asynchrony_table),
    ("BENCH_README", "c10d", c10d_table),
    _congestion_block("910bf0a"),
    ("BENCH_README", "c10d-allgather", c10d_allgather_table),
    _congestion_block("a8a55bf"),
    ("BENCH_README", "c10d-loopback", c10d_loopback_table),
    _congestion_block("a65b094"),
    ("BENCH_README", "c10d-cubic", c10d_cubic_table),
    ("BENCH_README", "paired", paired_table),
    ("BENCH_README", "rpc", rpc_table),
    ("BENCH_README", "parameter-server", parameter_server_table),
    ("BENCH_README", "dlrm", dlrm_table),
    ("BENCH_README", "serving", serving_table),
    ("BENCH_README", "gpu", gpu_table),
    ("BENCH_README", "gpu-c10d", gpu_c10d_table),
    ("BENCH_README", "node-split", node_split_table),
    ("BENCH_README", "frames", frames_table),
    ("BENCH_README", "scale", functools.partial(scale_table, SCALE_16MB)),
    ("BENCH_README", "scale-16mb-frames128", functools.partial(scale_table, SCALE_16MB_FRAMES128)),
    ("BENCH_README", "scale-64mb", functools.partial(scale_table, SCALE_64MB)),
    ("BENCH_README", "budget", budget_table),
    ("BENCH_README", "budget-targets", budget_targets_table),
    ("BENCH_README", "frames128", frames128_table),
    ("BENCH_README", "emulated-collectives", emulated_collectives_table),
]


def begin_marker(name: str) -> str:
    return f"<!-- report:begin {name} (generated by `python -m torch_hoplite.bench.report --write`; edit the script) -->"


def end_marker(name: str) -> str:
    return f"<!-- report:end {name} -->"


def block_text(make: Callable[[], list[str]]) -> str:
    return "\n".join(make()) + "\n"


def render() -> str:
    """Every block, each under the name of its file and block."""
    return "".join(f"== {os.path.basename(globals()[attr])}: {name} ==\n{block_text(make)}"
                    for attr, name, make in BLOCKS)


def file_block(text: str, name: str) -> Optional[str]:
    """What `text` holds between block `name`'s markers (None without them)."""
    begin, end = begin_marker(name), end_marker(name)
    if begin not in text or end not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n") + "\n"


def replace_block(text: str, name: str, block: str) -> str:
    """`text` with block `name`'s contents replaced (its markers must be there)."""
    head, rest = text.split(begin_marker(name), 1)
    tail = rest.split(end_marker(name), 1)[1]
    return head + begin_marker(name) + "\n" + block + end_marker(name) + tail


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="replace the blocks in the files")
    mode.add_argument("--check", action="store_true", help="exit 1 if a file's block differs")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        sys.stdout.write(render())
        return 0
    failed = False
    for attr in dict.fromkeys(attr for attr, _, _ in BLOCKS):  # each file once, in order
        path = globals()[attr]
        with open(path) as f:
            original = f.read()
        text = original
        for name, make in ((n, m) for a, n, m in BLOCKS if a == attr):
            block, current = block_text(make), file_block(text, name)
            if current is None:
                print(f"{path} has no block {name!r} between its markers {begin_marker(name)!r} and "
                      f"{end_marker(name)!r}", file=sys.stderr)
                failed = True
            elif current != block and args.check:
                print(f"{path}'s block {name!r} differs from the results: run python -m torch_hoplite.bench.report "
                      "--write", file=sys.stderr)
                failed = True
            elif current != block:
                text = replace_block(text, name, block)
        if text != original:
            with open(path, "w") as f:
                f.write(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
