"""Save and load time of a replay buffer in a Lightning checkpoint, against bare torchrl.

Two buffers, both ``LazyTensorStorage``, full:

* ``rl``: ``--rl-items`` RL transitions (obs and next obs float32[8], action
  int64, reward float32, done bool), 1M by default (~82 MB);
* ``tokens``: ``--token-items`` x ``--seq-len`` int64 tokens, 100k x 512 by
  default (~410 MB).

For each, in one process, so the ratios are fair:

* ``bare``: ``rb.dumps(dir)`` and ``ReplayBuffer(...).loads(dir)`` (torchrl alone);
* ``beside``: what a checkpoint of ``ReplayBufferDataModule`` does for a buffer
  over the inline threshold: ``BufferCheckpointIO.save_checkpoint`` (dump to a
  temporary version directory, manifest, rename, ``.ckpt`` write, prune) and
  ``load_checkpoint`` + ``restore_buffer_state`` (manifest check, ``loads``,
  item-count check) into a fresh buffer.

A second table fills the ``rl`` buffer (capacity ``--rl-items``) to 1%, 30% and
100% and adds the bytes each checkpoint writes: ours writes only the filled
rows of a buffer that has not wrapped, bare torchrl ``dumps`` the capacity.

Each number is the median of ``--repeats`` runs, bare and ours alternating; the
ratio is ours / bare.
Run from the repository root::

    python benchmarks/checkpoint.py                              # about 1-2 minutes
    python benchmarks/checkpoint.py --rl-items 100000 --token-items 10000   # quick
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning.checkpoint import BufferCheckpointIO, buffer_state, restore_buffer_state

torch.set_num_threads(1)
logging.getLogger("torchrl").setLevel(logging.WARNING)


def rl_items(n: int) -> TensorDict:
    return TensorDict(
        {
            "obs": torch.randn(n, 8),
            "action": torch.randint(0, 4, (n,)),
            "next": {
                "obs": torch.randn(n, 8),
                "reward": torch.randn(n, 1),
                "done": torch.zeros(n, 1, dtype=torch.bool),
            },
        },
        batch_size=[n],
    )


def token_items(n: int, seq_len: int) -> TensorDict:
    return TensorDict({"tokens": torch.randint(0, 32_000, (n, seq_len))}, batch_size=[n])


def paired_medians(
    bare: Callable[[], None], ours: Callable[[], None], repeats: int, reset: Callable[[], None]
) -> tuple[float, float]:
    """Median seconds of ``bare`` and ``ours``, run alternately so drift hits both alike."""
    times: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(repeats):
        for which, fn in enumerate((bare, ours)):
            reset()
            start = time.perf_counter()
            fn()
            times[which].append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(
    name: str, data: TensorDict, repeats: int, root: Path, capacity: int | None = None
) -> dict[str, float]:
    capacity = data.shape[0] if capacity is None else capacity

    def fresh() -> ReplayBuffer:
        return ReplayBuffer(storage=LazyTensorStorage(capacity))

    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), generator=torch.Generator())
    rb.extend(data)
    bare_dir, ckpt = root / f"{name}-bare", root / f"{name}.ckpt"
    io = BufferCheckpointIO()

    def clear() -> None:
        shutil.rmtree(bare_dir, ignore_errors=True)
        io.remove_checkpoint(ckpt)

    def ours_save() -> None:
        checkpoint = {"DataModule": {"buffer": buffer_state(rb, inline_max_bytes=0)}}
        io.save_checkpoint(checkpoint, ckpt)

    targets: list[ReplayBuffer] = []

    def new_target() -> None:
        targets.clear()
        targets.append(fresh())

    def bare_load() -> None:
        targets[0].loads(bare_dir)

    def ours_load() -> None:
        state = io.load_checkpoint(ckpt)["DataModule"]["buffer"]
        restore_buffer_state(targets[0], state)

    result = dict(
        zip(
            ("bare save", "ours save"),
            paired_medians(lambda: rb.dumps(bare_dir), ours_save, repeats, clear),
            strict=True,
        )
    )
    rb.dumps(bare_dir)
    ours_save()
    result["bare MB"] = dir_bytes(bare_dir) / 1e6
    result["ours MB"] = (dir_bytes(Path(f"{ckpt}.buffer")) + ckpt.stat().st_size) / 1e6
    result.update(
        zip(
            ("bare load", "ours load"),
            paired_medians(bare_load, ours_load, repeats, new_target),
            strict=True,
        )
    )
    assert torch.equal(
        targets[0][:]["obs" if name == "rl" else "tokens"],
        rb[:]["obs" if name == "rl" else "tokens"],
    )
    clear()
    result["MB"] = data.bytes() / 1e6
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rl-items", type=int, default=1_000_000)
    parser.add_argument("--token-items", type=int, default=100_000)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--fills", default="0.01,0.3,1.0", help="fill fractions of the rl buffer, table 2"
    )
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()

    fills = [float(f) for f in args.fills.split(",")]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="rb_ckpt_bench-") as tmp:
        by_fill = {
            fill: measure(
                "rl",
                rl_items(max(1, int(args.rl_items * fill))),
                args.repeats,
                Path(tmp),
                capacity=args.rl_items,
            )
            for fill in fills
        }
        rows = {
            f"rl {args.rl_items:,} transitions": measure(
                "rl", rl_items(args.rl_items), args.repeats, Path(tmp)
            ),
            f"tokens {args.token_items:,} x {args.seq_len}": measure(
                "tokens", token_items(args.token_items, args.seq_len), args.repeats, Path(tmp)
            ),
        }
    print(f"median of {args.repeats}; ratio = ours / bare torchrl dumps|loads")
    print(
        "| buffer | MB | bare save s | ours save s | save ratio | bare load s | ours load s | load ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['MB']:.0f} | {r['bare save']:.2f} | {r['ours save']:.2f} | "
            f"{r['ours save'] / r['bare save']:.2f} | {r['bare load']:.2f} | "
            f"{r['ours load']:.2f} | {r['ours load'] / r['bare load']:.2f} |"
        )
    print()
    print(
        f"rl buffer of capacity {args.rl_items:,}, filled to a fraction; MB written per checkpoint"
    )
    print(
        "| full | bare MB | ours MB | size ratio | bare save s | ours save s | save ratio "
        "| bare load s | ours load s | load ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for fill, r in by_fill.items():
        print(
            f"| {fill:.0%} | {r['bare MB']:.1f} | {r['ours MB']:.1f} | "
            f"{r['ours MB'] / r['bare MB']:.2f} | {r['bare save']:.3f} | {r['ours save']:.3f} | "
            f"{r['ours save'] / r['bare save']:.2f} | {r['bare load']:.3f} | "
            f"{r['ours load']:.3f} | {r['ours load'] / r['bare load']:.2f} |"
        )


if __name__ == "__main__":
    main()
