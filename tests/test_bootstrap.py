"""init() finds its store the ways torchrun users expect: from MASTER_ADDR /
MASTER_PORT / RANK / WORLD_SIZE, or from an initialized default process group."""

import datetime
import multiprocessing as mp
import os
import re
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

import torch_hoplite as hop
from torch_hoplite.ports import free_port


def _via_env(rank: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    try:
        hop.init()
        _exchange(rank, queue, "env")
    except BaseException as e:
        queue.put((rank, repr(e)))


def _via_process_group(rank: int, port: int, queue) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        hop.init()
        _exchange(rank, queue, "pg")
        dist.destroy_process_group()
    except BaseException as e:
        queue.put((rank, repr(e)))


def _exchange(rank: int, queue, tag: str) -> None:
    assert (hop.get_rank(), hop.get_world_size()) == (rank, 2)
    hop.put(torch.full((100_000,), float(rank)), f"{tag}-{rank}")
    other = hop.get(f"{tag}-{1 - rank}", timeout=30).wait()
    hop.barrier(timeout=30)
    hop.shutdown()
    queue.put((rank, float(other[0])))


def run_pair(target) -> dict:
    """Runs target(rank, port, queue) as ranks 0 and 1; what they put on the queue."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    return dict(queue.get() for _ in procs if not queue.empty())


@pytest.mark.parametrize("target", [_via_env, _via_process_group], ids=["torchrun-env", "process-group"])
def test_init_finds_the_store(target):
    assert run_pair(target) == {1: 0.0, 0: 1.0}


def test_init_alone_starts_a_one_process_cluster(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for kwargs in ({}, {"rank": 0, "world_size": 1}):
        hop.init(**kwargs)
        try:
            assert (hop.get_rank(), hop.get_world_size()) == (0, 1)
            ref = hop.put(torch.arange(70_000, dtype=torch.int64))
            assert torch.equal(hop.get(ref, timeout=10).wait(), torch.arange(70_000, dtype=torch.int64))
            hop.barrier(timeout=10)
        finally:
            hop.shutdown()


def test_init_without_a_store_for_several_ranks_says_what_is_missing(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="RANK and WORLD_SIZE"):
        hop.init(rank=1)
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        hop.init(rank=0, world_size=2)
    with pytest.raises(ValueError, match="out of range"):
        hop.init(dist.HashStore(), rank=3, world_size=2)
    assert not hop.is_initialized()


def _learns_rank_2_late(rank: int, port: int, queue) -> None:
    """Rank 1 adds its peers only after rank 0's put reached its shard, whose
    standby (rank 2) it must then write to before it knows where rank 2 is."""
    from cluster import ids_with_shard
    import torch_hoplite._bootstrap as bootstrap
    try:
        store = dist.TCPStore("127.0.0.1", port, 3, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
        exchange = bootstrap.Rendezvous.exchange_addresses

        def exchange_then_stall(self, host, port, host_identity):
            peers = exchange(self, host, port, host_identity)
            store.set("rank1-listens", "1")
            store.wait(["put-listed"])  # (the node runs meanwhile: its shard hears of the put)
            return peers

        if rank == 1:
            bootstrap.Rendezvous.exchange_addresses = exchange_then_stall
        hop.init(store, rank=rank, world_size=3, timeout=30)
        if rank == 0:
            store.wait(["rank1-listens"])
            on_rank_1 = ids_with_shard("late", 1, 3, lambda s: s == 1)[0]
            hop.put(torch.full((1000,), 7.0), on_rank_1, timeout=30)
            time.sleep(0.5)  # the shard mirrors the put to its standby, rank 2
            store.set("put-listed", "1")
        hop.put(torch.full((1000,), float(rank)), f"late-from-{rank}")
        hop.barrier(timeout=30)
        got = [float(hop.get(f"late-from-{r}", timeout=30).wait()[0]) for r in range(3)]
        moved = hop.stats()["shards_moved"]
        hop.barrier(timeout=30)  # (before any rank leaves, which moves its shard)
        hop.shutdown()
        queue.put((rank, (got, moved)))
    except BaseException as e:
        queue.put((rank, repr(e)))


def test_a_peer_heard_of_before_its_address_is_waited_for_not_failed():
    """A rank may be written to (a shard's standby mirror) before the
    rendezvous told this node its address: the write waits for the address,
    and no rank is taken for failed (it was, and its shard moved, under load)."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_learns_rank_2_late, args=(r, port, queue)) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    results = dict(queue.get() for _ in procs if not queue.empty())
    assert results == {r: ([0.0, 1.0, 2.0], 0) for r in range(3)}


TORCHRUN_SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_rpc_and_hoplite.py")


@pytest.mark.parametrize("order", ["hoplite-first", "rpc-first", "process-group"])
def test_torchrun_shares_one_rendezvous_with_rpc(order):
    """Under torchrun (the agent hosts the store), init_rpc, init_process_group
    and hop.init meet through MASTER_ADDR/PORT in any order, and nothing logs a
    bind error."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
           "--master-port", str(free_port()), TORCHRUN_SCRIPT, order]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    # The ranks share torchrun's stdout: a line may land inside another's.
    lines = sorted(re.findall(r"rank \d+: rpc \d+ hoplite \d+", run.stdout))
    assert lines == [f"rank {r}: rpc {r + 1} hoplite {(r + 1) % 3}" for r in range(3)], run.stdout
    assert "failed to bind" not in run.stderr and "EADDRINUSE" not in run.stderr, run.stderr


def _rpc_first_then_hoplite(rank: int, port: int, queue) -> None:
    import torch.distributed.rpc as rpc

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    try:
        rpc.init_rpc(f"w{rank}", rank=rank, world_size=2)
        hop.init(timeout=60)  # rank 0 already hosts a store on MASTER_PORT: the same, multi-tenant one
        _exchange(rank, queue, "rpc-first")
        rpc.shutdown()
    except BaseException as e:
        queue.put((rank, repr(e)))


def test_rpc_first_with_rank_0_hosting_the_store():
    """Without torchrun's agent, rank 0 hosts the store: init_rpc made it,
    hop.init() uses it instead of binding MASTER_PORT again (EADDRINUSE before)."""
    assert run_pair(_rpc_first_then_hoplite) == {0: 1.0, 1: 0.0}


def _init_and_report(rank: int, world_size: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    start = time.monotonic()
    try:
        hop.init(timeout=120)
        queue.put((rank, "joined", "", 0.0))
    except Exception as e:
        queue.put((rank, type(e).__name__, str(e), time.monotonic() - start))


def _clients_of(port: int) -> int:
    """Established connections on this host (IPv4 and IPv6) whose remote end is `port`."""
    count = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(path) as table:
            for line in list(table)[1:]:
                fields = line.split()
                remote, state = fields[2], fields[3]
                count += state == "01" and int(remote.rsplit(":", 1)[1], 16) == port
    return count


def test_losing_the_store_host_during_init_says_so():
    """Rank 0 hosts the store and dies while rank 2 never comes (rank 0 waits
    for it, rank 1 for rank 0's address): rank 1 learns at once that the store
    is gone, not a timeout."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    host = ctx.Process(target=_init_and_report, args=(0, 3, port, queue))
    host.start()
    waiter = ctx.Process(target=_init_and_report, args=(1, 3, port, queue))
    waiter.start()
    # Killed only once both are its clients (rank 0's own and rank 1's), however
    # slowly the processes start, and rank 1 has had a moment to start waiting.
    deadline = time.monotonic() + 60
    while _clients_of(port) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    host.kill()
    waiter.join(60)
    host.join(10)
    assert not waiter.is_alive()
    rank, kind, message, elapsed = queue.get()
    assert (rank, kind) == (1, "StoreLostError"), message
    assert f"lost the rendezvous store at 127.0.0.1:{port}" in message
    assert elapsed < 60  # the timeout was 120 s


def test_rpc_offload_before_init_says_so():
    import torch_hoplite.rpc as hop_rpc

    assert not hop.is_initialized()
    with pytest.raises(hop.NotInitializedError, match="init"):
        hop_rpc.enable()
    assert not hop_rpc.is_enabled()
