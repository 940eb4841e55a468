"""An emulated cluster on one machine: one network namespace per node on a
bridge, each node's egress and ingress limited with `tc tbf`, so that link
bandwidth, not the CPU, is the bottleneck and the ideal time is known.

    with EmulatedCluster(4, rate="1gbit") as cluster:
        proc = cluster.popen(0, ["python", "worker.py"])   # runs inside node 0's namespace

A node's link can be cut (all its frames dropped both ways) or made lossy
(nftables at the switch), or delayed with jitter, which reorders (this kernel
has no netem: link_delay.c holds the node's packets in user space, queued to
it by iptables at the switch), and healed. With `management=True` every node
also has an unshaped link to this (the host's) namespace at `management_address(i)`, never impaired: a
harness's own bookkeeping (its rendezvous store) stays reachable while the
data link is cut.

Needs root and iproute2. Everything is torn down on exit, also after an
exception or Ctrl-C (and a stale cluster of the same name is removed first).
Facts behind the settings: shared/EMULATOR-NOTES.md (burst >= 128kb, or tbf
splits the kernel's 64 KB segments; tbf counts Ethernet bytes, ~95.5% of the
rate is full speed).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
from typing import Optional

from torch_hoplite.bench.common import compile_helper

SUBNET = "10.77.0"
MANAGEMENT_SUBNET = "10.78.0"
MANAGEMENT_HOST = f"{MANAGEMENT_SUBNET}.254"  # this namespace's address on the management bridge
_CLONE_NEWNET = 0x40000000

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


def available_congestion_controls() -> list[str]:
    """The TCP congestion controls this kernel has."""
    with open(_AVAILABLE) as f:
        return f.read().split()


def _ip(*args: str, ns: Optional[str] = None, check: bool = True) -> str:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    return subprocess.run(cmd, check=check, capture_output=True, text=True).stdout


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


def links_can_fail() -> bool:
    """Whether an emulated cluster can be made here and its links cut or made
    lossy (available(), and nft)."""
    return available() and shutil.which("nft") is not None


def _delay_tools_present() -> bool:
    """iptables, a C compiler and libnetfilter_queue, for link_delay.c."""
    return (shutil.which("iptables") is not None and shutil.which("cc") is not None
            and os.path.exists("/usr/include/libnetfilter_queue/libnetfilter_queue.h"))


def links_can_be_delayed() -> bool:
    """Whether its links can be delayed too (links_can_fail(), and the tools
    link_delay.c needs)."""
    return links_can_fail() and _delay_tools_present()


def enter_namespace(ns: str) -> None:
    """Moves the calling thread into the network namespace `ns`: the sockets it
    opens from then on, and the threads it starts, are that namespace's."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


class EmulatedCluster:
    """`congestion`: the TCP congestion control every node's kernel defaults to
    (None: what a new namespace gets, the host's default). A namespace may only
    default to one in the host's allowed list; one missing there is added for
    the cluster's lifetime.

    `management`: see the module's docstring."""

    def __init__(self, nodes: int, rate: str = "1gbit", name: str = "hpl",
                 congestion: Optional[str] = None, management: bool = False):
        if not 1 <= nodes <= 200:
            raise ValueError(f"nodes must be in 1..200, got {nodes}")
        self.nodes = nodes
        self.rate = rate
        self.name = name
        self.switch = f"{name}-sw"
        self.management_bridge = f"{name}-mbr"
        self.congestion = congestion
        self.management = management
        self._allowed_before: Optional[str] = None
        self._faults: dict[int, str] = {}  # node: what the switch does to its frames
        self._delays: dict[int, subprocess.Popen] = {}  # node: its link_delay process

    def ns(self, i: int) -> str:
        return f"{self.name}-n{i}"

    def command_prefix(self) -> str:
        """What runs a command on node {rank} (a template for str.format)."""
        return f"ip netns exec {self.name}-n{{rank}}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def management_address(self, i: int) -> str:
        return f"{MANAGEMENT_SUBNET}.{i + 1}"

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
        if self.management:
            _ip("ip", "link", "add", self.management_bridge, "type", "bridge")
            _ip("ip", "addr", "add", f"{MANAGEMENT_HOST}/24", "dev", self.management_bridge)
            _ip("ip", "link", "set", self.management_bridge, "up")
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
            if self.management:
                leg = f"{self.name}-m{i}"
                _ip("ip", "link", "add", "mgmt0", "netns", ns, "type", "veth", "peer", "name", leg)
                _ip("ip", "addr", "add", f"{self.management_address(i)}/24", "dev", "mgmt0", ns=ns)
                _ip("ip", "link", "set", "mgmt0", "up", ns=ns)
                _ip("ip", "link", "set", leg, "master", self.management_bridge)
                _ip("ip", "link", "set", leg, "up")
            if self.congestion:
                _ip("sysctl", "-qw", f"net.ipv4.tcp_congestion_control={self.congestion}", ns=ns)

    def cut(self, i: int) -> None:
        """Node i can reach no other node, nor be reached: the switch drops its
        frames both ways (its own link stays up, as when a cable beyond the NIC is cut)."""
        self._faults[i] = "drop"
        self._apply_faults()

    def lose(self, i: int, fraction: float) -> None:
        """The switch drops this fraction of node i's frames, both ways, at random."""
        if not 0 < fraction < 1:
            raise ValueError(f"a loss fraction is in (0, 1), got {fraction}")
        self._faults[i] = f"numgen random mod 10000 < {round(fraction * 10000)} drop"
        self._apply_faults()

    def delay(self, i: int, ms: float, jitter_ms: float = 0.0, seed: int = 0) -> None:
        """Node i's packets, to it and from it, reach the other side `ms` +-
        `jitter_ms` (uniform) later than they would; a jitter wider than the
        gap between two packets reorders them. (A packet between two delayed
        nodes is delayed once.) Throughput through the delayer is lower than
        the link's at 1 Gbit/s: a delayed link is also a slower one."""
        if not 0 <= jitter_ms <= ms <= 60_000:
            raise ValueError(f"a delay needs 0 <= jitter_ms <= ms <= 60000, got ms={ms}, jitter_ms={jitter_ms}")
        if i in self._delays:
            raise ValueError(f"node {i}'s link is delayed already: heal it first")
        if not _delay_tools_present():
            raise RuntimeError("delaying an emulated link needs iptables, cc and libnetfilter_queue "
                               "(apt-get install iptables libnetfilter-queue-dev; `make bench` installs them)")
        tool = compile_helper("link_delay.c", "link_delay", libraries=("netfilter_queue",))
        # Bridged frames pass iptables only with this (per namespace: the switch's alone).
        _ip("sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", ns=self.switch)
        delayer = subprocess.Popen(["ip", "netns", "exec", self.switch, tool, str(i), str(ms), str(jitter_ms), str(seed)],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        said = delayer.stdout.readline().strip()  # "ready", or why not (it exits)
        if said != "ready":
            delayer.kill()
            rest, _ = delayer.communicate(timeout=5)
            raise RuntimeError(f"link_delay for node {i} did not start: {(said + ' ' + rest).strip()}")
        delayer.stdout.close()  # it writes nothing more
        self._delays[i] = delayer
        try:
            for rule in self._delay_rules(i):
                _ip("iptables", "-A", *rule, ns=self.switch)
        except BaseException:
            self._stop_delay(i)
            raise

    def _delay_rules(self, i: int) -> list[list[str]]:
        # --queue-bypass: while no delayer listens, packets pass as if undelayed.
        return [["FORWARD", way, self.address(i), "-j", "NFQUEUE", "--queue-num", str(i), "--queue-bypass"]
                for way in ("-s", "-d")]

    def _stop_delay(self, i: int) -> None:
        """Node i's delay rules removed (those there are), then its delayer
        stopped, which lets through what it still holds."""
        delayer = self._delays[i]
        try:
            for rule in self._delay_rules(i):
                _ip("iptables", "-D", *rule, ns=self.switch, check=False)
        finally:
            delayer.terminate()
            try:
                delayer.wait(timeout=5)
            except subprocess.TimeoutExpired:
                delayer.kill()
                delayer.wait()
            del self._delays[i]

    def heal(self, i: int) -> None:
        """Node i's link as it was set up."""
        if self._faults.pop(i, None) is not None:
            self._apply_faults()
        if i in self._delays:
            self._stop_delay(i)

    def _apply_faults(self) -> None:
        """The switch's fault rules, replaced as a whole in one transaction."""
        if shutil.which("nft") is None:
            raise RuntimeError("cutting or impairing an emulated link needs nft (apt-get install nftables)")
        rules = "".join(f"    {way}ifname \"{self.name}-p{i}\" {action}\n"
                        for i, action in sorted(self._faults.items()) for way in ("i", "o"))
        ruleset = ("table bridge faults\ndelete table bridge faults\n"
                   "table bridge faults {\n  chain forward {\n    type filter hook forward priority 0; policy accept;\n"
                   f"{rules}  }}\n}}\n")
        subprocess.run(["ip", "netns", "exec", self.switch, "nft", "-f", "-"], input=ruleset, text=True,
                       check=True, capture_output=True)

    def node_congestion(self, i: int = 0) -> str:
        """The congestion control node i's kernel gives new connections."""
        return _ip("cat", "/proc/sys/net/ipv4/tcp_congestion_control", ns=self.ns(i)).strip()

    def _allow_congestion(self) -> None:
        """Lets namespaces default to self.congestion (the host's allowed list)."""
        available = available_congestion_controls()
        if self.congestion not in available:
            raise ValueError(f"congestion control {self.congestion!r}: this kernel has {' '.join(available)}")
        allowed = open(_ALLOWED).read().split()
        if self.congestion not in allowed:
            self._allowed_before = " ".join(allowed)
            with open(_ALLOWED, "w") as f:
                f.write(" ".join(allowed + [self.congestion]))

    def _teardown(self) -> None:
        self._faults.clear()  # (the switch goes, and its rules with it)
        for delayer in self._delays.values():
            delayer.kill()
            delayer.wait()
        self._delays.clear()
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        for ns in names:
            if ns == self.switch or ns.startswith(f"{self.name}-n"):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        # The management legs go too: a namespace's veths outlive it while a
        # socket of a process still running there holds it.
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        for line in links.splitlines():
            link = line.split(":")[1].strip().split("@")[0]
            if link.startswith(f"{self.name}-m"):
                subprocess.run(["ip", "link", "del", link], capture_output=True)
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
