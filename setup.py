"""Builds torch_hoplite._C against the torch that is already installed.

CPU build by default on a CPU torch. A CUDA build (adding the kernels in cuda/)
happens when torch has CUDA and nvcc is found; HOPLITE_BUILD_CUDA=0/1 forces either.
GPU architectures: TORCH_CUDA_ARCH_LIST, else the visible GPUs', else (no GPU)
those torch was built for (see default_cuda_archs).
Compile flags: -O2 -g0 (HOPLITE_DEBUG_BUILD=1 gives -O0 -g and the checks that
loop-owned state is touched on its loop thread only).

The UCX transport (csrc/net/ucx/) is a shared object of its own,
torch_hoplite/_transport_ucx*.so, loaded only when a node asks for
transport="ucx": built when UCX's headers are found (UCX_HOME, else
/usr/include, i.e. Debian's libucx-dev); HOPLITE_BUILD_UCX=0/1 forces either.
"""
import glob
import os
import shutil

from setuptools import Extension, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def nvcc_path() -> str | None:
    in_cuda_home = os.path.join(cpp_extension.CUDA_HOME or "", "bin", "nvcc")
    return shutil.which("nvcc") or (in_cuda_home if os.path.exists(in_cuda_home) else None)


def want_cuda() -> bool:
    forced = os.environ.get("HOPLITE_BUILD_CUDA")
    if forced is not None:
        return forced == "1"
    import torch

    return torch.version.cuda is not None and nvcc_path() is not None


def default_cuda_archs() -> None:
    """Picks the GPU architectures to build for when nothing tells torch which.

    With no GPU visible (a build host, a CI runner) and no TORCH_CUDA_ARCH_LIST,
    torch's extension builder has no device to ask and fails. Build then for the
    architectures this torch was built for that the local nvcc knows, with PTX
    for the newest so later GPUs can still run the kernels.
    """
    import subprocess

    import torch

    if os.environ.get("TORCH_CUDA_ARCH_LIST") or torch.cuda.device_count() > 0:
        return
    known = subprocess.run([nvcc_path() or "nvcc", "--list-gpu-arch"], capture_output=True, text=True).stdout.split()
    # torch < 2.15 lists its archs only when a driver is present: ask its build flags.
    built = torch.cuda.get_arch_list() or torch._C._cuda_getArchFlags().split()
    archs = [a[3:] for a in built if a.startswith("sm_") and "compute_" + a[3:] in known]
    if not archs:
        raise RuntimeError(
            f"no GPU architecture that both torch ({built}) and nvcc know; "
            "set TORCH_CUDA_ARCH_LIST (e.g. 9.0) or HOPLITE_BUILD_CUDA=0"
        )
    os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(f"{a[:-1]}.{a[-1]}" for a in archs) + "+PTX"


def sources(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


debug = os.environ.get("HOPLITE_DEBUG_BUILD") == "1"
cxx_flags = ["-std=c++20", "-O0" if debug else "-O2", "-g" if debug else "-g0", "-Wall", "-Wno-sign-compare"]
if debug:
    cxx_flags.append("-DHOPLITE_DEBUG")  # loop-owned state checks its thread (HOPLITE_ASSERT_ON_LOOP)
UCX_SOURCES = "csrc/net/ucx/*.cpp"
core = [s for s in sources("csrc/**/*.cpp") if s not in sources(UCX_SOURCES)]
include_dirs = [os.path.join(ROOT, "csrc")]


def ucx_home() -> str | None:
    """Where UCX's include/ and lib/ are, or None to build without the UCX transport."""
    forced = os.environ.get("HOPLITE_BUILD_UCX")
    for home in [os.environ.get("UCX_HOME"), "/usr"]:
        if home and os.path.exists(os.path.join(home, "include", "ucp", "api", "ucp.h")):
            return None if forced == "0" else home
    if forced == "1":
        raise RuntimeError("HOPLITE_BUILD_UCX=1 but no ucp/api/ucp.h under $UCX_HOME or /usr (apt install libucx-dev)")
    return None


class BuildExtension(cpp_extension.BuildExtension):
    """Links the UCX transport against the _C it plugs into (found beside it at run time)."""

    def build_extension(self, ext):
        if ext.name == "torch_hoplite._transport_ucx":
            core_path = self.get_ext_fullpath("torch_hoplite._C")
            ext.library_dirs.append(os.path.dirname(core_path))
            ext.extra_link_args += ["-l:" + os.path.basename(core_path), "-Wl,-rpath,$ORIGIN"]
        super().build_extension(ext)

if want_cuda():
    default_cuda_archs()
    ext = cpp_extension.CUDAExtension(
        "torch_hoplite._C",
        core + sources("cuda/**/*.cu") + sources("cuda/**/*.cpp"),
        include_dirs=include_dirs + [os.path.join(ROOT, "cuda")],
        define_macros=[("HOPLITE_WITH_CUDA", "1")],
        extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O2", "-std=c++20"]},
    )
else:
    ext = cpp_extension.CppExtension(
        "torch_hoplite._C",
        core,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx_flags},
    )

extensions = [ext]
if (ucx := ucx_home()) is not None:
    lib_dirs = [d for d in (os.path.join(ucx, "lib"), os.path.join(ucx, "lib", "x86_64-linux-gnu")) if os.path.isdir(d)]
    extensions.append(
        Extension(
            "torch_hoplite._transport_ucx",
            sources(UCX_SOURCES),
            include_dirs=include_dirs + ([os.path.join(ucx, "include")] if ucx != "/usr" else []),
            library_dirs=lib_dirs,
            libraries=["ucp", "ucs"],
            extra_compile_args=cxx_flags,
            language="c++",
        )
    )

setup(
    ext_modules=extensions,
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
