"""A small cluster of real local processes, for tests and benchmarks: the
calling process is rank 0 and ranks 1.. are worker processes that run the
(importable) functions sent to them. Ranks can be killed and restarted."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from typing import Any, Callable, Optional

import torch.distributed as dist

import torch_hoplite as hop

CALL_TIMEOUT = 120.0


def shard_of(obj_id: str, world: int) -> int:
    """The directory shard of an id (FNV-1a, as the core hashes it)."""
    h = 1469598103934665603
    for c in obj_id.encode():
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h % world


def worker_context() -> mp.context.BaseContext:
    """Where workers start: a fork server that imported torch and torch_hoplite
    once, so that a worker starts in milliseconds instead of importing torch
    again (seconds on two cores). Torch's import-time settings are therefore
    the fork server's; the environment is the caller's (`_worker_main`)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _worker_main(rank: int, world_size: int, port: int, conn, options: dict, env: dict) -> None:
    # A forked worker has the fork server's environment: take the caller's.
    os.environ.clear()
    os.environ.update(env)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False)
    hop.init(store, rank=rank, world_size=world_size, **options)
    conn.send(("ready", os.getpid()))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        fn, args = msg
        try:
            conn.send(("ok", fn(*args)))
        except BaseException as e:  # report everything, including assertion failures
            conn.send(("err", (e, traceback.format_exc())))
    hop.shutdown()
    conn.send(("bye", None))


def in_thread(fn: Callable, *args, **kwargs) -> Callable[[float], Any]:
    """Runs fn on a thread of this process (e.g. a reduce that returns only
    once every task has registered, which a frozen rank never does); the
    returned join(timeout) gives its result or raises its exception."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn(*args, **kwargs)
        except Exception as e:  # handed to the caller of join
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join(timeout: float) -> Any:
        thread.join(timeout)
        assert not thread.is_alive(), f"{fn.__name__} did not return within {timeout} s"
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    return join


class Pending:
    def __init__(self, cluster: "Cluster", rank: int):
        self._cluster = cluster
        self._rank = rank

    def result(self, timeout: float = CALL_TIMEOUT) -> Any:
        return self._cluster._receive(self._rank, timeout)


class Cluster:
    def __init__(self, world_size: int, options: Optional[dict] = None, env: Optional[dict] = None):
        self.world_size = world_size
        options = options or {}
        self._options, self._env = options, env or {}
        self.store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
        self._conns = {}
        self.procs = {}
        for rank in range(1, world_size):
            self._start_worker(rank, options)
        hop.init(self.store, rank=0, world_size=world_size, **options)
        self.pids = {rank: self._receive(rank, CALL_TIMEOUT, expect="ready") for rank in self._conns}
        self.pids[0] = os.getpid()

    def _start_worker(self, rank: int, options: dict) -> None:
        ctx = worker_context()
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=_worker_main,
            args=(rank, self.world_size, self.store.port, child, options, {**os.environ, **self._env}),
            daemon=True,
        )
        proc.start()
        self._conns[rank] = parent
        self.procs[rank] = proc

    def submit(self, rank: int, fn: Callable, *args) -> Pending:
        self._conns[rank].send((fn, args))
        return Pending(self, rank)

    def call(self, rank: int, fn: Callable, *args, timeout: float = CALL_TIMEOUT) -> Any:
        if rank == 0:
            return fn(*args)
        return self.submit(rank, fn, *args).result(timeout)

    def _receive(self, rank: int, timeout: float, expect: str = "ok") -> Any:
        conn = self._conns[rank]
        if not conn.poll(timeout):
            raise TimeoutError(f"rank {rank} did not answer within {timeout} s")
        kind, value = conn.recv()
        if kind == "err":
            exc, tb = value
            raise exc from RuntimeError(f"in rank {rank}:\n{tb}")
        assert kind == expect, (kind, value)
        return value

    def restart(self, rank: int, **options) -> None:
        """Starts a new process for `rank`, killed before, which rejoins the cluster."""
        self._start_worker(rank, {**self._options, **options, "rejoin": True})
        self.pids[rank] = self._receive(rank, CALL_TIMEOUT, expect="ready")

    def freeze(self, rank: int, timeout: float = 5.0) -> None:
        """SIGSTOPs a rank and waits until the kernel reports every one of its
        threads stopped (the signal takes effect thread by thread, asynchronously)."""
        pid = self.pids[rank]
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = []
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        states.append(f.read().rsplit(")", 1)[1].split()[0])
                except FileNotFoundError:
                    pass  # a thread that just exited
            if states and all(s == "T" for s in states):
                return
            time.sleep(0.001)
        raise TimeoutError(f"rank {rank} (pid {pid}) did not stop within {timeout} s")

    def kill(self, rank: int) -> None:
        self.procs[rank].kill()
        self.procs[rank].join(10)
        del self._conns[rank]

    def close(self) -> None:
        for rank, conn in list(self._conns.items()):
            try:
                conn.send(None)
                if conn.poll(30):
                    conn.recv()
            except (BrokenPipeError, EOFError, OSError):
                pass
        for proc in self.procs.values():
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        hop.shutdown()
