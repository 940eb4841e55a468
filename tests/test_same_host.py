"""The same-host path: processes of one host pull objects by reading the
holder's memory (process_vm_readv) instead of through loopback TCP, with the
same results, relays and failure behaviour; HOPLITE_SAME_HOST=0 turns it off."""

import json
import os
import platform
import subprocess
import sys
import time

import pytest
import torch

import torch_hoplite as hop
import workers
from cluster import Cluster, communicate_all


def _delta(before: dict, after: dict, key: str) -> int:
    return after[key] - before[key]


# 64 KiB chunks: every read is small enough for the loop, which then reads
# 1 MiB per turn and goes on in the next.
@pytest.mark.parametrize("chunk", [0, 64 << 10], ids=["default-chunks", "64KiB-chunks"])
def test_a_get_reads_the_holders_memory_and_the_holder_sends_nothing(chunk):
    c = Cluster(2, options={"chunk_bytes": chunk})
    try:
        n = (8 << 20) // 4
        ref = c.call(1, workers.put, workers.pattern(n, 3), "same-host-8MiB")
        before = {r: c.call(r, workers.stats) for r in (0, 1)}
        assert torch.equal(hop.get(ref, timeout=30).wait(), workers.pattern(n, 3))
        after = {r: c.call(r, workers.stats) for r in (0, 1)}
        assert _delta(before[0], after[0], "bytes_received_same_host") == n * 4
        assert _delta(before[0], after[0], "bytes_received") == n * 4
        assert _delta(before[1], after[1], "bytes_sent_same_host") == n * 4
        # Once read, the holder's memory is no longer lent to the reader.
        deadline = time.monotonic() + 10
        while c.call(1, workers.stats)["pulls_lent"] != 0:
            assert time.monotonic() < deadline, "the holder still lends memory to a finished pull"
            time.sleep(0.01)
    finally:
        c.close()


def test_a_get_takes_the_copy_it_read_and_the_directory_forgets_it():
    """A copy=True get that read a holder on its own host returns the copy it
    pulled instead of copying it once more: the copy leaves this node's store
    and the directory, and a later get reads the holder again."""
    c = Cluster(2)
    try:
        n = (4 << 20) // 4
        ref = c.call(1, workers.put, workers.pattern(n, 11), "taken-4MiB")
        with hop.subscribe(ref) as sub:
            sub.wait_for(lambda loc: loc.complete == (1,), timeout=10)
            before = hop.stats()
            first = hop.get(ref, timeout=30).wait()
            after = hop.stats()
            assert torch.equal(first, workers.pattern(n, 11))
            assert _delta(before, after, "copies_handed_over") == 1
            assert _delta(before, after, "bytes_received_same_host") == n * 4
            assert after["store_used_bytes"] == before["store_used_bytes"]
            # Rank 0 was listed while its copy arrived, and is not any more.
            sub.wait_for(lambda loc: loc.partial == () and loc.complete == (1,), timeout=10)
            first.fill_(-1)  # the caller's own memory now
            second = hop.get(ref, timeout=30).wait()
            assert torch.equal(second, workers.pattern(n, 11))
            assert _delta(after, hop.stats(), "copies_handed_over") == 1
    finally:
        c.close()


def test_a_pull_reaching_a_node_after_its_get_took_the_copy_is_sent_elsewhere_at_once():
    """The directory sent a reader here just before this node's get took its
    copy: the pull is answered at once with "moved" (status 12; the reader asks
    the directory again, which is no failure) instead of waiting for a copy."""
    import socket
    import struct

    import torch_hoplite.api as api
    from test_bad_peers import frame, handshake_as_rank_1, read_frame, string

    c = Cluster(2)
    try:
        ref = c.call(1, workers.put, workers.pattern((1 << 20) // 4, 13), "moved-1MiB")
        hop.get(ref, timeout=30).wait()
        assert hop.stats()["copies_handed_over"] == 1
        rt = api._rt()
        with socket.create_connection(rt.address, timeout=5) as s:
            assert handshake_as_rank_1(s, rt._rendezvous.secret(None).encode())
            assert read_frame(s)[0] == 2  # hello ack
            s.sendall(frame(10, struct.pack("<Q", 77) + string(b"moved-1MiB") + struct.pack("<QB", 0, 0)))  # pull
            s.settimeout(2)  # a parked pull would wait 5 s
            msg_type, payload = read_frame(s)
            assert msg_type == 4 and struct.unpack("<QB", payload[:9]) == (77, 12), (msg_type, payload)
            assert b"moved-1MiB" in payload
    finally:
        c.close()


def test_a_copy_another_get_uses_is_copied_not_taken():
    """A zero-copy get and a copy=True get of one object, waiting on the same
    node: the store keeps the copy the zero-copy result shows, and the other
    get gets memory of its own."""
    c = Cluster(2)
    try:
        n = (4 << 20) // 4
        shared = hop.get("shared-4MiB", timeout=30, copy=False)
        own = hop.get("shared-4MiB", timeout=30)
        before = hop.stats()
        c.call(1, workers.put, workers.pattern(n, 12), "shared-4MiB")
        shared, own = shared.wait(), own.wait()
        assert _delta(before, hop.stats(), "copies_handed_over") == 0
        assert shared.data_ptr() != own.data_ptr()
        own.fill_(-1)
        assert torch.equal(shared, workers.pattern(n, 12))
    finally:
        c.close()


def test_turned_off_on_one_side_both_directions_use_tcp():
    """Rank 1 runs with HOPLITE_SAME_HOST=0: it offers no reads of its memory
    and reads no one's, so both directions go over TCP, with the same bytes."""
    c = Cluster(2, env={"HOPLITE_SAME_HOST": "0"})
    try:
        n = (4 << 20) // 4
        ref1 = c.call(1, workers.put, workers.pattern(n, 4), "tcp-from-1")
        ref0 = hop.put(workers.pattern(n, 5), "tcp-from-0")
        assert torch.equal(hop.get(ref1, timeout=30).wait(), workers.pattern(n, 4))
        assert c.call(1, workers.get_matches_pattern, ref0, n, 5, 30)
        for r in (0, 1):
            s = c.call(r, workers.stats)
            assert s["bytes_received"] == n * 4 and s["bytes_received_same_host"] == 0, (r, s)
    finally:
        c.close()


def test_simultaneous_receivers_relay_through_each_others_memory():
    c = Cluster(4)
    try:
        n = (32 << 20) // 4
        before = {r: c.call(r, workers.stats) for r in range(4)}
        pendings = {r: c.submit(r, workers.get_matches_pattern, "same-host-chain", n, 7, 60) for r in (1, 2, 3)}
        hop.put(workers.pattern(n, 7), "same-host-chain")
        assert [p.result() for p in pendings.values()] == [True, True, True]
        after = {r: c.call(r, workers.stats) for r in range(4)}
        read = sum(_delta(before[r], after[r], "bytes_received_same_host") for r in (1, 2, 3))
        assert read == 3 * n * 4  # every byte of every copy came out of a peer's memory
        assert sum(_delta(before[r], after[r], "relays_served") for r in range(4)) >= 1
    finally:
        c.close()


def test_delete_during_same_host_reads_gives_exact_bytes_or_a_clear_error():
    """A delete while two ranks read the object: each get returns the exact
    bytes or raises ObjectDeletedError (never other bytes), and afterwards no
    node lends memory any more."""
    c = Cluster(4)
    try:
        n = (128 << 20) // 4
        # From before the first read to after the last (the reads of 128 MiB took
        # ~0.1-0.35 s after the get was sent, measured here): both outcomes must
        # occur, or the deletes never met a read and the test proved nothing.
        seen = []
        for attempt, delay in enumerate((0.0, 0.1, 0.2, 0.3, 0.45, 1.0)):
            obj = f"same-host-deleted-{attempt}"
            c.call(1, workers.put, workers.pattern(n, attempt), obj)
            pendings = {r: c.submit(r, workers.get_outcome, obj, n, attempt, 60) for r in (2, 3)}
            time.sleep(delay)
            hop.delete(obj)
            outcomes = [p.result() for p in pendings.values()]
            for outcome in outcomes:
                assert outcome in ("exact", "ObjectDeletedError"), outcome
            seen += outcomes
        assert {"exact", "ObjectDeletedError"} <= set(seen), seen
        deadline = time.monotonic() + 10
        while any(c.call(r, workers.stats)["pulls_lent"] for r in range(4)):
            assert time.monotonic() < deadline, "memory still lent after every pull ended"
            time.sleep(0.01)
    finally:
        c.close()


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_bad_HOPLITE_SAME_HOST_is_refused_naming_it(monkeypatch, value):
    from torch_hoplite.config import Config

    monkeypatch.setenv("HOPLITE_SAME_HOST", value)
    with pytest.raises(ValueError, match="HOPLITE_SAME_HOST"):
        Config.resolve({})


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the helper calls capget/capset by their x86-64 numbers")
def test_a_peer_whose_memory_cannot_be_read_is_served_over_tcp(tmp_path):
    """The kernel refuses the reads (here: a non-dumpable holder and a reader
    without CAP_SYS_PTRACE, as Yama's ptrace_scope does between siblings on many
    hosts): the reader finds out at the handshake and pulls over TCP instead."""
    from torch_hoplite.ports import free_port

    port = free_port()
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "same_host_refused.py")
    procs = [subprocess.Popen([sys.executable, script, str(r), str(port), str(tmp_path / f"{r}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    communicate_all(procs, timeout=120)
    result = json.loads((tmp_path / "1.json").read_text())
    assert result == {"exact": True, "received": 4 << 20, "same_host": 0}, result
