"""Joining a cluster through a PyTorch Store: which store, which address, who is where."""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
import secrets
import socket
import struct
import time
import uuid
from typing import Optional

import torch.distributed as dist

from torch_hoplite.errors import HopliteTimeoutError, StoreLostError


def resolve_store(
    store: Optional[dist.Store], rank: Optional[int], world_size: Optional[int], timeout: float
) -> tuple[dist.Store, int, int]:
    """The store to rendezvous through, with this process's rank and the world size.

    In order: an explicit store; the default process group's store when
    torch.distributed is initialized; torch's own ``env://`` rendezvous from
    MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE (a multi-tenant TCPStore that rank 0
    hosts and that ``init_process_group`` and ``rpc.init_rpc`` share, or
    torchelastic's agent store under torchrun); with none of these, a
    one-process cluster on an in-memory store, as ``ray.init()`` starts one.
    """
    if store is None and dist.is_available() and dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    if rank is None:
        rank = _env_int("RANK")
    if world_size is None:
        world_size = _env_int("WORLD_SIZE")
    has_master = bool(os.environ.get("MASTER_ADDR")) and _env_int("MASTER_PORT") is not None
    if store is None and not has_master and rank in (None, 0) and world_size in (None, 1):
        return dist.HashStore(), 0, 1
    if rank is None or world_size is None:
        raise ValueError(
            "torch_hoplite.init: rank and world_size are unknown; pass them, set RANK and WORLD_SIZE "
            "(torchrun does), or initialize torch.distributed first"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"torch_hoplite.init: rank {rank} is out of range for world size {world_size}")
    if store is None:
        if not has_master:
            raise ValueError(
                f"torch_hoplite.init: world size {world_size} needs a rendezvous, but no store was given, "
                "torch.distributed is not initialized, and MASTER_ADDR/MASTER_PORT are not set"
            )
        store = _env_store(rank, world_size, timeout)
    return store, rank, world_size


def _env_store(rank: int, world_size: int, timeout: float) -> dist.Store:
    """torch's env:// store: the same server that init_process_group and
    rpc.init_rpc use in this process (multi-tenant), so any order works."""
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    try:
        store, _, _ = next(
            dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout))
        )
    except dist.DistStoreError as e:  # rank 0's store waits for every rank to connect
        raise HopliteTimeoutError(
            f"torch_hoplite.init: rank {rank} timed out after {timeout:g} s waiting for all {world_size} ranks "
            f"to connect to the rendezvous store at {where}: {e}"
        ) from e
    except (RuntimeError, dist.DistError) as e:
        raise StoreLostError(
            f"torch_hoplite.init: rank {rank} could not reach the rendezvous store at {where} "
            f"(MASTER_ADDR/MASTER_PORT; rank 0 or torchrun's agent hosts it): {e}"
        ) from e
    return store


def _env_int(name: str) -> Optional[int]:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def _tcp_store(store: dist.Store) -> Optional[dist.TCPStore]:
    """The TCPStore behind `store` (through PrefixStores), if any."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store if isinstance(store, dist.TCPStore) else None


def store_host(store: dist.Store) -> Optional[str]:
    """The host of the TCPStore behind `store`, if any."""
    tcp = _tcp_store(store)
    return tcp.host if tcp is not None else None


def _address_of(store: dist.Store) -> str:
    """" at HOST:PORT" for a TCPStore, else ""."""
    tcp = _tcp_store(store)
    return f" at {tcp.host}:{tcp.port}" if tcp is not None else ""


def interface_address(ifname: str) -> str:
    """IPv4 address of a network interface, e.g. 'eth0'."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = struct.pack("256s", ifname.encode()[:15])
        return socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x8915, packed)[20:24])  # SIOCGIFADDR
    except OSError as e:
        raise ValueError(f"HOPLITE_IFNAME={ifname!r}: interface has no IPv4 address ({e})") from None
    finally:
        sock.close()


def advertise_address(host: Optional[str], ifname: Optional[str], store: dist.Store) -> str:
    """The address peers should use to reach this node."""
    if host:
        return host
    if ifname:
        return interface_address(ifname)
    target = store_host(store)
    if not target:
        return "127.0.0.1"
    try:
        target_ip = socket.gethostbyname(target)
        if ipaddress.ip_address(target_ip).is_loopback:
            return "127.0.0.1"
        # The address of the interface that routes to the store's host.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target_ip, 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


class Rendezvous:
    """Keys in the store for one round of init: every rank's init bumps its own
    counter, so ranks that re-init together meet in a fresh namespace. A
    restarted rank that rejoins takes the round its previous process was in."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: float, rejoin: bool = False):
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout
        base = dist.PrefixStore("hoplite", store)
        round_ = base.add(f"round/{rank}", 0 if rejoin else 1)
        if round_ == 0:
            raise ValueError(f"torch_hoplite.init(rejoin=True): rank {rank} never joined a cluster through this store")
        self.store = dist.PrefixStore(f"r{round_}", base)
        self._barriers = 0

    def cluster_id(self) -> str:
        value = self.store.compare_set("cluster_id", "", uuid.uuid4().hex)
        return value.decode() if isinstance(value, bytes) else str(value)

    def secret(self, configured: Optional[str]) -> str:
        """The cluster secret: the configured one, else one that the first rank
        to ask generates and keeps in the store (whoever can read the store is
        in the cluster)."""
        if configured:
            return configured
        value = self.store.compare_set("secret", "", secrets.token_hex(32))
        return value.decode() if isinstance(value, bytes) else str(value)

    def exchange_addresses(self, host: str, port: int, host_identity: str) -> dict[int, tuple[str, int, str]]:
        """Publishes this rank's address and host identity (empty: same-host
        reads off) and returns every rank's."""
        self.store.set(f"addr/{self.rank}", f"{host}:{port}\n{host_identity}")
        peers = {}
        for r in range(self.world_size):
            key = f"addr/{r}"
            self._wait(key, f"rank {r} to publish its address")
            address, identity = self.store.get(key).decode().split("\n", 1)
            peer_host, peer_port = address.rsplit(":", 1)
            peers[r] = (peer_host, int(peer_port), identity)
        return peers

    def barrier(self, timeout: float) -> None:
        """All ranks meet. Rank 0 returns only after every rank is done with the
        store for this barrier, so a store hosted by rank 0 (torchrun's
        convention) may go away right after it without breaking anyone's wait."""
        n = self._barriers
        self._barriers += 1
        key = f"barrier/{n}"
        if self.store.add(key, 1) == self.world_size:
            self.store.set(f"{key}/done", "1")
        self._wait(f"{key}/done", "all ranks to reach the barrier", timeout)
        if self.store.add(f"{key}/left", 1) == self.world_size:
            self.store.set(f"{key}/all_left", "1")
        if self.rank == 0:
            self._wait(f"{key}/all_left", "all ranks to leave the barrier", timeout)

    def _wait(self, key: str, what: str, timeout: Optional[float] = None) -> None:
        seconds = self.timeout if timeout is None else timeout
        start = time.monotonic()
        try:
            self.store.wait([key], datetime.timedelta(seconds=seconds))
        except (RuntimeError, dist.DistError) as e:
            elapsed = time.monotonic() - start
            # A wait that ends well before its timeout lost the store (its host
            # exited, or the connection broke): say that, not "timed out".
            if elapsed < 0.9 * seconds and not isinstance(e, dist.DistStoreError):
                raise StoreLostError(
                    f"rank {self.rank} lost the rendezvous store{_address_of(self.store)} after {elapsed:.1f} s while waiting "
                    f"for {what}: its host (rank 0, or torchrun's agent) has probably exited: {e}"
                ) from e
            raise HopliteTimeoutError(f"rank {self.rank} timed out after {seconds:g} s waiting for {what}") from e
