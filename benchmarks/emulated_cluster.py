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
from typing import Optional

SUBNET = "10.77.0"


def _ip(*args: str, ns: Optional[str] = None) -> None:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    subprocess.run(cmd, check=True, capture_output=True, text=True)


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
    def __init__(self, nodes: int, rate: str = "1gbit", name: str = "hpl"):
        if not 1 <= nodes <= 200:
            raise ValueError(f"nodes must be in 1..200, got {nodes}")
        self.nodes = nodes
        self.rate = rate
        self.name = name
        self.switch = f"{name}-sw"

    def ns(self, i: int) -> str:
        return f"{self.name}-n{i}"

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

    def _teardown(self) -> None:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        for ns in names:
            if ns == self.switch or ns.startswith(f"{self.name}-n"):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def popen(self, i: int, cmd: list[str], env: Optional[dict] = None, **kwargs) -> subprocess.Popen:
        """Starts `cmd` inside node i's namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns(i), *cmd], env=env, **kwargs)
