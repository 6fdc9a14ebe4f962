"""Samples per second per rank: a local buffer in each rank vs one Ray-backed buffer they share.

Paths, all timed in the same run (RL transitions, batch ``B``, a full buffer):

* ``local_raw``: a bare ``rb.sample(B)`` loop on a local buffer, the ceiling.
* ``local_seed``: torchrl's ``TorchRLBufferDataset`` + ``DataLoader(batch_size=B)``.
* ``local_datamodule``: ``ReplayBufferDataModule(rb).train_dataloader()`` on that buffer.
* ``ray_raw``: ``rb.sample(B)`` on a ``RayReplayBufferView`` of a buffer actor.
* ``ray_datamodule``: the DataModule's loader over the same view, one call to the actor per
  batch, each answered before the next is sent (``requests_in_flight=1,
  batches_per_request=1``).
* ``ray_datamodule_k{k}``: ``k`` calls in flight, one batch each.
* ``ray_datamodule_k{k}_m{m}``: ``k`` calls in flight, ``m`` batches each (the defaults).
* ``ray_datamodule_2ranks`` / ``..._2ranks_k{k}_m{m}``: two processes (as two DDP ranks would)
  running the DataModule's loader over the same actor at once; samples/s of each, averaged.

Ratios are to ``local_raw`` and ``local_seed`` of the same run (medians over ``--repeats``).
For the Ray paths, ``actor_cpu`` and ``trainer_cpu`` are the CPU time the buffer actor's
process and the sampling process(es) used per second of the run (1.0 = one core busy), and
``projected`` is samples/s per rank scaled until the busiest process (the actor, or one rank)
uses a whole core: what a machine with a free core for each would reach, if nothing else
bounds it first.
The Ray cluster is local (loopback); across machines add the network: one ``B``-item batch
is ``B * item_bytes`` on the wire per sample call.

Run from the repository root::

    python benchmarks/scale.py --quick
    python benchmarks/scale.py --batch-size 256 --repeats 3
    python benchmarks/scale.py --skip-local --in-flight 1 2 4 8   # the Ray paths only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import psutil
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
from rb_lightning.stream.remote_prefetch import DEFAULT_BATCHES_PER_REQUEST  # noqa: E402

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


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def with_cpu(run: Callable[[], float], actor: psutil.Process) -> tuple[float, float, float]:
    """``run()``'s samples/s, and CPU per second of the actor and of this process meanwhile."""
    me = psutil.Process()
    actor_0, me_0, start = _cpu_s(actor), _cpu_s(me), time.perf_counter()
    rate = run()
    wall = time.perf_counter() - start
    return rate, (_cpu_s(actor) - actor_0) / wall, (_cpu_s(me) - me_0) / wall


def rank_main(
    address: str, batch_size: int, seconds: float, in_flight: int, per_request: int
) -> None:
    """One 'rank' process: the DataModule's loader over the shared buffer."""
    from rb_lightning.distributed.ray import RayReplayBufferView

    view = RayReplayBufferView(
        BUFFER_NAME, address=address, requests_in_flight=in_flight, batches_per_request=per_request
    )
    step = _datamodule_loop(view, batch_size)
    step()  # the first call starts the queue
    me = psutil.Process()
    cpu_0, start = _cpu_s(me), time.time()
    rate = samples_per_s(step, batch_size, seconds)
    end = time.time()
    cpu = (_cpu_s(me) - cpu_0) / (end - start)
    print(json.dumps({"samples_per_s": rate, "cpu": cpu, "start": start, "end": end}))


class _CpuTrace:
    """The actor's CPU seconds, polled in a thread: its use over any window read afterwards."""

    def __init__(self, process: psutil.Process) -> None:
        self.points: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(process,), daemon=True)
        self._thread.start()

    def _poll(self, process: psutil.Process) -> None:
        while not self._stop.wait(0.05):
            self.points.append((time.time(), _cpu_s(process)))

    def use(self, start: float, end: float) -> float:
        self._stop.set()
        self._thread.join()
        inside = [(t, c) for t, c in self.points if start <= t <= end]
        if len(inside) < 2:
            return float("nan")
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def two_ranks(
    address: str,
    batch_size: int,
    seconds: float,
    in_flight: int,
    per_request: int,
    actor: psutil.Process,
) -> tuple[float, float, float]:
    """Samples/s of each of two rank processes (mean), the actor's CPU while both ran, and
    the ranks' CPU (sum)."""
    cmd = [sys.executable, __file__, "--rank", address, "--batch-size", str(batch_size)]
    cmd += ["--seconds", str(seconds), "--in-flight", str(in_flight)]
    cmd += ["--batches-per-request", str(per_request)]
    trace = _CpuTrace(actor)
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    ranks = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    both = max(r["start"] for r in ranks), min(r["end"] for r in ranks)
    rate = statistics.mean(r["samples_per_s"] for r in ranks)
    return rate, trace.use(*both), sum(r["cpu"] for r in ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samplers", nargs="+", default=["random", "prioritized"])
    parser.add_argument(
        "--in-flight", type=int, nargs="+", default=[4], help="k of the ray_datamodule_k paths"
    )
    parser.add_argument("--batches-per-request", type=int, default=DEFAULT_BATCHES_PER_REQUEST)
    parser.add_argument("--skip-local", action="store_true", help="only the Ray paths")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 1 s per path")
    parser.add_argument("--rank", metavar="RAY_ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(
            args.rank, args.batch_size, args.seconds, args.in_flight[0], args.batches_per_request
        )
        return
    if args.quick:
        args.repeats, args.seconds = 1, 1.0

    import ray

    from rb_lightning.distributed.ray import RayReplayBufferView, named_actor_config
    from rb_lightning.torchrl_compat import ray_buffer_actor

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    B, data, M = args.batch_size, transitions(args.capacity), args.batches_per_request
    K = max(args.in_flight)
    results: dict[str, dict[str, Any]] = {}
    for kind in args.samplers:
        local = ReplayBuffer(
            storage=partial(LazyTensorStorage, args.capacity),
            sampler=_sampler(kind, args.capacity)(),
        )
        local.extend(data)
        owner = ReplayBuffer(
            storage=partial(LazyTensorStorage, args.capacity),
            sampler=_sampler(kind, args.capacity),
            service_backend="ray",
            service_backend_options={"remote_config": named_actor_config(BUFFER_NAME)},
        )
        owner.extend(data)
        actor = psutil.Process(
            ray.get(ray_buffer_actor(owner).__ray_call__.remote(lambda rb: os.getpid()))
        )

        def view(k: int, m: int) -> ReplayBuffer:
            return RayReplayBufferView(BUFFER_NAME, requests_in_flight=k, batches_per_request=m)

        runs: dict[str, list[float]] = {}
        cpu: dict[str, list[tuple[float, float]]] = {}
        for _ in range(args.repeats):
            paths: dict[str, Callable[[], Any]] = {"local_raw": partial(local.sample, B)}
            if not args.skip_local:
                paths["local_seed"] = _seed_loop(local, B)
                paths["local_datamodule"] = _datamodule_loop(local, B)
            remote: dict[str, Callable[[], Any]] = {
                "ray_raw": partial(view(1, 1).sample, B),
                "ray_datamodule": _datamodule_loop(view(1, 1), B),
            }
            for k in args.in_flight:
                if k > 1:
                    remote[f"ray_datamodule_k{k}"] = _datamodule_loop(view(k, 1), B)
                remote[f"ray_datamodule_k{k}_m{M}"] = _datamodule_loop(view(k, M), B)
            for name, step in paths.items():
                runs.setdefault(name, []).append(samples_per_s(step, B, args.seconds))
            for name, step in remote.items():
                rate, actor_cpu, trainer_cpu = with_cpu(
                    partial(samples_per_s, step, B, args.seconds), actor
                )
                runs.setdefault(name, []).append(rate)
                cpu.setdefault(name, []).append((actor_cpu, trainer_cpu))
            for name, (k, m) in {
                "ray_datamodule_2ranks": (1, 1),
                f"ray_datamodule_2ranks_k{K}_m{M}": (K, M),
            }.items():
                rate, actor_cpu, trainer_cpu = two_ranks(address, B, args.seconds, k, m, actor)
                runs.setdefault(name, []).append(rate)
                cpu.setdefault(name, []).append((actor_cpu, trainer_cpu))
        owner.close()
        table = {}
        for name, rates in runs.items():
            row = {
                "samples_per_s": statistics.median(rates),
                "vs_local_raw": statistics.median(
                    r / c for r, c in zip(rates, runs["local_raw"], strict=True)
                ),
            }
            if name in cpu:
                row["actor_cpu"] = statistics.median(a for a, _ in cpu[name])
                row["trainer_cpu"] = statistics.median(t for _, t in cpu[name])
                # Each process on a core of its own: the busiest one (the actor, or one
                # rank) reaches 1.0 and the rest scale with it.
                ranks = 2 if "2ranks" in name else 1
                busiest = max(row["actor_cpu"], row["trainer_cpu"] / ranks)
                row["projected_samples_per_s"] = row["samples_per_s"] / busiest
            table[name] = row
        results[kind] = table
        print(f"\nsampler={kind} B={B} capacity={args.capacity} (samples/s per rank)")
        print(
            f"{'path':<30}{'samples/s':>12}{'vs raw':>9}{'actor cpu':>11}{'trainer cpu':>13}"
            f"{'projected':>12}"
        )
        for name, row in table.items():
            cpus = ""
            if "actor_cpu" in row:
                cpus = f"{row['actor_cpu']:>11.2f}{row['trainer_cpu']:>13.2f}"
                cpus += f"{row['projected_samples_per_s']:>12,.0f}"
            print(f"{name:<30}{row['samples_per_s']:>12,.0f}{row['vs_local_raw']:>9.3f}{cpus}")
    ray.shutdown()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
