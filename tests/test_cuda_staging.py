"""CUDA tensors through the store's page-locked staging path (cuda/staging.*).

The CUDA build of that path is compile-checked on every machine with the CUDA
headers; what a CPU build says to CUDA requests is checked without a GPU; the
transfers themselves run where a GPU is present (``pytest -m gpu``).
"""

import os
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import torch_hoplite as hop
import workers
from test_object_store import DTYPES, sample, same_bits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_INCLUDE = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")
TORCH_INCLUDE = os.path.join(os.path.dirname(torch.__file__), "include")
# What the CUDA build compiles with g++ that a CPU build never does.
CUDA_ONLY_HOST_SOURCES = ["cuda/staging.cpp", "cuda/device_reducer.cpp", "csrc/python/node_handle.cpp", "csrc/python/bindings.cpp"]


@pytest.fixture(scope="module")
def cluster3():
    from cluster import Cluster

    c = Cluster(3)
    yield c
    c.close()


@pytest.fixture(scope="module")
def cuda_host_checks(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Each CUDA-only host source checked by g++ as the CUDA build compiles it,
    as many at once as there are cores."""
    if not os.path.exists(os.path.join(CUDA_INCLUDE, "cuda_runtime_api.h")):
        pytest.skip(f"no CUDA headers under {CUDA_INCLUDE}")
    include = [TORCH_INCLUDE, os.path.join(TORCH_INCLUDE, "torch", "csrc", "api", "include"),
               sysconfig.get_paths()["include"], CUDA_INCLUDE, os.path.join(ROOT, "csrc"), os.path.join(ROOT, "cuda")]
    if not os.path.exists(os.path.join(TORCH_INCLUDE, "c10", "cuda", "impl", "cuda_cmake_macros.h")):
        # A CPU wheel ships c10/cuda's headers but not this generated one (it only
        # sets export macros): stand in for it to check our code against the rest.
        stubs = tmp_path_factory.mktemp("cuda_macros")
        (stubs / "c10" / "cuda" / "impl").mkdir(parents=True)
        (stubs / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text("#pragma once\n")
        include.append(str(stubs))
    cmd = ["g++", "-std=c++20", "-fsyntax-only", "-Wall", "-Werror", "-Wno-sign-compare", "-Wno-attributes",
           "-DHOPLITE_WITH_CUDA=1", "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C"]
    cmd += [f"-I{d}" for d in include]

    def check(source: str) -> subprocess.CompletedProcess:
        return subprocess.run([*cmd, os.path.join(ROOT, source)], capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(zip(CUDA_ONLY_HOST_SOURCES, pool.map(check, CUDA_ONLY_HOST_SOURCES)))


@pytest.mark.parametrize("source", CUDA_ONLY_HOST_SOURCES)
def test_the_cuda_build_of_the_host_code_compiles(cuda_host_checks, source):
    done = cuda_host_checks[source]
    assert done.returncode == 0, done.stderr[-4000:]


def test_a_build_without_cuda_refuses_cuda_targets_by_name(cluster3):
    if hop._C.with_cuda:
        pytest.skip("this build has CUDA (its transfers run in the gpu tests)")
    ref = hop.put(torch.arange(10), "cpu-only-build")
    for device in ("cuda", "cuda:0", torch.device("cuda", 1)):
        with pytest.raises(NotImplementedError, match=r"'cpu-only-build'.*built without CUDA"):
            hop.get(ref, device=device)
    with pytest.raises(NotImplementedError, match="to meta"):
        hop.get(ref, device="meta")
    assert torch.equal(hop.get(ref, device="cpu").wait(), torch.arange(10))


def test_out_on_another_device_than_device_is_refused(cluster3):
    ref = hop.put(torch.arange(10), "out-device-mismatch")
    with pytest.raises(ValueError, match=r"out is on cpu, not on device=cuda:0"):
        hop.get(ref, device="cuda:0", out=torch.empty(10, dtype=torch.int64))


# ---------------------------------------------------------------- on a GPU

SIZES = [((4, 0), "empty"), ((3, 5), "inline"), ((300_000,), "streamed")]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_cuda_round_trips_every_dtype(cluster3, dtype):
    for shape, tag in SIZES:
        t = sample(dtype, shape, seed=3)
        ref = hop.put(t.cuda(), f"cuda-{dtype}-{tag}")
        assert ref.device == torch.device("cuda", torch.cuda.current_device())
        # CUDA -> CUDA and CUDA -> CPU on another process, CUDA -> CUDA here
        got, where = cluster3.call(1, workers.get_to, ref, "cuda", 30)
        assert where.startswith("cuda") and same_bits(got, t), (dtype, tag)
        got, where = cluster3.call(1, workers.get_to, ref, "cpu", 30)
        assert where == "cpu" and same_bits(got, t), (dtype, tag)
        here = hop.get(ref, device="cuda").wait()
        assert here.is_cuda and same_bits(here.cpu(), t)
        # CPU -> CUDA: put on the CPU by the other process
        back = cluster3.call(1, workers.put, t, f"cpu-{dtype}-{tag}")
        here = hop.get(back, device="cuda", timeout=30).wait()
        assert here.is_cuda and same_bits(here.cpu(), t), (dtype, tag)


@pytest.mark.gpu
def test_a_large_cuda_object_and_out_on_the_gpu(cluster3):
    t = torch.arange(1 << 24, dtype=torch.float32)
    ref = cluster3.call(1, workers.put_from_cuda, t, "cuda-64MB")
    out = torch.full((1 << 24,), -1.0, device="cuda")
    got = hop.get(ref, out=out, timeout=60).wait()
    assert got.data_ptr() == out.data_ptr() and torch.equal(got.cpu(), t)
    with pytest.raises(hop.InvalidArgumentError, match="'cuda-64MB' into out="):
        hop.get(ref, out=torch.empty(5, device="cuda"), timeout=60).wait()


@pytest.mark.gpu
def test_put_waits_for_the_producing_stream(cluster3):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros(1 << 22, device="cuda")
        torch.cuda._sleep(200_000_000)  # keeps the stream busy for ~0.1 s
        x.fill_(7.0)
        ref = hop.put(x, "after-the-kernel")  # the fill is still queued
    got, _ = cluster3.call(1, workers.get_to, ref, "cpu", 30)
    assert torch.equal(got, torch.full((1 << 22,), 7.0))


@pytest.mark.gpu
def test_a_consumer_on_another_stream_sees_the_whole_object(cluster3):
    t = torch.arange(1 << 22, dtype=torch.float64)
    ref = cluster3.call(1, workers.put, t, "for-a-consumer-stream")
    fut = hop.get(ref, device="cuda", timeout=30)
    consumer = torch.cuda.Stream()
    with torch.cuda.stream(consumer):
        y = fut.wait()  # makes `consumer` wait for the copies, without a host sync
        total = y.sum()
        doubled = y * 2
    consumer.synchronize()
    assert total.item() == float(t.sum()) and torch.equal(doubled.cpu(), t * 2)


@pytest.mark.gpu
def test_reduce_and_broadcast_of_cuda_tensors_across_processes(cluster3):
    n = 1 << 20
    inputs = [torch.full((n,), float(r + 1)) for r in range(3)]  # integer-valued: exact sums
    refs = [hop.put(inputs[0].cuda(), "cuda-in-0")]
    refs += [cluster3.call(r, workers.put_from_cuda, inputs[r], f"cuda-in-{r}") for r in (1, 2)]
    result, _ = hop.reduce(refs, "sum", id="cuda-sum")
    expected = torch.full((n,), 6.0)
    for r in (1, 2):  # every rank fetches the result onto its GPU (a broadcast)
        got, where = cluster3.call(r, workers.get_to, result, "cuda", 60)
        assert where.startswith("cuda") and torch.equal(got, expected)
    assert torch.equal(hop.get(result, device="cuda", timeout=60).wait().cpu(), expected)
    pending = [cluster3.submit(r, workers.allreduce_on_cuda, inputs[r], "cuda-allreduce", {}) for r in (1, 2)]
    mine = hop.allreduce(inputs[0].cuda(), "cuda-allreduce")
    assert mine.is_cuda and torch.equal(mine.cpu(), expected)
    for p in pending:
        got, where = p.result()
        assert where.startswith("cuda") and torch.equal(got, expected)


def _total(cluster, counter):
    return hop.stats()[counter] + sum(cluster.call(r, workers.stats)[counter] for r in (1, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
                                   torch.int64, torch.int8], ids=lambda d: str(d).removeprefix("torch."))
def test_a_tree_reduce_of_cuda_objects_combines_on_the_gpu(cluster3, dtype):
    n = (3 << 20) + 5  # several steps and a tail past the last vector
    g = torch.Generator().manual_seed(11)
    # Small integers: every op's result is exact in every dtype, in any order.
    inputs = [torch.randint(-4, 5, (n,), generator=g).to(dtype) for _ in range(3)]
    ops = {"sum": inputs[0] + inputs[1] + inputs[2], "prod": inputs[0] * inputs[1] * inputs[2],
           "min": torch.minimum(torch.minimum(inputs[0], inputs[1]), inputs[2]),
           "max": torch.maximum(torch.maximum(inputs[0], inputs[1]), inputs[2])}
    if dtype.is_floating_point:
        ops["avg"] = ops["sum"]  # of inputs tripled below: the mean is their plain sum
    combined, on_device = _total(cluster3, "reduce_bytes"), _total(cluster3, "reduce_bytes_on_device")
    for op, expected in ops.items():
        scale = 3 if op == "avg" else 1
        tag = f"gpu-reduce-{dtype}-{op}"
        refs = [hop.put((inputs[0] * scale).cuda(), f"{tag}-0")]
        refs += [cluster3.call(r, workers.put_from_cuda, inputs[r] * scale, f"{tag}-{r}") for r in (1, 2)]
        result, _ = hop.reduce(refs, op, id=tag)
        got = hop.get(result, timeout=60).wait()
        assert torch.equal(got, expected), (dtype, op)
    combined = _total(cluster3, "reduce_bytes") - combined
    on_device = _total(cluster3, "reduce_bytes_on_device") - on_device
    assert combined >= len(ops) * n * inputs[0].element_size()  # at least the root combined every byte
    # int8 has no CUDA kernel: its reduce runs on the CPU, as for CPU objects.
    assert on_device == (0 if dtype == torch.int8 else combined)


def test_the_gpu_benchmark_measures_every_device_it_has(tmp_path):
    """benchmarks/gpu.py end to end at a tiny size (without a GPU: its cpu rows)."""
    import json
    import sys

    out = tmp_path / "gpu"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "gpu.py"), "--sizes", "256KB", "--nodes", "3",
           "--trials", "2", "--warmup", "1", "--kernel-size", "1MB", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "gpu.json").read_text())
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    assert result["settings"]["gpu_present"] == torch.cuda.is_available()
    transfers = [r for r in result["records"] if r["op"] in ("p2p", "broadcast")]
    assert {(r["system"], r["op"]) for r in transfers} == {
        (f"hoplite-{d}", op) for d in devices for op in ("p2p", "broadcast")}
    for r in transfers:
        assert r["nodes"] == (2 if r["op"] == "p2p" else 3) and r["trials"] == 2
        assert 0 < r["min_s"] <= r["median_s"] <= r["max_s"] and r["gbps"] > 0
    c10d = [r for r in result["records"] if r["op"] == "c10d allreduce"]
    assert {r["system"] for r in c10d} == {f"c10d-{b}-{d}" for b in ("gloo", "hoplite") for d in devices}
    assert all(r["median_s"] > 0 and r["time_vs_gloo"] > 0 for r in c10d)
    assert (tmp_path / "gpu.png").stat().st_size > 0
