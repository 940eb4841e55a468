"""The workload examples as benchmarks: asynchronous PS training beside DDP and
an RPC parameter server, and ensemble serving through a replica's failure.

    python benchmarks/workloads.py [--nodes 8] [--rate 1gbit] [--hidden 1024] [--max-seconds 60]
    python benchmarks/workloads.py --loopback --nodes 4          # one host, no emulated links

- async PS: examples/async_ps.py, one process per node (rank 0 the server,
  the others workers), every mode with and without the straggler: samples/s
  and time to the target loss. TensorPipe is held to its uv transport and
  basic channel on the emulated cluster (its shm and cma paths would bypass
  the links), gloo to eth0.
- dlrm: examples/dlrm_push_pull.py, one process per node (2 servers, the
  others trainers): rows/s, p50/p99 pull latency and bytes per step of rpc,
  all_to_all and hoplite.
- serving: examples/serving_ensemble.py, the frontend and its launcher on
  node 0, a replica on each other node (the launcher kills replica 2 and
  starts its replacement in the same namespace): queries/s and p50/p99
  latency before, around and after the kill.

Results: benchmarks/results/workloads_<network>.json and .png (with
--workloads naming a subset: workloads-<subset>_<network>).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from torch_hoplite.bench import common  # noqa: E402

EXAMPLES = os.path.join(ROOT, "examples")
MODE_ORDER = ("rpc", "ddp-gloo", "ddp-hoplite", "hoplite")


def async_ps_cmd(args, out_dir: str, emulated: bool) -> list[str]:
    cmd = [sys.executable, os.path.join(EXAMPLES, "async_ps.py"), "--hidden", str(args.hidden),
           "--max-seconds", str(args.max_seconds), "--target", str(args.target), "--allow-miss",
           "--warmup-seconds", str(args.warmup_seconds), "--out-dir", out_dir]
    if emulated:
        cmd += common.TENSORPIPE_OVER_LINKS
    return cmd


def run_example_ranks(cmd_for, name: str, world: int, launch, env_for) -> dict:
    """Runs cmd_for(out_dir) as every rank (started by launch) and reads the
    JSON `name` that rank 0 writes into out_dir."""
    with tempfile.TemporaryDirectory() as tmp:
        common.wait_all([launch(r, cmd_for(tmp), env_for(r, world)) for r in range(world)], 3600)
        with open(os.path.join(tmp, name)) as f:
            return json.load(f)


def dlrm_cmd(args, out_dir: str, emulated: bool) -> list[str]:
    cmd = [sys.executable, os.path.join(EXAMPLES, "dlrm_push_pull.py"), "--rows", str(args.dlrm_rows),
           "--batch", str(args.dlrm_batch), "--dim", str(args.dlrm_dim), "--steps", str(args.dlrm_steps),
           "--out-dir", out_dir]
    if emulated:
        cmd += common.TENSORPIPE_OVER_LINKS
    return cmd


def run_serving(args, cluster=None) -> dict:
    """The serving example with one replica per node but the first; its
    launcher runs on node 0 (hosting the store) and starts each rank in its
    node's namespace."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, os.path.join(EXAMPLES, "serving_ensemble.py"), "--queries", str(args.queries),
               "--replicas", str(args.nodes - 1), "--out-dir", tmp]
        if cluster is None:
            subprocess.run(cmd, check=True, timeout=1800)
        else:
            cmd += ["--host", cluster.address(0), "--rank-prefix", cluster.command_prefix()]
            common.wait_all([cluster.popen(0, cmd)], 1800)
        name = [f for f in os.listdir(tmp) if f.endswith(".json")][0]
        with open(os.path.join(tmp, name)) as f:
            return json.load(f)


def ps_records(result: dict, world: int, network: str) -> list[dict]:
    records = []
    for run in result["runs"]:
        records.append({
            "workload": "async_ps", "system": run["mode"], "straggler": run["straggler"], "nodes": world,
            "network": network, "params": result["params"], "samples_per_s": run["samples_per_s"],
            "time_to_target_s": run["time_to_target_s"], "reached": run["reached"], "updates": run["updates"],
            "final_loss": run["final_loss"], "seconds": run["seconds"], "curve": run["curve"],
        })
    for r in records:
        peers = {p["system"]: p for p in records if p["straggler"] == r["straggler"]}
        r["samples_per_s_vs_rpc"] = r["samples_per_s"] / peers["rpc"]["samples_per_s"] if "rpc" in peers else None
        gloo = peers.get("ddp-gloo")
        r["time_to_target_vs_ddp_gloo"] = (r["time_to_target_s"] / gloo["time_to_target_s"]
                                           if gloo and r["reached"] and gloo["reached"] else None)
    return records


def _bars(ax, labels: list[str], series: dict[str, list[float]]) -> None:
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(labels))], values, width, label=name)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels)
    ax.legend(fontsize=8)


def plot(records: list[dict], serving: dict | None, path: str, title: str, network: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ps = [r for r in records if r["workload"] == "async_ps"]
    dlrm = [r for r in records if r["workload"] == "dlrm"]
    panels = 2 * bool(ps) + 2 * bool(dlrm) + bool(serving)
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels, 3.8), squeeze=False)
    axes = list(axes[0])
    if ps:
        modes = [m for m in MODE_ORDER if any(r["system"] == m for r in ps)]

        def values(key, straggler):
            return [next((r[key] or 0 for r in ps if r["system"] == m and r["straggler"] == straggler), 0)
                    for m in modes]
        for key, label in (("samples_per_s", "samples/s"), ("time_to_target_s", "seconds to the target (0: missed)")):
            ax = axes.pop(0)
            _bars(ax, modes, {"no straggler": values(key, False), "worker 1 2.5x slower": values(key, True)})
            ax.set_ylabel(label)
        ax.set_title(f"async PS, {ps[0]['nodes']} nodes, {ps[0]['params'] / 1e6:.2f} M params", fontsize=9)
    if dlrm:
        systems = [r["system"] for r in dlrm]
        ax = axes.pop(0)
        _bars(ax, systems, {"rows/s": [r["rows_per_s"] for r in dlrm]})
        ax.set_title(f"DLRM, {dlrm[0]['nodes']} nodes (2 servers), {dlrm[0]['rows']:,} rows x 26", fontsize=9)
        ax = axes.pop(0)
        _bars(ax, systems, {"p50": [r["pull_p50_ms"] for r in dlrm], "p99": [r["pull_p99_ms"] for r in dlrm]})
        ax.set_ylabel("pull latency (ms)")
        ax.set_title(f"DLRM pulls, batch {dlrm[0]['batch']} per trainer", fontsize=9)
    if serving:
        ax = axes.pop(0)
        phases = [("before_kill", "before"), ("around_kill", "around kill"), ("after_replacement", "after")]
        _bars(ax, [label for _, label in phases],
              {stat: [(serving[p] or {}).get(f"{stat}_ms", 0) for p, _ in phases] for stat in ("p50", "p99")})
        ax.set_yscale("log")
        ax.set_ylabel("query latency (ms)")
        ax.set_title(f"serving, {serving['replicas']} replicas ({serving['queries_per_s']:.1f} queries/s, {network})",
                     fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--loopback", action="store_true")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--target", type=float, default=0.004)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--warmup-seconds", type=float, default=2.0)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--workloads", default="ps,dlrm,serving")
    parser.add_argument("--dlrm-rows", type=int, default=1_000_000, help="rows per table (26 tables)")
    parser.add_argument("--dlrm-dim", type=int, default=32)
    parser.add_argument("--dlrm-batch", type=int, default=2048)
    parser.add_argument("--dlrm-steps", type=int, default=30)
    parser.add_argument("--out", default=None, help="result path without extension")
    args = parser.parse_args()
    selected = [w for w in args.workloads.split(",") if w]
    if set(selected) - {"ps", "dlrm", "serving"}:
        parser.error("--workloads takes ps, dlrm and serving")
    world = args.nodes
    port = common.free_port()
    link_check = None
    records, dlrm, serving = [], None, None

    def run_all(launch, env_for, network, cluster=None):
        nonlocal dlrm, serving
        if "ps" in selected:
            result = run_example_ranks(lambda out: async_ps_cmd(args, out, not args.loopback), "async_ps.json",
                                       world, launch, env_for)
            records.extend(ps_records(result, world, network))
        if "dlrm" in selected:
            dlrm = run_example_ranks(lambda out: dlrm_cmd(args, out, not args.loopback), "dlrm_push_pull.json",
                                     world, launch, env_for)
            records.extend({"workload": "dlrm", "nodes": world, "network": network, "rows": dlrm["rows"],
                            "dim": dlrm["dim"], "batch": dlrm["batch"], "alpha": dlrm["alpha"], **r}
                           for r in dlrm["records"])
        if "serving" in selected:
            serving = run_serving(args, cluster)
            records.append({"workload": "serving", "system": "hoplite", "nodes": serving["replicas"] + 1,
                            "network": network, **{k: v for k, v in serving.items() if k != "latency_s"}})

    if args.loopback:
        network = "loopback"
        run_all(lambda r, cmd, env: subprocess.Popen(cmd, env=env),
                lambda r, w: common.rank_env(r, w, "127.0.0.1", port, emulated=False), network)
    else:
        from torch_hoplite.bench.emulated_cluster import EmulatedCluster

        network = f"emulated {args.rate}"
        with EmulatedCluster(world, rate=args.rate) as cluster:
            link_check = cluster.measure_rate()
            print(f"one TCP flow gets {link_check / 1e9:.3f} Gbit/s of {args.rate}", flush=True)
            run_all(lambda r, cmd, env: cluster.popen(r, cmd, env=env),
                    lambda r, w: common.rank_env(r, w, cluster.address(0), port, emulated=True), network, cluster)
    subset = "" if len(selected) == 3 else "-" + "-".join(selected)
    name = args.out or os.path.join(common.RESULTS,
                                    f"workloads{subset}_{'loopback' if args.loopback else 'emulated_' + args.rate}")
    settings = {"nodes": world, "rate": None if args.loopback else args.rate, "link_check_bps": link_check,
                "hidden": args.hidden, "target": args.target, "max_seconds": args.max_seconds,
                "warmup_seconds": args.warmup_seconds, "queries": args.queries, "workloads": selected,
                "dlrm": {"rows": args.dlrm_rows, "dim": args.dlrm_dim, "batch": args.dlrm_batch,
                         "steps": args.dlrm_steps, "servers": 2}}
    common.write_json(name + ".json", "workloads", records, settings)
    plot(records, serving, name + ".png", f"workloads ({network})", network)
    common.print_table([r for r in records if r["workload"] == "dlrm"],
                       [("dlrm", "system", ""), ("rows/s", "rows_per_s", ".0f"), ("x rpc", "rows_per_s_vs_rpc", ".2f"),
                        ("pull p50 ms", "pull_p50_ms", ".1f"), ("pull p99 ms", "pull_p99_ms", ".1f"),
                        ("bytes/step", "bytes_per_step", ".3g"), ("step ms", "step_ms", ".0f"),
                        ("compute ms", "compute_ms", ".0f")])
    common.print_table([r for r in records if r["workload"] == "async_ps"],
                       [("system", "system", ""), ("straggler", "straggler", ""), ("samples/s", "samples_per_s", ".0f"),
                        ("x rpc", "samples_per_s_vs_rpc", ".2f"), ("to target s", "time_to_target_s", ".1f"),
                        ("x ddp-gloo", "time_to_target_vs_ddp_gloo", ".2f")])
    print(f"wrote {name}.json and {name}.png")


if __name__ == "__main__":
    main()
