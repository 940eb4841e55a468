"""The GPU path (issue #5), on one GPU shared by several processes over loopback:

    python benchmarks/gpu.py [--sizes 1MB,64MB,256MB] [--nodes 4] [--trials 5]

  p2p:       round trip between 2 processes, as in p2p.py (put on rank 0, get
             and put back on rank 1, get on rank 0), of a CUDA tensor delivered
             to the GPU ("cuda", put from and got to cuda:0) and of a CPU tensor
             ("cpu"), interleaved trial by trial. Target: cuda within 10% of
             cpu at 256 MB (the staging hidden behind the transfer).
  broadcast: rank 0 puts, every other rank gets onto its device; time to the
             slowest; cuda vs cpu as above.
  allreduce: every rank's hop.allreduce of its tensor (SUM), the result on
             its device; time to the slowest. For CUDA tensors the tree's
             combine steps run on the GPU (reading the page-locked store
             buffers in place); the JSON counts the bytes that did.
  c10d allreduce: dist.all_reduce (SUM) through the "hoplite" backend and
             through gloo, on cuda and cpu tensors, time to the slowest;
             "x gloo" is hoplite's time over gloo's on the same device.
  kernels:   the streaming reduce kernels of cuda/ (built here with nvcc)
             combining out = a + b for float32, float16, bfloat16, with b on the
             device and b in page-locked host memory (how the tree reduce reads
             a child's chunk), vs a device-to-device copy measured in the same
             run; bandwidth counts every byte read and written (3 per element
             and input byte for a combine, 2 for a copy). Target: >= 80% of the
             copy's. With b in host memory the link to the host bounds it:
             compared with a host-to-device copy of b ("x link").
  pinning:   cudaHostRegister / cudaHostUnregister of a store-sized buffer,
             what a pool buffer costs the first time a device copy uses it.

Without a GPU only the cpu rows of p2p and broadcast run (a check of the
harness); the JSON says so. Results: benchmarks/results/gpu.json and gpu.png.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import statistics
import subprocess
import tempfile
import time

import torch
import torch.distributed as dist

from torch_hoplite.bench import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def worker(rank, world, port, devices, sizes, warmup, trials, queue):
    import torch_hoplite as hop

    store = dist.TCPStore("127.0.0.1", port, world, is_master=(rank == 0), timeout=datetime.timedelta(seconds=600))
    dist.init_process_group("gloo", store=dist.PrefixStore("gloo", store), rank=rank, world_size=world)
    hop.init(dist.PrefixStore("hoplite", store), rank=rank, world_size=world)
    results: dict = {}
    n = 0
    for size in sizes:
        tensors = {d: torch.ones(size // 4, dtype=torch.float32, device=d) for d in devices}
        for trial in range(warmup + trials):
            for device in devices[trial % len(devices):] + devices[: trial % len(devices)]:
                n += 1
                x = tensors[device]
                for op in OPS:
                    if op == "p2p" and rank > 1:
                        dist.barrier()
                        dist.barrier()
                        continue
                    ping, pong = f"{op}-{n}-ping", f"{op}-{n}-pong"
                    dist.barrier()
                    t0 = time.perf_counter()
                    if op == "p2p" and rank == 0:
                        hop.put(x, ping)
                        y = hop.get(pong, device=device).wait()
                    elif op == "p2p":
                        y = hop.get(ping, device=device).wait()
                        hop.put(y, pong)
                    elif op == "allreduce":
                        y = hop.allreduce(x, ping)
                    elif rank == 0:
                        hop.put(x, ping)
                    else:
                        y = hop.get(ping, device=device).wait()
                    _sync(device)  # the bytes are on the device, not just queued
                    elapsed = time.perf_counter() - t0
                    dist.barrier()
                    if trial >= warmup:
                        results.setdefault((op, device, size), []).append(elapsed)
                    if rank == 0 and op != "allreduce":
                        hop.delete(ping)
                    if op == "p2p" and rank == 1:
                        hop.delete(pong)
    groups = {"gloo": dist.group.WORLD, "hoplite": dist.new_group(backend="hoplite")}
    for size in sizes:
        for trial in range(warmup + trials):
            for device in devices:
                for backend, group in groups.items():
                    x = torch.ones(size // 4, dtype=torch.float32, device=device)
                    _sync(device)
                    dist.barrier()
                    t0 = time.perf_counter()
                    dist.all_reduce(x, group=group)
                    _sync(device)
                    elapsed = time.perf_counter() - t0
                    if trial >= warmup:
                        results.setdefault((C10D, backend, device, size), []).append(elapsed)
    stats = hop.stats()
    results["reduce_bytes"] = (stats["reduce_bytes"], stats["reduce_bytes_on_device"])
    hop.barrier()
    hop.shutdown()
    dist.destroy_process_group()
    queue.put((rank, results))


OPS = ("p2p", "broadcast", "allreduce")
C10D = "c10d allreduce"


def measure_transfers(devices: list[str], sizes: list[int], nodes: int, warmup: int,
                      trials: int) -> tuple[list[dict], dict]:
    """The transfer records, and the bytes the reduces combined (in all, on a device)."""
    results = common.run_ranks(worker, nodes, (nodes, common.free_port(), devices, sizes, warmup, trials))
    combined = {"reduce_bytes": sum(results[r]["reduce_bytes"][0] for r in range(nodes)),
                "reduce_bytes_on_device": sum(results[r]["reduce_bytes"][1] for r in range(nodes))}
    def record(system: str, op: str, size: int, key: tuple, ranks, moved: int) -> dict:
        """The trials of `key` timed to the slowest of `ranks`."""
        per_trial = [max(results[r][key][i] for r in ranks) for i in range(trials)]
        median = statistics.median(per_trial)
        return {"system": system, "op": op, "nodes": len(ranks), "size_bytes": size, "trials": trials,
                "median_s": median, "min_s": min(per_trial), "max_s": max(per_trial), "gbps": moved / median / 1e9}

    records = []
    for op in OPS:
        ranks = [0, 1] if op == "p2p" else range(nodes)
        moved = 2 if op == "p2p" else 1
        for size in sizes:
            for device in devices:
                records.append(record(f"hoplite-{device}", op, size, (op, device, size), ranks, moved * size))
    cpu = {(r["op"], r["size_bytes"]): r["median_s"] for r in records if r["system"] == "hoplite-cpu"}
    for r in records:
        r["time_vs_cpu"] = r["median_s"] / cpu[(r["op"], r["size_bytes"])]
    for size in sizes:
        for device in devices:
            pair = [record(f"c10d-{backend}-{device}", C10D, size, (C10D, backend, device, size), range(nodes), size)
                    for backend in ("gloo", "hoplite")]
            for r in pair:
                r["time_vs_gloo"] = r["median_s"] / pair[0]["median_s"]
            records += pair
    return records, combined


# ---------------------------------------------------------------- kernels

SUM = 0
DTYPE_CODES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


def build_kernels(directory: str) -> ctypes.CDLL:
    lib = os.path.join(directory, "libhoplite_cuda.so")
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    subprocess.run([nvcc if os.path.exists(nvcc) else "nvcc", "-O3", "-std=c++17", "-arch=native", "-shared",
                    "-Xcompiler", "-fPIC", os.path.join(ROOT, "cuda", "reduce_kernels.cu"), "-o", lib], check=True)
    k = ctypes.CDLL(lib)
    k.hoplite_cuda_combine.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_size_t, ctypes.c_void_p]
    k.hoplite_cuda_dtype.argtypes = [ctypes.c_char_p]
    return k


def _time_gpu(fn, repeats: int) -> float:
    """Median seconds of fn() on the current stream, by CUDA events."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def measure_kernels(size: int, repeats: int) -> list[dict]:
    records = []
    stream = torch.cuda.current_stream().cuda_stream
    with tempfile.TemporaryDirectory() as tmp:
        k = build_kernels(tmp)
        src = torch.ones(size, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy_s = _time_gpu(lambda: dst.copy_(src), repeats)
        copy_gbps = 2 * size / copy_s / 1e9
        records.append({"system": "torch-copy", "op": "d2d-copy", "dtype": "uint8", "size_bytes": size,
                        "median_s": copy_s, "gbps": copy_gbps, "vs_copy": 1.0})
        host = torch.ones(size, dtype=torch.uint8).pin_memory()
        h2d_s = _time_gpu(lambda: dst.copy_(host, non_blocking=True), repeats)
        records.append({"system": "torch-copy", "op": "h2d-copy", "dtype": "uint8", "size_bytes": size,
                        "median_s": h2d_s, "gbps": size / h2d_s / 1e9, "vs_link": 1.0})
        for dtype, code in DTYPE_CODES.items():
            n = size // torch.tensor([], dtype=dtype).element_size()
            a = torch.ones(n, dtype=dtype, device="cuda")
            out = torch.empty_like(a)
            for where, b in (("device", torch.ones_like(a)), ("pinned-host", torch.ones(n, dtype=dtype).pin_memory())):
                def combine():
                    rc = k.hoplite_cuda_combine(SUM, code, out.data_ptr(), a.data_ptr(), b.data_ptr(), n, stream)
                    assert rc == 0, rc
                seconds = _time_gpu(combine, repeats)
                gbps = 3 * size / seconds / 1e9
                record = {"system": "hoplite-kernel", "op": f"sum, b in {where}", "dtype": str(dtype)[6:],
                          "size_bytes": size, "median_s": seconds, "gbps": gbps}
                if where == "device":
                    record["vs_copy"] = gbps / copy_gbps
                else:  # b crossed the host link once: as fast as the link is the ideal
                    record["vs_link"] = h2d_s / seconds
                records.append(record)
            assert torch.equal(out.float().cpu(), torch.full((n,), 2.0))
    return records


def measure_pinning(sizes: list[int], repeats: int) -> list[dict]:
    """cudaHostRegister + cudaHostUnregister of touched host memory, as a pool buffer is locked."""
    cudart = torch.cuda.cudart()
    records = []
    for size in sizes:
        buffer = torch.ones(size, dtype=torch.uint8)  # touched, like a pool buffer in use
        register, unregister = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            assert int(cudart.cudaHostRegister(buffer.data_ptr(), size, 3)) == 0  # portable | mapped, as the pool
            t1 = time.perf_counter()
            assert int(cudart.cudaHostUnregister(buffer.data_ptr())) == 0
            register.append(t1 - t0)
            unregister.append(time.perf_counter() - t1)
        records.append({"system": "cuda-runtime", "op": "pin", "size_bytes": size,
                        "register_ms": statistics.median(register) * 1e3,
                        "unregister_ms": statistics.median(unregister) * 1e3,
                        "gbps": size / statistics.median(register) / 1e9})
    return records


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [op for op in OPS + (C10D,) if any(r["op"] == op for r in records)]
    fig, axes = plt.subplots(1, len(ops), figsize=(5.5 * len(ops), 4.2), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for system in dict.fromkeys(r["system"] for r in records if r["op"] == op):
            rs = [r for r in records if r["op"] == op and r["system"] == system]
            ax.plot([r["size_bytes"] for r in rs], [r["gbps"] for r in rs], marker="o", label=system)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tensor size (bytes)")
        ax.set_ylabel("GB/s (bytes delivered / time)")
        ax.set_title(f"{op}, {rs[0]['nodes']} processes, loopback")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1MB,64MB,256MB")
    parser.add_argument("--nodes", type=int, default=4, help="processes in the broadcast (p2p uses 2 of them)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--kernel-size", default="256MB", help="bytes per kernel input")
    parser.add_argument("--out", default=os.path.join(common.RESULTS, "gpu"))
    args = parser.parse_args()
    if args.nodes < 2:
        parser.error("--nodes must be at least 2")
    sizes = common.parse_sizes(args.sizes)
    gpu = torch.cuda.is_available()
    devices = ["cpu", "cuda"] if gpu else ["cpu"]
    if not gpu:
        print("no CUDA device: measuring the cpu rows only (a check of the harness, not a GPU result)", flush=True)
    records, combined = measure_transfers(devices, sizes, args.nodes, args.warmup, args.trials)
    for r in records:
        r["median_ms"] = r["median_s"] * 1e3
    common.print_table(records, [("system", "system", ""), ("op", "op", ""), ("size", "size_bytes", "d"),
                                 ("median ms", "median_ms", ".3f"), ("GB/s", "gbps", ".2f"),
                                 ("x cpu time", "time_vs_cpu", ".2f"), ("x gloo", "time_vs_gloo", ".2f")])
    print(f"allreduce combine steps: {combined['reduce_bytes']} bytes, {combined['reduce_bytes_on_device']} of them "
          "on a GPU", flush=True)
    kernels, pinning = [], []
    if gpu:
        kernels = measure_kernels(common.parse_sizes(args.kernel_size)[0], max(args.trials, 10))
        common.print_table(kernels, [("system", "system", ""), ("op", "op", ""), ("dtype", "dtype", ""),
                                     ("GB/s", "gbps", ".1f"), ("x copy", "vs_copy", ".2f"),
                                     ("x link", "vs_link", ".2f")])
        pinning = measure_pinning(sizes, 5)
        common.print_table(pinning, [("op", "op", ""), ("size", "size_bytes", "d"),
                                     ("register ms", "register_ms", ".2f"), ("unregister ms", "unregister_ms", ".2f"),
                                     ("GB/s", "gbps", ".1f")])
    settings = {"sizes": sizes, "nodes": args.nodes, "trials": args.trials, "warmup": args.warmup,
                "devices": devices, "gpu_present": gpu, **combined}
    common.write_json(args.out + ".json", "gpu", records + kernels + pinning, settings)
    plot(records, args.out + ".png")
    print(f"wrote {args.out}.json and {args.out}.png")


if __name__ == "__main__":
    main()
