"""The UCX transport (``transport="ucx"``): its own shared object, loaded when
asked for, and the transport-independent tests run over it (UCX_TLS=tcp, and
UCX's shared memory: UCX_TLS=sm,self)."""

import glob
import json
import os
import re
import socket
import struct
import subprocess
import sys

import pytest
import torch

import torch_hoplite as hop
import torch_hoplite.api as api
from cluster import Cluster
from test_bad_peers import cluster_proof, recv_exactly

import workers

BUILT = bool(glob.glob(os.path.join(os.path.dirname(hop.__file__), "_transport_ucx*.so")))
needs_ucx = pytest.mark.skipif(not BUILT, reason="built without UCX's headers (apt install libucx-dev, then rebuild)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every test of these runs again in a process whose nodes all use UCX.
OVER_UCX = [
    "tests/test_object_store.py",
    "tests/test_broadcast.py",
    "tests/test_reduce.py",
    "tests/test_allreduce.py",
    "tests/test_peer_failure.py",
    "tests/test_directory_failover.py",
    "tests/test_heartbeat.py",
    "tests/test_rejoin.py",
    "tests/test_lifecycle.py",
    "tests/test_c10d_backend.py",
    "tests/test_bad_peers.py::test_nodes_with_different_secrets_cannot_talk",
]
# Over shared memory, what issue #29 names (put/get, broadcast, reduce and
# allreduce, the c10d ops, a peer's failure, a bad handshake) and the stalls.
OVER_UCX_SHARED_MEMORY = [
    "tests/test_object_store.py",
    "tests/test_broadcast.py",
    "tests/test_reduce.py",
    "tests/test_peer_failure.py",
    "tests/test_heartbeat.py",
    "tests/test_c10d_backend.py",
    "tests/test_bad_peers.py::test_nodes_with_different_secrets_cannot_talk",
]


def test_ucx_is_listed_exactly_when_built():
    assert ("ucx" in hop.transports()) == BUILT


@needs_ucx
def test_put_and_get_over_ucx(monkeypatch):
    monkeypatch.setenv("UCX_TLS", "tcp")
    c = Cluster(2, options={"transport": "ucx", "same_host": False}, env={"UCX_TLS": "tcp"})
    try:
        # Eager and rendezvous sizes, several data frames at the largest.
        for n in (1, 1000, 300_000, 5_000_000):
            x = torch.arange(n, dtype=torch.float32) * 3 - 7
            ref = c.call(1, workers.put, x, f"ucx-{n}")
            assert torch.equal(hop.get(ref, timeout=60).wait(), x), n
        assert hop.stats()["bytes_received"] >= 4 * 5_000_000
        # Loaded only because this node asked for it (makeTransport), with UCX.
        maps = open("/proc/self/maps").read()
        assert "_transport_ucx" in maps and "libucp.so" in maps
    finally:
        c.close()
    assert not hop.is_initialized()


@needs_ucx
def test_a_traced_get_over_ucx_records_every_data_frame_on_both_sides(monkeypatch):
    monkeypatch.setenv("UCX_TLS", "tcp")
    c = Cluster(2, options={"transport": "ucx", "same_host": False}, env={"UCX_TLS": "tcp"})
    try:
        x = torch.arange(1_000_000, dtype=torch.float32)  # 4 MB: several rendezvous frames
        ref = c.call(1, workers.put, x, "ucx-traced")
        c.call(1, workers.trace_events)
        c.call(1, hop.enable_tracing)
        hop.trace_events()
        hop.enable_tracing()
        try:
            assert torch.equal(hop.get(ref, timeout=60).wait(), x)
        finally:
            hop.enable_tracing(False)
            c.call(1, hop.enable_tracing, False)
        here = [s for s in hop.trace_events() if s.step.startswith("frame.")]
        there = [s for s in c.call(1, workers.trace_events) if s[1].startswith("frame.")]
    finally:
        c.close()
    received = {}
    for s in here:
        assert s.peer == 1
        received.setdefault(s.id, []).append((s.step, s.time, s.nbytes))
    offsets = sorted(int(frame.split("/")[1]) for frame in received)
    sizes = {frame: steps[0][2] for frame, steps in received.items()}
    assert len(offsets) > 1 and offsets[0] == 0
    assert sum(sizes.values()) == x.numel() * 4
    for frame, steps in received.items():
        # By rendezvous a receive is posted; an eager frame is copied out of UCX's buffer.
        assert [step for step, _, _ in steps] in (["frame.arrived", "frame.receive", "frame.landed"],
                                                  ["frame.arrived", "frame.landed"]), frame
        assert [t for _, t, _ in steps] == sorted(t for _, t, _ in steps)
    sent = {}
    for _, step, frame, peer, nbytes in there:
        assert peer == 0 and nbytes == sizes[frame]
        sent.setdefault(frame, []).append(step)
    assert sent == {frame: ["frame.send", "frame.sent"] for frame in received}


@needs_ucx
@pytest.mark.parametrize("user_sets", [False, True], ids=["default", "user's"])
def test_ucx_tcp_segments_are_ours_unless_the_user_sets_them(user_sets):
    # UCX says which UCT settings it applied in its debug log (Debian's and the wheels' builds log it).
    env = {**os.environ, "UCX_TLS": "tcp", "UCX_LOG_LEVEL": "debug"}
    if user_sets:
        env["UCX_TCP_TX_SEG_SIZE"] = "16k"
    script = ("import sys; sys.path.insert(0, 'tests'); from cluster import Cluster; "
              "Cluster(1, options={'transport': 'ucx', 'same_host': False}).close()")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    log = run.stdout + run.stderr
    assert "apply UCT configuration RX_SEG_SIZE=256k" in log
    assert ("apply UCT configuration TX_SEG_SIZE=32k" in log) != user_sets


@needs_ucx
@pytest.mark.parametrize("tls,tcp_settings,shm_settings", [
    (None, True, False), ("all", True, False), ("tcp", True, False), ("^sm", True, False),
    ("sm,self", False, True), ("tcp,shm,self", True, True), ("^tcp", False, False), ("posix,self", False, True),
])
def test_ucx_settings_follow_what_ucx_tls_asks_for(tls, tcp_settings, shm_settings):
    """tcp's segment sizes where tcp may carry traffic; shared memory's error
    handling only where UCX_TLS names it (left in by "all" or an exclusion,
    UCX would take it over tcp on one host)."""
    env = {k: v for k, v in os.environ.items() if k != "UCX_TLS"} | {"UCX_LOG_LEVEL": "debug"}
    if tls is not None:
        env["UCX_TLS"] = tls
    script = ("import sys; sys.path.insert(0, 'tests'); from cluster import Cluster; "
              "Cluster(1, options={'transport': 'ucx', 'same_host': False}).close()")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    log = run.stdout + run.stderr
    assert ("apply UCT configuration TX_SEG_SIZE=32k" in log) == tcp_settings
    assert ("apply UCT configuration MM_ERROR_HANDLING=y" in log) == shm_settings
    assert "invalid configuration" not in log


@needs_ucx
def test_shared_memory_carries_the_traffic_when_ucx_tls_names_it():
    """UCX's shared-memory transports take part in peer error handling only
    when told to: with UCX_TLS=sm,self the transport tells them, so the
    endpoints use them, and leaves out tcp's settings (UCX would warn that
    nothing took them)."""
    env = {**os.environ, "UCX_TLS": "sm,self", "UCX_LOG_LEVEL": "debug"}
    script = ("import sys, torch; sys.path.insert(0, 'tests'); from cluster import Cluster; import workers\n"
              "import torch_hoplite as hop\n"
              "if __name__ == '__main__':\n"
              "    c = Cluster(2, options={'transport': 'ucx', 'same_host': False})\n"
              "    x = torch.arange(5_000_000, dtype=torch.float32)\n"
              "    ok = torch.equal(hop.get(c.call(1, workers.put, x, 'shm'), timeout=60).wait(), x)\n"
              "    c.close()\n"
              "    print('round trip', ok)\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    log = run.stdout + run.stderr
    assert "round trip True" in log
    assert re.search(r"ep_cfg\[\d+\]: .*am\((sysv|posix)/memory\)", log), log[-3000:]
    assert "SEG_SIZE" not in log and "invalid configuration" not in log


@needs_ucx
def test_tcp_options_are_refused_over_ucx():
    with pytest.raises(ValueError, match="tcp_congestion applies to the tcp transport, not to ucx"):
        Cluster(1, options={"transport": "ucx", "tcp_congestion": "reno"})
    assert not hop.is_initialized()


def _message(kind: int, body: bytes) -> bytes:
    """A UCX bootstrap message (net/ucx/bootstrap.cpp): magic, version 3, kind, length, body."""
    return struct.pack("<IBBI", 0x58435548, 3, kind, len(body)) + body


def _read_message(s: socket.socket) -> tuple[int, bytes]:
    magic, version, kind, length = struct.unpack("<IBBI", recv_exactly(s, 10))
    assert (magic, version) == (0x58435548, 3)
    return kind, recv_exactly(s, length)


def _hello_tail(connection_id: int, address: bytes) -> bytes:
    return struct.pack("<Q", connection_id) + address


@needs_ucx
def test_the_bootstrap_tells_nothing_to_a_stranger_and_refuses_it(monkeypatch):
    """A stranger dialing the UCX bootstrap gets a nonce with the node's proof
    and no worker address; its hello with a proof under another secret is
    refused (it is told, then dropped) and counted. A hello proved with the
    secret gets the node's hello, whose proof checks under the secret."""
    monkeypatch.setenv("UCX_TLS", "tcp")
    c = Cluster(2, options={"transport": "ucx", "same_host": False}, env={"UCX_TLS": "tcp"})
    try:
        rt = api._rt()
        host, port = rt.address
        secret, cluster = rt._rendezvous.secret(None).encode(), rt._rendezvous.cluster_id().encode()
        refused_before = hop.stats()["handshakes_refused"]
        for key, accepted in ((b"another secret", False), (secret, True)):
            with socket.create_connection((host, port), timeout=10) as s:
                nonce = os.urandom(16)
                s.sendall(_message(1, nonce))
                kind, body = _read_message(s)
                assert kind == 1 and len(body) == 48
                # The node's nonce, and its proof that it knows the secret (a member checks it before it says more).
                node_nonce = body[:16]
                assert body[16:] == cluster_proof(secret, b"ucx-responder-nonce", cluster, nonce, node_nonce)
                address = b""  # (a member's would be its worker's; UCX would parse it)
                proof = cluster_proof(key, b"ucx-dialer", cluster, nonce, node_nonce, _hello_tail(7, address))
                s.sendall(_message(2, struct.pack("<Q", 7) + proof + address))
                if not accepted:
                    assert _read_message(s) == (3, b"")  # refused, and told so
                    with pytest.raises(ConnectionError):
                        _read_message(s)
                    continue
                # Nothing to reach: the node's hello says so (no address) and
                # proves that it comes from a member.
                kind, body = _read_message(s)
                assert kind == 2
                (node_id,), node_proof, node_address = struct.unpack("<Q", body[:8]), body[8:40], body[40:]
                assert node_address == b""
                assert node_proof == cluster_proof(secret, b"ucx-responder", cluster, nonce, node_nonce,
                                                      _hello_tail(node_id, node_address))
        assert hop.stats()["handshakes_refused"] == refused_before + 1
        ref = c.call(1, workers.put, torch.arange(10.0), "after-stranger")
        assert torch.equal(hop.get(ref, timeout=30).wait(), torch.arange(10.0))
    finally:
        c.close()


@needs_ucx
@pytest.mark.parametrize("tls,tests", [("tcp", t) for t in OVER_UCX] + [("sm,self", t) for t in OVER_UCX_SHARED_MEMORY])
def test_transport_independent_tests_pass_over_ucx(tls, tests):
    env = {**os.environ, "HOPLITE_TRANSPORT": "ucx", "UCX_TLS": tls}
    run = subprocess.run(
        # (The GPU tests run over UCX on a GPU machine: HOPLITE_TRANSPORT=ucx pytest -m gpu.)
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu", tests],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    # A crash's cause (UCX's fatal message, a failed assertion) comes before the stacks that end stderr.
    causes = [line for line in run.stderr.splitlines()
              if re.search(r"UCX +(ERROR|FATAL)|Assertion|terminate called|Fatal Python error|hoplite E ", line)]
    assert run.returncode == 0, run.stdout[-6000:] + "\n".join(causes[-40:]) + "\n" + run.stderr[-3000:]
    assert " passed" in run.stdout and " skipped" not in run.stdout, run.stdout[-2000:]


@needs_ucx
def test_p2p_trace_summarises_the_ucx_frames_of_both_directions(tmp_path):
    out = tmp_path / "p2p"
    cmd = [sys.executable, "benchmarks/p2p.py", "--sizes", "4MB", "--systems", "hoplite-ucx-zero-copy", "--trials", "1",
           "--warmup", "0", "--trace", "--out", str(out)]
    run = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "UCX_TLS": "tcp"}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (traced,) = json.loads((tmp_path / "p2p-trace.json").read_text())
    assert traced["system"] == "hoplite-ucx-zero-copy" and traced["size_bytes"] == 4 << 20
    frames = traced["frames"]
    assert sorted(f["sender"] for f in frames) == [0, 1]  # the object there, the reply back
    for f in frames:
        assert f["frames"] > 1 and f["frames"] * f["frame_bytes"] == 4 << 20, f
        assert f["gbps"] > 0 and f["send_to_arrived_us"] >= 0, f
