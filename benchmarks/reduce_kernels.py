"""Throughput of the CPU reduce kernels vs memcpy, and vs the links they feed (issue #3).

    python benchmarks/reduce_kernels.py [--chunk 2MB]

Builds benchmarks/cpp/reduce_kernels_bench.cpp with the kernels from
csrc/coll/ (g++ -O2, as the extension is built) and streams 256 MB through each
kernel in reduce-step-sized chunks: out = a op b, the work of one tree node
with one child. Reported: GB/s of output, the ratio to memcpy of the same
chunks, and how many 1 Gbit/s links one core keeps up with. Results:
benchmarks/results/reduce_kernels.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile

from torch_hoplite.bench import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunk", default="2MB", help="bytes reduced per step (the node's largest step is 2 MiB)")
    parser.add_argument("--out", default=os.path.join(common.RESULTS, "reduce_kernels.json"))
    args = parser.parse_args()
    chunk = common.parse_sizes(args.chunk)[0]
    with tempfile.TemporaryDirectory() as tmp:
        binary = os.path.join(tmp, "bench")
        subprocess.run(
            ["g++", "-std=c++20", "-O2", "-I", os.path.join(ROOT, "csrc"),
             os.path.join(ROOT, "benchmarks/cpp/reduce_kernels_bench.cpp"),
             os.path.join(ROOT, "csrc/coll/reduce_kernels.cpp"), "-o", binary],
            check=True,
        )
        run = subprocess.run([binary, str(chunk)], check=True, capture_output=True, text=True)
    records = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    for r in records:
        r["gbit_links_per_core"] = r["gbytes_per_s"] * 8
    common.print_table(records, [("kernel", "kernel", ""), ("dtype", "dtype", ""), ("GB/s", "gbytes_per_s", ".2f"),
                                 ("x memcpy", "vs_memcpy", ".2f"), ("1Gb links", "gbit_links_per_core", ".0f")])
    common.write_json(args.out, "reduce_kernels", records, {"chunk_bytes": chunk, "total_bytes": 256 << 20})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
