"""Configuration: keyword arguments of :func:`torch_hoplite.init` override
``HOPLITE_*`` environment variables, which override the defaults.

=============================  ==========================================  ===============
variable / keyword             meaning                                     default
=============================  ==========================================  ===============
HOPLITE_LISTEN_HOST  host      IPv4 address to listen on and advertise     see below
HOPLITE_IFNAME       ifname    take the address of this interface          unset
HOPLITE_LISTEN_PORT  port      TCP port (0: any free port)                 0
HOPLITE_TRANSPORT    transport  how nodes reach each other, by name       tcp
                               (``torch_hoplite.transports()`` lists them)
HOPLITE_CHUNK_BYTES  chunk     pipelining chunk (0: by object size,        0
                     _bytes    about 1/128 of the object, 128 KiB
                               .. 4 MiB; at least 16 chunks, down to
                               64 KiB)
HOPLITE_STORE_CAPACITY         bytes of object copies this node keeps      half of RAM
                     capacity
                     _bytes
HOPLITE_INLINE_THRESHOLD       objects up to this size live in the         64KiB
                     inline_threshold_bytes  directory (one-round-trip gets)
HOPLITE_POOL_CACHE   pool      freed buffer memory kept for reuse; what    RAM/16
                     _cache    stays unused a whole heap trim interval
                     _bytes    is given back at the next trim
HOPLITE_TIMEOUT      timeout   default timeout of every operation, s       300
HOPLITE_CONNECT_TIMEOUT        retrying connects to a peer, and waiting    30
                               for a new connection's hello, s
                     connect_timeout
HOPLITE_HEARTBEAT_INTERVAL     ping a peer that said nothing for this, s   1
                     heartbeat_interval
HOPLITE_HEARTBEAT_TIMEOUT      a peer that answers nothing for this long   10
                     heartbeat_timeout  has failed, s
HOPLITE_COPY_THREADS           threads for a get's copies and reduce       2
                     copy_threads  steps (puts copy on their own thread)
HOPLITE_SOCKET_BUFFER          SO_SNDBUF/SO_RCVBUF bytes (0: autotune)     0
                     socket_buffer_bytes
HOPLITE_TCP_CONGESTION         TCP congestion control of the node's        system's
                     tcp_congestion  connections (TCP_CONGESTION), e.g.
                               cubic; must be in the kernel's allowed
                               list (or the process has CAP_NET_ADMIN)
HOPLITE_MAILBOX_BYTES          backend messages sent to one peer ahead     64MiB
                     mailbox   of their receives; later ones (and any
                     _bytes    over 4 MiB) wait for the receive
HOPLITE_SAME_HOST    same      processes of one host (same kernel, pid     1
                     _host     and network namespace) read each other's
                               objects from memory (process_vm_readv)
                               instead of over loopback TCP; 0: always TCP
HOPLITE_HEAP_TRIM_INTERVAL     give the pool's idle buffers and glibc      30
                     heap_trim malloc's freed pages back to the kernel
                     _interval (malloc_trim) every this many s, so
                               that a process that frees many large
                               tensors stays flat; 0: never, else
                               at least 0.1
HOPLITE_SECRET       secret    cluster secret: peers prove they know it    generated
                               (HMAC challenge-response) before anything
                               else is accepted; unset: rank 0 generates
                               one at rendezvous and keeps it in the store
HOPLITE_REJOIN       rejoin    this process restarts a rank that failed:   0
                               join the running cluster (its round in
                               the store) instead of starting a new one
HOPLITE_LOG_LEVEL    (env)     error, warn, info or debug                  warn
=============================  ==========================================  ===============

Sizes accept suffixes: ``64KB``, ``1MiB``, ``2G`` (K/M/G = 1024-based).
Without HOPLITE_LISTEN_HOST or HOPLITE_IFNAME, the node advertises the local
address that routes to the rendezvous store's host (127.0.0.1 for a local store).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Optional

MAX_TIMEOUT = 86400.0  # a day; the core clamps longer waits too
# malloc_trim takes ~30 ms and holds each arena's lock in turn: not back to back.
MIN_HEAP_TRIM_INTERVAL = 0.1

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kKmMgGtT]?)(i?[bB])?\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bool(value: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case)."""
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected 1/0, true/false, yes/no or on/off, got {value!r}")


def parse_size(value: str | int, name: str = "size") -> int:
    """Parses ``"64KiB"``, ``"1MB"``, ``"2g"`` or a plain integer into bytes."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ValueError(f"{name}: cannot parse size {value!r} (examples: 65536, 64KiB, 1MB)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16 << 30


@dataclasses.dataclass
class Config:
    host: Optional[str] = None
    ifname: Optional[str] = None
    port: int = 0
    transport: str = "tcp"
    chunk_bytes: int = 0
    capacity_bytes: int = dataclasses.field(default_factory=lambda: _total_memory() // 2)
    inline_threshold_bytes: int = 64 << 10
    pool_cache_bytes: Optional[int] = None
    timeout: float = 300.0
    connect_timeout: float = 30.0
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 10.0
    copy_threads: int = 2
    socket_buffer_bytes: int = 0
    tcp_congestion: str = ""
    mailbox_bytes: int = 64 << 20
    same_host: bool = True
    heap_trim_interval: float = 30.0
    secret: Optional[str] = dataclasses.field(default=None, repr=False)
    rejoin: bool = False

    _ENV = {
        "host": ("HOPLITE_LISTEN_HOST", str),
        "ifname": ("HOPLITE_IFNAME", str),
        "port": ("HOPLITE_LISTEN_PORT", int),
        "transport": ("HOPLITE_TRANSPORT", str),
        "chunk_bytes": ("HOPLITE_CHUNK_BYTES", parse_size),
        "capacity_bytes": ("HOPLITE_STORE_CAPACITY", parse_size),
        "inline_threshold_bytes": ("HOPLITE_INLINE_THRESHOLD", parse_size),
        "pool_cache_bytes": ("HOPLITE_POOL_CACHE", parse_size),
        "timeout": ("HOPLITE_TIMEOUT", float),
        "connect_timeout": ("HOPLITE_CONNECT_TIMEOUT", float),
        "heartbeat_interval": ("HOPLITE_HEARTBEAT_INTERVAL", float),
        "heartbeat_timeout": ("HOPLITE_HEARTBEAT_TIMEOUT", float),
        "copy_threads": ("HOPLITE_COPY_THREADS", int),
        "socket_buffer_bytes": ("HOPLITE_SOCKET_BUFFER", parse_size),
        "tcp_congestion": ("HOPLITE_TCP_CONGESTION", str),
        "mailbox_bytes": ("HOPLITE_MAILBOX_BYTES", parse_size),
        "same_host": ("HOPLITE_SAME_HOST", parse_bool),
        "heap_trim_interval": ("HOPLITE_HEAP_TRIM_INTERVAL", float),
        "secret": ("HOPLITE_SECRET", str),
        "rejoin": ("HOPLITE_REJOIN", parse_bool),
    }

    @classmethod
    def resolve(cls, overrides: dict[str, Any]) -> "Config":
        """Defaults, then environment, then keyword overrides (None means unset)."""
        cfg = cls()
        for field, (env, parse) in cls._ENV.items():
            raw = os.environ.get(env)
            if raw is not None and raw != "":
                try:
                    setattr(cfg, field, parse(raw))
                except ValueError as e:
                    raise ValueError(f"{env}={raw!r}: {e}") from None
        unknown = set(overrides) - set(cls._ENV)
        if unknown:
            raise TypeError(f"unknown torch_hoplite option(s): {', '.join(sorted(unknown))}")
        for field, value in overrides.items():
            if value is None:
                continue
            if field.endswith("_bytes"):
                value = parse_size(value, field)
            setattr(cfg, field, value)
        if cfg.pool_cache_bytes is None:
            # Every process on a host keeps its own cache: stay well below RAM even with several.
            cfg.pool_cache_bytes = min(cfg.capacity_bytes, _total_memory() // 16)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.chunk_bytes > (64 << 20):
            raise ValueError(f"chunk_bytes must be at most 64 MiB, got {self.chunk_bytes}")
        if self.inline_threshold_bytes > (16 << 20):
            raise ValueError(f"inline_threshold_bytes must be at most 16 MiB, got {self.inline_threshold_bytes}")
        for name in ("timeout", "connect_timeout", "heartbeat_interval", "heartbeat_timeout"):
            value = getattr(self, name)
            if not 0 < value <= MAX_TIMEOUT:
                raise ValueError(f"{name} must be positive and at most {MAX_TIMEOUT:g} s, got {value}")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise ValueError(
                f"heartbeat_timeout ({self.heartbeat_timeout} s) must exceed heartbeat_interval "
                f"({self.heartbeat_interval} s)"
            )
        if self.heap_trim_interval != 0 and not MIN_HEAP_TRIM_INTERVAL <= self.heap_trim_interval <= MAX_TIMEOUT:
            raise ValueError(
                f"heap_trim_interval must be 0 (never) or between {MIN_HEAP_TRIM_INTERVAL:g} and {MAX_TIMEOUT:g} s, "
                f"got {self.heap_trim_interval}"
            )
        if self.copy_threads < 1:
            raise ValueError(f"copy_threads must be at least 1, got {self.copy_threads}")
