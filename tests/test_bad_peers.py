"""Garbage at a node's port, or a peer from another cluster, is refused without
disturbing anyone else."""

import socket
import struct
import time

import torch

import torch_hoplite as hop
import torch_hoplite.api as api
import workers
from cluster import Cluster

MAGIC = 0x544C5048


def frame(msg_type: int, payload: bytes, version: int = 1) -> bytes:
    return struct.pack("<IBBHQ", MAGIC, version, msg_type, 0, len(payload)) + payload


def hello(rank: int, cluster: bytes) -> bytes:
    return frame(1, struct.pack("<Ii", 1, rank) + struct.pack("<I", len(cluster)) + cluster)


def closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_garbage_and_strangers_are_dropped_and_others_unaffected():
    c = Cluster(2)
    try:
        host, port = api._rt().address
        attempts = [
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # not our protocol at all
            struct.pack("<IBBHQ", MAGIC, 1, 1, 0, 1 << 40),  # a hello claiming a terabyte
            struct.pack("<IBBHQ", MAGIC, 1, 1, 0, 1 << 20),  # a 1 MiB hello (handshake frames are small)
            frame(11, b"\x00" * 16),  # a data frame before the handshake
            frame(6, b"\x00" * 20),  # a request before the handshake
            frame(1, b"\x01\x00"),  # a truncated hello
            hello(1, b"some-other-cluster"),  # the wrong cluster
            frame(1, b"", version=9),  # an unknown protocol version
        ]
        for payload in attempts:
            with socket.create_connection((host, port), timeout=5) as s:
                s.sendall(payload)
                assert closed_by_peer(s), payload[:20]
        # Everyone still works.
        ref = hop.put(torch.arange(100_000.0), "after-garbage")
        assert torch.equal(c.call(1, workers.get, ref, 30), torch.arange(100_000.0))
        ref2 = c.call(1, workers.put, torch.ones(7), "after-garbage-2")
        assert torch.equal(hop.get(ref2, timeout=30).wait(), torch.ones(7))
    finally:
        c.close()


def test_silent_connection_does_not_block_the_node_and_is_dropped():
    c = Cluster(2, options={"connect_timeout": 1.0})
    try:
        host, port = api._rt().address
        idle = socket.create_connection((host, port), timeout=5)  # connects, never speaks
        half = socket.create_connection((host, port), timeout=5)
        half.sendall(struct.pack("<IBB", MAGIC, 1, 6))  # half a header, then nothing
        time.sleep(0.2)
        ref = c.call(1, workers.put, torch.full((100_000,), 2.0), "while-idle")
        assert torch.equal(hop.get(ref, timeout=30).wait(), torch.full((100_000,), 2.0))
        # Neither completed the handshake: both are closed after the connect timeout.
        assert closed_by_peer(idle, timeout=5.0)
        assert closed_by_peer(half, timeout=5.0)
        idle.close()
        half.close()
    finally:
        c.close()
