"""An emulated cluster on one machine: one network namespace per node on a
bridge, each node's egress and ingress limited with `tc tbf`, so that link
bandwidth, not the CPU, is the bottleneck and the ideal time is known.

    with EmulatedCluster(4, rate="1gbit") as cluster:
        proc = cluster.popen(0, ["python", "worker.py"])   # runs inside node 0's namespace

Needs root and iproute2. Everything is torn down on exit, also after an
exception or Ctrl-C (and a stale cluster of the same name is removed first).
Facts behind the settings: shared/EMULATOR-NOTES.md (burst >= 128kb, or tbf
splits the kernel's 64 KB segments; tbf counts Ethernet bytes, ~95.5% of the
rate is full speed).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from typing import Optional

SUBNET = "10.77.0"

# One TCP flow, timed by the receiver from its first byte to the end.
_RECEIVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5999)); s.listen(1); s.settimeout(30)
c, _ = s.accept(); c.settimeout(30)
got, start = 0, None
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    start = start or time.monotonic()
    got += len(b)
print(got * 8 / (time.monotonic() - start))
"""
_SENDER = """
import socket, sys, time
deadline = time.monotonic() + 10
while True:
    try:
        c = socket.create_connection((sys.argv[1], 5999), timeout=5); break
    except OSError:
        if time.monotonic() > deadline: raise
        time.sleep(0.05)
block = b"x" * (1 << 20)
for _ in range(int(sys.argv[2])):
    c.sendall(block)
c.close()
"""


_AVAILABLE = "/proc/sys/net/ipv4/tcp_available_congestion_control"
_ALLOWED = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"


def _ip(*args: str, ns: Optional[str] = None) -> str:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def available() -> bool:
    """Whether this process may create network namespaces (root, iproute2, and a
    kernel/container that allows it: probed by making one)."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    probe = f"hpl-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return made


class EmulatedCluster:
    """`congestion`: the TCP congestion control every node's kernel defaults to
    (None: what a new namespace gets, the host's default). A namespace may only
    default to one in the host's allowed list; one missing there is added for
    the cluster's lifetime."""

    def __init__(self, nodes: int, rate: str = "1gbit", name: str = "hpl", congestion: Optional[str] = None):
        if not 1 <= nodes <= 200:
            raise ValueError(f"nodes must be in 1..200, got {nodes}")
        self.nodes = nodes
        self.rate = rate
        self.name = name
        self.switch = f"{name}-sw"
        self.congestion = congestion
        self._allowed_before: Optional[str] = None

    def ns(self, i: int) -> str:
        return f"{self.name}-n{i}"

    def command_prefix(self) -> str:
        """What runs a command on node {rank} (a template for str.format)."""
        return f"ip netns exec {self.name}-n{{rank}}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def __enter__(self) -> "EmulatedCluster":
        self._teardown()
        self._old_sigterm = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            self._setup()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._teardown()
        signal.signal(signal.SIGTERM, self._old_sigterm)

    def _setup(self) -> None:
        if self.congestion:
            self._allow_congestion()
        _ip("ip", "netns", "add", self.switch)
        _ip("ip", "link", "add", "br0", "type", "bridge", ns=self.switch)
        _ip("ip", "link", "set", "br0", "up", ns=self.switch)
        tbf = ["tbf", "rate", self.rate, "burst", "128kb", "latency", "20ms"]
        for i in range(self.nodes):
            ns, port = self.ns(i), f"{self.name}-p{i}"
            _ip("ip", "netns", "add", ns)
            _ip("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", self.switch)
            _ip("ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0", ns=ns)
            _ip("ip", "link", "set", "eth0", "up", ns=ns)
            _ip("ip", "link", "set", "lo", "up", ns=ns)
            _ip("ip", "link", "set", port, "master", "br0", ns=self.switch)
            _ip("ip", "link", "set", port, "up", ns=self.switch)
            _ip("tc", "qdisc", "replace", "dev", "eth0", "root", *tbf, ns=ns)  # egress
            _ip("tc", "qdisc", "replace", "dev", port, "root", *tbf, ns=self.switch)  # ingress of the node
            if self.congestion:
                _ip("sysctl", "-qw", f"net.ipv4.tcp_congestion_control={self.congestion}", ns=ns)

    def node_congestion(self, i: int = 0) -> str:
        """The congestion control node i's kernel gives new connections."""
        return _ip("cat", "/proc/sys/net/ipv4/tcp_congestion_control", ns=self.ns(i)).strip()

    def _allow_congestion(self) -> None:
        """Lets namespaces default to self.congestion (the host's allowed list)."""
        available = open(_AVAILABLE).read().split()
        if self.congestion not in available:
            raise ValueError(f"congestion control {self.congestion!r}: this kernel has {' '.join(available)}")
        allowed = open(_ALLOWED).read().split()
        if self.congestion not in allowed:
            self._allowed_before = " ".join(allowed)
            with open(_ALLOWED, "w") as f:
                f.write(" ".join(allowed + [self.congestion]))

    def _teardown(self) -> None:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        for ns in names:
            if ns == self.switch or ns.startswith(f"{self.name}-n"):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        if self._allowed_before is not None:
            with open(_ALLOWED, "w") as f:
                f.write(self._allowed_before)
            self._allowed_before = None

    def measure_rate(self, megabytes: int = 24) -> float:
        """Bits per second that one TCP flow from node 1 to node 0 gets through
        both nodes' shapers (tbf counts Ethernet bytes: ~95.5% of the rate is full speed)."""
        if self.nodes < 2:
            raise ValueError("measuring a link needs two nodes")
        receiver = self.popen(0, [sys.executable, "-c", _RECEIVER, self.address(0)], stdout=subprocess.PIPE, text=True)
        sender = self.popen(1, [sys.executable, "-c", _SENDER, self.address(0), str(megabytes)])
        try:
            if sender.wait(timeout=60) != 0:
                raise RuntimeError("the link check's sender failed")
            out, _ = receiver.communicate(timeout=60)
        finally:
            for p in (sender, receiver):
                if p.poll() is None:
                    p.kill()
        return float(out.strip())

    def popen(self, i: int, cmd: list[str], env: Optional[dict] = None, **kwargs) -> subprocess.Popen:
        """Starts `cmd` inside node i's namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns(i), *cmd], env=env, **kwargs)
