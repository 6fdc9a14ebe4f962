"""Sample requests kept in flight to a Ray-served buffer; priority updates that skip rewritten slots.

A Ray-served buffer (``ReplayBuffer(service_backend="ray")``, a
:class:`~rb_lightning.distributed.ray.RayReplayBufferView`) samples inside its
actor, so a batch asked for one at a time costs a full round trip (request,
sample, serialise, reply) while the trainer waits, and most of that cost is per
call, not per item. :class:`RemoteSampleQueue` keeps ``requests_in_flight`` calls
to the actor's own ``sample`` queued (``actor.sample.remote(...)`` futures, read
with ``ray.get``), each drawing ``batches_per_request`` batches at once: while the
trainer works on one batch, the actor draws the next ones.

What a queued call means:

* a batch reflects the buffer (content and priorities) as of when its call reached
  the actor: at most ``requests_in_flight * batches_per_request - 1`` batches
  before it is handed out, as with any sampling ahead (torchrl's ``prefetch``);
* a checkpoint does not hold the queued calls: sampling takes nothing out of the
  buffer, so nothing stored is lost when their replies are dropped, and a resumed
  run sends new calls (a Ray buffer's stream is not bit-exact on resume either
  way: docs/checkpoints.md).

Priority updates (:func:`send_priority_update`) are held until
``batches_per_request`` have come (one per training step), then go to the actor as
one call without waiting for a reply (Ray runs one caller's calls to an actor in
order, so they land before any request issued later; ``drained`` sends what is
held, as a checkpoint does), and an update for a slot that a writer
rewrote between the draw and the update is dropped, as torchrl drops it: when
the actor's writer tracks slot generations
(``RoundRobinWriter(track_generations=True)``), each sample carries
``"index_generation"`` and the update keeps only the slots whose generation is
unchanged (torchrl's ``update_if_present`` rule); the others are sent to the
sampler as index ``-1``, which ``PrioritizedSampler.update_priority`` skips.

This module imports Ray only when a Ray buffer is sampled.

Example (needs Ray, so a literal block rather than a doctest;
``tests/scale/test_remote_prefetch.py`` runs the same)::

    from functools import partial
    import ray
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from rb_lightning.stream.remote_prefetch import RemoteSampleQueue

    ray.init(num_cpus=1, include_dashboard=False)
    owner = ReplayBuffer(storage=partial(LazyTensorStorage, 1_000), service_backend="ray")
    owner.extend(TensorDict({"x": torch.arange(1_000)}, batch_size=[1_000]))
    queue = RemoteSampleQueue(owner, batch_size=64, requests_in_flight=4, batches_per_request=2)
    batch, info = queue.next()  # 4 calls of 128 items sent; the first reply split in two
    assert batch.batch_size == torch.Size([64]) and len(queue) == 3
    owner.close()
"""

from __future__ import annotations

import atexit
import logging
import weakref
from collections import deque
from typing import Any

import torch
from tensordict import TensorDictBase

from rb_lightning.buffers.priorities import InvalidPriority, check_priority, current_max_priority
from rb_lightning.errors import BufferStateError
from rb_lightning.torchrl_compat import GENERATION_KEY, ray_buffer_actor
from rb_lightning.validation import check_positive_int

logger = logging.getLogger(__name__)

#: Calls kept in flight, and batches each draws, when the buffer does not say
#: (measured: benchmarks/scale.py, docs/scaling.md).
DEFAULT_REQUESTS_IN_FLIGHT = 4
DEFAULT_BATCHES_PER_REQUEST = 4
#: Priority updates sent but not yet confirmed, past which the next update waits for the oldest.
MAX_UNCONFIRMED_UPDATES = 64


def pipeline_options(replay_buffer: Any) -> tuple[int, int]:
    """The buffer's ``(requests_in_flight, batches_per_request)`` (``RayReplayBufferView``
    options), else the defaults."""
    depth = getattr(replay_buffer, "requests_in_flight", None)
    per_request = getattr(replay_buffer, "batches_per_request", None)
    return (
        check_positive_int(
            DEFAULT_REQUESTS_IN_FLIGHT if depth is None else depth, "requests_in_flight"
        ),
        check_positive_int(
            DEFAULT_BATCHES_PER_REQUEST if per_request is None else per_request,
            "batches_per_request",
        ),
    )


def one_actor(replay_buffer: Any) -> bool:
    """Whether one torchrl Ray actor serves the buffer (not a ``ShardedRayReplayBuffer``,
    which keeps its own requests ahead, nor a closed buffer): the queue applies."""
    return ray_buffer_actor(replay_buffer) is not None


def live_actor(replay_buffer: Any) -> Any:
    """The Ray actor serving ``replay_buffer``; a closed buffer is a clear error."""
    actor = ray_buffer_actor(replay_buffer)
    if actor is None:
        raise BufferStateError(
            f"{type(replay_buffer).__name__} is closed: it has no actor. Build a new view "
            "(RayReplayBufferView(name=...)) or a new Ray-backed buffer."
        )
    return actor


class RemoteSampleQueue:
    """``requests_in_flight`` sample calls queued at a Ray buffer's actor, answered in order.

    Each call draws ``batches_per_request`` batches as one sample of
    ``batches_per_request * batch_size`` items, split here: the same items as that
    many draws in a row when the sampler draws each item independently (torchrl's
    ``RandomSampler`` and ``PrioritizedSampler``, no transform in the actor); any
    other buffer gets one batch per call.

    Args:
        replay_buffer: A Ray-served torchrl buffer (owner or view).
        batch_size: Items per batch.
        requests_in_flight: Calls kept queued; ``1`` is one round trip per call.
        batches_per_request: Batches each call draws.
    """

    def __init__(
        self,
        replay_buffer: Any,
        batch_size: int,
        requests_in_flight: int,
        batches_per_request: int = 1,
    ) -> None:
        self._actor = live_actor(replay_buffer)
        self._batch_size = check_positive_int(batch_size, "batch_size")
        self._depth = check_positive_int(requests_in_flight, "requests_in_flight")
        per_request = check_positive_int(batches_per_request, "batches_per_request")
        if per_request > 1 and not _draws_independent_items(self._actor):
            per_request = 1
        self._per_request = per_request
        self._pending: deque[Any] = deque()
        self._ready: deque[tuple[Any, dict[str, Any]]] = deque()

    @property
    def requests_in_flight(self) -> int:
        """Calls kept queued at the actor."""
        return self._depth

    @property
    def batches_per_request(self) -> int:
        """Batches each call draws (``1`` for a sampler whose draws are not independent)."""
        return self._per_request

    def __len__(self) -> int:
        """Calls sent and not yet read."""
        return len(self._pending)

    def next(self) -> tuple[Any, dict[str, Any]]:
        """The next ``(batch, info)``: a batch of the oldest reply, the queue topped up first.

        A failed call (an empty buffer, a dead actor) drops every queued one
        before its error is raised: the next call starts a fresh queue.
        """
        if self._ready:
            return self._ready.popleft()
        import ray

        items = self._batch_size * self._per_request
        while len(self._pending) < self._depth:
            self._pending.append(self._actor.sample.remote(items, return_info=True))
        try:
            batch, info = ray.get(self._pending.popleft())
        except Exception:
            self.drop()
            raise
        if self._per_request == 1 or not isinstance(batch, TensorDictBase) or len(batch) != items:
            return batch, info
        size = self._batch_size
        for start in range(0, items, size):
            part = {
                k: v[start : start + size] if _per_item(v, items) else v for k, v in info.items()
            }
            self._ready.append((batch[start : start + size], part))
        return self._ready.popleft()

    def drop(self) -> None:
        """Forget the queued calls and split batches (the actor still answers; replies are freed)."""
        self._pending.clear()
        self._ready.clear()


def _per_item(value: Any, items: int) -> bool:
    return isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape[0] == items


def _draws_independent_items(actor: Any) -> bool:
    """Whether the actor's buffer draws each item on its own: one sample of ``m * B``
    items is then ``m`` samples of ``B`` (one actor call, at queue creation)."""
    import ray

    # Sent by value, as the update below: the actor needs torchrl only.
    def independent(rb: Any) -> bool:
        from torchrl.data import PrioritizedSampler, RandomSampler, TensorStorage

        return (
            type(rb.sampler) in (RandomSampler, PrioritizedSampler)
            and isinstance(rb.storage, TensorStorage)
            and len(rb.transform) == 0
        )

    return bool(ray.get(actor.__ray_call__.remote(independent)))


class _UnconfirmedUpdates:
    """Priority updates for one actor: held until ``send_every`` have come, then sent as one
    call; errors of sent ones are raised at a later update."""

    def __init__(self, send_every: int) -> None:
        self.send_every = send_every
        self.held: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        self.refs: deque[Any] = deque()
        self._function: Any = None  # update_live, put in Ray's object store once

    def check(self) -> None:
        import ray

        if len(self.refs) >= MAX_UNCONFIRMED_UPDATES:
            ray.get(self.refs.popleft())
        done, _ = ray.wait(list(self.refs), num_returns=len(self.refs), timeout=0)
        for ref in done:
            self.refs.remove(ref)
            ray.get(ref)  # raises the actor's error, if any

    def send(self, actor: Any) -> None:
        """Send the held updates as one actor call (the generation check and the update in
        one call: no write lands between them)."""
        if not self.held:
            return
        import ray

        indices, priorities, generations = zip(*self.held, strict=True)
        self.held.clear()
        generation = None if generations[0] is None else torch.cat(generations)
        if self._function is None:
            # Pickling a function by value costs more than the update itself; the actor
            # reads it from the object store (Ray resolves an ObjectRef argument).
            self._function = ray.put(_update_live_function())
        self.refs.append(
            actor.__ray_call__.remote(
                self._function, torch.cat(indices), torch.cat(priorities), generation
            )
        )


def _update_live_function() -> Any:
    """The function run in the actor, defined here so that it is pickled by value (the
    actor needs torchrl only): it updates the slots still holding what was drawn and
    returns how many it dropped."""

    def update_live(rb: Any, index: Any, priority: Any, generation: Any) -> int:
        dropped = 0
        if generation is not None:
            current = rb.writer.generations_of(index)
            live = (current >= 0) & (generation >= 0) & (current == generation)
            dropped = int((~live).sum())
            index = torch.where(live, index, torch.full_like(index, -1))
        # The tree's own type: mixed precision computes priorities in bfloat16 or float16.
        rb.update_priority(index, priority.to(getattr(rb.sampler, "dtype", priority.dtype)))
        return dropped

    return update_live


_UNCONFIRMED: weakref.WeakKeyDictionary[Any, _UnconfirmedUpdates] = weakref.WeakKeyDictionary()


def _drain_at_exit() -> None:
    """At interpreter exit, before Ray's own shutdown (registered later: runs first): a
    process that updates and exits (a DDP rank after ``fit``) still delivers its updates."""
    import ray

    for replay_buffer in list(_UNCONFIRMED.keys()):
        try:
            drained(replay_buffer)
        except (ray.exceptions.RayActorError, BufferStateError):
            pass  # the actor is gone: the run said so (its updates went with its items)
        except Exception as err:  # do not raise at exit; say what was not confirmed
            name = type(replay_buffer).__name__
            logger.warning("Priority updates for a %s were not confirmed: %s", name, err)


def send_priority_update(
    replay_buffer: Any,
    batch: TensorDictBase,
    priority: Any,
    *,
    invalid: InvalidPriority = "raise",
    where: str = "update_priority",
) -> int:
    """Send new priorities for ``batch``'s items to a Ray buffer's actor; return how many
    invalid ones were replaced (:func:`~rb_lightning.buffers.priorities.check_priority`).

    Returns without waiting for the actor; an error it raised comes out of the
    next call. With ``"index_generation"`` in ``batch``, slots rewritten since the
    draw keep their priority (see the module docstring).
    """
    priority = torch.as_tensor(priority).detach().cpu()
    checked = check_priority(
        priority,
        invalid=invalid,
        replacement=lambda: current_max_priority(replay_buffer),
        where=where,
    )
    replaced = 0 if checked is priority else int((checked != priority).sum())
    index = batch["index"].cpu()
    generation = batch.get(GENERATION_KEY, None)
    generation = None if generation is None else generation.cpu()
    if not _UNCONFIRMED:  # registered again after Ray's own exit hook, so it runs before it
        atexit.unregister(_drain_at_exit)
        atexit.register(_drain_at_exit)
    pending = _UNCONFIRMED.get(replay_buffer)
    if pending is None:
        pending = _UNCONFIRMED[replay_buffer] = _UnconfirmedUpdates(
            send_every=pipeline_options(replay_buffer)[1]
        )
    pending.check()
    if index.ndim == 1:  # one item per slot: updates concatenate
        pending.held.append((index, torch.broadcast_to(checked, index.shape), generation))
    else:
        pending.send(live_actor(replay_buffer))
        pending.held.append((index, checked, generation))
    if index.ndim != 1 or len(pending.held) >= pending.send_every:
        pending.send(live_actor(replay_buffer))
    return replaced


def remote_update_priority(
    handle: Any, batch: TensorDictBase, priority: Any, *, invalid: InvalidPriority, where: str
) -> int:
    """:meth:`~rb_lightning.buffers.handles.BufferHandle.update_priority` of a Ray buffer's
    handle: :func:`send_priority_update` to ``handle.replay_buffer``."""
    return send_priority_update(handle.replay_buffer, batch, priority, invalid=invalid, where=where)


def drained(replay_buffer: Any) -> list[int]:
    """Wait for the updates sent to ``replay_buffer``'s actor and not confirmed yet; return
    how many slots each dropped. Nothing to wait for (any other buffer): ``[]``.

    Examples:
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> drained(ReplayBuffer(storage=LazyTensorStorage(4)))
        []
    """
    pending = _UNCONFIRMED.pop(replay_buffer, None)
    if pending is None:
        return []
    if pending.held:  # a closed buffer with nothing held has nothing to deliver
        pending.send(live_actor(replay_buffer))
    if not pending.refs:
        return []
    import ray

    return [int(n) for n in ray.get(list(pending.refs))]


__all__ = [
    "DEFAULT_BATCHES_PER_REQUEST",
    "DEFAULT_REQUESTS_IN_FLIGHT",
    "GENERATION_KEY",
    "RemoteSampleQueue",
    "drained",
    "live_actor",
    "one_actor",
    "pipeline_options",
    "remote_update_priority",
    "send_priority_update",
]
