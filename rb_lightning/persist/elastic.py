"""Resuming per-rank buffers on another number of ranks: every saved item on exactly one rank.

A DDP run saves one dump per rank. Resumed on another number of processes (decided once,
by :func:`plan_redistribution`), every rank runs :func:`restore_share`: it reads every
saved dump and keeps its share of their union. :func:`dealt_items` depends only on the
saved lengths and the new world size, so the ranks agree without talking: the union is put
oldest first (the saved ranks' newest items aligned, ties by saved rank) and item ``i``
goes to rank ``i % world_size``, written oldest first. When the new buffers cannot hold
every item the resume stops before loading anything (``keep="newest"`` drops the oldest).
Read-ahead batches are dropped and each generator is seeded by :func:`elastic_seed`.

Examples:
    >>> def dealt(rank):  # (saved rank, j-th oldest of that rank)
    ...     saved, oldest_first = dealt_items([4, 2], rank, world_size=3)
    ...     return list(zip(saved.tolist(), oldest_first.tolist()))
    >>> [dealt(rank) for rank in range(3)]
    [[(0, 0), (1, 0)], [(0, 1), (0, 3)], [(0, 2), (1, 1)]]
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torchrl.data import ListStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, SliceSampler
from torchrl.data.replay_buffers.storages import LazyTensorStorage
from torchrl.data.replay_buffers.writers import RoundRobinWriter

from rb_lightning import torchrl_compat
from rb_lightning.errors import BufferCheckpointError, UsageError
from rb_lightning.persist.build import buffer_build, compare_builds
from rb_lightning.persist.layouts import layout_named
from rb_lightning.persist.manifest import (
    TRANSFORM_STATE,
    Layout,
    Verify,
    check_plain_files,
    read_manifest,
)
from rb_lightning.persist.mismatch import unloadable
from rb_lightning.persist.record import RANK_KINDS, BufferRecord, record_dumps

logger = logging.getLogger(__name__)

__all__ = [
    "RESUME_KEEP_MODES",
    "Redistribution",
    "ResumeKeep",
    "check_resume_keep",
    "dealt_items",
    "elastic_seed",
    "plan_redistribution",
    "restore_share",
]

ResumeKeep = Literal["all", "newest"]
RESUME_KEEP_MODES: tuple[str, ...] = ("all", "newest")
#: Dump layouts whose items can be dealt out (the others are written by a Ray buffer's actor).
_DEALABLE: tuple[Layout, ...] = (
    "empty_buffer",
    "filled_rows",
    "whole_storage",
    "list_items",
    "chunked_rows",
)


def check_resume_keep(keep: Any, argument: str = "resume_keep") -> ResumeKeep:
    """``keep`` if it is one of :data:`RESUME_KEEP_MODES`; otherwise a :class:`UsageError`.

    Examples:
        >>> check_resume_keep("newest")
        'newest'
    """
    if keep not in RESUME_KEEP_MODES:
        raise UsageError(
            argument,
            f"{argument}={keep!r} is not a keep mode: use 'all' (a resume on another number "
            "of ranks whose buffers cannot hold every saved item stops with an error, the "
            "default) or 'newest' (it keeps the newest items that fit and drops the oldest).",
        )
    return keep


@dataclass(frozen=True)
class Redistribution:
    """A restore that deals every saved rank's items out to ``world_size`` ranks anew (made once per resume by :func:`plan_redistribution`)."""

    rank: int
    world_size: int
    keep: ResumeKeep = "all"
    seed: int | None = None


def plan_redistribution(
    record: BufferRecord,
    rank: int,
    world_size: int,
    *,
    keep: ResumeKeep = "all",
    stream: dict[str, Any] | None = None,
) -> Redistribution | None:
    """The one decision of a resume: deal the saved items out anew, or restore each rank's own.

    ``None`` when each rank restores its own dump (the record was saved by ``world_size``
    processes, or is a Ray buffer's or a mixture's); otherwise the :class:`Redistribution`,
    seeded by :func:`elastic_seed`.

    Examples:
        >>> ranks = BufferRecord(kind="ranks", world_size=2)
        >>> plan_redistribution(ranks, 0, 3, stream={"seed": 1}).world_size
        3
        >>> plan_redistribution(ranks, 1, 2) is None, plan_redistribution(BufferRecord("inline"), 0, 1)
        (True, None)
    """
    if record.kind not in RANK_KINDS or record.saved_world_size == int(world_size):
        return None
    seed = elastic_seed(stream or {}, rank, world_size)
    return Redistribution(int(rank), int(world_size), check_resume_keep(keep), seed)


def elastic_seed(stream: dict[str, Any], rank: int, world_size: int) -> int:
    """The seed of rank ``rank`` of ``world_size`` after a resume that dealt the items anew.

    A function of the saved stream state (``seed``, ``epoch``, ``position``) and of
    the new rank and world size only: the same resume draws the same batches.

    Examples:
        >>> stream = {"seed": 7, "epoch": 0, "position": 4}
        >>> elastic_seed(stream, 0, 3) == elastic_seed(stream, 0, 3) != elastic_seed(stream, 1, 3)
        True
    """
    seed = 0
    for value in (stream.get("seed", 0), stream.get("epoch", 0), stream.get("position", 0)):
        seed = (seed * 1_000_003 + int(value)) % (2**63 - 1)
    for value in (world_size, rank):
        seed = (seed * 1_000_003 + int(value)) % (2**63 - 1)
    return seed


def dealt_items(
    lengths: Sequence[int], rank: int, world_size: int, keep_last: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The saved items rank ``rank`` of ``world_size`` takes, in the order it writes them.

    Two tensors: each item's saved rank, and its position from that saved
    rank's oldest item (of ``lengths[saved rank]``). See the module's description
    for the order; ``keep_last``: deal only the newest ``keep_last`` items of the union.

    Examples:
        >>> saved, oldest_first = dealt_items([3, 2], rank=0, world_size=2)
        >>> list(zip(saved.tolist(), oldest_first.tolist()))
        [(0, 0), (1, 0), (1, 1)]
    """
    counts = torch.tensor([0, *lengths], dtype=torch.long)[1:]
    saved = torch.repeat_interleave(torch.arange(len(counts)), counts)
    starts = torch.cumsum(counts, 0) - counts
    oldest_first = torch.arange(len(saved)) - starts[saved]
    age = counts[saved] - 1 - oldest_first
    # Stable: items of equal age stay in saved-rank order, as they were concatenated.
    order = torch.sort(-age, stable=True).indices
    if keep_last is not None:
        order = order[max(len(order) - keep_last, 0) :]
    mine = order[rank::world_size]
    return saved[mine], oldest_first[mine]


def restore_share(
    replay_buffer: ReplayBuffer,
    record: BufferRecord | Mapping[str, Any],
    checkpoint_path: str | os.PathLike | None,
    redistribution: Redistribution,
    *,
    verify: Verify = "full",
) -> list[Any]:
    """Replace ``replay_buffer``'s content with this rank's share of every saved buffer.

    Every dump is verified and checked against ``replay_buffer``'s build (the capacity may
    differ) before anything is loaded; priorities move with their items; the saved ranks'
    read-ahead batches are dropped. ``redistribution.keep="all"`` raises
    :class:`BufferCheckpointError` when the shares do not fit, ``"newest"`` drops the oldest.

    Examples:
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage
        >>> from rb_lightning.buffers.state import buffer_state
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(8))
        >>> _ = rb.extend(TensorDict({"x": torch.arange(5)}, batch_size=[5]))
        >>> record = BufferRecord.from_dict(buffer_state(rb))  # one process's, on 2 ranks:
        >>> shares = [ReplayBuffer(storage=LazyTensorStorage(4)) for _ in range(2)]
        >>> for rank, share in enumerate(shares):
        ...     plan = plan_redistribution(record, rank, 2)
        ...     _ = restore_share(share, record, None, plan)
        >>> [share[:]["x"].tolist() for share in shares]
        [[0, 2, 4], [1, 3]]
    """
    record = BufferRecord.of(record)
    rank, world_size = redistribution.rank, redistribution.world_size
    keep, seed = redistribution.keep, redistribution.seed
    with _saved_dumps(record, checkpoint_path) as roots:
        manifests = [read_manifest(root, verify="none") for root in roots]
        lengths = [int(manifest["len"]) for manifest in manifests]
        kept = _kept(lengths, replay_buffer, world_size, keep)
        for root in roots:
            read_manifest(root, verify=verify)
            check_plain_files(root)
        for root, manifest in zip(roots, manifests, strict=True):
            _check_dealable(replay_buffer, root, manifest)
        share = dealt_items(lengths, rank, world_size, kept)
        items, priorities, max_priority = _gather(replay_buffer, roots, manifests, share)
        _write(replay_buffer, roots[0], items, priorities, max_priority)
    if seed is None:
        seed = elastic_seed({}, rank, world_size)
    replay_buffer.set_rng(torch.Generator().manual_seed(int(seed)))
    logger.info(
        "Resumed on %d process(es) a checkpoint of %d: rank %d holds %d of the %d saved items.",
        world_size,
        record.saved_world_size,
        rank,
        len(share[0]),
        sum(lengths),
    )
    return []


@contextlib.contextmanager
def _saved_dumps(
    record: BufferRecord, checkpoint_path: str | os.PathLike | None
) -> Iterator[list[Path]]:
    """The dump directories of ``record``, in saved-rank order (an inline one unpacked meanwhile)."""
    if record.kind not in RANK_KINDS:
        raise BufferCheckpointError(
            f"A replay buffer saved as {record.describe()} cannot be dealt out to another "
            "number of processes: only buffers of the run's processes can. Resume with the "
            "number of processes it was saved with."
        )
    with record_dumps(record, checkpoint_path) as dumps:
        yield list(dumps.values())


def _kept(lengths: list[int], replay_buffer: ReplayBuffer, world_size: int, keep: str) -> int:
    """How many of the saved items the ranks keep; raise when they cannot keep all and must."""
    total, capacity = sum(lengths), int(replay_buffer.storage.max_size)
    room = capacity * int(world_size)
    if total <= room:
        return total
    if keep == "newest":
        return room
    ranks = len(lengths)
    raise BufferCheckpointError(
        f"The checkpoint holds {total} replay-buffer items saved by {ranks} process(es) "
        f"({', '.join(str(n) for n in lengths)}), and it is being resumed on {world_size} "
        f"process(es) whose buffers hold max_size={capacity} items each, {room} in all, "
        f"so {total - room} of them would not fit. Build the buffer with max_size of at least "
        f"{math.ceil(total / world_size)}, resume on at least {math.ceil(total / capacity)} "
        "processes (Trainer(devices=..., num_nodes=...)), or pass "
        "ReplayBufferDataModule(resume_keep='newest') (in a config: data.init_args.resume_keep: "
        f"newest) to keep the newest {room} items and drop the oldest. Nothing was loaded."
    )


def _check_dealable(replay_buffer: ReplayBuffer, root: Path, manifest: dict[str, Any]) -> None:
    """Raise :class:`BufferCheckpointError` if the items of the dump in ``root`` cannot be dealt."""
    given = buffer_build(replay_buffer)
    saved = dict(manifest["build"])
    settings = dict(saved.get("sampler_settings", {}))
    settings.pop("max_capacity", None)  # the new buffers' capacity may differ: so may the trees'
    compare_builds(
        {**saved, "capacity": given["capacity"], "sampler_settings": settings}, given, root
    )
    reason = None
    if manifest["layout"] not in _DEALABLE:
        reason = f"it is a dump of layout {manifest['layout']!r}, written by a Ray buffer's actor"
    elif (root / TRANSFORM_STATE).exists():
        reason = "the buffer's transform has a state, which belongs to no single item"
    elif not isinstance(replay_buffer.writer, RoundRobinWriter):
        reason = f"its writer, {type(replay_buffer.writer).__name__}, keeps items by its own rule"
    elif isinstance(replay_buffer.sampler, SliceSampler):
        reason = "its items are trajectories, which dealing them out one by one would cut"
    elif getattr(replay_buffer.storage, "ndim", 1) != 1:
        reason = "its storage has more than one dimension"
    if reason is not None:
        raise BufferCheckpointError(
            f"The replay buffer saved in {root} cannot be dealt out to another number of "
            f"processes: {reason}. Resume with the number of processes it was saved with "
            "(Trainer(devices=..., num_nodes=...)), or start a new run."
        )


def _gather(
    replay_buffer: ReplayBuffer,
    roots: list[Path],
    manifests: list[dict[str, Any]],
    share: tuple[torch.Tensor, torch.Tensor],
) -> tuple[Any, torch.Tensor | None, float | None]:
    """This rank's items in writing order, their priority-tree values and the saved max priority."""
    prioritized = isinstance(replay_buffer.sampler, PrioritizedSampler)
    saved, oldest_first = share
    pieces: list[Any] = []
    trees: list[torch.Tensor] = []
    order: list[torch.Tensor] = []
    max_priority: float | None = None
    for saved_rank, (root, manifest) in enumerate(zip(roots, manifests, strict=True)):
        if prioritized and manifest["len"]:
            tree, saved_max = torchrl_compat.saved_priority_tree(root / "sampler")
            if saved_max is not None:
                max_priority = saved_max if max_priority is None else max(max_priority, saved_max)
        taken = (saved == saved_rank).nonzero().squeeze(-1)
        if not len(taken):
            continue
        scratch = _scratch_buffer(replay_buffer, manifest)
        layout_named(manifest["layout"], root).load(scratch, root, manifest)
        capacity = int(scratch.storage.max_size)
        # A full buffer's oldest item is where its writer writes next; otherwise slot 0.
        start = torchrl_compat.write_cursor(scratch) if len(scratch) == capacity else 0
        slots = (start + oldest_first[taken]) % capacity
        pieces.append(scratch.storage.get(slots))
        if prioritized:
            trees.append(tree[slots])
        order.append(taken)
    if not order:
        return None, None, max_priority
    position = torch.argsort(torch.cat(order))
    if isinstance(replay_buffer.storage, ListStorage):
        flat = [item for piece in pieces for item in piece]
        items: Any = [flat[p] for p in position.tolist()]
    else:
        items = torch.cat(pieces)[position]
    priorities = torch.cat(trees)[position] if prioritized else None
    return items, priorities, max_priority


def _scratch_buffer(replay_buffer: ReplayBuffer, manifest: dict[str, Any]) -> ReplayBuffer:
    """A buffer in host memory of the saved capacity, for one saved rank's items."""
    capacity = int(manifest["capacity"])
    storage = ListStorage(capacity) if isinstance(replay_buffer.storage, ListStorage) else None
    return ReplayBuffer(
        storage=storage or LazyTensorStorage(capacity, device="cpu"), writer=RoundRobinWriter()
    )


def _write(
    replay_buffer: ReplayBuffer,
    where: Path,
    items: Any,
    priorities: torch.Tensor | None,
    max_priority: float | None,
) -> None:
    """Make ``items`` the whole content of ``replay_buffer``, oldest first, with their priorities."""
    replay_buffer.empty()
    if items is None:
        return
    try:
        with torchrl_compat.overwriting_scratch_files(replay_buffer.storage):
            # Through the writer, not extend(): the items were stored already (no inverse
            # transform again), and the sampler's state is rebuilt below.
            index = replay_buffer.writer.extend(items)
    except Exception as error:
        raise unloadable(where, error, replay_buffer, items) from error
    replay_buffer.sampler.extend(index)
    if priorities is not None:
        torchrl_compat.set_priority_tree(replay_buffer.sampler, index, priorities, max_priority)
