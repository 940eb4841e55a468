"""A free TCP port for a rendezvous server (``MASTER_PORT``) on this host."""

from __future__ import annotations

import random
import socket

_FIRST_USER_PORT = 10000


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))  # every interface, as a store server listens
        except OSError:
            return False
        return True


def free_port() -> int:
    """A port nothing on this host listens on now, outside the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` is also one it hands out to
    outgoing connections: a client that connects to it before the server
    listens can be given it as its own port, connect to itself and hold it, and
    the server then fails with "address already in use". Ports below (or above)
    the ephemeral range are never given to outgoing connections.
    """
    low, high = _ephemeral_range()
    candidates = list(range(_FIRST_USER_PORT, low)) + list(range(high + 1, 65536))
    # Random (not the module's state, which forked processes share), so that
    # two callers at once are unlikely to pick the same port.
    for port in random.SystemRandom().sample(candidates, min(len(candidates), 200)):
        if _bindable(port):
            return port
    # The ephemeral range covers every port (or all were taken): any free one.
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
