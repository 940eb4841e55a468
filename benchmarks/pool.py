"""Gets after the object sizes change: what the node's buffer pool keeps (issue #30).

    python benchmarks/pool.py [--cache 256MiB] [--small 1MiB] [--large 8MiB] [--trials 200]

One process, one node (HOPLITE_POOL_CACHE=--cache). A get with copy=True
copies the object into a buffer of the node's pool, which takes it back, for
the next get, when the tensor is dropped. First cache/small gets of a
`small` object are held and then dropped at once: the pool's cache is then
full of buffers of that size. Then the program moves on to a `large` object:
`trials` gets, each tensor dropped before the next get. Reported for each
phase: the median get time, GB/s, and the fresh memory the pool mapped per
get (stats' pool_mapped_bytes; fresh pages cost a fault each on first touch).
Beside them, in the same process and on the same bytes, what a program
without the store does: torch.empty and copy_ into it each time ("torch
empty+copy_"; glibc's malloc hands the freed memory back, so its pages are
not fresh after the first), and copy_ into one tensor it keeps ("torch
reused"). Results:
benchmarks/results/pool.json and pool.png.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from torch_hoplite.bench import common


def timed(fn, trials: int, warmup: int, mapped=None) -> dict:
    """Median, min and max seconds of fn() over `trials` calls after
    `warmup`, and the bytes `mapped()` grew by per timed call."""
    for _ in range(warmup):
        fn()
    before = mapped() if mapped else 0
    times = []
    for _ in range(trials):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    grew = (mapped() - before) / trials if mapped else None
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "mapped_per_op_bytes": grew}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", default="256MiB", help="HOPLITE_POOL_CACHE of the node")
    parser.add_argument("--small", default="1MiB", help="object size before the change")
    parser.add_argument("--large", default="8MiB", help="object size after it")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=3, help="untimed gets of the large object first")
    parser.add_argument("--label", default="", help="what this run's build is, for the record (e.g. 'before')")
    parser.add_argument("--out", default=os.path.join(common.RESULTS, "pool"))
    args = parser.parse_args()
    cache, small, large = (common.parse_sizes(s)[0] for s in (args.cache, args.small, args.large))
    if not 0 < small <= cache or not 0 < large <= cache:
        parser.error("--small and --large must be positive and at most --cache")
    os.environ["HOPLITE_POOL_CACHE"] = str(cache)
    import torch_hoplite as hop

    hop.init()
    small_src = torch.arange(small, dtype=torch.uint8)
    large_src = torch.arange(large, dtype=torch.uint8)
    small_ref = hop.put(small_src, "pool-small", blocking=True)
    large_ref = hop.put(large_src, "pool-large", blocking=True)

    def mapped() -> int:
        return hop.stats()["pool_mapped_bytes"]

    def get_large() -> None:
        got = hop.get(large_ref).wait()
        assert got.numel() == large and int(got[-1]) == int(large_src[-1])

    # Fill the cache with small buffers: held together, then dropped together.
    held = [hop.get(small_ref).wait() for _ in range(cache // small)]
    assert all(int(t[-1]) == int(small_src[-1]) for t in held)
    del held
    cached_small = hop.stats()["pool_cached_bytes"]
    records = []
    # The first gets after the change, then the same once they have settled.
    n_first = min(args.trials, 20)
    first = timed(get_large, n_first, 0, mapped)
    records.append({"system": "hoplite get", "phase": f"first {n_first} after the change", **first})
    settled = timed(get_large, args.trials, args.warmup, mapped)
    records.append({"system": "hoplite get", "phase": "after the change, settled", **settled})
    def torch_fresh() -> None:
        torch.empty(large, dtype=torch.uint8).copy_(large_src)  # freed at once

    reused = torch.empty(large, dtype=torch.uint8)
    records.append({"system": "torch empty+copy_", "phase": "a new tensor each time",
                    **timed(torch_fresh, args.trials, args.warmup)})
    records.append({"system": "torch reused", "phase": "copy_ into one tensor",
                    **timed(lambda: reused.copy_(large_src), args.trials, args.warmup)})
    for r in records:
        r["size_bytes"] = large
        r["median_ms"] = r["median_s"] * 1e3
        r["max_ms"] = r["max_s"] * 1e3
        r["gbps"] = large / r["median_s"] / 1e9
    hop.delete(small_ref)
    hop.delete(large_ref)
    settings = {"cache_bytes": cache, "small_bytes": small, "large_bytes": large, "trials": args.trials,
                "warmup": args.warmup, "label": args.label, "cached_small_bytes_before_change": cached_small}
    common.write_json(args.out + ".json", "pool", records, settings)
    common.print_table(records, [("system", "system", ""), ("phase", "phase", ""), ("median ms", "median_ms", ".3f"),
                                 ("max ms", "max_ms", ".3f"), ("GB/s", "gbps", ".2f"),
                                 ("mapped/op", "mapped_per_op_bytes", ".0f")])
    _plot(records, args.out + ".png", f"{common.human_size(large)} gets after {common.human_size(small)} ones "
                                      f"filled a {common.human_size(cache)} cache {args.label}".strip())
    print(f"wrote {args.out}.json and {args.out}.png")


def _plot(records: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    labels = [f"{r['system']}\n{r['phase']}" for r in records]
    ax.barh(labels, [r["median_ms"] for r in records], color=["tab:blue", "tab:blue", "tab:gray", "tab:gray"])
    ax.invert_yaxis()
    ax.set_xlabel("median ms per get / copy")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
