"""Samples per second per rank: a local buffer in each rank vs one Ray-backed buffer they share.

Paths, all timed in the same run (RL transitions, batch ``B``, a full buffer):

* ``local_raw``: a bare ``rb.sample(B)`` loop on a local buffer, the ceiling.
* ``local_seed``: torchrl's ``TorchRLBufferDataset`` + ``DataLoader(batch_size=B)``.
* ``local_datamodule``: ``ReplayBufferDataModule(rb).train_dataloader()`` on that buffer.
* ``ray_raw``: ``rb.sample(B)`` on a ``RayReplayBufferView`` of a buffer actor.
* ``ray_datamodule``: the DataModule's loader over the same view.
* ``ray_datamodule_2ranks``: two processes (as two DDP ranks would) running the DataModule's
  loader over the same actor at once; samples/s of each, averaged.

Ratios are to ``local_raw`` and ``local_seed`` of the same run (medians over ``--repeats``).
The Ray cluster is local (loopback); across machines add the network: one ``B``-item batch
is ``B * item_bytes`` on the wire per sample call.

Run from the repository root::

    python benchmarks/scale.py --quick
    python benchmarks/scale.py --batch-size 256 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

torch.set_num_threads(1)

from tensordict import TensorDict  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
)

from rb_lightning import ReplayBufferDataModule  # noqa: E402

BUFFER_NAME = "rb_lightning_scale_benchmark"


def transitions(n: int) -> TensorDict:
    return TensorDict(
        {
            "obs": torch.randn(n, 4),
            "action": torch.randint(0, 2, (n,)),
            "next": {"obs": torch.randn(n, 4), "reward": torch.randn(n, 1)},
        },
        batch_size=[n],
    )


def _sampler(kind: str, capacity: int) -> Callable[[], Any]:
    if kind == "prioritized":
        return partial(PrioritizedSampler, capacity, alpha=0.6, beta=0.4)
    return RandomSampler


def samples_per_s(next_batch: Callable[[], Any], batch_size: int, seconds: float) -> float:
    next_batch()  # warm-up
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next_batch()
        count += 1
    return count * batch_size / (time.perf_counter() - start)


def _loop(iterator: Iterator[Any]) -> Callable[[], Any]:
    return lambda: next(iterator)


def _datamodule_loop(rb: ReplayBuffer, batch_size: int) -> Callable[[], Any]:
    dm = ReplayBufferDataModule(rb, batch_size=batch_size, num_batches=None)
    return _loop(iter(dm.train_dataloader()))


def _seed_loop(rb: ReplayBuffer, batch_size: int) -> Callable[[], Any]:
    from torchrl.modules.llm.trl_interop import TorchRLBufferDataset

    dataset = TorchRLBufferDataset(rb, batch_size, num_batches=None)
    return _loop(iter(DataLoader(dataset, batch_size=batch_size)))


def rank_main(address: str, batch_size: int, seconds: float) -> None:
    """One 'rank' process: the DataModule's loader over the shared buffer."""
    from rb_lightning.distributed.ray import RayReplayBufferView

    view = RayReplayBufferView(BUFFER_NAME, address=address)
    rate = samples_per_s(_datamodule_loop(view, batch_size), batch_size, seconds)
    print(json.dumps({"samples_per_s": rate}))


def two_ranks(address: str, batch_size: int, seconds: float) -> float:
    cmd = [sys.executable, __file__, "--rank", address, "--batch-size", str(batch_size)]
    cmd += ["--seconds", str(seconds)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    rates = [
        json.loads(p.communicate()[0].strip().splitlines()[-1])["samples_per_s"] for p in procs
    ]
    return statistics.mean(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samplers", nargs="+", default=["random", "prioritized"])
    parser.add_argument("--quick", action="store_true", help="1 repeat, 1 s per path")
    parser.add_argument("--rank", metavar="RAY_ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args.rank, args.batch_size, args.seconds)
        return
    if args.quick:
        args.repeats, args.seconds = 1, 1.0

    import ray

    from rb_lightning.distributed.ray import RayReplayBufferView, named_actor_config

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    B, data = args.batch_size, transitions(args.capacity)
    results: dict[str, dict[str, Any]] = {}
    for kind in args.samplers:
        local = ReplayBuffer(
            storage=LazyTensorStorage(args.capacity), sampler=_sampler(kind, args.capacity)()
        )
        local.extend(data)
        owner = ReplayBuffer(
            storage=partial(LazyTensorStorage, args.capacity),
            sampler=_sampler(kind, args.capacity),
            service_backend="ray",
            service_backend_options={"remote_config": named_actor_config(BUFFER_NAME)},
        )
        owner.extend(data)
        view = RayReplayBufferView(BUFFER_NAME)
        runs: dict[str, list[float]] = {}
        for _ in range(args.repeats):
            paths = {
                "local_raw": lambda rb=local: rb.sample(B),
                "local_seed": _seed_loop(local, B),
                "local_datamodule": _datamodule_loop(local, B),
                "ray_raw": lambda rb=view: rb.sample(B),
                "ray_datamodule": _datamodule_loop(view, B),
            }
            for name, step in paths.items():
                runs.setdefault(name, []).append(samples_per_s(step, B, args.seconds))
            runs.setdefault("ray_datamodule_2ranks", []).append(two_ranks(address, B, args.seconds))
        owner.close()
        table = {}
        for name, rates in runs.items():
            table[name] = {
                "samples_per_s": statistics.median(rates),
                "vs_local_raw": statistics.median(
                    r / c for r, c in zip(rates, runs["local_raw"], strict=True)
                ),
                "vs_local_seed": statistics.median(
                    r / c for r, c in zip(rates, runs["local_seed"], strict=True)
                ),
            }
        results[kind] = table
        print(f"\nsampler={kind} B={B} capacity={args.capacity} (samples/s per rank)")
        print(f"{'path':<24}{'samples/s':>12}{'vs raw':>9}{'vs seed':>9}")
        for name, row in table.items():
            print(
                f"{name:<24}{row['samples_per_s']:>12,.0f}"
                f"{row['vs_local_raw']:>9.3f}{row['vs_local_seed']:>9.2f}"
            )
    ray.shutdown()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
