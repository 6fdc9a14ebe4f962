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

``--verification`` measures instead what the per-file checksums cost, for full
buffers of ``--verify-mb`` megabytes (transitions with float32[64] observation and
next observation; full, so written whole through torchrl's checkpointer, and half
full, written as filled rows by rb_lightning): the dump with and without checksums
(``dump_buffer(checksums=...)``, no ``fsync``), the whole save as a checkpoint makes
it (``write_version``: dump, ``fsync``, rename), and the load into a fresh buffer
with ``verify="full"``, ``"size"`` and ``"none"``: into a buffer already allocated
(the copy alone), and into a new buffer, as a resume does. ``verify alone`` is
``read_manifest(verify="full")`` by itself. Page cache warm (the files were just
written).
``--incremental`` measures chunked saves (``BufferCheckpointIO(incremental=True)``)
against today's full save, in one run, for a ``LazyMemmapStorage`` buffer of
``--incremental-gb`` gigabytes (2 KB transitions) that has wrapped, with
``--changed`` of its rows (1%) rewritten between saves and the 5 newest checkpoints
kept (the older removed as ``ModelCheckpoint(save_top_k=5)`` does): the training
thread's stall per save, the bytes written per save against the changed rows' bytes,
the disk the kept checkpoints use against one full copy, and the resume time.
Run from the repository root::

    python benchmarks/checkpoint.py                              # about 1-2 minutes
    python benchmarks/checkpoint.py --rl-items 100000 --token-items 10000   # quick
    python benchmarks/checkpoint.py --verification --verify-mb 100,1000   # about 3 minutes
    python benchmarks/checkpoint.py --incremental --incremental-gb 0.5,2  # about 3 minutes
    python benchmarks/checkpoint.py --main-job --main-steps 2000          # about 2 minutes

``--main-job`` runs the main job's setup (``configs/cartpole_dqn.yaml``: DQN, a
prioritized buffer of 1,000 transitions, 16 CartPoles collected every 128 steps) for
``--main-steps`` steps with ``last.ckpt`` saved every 100 steps, once as today (the
buffer inside the ``.ckpt``) and once chunked (``checkpoint_inline_max_bytes=0``,
``BufferCheckpointIO(incremental=True)``), and reports the training thread's stall per
save (the time Lightning's ``ModelCheckpoint`` spends saving) and its share of the run.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rb_lightning.buffers.reader import load_buffer
from rb_lightning.buffers.state import buffer_state, restore_buffer_state
from rb_lightning.lightning.checkpoint_io import BufferCheckpointIO
from rb_lightning.persist.dumps import dump_buffer
from rb_lightning.persist.files import write_version
from rb_lightning.persist.manifest import read_manifest

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
    """Median seconds of ``bare`` and ``ours``, run alternately so drift hits both alike.

    The order flips every repeat (the first of a pair can pay for the pages the other
    left behind), and dirty pages are flushed (``os.sync``) before each run, so a run
    does not pay for the writeback of the one before.
    """
    times: dict[int, list[float]] = {0: [], 1: []}
    for repeat in range(repeats):
        order = (0, 1) if repeat % 2 == 0 else (1, 0)
        for which in order:
            reset()
            os.sync()
            start = time.perf_counter()
            (bare, ours)[which]()
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


def wide_items(n: int) -> TensorDict:
    """Transitions of ~530 bytes: float32[64] observation and next observation."""
    return TensorDict(
        {
            "id": torch.arange(n),
            "obs": torch.randn(n, 64),
            "action": torch.randint(0, 4, (n,)),
            "next": {
                "obs": torch.randn(n, 64),
                "reward": torch.randn(n, 1),
                "done": torch.zeros(n, 1, dtype=torch.bool),
            },
        },
        batch_size=[n],
    )


def measure_verification(megabytes: int, fill: float, repeats: int, root: Path) -> dict[str, float]:
    """Save and load seconds with and without checksums for a buffer of ``megabytes`` MB."""
    per_item = wide_items(1).bytes()
    capacity = int(megabytes * 1e6 / per_item)
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), generator=torch.Generator())
    rb.extend(wide_items(int(capacity * fill)))
    result: dict[str, float] = {"MB": rb[:].bytes() / 1e6}
    dumps = root / f"dumps-{megabytes}"

    def clear() -> None:
        shutil.rmtree(dumps, ignore_errors=True)
        dumps.mkdir()

    def dump(checksums: bool) -> Callable[[], None]:
        return lambda: dump_buffer(rb, dumps / "dump", checksums=checksums) and None

    without, with_ = paired_medians(dump(False), dump(True), repeats, clear)
    result.update({"dump": without, "dump+xxh3": with_})
    saved = paired_medians(
        lambda: write_version(dumps, lambda path: dump_buffer(rb, path, checksums=False)) and None,
        lambda: write_version(dumps, lambda path: dump_buffer(rb, path)) and None,
        repeats,
        clear,
    )
    result.update({"save": saved[0], "save+xxh3": saved[1]})

    clear()
    version, _ = write_version(dumps, lambda path: dump_buffer(rb, path))
    # One target, allocated by a first load: a fresh 1 GB allocation per load costs
    # 0.5-3 s on this VM (page faults), which would hide what verification adds.
    target = ReplayBuffer(storage=LazyTensorStorage(capacity))
    load_buffer(target, dumps / version)

    def load(verify: str) -> Callable[[], None]:
        return lambda: load_buffer(target, dumps / version, verify=verify) and None  # type: ignore[arg-type]

    none, full = paired_medians(load("none"), load("full"), repeats, lambda: None)
    _, size = paired_medians(load("none"), load("size"), repeats, lambda: None)
    alone, _ = paired_medians(
        lambda: read_manifest(dumps / version, verify="full") and None,
        lambda: None,
        repeats,
        lambda: None,
    )
    result.update({"load none": none, "load size": size, "load full": full, "verify": alone})

    # What a resume does: load into a new, empty buffer.
    fresh: list[ReplayBuffer] = []

    def new_buffer() -> None:
        fresh.clear()
        fresh.append(ReplayBuffer(storage=LazyTensorStorage(capacity)))

    def resume(verify: str) -> Callable[[], None]:
        return lambda: load_buffer(fresh[0], dumps / version, verify=verify) and None  # type: ignore[arg-type]

    result["resume none"], result["resume full"] = paired_medians(
        resume("none"), resume("full"), repeats, new_buffer
    )
    assert torch.equal(target[:]["next", "obs"], rb[:]["next", "obs"])
    shutil.rmtree(dumps, ignore_errors=True)
    return result


def verification_main(args: argparse.Namespace) -> None:
    sizes = [int(mb) for mb in args.verify_mb.split(",")]
    rows = {}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="rb_ckpt_bench-") as tmp:
        for megabytes in sizes:
            for fill, kind in ((1.0, "full (torchrl writes)"), (0.5, "half (filled rows)")):
                rows[(megabytes, kind)] = measure_verification(
                    megabytes, fill, args.repeats, Path(tmp)
                )
    print(f"median of {args.repeats}; seconds; +x% = added by the checksums")
    print(
        "| buffer | MB written | dump s | dump + xxh3 s | added | save (fsync) s | "
        "save + xxh3 s | added | load none s | load size s | load full s | added | "
        "verify alone s | resume none s | resume full s | added |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (megabytes, kind), r in rows.items():

        def added(base: str, more: str, r: dict[str, float] = r) -> str:
            return f"{(r[more] / r[base] - 1) * 100:+.0f}%"

        print(
            f"| {megabytes:,} MB, {kind} | {r['MB']:.0f} | {r['dump']:.2f} | "
            f"{r['dump+xxh3']:.2f} | {added('dump', 'dump+xxh3')} | {r['save']:.2f} | "
            f"{r['save+xxh3']:.2f} | {added('save', 'save+xxh3')} | {r['load none']:.2f} | "
            f"{r['load size']:.2f} | {r['load full']:.2f} | {added('load none', 'load full')} | "
            f"{r['verify']:.3f} | {r['resume none']:.2f} | {r['resume full']:.2f} | "
            f"{added('resume none', 'resume full')} |"
        )


def wide_transitions(n: int, obs: int = 248) -> TensorDict:
    """``n`` transitions of about 2 KB (observation and next observation float32[obs])."""
    return TensorDict(
        {
            "obs": torch.rand(n, obs),
            "action": torch.randint(0, 4, (n,)),
            "next": {
                "obs": torch.rand(n, obs),
                "reward": torch.rand(n, 1),
                "done": torch.zeros(n, 1, dtype=torch.bool),
            },
        },
        batch_size=[n],
    )


def measure_incremental(
    gigabytes: float, changed: float, saves: int, keep: int, repeats: int, root: Path
) -> dict[str, float]:
    """Full save (today) against chunked saves of one wrapped memory-mapped buffer; see the module doc."""
    from torchrl.data import LazyMemmapStorage

    batch = wide_transitions(16_384)
    row_bytes = int(batch.bytes()) // 16_384
    capacity = int(gigabytes * 1e9) // row_bytes
    changed_rows = max(1, int(capacity * changed))

    def new_buffer(scratch: str) -> ReplayBuffer:
        storage = LazyMemmapStorage(capacity, scratch_dir=root / scratch)
        return ReplayBuffer(storage=storage, generator=torch.Generator().manual_seed(0))

    rb = new_buffer("scratch")
    while rb.write_count < capacity + capacity // 3:  # wrapped: the cursor is a third in
        rb.extend(batch)

    def rewrite() -> None:  # ``changed`` of the rows, as an online job writes between saves
        left = changed_rows
        while left:
            rb.extend(batch[: min(left, 16_384)])
            left -= min(left, 16_384)

    def checkpoint() -> dict:
        return {"optimizer_states": [], "dm": {"buffer": buffer_state(rb, inline_max_bytes=0)}}

    def resume(path: Path) -> float:
        # In a new process, as a resume is: this one's heap (every buffer and checkpoint made
        # above) would make Python's garbage collector, not the load, the measured cost.
        os.sync()
        probe = [sys.executable, __file__, "--resume-probe", str(path), "--probe-capacity"]
        output = subprocess.run(
            [*probe, str(capacity), "--dir", str(root / "resumed")],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        shutil.rmtree(root / "resumed", ignore_errors=True)
        return float(output.strip().splitlines()[-1])

    full_dir, chunked_dir = root / "full", root / "chunked"
    full_io = BufferCheckpointIO()
    full_saves = []
    for _ in range(repeats):
        rewrite()
        os.sync()
        start = time.perf_counter()
        full_io.save_checkpoint(checkpoint(), full_dir / "last.ckpt")
        full_saves.append(time.perf_counter() - start)
    full_bytes = dir_bytes(full_dir)

    io = BufferCheckpointIO(incremental=True)
    store = chunked_dir / "buffer-chunks"
    stalls, totals, written = [], [], []
    for number in range(saves + 1):
        if number:
            rewrite()
        before = {p.name: dir_bytes(p) for p in store.iterdir()} if store.is_dir() else {}
        os.sync()
        start = time.perf_counter()
        io.save_checkpoint(checkpoint(), chunked_dir / f"step-{number}.ckpt")
        stall = time.perf_counter() - start
        io.teardown()  # waits for the writer thread: the save is complete on disk
        total = time.perf_counter() - start
        if number >= keep:  # ModelCheckpoint(save_top_k=keep) removes the oldest
            io.remove_checkpoint(chunked_dir / f"step-{number - keep}.ckpt")
        new_chunks = sum(dir_bytes(p) for p in store.iterdir() if p.name not in before)
        version = dir_bytes(Path(f"{chunked_dir / f'step-{number}.ckpt'}.buffer"))
        ckpt = (chunked_dir / f"step-{number}.ckpt").stat().st_size
        if number:  # the first save writes every row
            stalls.append(stall)
            totals.append(total)
            written.append(new_chunks + version + ckpt)
    kept_bytes = dir_bytes(chunked_dir)
    # Both resumes alternate, order flipped every repeat, so drift hits both alike.
    resumes: dict[str, list[float]] = {"full": [], "chunked": []}
    paths = {"full": full_dir / "last.ckpt", "chunked": chunked_dir / f"step-{saves}.ckpt"}
    for repeat in range(repeats):
        for which in ("full", "chunked") if repeat % 2 == 0 else ("chunked", "full"):
            resumes[which].append(resume(paths[which]))
    full_resume = statistics.median(resumes["full"])
    chunked_resume = statistics.median(resumes["chunked"])
    shutil.rmtree(full_dir)
    shutil.rmtree(chunked_dir)
    shutil.rmtree(root / "scratch", ignore_errors=True)
    return {
        "GB": capacity * row_bytes / 1e9,
        "rows": capacity,
        "changed MB": changed_rows * row_bytes / 1e6,
        "full save": statistics.median(full_saves),
        "full MB": full_bytes / 1e6,
        "stall": statistics.median(stalls),
        "stall max": max(stalls),
        "background": statistics.median(totals),
        "written MB": statistics.median(written) / 1e6,
        "kept GB": kept_bytes / 1e9,
        "copy GB": full_bytes / 1e9,
        "full resume": full_resume,
        "chunked resume": chunked_resume,
    }


def main_job_stalls(steps: int, incremental: bool, root: Path) -> dict[str, float]:
    """Stall per save and share of the fit of the main job's setup, saving every 100 steps."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torchrl.data import PrioritizedSampler, TensorDictReplayBuffer

    from rb_lightning import ReplayBufferDataModule
    from rb_lightning.rl import DQN, OnlineCollector, TorchThreads

    stalls: list[float] = []

    class TimedCheckpoint(ModelCheckpoint):
        def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
            start = time.perf_counter()
            super()._save_checkpoint(trainer, filepath)
            stalls.append(time.perf_counter() - start)

    L.seed_everything(0)
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(1000), sampler=PrioritizedSampler(1000, alpha=0.6, beta=0.4)
    )
    model = DQN(
        4, 2, hidden_sizes=[128], activation="relu", td_loss="mse", lr=0.01, gamma=0.99,
        double_dqn=False, target_update_interval=10, tau=1.0, eps_start=1.0, eps_end=0.01,
        eps_decay_steps=1000,
    )  # fmt: skip
    collector = OnlineCollector(
        "CartPole-v1", env_kwargs={"categorical_action_encoding": True}, num_envs=16,
        init_random_frames=1000, frames_per_step=256, every_n_steps=128, return_window=10,
        n_steps=3, keys=["observation", "action", ("next", "observation"),
                         ("next", "reward"), ("next", "terminated"), "steps_to_next_obs"],
    )  # fmt: skip
    checkpoint = TimedCheckpoint(
        dirpath=root / "main-job", save_last=True, save_top_k=0, every_n_train_steps=100
    )
    trainer = L.Trainer(
        max_steps=steps, limit_train_batches=100, max_epochs=-1, logger=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, callbacks=[TorchThreads(1), collector, checkpoint],
        plugins=[BufferCheckpointIO(incremental=True)] if incremental else None,
    )  # fmt: skip
    datamodule = ReplayBufferDataModule(
        buffer, batch_size=16, num_batches=None,
        checkpoint_inline_max_bytes=0 if incremental else 64 * 1024**2,
    )  # fmt: skip
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule)
    wall = time.perf_counter() - start
    shutil.rmtree(root / "main-job", ignore_errors=True)
    return {
        "saves": len(stalls),
        "stall": statistics.median(stalls),
        "stall max": max(stalls),
        "share": sum(stalls) / wall,
        "wall": wall,
    }


def main_job_main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="rb_ckpt_bench-") as tmp:
        rows = {
            "today (inside the .ckpt)": main_job_stalls(args.main_steps, False, Path(tmp)),
            "chunked, in the background": main_job_stalls(args.main_steps, True, Path(tmp)),
        }
    print(f"main job's setup, {args.main_steps} steps, last.ckpt every 100 steps")
    print("| save | saves | stall per save ms (max) | share of the run | run s |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['saves']:.0f} | {1000 * r['stall']:.1f} ({1000 * r['stall max']:.1f}) "
            f"| {r['share']:.2%} | {r['wall']:.1f} |"
        )


def resume_probe(args: argparse.Namespace) -> None:
    """Print the seconds a resume of ``--resume-probe`` takes into a new memory-mapped buffer."""
    from torchrl.data import LazyMemmapStorage

    path = Path(args.resume_probe)
    storage = LazyMemmapStorage(args.probe_capacity, scratch_dir=args.dir)
    target = ReplayBuffer(storage=storage, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    state = BufferCheckpointIO().load_checkpoint(path, weights_only=True)["dm"]["buffer"]
    restore_buffer_state(target, state, path)
    print(time.perf_counter() - start)


def incremental_main(args: argparse.Namespace) -> None:
    sizes = [float(size) for size in args.incremental_gb.split(",")]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="rb_ckpt_bench-") as tmp:
        rows = {
            size: measure_incremental(size, args.changed, args.saves, 5, args.repeats, Path(tmp))
            for size in sizes
        }
    print(
        f"wrapped LazyMemmapStorage buffer, {args.changed:.0%} of its rows rewritten between "
        f"saves, {args.saves} chunked saves (median), 5 kept; full save: median of {args.repeats}"
    )
    print(
        "| buffer GB | changed MB | full save s | chunked stall s (max) | stall / full "
        "| chunked save in background s | MB written | written / changed "
        "| 5 kept GB | kept / one copy | full resume s | chunked resume s | resume ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows.values():
        print(
            f"| {r['GB']:.2f} | {r['changed MB']:.1f} | {r['full save']:.2f} | "
            f"{r['stall']:.3f} ({r['stall max']:.3f}) | {r['stall'] / r['full save']:.3f} | "
            f"{r['background']:.2f} | {r['written MB']:.1f} | "
            f"{r['written MB'] / r['changed MB']:.2f} | {r['kept GB']:.2f} | "
            f"{r['kept GB'] / r['copy GB']:.2f} | {r['full resume']:.2f} | "
            f"{r['chunked resume']:.2f} | {r['chunked resume'] / r['full resume']:.2f} |"
        )


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
    parser.add_argument(
        "--verification", action="store_true", help="the cost of checksums (see above)"
    )
    parser.add_argument("--verify-mb", default="100,1000", help="buffer sizes, --verification")
    parser.add_argument(
        "--incremental", action="store_true", help="chunked saves against full ones (see above)"
    )
    parser.add_argument("--incremental-gb", default="2", help="buffer sizes, --incremental")
    parser.add_argument("--changed", type=float, default=0.01, help="rows rewritten per save")
    parser.add_argument("--saves", type=int, default=8, help="chunked saves, --incremental")
    parser.add_argument("--main-job", action="store_true", help="stall of the main job's saves")
    parser.add_argument("--main-steps", type=int, default=2000, help="steps, --main-job")
    parser.add_argument("--resume-probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--probe-capacity", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.resume_probe:
        resume_probe(args)
        return
    if args.verification:
        verification_main(args)
        return
    if args.incremental:
        incremental_main(args)
        return
    if args.main_job:
        main_job_main(args)
        return

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
