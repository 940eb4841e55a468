"""Asynchronous parameter-server training of a real model, three ways, with and
without a straggler.

    python examples/async_ps.py                          # 1 server + 3 workers, every mode, both cases
    python examples/async_ps.py --modes hoplite,rpc --straggler only
    python examples/async_ps.py --hidden 3500 --max-seconds 120   # an MLP of ~25 M parameters

The model is an MLP student regressing a fixed random teacher network on
synthetic inputs (nothing is downloaded), so the target loss is reachable.
Modes:

- ``hoplite``: the Hoplite paper's asynchronous SGD. Workers put gradients as
  objects; the server reduces the first k of n to arrive with the streaming
  reduce (the others join a later round), applies the sum, and puts the new
  weights as an object that the workers whose gradients were used pull
  (through relays).
- ``ddp-gloo`` / ``ddp-hoplite``: synchronous DistributedDataParallel over the
  workers, with the gloo and the ``"hoplite"`` backends.
- ``rpc``: the batch-update parameter server of PyTorch's RPC examples: each
  worker sends its gradient with ``rpc_sync`` and receives the next weights
  from an ``@async_execution`` future; the server steps on the first k
  gradients to arrive, as in the hoplite mode, so that the two differ only in
  how the bytes move.

``--straggler`` (both, only, none) makes worker 1 ``--slowdown`` times slower.
Each run stops at the target loss (validation MSE) or after ``--max-seconds``;
the script fails unless every run reached the target. It shows progress, and
writes the loss against time (PNG) and every run's figures (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
from torch import nn

import torch_hoplite as hop
from launch import add_tensorpipe_arguments, launch, tensorpipe_options

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")  # PNG + JSON

MODES = ("hoplite", "ddp-gloo", "ddp-hoplite", "rpc")
IN_DIM, OUT_DIM = 64, 16
EVAL_INTERVAL_S = 0.2
TIMEOUT = 300


# ---------------------------------------------------------------- model and data


def student(hidden: int) -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(IN_DIM, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, OUT_DIM))


def teacher() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(IN_DIM, 64), nn.Tanh(), nn.Linear(64, OUT_DIM))
    for p in net.parameters():
        p.requires_grad_(False)
    return net


class Data:
    """Batches of inputs and the teacher's answers; each worker draws its own stream."""

    def __init__(self, seed: int, batch: int):
        self.teacher = teacher()
        self.generator = torch.Generator().manual_seed(seed)
        self.batch = batch

    def next(self, size: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(size or self.batch, IN_DIM, generator=self.generator)
        return x, self.teacher(x)


def validation_loss(model: nn.Module, validation: tuple[torch.Tensor, torch.Tensor]) -> float:
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(validation[0]), validation[1]))


def flat_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def load_flat(model: nn.Module, flat: torch.Tensor) -> None:
    nn.utils.vector_to_parameters(flat, model.parameters())


def set_flat_grad(model: nn.Module, flat: torch.Tensor) -> None:
    offset = 0
    for p in model.parameters():
        p.grad = flat[offset: offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def params_of(model: nn.Module) -> torch.Tensor:
    return nn.utils.parameters_to_vector(model.parameters()).detach().clone()


class Straggle:
    """Makes one step take `factor` times its compute time (sleeping the rest)."""

    def __init__(self, factor: float):
        self.factor = factor

    def __call__(self, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        start = time.monotonic()
        out = compute()
        if self.factor > 1:
            time.sleep((self.factor - 1) * (time.monotonic() - start))
        return out


class Progress:
    """The server's record of a run: loss against time, samples, time to target."""

    def __init__(self, mode: str, straggler: bool, target: float, max_seconds: float, show: bool):
        from tqdm import tqdm

        self.mode, self.straggler, self.target, self.max_seconds = mode, straggler, target, max_seconds
        self.start = time.monotonic()
        self.curve: list[tuple[float, float]] = []
        self.samples = 0
        self.updates = 0
        self.time_to_target: Optional[float] = None
        self._last_eval = -1.0
        self.bar = tqdm(desc=f"{mode}{' +straggler' if straggler else ''}", unit="upd", disable=not show, delay=0.1)

    def begin(self, loss: float) -> None:
        """Starts the clock once the run's set-up is done, with the initial loss."""
        self.start = time.monotonic()
        self.record(loss)

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def update(self, samples: int, loss_of: Callable[[], float]) -> None:
        self.samples += samples
        self.updates += 1
        self.bar.update()
        now = self.elapsed()
        if now - self._last_eval >= EVAL_INTERVAL_S:
            self.record(loss_of())

    def record(self, loss: float) -> None:
        now = self.elapsed()
        self._last_eval = now
        self.curve.append((now, loss))
        self.bar.set_postfix(loss=f"{loss:.4f}", samples_per_s=f"{self.samples / max(now, 1e-9):.0f}")
        if self.time_to_target is None and loss <= self.target:
            self.time_to_target = now

    def done(self) -> bool:
        return self.time_to_target is not None or self.elapsed() >= self.max_seconds

    def result(self) -> dict:
        self.bar.close()
        seconds = self.elapsed()
        return {"mode": self.mode, "straggler": self.straggler, "seconds": seconds, "updates": self.updates,
                "samples": self.samples, "samples_per_s": self.samples / seconds,
                "time_to_target_s": self.time_to_target, "reached": self.time_to_target is not None,
                "final_loss": self.curve[-1][1] if self.curve else None, "curve": self.curve}


# ---------------------------------------------------------------- (a) hoplite: first k of n


def hoplite_server(args, run: str, progress: Progress, workers: list[int]) -> None:
    model = student(args.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    validation = Data(10_000, args.batch).next(1024)
    version = 0
    next_step = {w: 0 for w in workers}
    computing_on = {w: 0 for w in workers}  # the version each worker's pending gradient uses
    alive = {0}  # versions put and not yet deleted
    progress.begin(validation_loss(model, validation))
    hop.put(params_of(model), f"{run}/w/0")
    while not progress.done():
        ids = {f"{run}/g/{w}/{next_step[w]}": w for w in workers}
        total, unused = hop.reduce(list(ids), num_objects=args.k, timeout=TIMEOUT)
        summed = hop.get(total, timeout=TIMEOUT).wait()
        hop.delete(total)
        used = [ids[i] for i in ids if i not in set(unused)]
        for w in used:
            hop.delete(f"{run}/g/{w}/{next_step[w]}")
        set_flat_grad(model, summed / len(used))
        optimizer.step()
        version += 1
        hop.put(params_of(model), f"{run}/w/{version}")
        for w in used:
            hop.put(torch.tensor([version]), f"{run}/told/{w}/{next_step[w]}")
            next_step[w] += 1
            computing_on[w] = version
        alive.add(version)
        for old in sorted(alive - set(computing_on.values()) - {version}):  # no worker reads these any more
            hop.delete(f"{run}/w/{old}")
            alive.discard(old)
        progress.update(len(used) * args.batch, lambda: validation_loss(model, validation))
    for w in workers:  # tell every worker to stop where it waits
        hop.put(torch.tensor([-1]), f"{run}/told/{w}/{next_step[w]}")
    hop.barrier(timeout=TIMEOUT)
    for v in alive:
        hop.delete(f"{run}/w/{v}")


def hoplite_worker(args, run: str, rank: int, straggle: Straggle) -> None:
    model = student(args.hidden)
    data = Data(rank, args.batch)
    version, step = 0, 0
    while version >= 0:
        load_flat(model, hop.get(f"{run}/w/{version}", timeout=TIMEOUT).wait())
        grad = straggle(lambda: flat_grad(model, *data.next()))
        hop.put(grad, f"{run}/g/{rank}/{step}")
        told = f"{run}/told/{rank}/{step}"
        version = int(hop.get(told, timeout=TIMEOUT).wait())
        hop.delete(told)
        if version < 0:
            hop.delete(f"{run}/g/{rank}/{step}")  # the server stopped before using it
        step += 1
    hop.barrier(timeout=TIMEOUT)


# ---------------------------------------------------------------- (b) synchronous DDP


def ddp_worker(args, rank: int, group, straggle: Straggle, progress: Optional[Progress], stop) -> None:
    model = nn.parallel.DistributedDataParallel(student(args.hidden), process_group=group)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    data = Data(rank, args.batch)
    validation = Data(10_000, args.batch).next(1024)
    if progress is not None:
        progress.begin(validation_loss(model.module, validation))
    while True:
        def step():
            x, y = data.next()
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()  # the allreduce of the gradients
            optimizer.step()
        straggle(step)
        if progress is not None:
            progress.update(args.batch * args.workers, lambda: validation_loss(model.module, validation))
            stop.fill_(1.0 if progress.done() else 0.0)
        dist.broadcast(stop, src=1, group=group)  # the first worker decides for all
        if stop.item():
            break


# ---------------------------------------------------------------- (c) torch RPC parameter server


class RpcServer:
    """The batch-update parameter server of PyTorch's RPC examples: each worker
    sends its gradient and gets the weights of the next update back through an
    ``@async_execution`` future; the server steps once k gradients are in (the
    same first-k rule as the hoplite mode)."""

    instance: Optional["RpcServer"] = None

    def __init__(self, args, progress: Progress):
        self.model = student(args.hidden)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr)
        self.validation = Data(10_000, args.batch).next(1024)
        self.lock = threading.Lock()
        self.progress = progress
        self.batch, self.k = args.batch, args.k
        self.grads: list[torch.Tensor] = []
        self.waiting: list[torch.futures.Future] = []
        self.stopped = False

    def begin(self) -> None:
        """Starts the clock (every worker is about to fetch the first weights)."""
        self.progress.begin(validation_loss(self.model, self.validation))

    def weights(self) -> Optional[torch.Tensor]:
        with self.lock:
            return None if self.stopped else params_of(self.model)

    def add(self, grad: torch.Tensor) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        with self.lock:
            if self.stopped:
                fut.set_result(None)
                return fut
            self.grads.append(grad)
            self.waiting.append(fut)
            if len(self.grads) < self.k:
                return fut
            set_flat_grad(self.model, torch.stack(self.grads).mean(dim=0))
            self.optimizer.step()
            self.progress.update(len(self.grads) * self.batch, lambda: validation_loss(self.model, self.validation))
            self.stopped = self.progress.done()
            answer = None if self.stopped else params_of(self.model)
            waiting, self.grads, self.waiting = self.waiting, [], []
        for f in waiting:
            f.set_result(answer)
        return fut

    def stop(self) -> None:
        """Answers the workers still waiting (a straggler's gradient left out)."""
        with self.lock:
            self.stopped = True
            waiting, self.grads, self.waiting = self.waiting, [], []
        for f in waiting:
            f.set_result(None)


def rpc_weights() -> Optional[torch.Tensor]:
    return RpcServer.instance.weights()


@rpc.functions.async_execution
def rpc_update_and_fetch(grad: torch.Tensor) -> torch.futures.Future:
    return RpcServer.instance.add(grad)


def rpc_worker(args, rank: int, straggle: Straggle) -> None:
    model = student(args.hidden)
    data = Data(rank, args.batch)
    weights = rpc.rpc_sync("ps0", rpc_weights, timeout=TIMEOUT)
    while weights is not None:
        load_flat(model, weights)
        grad = straggle(lambda: flat_grad(model, *data.next()))
        weights = rpc.rpc_sync("ps0", rpc_update_and_fetch, args=(grad,), timeout=TIMEOUT)


# ---------------------------------------------------------------- one process


def run_rank(rank: int, world: int, args) -> None:
    torch.set_num_threads(1)
    hop.init(timeout=TIMEOUT)
    dist.init_process_group("gloo")
    rpc.init_rpc(f"ps{rank}", rank=rank, world_size=world, rpc_backend_options=tensorpipe_options(args, TIMEOUT))
    workers = list(range(1, world))
    groups = {"ddp-gloo": dist.new_group(workers, backend="gloo"),
              "ddp-hoplite": dist.new_group(workers, backend="hoplite")}
    # A short unrecorded run of each mode first: connections, buffer pools and
    # allocator caches are warm for the runs that count.
    schedule = [(mode, False, None) for mode in args.modes if args.warmup_seconds > 0]
    for straggler in {"both": (False, True), "only": (True,), "none": (False,)}[args.straggler]:
        schedule += [(mode, straggler, len(schedule)) for mode in args.modes]
    results = []
    for mode, straggler, index in schedule:
        record = run_case(rank, workers, groups, args, mode, straggler, warmup=index is None)
        if record is not None and index is not None:
            results.append(record)
            print(_summary(record), flush=True)
    rpc.shutdown()
    dist.destroy_process_group()
    hop.shutdown()
    if rank == 0:
        report(results, args)


def run_case(rank: int, workers: list[int], groups: dict, args, mode: str, straggler: bool,
             warmup: bool) -> Optional[dict]:
    """One run of `mode` on every rank; rank 0 returns its record."""
    straggle = Straggle(args.slowdown if straggler and rank == 1 else 1.0)
    run = f"{mode}/{int(straggler)}/{'warmup' if warmup else 'run'}"
    target, seconds = (-1.0, args.warmup_seconds) if warmup else (args.target, args.max_seconds)
    # Who keeps the record: the server, or worker 1 under DDP (rank 0 has no part in it).
    keeper = 1 if mode.startswith("ddp") else 0
    progress = Progress(mode, straggler, target, seconds, show=not warmup) if rank == keeper else None
    hop.barrier(timeout=TIMEOUT)
    if mode == "hoplite":
        if rank == 0:
            hoplite_server(args, run, progress, workers)
        else:
            hoplite_worker(args, run, rank, straggle)
    elif mode.startswith("ddp"):
        if rank != 0:
            ddp_worker(args, rank, groups[mode], straggle, progress, torch.zeros(1))
    else:
        if rank == 0:
            RpcServer.instance = RpcServer(args, progress)
        hop.barrier(timeout=TIMEOUT)
        if rank == 0:
            RpcServer.instance.begin()
            while not progress.done():
                time.sleep(0.01)
            RpcServer.instance.stop()
        else:
            rpc_worker(args, rank, straggle)
        hop.barrier(timeout=TIMEOUT)
        RpcServer.instance = None
    if keeper == 0:
        return progress.result() if rank == 0 else None
    if rank == keeper:
        hop.put(torch.tensor(list(json.dumps(progress.result()).encode()), dtype=torch.uint8), f"{run}/record")
    hop.barrier(timeout=TIMEOUT)
    if rank != 0:
        return None
    record = json.loads(bytes(hop.get(f"{run}/record", timeout=TIMEOUT).wait().tolist()))
    hop.delete(f"{run}/record")
    return record


def _summary(r: dict) -> str:
    reached = f"target reached in {r['time_to_target_s']:.1f} s" if r["reached"] else "target NOT reached"
    return (f"{r['mode']:>12}{' +straggler' if r['straggler'] else '':11}: {r['samples_per_s']:8.0f} samples/s, "
            f"{r['updates']} updates, final loss {r['final_loss']:.4f}, {reached}")


def write_results(results: list[dict], args, out_dir: str, params: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    cases = sorted({r["straggler"] for r in results})
    fig, axes = plt.subplots(1, len(cases), figsize=(6 * len(cases), 4), squeeze=False, sharey=True)
    for ax, straggler in zip(axes[0], cases):
        for r in results:
            if r["straggler"] == straggler and r["curve"]:
                ax.plot([t for t, _ in r["curve"]], [loss for _, loss in r["curve"]], label=r["mode"])
        ax.axhline(args.target, color="grey", linestyle="--", linewidth=0.8, label="target")
        ax.set_yscale("log")
        ax.set_xlabel("seconds")
        ax.set_title(f"{args.workers} workers" + (f", worker 1 {args.slowdown:g}x slower" if straggler else ""))
        ax.legend()
    axes[0][0].set_ylabel("validation MSE")
    fig.suptitle(f"asynchronous PS: MLP of {params / 1e6:.2f} M parameters, batch {args.batch}", fontsize=10)
    fig.tight_layout()
    base = os.path.join(out_dir, "async_ps")
    fig.savefig(base + ".png", dpi=100)
    with open(base + ".json", "w") as f:
        json.dump({"params": params, "workers": args.workers, "k": args.k, "batch": args.batch,
                   "target": args.target, "slowdown": args.slowdown, "runs": results}, f)
    print(f"wrote {base}.png and {base}.json")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--k", type=int, default=None, help="gradients per update in hoplite mode (default workers-1)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--straggler", choices=["both", "only", "none"], default="both")
    parser.add_argument("--slowdown", type=float, default=2.5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--target", type=float, default=0.004)
    parser.add_argument("--max-seconds", type=float, default=20.0)
    parser.add_argument("--warmup-seconds", type=float, default=1.0, help="unrecorded run of each mode first")
    parser.add_argument("--allow-miss", action="store_true", help="report a missed target instead of failing")
    add_tensorpipe_arguments(parser)
    parser.add_argument("--out-dir", default=RESULTS)
    args = parser.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = set(args.modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    if "RANK" in os.environ:  # started by torchrun (or the benchmark): one rank here
        args.workers = int(os.environ["WORLD_SIZE"]) - 1
    args.k = args.k or max(1, args.workers - 1)
    if not 1 <= args.k <= args.workers:
        parser.error(f"--k must be in [1, {args.workers}] (the number of workers)")
    launch(run_rank, args.workers + 1, args)


def report(results: list[dict], args) -> None:
    """Writes the results and fails unless every run reached the target."""
    params = sum(p.numel() for p in student(args.hidden).parameters())
    if args.out_dir:
        write_results(results, args, args.out_dir, params)
    missed = [f"{r['mode']}{' +straggler' if r['straggler'] else ''}" for r in results if not r["reached"]]
    if missed and not args.allow_miss:
        raise SystemExit(f"the loss did not reach {args.target:g} in: {', '.join(missed)}")
    print(f"MLP of {params:,} parameters, {args.workers} workers: "
          + (f"missed the target {args.target:g} in {', '.join(missed)}" if missed
             else f"every run reached the target loss {args.target:g}"))

if __name__ == "__main__":
    main()
