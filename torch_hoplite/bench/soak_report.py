"""The soak run's report (see soak.py), from the ranks' JSON-line logs and the
nemesis's list of faults: JSON + PNG."""

from __future__ import annotations

import collections
import glob
import json
import os
import statistics
from typing import Any

# Errors that faults do not explain: an owner deleted the object (ObjectDeletedError) on purpose.
EXPECTED = ("ObjectDeletedError",)


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


def lost_with_holder(op: dict, faults: list[dict]) -> bool:
    """Whether the operation touched an object whose owner's incarnation had
    been killed before it started: it may be gone with its only holder."""
    for obj in op.get("objects", []):
        parts = obj.split(".")
        if len(parts) != 4:
            continue
        rank, incarnation = int(parts[1]), int(parts[2])
        if any(f["kind"] == "kill" and f["rank"] == rank and f["incarnation"] == incarnation and f["t"] <= op["start"] + op["dur"]
               for f in faults):
            return True
    return False


def recovery_seconds(fault: dict, ops: list[dict], faults: list[dict], until: float) -> float:
    """Seconds from the fault to the end of the last failed operation of
    another rank that the fault can explain (not a deliberate delete, not an
    object gone with a killed holder), before the next fault; 0 if none failed."""
    last = fault["t"]
    for op in ops:
        end = op["start"] + op["dur"]
        if (op["error"] and op["rank"] != fault["rank"] and fault["t"] <= end < until
                and error_type(op) not in EXPECTED and not lost_with_holder(op, faults)):
            last = max(last, end)
    return last - fault["t"]


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
        })
    return out


def summarize(workdir: str, faults: list[dict], began: float, settings: dict, machine: dict) -> dict[str, Any]:
    records = read_logs(workdir)
    ops = [r for r in records if r.get("event") == "op" and r["start"] >= began]
    samples = [r for r in records if r.get("event") == "sample"]
    hangs = [r for r in records if r.get("event") == "hang"]
    late = [op for op in ops if op["late"] and not op["error"]]
    counts: dict[str, dict[str, Any]] = {}
    for op in ops:
        c = counts.setdefault(op["op"], {"ok": 0, "failed": 0, "errors": collections.Counter()})
        if op["error"]:
            c["failed"] += 1
            kind = error_type(op)
            if lost_with_holder(op, faults):
                kind += " (object of a killed rank)"
            c["errors"][kind] += 1
        else:
            c["ok"] += 1
    fault_times = sorted(f["t"] for f in faults if f["kind"] in ("kill", "pause"))
    end = max((op["start"] + op["dur"] for op in ops), default=began)
    for f in faults:
        later = [t for t in fault_times if t > f["t"]]
        if f["kind"] in ("kill", "pause"):
            f["recovery_s"] = recovery_seconds(f, ops, faults, later[0] if later else end + 1)
    return {
        "benchmark": "soak",
        "machine": machine,
        "settings": settings,
        "seconds": end - began,
        "operations": {k: {"ok": v["ok"], "failed": v["failed"], "errors": dict(v["errors"])}
                       for k, v in sorted(counts.items())},
        "faults": [{**f, "t": f["t"] - began, **({"restart_at": f["restart_at"] - began} if "restart_at" in f else {}),
                    **({"restarted": f["restarted"] - began} if "restarted" in f else {})} for f in faults],
        "faults_by_kind": dict(collections.Counter(f["kind"] for f in faults)),
        "wrong_bytes": sum(op["wrong"] for op in ops),
        "hangs": len(hangs) + len(late),
        "hang_records": hangs + late,
        "resources": resource_trend(samples),
        "timeline": {
            "ops": [[op["start"] - began, op["dur"], op["op"], bool(op["error"]), op["rank"]] for op in ops],
            "samples": [[s["t"] - began, s["rank"], s["inc"], s["rss"], s["fds"]] for s in samples],
        },
    }


def write(report: dict, out: str) -> None:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    plot(report, os.path.splitext(out)[0] + ".png")


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_ops, ax_rss, ax_fds) = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    seconds = max(1, int(report["seconds"]) + 1)
    kinds = sorted({op[2] for op in report["timeline"]["ops"]})
    ok = {k: [0] * seconds for k in kinds}
    failed = [0] * seconds
    for start, dur, kind, error, _rank in report["timeline"]["ops"]:
        second = min(seconds - 1, max(0, int(start + dur)))
        if error:
            failed[second] += 1
        else:
            ok[kind][second] += 1
    xs = list(range(seconds))
    ax_ops.stackplot(xs, [ok[k] for k in kinds], labels=kinds, alpha=0.8)
    ax_ops.plot(xs, failed, color="red", label="failed", linewidth=1)
    colors = {"kill": "black", "pause": "purple", "stranger": "orange"}
    for f in report["faults"]:
        for ax in (ax_ops, ax_rss, ax_fds):
            ax.axvline(f["t"], color=colors.get(f["kind"], "gray"), linewidth=0.8, alpha=0.6,
                       linestyle="-" if f["kind"] != "stranger" else ":")
    ax_ops.set_ylabel("operations completed / s")
    ax_ops.legend(loc="upper right", fontsize=8, ncol=len(kinds) + 1)
    s = report["settings"]
    ax_ops.set_title(f"soak: {s['nodes']} ranks, {s['minutes']:g} min, seed {s['seed']}; "
                     f"wrong bytes {report['wrong_bytes']}, hangs {report['hangs']}; "
                     f"faults (lines): kill black, pause purple, stranger orange", fontsize=9)
    series = collections.defaultdict(list)
    for t, rank, inc, rss, fds in report["timeline"]["samples"]:
        series[(rank, inc)].append((t, rss, fds))
    for (rank, inc), points in sorted(series.items()):
        points.sort()
        ts = [p[0] for p in points]
        ax_rss.plot(ts, [p[1] / 2**20 for p in points], linewidth=0.8, label=f"rank {rank}" if inc == 0 else None)
        ax_fds.plot(ts, [p[2] for p in points], linewidth=0.8)
    ax_rss.set_ylabel("RSS (MiB)")
    ax_rss.legend(loc="upper right", fontsize=8, ncol=4)
    ax_fds.set_ylabel("open fds")
    ax_fds.set_xlabel("seconds since the ranks started")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def print_summary(report: dict) -> None:
    print(f"soak: {report['seconds']:.0f} s, faults {report['faults_by_kind']}")
    for kind, c in report["operations"].items():
        print(f"  {kind:7s} ok {c['ok']:6d}  failed {c['failed']:5d}  {c['errors']}")
    recoveries = [f["recovery_s"] for f in report["faults"] if "recovery_s" in f]
    if recoveries:
        print(f"  recovery after kill/pause: median {statistics.median(recoveries):.2f} s, max {max(recoveries):.2f} s")
    for r in report["resources"]:
        print(f"  rank {r['rank']}.{r['incarnation']}: RSS {r['rss_first_third_mb']:.0f} -> {r['rss_last_third_mb']:.0f} MiB "
              f"(max {r['rss_max_mb']:.0f}), fds {r['fds_first_third']:.0f} -> {r['fds_last_third']:.0f} over {r['seconds']:.0f} s")
    print(f"  wrong bytes {report['wrong_bytes']}, hangs {report['hangs']}")
