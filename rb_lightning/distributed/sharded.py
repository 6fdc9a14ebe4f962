"""A replay buffer split over several Ray actors, sampled as one (needs the ``ray`` extra).

:class:`ShardedRayReplayBuffer` puts ``num_shards`` actors, each holding a torchrl
``ReplayBuffer``, behind one object usable wherever a ``ReplayBuffer`` is expected. Writes
go to one shard per ``extend``; a batch draws from the shards in proportion to their size
(uniform) or priority mass (prioritized), with importance weights against the smallest
priority of all shards; ``in_flight=k`` batches come per round trip; a priority update
for a slot written again since its draw is dropped. This module also holds the
DataModule's handle (:class:`ShardedBuffer`) and its checkpoints beside the ``.ckpt``;
the actors run :mod:`~rb_lightning.distributed.shard_actor`.

Example::

    rb = ShardedRayReplayBuffer(1_000, num_shards=2, prioritized=True,
                                ray_init_config={"num_cpus": 2})
    rb.extend(TensorDict({"x": torch.arange(100)}, batch_size=[100]))
    batch = rb.sample(32)                       # index, index_generation, priority_weight
    rb.update_priority(batch["index"], torch.rand(32), generation=batch["index_generation"])
    rb.close()
"""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import ReplayBuffer

from rb_lightning.buffers.priorities import InvalidPriority, check_priority
from rb_lightning.distributed.actor_process import semaphore_names_released
from rb_lightning.distributed.ray_checkpoint import (
    RemoteDumpRequest,
    remote_buffer_state,
    restore_on_rank_zero,
)
from rb_lightning.distributed.remote_handle import RemoteBuffer
from rb_lightning.distributed.shard_actor import shard_actor_class
from rb_lightning.errors import BufferCheckpointError, BufferStateError, UsageError
from rb_lightning.persist.elastic import Redistribution
from rb_lightning.persist.manifest import Layout, Verify, read_manifest, write_manifest
from rb_lightning.persist.record import BufferRecord
from rb_lightning.validation import check_positive_int

__all__ = [
    "ShardedBuffer",
    "ShardedRayReplayBuffer",
    "dump_shards",
    "restore_sharded_state",
    "sharded_state",
]

_META = "shards.json"
#: The manifest's layout of a dump of every shard.
LAYOUT: Layout = "sharded_ray_dumps"


class ShardedRayReplayBuffer(ReplayBuffer):
    """``num_shards`` Ray buffer actors behind one ``ReplayBuffer``.

    Args:
        capacity: Items the whole buffer holds; each shard ``ceil(capacity / num_shards)``.

    Keyword Args:
        num_shards: Buffer actors.
        prioritized: A ``PrioritizedSampler(alpha, beta)`` in each shard (else uniform).
        alpha: The prioritized sampler's exponent of the priorities.
        beta: The prioritized sampler's importance-weight exponent.
        eps: Added to every priority (as torchrl's ``PrioritizedSampler``).
        in_flight: Batches drawn per round trip and requested ahead (docs/scaling.md).
        seed: Seeds the split of each batch over the shards and shard ``i``'s sampler
            (``seed * 1000 + i``).
        name: Names the actors (``name.0``, ... in Ray namespace ``rb_lightning``): every
            process building the buffer with the same name binds the same actors.
        ray_init_config: ``ray.init`` arguments when Ray is not initialised yet.
        actor_options: ``ray.remote`` options of every shard actor; default ``{"num_cpus": 0}``.

    Examples:
        >>> ShardedRayReplayBuffer(10, num_shards=0)
        Traceback (most recent call last):
        ...
        rb_lightning.errors.UsageError: num_shards must be a positive integer, got 0.
    """

    def __init__(
        self,
        capacity: int,
        *,
        num_shards: int = 1,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-8,
        in_flight: int = 16,
        seed: int = 0,
        name: str | None = None,
        ray_init_config: dict[str, Any] | None = None,
        actor_options: dict[str, Any] | None = None,
    ) -> None:
        # Not ReplayBuffer.__init__: nothing is stored in this process.
        self.capacity = check_positive_int(capacity, "capacity")
        self.num_shards = check_positive_int(num_shards, "num_shards")
        self.in_flight = check_positive_int(in_flight, "in_flight")
        self.prioritized = bool(prioritized)
        self.alpha, self.beta, self.eps = float(alpha), float(beta), float(eps)
        self.stride = -(-self.capacity // self.num_shards)
        self._seed = int(seed)
        self._generator = torch.Generator().manual_seed(self._seed)
        self._next_writer = 0
        self._pending: deque[tuple[int, list[tuple[int, Any]]]] = deque()
        self._ready: deque[TensorDictBase] = deque()
        self._updates: list[tuple[int, Any]] = []
        self.dropped_updates = 0
        self._ray_init_config = dict(ray_init_config or {})
        self.name = name
        options = {"num_cpus": 0, **(actor_options or {})}
        self._shards = [self._new_shard(options, i) for i in range(self.num_shards)]
        self._masses = [(0, 0.0, 1.0)] * self.num_shards

    def _new_shard(self, options: dict[str, Any], shard: int) -> Any:
        import ray

        if not ray.is_initialized():
            ray.init(**self._ray_init_config)
        if self.name is not None:
            options = {
                **options,
                "name": f"{self.name}.{shard}",
                "namespace": "rb_lightning",
                "get_if_exists": True,
            }
        actor_cls: Any = ray.remote(**options)(shard_actor_class())
        seed = self._seed * 1_000 + shard  # each shard samples its own stream
        settings = (self.stride, self.prioritized, self.alpha, self.beta, self.eps, seed)
        actor = actor_cls.remote(*settings)
        # Its process keeps no semaphore name in /dev/shm (actor_process); the call runs
        # before this process's next call to the actor.
        actor.__ray_call__.remote(semaphore_names_released())
        return actor

    # -- what a ReplayBuffer answers ---------------------------------------------------------
    def buffer_handle(self) -> ShardedBuffer:
        """How a :class:`~rb_lightning.ReplayBufferDataModule` trains from this buffer."""
        return ShardedBuffer(self)

    @property
    def service_backend(self) -> str:
        return "ray"

    def _call(self, shard: int, op: str, *args: Any) -> Any:
        """One call of ``op`` inside shard ``shard``'s actor: the pending result."""
        if not self._shards:
            raise BufferStateError(
                "The ShardedRayReplayBuffer is closed: its shard actors are gone. Build a "
                "new one (or loads() a saved one into a new one)."
            )
        return getattr(self._shards[shard], op).remote(*args)

    def _all(self, op: str, *args: Any) -> list[Any]:
        import ray

        return ray.get([self._call(i, op, *args) for i in range(self.num_shards)])

    def __len__(self) -> int:
        self._masses = self._all("mass")
        return sum(m[0] for m in self._masses)

    @property
    def write_count(self) -> int:
        return sum(self._all("write_count"))

    def shard_lengths(self) -> list[int]:
        """Items in each shard."""
        return [m[0] for m in self._all("mass")]

    # -- writing -----------------------------------------------------------------------------
    def extend(self, data: Any, *, shard: int | None = None) -> torch.Tensor:
        """Write ``data`` into one shard (``shard``, e.g. the writer's rank; default: round robin).

        Returns the global indices of the written items.
        """
        import ray

        if shard is None:
            shard, self._next_writer = self._next_writer, (self._next_writer + 1) % self.num_shards
        elif not 0 <= shard < self.num_shards:
            raise UsageError(
                "shard", f"shard={shard!r} is not one of the {self.num_shards} shards (0-based)."
            )
        index, self._masses[shard] = ray.get(self._call(shard, "extend", data))
        return torch.as_tensor(index) + shard * self.stride

    def add(self, data: Any) -> int:
        """Write one item (round robin)."""
        batch = data.unsqueeze(0) if isinstance(data, TensorDictBase) else [data]
        return int(self.extend(batch)[0])

    # -- sampling ----------------------------------------------------------------------------
    def _split(self, batch_size: int) -> list[tuple[int, int]]:
        """(shard, items) to ask each shard for: multinomial over the shards' masses."""
        if self.num_shards == 1:
            return [(0, batch_size)]
        weights = torch.tensor([m[1] for m in self._masses], dtype=torch.double)
        if not weights.sum() > 0:
            self._masses = self._all("mass")
            weights = torch.tensor([m[1] for m in self._masses], dtype=torch.double)
            if not weights.sum() > 0:
                raise BufferStateError(
                    "The ShardedRayReplayBuffer is empty, so there is nothing to sample. "
                    "Fill it first (rb.extend(...)), or pass min_size=N to the DataModule."
                )
        picks = torch.multinomial(weights, batch_size, replacement=True, generator=self._generator)
        counts = torch.bincount(picks, minlength=self.num_shards).tolist()
        return [(shard, n) for shard, n in enumerate(counts) if n]

    def _request(self, batch_size: int) -> None:
        # in_flight > 1: one call per shard draws in_flight batches at once (one round
        # trip and one serialisation per call, not per batch), while the step trains
        # on the previous call's batches.
        burst = batch_size * self.in_flight
        parts = [(s, self._call(s, "draw", n)) for s, n in self._split(burst)]
        self._pending.append((batch_size, parts))

    def _drop_ahead(self) -> None:
        """Forget the batches drawn ahead (content or batch size changed)."""
        self._pending.clear()
        self._ready.clear()

    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """A batch with ``index`` (global), ``index_generation`` and, when prioritized, ``priority_weight``.

        With ``in_flight=k > 1`` batches come ``k`` per round trip and the next ``k`` are requested
        at once, so a batch may be drawn up to ``2k - 1`` batches before it is returned.
        """
        import ray

        if batch_size is None:
            raise UsageError("batch_size", "ShardedRayReplayBuffer.sample needs a batch_size.")
        ahead = [self._ready[0].shape[0]] if self._ready else []
        ahead += [size for size, _ in self._pending]
        if any(size != batch_size for size in ahead):
            self._drop_ahead()  # asked for another size: those batches are not wanted
        if not self._ready:
            if not self._pending:
                self._request(batch_size)
            _, parts = self._pending.popleft()
            try:
                results = ray.get([ref for _, ref in parts])
            except Exception:
                self._drop_ahead()
                raise
            for (shard, _), result in zip(parts, results, strict=True):
                self._masses[shard] = result[4]
            drawn = self._assemble([shard for shard, _ in parts], results)
            if len(parts) > 1:
                # Shard by shard the items are grouped: a random order makes every batch
                # an independent draw from the mixture of shards.
                drawn = drawn[torch.randperm(drawn.shape[0], generator=self._generator)]
            self._ready.extend(drawn.split(batch_size))
        if self.in_flight > 1 and not self._pending:
            self._request(batch_size)
        batch = self._ready.popleft()
        if return_info:
            info = {k: batch[k] for k in ("index", "priority_weight") if k in batch.keys()}
            return batch, info
        return batch

    def _assemble(self, shards: list[int], results: list[Any]) -> TensorDictBase:
        pieces = []
        for shard, (items, index, generation, stored, _) in zip(shards, results, strict=True):
            piece = items if isinstance(items, TensorDictBase) else TensorDict(items)
            piece = piece.clone(False) if piece.is_locked else piece
            # reshape: a one-item draw may come back as scalars
            piece.set("index", torch.as_tensor(index).reshape(-1) + shard * self.stride)
            if generation is not None:
                piece.set("index_generation", torch.as_tensor(generation).reshape(-1))
            if stored is not None:
                piece.set("_stored_priority", stored.reshape(-1))
            pieces.append(piece)
        batch: TensorDictBase = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        if self.prioritized:
            # One buffer's weight: (p_i / p_min)^-beta with p_min over every shard.
            p_min = min(m[2] for m in self._masses if m[0] > 0)
            stored = batch.pop("_stored_priority")
            batch.set("priority_weight", (stored / p_min).pow(-self.beta).float())
        return batch

    # -- priorities --------------------------------------------------------------------------
    def update_priority(self, index: Any, priority: Any, *, generation: Any = None) -> None:
        """New priorities by global ``index``, each sent to its shard; with ``generation``, a slot written since its draw keeps its priority (counted in :attr:`dropped_updates`)."""
        import ray

        index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        priority = torch.as_tensor(priority, dtype=torch.float).reshape(-1).expand(index.shape)
        gen = None if generation is None else torch.as_tensor(generation).reshape(-1)
        owner = index // self.stride
        for shard in owner.unique().tolist():
            mine = owner == shard
            local = index[mine] - shard * self.stride
            generations = None if gen is None else gen[mine]
            self._updates.append(
                (shard, self._call(shard, "update", local, generations, priority[mine]))
            )
        # Ray runs one caller's calls on an actor in order: a later sample sees the update.
        # Collect finished results (and errors) without waiting.
        refs = [ref for _, ref in self._updates]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        self._collect(set(done))

    def _collect(self, done: set[Any]) -> None:
        """Count the finished updates' dropped items and take their shards' new masses."""
        import ray

        waiting = []
        for shard, ref in self._updates:
            if ref in done:
                dropped, self._masses[shard] = ray.get(ref)
                self.dropped_updates += dropped
            else:
                waiting.append((shard, ref))
        self._updates = waiting

    def flush(self) -> None:
        """Wait for every priority update sent so far."""
        import ray

        refs = [ref for _, ref in self._updates]
        if refs:
            ray.wait(refs, num_returns=len(refs))
        self._collect(set(refs))

    # -- checkpoint --------------------------------------------------------------------------
    def dumps(self, path: str | os.PathLike[str]) -> None:
        """Every shard's dump (torchrl's ``dumps``, written by the shard) under ``path``."""
        import ray

        self.flush()
        self._drop_ahead()
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        refs = [self._call(i, "dump", str(root / f"shard_{i}")) for i in range(self.num_shards)]
        lengths = ray.get(refs)
        meta = {
            "num_shards": self.num_shards,
            "stride": self.stride,
            "prioritized": self.prioritized,
            "alpha": self.alpha,
            "lengths": lengths,
            "write_counts": self._all("write_count"),
        }
        (root / _META).write_text(json.dumps(meta))

    def loads(self, path: str | os.PathLike[str]) -> None:
        """Replace the content with a :meth:`dumps` of any number of shards (another layout spreads every item evenly: none lost, none twice)."""
        import ray

        root = Path(path)
        try:
            meta = json.loads((root / _META).read_text())
        except (OSError, ValueError) as err:
            raise BufferCheckpointError(
                f"{root} holds no ShardedRayReplayBuffer dump ({_META} unreadable: {err}). "
                "Give the directory a ShardedRayReplayBuffer.dumps() wrote."
            ) from None
        self._drop_ahead()
        self.flush()
        saved = [str(root / f"shard_{i}") for i in range(meta["num_shards"])]
        if meta["num_shards"] == self.num_shards and meta["stride"] == self.stride:
            ray.get([self._call(i, "load", p) for i, p in enumerate(saved)])
            return
        if sum(meta["lengths"]) > self.num_shards * self.stride:
            raise BufferCheckpointError(
                f"The dump at {root} holds {sum(meta['lengths'])} items, more than this "
                f"buffer's {self.num_shards} shards of {self.stride} can hold. Build it with "
                f"capacity >= {sum(meta['lengths'])}."
            )
        self.empty()
        alpha = meta["alpha"] if meta["prioritized"] else None
        for source in saved:
            items, priority = self._read_dump(source, meta, alpha)
            if items is None:
                continue
            self._spread(items, priority)

    def _read_dump(self, source: str, meta: dict[str, Any], alpha: float | None) -> Any:
        """A saved shard read back in this process, by a shard object of the saved settings."""
        if not os.listdir(source):
            return None, None
        shard_cls = shard_actor_class()
        shard = shard_cls(meta["stride"], alpha is not None, alpha or 1.0, self.beta, self.eps, 0)
        shard.rb.loads(source)
        return shard.read(alpha, self.eps)

    def _spread(self, items: TensorDictBase, priority: torch.Tensor | None) -> None:
        """Items split evenly over the shards, the least filled first."""
        lengths = self.shard_lengths()
        n = items.shape[0]
        order = sorted(range(self.num_shards), key=lambda s: lengths[s])
        chunks = torch.arange(n).tensor_split(self.num_shards)
        for shard, chunk in zip(order, chunks, strict=True):
            if chunk.numel() == 0:
                continue
            index = self.extend(items[chunk], shard=shard)
            if priority is not None:
                self.update_priority(index, priority[chunk])
        self.flush()

    def empty(self) -> None:
        """Remove every item from every shard."""
        self._drop_ahead()
        self.flush()
        self._all("clear")
        self._masses = [(0, 0.0, 1.0)] * self.num_shards

    def contents(self) -> tuple[TensorDictBase, torch.Tensor | None]:
        """Every stored item (``index`` column: its global index) and its priority.

        ``None`` for the priorities of a uniform buffer. One round trip per shard.
        """
        alpha = self.alpha if self.prioritized else None
        parts = self._all("read", alpha, self.eps)
        items, priorities = [], []
        for shard, (rows, priority) in enumerate(parts):
            if rows is None:
                continue
            rows = rows if isinstance(rows, TensorDictBase) else TensorDict(rows)
            rows.set("index", torch.arange(rows.shape[0]) + shard * self.stride)
            items.append(rows)
            priorities.append(priority)
        if not items:
            raise BufferStateError("The ShardedRayReplayBuffer is empty: it has no contents.")
        merged = torch.cat(items)
        return merged, None if alpha is None else torch.cat(priorities)

    def shard_pids(self) -> list[int]:
        """The process id of each shard actor (to watch its CPU use)."""
        import ray

        refs = [self._call(i, "pid") for i in range(self.num_shards)]
        return [int(pid) for pid in ray.get(refs)]

    def close(self) -> None:
        """Kill every shard actor (for every process that bound them by ``name``)."""
        import ray

        self._drop_ahead()
        for actor in self._shards:
            ray.kill(actor, no_restart=True)
        self._shards = []

    def __repr__(self) -> str:
        kind = "prioritized" if self.prioritized else "uniform"
        return (
            f"{type(self).__name__}(capacity={self.capacity}, num_shards={self.num_shards}, "
            f"{kind}, in_flight={self.in_flight})"
        )


class ShardedBuffer(RemoteBuffer):
    """The DataModule's handle on a :class:`ShardedRayReplayBuffer`: served like one Ray buffer.

    Two differences: a priority update carries the batch's ``index_generation``, and the
    checkpoint holds every shard (:meth:`ShardedRayReplayBuffer.dumps`).
    """

    replay_buffer: ShardedRayReplayBuffer

    def describe(self) -> str:
        rb = self.replay_buffer
        return f"{type(rb).__name__}(len={len(rb)}, {rb.num_shards} Ray shard actors)"

    def capacity(self) -> int | None:
        return self.replay_buffer.capacity

    def where(self) -> str:
        import ray

        rb = self.replay_buffer
        names = f"{rb.name}.0-{rb.num_shards - 1}" if rb.name is not None else "(unnamed)"
        address = ray.get_runtime_context().gcs_address
        return f"Ray cluster at {address}: {rb.num_shards} buffer shard actors {names}"

    def prepare(self, num_workers: int) -> None:
        """Nothing: each shard's process removed its semaphore names when it was made."""

    def update_priority(
        self, batch: TensorDictBase, priority: torch.Tensor, *, invalid: InvalidPriority, where: str
    ) -> int:
        """Priorities to each item's shard; stale slots (another generation) keep theirs."""
        priority = torch.as_tensor(priority).detach().cpu().float()
        checked = check_priority(priority, invalid=invalid, replacement=lambda: 1.0, where=where)
        replaced = 0 if checked is priority else int((checked != priority).sum())
        generation = batch.get("index_generation", None)
        self.replay_buffer.update_priority(batch["index"].cpu(), checked, generation=generation)
        return replaced

    def state_dict(self, trainer: Any, *, inline_max_bytes: int, pending_batches: list[Any]) -> Any:
        """Every shard, dumped by its actor beside the ``.ckpt`` on behalf of global rank 0."""
        return sharded_state(self.replay_buffer, trainer)

    def load_state_dict(
        self,
        record: BufferRecord,
        trainer: Any,
        *,
        verify: Verify,
        redistribution: Redistribution | None = None,
    ) -> list[Any]:
        """Rank 0 loads the shards (onto this buffer's number of shards); every rank waits."""
        restore_sharded_state(self.replay_buffer, record, trainer, verify=verify)
        return []


# -- checkpoints beside the .ckpt ------------------------------------------------------------
# Global rank 0 (the process Lightning saves from) has every shard actor write its part
# (ShardedRayReplayBuffer.dumps) into a new version directory beside the .ckpt; the
# manifest and checksums are rb_lightning.checkpoint's. On resume rank 0 verifies the dump
# and loads it (onto the same shard layout as saved, or spread over another number of
# shards) while every rank waits. The directory must be reachable from the shard actors'
# node (a shared filesystem across machines).


def dump_shards(replay_buffer: ShardedRayReplayBuffer, path: Path) -> dict[str, Any]:
    """Every shard dumped by its actor into the new directory ``path``; return the manifest."""
    replay_buffer.dumps(path)
    content: dict[str, Any] = {
        "layout": LAYOUT,
        "len": len(replay_buffer),
        "write_count": replay_buffer.write_count,
        "build": {},
    }
    return write_manifest(path, {**content, "num_shards": replay_buffer.num_shards})


def sharded_state(replay_buffer: ShardedRayReplayBuffer, trainer: Any) -> Any:
    """What the DataModule stores: rank 0's request to dump every shard; a placeholder elsewhere."""
    request = RemoteDumpRequest(
        replay_buffer,
        lambda path: dump_shards(replay_buffer, path),
        kind="shards",
        what="ShardedRayReplayBuffer",
    )
    return remote_buffer_state(replay_buffer, trainer, request)


def restore_sharded_state(
    replay_buffer: ShardedRayReplayBuffer, record: BufferRecord, trainer: Any, *, verify: Verify
) -> None:
    """Rank 0 verifies and loads the saved shards; every rank waits for it (collective)."""

    def load() -> None:
        if record.kind != "shards":
            raise BufferCheckpointError(
                "The checkpoint's replay buffer was not saved from a ShardedRayReplayBuffer, "
                "and the DataModule now holds one. Resume with the same kind of buffer as "
                "the saved run, or start a new run."
            )
        path = record.directory(trainer.ckpt_path if trainer is not None else None)
        read_manifest(path, verify=verify)
        replay_buffer.loads(path)

    restore_on_rank_zero(record, trainer, load, what="ShardedRayReplayBuffer")
