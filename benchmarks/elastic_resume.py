"""What resuming per-rank buffers on another number of ranks costs, against the same number.

A DDP checkpoint of ``--saved-ranks`` ranks, each a full prioritized buffer of ``--items`` RL
transitions (obs and next obs float32[8], action int64, reward float32, done bool; the
buffers have wrapped, as a long run's have), written as a checkpoint writes them
(``<ckpt>.buffer/<version>/rank<r>``). Then, for each new world size, the restore of one
new rank (rank 0) into a fresh buffer, as ``ReplayBufferDataModule.load_state_dict`` does it
(``restore_buffer_state`` with ``verify="full"``): with the saved number of ranks each rank
reads its own dump; with another, every rank reads all of them and keeps its share
(:mod:`rb_lightning.persist.elastic`). Medians of ``--repeats`` runs, page cache warm.

Run from the repository root::

    python benchmarks/elastic_resume.py                    # about 1 minute
    python benchmarks/elastic_resume.py --items 20000      # quick
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch
from checkpoint import rl_items  # benchmarks/checkpoint.py: the same transitions
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

from rb_lightning.buffers.state import restore_buffer_state
from rb_lightning.persist.beside import beside_reference, buffer_dir_for
from rb_lightning.persist.dumps import dump_buffer
from rb_lightning.persist.elastic import plan_redistribution
from rb_lightning.persist.record import BufferRecord

torch.set_num_threads(1)
logging.getLogger("torchrl").setLevel(logging.WARNING)


def prioritized(capacity: int) -> ReplayBuffer:
    return ReplayBuffer(
        storage=LazyTensorStorage(capacity),
        sampler=PrioritizedSampler(capacity, alpha=0.6, beta=0.4),
    )


def saved_checkpoint(root: Path, ranks: int, items: int) -> tuple[dict, Path]:
    """The buffer state of a DDP checkpoint of ``ranks`` full buffers, and the ``.ckpt`` path."""
    ckpt = root / "last.ckpt"
    version = buffer_dir_for(ckpt) / "v1"
    for rank in range(ranks):
        rb = prioritized(items)
        index = rb.extend(rl_items(items + items // 3))  # wrapped
        rb.update_priority(index[-items:], torch.rand(items) + 0.1)
        manifest = dump_buffer(
            rb, version / f"rank{rank}", extra={"rank": rank, "world_size": ranks}
        )
    record = beside_reference(buffer_dir_for(ckpt), "v1", manifest, kind="ranks", world_size=ranks)
    return record, ckpt


def restore_seconds(state: dict, ckpt: Path, world_size: int, items: int, repeats: int) -> float:
    capacity = -(-items * int(state["world_size"]) // world_size)  # room for every item
    times = []
    for _ in range(repeats):
        rb = prioritized(capacity)
        start = time.perf_counter()
        record = BufferRecord.from_dict(state)  # as a resumed rank: decide, then restore
        plan = plan_redistribution(record, 0, world_size)
        restore_buffer_state(rb, record, ckpt, rank=0, redistribution=plan)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000, help="items per saved rank")
    parser.add_argument("--saved-ranks", type=int, default=2)
    parser.add_argument("--new-ranks", default="2,1,3,4", help="world sizes to resume on")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state, ckpt = saved_checkpoint(Path(tmp), args.saved_ranks, args.items)
        same = None
        print(f"{args.saved_ranks} saved ranks x {args.items:,} prioritized items")
        print("| resumed on | items on rank 0 | restore of rank 0 (s) | vs same number |")
        print("|---|---|---|---|")
        for world_size in (int(n) for n in args.new_ranks.split(",")):
            seconds = restore_seconds(state, ckpt, world_size, args.items, args.repeats)
            same = seconds if world_size == args.saved_ranks else same
            share = -(-args.items * args.saved_ranks // world_size)
            ratio = f"{seconds / same:.1f}x" if same else "-"
            print(f"| {world_size} | {share:,} | {seconds:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
