"""Which tensors can be stored, and the dtype names the core records."""

from __future__ import annotations

import torch

from torch_hoplite import _C

_DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    )
}


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise TypeError(f"dtype {dtype} is not supported by torch_hoplite")
    return name


def require_cuda(what: str) -> None:
    """Raises unless CUDA tensors can go through this build's staging path."""
    if not _C.with_cuda:
        raise NotImplementedError(
            f"{what}: this torch_hoplite was built without CUDA; rebuild it where torch has CUDA "
            "and nvcc is installed (HOPLITE_BUILD_CUDA=1 forces it)"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what}: no CUDA device is available")


def prepare_for_put(tensor: torch.Tensor, what: str = "put") -> torch.Tensor:
    """Checks a tensor can be stored and returns a dense, contiguous view of it
    (on its own device: CUDA tensors are copied to the store by the core).
    `what` names the operation in errors."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise TypeError(f"{what} supports dense (strided) tensors, got layout {tensor.layout}")
    if tensor.is_quantized:
        raise TypeError(f"{what} does not support quantized tensors")
    if tensor.device.type == "cuda":
        require_cuda(f"{what} of a CUDA tensor")
    elif tensor.device.type != "cpu":
        raise NotImplementedError(
            f"{what} of a {tensor.device.type} tensor: torch_hoplite stores CPU and CUDA tensors "
            "(move it with .cpu() first)"
        )
    dtype_name(tensor.dtype)
    tensor = tensor.detach()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    return tensor.contiguous()
