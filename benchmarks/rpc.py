"""torch.distributed.rpc with and without torch_hoplite, on the emulated cluster.

    python benchmarks/rpc.py [--nodes 4,8] [--sizes 64MB,256MB] [--trials 3] [--rate 1gbit]
    python benchmarks/rpc.py --loopback --nodes 3 --sizes 4MB --trials 1   # a quick local run

Rank 0 is the server, ranks 1..N-1 the callers. Each trial starts at a barrier
and lasts until the last rank is done (max end - min start); results are
checked exactly after each trial, outside the timed region.

- fanout: every caller asks the server for its weights (S bytes; the server
  changes them in place before each trial, as an optimizer step would).
  "rpc": rpc_sync returns the tensor (TensorPipe sends N-1 copies);
  "offload": the same code with torch_hoplite.rpc.enable(); "refs": the server
  returns an ObjectRef (one put per version) and the callers get it.
  Ideal: S/B (every caller needs S through its own link).
- fanin: every caller sends S of gradients to the server, which needs their
  sum. "rpc" / "offload": rpc_sync(accumulate, grad); "reduce": the callers put,
  the server reduces the first N-1 with torch_hoplite.reduce and gets the sum.
  Ideal: S/B (the server's link carries S at the least).
- small: round trip of a 1 KB tensor (rpc_sync echo), offload off and on,
  interleaved in blocks, from rank 1; median per call.
- rl: examples/rl_actor_learner.py with a 64 MB policy (ballast), 1 learner and
  N-1 actors, --transport rpc, offload and hoplite; median iteration time.

TensorPipe runs over its uv (TCP) transport and basic channel (its shm
transport and cma channel would bypass the emulated links). Results go to
benchmarks/results/rpc_emulated_<rate>.json and .png (rpc_loopback with --loopback).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch
import torch.distributed.rpc as rpc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch_hoplite as hop  # noqa: E402
import torch_hoplite.rpc as hop_rpc  # noqa: E402
from torch_hoplite.bench import common  # noqa: E402

FANOUT = ("rpc", "offload", "refs")
FANIN = ("rpc", "offload", "reduce")
RL = ("rpc", "offload", "hoplite")
SMALL_BYTES = 1024
SMALL_CALLS = 200
SMALL_BLOCKS = 10
SERVER = "rank0"
COLORS = {"rpc": "C0", "offload": "C1", "refs": "C2", "reduce": "C2", "hoplite": "C2"}  # plain RPC first
TP_OPTIONS = dict(rpc_timeout=600, _transports=["uv"], _channels=["basic"])


# ---------------------------------------------------------------- the server's side (runs on rank 0)

_weights = torch.empty(0)
_weights_ref: dict[int, hop.ObjectRef] = {}
_sum = torch.empty(0)
_lock = threading.Lock()


def _set_weights(n: int, value: float) -> None:
    global _weights
    if _weights.numel() != n:
        _weights = torch.empty(n)
    _weights.fill_(value)  # in place: a new version for the offload


def weights() -> torch.Tensor:
    return _weights


def weights_ref(version: int) -> hop.ObjectRef:
    """One put per version (concurrent callers share it)."""
    with _lock:
        if version not in _weights_ref:
            for old in list(_weights_ref):
                hop.delete(_weights_ref.pop(old))
            _weights_ref[version] = hop.put(_weights, blocking=True)
        return _weights_ref[version]


def _reset_sum(n: int) -> None:
    global _sum
    _sum = torch.zeros(n)


def accumulate(grad: torch.Tensor) -> None:
    with _lock:
        _sum.add_(grad)


def echo(t: torch.Tensor) -> torch.Tensor:
    return t


# ---------------------------------------------------------------- one rank


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(f"wrong result: {what}")


def worker(rank: int, world: int, sizes: list[int], trials: int, warmup: int, cases: list[str], out: str) -> None:
    hop.init(timeout=600)
    rpc.init_rpc(f"rank{rank}", rank=rank, world_size=world,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(**TP_OPTIONS))
    timings: dict[str, list] = {}

    def timed(key: str, trial: int, body) -> None:
        hop.barrier(timeout=600)
        start = time.monotonic()
        result = body()
        end = time.monotonic()
        if trial >= warmup:
            timings.setdefault(key, []).append((start, end))
        hop.barrier(timeout=600)
        return result

    def offload(on: bool) -> None:
        if on and not hop_rpc.is_enabled():
            hop_rpc.enable("1MiB")
        elif not on and hop_rpc.is_enabled():
            hop_rpc.disable(timeout=60)
        hop.barrier(timeout=600)

    callers = world - 1
    for size in sizes:
        n = size // 4
        if "fanout" in cases:
            for system in FANOUT:
                offload(system == "offload")
                for trial in range(warmup + trials):
                    value = float(trial + 1)
                    if rank == 0:
                        _set_weights(n, value)
                    hop.barrier(timeout=600)

                    def fetch():
                        if rank == 0:
                            return None
                        if system == "refs":
                            return hop.get(rpc.rpc_sync(SERVER, weights_ref, args=(trial,)), timeout=600).wait()
                        return rpc.rpc_sync(SERVER, weights)

                    got = timed(f"fanout/{system}/{size}", trial, fetch)
                    if rank != 0:
                        _check(got.numel() == n and bool((got == value).all()), f"fanout {system} rank {rank}")
                        del got
        if "fanin" in cases:
            for system in FANIN:
                offload(system == "offload")
                grad = torch.empty(n)
                for trial in range(warmup + trials):
                    grad.fill_(float(rank))  # in place: new gradients each step (the offload puts again)
                    if rank == 0:
                        _reset_sum(n)
                    ids = [f"grad/{size}/{trial}/{r}" for r in range(1, world)]
                    hop.barrier(timeout=600)

                    def send():
                        if system == "reduce":
                            if rank == 0:
                                total, _ = hop.reduce(ids, num_objects=callers, timeout=600)
                                return hop.get(total, timeout=600).wait(), total
                            hop.put(grad, ids[rank - 1])
                            return None
                        if rank != 0:
                            rpc.rpc_sync(SERVER, accumulate, args=(grad,))
                        return None

                    got = timed(f"fanin/{system}/{size}", trial, send)
                    if rank == 0:
                        total = got[0] if system == "reduce" else _sum
                        _check(bool((total == float(sum(range(1, world)))).all()), f"fanin {system}")
                        if system == "reduce":
                            hop.delete(got[1])
                    elif system == "reduce":
                        hop.delete(ids[rank - 1])  # the server has the sum: the inputs are done with
    if "small" in cases:
        t = torch.arange(SMALL_BYTES // 4, dtype=torch.float32)
        for block in range(SMALL_BLOCKS):
            for system in ("rpc", "offload"):
                offload(system == "offload")
                if rank == 1:
                    for call in range(SMALL_CALLS):
                        start = time.monotonic()
                        got = rpc.rpc_sync(SERVER, echo, args=(t,))
                        end = time.monotonic()
                        _check(torch.equal(got, t), f"small {system}")
                        if call >= 10:
                            timings.setdefault(f"small/{system}/{SMALL_BYTES}", []).append((start, end))
                hop.barrier(timeout=600)
    offload(False)
    rpc.shutdown()
    hop.shutdown()
    with open(out, "w") as f:
        json.dump(timings, f)


# ---------------------------------------------------------------- the parent


def _ideal(case: str, size: int, rate_bps: float) -> float | None:
    if case in ("fanout", "fanin") and rate_bps:
        return size / (rate_bps / 8)
    return None


def summarize(per_rank: dict[int, dict], world: int, rate_bps: float, network: str) -> list[dict]:
    records = []
    keys = sorted({k for timings in per_rank.values() for k in timings}, key=lambda k: (k.split("/")[0], int(k.split("/")[2]), k))
    for key in keys:
        case, system, size = key.split("/")
        size = int(size)
        runs = [per_rank[r][key] for r in per_rank if key in per_rank[r]]
        if case == "small":
            times = [end - start for start, end in runs[0]]
            skews = after_last = [0.0]
        else:
            count = len(runs[0])
            times = [max(run[i][1] for run in runs) - min(run[i][0] for run in runs) for i in range(count)]
            skews = [max(run[i][0] for run in runs) - min(run[i][0] for run in runs) for i in range(count)]
            after_last = [max(run[i][1] for run in runs) - max(run[i][0] for run in runs) for i in range(count)]
        median = statistics.median(times)
        ideal = _ideal(case, size, rate_bps)
        records.append({
            "case": case, "system": system, "nodes": world, "size_bytes": size, "network": network,
            "ideal_s": ideal, "ratio_to_ideal": median / ideal if ideal else None,
            "trials": len(times), "median_s": median, "min_s": min(times), "max_s": max(times),
            "times_s": times, "start_skew_s": statistics.median(skews),
            "after_last_start_s": statistics.median(after_last),
        })
    plain = {(r["case"], r["nodes"], r["size_bytes"]): r["median_s"] for r in records if r["system"] == "rpc"}
    for r in records:
        base = plain.get((r["case"], r["nodes"], r["size_bytes"]))
        r["time_vs_rpc"] = r["median_s"] / base if base else None
    return records


def _worker_cmd(rank: int, world: int, args, out: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--worker", str(rank), "--nodes", str(world),
            "--sizes", args.sizes, "--trials", str(args.trials), "--warmup", str(args.warmup),
            "--cases", ",".join(c for c in args.cases.split(",") if c != "rl"), "--out", out]


def _rl_cmd(transport: str, out_dir: str, args) -> list[str]:
    return [sys.executable, os.path.join(ROOT, "examples", "rl_actor_learner.py"), "--transport", transport,
            "--policy-bytes", args.rl_policy_bytes, "--iterations", str(args.rl_iterations), "--target", "0",
            *common.TENSORPIPE_OVER_LINKS, "--out-dir", out_dir]


def run_world(world: int, args, launch, env_for) -> tuple[list[dict], list[dict]]:
    """Runs the RPC cases and the RL example on `world` ranks started by
    launch(rank, cmd, env); returns (per-rank timings, RL results)."""
    rl_results = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [c for c in args.cases.split(",") if c != "rl"]
        per_rank = {}
        if cases:
            procs = [launch(r, _worker_cmd(r, world, args, os.path.join(tmp, f"rank{r}.json")), env_for(r, world))
                     for r in range(world)]
            common.wait_all(procs, 3600)
            for r in range(world):
                with open(os.path.join(tmp, f"rank{r}.json")) as f:
                    per_rank[r] = json.load(f)
        if "rl" in args.cases.split(","):
            for transport in RL:
                out_dir = os.path.join(tmp, f"rl-{transport}")
                procs = [launch(r, _rl_cmd(transport, out_dir, args), env_for(r, world)) for r in range(world)]
                common.wait_all(procs, 1800)
                with open(os.path.join(out_dir, f"rl_actor_learner_{transport}.json")) as f:
                    result = json.load(f)
                rl_results.append({
                    "case": "rl", "system": transport, "nodes": world,
                    "size_bytes": result["policy_bytes"], "trials": result["iterations"],
                    "median_s": result["iteration_s_median"], "times_s": result["iteration_s"],
                    "min_s": min(result["iteration_s"]), "max_s": max(result["iteration_s"]),
                })
        return per_rank, rl_results


def plot(records: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [c for c in ("fanout", "fanin", "rl", "small") if any(r["case"] == c for r in records)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    for ax, case in zip(axes[0], panels):
        rs = [r for r in records if r["case"] == case]
        points = sorted({(r["nodes"], r["size_bytes"]) for r in rs})
        systems = [s for s in COLORS if any(r["system"] == s for r in rs)]
        width = 0.8 / len(systems)
        use_ideal = all(r.get("ratio_to_ideal") for r in rs)
        for i, system in enumerate(systems):
            values = []
            for point in points:
                match = [r for r in rs if (r["nodes"], r["size_bytes"]) == point and r["system"] == system]
                value = (match[0]["ratio_to_ideal"] if use_ideal else match[0]["median_s"] * (1e6 if case == "small" else 1)) if match else 0
                values.append(value)
            ax.bar([p + i * width for p in range(len(points))], values, width, label=system, color=COLORS[system])
        ax.set_xticks([p + width * (len(systems) - 1) / 2 for p in range(len(points))])
        ax.set_xticklabels([f"N={n}\n{common.human_size(s)}" for n, s in points])
        unit = "time / ideal (S/B)" if use_ideal else ("µs per call" if case == "small" else "s per iteration")
        ax.set_ylabel(unit)
        ax.set_title({"fanout": "fan-out: server -> N-1 callers", "fanin": "fan-in: N-1 callers -> server",
                      "rl": "RL iteration (64 MB policy)", "small": "1 KB round trip"}[case])
        if use_ideal:
            ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="4,8")
    parser.add_argument("--sizes", default="64MB,256MB")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--cases", default="fanout,fanin,small,rl")
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--loopback", action="store_true", help="local processes on 127.0.0.1, no ideal")
    parser.add_argument("--rl-policy-bytes", default="64MB")
    parser.add_argument("--rl-iterations", type=int, default=20)
    parser.add_argument("--out", default=None, help="result path without extension")
    parser.add_argument("--replot", default=None, help="redraw the PNG of a result JSON and exit")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = common.parse_sizes(args.sizes)
    if args.replot:
        with open(args.replot) as f:
            result = json.load(f)
        rate = result["settings"]["rate"]
        plot(result["records"], args.replot.removesuffix(".json") + ".png",
             f"torch RPC with torch_hoplite ({'emulated ' + rate if rate else 'loopback'})")
        return
    if args.worker is not None:
        worker(args.worker, int(args.nodes), sizes, args.trials, args.warmup, args.cases.split(","), args.out)
        return

    from torch_hoplite.bench.collectives import _rate_bps
    from torch_hoplite.bench.emulated_cluster import EmulatedCluster

    records, link_checks = [], {}
    rate_bps = 0.0 if args.loopback else _rate_bps(args.rate)
    for world in [int(n) for n in args.nodes.split(",")]:
        port = common.free_port()
        if args.loopback:
            per_rank, rl = run_world(world, args, lambda r, cmd, env: subprocess.Popen(cmd, env=env),
                                     lambda r, w: common.rank_env(r, w, "127.0.0.1", port, emulated=False))
            records += summarize(per_rank, world, 0.0, "loopback") + rl
            continue
        with EmulatedCluster(world, rate=args.rate) as cluster:
            achieved = cluster.measure_rate()
            link_checks[world] = achieved
            print(f"N={world}: one TCP flow gets {achieved / 1e9:.3f} Gbit/s of {args.rate}", flush=True)
            per_rank, rl = run_world(world, args, lambda r, cmd, env: cluster.popen(r, cmd, env=env),
                                     lambda r, w: common.rank_env(r, w, cluster.address(0), port, emulated=True))
            records += summarize(per_rank, world, rate_bps, f"emulated {args.rate}") + rl
    for r in records:
        if r["case"] == "rl":
            base = [x for x in records if x["case"] == "rl" and x["nodes"] == r["nodes"] and x["system"] == "rpc"]
            r["time_vs_rpc"] = r["median_s"] / base[0]["median_s"] if base else None
    name = args.out or os.path.join(common.RESULTS, "rpc_loopback" if args.loopback else f"rpc_emulated_{args.rate}")
    settings = {"nodes": args.nodes, "sizes": sizes, "trials": args.trials, "warmup": args.warmup,
                "cases": args.cases, "rate": None if args.loopback else args.rate, "link_check_bps": link_checks,
                "tensorpipe": {k: v for k, v in TP_OPTIONS.items() if k != "rpc_timeout"},
                "rl_policy_bytes": args.rl_policy_bytes, "rl_iterations": args.rl_iterations}
    common.write_json(name + ".json", "rpc", records, settings)
    plot(records, name + ".png", f"torch RPC with torch_hoplite ({'loopback' if args.loopback else 'emulated ' + args.rate})")
    common.print_table(records, [("case", "case", ""), ("system", "system", ""), ("nodes", "nodes", "d"),
                                 ("size", "size_bytes", "d"), ("median s", "median_s", ".4f"),
                                 ("x ideal", "ratio_to_ideal", ".3f"), ("x rpc", "time_vs_rpc", ".3f")])
    print(f"wrote {name}.json and {name}.png")


if __name__ == "__main__":
    main()
