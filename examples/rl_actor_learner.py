"""Asynchronous actor/learner reinforcement learning over torch.distributed.rpc,
with the policy and the trajectories moving through torch_hoplite.

    python examples/rl_actor_learner.py                 # 1 learner + 3 actors, CartPole-v1
    python examples/rl_actor_learner.py --transport rpc # the same with plain TensorPipe RPC
    python examples/rl_actor_learner.py --policy-bytes 64MB --iterations 20   # for the benchmark

The learner creates its actors with ``rpc.remote``. Each iteration it puts the
policy's weights once; the actors that are ready receive the ObjectRef and pull
the weights (through relays, not one copy per actor from the learner), play
episodes of gymnasium's CartPole, and return their trajectories as ObjectRefs.
The learner trains (REINFORCE with a baseline) on the first `k` trajectories
to arrive and sends the new policy to those actors at once, while the slower
ones keep playing. It checks that the policy learned (the mean reward of the
last 50 episodes reaches `--target`), and plots the reward curve.

``--policy-bytes`` adds ballast to the published weights, so that the transfer
is that of a large policy while the network stays small (the actors pull the
ballast and check its size). With ``--transport rpc`` the weights and the
trajectories travel inside the RPC messages instead, as in PyTorch's RPC
examples, and with ``--transport offload`` the same messages with
``torch_hoplite.rpc.enable()``, which sends the weights through the store
without changing the RPC code. The script starts its own processes, or joins torchrun's (the
learner is rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import time
from typing import Optional, Union

import torch
import torch.distributed.rpc as rpc
from torch import nn

import torch_hoplite as hop
import torch_hoplite.rpc as hop_rpc
from launch import add_tensorpipe_arguments, launch, tensorpipe_options
from torch_hoplite.config import parse_size

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")  # PNG + JSON

GAMMA = 0.99
ENV = "CartPole-v1"


class Policy(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 2))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


def flat_weights(policy: Policy, ballast_elements: int, version: int) -> torch.Tensor:
    """The policy's parameters as one tensor, followed by `ballast_elements`
    copies of the version number (which the actors check)."""
    params = nn.utils.parameters_to_vector(policy.parameters()).detach()
    return torch.cat([params, torch.full((ballast_elements,), float(version))])


WeightsHandle = Union[hop.ObjectRef, torch.Tensor]


class Actor:
    """Plays episodes with the policy it is sent; lives on an actor process (an RRef's owner)."""

    def __init__(self, index: int, seed: int, transport: str, ballast_elements: int):
        import gymnasium as gym

        self.index = index
        self.env = gym.make(ENV)
        self.seed = seed
        self.episodes_played = 0
        self.transport = transport
        self.ballast_elements = ballast_elements
        self.policy = Policy()
        self.generator = torch.Generator().manual_seed(seed)

    def play(self, weights: WeightsHandle, version: int, episodes: int):
        """Returns (trajectory, episode rewards, version of the policy that played).

        The trajectory is one float tensor with a row per step: observation (4),
        action, discounted return from that step."""
        flat = hop.get(weights, timeout=120).wait() if isinstance(weights, hop.ObjectRef) else weights
        n = sum(p.numel() for p in self.policy.parameters())
        if flat.numel() != n + self.ballast_elements:
            raise ValueError(f"actor {self.index}: weights of {flat.numel()} elements, expected {n + self.ballast_elements}")
        if not bool((flat[n:] == version).all()):
            raise ValueError(f"actor {self.index}: the weights it received are not those of version {version}")
        nn.utils.vector_to_parameters(flat[:n], self.policy.parameters())
        rows, rewards = [], []
        with torch.no_grad():
            for _ in range(episodes):
                obs, _ = self.env.reset(seed=self.seed * 100_003 + self.episodes_played)
                self.episodes_played += 1
                steps, done = [], False
                while not done:
                    o = torch.as_tensor(obs, dtype=torch.float32)
                    probs = torch.softmax(self.policy(o), dim=-1)
                    action = int(torch.multinomial(probs, 1, generator=self.generator))
                    obs, reward, terminated, truncated, _ = self.env.step(action)
                    steps.append((o, action, float(reward)))
                    done = terminated or truncated
                ret = 0.0
                returns = []
                for _, _, r in reversed(steps):
                    ret = r + GAMMA * ret
                    returns.append(ret)
                returns.reverse()
                for (o, a, _), g in zip(steps, returns):
                    rows.append(torch.cat([o, torch.tensor([float(a), g])]))
                rewards.append(sum(r for _, _, r in steps))
        trajectory = torch.stack(rows)
        if self.transport == "hoplite":
            return hop.put(trajectory), rewards, version
        return trajectory, rewards, version


class Learner:
    """Publishes the policy, takes the first k trajectories to arrive, trains."""

    def __init__(self, args, actor_names: list[str]):
        torch.manual_seed(args.seed)
        self.args = args
        self.policy = Policy()
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=args.lr)
        self.ballast = parse_size(args.policy_bytes, "--policy-bytes") // 4
        self.actors = [
            rpc.remote(name, Actor, args=(i, args.seed + 1 + i, args.transport, self.ballast))
            for i, name in enumerate(actor_names)
        ]
        self.version = 0
        self.published: dict[int, WeightsHandle] = {}
        self.in_flight: dict[int, int] = {}  # actor index -> version it plays with
        self.arrivals: "queue.Queue[int]" = queue.Queue()
        self.futures: dict[int, torch.futures.Future] = {}
        self.history: list[tuple[float, float]] = []  # (seconds since start, episode reward)
        self.iteration_times: list[float] = []

    def publish(self) -> None:
        weights = flat_weights(self.policy, self.ballast, self.version)
        self.published[self.version] = hop.put(weights) if self.args.transport == "hoplite" else weights

    def launch(self, actor: int) -> None:
        self.in_flight[actor] = self.version
        fut = self.actors[actor].rpc_async(timeout=300).play(
            self.published[self.version], self.version, self.args.episodes)
        self.futures[actor] = fut
        fut.add_done_callback(lambda _f, a=actor: self.arrivals.put(a))

    def retire_unused_versions(self) -> None:
        for version in [v for v in self.published if v != self.version and v not in self.in_flight.values()]:
            handle = self.published.pop(version)
            if isinstance(handle, hop.ObjectRef):
                hop.delete(handle)

    def train_on(self, trajectories: list[torch.Tensor]) -> None:
        batch = torch.cat(trajectories)
        obs, actions, returns = batch[:, :4], batch[:, 4].long(), batch[:, 5]
        advantages = (returns - returns.mean()) / (returns.std() + 1e-8)
        logp = torch.log_softmax(self.policy(obs), dim=-1).gather(1, actions[:, None]).squeeze(1)
        loss = -(logp * advantages).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def mean_recent_reward(self, last: int = 50) -> float:
        recent = [r for _, r in self.history[-last:]]
        return sum(recent) / max(len(recent), 1)

    def run(self) -> bool:
        from tqdm import tqdm

        args = self.args
        start = time.monotonic()
        self.publish()
        for actor in range(len(self.actors)):
            self.launch(actor)
        solved = False
        bar = tqdm(total=args.iterations, desc=f"learner ({args.transport})", unit="it")
        for _ in range(args.iterations):
            t0 = time.monotonic()
            ready = [self.arrivals.get(timeout=300) for _ in range(args.k)]
            trajectories = []
            for actor in ready:
                handle, rewards, _ = self.futures.pop(actor).wait()
                del self.in_flight[actor]
                if isinstance(handle, hop.ObjectRef):
                    trajectories.append(hop.get(handle, timeout=120).wait())
                    hop.delete(handle)
                else:
                    trajectories.append(handle)
                now = time.monotonic() - start
                self.history.extend((now, r) for r in rewards)
            self.train_on(trajectories)
            self.version += 1
            self.publish()
            for actor in ready:
                self.launch(actor)
            self.retire_unused_versions()
            self.iteration_times.append(time.monotonic() - t0)
            bar.update()
            bar.set_postfix(reward=f"{self.mean_recent_reward():.0f}", episodes=len(self.history))
            if args.target and len(self.history) >= 50 and self.mean_recent_reward() >= args.target:
                solved = True
                break
        bar.close()
        for actor in list(self.futures):
            self.futures.pop(actor).wait()
        self.in_flight.clear()
        self.version += 1
        self.retire_unused_versions()
        return solved


def write_results(learner: Learner, solved: bool, seconds: float, out_dir: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args = learner.args
    os.makedirs(out_dir, exist_ok=True)
    times = [t for t, _ in learner.history]
    rewards = [r for _, r in learner.history]
    window = 20
    smooth = [sum(rewards[max(0, i - window + 1): i + 1]) / len(rewards[max(0, i - window + 1): i + 1])
              for i in range(len(rewards))]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.scatter(times, rewards, s=4, alpha=0.3, label="episode")
    ax.plot(times, smooth, color="C1", label=f"mean of last {window}")
    if args.target:
        ax.axhline(args.target, color="grey", linestyle="--", label=f"target {args.target:g}")
    ax.set_xlabel("seconds")
    ax.set_ylabel("episode reward")
    ax.set_title(f"{ENV}: 1 learner, {args.actors} actors, first {args.k} of {args.actors} ({args.transport})")
    ax.legend(loc="upper left")
    fig.tight_layout()
    base = os.path.join(out_dir, f"rl_actor_learner_{args.transport}")
    fig.savefig(base + ".png", dpi=110)
    iterations = sorted(learner.iteration_times)
    with open(base + ".json", "w") as f:
        json.dump({
            "env": ENV, "transport": args.transport, "actors": args.actors, "k": args.k,
            "policy_bytes": parse_size(args.policy_bytes, "--policy-bytes"), "episodes": len(rewards),
            "iterations": len(iterations), "seconds": seconds, "solved": solved, "target": args.target,
            "mean_last_50": learner.mean_recent_reward(),
            "iteration_s_median": iterations[len(iterations) // 2] if iterations else None,
            "iteration_s": learner.iteration_times, "rewards": rewards, "times_s": times,
            "offload": hop_rpc.offload_stats(),
        }, f)
    print(f"wrote {base}.png and {base}.json")


def run(rank: int, world_size: int, args) -> None:
    torch.set_num_threads(1)
    name = "learner" if rank == 0 else f"actor{rank}"
    hop.init(timeout=300)
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=tensorpipe_options(args, 300))
    if args.transport == "offload":
        hop_rpc.enable("1MiB")
    if rank == 0:
        learner = Learner(args, [f"actor{r}" for r in range(1, world_size)])
        start = time.monotonic()
        solved = learner.run()
        seconds = time.monotonic() - start
        print(f"learner: {len(learner.history)} episodes, {len(learner.iteration_times)} iterations in "
              f"{seconds:.1f} s; mean reward of the last 50 episodes {learner.mean_recent_reward():.1f}"
              + (f" (target {args.target:g}: {'reached' if solved else 'NOT reached'})" if args.target else ""))
        if args.out_dir:
            write_results(learner, solved, seconds, args.out_dir)
        learner.actors.clear()  # the RRefs go before RPC does
        args.failed = bool(args.target) and not solved
    hop_rpc.disable(timeout=30)  # while RPC still carries the receivers' releases
    rpc.shutdown()
    hop.shutdown()
    if rank == 0 and args.failed:
        raise SystemExit(1)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, default=3)
    parser.add_argument("--k", type=int, default=None, help="trajectories per update (default: actors - 1)")
    parser.add_argument("--episodes", type=int, default=4, help="episodes an actor plays per call")
    parser.add_argument("--iterations", type=int, default=400, help="most updates")
    parser.add_argument("--target", type=float, default=475.0, help="mean reward of the last 50 episodes (0: none)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--transport", choices=["hoplite", "rpc", "offload"], default="hoplite",
                        help="hoplite: ObjectRefs; rpc: tensors in the messages; offload: the same with "
                             "torch_hoplite.rpc.enable()")
    parser.add_argument("--policy-bytes", default="0", help="ballast added to the published weights, e.g. 64MB")
    add_tensorpipe_arguments(parser)
    parser.add_argument("--out-dir", default=RESULTS, help="where the PNG and JSON go ('' for none)")
    args = parser.parse_args(argv)
    args.k = args.k or max(1, args.actors - 1)
    if not 1 <= args.k <= args.actors:
        parser.error(f"--k must be between 1 and --actors ({args.actors})")
    args.failed = False
    launch(run, args.actors + 1, args)


if __name__ == "__main__":
    main()
