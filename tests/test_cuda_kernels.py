"""The CUDA reduce kernels (cuda/): compiled with nvcc on every machine that has
it (this one has no GPU), run against torch's answers where a GPU is present."""

import ctypes
import os
import shutil
import subprocess

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
SUM, PROD, MIN, MAX = 0, 1, 2, 3
CODES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3, torch.int32: 4, torch.int64: 5}


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """cuda/reduce_kernels.cu built by nvcc (warnings are errors) into a library loaded with ctypes."""
    if not os.path.exists(NVCC):
        pytest.skip("nvcc is not installed")
    lib = str(tmp_path_factory.mktemp("cuda") / "libhoplite_cuda.so")
    arch = "native" if torch.cuda.is_available() else "sm_90"
    subprocess.run([NVCC, "-std=c++20", "-O2", f"-arch={arch}", "-Werror", "all-warnings", "-Xcompiler", "-Wall",
                    "-shared", "-Xcompiler", "-fPIC", os.path.join(ROOT, "cuda", "reduce_kernels.cu"), "-o", lib],
                   check=True, capture_output=True, timeout=600)
    k = ctypes.CDLL(lib)
    k.hoplite_cuda_dtype.argtypes = [ctypes.c_char_p]
    k.hoplite_cuda_combine.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_size_t, ctypes.c_void_p]
    k.hoplite_cuda_divide.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_void_p]
    k.hoplite_cuda_error_string.restype = ctypes.c_char_p
    return k


def test_the_c_interface_names_dtypes_and_refuses_what_it_lacks(kernels):
    for dtype, code in CODES.items():
        assert kernels.hoplite_cuda_dtype(str(dtype).split(".")[1].encode()) == code
    assert kernels.hoplite_cuda_dtype(b"int8") == -1
    assert kernels.hoplite_cuda_combine(9, 2, None, None, None, 10, None) == -1  # unknown op
    assert kernels.hoplite_cuda_combine(SUM, 42, None, None, None, 10, None) == -1  # unknown dtype
    assert kernels.hoplite_cuda_divide(CODES[torch.int32], None, 10, 3, None) == -1  # AVG of integers
    assert kernels.hoplite_cuda_error_string(-1) == b"unsupported reduce op or dtype"
    assert kernels.hoplite_cuda_combine(SUM, 2, None, None, None, 0, None) == 0  # nothing to do


def test_without_a_device_a_launch_reports_the_cuda_error(kernels):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present (the kernels run in the gpu tests)")
    x = torch.ones(64)
    code = kernels.hoplite_cuda_combine(SUM, 2, x.data_ptr(), x.data_ptr(), x.data_ptr(), 64, None)
    assert code > 0 and kernels.hoplite_cuda_error_string(code)
    assert torch.equal(x, torch.ones(64))  # nothing ran


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(CODES))
def test_kernels_match_torch_reading_pinned_host_memory_in_place(kernels, dtype):
    n = (1 << 20) + 3  # a tail past the last 16-byte vector
    g = torch.Generator().manual_seed(len(str(dtype)))
    a_host = torch.randint(-8, 9, (n,), generator=g).to(dtype)  # small integers: every result is exact
    b_host = torch.randint(-8, 9, (n,), generator=g).to(dtype)
    a = a_host.cuda()
    b = b_host.pin_memory()  # a store buffer: read by the kernel where it is
    stream = torch.cuda.current_stream().cuda_stream
    expected = {SUM: a_host + b_host, PROD: a_host * b_host, MIN: torch.minimum(a_host, b_host),
                MAX: torch.maximum(a_host, b_host)}
    for op, want in expected.items():
        out = torch.empty_like(a)
        assert kernels.hoplite_cuda_combine(op, CODES[dtype], out.data_ptr(), a.data_ptr(), b.data_ptr(), n, stream) == 0
        # Unaligned pointers take the element-wise path.
        odd = torch.empty_like(a)
        assert kernels.hoplite_cuda_combine(op, CODES[dtype], odd[1:].data_ptr(), a[1:].data_ptr(), b[1:].data_ptr(),
                                            n - 1, stream) == 0
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), want), op
        assert torch.equal(odd[1:].cpu(), want[1:]), op
    # In place (out is a), then AVG's division by the number of inputs.
    if dtype.is_floating_point:
        acc = (a_host * 3).cuda()
        assert kernels.hoplite_cuda_combine(SUM, CODES[dtype], acc.data_ptr(), acc.data_ptr(), b.data_ptr(), n, stream) == 0
        assert kernels.hoplite_cuda_divide(CODES[dtype], acc.data_ptr(), n, 1, stream) == 0
        torch.cuda.synchronize()
        assert torch.equal(acc.cpu(), a_host * 3 + b_host)
        third = (a_host * 3).cuda()
        assert kernels.hoplite_cuda_divide(CODES[dtype], third.data_ptr(), n, 3, stream) == 0
        torch.cuda.synchronize()
        assert torch.equal(third.cpu(), a_host)
