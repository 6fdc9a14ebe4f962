"""``BufferMixture``: several named replay buffers sampled as one, with a per-batch composition.

Each member keeps its own storage, sampler and writer; a draw is one flat ``[batch_size]``
``TensorDict`` with, per item, ``"source"`` (the member's id), ``"index"`` (in its member)
and, when any member is prioritized, ``"priority_weight"`` and ``"index_generation"`` (a
priority update for a slot written since the draw is dropped and counted).

Not ``ReplayBufferEnsemble.sample``: in torchrl 0.14.1 it returns ``[k, batch_size / k]``
batches and raises when a prioritized member is mixed with a uniform one, so
:meth:`BufferMixture.sample` draws each member's share with its own ``sample`` and
concatenates them.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, PrioritizedSampler, TensorDictReplayBuffer
    >>> from rb_lightning import BufferMixture
    >>> offline = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
    >>> online = TensorDictReplayBuffer(
    ...     storage=LazyTensorStorage(100), sampler=PrioritizedSampler(100, 0.6, 0.4))
    >>> _ = offline.extend(TensorDict({"x": torch.zeros(100)}, batch_size=[100]))
    >>> _ = online.extend(TensorDict({"x": torch.ones(10)}, batch_size=[10]))
    >>> mix = BufferMixture({"offline": offline, "online": online},
    ...                     fractions={"offline": 0.5, "online": 0.5})
    >>> batch = mix.sample(8)
    >>> batch["source"].tolist(), sorted(batch.keys())
    ([0, 0, 0, 0, 1, 1, 1, 1], ['index', 'index_generation', 'priority_weight', 'source', 'x'])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.data import PrioritizedSampler, ReplayBuffer, ReplayBufferEnsemble

from rb_lightning import torchrl_compat
from rb_lightning.buffers.composition import FRACTION_TOLERANCE, Composition
from rb_lightning.buffers.member_columns import check_alike, not_tensordicts, schema
from rb_lightning.buffers.priorities import current_max_priority, in_sampler_dtype
from rb_lightning.errors import ArgumentTypeError, BufferStateError, MissingKeyError, UsageError
from rb_lightning.torchrl_compat import GENERATION_KEY
from rb_lightning.validation import check_replay_buffer

#: The per-item column holding the member's integer id (its position in ``names``).
SOURCE_KEY = "source"
__all__ = ["FRACTION_TOLERANCE", "GENERATION_KEY", "SOURCE_KEY", "BufferMixture"]


def _stamps_at_draw(
    info: Mapping[str, Any], index: torch.Tensor, position: tuple[int, int, int] | None
) -> torch.Tensor:
    """Each drawn slot's write stamp: the writer's generation when it tracks them (torchrl
    puts it in the info, read with the draw), else the round-robin write number at
    ``position`` (taken before the draw), else ``-1`` (a writer that cannot tell)."""
    generation = info.get(GENERATION_KEY)
    if generation is not None:
        return torch.as_tensor(generation).reshape(-1).to("cpu", torch.long)
    if position is not None:
        return torchrl_compat.slot_stamps(position, index.cpu())
    return torch.full(index.shape, -1, dtype=torch.long)


def _stamps_now(rb: ReplayBuffer, index: torch.Tensor) -> torch.Tensor | None:
    """The slots' stamps now, as :func:`_stamps_at_draw` took them; ``None``: cannot tell."""
    if rb.writer.tracks_generations:
        return torch.as_tensor(rb.writer.generations_of(index)).cpu()
    position = torchrl_compat.ring_position(rb)
    return None if position is None else torchrl_compat.slot_stamps(position, index.cpu())


class BufferMixture(ReplayBufferEnsemble):
    """Named replay buffers sampled as one flat batch, with fixed fractions or random weights.

    Writes go to a member (``mixture.member("online").extend(...)``); the mixture is read-only.

    Args:
        members: Name -> buffer; in this order, the source ids ``0, 1, ...`` of the
            ``"source"`` column (:attr:`names`). Members store items with the same keys.

    Keyword Args:
        fractions: Name -> exact share of every batch; they add up to 1 and each
            ``f * batch_size`` is whole (to within :data:`FRACTION_TOLERANCE`).
        weights: Name -> relative weight of a random draw per item. With neither: equal
            fractions.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> a = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
        >>> b = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
        >>> _ = a.extend(TensorDict({"x": torch.zeros(10)}, batch_size=[10]))
        >>> _ = b.extend(TensorDict({"x": torch.ones(10)}, batch_size=[10]))
        >>> mix = BufferMixture({"a": a, "b": b}, weights={"a": 1, "b": 3})
        >>> mix.set_rng(torch.Generator().manual_seed(0))
        >>> counts = mix.sample(400)["source"].bincount().tolist()
        >>> 50 < counts[0] < 150, sum(counts), len(mix)
        (True, 400, 20)
    """

    def __init__(
        self,
        members: Mapping[str, ReplayBuffer],
        *,
        fractions: Mapping[str, float] | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        if not isinstance(members, Mapping) or not members:
            raise ArgumentTypeError(
                "members",
                "BufferMixture(members=...) takes a dict of name -> ReplayBuffer with at least "
                f"one member, got {members!r}.",
            )
        names = [str(name) for name in members]
        buffers = [check_replay_buffer(rb, f"members[{name!r}]") for name, rb in members.items()]
        if len({id(rb) for rb in buffers}) != len(buffers):
            raise UsageError(
                "members", "BufferMixture(members=...): each member must be a different buffer."
            )
        self._names = names
        self._members = dict(zip(names, buffers, strict=False))
        self._prioritized = [isinstance(rb.sampler, PrioritizedSampler) for rb in buffers]
        self._alike = False  # the members' columns checked, once all hold items
        self._dropped = dict.fromkeys(names, 0)
        self._composition = Composition.of(names, fractions, weights)
        if self._composition.fixed:
            super().__init__(*buffers, sample_from_all=True)
        else:
            super().__init__(*buffers, p=list(self._composition.shares))

    # -- members ----------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """Member names; a name's position is its source id."""
        return list(self._names)

    @property
    def members(self) -> dict[str, ReplayBuffer]:
        """Name -> member buffer."""
        return dict(self._members)

    def member(self, name: str) -> ReplayBuffer:
        """The member called ``name`` (a ``KeyError`` lists the names)."""
        try:
            return self._members[name]
        except KeyError:
            raise MissingKeyError(
                "member", f"The mixture has no member {name!r}; its members are {self._names}."
            ) from None

    @property
    def fractions(self) -> dict[str, float] | None:
        """Name -> exact share of every batch, as given (``None`` for a weighted mixture)."""
        c = self._composition
        return dict(zip(self._names, c.shares, strict=True)) if c.fixed else None

    @property
    def weights(self) -> dict[str, float] | None:
        """Name -> probability of each item (``None`` for a mixture with fixed fractions)."""
        c = self._composition
        return None if c.fixed else dict(zip(self._names, c.shares, strict=True))

    @property
    def composition(self) -> dict[str, Any]:
        """The composition as given: ``{"fractions": {...}}``, ``{"weights": {...}}``, or
        ``{"fractions": None}`` for the default equal fractions (what a checkpoint keeps)."""
        return self._composition.to_saved()

    def check_resumed_composition(self, saved: Mapping[str, Any] | None) -> None:
        """Refuse (:class:`~rb_lightning.errors.BufferCheckpointError`, naming both) a
        checkpoint's :attr:`composition` that draws other shares than this mixture's;
        ``None`` (a checkpoint from before it was kept) is taken."""
        self._composition.check_resumed(saved)

    @property
    def prioritized(self) -> bool:
        """Whether any member samples with a ``PrioritizedSampler``."""
        return any(self._prioritized)

    def __len__(self) -> int:
        """Items held by all members together."""
        return sum(len(rb) for rb in self._members.values())

    def set_rng(self, generator: torch.Generator | None) -> None:
        """Sample every member, and the composition, with ``generator``."""
        super().set_rng(generator)
        if generator is None:  # torchrl's construction: members keep their own
            return
        for rb in self._members.values():
            rb.set_rng(generator)

    # -- sampling ---------------------------------------------------------------------------
    def counts(self, batch_size: int) -> list[int]:
        """Items of each member in the next batch of ``batch_size`` (draws for weights)."""
        return self._composition.counts(batch_size, torchrl_compat.buffer_generator(self))

    def check_members_alike(self) -> None:
        """Refuse members whose items differ in keys, dtypes or per-item shapes (read once per member until all hold items); :meth:`sample` and :meth:`items` call it first."""
        if self._alike:
            return
        schemas = {name: schema(name, rb) for name, rb in self._members.items() if len(rb) > 0}
        if len(schemas) > 1:
            check_alike(schemas)
        self._alike = len(schemas) == len(self._names)

    def sample(  # flat batch; the info is also in its columns
        self, batch_size: int | None = None, return_info: bool = False
    ) -> Any:
        """One flat batch of ``batch_size`` items, with ``"source"`` and ``"index"`` columns."""
        if batch_size is None:
            batch_size = torchrl_compat.default_batch_size(self)
        if batch_size is None:
            raise UsageError("batch_size", "BufferMixture.sample needs a batch_size.")
        self.check_members_alike()
        parts = []
        for source, (name, count) in enumerate(
            zip(self._names, self.counts(batch_size), strict=False)
        ):
            if count == 0:
                continue
            rb = self._members[name]
            if len(rb) == 0:
                raise BufferStateError(
                    f"The mixture's member {name!r} is empty but its share of this batch is "
                    f"{count} items. Fill it first (a source, or a collector's warm-up: "
                    "OnlineCollector(member=..., init_random_frames=N))."
                )
            # Where the writer is before the draw: a write after it changes the stamps
            # of the slots it takes, so their priority updates are dropped.
            position = torchrl_compat.ring_position(rb) if self._prioritized[source] else None
            part, info = rb.sample(count, return_info=True)
            if not isinstance(part, TensorDictBase):
                raise not_tensordicts(name, part)
            index = torch.as_tensor(info["index"]).reshape(count)
            part.set("index", index.to(part.device))
            part.set(SOURCE_KEY, torch.full((count,), source, dtype=torch.long, device=part.device))
            if self.prioritized:
                weight = info.get("priority_weight")
                weight = (
                    torch.ones(count) if weight is None else torch.as_tensor(weight).reshape(count)
                )
                part.set("priority_weight", weight.to(part.device, torch.float))
                stamps = _stamps_at_draw(info, index, position)
                part.set(GENERATION_KEY, stamps.to(part.device))
            elif GENERATION_KEY in part.keys():  # a tracking writer's, in one member only
                del part[GENERATION_KEY]
            parts.append(part)
        keys = [sorted(map(str, p.keys(True, True))) for p in parts]
        if any(k != keys[0] for k in keys[1:]):
            raise MissingKeyError(
                "members",
                f"The mixture's members hold different keys ({dict(zip(self._names, keys, strict=False))}); "
                "a batch concatenates them, so store the same keys in every member (e.g. "
                "OnlineCollector(keys=[...]) as in the offline data).",
            )
        batch: TensorDictBase = torch.cat(parts) if len(parts) > 1 else parts[0]
        if return_info:
            info = {"index": batch["index"], SOURCE_KEY: batch[SOURCE_KEY]}
            if self.prioritized:
                info["priority_weight"] = batch["priority_weight"]
                info[GENERATION_KEY] = batch[GENERATION_KEY]
            return batch, info
        return batch

    def items(self, start: int = 0, stop: int | None = None) -> TensorDictBase:
        """Stored items ``start:stop`` of the members laid end to end, with their ``"source"``.

        Member by member in :attr:`names` order, each in storage order: the
        mixture's content read once (no sampling), e.g. for a snapshot export.
        """
        stop = len(self) if stop is None else min(stop, len(self))
        self.check_members_alike()
        parts = []
        offset = 0
        for source, rb in enumerate(self._members.values()):
            size = len(rb)
            lo, hi = max(start - offset, 0), min(stop - offset, size)
            if lo < hi:
                part = rb[lo:hi]
                part.set(SOURCE_KEY, torch.full((hi - lo,), source, dtype=torch.long))
                parts.append(part)
            offset += size
        if not parts:
            raise IndexError(f"items({start}, {stop}): the mixture holds {len(self)} items.")
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    # -- priorities -------------------------------------------------------------------------
    def update_member_priority(
        self,
        source: torch.Tensor,
        index: torch.Tensor,
        priority: torch.Tensor,
        generation: torch.Tensor | None = None,
    ) -> int:
        """Give each item (``source[i]``, ``index[i]``) its new ``priority[i]``; return the updates dropped.

        With ``generation`` (the batch's ``"index_generation"``), an update for a slot written since
        the draw is dropped and counted (:attr:`dropped_priority_updates`). Members without a
        ``PrioritizedSampler`` are skipped.
        """
        source = torch.as_tensor(source).reshape(-1)
        index = torch.as_tensor(index).reshape(-1)
        priority = torch.as_tensor(priority).reshape(-1)
        stamps = None if generation is None else torch.as_tensor(generation).reshape(-1).cpu()
        if not source.shape == index.shape == priority.shape or (
            stamps is not None and stamps.shape != source.shape
        ):
            raise UsageError(
                "priority",
                f"source, index and priority must have one value per item, got shapes "
                f"{tuple(source.shape)}, {tuple(index.shape)}, {tuple(priority.shape)}"
                + ("" if stamps is None else f" (index_generation {tuple(stamps.shape)})")
                + ".",
            )
        dropped = 0
        for member_id, name in enumerate(self._names):
            if not self._prioritized[member_id]:
                continue
            mask = (source == member_id).cpu()
            if not bool(mask.any()):
                continue
            member = self._members[name]
            member_index = index[mask.to(index.device)]
            member_priority = in_sampler_dtype(priority[mask.to(priority.device)], member.sampler)
            # Held from the check to the update: no write of another thread lands between.
            with torchrl_compat.buffer_lock(member):
                now = None if stamps is None else _stamps_now(member, member_index)
                if now is not None and stamps is not None:
                    live = now == stamps[mask]
                    stale = int((~live).sum())
                    if stale:
                        self._dropped[name] += stale
                        dropped += stale
                        member_index = member_index[live.to(member_index.device)]
                        member_priority = member_priority[live.to(member_priority.device)]
                if member_index.numel():
                    member.update_priority(member_index, member_priority)
        return dropped

    @property
    def dropped_priority_updates(self) -> dict[str, int]:
        """Name -> priority updates dropped so far because their slot was written between
        the draw and the update (see :meth:`update_member_priority`)."""
        return dict(self._dropped)

    def max_priority(self) -> float:
        """The largest current max priority over the prioritized members (1.0 if none)."""
        values = [
            current_max_priority(rb)
            for rb, prioritized in zip(self._members.values(), self._prioritized, strict=False)
            if prioritized
        ]
        return max(values) if values else 1.0

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{name}={type(rb.sampler).__name__}(len={len(rb)})"
            for name, rb in self._members.items()
        )
        return f"BufferMixture({parts}; {self._composition.describe()})"
