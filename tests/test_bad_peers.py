"""Garbage at a node's port, a peer from another cluster, or one without the
cluster secret is refused without disturbing anyone else."""

import hashlib
import hmac
import os
import socket
import struct
import time

import torch

import torch_hoplite as hop
import torch_hoplite.api as api
import workers
from cluster import Cluster

MAGIC = 0x544C5048


VERSION = hop._C.wire_version  # csrc/wire/frame.h kVersion


def frame(msg_type: int, payload: bytes, version: int = VERSION) -> bytes:
    return struct.pack("<IBBHQ", MAGIC, version, msg_type, 0, len(payload)) + payload


def string(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def hello(rank: int, cluster: bytes, nonce: bytes = b"n" * 16, host: bytes = b"127.0.0.1", port: int = 1) -> bytes:
    body = struct.pack("<Ii", VERSION, rank) + string(cluster) + string(nonce) + string(host)
    body += struct.pack("<IQ", port, 0)  # incarnation 0: a process we have not heard from
    return frame(1, body)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """`n` bytes from `sock`; ConnectionError if the peer closes first."""
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    magic, _version, msg_type, _reserved, length = struct.unpack("<IBBHQ", recv_exactly(sock, 16))
    assert magic == MAGIC
    return msg_type, recv_exactly(sock, length)


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
            struct.pack("<IBBHQ", MAGIC, VERSION, 1, 0, 1 << 40),  # a hello claiming a terabyte
            struct.pack("<IBBHQ", MAGIC, VERSION, 1, 0, 1 << 20),  # a 1 MiB hello (handshake frames are small)
            frame(11, b"\x00" * 16),  # a data frame before the handshake
            frame(6, b"\x00" * 20),  # a request before the handshake
            frame(1, b"\x01\x00"),  # a truncated hello
            hello(1, b"some-other-cluster"),  # the wrong cluster
            frame(1, b"", version=VERSION + 1),  # an unknown protocol version
            frame(1, b"", version=1),  # the protocol before authentication
            frame(18, string(b"p" * 32)),  # a proof before any hello
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


def cluster_proof(secret: bytes, role: bytes, cluster: bytes, first_nonce: bytes, second_nonce: bytes,
                  tail: bytes = b"") -> bytes:
    """As clusterProof (common/hmac.h), which the handshakes' proofs use."""
    message = role + b"\0" + cluster + b"\0" + first_nonce + second_nonce + tail
    return hmac.new(secret, message, hashlib.sha256).digest()


def _proof(secret: bytes, role: bytes, cluster: bytes, client_nonce: bytes, server_nonce: bytes, client: int,
           server: int, listen: bytes) -> bytes:
    """As Peers::handshakeProof; `listen` is the hello's claim, b"host:port/incarnation"."""
    return cluster_proof(secret, role, cluster, client_nonce, server_nonce, f"{client}:{server}".encode() + b"\0" + listen)


def handshake_as_rank_1(s: socket.socket, secret: bytes, prove_port_offset: int = 0) -> bool:
    """Runs the client side of the handshake with this process's node (rank 0)
    on `s`, as rank 1 at rank 1's listening address (a new address would mean
    rank 1 restarted there). Returns whether the server proved it knows
    `secret`, for the hello as sent; the server's answer to the proof is left
    to read. `prove_port_offset` != 0: the client's proof is for a hello that
    named another port (as if the hello had been altered on the way)."""
    rt = api._rt()
    cluster = rt._rendezvous.cluster_id().encode()
    rank1_host, rank1_port = rt._rendezvous.store.get("addr/1").decode().split("\n")[0].rsplit(":", 1)
    nonce = os.urandom(16)
    s.sendall(hello(1, cluster, nonce, rank1_host.encode(), int(rank1_port)))
    msg_type, payload = read_frame(s)
    assert msg_type == 17  # challenge: server nonce, server proof
    server_nonce, server_proof = payload[4:20], payload[24:56]
    sent = f"{rank1_host}:{rank1_port}/0".encode()
    proved = f"{rank1_host}:{int(rank1_port) + prove_port_offset}/0".encode()
    s.sendall(frame(18, string(_proof(secret, b"client", cluster, nonce, server_nonce, 1, 0, proved))))
    return server_proof == _proof(secret, b"server", cluster, nonce, server_nonce, 1, 0, sent)


def test_handshake_needs_the_secret():
    """A stranger that knows the cluster id but not the secret gets a challenge
    and is dropped after a wrong proof; with the secret (read from the store, as
    a member would) the same handshake is accepted."""
    c = Cluster(2)
    try:
        rt = api._rt()
        host, port = rt.address
        refused_before = hop.stats()["handshakes_refused"]
        for secret, accepted in ((b"wrong secret", False), (rt._rendezvous.secret(None).encode(), True)):
            with socket.create_connection((host, port), timeout=5) as s:
                # The server proved it knows the real secret; a stranger cannot check that.
                assert handshake_as_rank_1(s, secret) == accepted
                if accepted:
                    msg_type, payload = read_frame(s)
                    assert msg_type == 2 and struct.unpack("<i", payload[:4])[0] == 0  # hello ack from rank 0
                else:
                    assert closed_by_peer(s)
        assert hop.stats()["handshakes_refused"] == refused_before + 1
        # A member's hello whose listen address was changed after it was
        # proved (the proof names another port) is refused too: otherwise
        # whoever altered it would redirect rank 1's traffic.
        with socket.create_connection((host, port), timeout=5) as s:
            assert handshake_as_rank_1(s, rt._rendezvous.secret(None).encode(), prove_port_offset=1)
            assert closed_by_peer(s)
        assert hop.stats()["handshakes_refused"] == refused_before + 2
        ref = c.call(1, workers.put, torch.arange(10.0), "after-impostor")
        assert torch.equal(hop.get(ref, timeout=30).wait(), torch.arange(10.0))
    finally:
        c.close()


def test_nodes_with_different_secrets_cannot_talk():
    """Ranks 1 and 2 share HOPLITE_SECRET; rank 0 has another: they refuse each
    other in both directions and say why, while 1 and 2 work together."""
    from cluster import ids_with_shard

    c = Cluster(3, env={"HOPLITE_SECRET": "the workers' secret"}, options={"timeout": 20})
    try:
        (obj,) = ids_with_shard("secret", 1, 3, lambda s: s == 2)
        ref = c.call(1, workers.put, torch.arange(1000.0), obj)
        assert torch.equal(c.call(2, workers.get, ref, 30), torch.arange(1000.0))
        try:
            hop.get(ref, timeout=10).wait()
        except hop.PeerFailedError as e:
            assert "authentication" in str(e) or "closed" in str(e), str(e)
        else:
            raise AssertionError("rank 0 got an object through peers with another secret")
        assert hop.stats()["handshakes_refused"] >= 1
    finally:
        c.close()


def test_handshake_hmac_matches_pythons():
    import random

    from torch_hoplite import _C

    rng = random.Random(7)
    for key_len in (0, 1, 31, 32, 63, 64, 65, 200):
        for msg_len in (0, 1, 55, 56, 63, 64, 65, 119, 120, 1000):
            key, msg = rng.randbytes(key_len), rng.randbytes(msg_len)
            assert _C.hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest(), (key_len, msg_len)
