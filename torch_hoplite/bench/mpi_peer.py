"""Open MPI as a peer system: MPI_Bcast, MPI_Reduce and MPI_Allreduce timed by
a small C program (mpi_peer.c) that the harness compiles with mpicc. It runs
after the torch systems of the same point, in the same cluster: by default
("mpi") Open MPI busy-polls, every rank taking a core while it waits, and
would distort anything running beside it; "mpi-yield" runs it with
mpi_yield_when_idle=1 (a waiting rank yields the core between polls).

Needs Open MPI (Debian: openmpi-bin libopenmpi-dev; `make bench` installs it).
Across network namespaces mpirun runs in node 0's namespace and starts its
daemons through an rsh agent that enters each node's namespace (a launch dies
at start-up now and then: all daemons share one hostname and /tmp; retried).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from typing import Optional

from torch_hoplite.bench import common

OPS = {"broadcast", "reduce", "allreduce"}
# System name -> whether waiting ranks yield their core.
SYSTEMS = {"mpi": False, "mpi-yield": True}
_LAUNCH_ATTEMPTS = 3


def build() -> str:
    """The compiled peer, rebuilt when its source is newer."""
    if shutil.which("mpicc") is None or shutil.which("mpirun") is None:
        raise RuntimeError("the mpi system needs Open MPI (apt-get install openmpi-bin libopenmpi-dev; "
                           "`make bench` installs it)")
    return common.compile_helper("mpi_peer.c", "mpi_peer", compiler="mpicc")


def _parse(stdout: str, world: int, system: str) -> dict:
    """{rank: {(op, system, size): [(t0, t1, cores), ...]}} from rank 0's JSON lines."""
    per_rank: dict = {r: {} for r in range(world)}
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        point = json.loads(line)
        for trial in point["runs"]:
            for r, (t0, t1, cores) in enumerate(trial):
                per_rank[r].setdefault((point["op"], system, point["size"]), []).append((t0, t1, cores))
    return per_rank


def _launch(cmd: list[str], popen, what: str) -> str:
    last = ""
    for _ in range(_LAUNCH_ATTEMPTS):
        proc = popen(cmd)
        out, err = proc.communicate(timeout=3600)
        if proc.returncode == 0:
            return out
        last = err[-2000:]
    raise RuntimeError(f"mpirun failed {_LAUNCH_ATTEMPTS} times {what}:\n{last}")


def _yielding(system: str) -> list[str]:
    return ["--mca", "mpi_yield_when_idle", "1"] if SYSTEMS[system] else []


def _args(binary: str, ops: list[str], sizes: list[int], warmup: int, trials: int, arrival: float) -> list[str]:
    return [binary, ",".join(op for op in ops if op in OPS), ",".join(map(str, sizes)), str(warmup), str(trials),
            str(arrival), str(common.env_seconds(common.SETTLE_ENV)),
            str(common.env_seconds(common.COMMON_START_ENV))]


def run_loopback(world: int, ops: list[str], sizes: list[int], trials: int, warmup: int, arrival: float = 0.0,
                 system: str = "mpi") -> dict:
    binary = build()
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(world), "--bind-to", "none",
           "--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo", *_yielding(system),
           *_args(binary, ops, sizes, warmup, trials, arrival)]

    def popen(c: list[str]) -> subprocess.Popen:
        return subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    return _parse(_launch(cmd, popen, "on loopback"), world, system)


def run_emulated(cluster, world: int, ops: list[str], sizes: list[int], trials: int, warmup: int,
                 arrival: float = 0.0, env: Optional[dict] = None, system: str = "mpi") -> dict:
    binary = build()
    with tempfile.TemporaryDirectory() as tmp:
        hostfile = os.path.join(tmp, "hosts")
        with open(hostfile, "w") as f:
            f.writelines(f"{cluster.address(i)} slots=1\n" for i in range(world))
        agent = os.path.join(tmp, "agent.sh")
        with open(agent, "w") as f:
            # Open MPI calls `agent [options] HOST COMMAND...`: run COMMAND in HOST's namespace.
            f.write("#!/bin/sh\n"
                    "while [ $# -gt 0 ]; do case \"$1\" in *.*.*.*) break;; *) shift;; esac; done\n"
                    "host=\"$1\"; shift\n"
                    f"exec ip netns exec \"{cluster.name}-n$(( ${{host##*.}} - 1 ))\" sh -c \"$*\"\n")
        os.chmod(agent, 0o755)
        cmd = ["mpirun", "--allow-run-as-root", "-np", str(world), "--hostfile", hostfile, "--map-by", "node",
               "--bind-to", "none", "--mca", "plm_rsh_agent", agent, "--mca", "pml", "ob1",
               "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "eth0",
               "--mca", "oob_tcp_if_include", "eth0", *_yielding(system),
               *_args(binary, ops, sizes, warmup, trials, arrival)]
        def popen(c: list[str]) -> subprocess.Popen:
            return cluster.popen(0, c, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        return _parse(_launch(cmd, popen, "on the emulated cluster"), world, system)
