"""Where objects are: subscriptions to the directory's list of an object's holders."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

from torch_hoplite.errors import error_from_status
from torch_hoplite.object_ref import ObjectId

_STATES = ("absent", "present", "deleted", "lost")


@dataclasses.dataclass(frozen=True)
class Locations:
    """Where an object is, as its directory shard knows it.

    ``state`` is ``"absent"`` (not put yet, or being recomputed by its reduce),
    ``"present"``, ``"deleted"`` or ``"lost"`` (its last holder died:
    ``last_holder``). ``complete`` and ``partial`` are the ranks holding every
    byte and those still receiving (which already relay what they have);
    ``inline``: the shard keeps a small object's bytes too.
    """

    id: ObjectId
    state: str
    complete: tuple[int, ...] = ()
    partial: tuple[int, ...] = ()
    inline: bool = False
    last_holder: Optional[int] = None

    @property
    def holders(self) -> tuple[int, ...]:
        """Every rank with a copy, complete or partial, in rank order."""
        return tuple(sorted(self.complete + self.partial))


class Subscription:
    """News of where one object is, pushed by its directory shard.

    Made by :func:`torch_hoplite.subscribe`. The shard sends the object's
    locations when the subscription starts and after each change: a put, a
    copy starting or completing on another rank, a copy evicted, a holder
    dying, a delete. Changes close together may arrive as one. If the shard's
    own rank dies, the subscription moves with its share of the directory; the
    new shard rebuilds the holder list as the holders re-register.
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, node, obj_id: ObjectId, key: bytes, timeout_of: Callable[[Optional[float]], float]):
        self._node = node
        self.id = obj_id
        self._handle = node.subscribe(key)
        self._seen = 0
        self._timeout_of = timeout_of  # a timeout checked, or the configured default
        self._latest: Optional[Locations] = None

    @property
    def latest(self) -> Optional[Locations]:
        """The locations :meth:`next` last returned (None before the first call)."""
        return self._latest

    def next(self, timeout: Optional[float] = None) -> Locations:
        """Waits for locations newer than those last returned (the first call:
        the current ones) and returns them. Raises HopliteTimeoutError after
        `timeout` seconds (default ``HOPLITE_TIMEOUT``) without news."""
        if self._handle is None:
            raise ValueError(f"the subscription to object {self.id!r} is closed")
        wait = self._timeout_of(timeout)
        code, message, version, state, complete, partial, inline, last_holder = self._node.next_locations(
            self._handle, self._seen, wait
        )
        if code != 0:
            raise error_from_status(code, message)
        self._seen = version
        self._latest = Locations(
            self.id, _STATES[state], tuple(complete), tuple(partial), bool(inline),
            last_holder if last_holder >= 0 else None,
        )
        return self._latest

    def wait_for(self, predicate: Callable[[Locations], bool], timeout: Optional[float] = None) -> Locations:
        """Returns the first locations (the latest known included) for which
        `predicate` holds, e.g. ``lambda loc: 3 in loc.complete``. Raises
        HopliteTimeoutError naming the object if none does within `timeout`."""
        wait = self._timeout_of(timeout)
        if self._latest is not None and predicate(self._latest):
            return self._latest
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise error_from_status(5, f"object {self.id!r} did not reach the awaited locations within "
                                           f"{wait} s; last known: {self._latest}")
            try:
                loc = self.next(left)
            except TimeoutError:
                continue  # the deadline check above raises with the last known state
            if predicate(loc):
                return loc

    def close(self) -> None:
        """Stops the news; :meth:`next` raises afterwards. Idempotent."""
        if self._handle is not None:
            self._node.unsubscribe(self._handle)
            self._handle = None

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # the node may be gone at interpreter exit
            pass

    def __repr__(self) -> str:
        return f"Subscription(id={self.id!r}, latest={self._latest})"

