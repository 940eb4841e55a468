"""ObjectRef: the small, picklable handle of an immutable object in the store."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional, Union

import torch

if TYPE_CHECKING:
    from torch_hoplite.collectives import ReducePlan

ObjectId = Union[str, bytes]


@dataclasses.dataclass(frozen=True)
class ObjectRef:
    """Names an object and describes its contents.

    Equality and hashing use the id alone. Pickles to a few hundred bytes, so it
    can travel through queues, files and ``torch.distributed.rpc``.
    """

    id: ObjectId
    nbytes: int = dataclasses.field(compare=False)
    dtype: torch.dtype = dataclasses.field(compare=False)
    shape: tuple[int, ...] = dataclasses.field(compare=False)
    device: torch.device = dataclasses.field(compare=False, default=torch.device("cpu"))
    #: For the result of :func:`torch_hoplite.reduce`: which inputs it used and how.
    reduce_plan: Optional["ReducePlan"] = dataclasses.field(compare=False, default=None, repr=False)

    def __repr__(self) -> str:
        shape = "x".join(str(d) for d in self.shape) or "scalar"
        return f"ObjectRef({self.id!r}, {str(self.dtype).removeprefix('torch.')}[{shape}], {self.nbytes} B, {self.device})"


def id_bytes(obj_id: ObjectId) -> bytes:
    """The wire form of an id; str ids are UTF-8."""
    if isinstance(obj_id, str):
        data = obj_id.encode("utf-8")
    elif isinstance(obj_id, (bytes, bytearray)):
        data = bytes(obj_id)
    else:
        raise TypeError(f"object id must be str or bytes, got {type(obj_id).__name__}")
    if not data:
        raise ValueError("object id must not be empty")
    if len(data) > 1024:
        raise ValueError(f"object id of {len(data)} bytes is longer than 1024 bytes")
    return data


def id_of(ref_or_id: "ObjectRef | ObjectId") -> ObjectId:
    return ref_or_id.id if isinstance(ref_or_id, ObjectRef) else ref_or_id
