"""DLRM-shaped training with sharded embedding tables: trainers pull the rows
of each batch and push their row gradients, three ways.

    python examples/dlrm_push_pull.py                      # 2 servers + 2 trainers, every system
    python examples/dlrm_push_pull.py --check              # small integer case, exact against one process
    python examples/dlrm_push_pull.py --rows 1000000 --batch 2048 --steps 30

Shapes follow the DLRM benchmark configurations, scaled to a 2-core, 24 GiB
machine: 26 sparse features (one table each, `--rows` rows of `--dim`
floats, Zipf(`--alpha`) indices, hot rows first), 13 dense features, a
bottom MLP, pairwise dot-product interactions and a top MLP. Tables are
sharded table-wise over the server ranks (table j on server j mod S); the
dense MLPs are replicated on the trainers and averaged with gloo. Every
system runs the same synchronous step: pull the rows of the batch's unique
indices, forward and backward, push the row gradients; a server applies
every trainer's gradients of a step (row-wise SGD) before it serves the next.

- ``rpc``: ``rpc_async`` to each shard owner, indices in, rows out; then the
  gradients in (PyTorch RPC's way).
- ``all_to_all``: gloo ``all_to_all_single`` over servers and trainers: the
  counts, the indices, the rows, the gradients (DLRM's model-parallel path).
- ``hoplite``: each trainer puts its keys per server; a server puts the rows
  of the union of all trainers' keys as one object, which every trainer
  pulls (relayed: the server's link carries it about once); each trainer
  scatters its gradients into the union's layout and the server sums them
  with the streaming reduce (its link receives about one union). What the
  store contributes: one object per step and server instead of one reply per
  trainer, and a sum on the way in.

Reported per system: embedding rows served per second (the trainers' unique
rows), p50/p99 pull latency, bytes sent per step, and the loss. ``--check``
replaces the model by an integer "gradient" of the pulled rows, so that every
system's final tables must equal a single-process reference bit for bit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
from torch import nn

import torch_hoplite as hop
from launch import add_tensorpipe_arguments, launch, tensorpipe_options

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")  # PNG + JSON
SYSTEMS = ("rpc", "all_to_all", "hoplite")
TABLES, DENSE = 26, 13
TIMEOUT = 300


# ---------------------------------------------------------------- data and model


class Batches:
    """Zipf-distributed indices (row k drawn with probability ~ 1/(k+1)^alpha)
    and synthetic clicks from a fixed rule; the same stream for a trainer in
    every system."""

    def __init__(self, args, trainer: int):
        weights = 1.0 / torch.arange(1, args.rows + 1, dtype=torch.float64) ** args.alpha
        self.cdf = torch.cumsum(weights / weights.sum(), 0)
        self.args = args
        self.generator = torch.Generator().manual_seed(1000 + trainer)
        hidden = torch.Generator().manual_seed(7)
        self.row_effect = torch.randn(args.rows, generator=hidden)  # part of the click rule
        self.dense_effect = torch.randn(DENSE, generator=hidden)

    def next(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dense [B, 13], indices [26, B], clicks [B])."""
        b = self.args.batch
        u = torch.rand(TABLES * b, generator=self.generator, dtype=torch.float64)
        idx = torch.searchsorted(self.cdf, u).clamp_(max=self.args.rows - 1).view(TABLES, b)
        dense = torch.randn(b, DENSE, generator=self.generator)
        logit = dense @ self.dense_effect + self.row_effect[idx].sum(0) / TABLES ** 0.5
        return dense, idx, (logit > 0).float()


class DenseNet(nn.Module):
    """Bottom MLP, dot-product interactions of the 27 vectors, top MLP."""

    def __init__(self, dim: int):
        super().__init__()
        torch.manual_seed(3)
        self.bottom = nn.Sequential(nn.Linear(DENSE, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        pairs = (TABLES + 1) * TABLES // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, 128), nn.ReLU(), nn.Linear(128, 1))
        self.rows, self.cols = torch.triu_indices(TABLES + 1, TABLES + 1, offset=1)

    def forward(self, dense: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)  # [B, dim]
        vectors = torch.cat([x[:, None, :], embedded], dim=1)  # [B, 27, dim]
        dots = vectors @ vectors.transpose(1, 2)
        return self.top(torch.cat([x, dots[:, self.rows, self.cols]], dim=1)).squeeze(1)


def initial_table(args, table: int) -> torch.Tensor:
    if args.check:  # small integers, so that every sum is exact
        rows = torch.arange(args.rows, dtype=torch.float32)[:, None]
        return ((rows * 7 + table * 3 + torch.arange(args.dim)) % 11 - 5).float()
    g = torch.Generator().manual_seed(100 + table)
    return torch.randn(args.rows, args.dim, generator=g) * 0.05


def check_gradient(rows: torch.Tensor, trainer: int) -> torch.Tensor:
    """--check's integer "gradient": depends on the pulled values, so a wrong pull shows."""
    return torch.remainder(rows, 5) - 2 + trainer


# ---------------------------------------------------------------- the server's tables


class Shard:
    """The tables a server owns, with row-wise SGD."""

    def __init__(self, args, server: int, servers: int):
        self.tables = {j: initial_table(args, j) for j in range(TABLES) if j % servers == server}
        self.lr = 1.0 if args.check else args.lr
        self.rows = args.rows

    def gather(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows for keys = table * rows + row (any order)."""
        out = torch.empty(len(keys), next(iter(self.tables.values())).shape[1])
        tables = keys // self.rows
        for j, table in self.tables.items():
            mask = tables == j
            out[mask] = table[keys[mask] % self.rows]
        return out

    def apply(self, keys: torch.Tensor, grads: torch.Tensor) -> None:
        """keys may repeat (several trainers): their gradients add up."""
        tables = keys // self.rows
        for j, table in self.tables.items():
            mask = tables == j
            table.index_add_(0, keys[mask] % self.rows, grads[mask], alpha=-self.lr)


_shard: Optional[Shard] = None


def rpc_pull(keys: torch.Tensor) -> torch.Tensor:
    return _shard.gather(keys)


def rpc_push(keys: torch.Tensor, grads: torch.Tensor) -> None:
    _shard.apply(keys, grads)


# ---------------------------------------------------------------- one trainer step, common part


def owner(table: int, servers: int) -> int:
    return table % servers


def batch_keys(idx: torch.Tensor, rows: int, servers: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """The unique keys of a batch per server (sorted), and for each lookup
    (table, position) where its row is in the concatenation of those lists."""
    keys = idx + torch.arange(TABLES)[:, None] * rows  # [26, B]
    per_server, where = [], torch.empty_like(keys)
    offset = 0
    for s in range(servers):
        mine = keys[[j for j in range(TABLES) if owner(j, servers) == s]]
        uniq, inverse = torch.unique(mine, return_inverse=True)
        where[[j for j in range(TABLES) if owner(j, servers) == s]] = inverse + offset
        per_server.append(uniq)
        offset += len(uniq)
    return per_server, where, keys


class Trainer:
    def __init__(self, args, trainer: int, servers: int, group):
        self.args, self.trainer, self.servers, self.group = args, trainer, servers, group
        self.batches = Batches(args, trainer)
        self.net = DenseNet(args.dim)
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=args.lr)

    def step(self, pull, push) -> tuple[float, float, float, int]:
        """One step: pull(keys per server) -> rows per server; push(keys, grads
        per server). Returns (pull seconds, compute seconds, loss, unique
        rows): compute is everything between the pull and the push (forward,
        backward, the dense gradients' all_reduce), which no exchange of rows
        can shorten."""
        dense, idx, clicks = self.batches.next()
        per_server, where, _ = batch_keys(idx, self.args.rows, self.servers)
        start = time.monotonic()
        rows = pull(per_server)
        pulled = time.monotonic()
        all_rows = torch.cat(rows)
        if self.args.check:
            grads = check_gradient(all_rows, self.trainer)
            loss = 0.0
        else:
            leaf = all_rows.requires_grad_()
            embedded = leaf[where].transpose(0, 1)  # [B, 26, dim]
            loss_t = nn.functional.binary_cross_entropy_with_logits(self.net(dense, embedded), clicks)
            self.optimizer.zero_grad()
            loss_t.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in self.net.parameters()])
            dist.all_reduce(flat, group=self.group)  # the dense MLPs stay replicated
            offset = 0
            for p in self.net.parameters():
                p.grad.copy_(flat[offset: offset + p.numel()].view_as(p) / self.args.trainers)
                offset += p.numel()
            self.optimizer.step()
            grads, loss = leaf.grad, float(loss_t.detach())
        computed = time.monotonic()
        push(per_server, list(grads.split([len(k) for k in per_server])))
        return pulled - start, computed - pulled, loss, len(all_rows)


# ---------------------------------------------------------------- the three systems


def run_rpc(rank: int, args, trainer: Optional[Trainer], stats) -> None:
    if trainer is None:
        return  # servers answer RPCs
    names = [f"r{s}" for s in range(args.servers)]

    def pull(per_server):
        futs = [rpc.rpc_async(names[s], rpc_pull, args=(keys,)) for s, keys in enumerate(per_server)]
        return [f.wait() for f in futs]

    def push(per_server, grads):
        dist.barrier(group=trainer.group)  # every trainer pulled this step's rows before any update
        futs = [rpc.rpc_async(names[s], rpc_push, args=(keys, g)) for s, (keys, g) in enumerate(zip(per_server, grads))]
        torch.futures.wait_all(futs)
        stats["bytes"] += sum(k.nbytes * 1 + g.nbytes * 2 for k, g in zip(per_server, grads))  # keys, rows, grads

    for _ in range(args.steps):
        stats.record(*trainer.step(pull, push))
        dist.barrier(group=trainer.group)  # every push of this step is applied before the next pull


def run_all_to_all(rank: int, args, trainer: Optional[Trainer], stats, world_group) -> None:
    world = args.servers + args.trainers
    servers = args.servers

    def exchange(send: list[torch.Tensor], dtype, width: int) -> list[torch.Tensor]:
        """all_to_all_single of one tensor per rank (rows of `width`), uneven."""
        counts = torch.tensor([len(t) for t in send], dtype=torch.int64)
        got = torch.empty(world, dtype=torch.int64)
        dist.all_to_all_single(got, counts, group=world_group)
        flat = torch.cat([t.reshape(-1) for t in send]) if send else torch.empty(0, dtype=dtype)
        out = torch.empty(int(got.sum()) * width, dtype=dtype)
        dist.all_to_all_single(out, flat.to(dtype), [int(c) * width for c in got], [int(c) * width for c in counts],
                               group=world_group)
        stats["bytes"] += flat.nbytes
        return list(out.view(-1, width).split(got.tolist()) if width > 1 else out.split(got.tolist()))

    empty_keys = torch.empty(0, dtype=torch.int64)
    empty_rows = torch.empty(0, args.dim)
    for _ in range(args.steps):
        if trainer is None:  # a server: answer the step's requests
            keys = exchange([empty_keys] * world, torch.int64, 1)
            exchange([_shard.gather(k) for k in keys], torch.float32, args.dim)
            grads = exchange([empty_rows] * world, torch.float32, args.dim)
            for k, g in zip(keys, grads):
                _shard.apply(k, g)
            dist.barrier(group=world_group)
            continue

        def pull(per_server):
            exchange(per_server + [empty_keys] * args.trainers, torch.int64, 1)
            return exchange([empty_rows] * world, torch.float32, args.dim)[:servers]

        def push(per_server, grads):
            exchange(grads + [empty_rows] * args.trainers, torch.float32, args.dim)

        stats.record(*trainer.step(pull, push))
        dist.barrier(group=world_group)


def run_hoplite(rank: int, args, trainer: Optional[Trainer], stats) -> None:
    trainers = range(args.servers, args.servers + args.trainers)
    before = hop.stats()["bytes_sent"]
    for i in range(args.steps):
        if trainer is None:  # a server
            s = rank
            keys = torch.unique(torch.cat([hop.get(f"k/{i}/{s}/{t}", timeout=TIMEOUT).wait() for t in trainers]))
            for t in trainers:
                hop.delete(f"k/{i}/{s}/{t}")
            hop.put(keys, f"keys/{i}/{s}")
            hop.put(_shard.gather(keys), f"rows/{i}/{s}")
            total, _ = hop.reduce([f"g/{i}/{s}/{t}" for t in trainers], timeout=TIMEOUT)
            _shard.apply(keys, hop.get(total, timeout=TIMEOUT).wait())
            for obj in [total.id, f"keys/{i}/{s}", f"rows/{i}/{s}"] + [f"g/{i}/{s}/{t}" for t in trainers]:
                hop.delete(obj)
            continue
        positions, union_size = {}, {}

        def pull(per_server):
            for s, keys in enumerate(per_server):
                hop.put(keys, f"k/{i}/{s}/{rank}")
            union = [hop.get(f"keys/{i}/{s}", timeout=TIMEOUT) for s in range(args.servers)]
            rows = [hop.get(f"rows/{i}/{s}", timeout=TIMEOUT) for s in range(args.servers)]
            out = []
            for s, keys in enumerate(per_server):
                union_keys = union[s].wait()
                positions[s], union_size[s] = torch.searchsorted(union_keys, keys), len(union_keys)
                out.append(rows[s].wait()[positions[s]])
            return out

        def push(per_server, grads):
            for s, (keys, g) in enumerate(zip(per_server, grads)):
                aligned = torch.zeros(union_size[s], args.dim)
                aligned[positions[s]] = g
                hop.put(aligned, f"g/{i}/{s}/{rank}")

        stats.record(*trainer.step(pull, push))
    hop.barrier(timeout=TIMEOUT)
    stats["bytes"] += hop.stats()["bytes_sent"] - before


class Stats(dict):
    def __init__(self):
        super().__init__(bytes=0)
        self.pulls: list[float] = []
        self.computes: list[float] = []
        self.losses: list[float] = []
        self.rows = 0

    def record(self, pull_s: float, compute_s: float, loss: float, rows: int) -> None:
        self.pulls.append(pull_s)
        self.computes.append(compute_s)
        self.losses.append(loss)
        self.rows += rows


# ---------------------------------------------------------------- one process


def run_rank(rank: int, world: int, args) -> None:
    global _shard
    torch.set_num_threads(1)
    hop.init(timeout=TIMEOUT)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT))
    rpc.init_rpc(f"r{rank}", rank=rank, world_size=world, rpc_backend_options=tensorpipe_options(args, TIMEOUT))
    world_group = dist.group.WORLD
    trainer_group = dist.new_group(list(range(args.servers, world)))
    is_server = rank < args.servers
    results = {}
    for system in args.systems:
        _shard = Shard(args, rank, args.servers) if is_server else None
        trainer = None if is_server else Trainer(args, rank - args.servers + 1, args.servers, trainer_group)
        stats = Stats()
        hop.barrier(timeout=TIMEOUT)
        start = time.monotonic()
        if system == "rpc":
            run_rpc(rank, args, trainer, stats)
        elif system == "all_to_all":
            run_all_to_all(rank, args, trainer, stats, world_group)
        else:
            run_hoplite(rank, args, trainer, stats)
        hop.barrier(timeout=TIMEOUT)
        seconds = time.monotonic() - start
        mine = {"rows": stats.rows, "pulls": stats.pulls, "computes": stats.computes, "losses": stats.losses,
                "bytes": stats["bytes"], "seconds": seconds, "tables": {j: t.tolist() for j, t in _shard.tables.items()} if args.check and is_server else {}}
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            results[system] = gathered
        hop.barrier(timeout=TIMEOUT)
    rpc.shutdown()
    dist.destroy_process_group()
    hop.shutdown()
    if rank == 0:
        report(results, args)


def reference_tables(args) -> dict[int, torch.Tensor]:
    """--check in one process: the same batches, pulls, "gradients" and updates."""
    tables = {j: initial_table(args, j) for j in range(TABLES)}
    streams = [Batches(args, t) for t in range(1, args.trainers + 1)]
    for _ in range(args.steps):
        updates = []
        for t, stream in enumerate(streams, start=1):
            _, idx, _ = stream.next()
            per_server, _, _ = batch_keys(idx, args.rows, args.servers)
            keys = torch.cat(per_server)
            rows = torch.stack([tables[int(k) // args.rows][int(k) % args.rows] for k in keys])
            updates.append((keys, check_gradient(rows, t)))
        for keys, grads in updates:
            for k, g in zip(keys.tolist(), grads):
                tables[k // args.rows][k % args.rows] -= g
    return tables


def summarize(results: dict, args) -> list[dict]:
    records = []
    for system, ranks in results.items():
        trainers = ranks[args.servers:]
        seconds = max(r["seconds"] for r in ranks)
        pulls = sorted(p for r in trainers for p in r["pulls"])
        losses = [statistics.mean(step) for step in zip(*(r["losses"] for r in trainers))]
        records.append({
            "system": system, "servers": args.servers, "trainers": args.trainers, "steps": args.steps,
            "rows_per_s": sum(r["rows"] for r in trainers) / seconds, "seconds": seconds,
            "pull_p50_ms": 1e3 * statistics.median(pulls), "pull_p99_ms": 1e3 * pulls[min(len(pulls) - 1, int(0.99 * len(pulls)))],
            "bytes_per_step": sum(r["bytes"] for r in ranks) / args.steps,
            "step_ms": 1e3 * seconds / args.steps,
            "compute_ms": 1e3 * statistics.mean(c for r in trainers for c in r["computes"]),
            "loss_first": losses[0], "loss_last": losses[-1], "losses": losses,
        })
    base = {r["system"]: r for r in records}.get("rpc")
    for r in records:
        r["rows_per_s_vs_rpc"] = r["rows_per_s"] / base["rows_per_s"] if base else None
    return records


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--trainers", type=int, default=2)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--rows", type=int, default=100_000, help="rows per table")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent of the indices")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--check", action="store_true", help="integer case, exact against one process")
    add_tensorpipe_arguments(parser)
    parser.add_argument("--out-dir", default=RESULTS)
    args = parser.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    if set(args.systems) - set(SYSTEMS):
        parser.error(f"systems are {', '.join(SYSTEMS)}")
    if args.check:
        args.rows, args.dim, args.batch, args.steps = min(args.rows, 500), min(args.dim, 4), min(args.batch, 64), min(args.steps, 4)
    if "RANK" in os.environ:  # torchrun or the benchmark: one rank here
        args.trainers = int(os.environ["WORLD_SIZE"]) - args.servers
    launch(run_rank, args.servers + args.trainers, args)


def report(results: dict, args) -> None:
    if args.check:
        expected = reference_tables(args)
        for system, ranks in results.items():
            for r in ranks[:args.servers]:
                for j, table in r["tables"].items():
                    if not torch.equal(torch.tensor(table), expected[int(j)]):
                        raise SystemExit(f"{system}: table {j} differs from the single-process reference")
        print(f"every system's tables equal the single-process reference bit for bit ({', '.join(results)})")
        return
    records = summarize(results, args)
    for r in records:
        vs_rpc = f" ({r['rows_per_s_vs_rpc']:.2f}x rpc)" if r["rows_per_s_vs_rpc"] else ""
        print(f"{r['system']:>10}: {r['rows_per_s']:9.0f} rows/s{vs_rpc}, pull p50 "
              f"{r['pull_p50_ms']:.1f} ms p99 {r['pull_p99_ms']:.1f} ms, {r['bytes_per_step'] / 1e6:.1f} MB/step, "
              f"step {r['step_ms']:.0f} ms of which compute {r['compute_ms']:.0f} ms, loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}")
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        path = os.path.join(args.out_dir, "dlrm_push_pull.json")
        with open(path, "w") as f:
            json.dump({"tables": TABLES, "rows": args.rows, "dim": args.dim, "batch": args.batch, "alpha": args.alpha,
                       "servers": args.servers, "trainers": args.trainers, "records": records}, f)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
