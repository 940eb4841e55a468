"""The soak run's report (see soak.py), from the ranks' JSON-line logs and the
nemesis's list of faults: JSON + PNG."""

from __future__ import annotations

import collections
import glob
import json
import os
import re
import statistics
from typing import Any, Callable, Optional, Union

from torch_hoplite.config import parse_size

ENDS_PROCESS = ("kill", "leave")  # faults after which the rank's objects are gone
NETWORK = ("partition", "loss", "delay")  # faults of a rank's link
KEEPS_PROCESS = ("pause",) + NETWORK  # faults the rank lives through: its own operations fail too
DISRUPTIVE = ENDS_PROCESS + KEEPS_PROCESS  # faults whose recovery is measured
FAULT_TIMES = ("t", "restart_at", "restarted", "back")  # a fault's moments (the report's count from the start)


def shifted(fault: dict, by: float) -> dict:
    """The fault with its moments moved by `by` seconds."""
    return {**fault, **{k: fault[k] + by for k in FAULT_TIMES if k in fault}}


def read_logs(workdir: str) -> list[dict]:
    records = []
    for path in sorted(glob.glob(os.path.join(workdir, "rank*.jsonl"))):
        with open(path) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # the last line of a killed process, cut short
    return records


def error_type(op: dict) -> str:
    return op["error"].split(":", 1)[0]


def object_owners(op: dict) -> list[tuple[int, int]]:
    """(rank, incarnation) of the process that put each object the operation
    touched (soak_workload.object_id names them)."""
    out = []
    for obj in op.get("objects", []):
        parts = obj.split(".")
        if len(parts) == 4 and parts[0] == "soak" and parts[1].isdigit() and parts[2].isdigit():
            out.append((int(parts[1]), int(parts[2])))
    return out


def lost_with_holder(op: dict, faults: list[dict]) -> bool:
    """Whether the operation touched an object whose owner's incarnation had
    been killed, or had left, before it ended: it may be gone with its only holder."""
    end = op["start"] + op["dur"]
    killed = {(f["rank"], f["incarnation"]) for f in faults if f["kind"] in ENDS_PROCESS and f["t"] <= end}
    return any(owner in killed for owner in object_owners(op))


def owners(op: dict) -> set[int]:
    """The ranks whose objects the operation touched."""
    return {rank for rank, _ in object_owners(op)}


def named_ranks(error: str) -> set[int]:
    """The ranks an error message names ("rank 3 at ...", "rank 3 (self)")."""
    return {int(m) for m in re.findall(r"\brank (\d+)\b", error)}


def lost_owners(error: str) -> set[tuple[int, int]]:
    """The owners, (rank, incarnation), of the soak's objects an error says
    were lost ("object 'soak.4.4.614' was lost"): whatever rank it names
    besides (where a reduce step failed, say), those objects went with a
    fault of the process that put them, not of an earlier one of its rank."""
    return {(int(r), int(i)) for r, i in re.findall(r"object 'soak\.(\d+)\.(\d+)\.\d+' was lost", error)}


def is_collective(op: dict) -> bool:
    """A c10d collective of the rounds every rank takes part in (soak_workload.CollectiveRounds)."""
    return op["op"].startswith("c10d ")


def aftermath(fault: dict, settle: float) -> float:
    """How long after its rank is back a fault still explains others'
    failures: `settle` after a kill or leave (the successor has rejoined); two
    of them after a pause or a network fault, since the rank takes its moved
    share back only once two heartbeat timeouts passed without news of trouble."""
    return settle if fault["kind"] in ENDS_PROCESS else 2 * settle


def explains(fault: dict, op: dict, until: float, settle: float) -> bool:
    """Whether `fault` can explain the failed operation of another rank: it
    ended after the fault and before the next fault on that rank, and its
    error names that rank (or, naming none, it touched that rank's objects).
    A fault the rank lives through also explains its own operations begun
    before the fault ended or within `settle` seconds after. An object lost
    is explained by its owner's faults alone. A fault explains others'
    failures begun only until its rank is back and its aftermath() more (a
    killed process's own objects' are not counted at all). Every rank is in
    every c10d round: a fault anywhere explains the collectives that began
    before its rank was back (`back`) and `settle` seconds more."""
    end = op["start"] + op["dur"]
    if is_collective(op):
        return fault["t"] <= end and op["start"] < fault["back"] + settle
    if not fault["t"] <= end < until:
        return False
    if op["rank"] == fault["rank"]:
        ended = fault.get("restarted", until)
        return fault["kind"] in KEEPS_PROCESS and op["start"] < ended + settle
    if op["start"] >= fault.get("back", until) + aftermath(fault, settle):
        return False
    lost = lost_owners(op["error"])
    if lost:
        return (fault["rank"], fault["incarnation"]) in lost
    named = named_ranks(op["error"])
    return fault["rank"] in named if named else fault["rank"] in owners(op)


def deleted_by_owner(op: dict, deleted_at: dict[str, float]) -> bool:
    """Whether the operation failed on an object its owner had begun to delete
    before it ended (a reader picks among an owner's last puts, and a fast
    owner may delete one while a slow reduce still reads it)."""
    end = op["start"] + op["dur"]
    found = re.search(r"object '([^']+)' was deleted", op["error"] or "")
    return bool(found) and deleted_at.get(found.group(1), end + 1) <= end


def deletions(ops: list[dict]) -> dict[str, float]:
    """When each object's delete began."""
    return {obj: op["start"] for op in ops if op["op"] == "delete" for obj in op.get("objects", [])}


def counted(op: dict, faults: list[dict], deleted_at: dict[str, float]) -> bool:
    """A failure that says something about recovery: not an object gone for
    good with its killed holder, nor one its owner deleted meanwhile."""
    return bool(op["error"]) and not lost_with_holder(op, faults) and not deleted_by_owner(op, deleted_at)


def mark_back(faults: list[dict], records: list[dict], end: float) -> None:
    """Sets each disruptive fault's `back`: when its rank's new process was up
    (after a kill or leave), or when it was resumed or healed."""
    up = {}
    for r in records:
        if r.get("event") == "up":
            up.setdefault((r["rank"], r["inc"]), r["t"])
    for f in faults:
        if f["kind"] in ENDS_PROCESS:
            f["back"] = up.get((f["rank"], f["incarnation"] + 1), end)
        elif f["kind"] in KEEPS_PROCESS:
            f["back"] = f.get("restarted", end)


def attribute(ops: list[dict], faults: list[dict], deleted_at: dict[str, float], end: float,
              settle: float) -> list[dict]:
    """Sets each disruptive fault's `recovery_s` (from the fault, for a pause
    also `after_resume_s`, to the end of the last object-store failure it
    explains, where a fault of the failing rank's own, if any, is the one
    that explains it, else those still under way, if any; 0 if none) and
    returns the counted failures that no fault explains. (A c10d round fails
    until the rank is back, restarts included: that is no measure of
    recovery.)"""
    disruptive = [f for f in faults if f["kind"] in DISRUPTIVE]
    windows = []
    for f in disruptive:
        later = [g["t"] for g in disruptive if g["rank"] == f["rank"] and g["t"] > f["t"]]
        windows.append((f, min(later) if later else end + 1))
        f["recovery_s"] = 0.0
        if f["kind"] == "pause":
            f["after_resume_s"] = 0.0
    unexplained = []
    for op in ops:
        if not counted(op, faults, deleted_at):
            continue
        causes = [f for f, until in windows if explains(f, op, until, settle)]
        if not causes:
            unexplained.append(op)
        if not causes or is_collective(op):
            continue
        # A fault of the rank's own explains it before any other's; else one
        # still under way (its rank not back `settle` seconds before the
        # operation began) before one whose rank was back by then.
        own = [f for f in causes if f["rank"] == op["rank"]]
        current = [f for f in causes if op["start"] < f["back"] + settle]
        op_end = op["start"] + op["dur"]
        for f in own or current or causes:
            f["recovery_s"] = max(f["recovery_s"], op_end - f["t"])
            if f["kind"] == "pause" and "restarted" in f:
                f["after_resume_s"] = max(f["after_resume_s"], op_end - f["restarted"])
    return unexplained


def outside_pool(sample: dict) -> Optional[int]:
    """Anonymous resident memory outside the store's pool. (Logs before
    d5a9813 lack it; those of d5a9813 have only the pool's mappings so far,
    which it holds still unless its cache overflowed.)"""
    if "shared" not in sample:
        return None
    return sample["rss"] - sample["shared"] - sample.get("pool", sample["mapped"])


def median_of(samples: list[dict], key: Union[str, Callable[[dict], Optional[int]]]) -> Optional[float]:
    values = [v for v in ((key(s) if callable(key) else s.get(key)) for s in samples) if v is not None]
    return statistics.median(values) if values else None


def median_mb(samples: list[dict], key: Union[str, Callable[[dict], Optional[int]]]) -> Optional[float]:
    value = median_of(samples, key)
    return None if value is None else value / 2**20


def resource_trend(samples: list[dict]) -> dict[str, Any]:
    """Per rank incarnation: first and last thirds' median RSS and fds."""
    by_process = collections.defaultdict(list)
    for s in samples:
        by_process[(s["rank"], s["inc"])].append(s)
    out = []
    for (rank, inc), series in sorted(by_process.items()):
        series.sort(key=lambda s: s["t"])
        third = max(1, len(series) // 3)
        head, tail = series[:third], series[-third:]
        out.append({
            "rank": rank, "incarnation": inc, "samples": len(series),
            "seconds": series[-1]["t"] - series[0]["t"],
            "rss_first_third_mb": statistics.median(s["rss"] for s in head) / 2**20,
            "rss_last_third_mb": statistics.median(s["rss"] for s in tail) / 2**20,
            "rss_max_mb": max(s["rss"] for s in series) / 2**20,
            "fds_first_third": statistics.median(s["fds"] for s in head),
            "fds_last_third": statistics.median(s["fds"] for s in tail),
            "fds_max": max(s["fds"] for s in series),
            "store_last_third_mb": statistics.median(s["store"] for s in tail) / 2**20,
            "objects_last_third": statistics.median(s["objects"] for s in tail),
            "pool_mapped_last_third_mb": statistics.median(s["mapped"] for s in tail) / 2**20,
            "pool_held_last_third_mb": median_mb(tail, "pool"),
            # Where RSS outside the store's pool goes (logs before 2026-11-27 lack these: None).
            **{f"{name}_{part}_third_mb": median_mb(samples_of, key)
               for name, key in (("anon_outside_pool", outside_pool), ("malloc_used", "malloc_used"),
                                 ("malloc_free", "malloc_free"), ("malloc_free_large", "malloc_free_large"))
               for part, samples_of in (("first", head), ("last", tail))},
            "py_blocks_first_third": median_of(head, "py_blocks"),
            "py_blocks_last_third": median_of(tail, "py_blocks"),
            # Copies the store evicted to make room, over the process's life (logs before 2026-11-27 lack it).
            "evictions": series[-1].get("evictions"),
            # Wakes of the node's HeapTrimmer, and their mean duration (logs before 2026-11-28 lack them): malloc_trim,
            # and since e3a0080 the pool's release of idle buffers before it.
            "heap_trims": series[-1].get("heap_trims"),
            "heap_trim_mean_ms": (series[-1]["heap_trim_us"] / series[-1]["heap_trims"] / 1e3
                                  if series[-1].get("heap_trims") else None),
        })
    return out


def shares_moved(samples: list[dict], nodes: int) -> dict[str, Any]:
    """How many shares of the directory the ranks took for moved, over all
    samples: shares pile up on the ranks never taken for failed if processes
    back from a stall or a cut-off do not take theirs back (logs before
    2026-11-27 lack it: None)."""
    moved = [s["shards_moved"] for s in samples if "shards_moved" in s]
    if not moved:
        return {"shares_moved_median": None, "shares_moved_max": None, "samples_with_half_moved": None}
    return {"shares_moved_median": statistics.median(moved), "shares_moved_max": max(moved),
            # Samples in which half of the shares or more had moved (their hosts carry two or more each).
            "samples_with_half_moved": sum(1 for m in moved if 2 * m >= nodes), "samples": len(moved)}


def summarize(workdir: str, faults: list[dict], began: float, settings: dict, machine: dict) -> dict[str, Any]:
    records = read_logs(workdir)
    ops = [r for r in records if r.get("event") == "op" and r["start"] >= began]
    samples = [r for r in records if r.get("event") == "sample"]
    hangs = [r for r in records if r.get("event") == "hang"]
    # An operation past its calls' timeouts: reported while running (the
    # watchdog), or late when it returned (counted once).
    reported = {(h["rank"], h["inc"], h["start"]) for h in hangs}
    late = [op for op in ops if op["late"] and (op["rank"], op["inc"], op["start"]) not in reported]
    counts: dict[str, dict[str, Any]] = {}
    deleted_at = deletions(ops)
    for op in ops:
        c = counts.setdefault(op["op"], {"ok": 0, "failed": 0, "errors": collections.Counter()})
        if op["error"]:
            c["failed"] += 1
            kind = error_type(op)
            if lost_with_holder(op, faults):
                kind += " (object of a killed or departed rank)"
            elif deleted_by_owner(op, deleted_at):
                kind += " (deleted by its owner meanwhile)"
            c["errors"][kind] += 1
        else:
            c["ok"] += 1
    end = max((op["start"] + op["dur"] for op in ops), default=began)
    mark_back(faults, records, end)
    # A rank back from a pause or a cut finds its peers again within a heartbeat timeout.
    unexplained = attribute(ops, faults, deleted_at, end, settings["options"]["heartbeat_timeout"])
    return {
        "benchmark": "soak",
        "machine": machine,
        "settings": settings,
        "seconds": end - began,
        "operations": {k: {"ok": v["ok"], "failed": v["failed"], "errors": dict(v["errors"])}
                       for k, v in sorted(counts.items())},
        "faults": [shifted(f, -began) for f in faults],
        # Failures no fault explains (see attribute()): each is a finding.
        "unexplained_failures": [{**op, "start": op["start"] - began} for op in unexplained],
        "faults_by_kind": dict(collections.Counter(f["kind"] for f in faults)),
        "wrong_bytes": sum(op["wrong"] for op in ops),
        "hangs": len(hangs) + len(late),
        "hang_records": hangs + late,
        "resources": resource_trend(samples),
        "directory": shares_moved(samples, settings["nodes"]),
        "timeline": {
            # Per second since the start: operations completed, by type, and failed.
            "completed": per_second(ops, began, end),
            "samples": [[round(s["t"] - began, 2), s["rank"], s["inc"], s["rss"], s["fds"], s["store"], s["objects"],
                         outside_pool(s), s.get("shards_moved")] for s in samples],
        },
    }


def per_second(ops: list[dict], began: float, end: float) -> dict[str, list[int]]:
    seconds = max(1, int(end - began) + 1)
    out = {kind: [0] * seconds for kind in sorted({op["op"] for op in ops})}
    out["failed"] = [0] * seconds
    for op in ops:
        second = min(seconds - 1, max(0, int(op["start"] + op["dur"] - began)))
        out["failed" if op["error"] else op["op"]][second] += 1
    return out


def write(report: dict, out: str) -> None:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    plot(report, os.path.splitext(out)[0] + ".png")


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_ops, ax_rss, ax_fds, ax_moved) = plt.subplots(4, 1, figsize=(11, 11), sharex=True,
                                                           gridspec_kw={"height_ratios": [3, 3, 2, 2]})
    completed = report["timeline"]["completed"]
    kinds = [k for k in completed if k != "failed"]
    ok, failed = {k: completed[k] for k in kinds}, completed["failed"]
    xs = list(range(len(failed)))
    ax_ops.stackplot(xs, [ok[k] for k in kinds], labels=kinds, alpha=0.8)
    ax_ops.plot(xs, failed, color="red", label="failed", linewidth=1)
    colors = {"kill": "black", "leave": "green", "pause": "purple", "stranger": "orange", "partition": "red",
              "loss": "brown", "delay": "teal"}
    for f in report["faults"]:
        for ax in (ax_ops, ax_rss, ax_fds, ax_moved):
            ax.axvline(f["t"], color=colors.get(f["kind"], "gray"), linewidth=0.8, alpha=0.6,
                       linestyle="-" if f["kind"] != "stranger" else ":")
    ax_ops.set_ylabel("operations completed / s")
    ax_ops.legend(loc="upper right", fontsize=8, ncol=len(kinds) + 1)
    s = report["settings"]
    seen = sorted({f["kind"] for f in report["faults"] if f["kind"] in colors})
    ax_ops.set_title(f"soak: {s['nodes']} ranks ({s.get('cluster', 'loopback')}), {s['minutes']:g} min, seed {s['seed']}; "
                     f"wrong bytes {report['wrong_bytes']}, hangs {report['hangs']}\n"
                     f"faults (lines): " + ", ".join(f"{k} {colors[k]}" for k in seen), fontsize=9)
    series = collections.defaultdict(list)
    for t, rank, inc, rss, fds, store, _objects, *more in report["timeline"]["samples"]:
        outside, moved = (more + [None, None])[:2]
        series[(rank, inc)].append((t, rss, fds, store, outside, moved))
    for (rank, inc), points in sorted(series.items()):
        points.sort()
        ts = [p[0] for p in points]
        line, = ax_rss.plot(ts, [p[1] / 2**20 for p in points], linewidth=0.8,
                            label=f"rank {rank}" if inc == 0 else None)
        ax_rss.plot(ts, [p[3] / 2**20 for p in points], linewidth=0.8, linestyle="--", color=line.get_color())
        if all(p[4] is not None for p in points):
            ax_rss.plot(ts, [p[4] / 2**20 for p in points], linewidth=0.8, linestyle=":", color=line.get_color())
        ax_fds.plot(ts, [p[2] for p in points], linewidth=0.8)
        if all(p[5] is not None for p in points):
            ax_moved.step(ts, [p[5] for p in points], linewidth=0.8, where="post", color=line.get_color())
    capacity = s.get("options", {}).get("capacity_bytes")
    if capacity is not None:
        capacity_mb = parse_size(capacity) / 2**20
        ax_rss.axhline(capacity_mb, color="gray", linewidth=0.8, linestyle=":")
        ax_rss.annotate("store capacity", (0, capacity_mb), fontsize=8, color="gray", xytext=(2, 2),
                        textcoords="offset points")
    ax_rss.set_ylabel("MiB: RSS (solid), store (dashed),\nanonymous outside the pool (dotted)", fontsize=8)
    ax_rss.legend(loc="upper right", fontsize=8, ncol=4)
    ax_fds.set_ylabel("open fds")
    ax_moved.set_ylabel("directory shares\nmoved, as each\nrank sees it", fontsize=8)
    ax_moved.set_ylim(bottom=0, top=s["nodes"])
    ax_moved.set_xlabel("seconds since the ranks started")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def print_summary(report: dict) -> None:
    print(f"soak: {report['seconds']:.0f} s, faults {report['faults_by_kind']}")
    for kind, c in report["operations"].items():
        print(f"  {kind:18s} ok {c['ok']:6d}  failed {c['failed']:5d}  {c['errors']}")
    for kind in DISRUPTIVE:
        recoveries = [f["recovery_s"] for f in report["faults"] if f["kind"] == kind]
        if recoveries:
            print(f"  recovery after a {kind}: median {statistics.median(recoveries):.2f} s, max {max(recoveries):.2f} s")
    resumes = [f["after_resume_s"] for f in report["faults"] if "after_resume_s" in f]
    if resumes:
        print(f"  failures after a resume: for up to {max(resumes):.2f} s")
    print(f"  failures no fault explains: {len(report['unexplained_failures'])}")
    for op in report["unexplained_failures"][:10]:
        print(f"    {op['start']:7.1f} s rank {op['rank']} {op['op']}: {op['error'][:200]}")
    for r in report["resources"]:
        print(f"  rank {r['rank']}.{r['incarnation']}: RSS {r['rss_first_third_mb']:.0f} -> {r['rss_last_third_mb']:.0f} MiB "
              f"(max {r['rss_max_mb']:.0f}; store {r['store_last_third_mb']:.0f} MiB in {r['objects_last_third']:.0f} objects, "
              f"pool mapped {r['pool_mapped_last_third_mb']:.0f}, evictions {r['evictions']}), fds {r['fds_first_third']:.0f} -> {r['fds_last_third']:.0f} "
              f"over {r['seconds']:.0f} s")
        if r.get("malloc_used_first_third_mb") is not None:
            def mb(key: str) -> str:
                return "?" if r[key] is None else f"{r[key]:.0f}"

            print(f"    outside the pool {mb('anon_outside_pool_first_third_mb')} -> {mb('anon_outside_pool_last_third_mb')}"
                  f" MiB; malloc in use {mb('malloc_used_first_third_mb')} -> {mb('malloc_used_last_third_mb')}, freed but"
                  f" kept {mb('malloc_free_first_third_mb')} -> {mb('malloc_free_last_third_mb')} MiB"
                  f" (in chunks of 256 KiB or more and heap tops {mb('malloc_free_large_first_third_mb')} ->"
                  f" {mb('malloc_free_large_last_third_mb')})")
        if r.get("heap_trims"):
            print(f"    heap trims: {r['heap_trims']}, {r['heap_trim_mean_ms']:.1f} ms each on average")
    d = report.get("directory", {})
    if d.get("shares_moved_max") is not None:
        print(f"  directory shares taken for moved: median {d['shares_moved_median']:g}, max {d['shares_moved_max']}, "
              f"half or more in {d['samples_with_half_moved']} of {d['samples']} samples")
    print(f"  wrong bytes {report['wrong_bytes']}, hangs {report['hangs']}")


def reanalyse(path: str, workdir: Optional[str] = None) -> dict[str, Any]:
    """Writes a soak's report again from its logs (kept next to it as
    ``<name>_logs``, or `workdir`) with this version of the analysis: its
    faults, settings and machine are the run's, its `analysed` the commit
    that analysed it now."""
    from torch_hoplite.bench.common import machine

    with open(path) as f:
        old = json.load(f)
    workdir = workdir or os.path.splitext(path)[0] + "_logs"
    records = read_logs(workdir)
    ends = [r["start"] + r["dur"] for r in records if r.get("event") == "op"]
    if not ends:
        raise ValueError(f"no operations logged in {workdir}")
    # The report's times count from `began`, and its `seconds` end at the last operation.
    began = max(ends) - old["seconds"]
    faults = [shifted(f, began) for f in old["faults"]]
    report = summarize(workdir, faults, began, old["settings"], old["machine"])
    now = machine()
    report["analysed"] = {"commit": now["commit"], "date": now["date"]}
    write(report, path)
    return report


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write a soak's report again from its logs.")
    parser.add_argument("result", help="the soak's JSON; its logs are read from <name>_logs")
    parser.add_argument("--workdir", default=None, help="where the logs are, if elsewhere")
    args = parser.parse_args()
    print_summary(reanalyse(args.result, args.workdir))
