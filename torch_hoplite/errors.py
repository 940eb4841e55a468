"""Exceptions raised by torch_hoplite. Every message names the object and, where
one is involved, the peer."""

from __future__ import annotations


class HopliteError(RuntimeError):
    """Base class of every torch_hoplite error."""


class InvalidArgumentError(HopliteError, ValueError):
    """The core refused an argument, e.g. reduce inputs of different dtypes."""


class ObjectExistsError(HopliteError):
    """A put used an id that already names an object."""


class ObjectNotFoundError(HopliteError, KeyError):
    """The object does not exist (e.g. delete of an unknown id)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ObjectDeletedError(HopliteError):
    """The object was deleted."""


class PeerFailedError(HopliteError):
    """A peer died or its connection broke during the operation."""


class StoreLostError(PeerFailedError):
    """The rendezvous store went away (its host exited) or could not be reached."""


class CapacityError(HopliteError, MemoryError):
    """The local store is full of copies that cannot be evicted."""


class HopliteTimeoutError(HopliteError, TimeoutError):
    """An operation did not finish within its timeout."""


class ProtocolError(HopliteError):
    """A peer sent something the protocol does not allow."""


class NotInitializedError(HopliteError):
    """torch_hoplite.init() has not been called in this process."""


_BY_CODE: dict[int, type[HopliteError]] = {
    1: InvalidArgumentError,
    2: ObjectNotFoundError,
    3: ObjectExistsError,
    4: ObjectDeletedError,
    5: HopliteTimeoutError,
    6: PeerFailedError,
    7: CapacityError,
    8: ProtocolError,
    9: HopliteError,  # shutdown
    10: HopliteError,  # internal
    11: PeerFailedError,  # an object being recomputed after a peer failed
    12: HopliteError,  # a holder handed its copy to a get (pulls look elsewhere; not expected here)
}


def error_from_status(code: int, message: str) -> HopliteError:
    """Maps a status reported by the C++ core to the matching exception."""
    return _BY_CODE.get(code, HopliteError)(message)
