"""Items/s per rank and in total: 1 and 2 ranks x 1 and 2 shards x 1 and k requests in flight.

Every configuration samples a :class:`~rb_lightning.distributed.ShardedRayReplayBuffer`
(100k RL transitions spread over the shards, batch ``B``) through
``ReplayBufferDataModule(rb).train_dataloader()`` in one or two rank processes (as DDP
ranks would) on one local Ray instance. The ranks bind the shard actors by name and
measure the same time windows. CPU use of every process (ranks and shard actors) over each
window is read with psutil, so a run bound by the machine's cores shows it; ``projected``
is the total with a core for each process (each one's rate over the share of a core it got,
the slower side bounding; Ray's own daemons left out).

Run from the repository root (about two minutes on 2 cores)::

    python benchmarks/scale_sharded.py
    python benchmarks/scale_sharded.py --in-flight 1 2 4 8 --ranks 1 --shards 1   # choose k
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import psutil
import torch

torch.set_num_threads(1)

from rb_lightning import ReplayBufferDataModule  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from scale import transitions  # noqa: E402

NAME = "rb_lightning_sharded_benchmark"
GAP_S = 0.3


def _buffer(args: argparse.Namespace, shards: int, prioritized: bool, **kw: Any) -> Any:
    from rb_lightning.distributed import ShardedRayReplayBuffer

    return ShardedRayReplayBuffer(
        args.capacity, num_shards=shards, prioritized=prioritized, name=NAME, **kw
    )


def rank_main(args: argparse.Namespace) -> None:
    """One rank: wait for the start time, then one window per (repeat, in_flight)."""
    import ray

    ray.init(address=args.rank, log_to_driver=False)
    rb = _buffer(args, args.shards[0], args.prioritized)
    me = psutil.Process()
    print("ready", flush=True)
    t0 = float(sys.stdin.readline())
    out = []
    for j, k in enumerate(_windows(args)):
        rb.in_flight = k
        loader = iter(
            ReplayBufferDataModule(
                rb, batch_size=args.batch_size, num_batches=None
            ).train_dataloader()
        )
        next(loader)  # fills the pipeline
        start = t0 + j * (args.seconds + GAP_S)
        time.sleep(max(0.0, start - time.time()))
        cpu0, count, t = sum(me.cpu_times()[:2]), 0, time.time()
        while time.time() < start + args.seconds:
            next(loader)
            count += 1
        elapsed = time.time() - t
        out.append(
            {
                "k": k,
                "items_per_s": count * args.batch_size / elapsed,
                "cpu": (sum(me.cpu_times()[:2]) - cpu0) / elapsed,
            }
        )
    print(json.dumps(out), flush=True)


def _windows(args: argparse.Namespace) -> list[int]:
    return [k for _ in range(args.repeats) for k in args.in_flight]


def run_config(
    args: argparse.Namespace,
    ranks: int,
    shards: int,
    prioritized: bool,
    actors: list[psutil.Process],
) -> list[dict[str, Any]]:
    cmd = [
        sys.executable,
        __file__,
        "--rank",
        args.address,
        "--shards",
        str(shards),
        "--batch-size",
        str(args.batch_size),
        "--seconds",
        str(args.seconds),
        "--repeats",
        str(args.repeats),
        "--capacity",
        str(args.capacity),
        "--in-flight",
        *map(str, args.in_flight),
    ] + (["--prioritized"] if prioritized else [])
    procs = [
        subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(ranks)
    ]
    for p in procs:
        while p.stdout.readline().strip() != "ready":
            pass
    t0 = time.time() + 1.0
    for p in procs:
        p.stdin.write(f"{t0}\n")
        p.stdin.flush()
    actor_cpu = []
    for j in range(len(_windows(args))):
        start = t0 + j * (args.seconds + GAP_S)
        time.sleep(max(0.0, start - time.time()))
        before = [sum(a.cpu_times()[:2]) for a in actors]
        time.sleep(args.seconds)
        actor_cpu.append(
            [
                (sum(a.cpu_times()[:2]) - b) / args.seconds
                for a, b in zip(actors, before, strict=True)
            ]
        )
    per_rank = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    rows = []
    for j, k in enumerate(_windows(args)):
        rows.append(
            {
                "k": k,
                "rates": [r[j]["items_per_s"] for r in per_rank],
                "rank_cpu": [r[j]["cpu"] for r in per_rank],
                "actor_cpu": actor_cpu[j],
            }
        )
    return rows


def _projected(row: dict[str, Any], shards: int) -> float:
    """Total items/s with a core for every rank and shard: each process's measured rate
    divided by the share of a core it got, the slowest side (ranks or shards) bounding."""
    ranks_cap = sum(
        rate / max(cpu, 1e-3) for rate, cpu in zip(row["rates"], row["rank_cpu"], strict=True)
    )
    per_shard = sum(row["rates"]) / shards  # sizes are equal: each shard serves its share
    shards_cap = sum(per_shard / max(cpu, 1e-3) for cpu in row["actor_cpu"])
    return min(ranks_cap, shards_cap)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--samplers", nargs="+", default=["uniform", "prioritized"])
    parser.add_argument("--prioritized", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", metavar="RAY_ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args)
        return

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    args.address = ray.get_runtime_context().gcs_address
    data = transitions(args.capacity)
    results = []
    print(
        f"B={args.batch_size}, {args.capacity} items, {psutil.cpu_count()} cores, "
        f"medians of {args.repeats} windows of {args.seconds} s"
    )
    print(
        f"{'sampler':<12}{'shards':>7}{'ranks':>6}{'k':>4}{'per rank':>11}{'total':>11}"
        f"{'rank CPU':>12}{'shard CPU':>12}{'projected':>12}"
    )
    for kind in args.samplers:
        for shards in args.shards:
            rb = _buffer(args, shards, kind == "prioritized")
            for chunk in data.split(10_000):
                rb.extend(chunk)
            actors = [psutil.Process(pid) for pid in rb.shard_pids()]
            for ranks in args.ranks:
                rows = run_config(args, ranks, shards, kind == "prioritized", actors)
                for k in args.in_flight:
                    mine = [r for r in rows if r["k"] == k]
                    per_rank = statistics.median(statistics.mean(r["rates"]) for r in mine)
                    total = statistics.median(sum(r["rates"]) for r in mine)
                    rank_cpu = [
                        statistics.median(r["rank_cpu"][i] for r in mine) for i in range(ranks)
                    ]
                    actor_cpu = [
                        statistics.median(r["actor_cpu"][i] for r in mine) for i in range(shards)
                    ]
                    projected = statistics.median(_projected(r, shards) for r in mine)
                    row = {
                        "sampler": kind,
                        "shards": shards,
                        "ranks": ranks,
                        "k": k,
                        "per_rank": per_rank,
                        "total": total,
                        "rank_cpu": rank_cpu,
                        "shard_cpu": actor_cpu,
                        "projected_total": projected,
                    }
                    results.append(row)
                    print(
                        f"{kind:<12}{shards:>7}{ranks:>6}{k:>4}{per_rank:>11,.0f}"
                        f"{total:>11,.0f}{'/'.join(f'{c:.2f}' for c in rank_cpu):>12}"
                        f"{'/'.join(f'{c:.2f}' for c in actor_cpu):>12}{projected:>12,.0f}",
                        flush=True,
                    )
            rb.close()
    ray.shutdown()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
