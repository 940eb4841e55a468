"""Helpers shared by the benchmarks: machine description, sizes, result files."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import time
from typing import Any

import torch

from torch_hoplite.ports import free_port  # noqa: F401  (the harnesses' rendezvous ports)


def _results_dir() -> str:
    """benchmarks/results of the source checkout this runs from, else ./bench-results."""
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if os.path.isdir(os.path.join(checkout, "benchmarks")):
        return os.path.join(checkout, "benchmarks", "results")
    return os.path.join(os.getcwd(), "bench-results")


RESULTS = _results_dir()
# The collectives harness's --settle (seconds between the barrier and each
# timed call) and --common-start (seconds ahead of rank 0's clock reading
# after the barrier at which every rank starts; 0: off), as its rank
# processes read them from their environment (env_seconds).
SETTLE_ENV = "HOPLITE_BENCH_SETTLE"
COMMON_START_ENV = "HOPLITE_BENCH_COMMON_START"


def env_seconds(name: str) -> float:
    return float(os.environ.get(name, "0"))


# Example flags that keep TensorPipe on TCP through the emulated links: its shm
# transport and cma channel would cross between namespaces through memory.
TENSORPIPE_OVER_LINKS = ["--rpc-transports", "uv", "--rpc-channels", "basic"]


def rank_env(rank: int, world: int, master: str, port: int, emulated: bool) -> dict:
    """A rank process's environment as torchrun sets it (plus the interface to
    use on the emulated cluster)."""
    env = dict(os.environ, MASTER_ADDR=master, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
               PYTHONUNBUFFERED="1")
    if emulated:
        env.update(GLOO_SOCKET_IFNAME="eth0", TP_SOCKET_IFNAME="eth0")
    return env


def wait_all(procs: list, timeout: float) -> None:
    """Waits for every process; kills them all and raises as soon as one
    fails, or when the timeout runs out."""
    import subprocess

    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        if code != 0:
            for q in procs:
                q.kill()
            raise RuntimeError(f"a benchmark process failed or hung (exit {code}; see its output above)")


def run_ranks(target, world: int, args: tuple) -> dict:
    """Runs target(rank, *args, queue) in `world` spawned processes; each puts
    (rank, result) on the queue. Returns {rank: result}; raises, killing the rest,
    as soon as one process fails instead of waiting forever."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=target, args=(r, *args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    while len(results) < world:
        if queue.empty():
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise RuntimeError("a benchmark process failed (see its traceback above)")
            time.sleep(0.2)
            continue
        rank, result = queue.get()
        results[rank] = result
    for p in procs:
        p.join(60)
    return results


def compile_helper(source: str, name: str, compiler: str = "cc", libraries: tuple[str, ...] = ()) -> str:
    """A C helper program of the harness (`source`, beside this file), compiled
    into ~/.cache/torch_hoplite/`name` and rebuilt when its source is newer."""
    cc = shutil.which(compiler)
    if cc is None:
        raise RuntimeError(f"building {name} needs {compiler}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), source)
    cache = os.path.join(os.path.expanduser("~"), ".cache", "torch_hoplite")
    os.makedirs(cache, exist_ok=True)
    binary = os.path.join(cache, name)
    if not os.path.exists(binary) or os.path.getmtime(binary) < os.path.getmtime(path):
        partial = f"{binary}.{os.getpid()}"  # (another process may be running the old one)
        built = subprocess.run([cc, "-O2", "-o", partial, path, *(f"-l{lib}" for lib in libraries)],
                               capture_output=True, text=True)
        if built.returncode != 0:
            raise RuntimeError(f"building {name} from {source} failed:\n{built.stderr[-2000:]}")
        os.replace(partial, binary)
    return binary


def parse_sizes(text: str) -> list[int]:
    from torch_hoplite.config import parse_size

    return [parse_size(s.strip(), "size") for s in text.split(",") if s.strip()]


def human_size(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def memory_bytes() -> int:
    """This machine's memory (MemTotal), 0 if unknown."""
    try:
        with open("/proc/meminfo") as f:
            return int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        git = ["git", "-C", os.path.dirname(os.path.abspath(__file__))]
        commit = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        changed = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no", "--", ":(top,exclude)benchmarks/results"],
                                 capture_output=True, text=True).stdout.strip()
        if changed:
            commit += "+uncommitted changes"
    except OSError:
        commit = ""
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": memory_bytes(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_json(path: str, benchmark: str, records: list[dict], settings: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({"benchmark": benchmark, "machine": machine(), "settings": settings, "records": records}, f, indent=1)


def print_table(records: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """columns: (header, key, format)."""
    widths = [max(len(h), 10) for h, _, _ in columns]
    print("  ".join(h.rjust(w) for (h, _, _), w in zip(columns, widths)))
    for r in records:
        cells = []
        for (h, key, fmt), w in zip(columns, widths):
            v = r.get(key)
            cells.append(("-" if v is None else format(v, fmt)).rjust(w))
        print("  ".join(cells))


def bytes_moved(before: dict, after: dict) -> tuple[int, int]:
    """From two snapshots of a node's stats(): the bytes it received in
    between, and how many of them it read from a peer's memory (the same-host
    path)."""
    return (after["bytes_received"] - before["bytes_received"],
            after["bytes_received_same_host"] - before["bytes_received_same_host"])


def ucx_env() -> dict[str, str]:
    """The UCX_* variables of this process, which choose what the UCX transport uses (for a run's settings)."""
    return {k: v for k, v in os.environ.items() if k.startswith("UCX_")}


def data_path(network: str, received: int, same_host: int) -> str:
    """What carried a torch_hoplite system's bytes, from its receivers'
    counters: `network` (e.g. "loopback TCP"), reads of a peer's memory, or,
    when nothing was pulled, the directory's inline copies."""
    if received == 0:
        return f"inline in the directory ({network})"
    if same_host == 0:
        return network
    return "same-host memory reads" if same_host == received else f"same-host memory reads and {network}"
