"""Recovery time: the same broadcast and reduce with and without a participant
SIGKILLed in the middle, as a ratio (issue #4).

    python benchmarks/recovery.py [--nodes 8] [--size 64MB] [--trials 5] [--kill-at 0.3]

N local processes on loopback (rank 0 is this process).
  broadcast: rank 1 puts an object; ranks 2.. and 0 get it at once (receivers
             relay through each other). Failure: rank 2, the first receiver and
             so a relay for later ones, is killed `kill-at` x (the median
             time without failure) after the gets start. Time: until the last
             surviving receiver holds the whole object.
  reduce:    every rank puts an input; rank 0 reduces the first half of them
             to become ready (k = N/2 of N). Failure: a rank computing one of
             the chosen positions (not rank 0) is killed `kill-at` x the median
             time after the call; the coordinator redoes what depended on it
             with a spare input. Time: from the call until the result is
             complete (wait_reduce); the result is checked against the inputs
             the plan reports.
The killed rank is restarted (init(rejoin=True)) between trials. gloo and
MPI have no counterpart: a killed rank makes their collective fail on every
rank, so only torch_hoplite's own times are compared. Results go to
benchmarks/results/recovery.json and recovery.png.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time

import torch

import torch_hoplite as hop
from torch_hoplite.bench import common
from torch_hoplite.bench.local_cluster import Cluster


def put_filled(obj_id: str, numel: int, value: float) -> None:
    hop.put(torch.full((numel,), float(value)), obj_id, copy=False)


def timed_get(obj_id: str, timeout: float) -> tuple[float, float, float]:
    """(wall-clock time the object was complete here, its min, its max)."""
    t = hop.get(obj_id, timeout=timeout, copy=False).wait()
    return time.time(), float(t.min()), float(t.max())


def delete_all(ids: list[str]) -> None:
    for obj_id in ids:
        try:
            hop.delete(obj_id, timeout=10)
        except (hop.ObjectNotFoundError, hop.ObjectDeletedError):
            pass


def broadcast_trial(c: Cluster, tag: str, numel: int, kill_after: float | None) -> float:
    c.call(1, put_filled, tag, numel, 7)
    receivers = list(range(2, c.world_size))
    start = time.time()
    pending = {r: c.submit(r, timed_get, tag, 120) for r in receivers}
    if kill_after is not None:
        time.sleep(kill_after)
        c.kill(2)
        del pending[2]
    done, low, high = timed_get(tag, 120)
    ends = [done]
    assert low == high == 7.0
    for rank, p in pending.items():
        finished, low, high = p.result(120)
        assert low == high == 7.0, (rank, low, high)
        ends.append(finished)
    elapsed = max(ends) - start
    hop.delete(tag)
    return elapsed


def reduce_trial(c: Cluster, tag: str, numel: int, kill_after: float | None) -> tuple[float, int, int]:
    """(seconds, the rank killed or -1, recoveries the reduce made)."""
    n = c.world_size
    ids = [f"{tag}/in/{r}" for r in range(n)]
    for r in range(1, n):
        c.call(r, put_filled, ids[r], numel, r + 1)
    put_filled(ids[0], numel, 1)
    start = time.time()
    result, _ = hop.reduce(ids, num_objects=n // 2, id=f"{tag}/sum", timeout=120)
    victim = -1
    if kill_after is not None:
        # A child of the root: its output is needed until the very end.
        plan = result.reduce_plan
        candidates = [plan.holders[p] for p in range(len(plan.holders)) if plan.parents[p] == plan.root]
        candidates += [h for p, h in enumerate(plan.holders) if p != plan.root]
        victim = next(h for h in candidates if h != 0)
        time.sleep(max(0.0, start + kill_after - time.time()))
        c.kill(victim)
    plan = hop.wait_reduce(result, timeout=120)
    elapsed = time.time() - start
    out = hop.get(result, timeout=60, copy=False).wait()
    expected = sum(int(hop.object_ref.id_of(i).rsplit("/", 1)[1]) + 1 for i in plan.inputs)  # rank r put r + 1
    assert float(out.min()) == float(out.max()) == expected, (float(out.min()), float(out.max()), expected)
    if plan.recoveries:
        assert victim not in plan.holders, plan
    delete_all([f"{tag}/sum"] + [i for r, i in enumerate(ids) if r != victim])
    return elapsed, victim, plan.recoveries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--size", default="64MB")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--kill-at", type=float, default=0.3, help="kill after this fraction of the time without failure")
    parser.add_argument("--out", default=None, help="results directory (default benchmarks/results)")
    args = parser.parse_args()
    size = common.parse_sizes(args.size)[0]
    numel = size // 4
    out_dir = args.out or common.RESULTS
    c = Cluster(args.nodes, options={"heartbeat_timeout": 5, "connect_timeout": 5})
    records = []
    try:
        for op, trial in (("broadcast", broadcast_trial), ("reduce", reduce_trial)):
            times: dict[bool, list[float]] = {False: [], True: []}
            recovered = 0  # killed-participant trials in which a reduce redid work
            trial(c, f"{op}-warmup", numel, None)
            for t in range(args.trials):
                result = trial(c, f"{op}-ok-{t}", numel, None)
                times[False].append(result if op == "broadcast" else result[0])
            kill_after = args.kill_at * statistics.median(times[False])
            for t in range(args.trials):
                result = trial(c, f"{op}-kill-{t}", numel, kill_after)
                times[True].append(result if op == "broadcast" else result[0])
                recovered += op == "reduce" and result[2] > 0
                c.restart(2 if op == "broadcast" else result[1])
            base = statistics.median(times[False])
            for failed in (False, True):
                xs = times[failed]
                records.append({
                    "op": op, "nodes": args.nodes, "size_bytes": size, "killed": failed,
                    "kill_after_s": kill_after if failed else None,
                    "median_s": statistics.median(xs), "min_s": min(xs), "max_s": max(xs), "trials": xs,
                    "ratio_to_no_failure": statistics.median(xs) / base,
                    "reduce_recovered_trials": recovered if failed and op == "reduce" else None,
                })
    finally:
        c.close()
    common.print_table(records, [("op", "op", "s"), ("killed", "killed", ""), ("median s", "median_s", ".3f"),
                                 ("min s", "min_s", ".3f"), ("max s", "max_s", ".3f"),
                                 ("ratio", "ratio_to_no_failure", ".2f"),
                                 ("recovered", "reduce_recovered_trials", "d")])
    settings = {"nodes": args.nodes, "size": size, "trials": args.trials, "kill_at": args.kill_at,
                "network": "loopback", "date": datetime.date.today().isoformat()}
    common.write_json(os.path.join(out_dir, "recovery.json"), "recovery", records, settings)
    plot(records, os.path.join(out_dir, "recovery.png"), args.nodes, size)


def plot(records: list[dict], path: str, nodes: int, size: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = ["broadcast", "reduce"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, failed in enumerate((False, True)):
        rows = [next(r for r in records if r["op"] == op and r["killed"] == failed) for op in ops]
        xs = [j + (0.2 if failed else -0.2) for j in range(len(ops))]
        bars = ax.bar(xs, [r["median_s"] for r in rows], width=0.4, label="a participant killed" if failed else "no failure",
                      yerr=[[r["median_s"] - r["min_s"] for r in rows], [r["max_s"] - r["median_s"] for r in rows]])
        if failed:
            for bar, r in zip(bars, rows):
                ax.annotate(f"{r['ratio_to_no_failure']:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom")
    ax.set_xticks(range(len(ops)), ops)
    ax.set_ylabel("seconds (median, min-max)")
    ax.set_title(f"Recovery, {nodes} processes, {common.human_size(size)}, loopback")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
