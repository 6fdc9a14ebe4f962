"""``BufferStream``: the one object that draws batches from a replay buffer.

Every sampled view of a buffer (the datasets, the Hugging Face export) samples through a
:class:`BufferStream`. It owns the seeding of each copy (worker, rank), the ``min_size``
wait, the draw with the sampler's ``index`` and ``priority_weight``, and drawing several
batches per call (:attr:`BufferStream.batches_per_draw`).

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=PrioritizedSampler(10, 0.7, 0.5))
    >>> _ = rb.extend(TensorDict({"x": torch.arange(10)}, batch_size=[10]))
    >>> stream = BufferStream(rb, batch_size=4)
    >>> stream.reseed(0)
    >>> batch = stream.sample()
    >>> sorted(batch.keys()), batch.batch_size
    (['index', 'priority_weight', 'x'], torch.Size([4]))
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.data import (
    PrioritizedSampler,
    RandomSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
)

from rb_lightning import torchrl_compat
from rb_lightning.buffers.handles import BufferHandle, resolve_buffer
from rb_lightning.columns import SAMPLER_INFO_KEYS
from rb_lightning.errors import BufferStateError, SampleTimeoutError, UsageError
from rb_lightning.stream.pickling import pickled_without_generator, unpickle_buffer
from rb_lightning.stream.rate_limiter import SamplesPerInsert
from rb_lightning.stream.remote_prefetch import (
    GENERATION_KEY,
    RemoteSampleQueue,
    one_actor,
    pipeline_options,
)
from rb_lightning.stream.sharding import Shard, current_shard, draw_base_seed
from rb_lightning.validation import check_positive_int, check_replay_buffer, check_seconds

logger = logging.getLogger(__name__)


class BufferStream:
    """Draws batches of ``batch_size`` items from ``replay_buffer``, one per :meth:`sample`.

    With a ``PrioritizedSampler`` each batch carries ``"index"`` and ``"priority_weight"``
    (also from a plain ``ReplayBuffer``). A pickled copy (a DataLoader worker) leaves the
    generator out and re-seeds (:meth:`seed_replica`).

    Args:
        replay_buffer: The torchrl ``ReplayBuffer`` to sample.
        batch_size: Items per draw.

    Keyword Args:
        min_size: :meth:`wait_until_ready` waits until the buffer holds this many items.
            ``None``: an empty buffer raises at once.
        wait_timeout: Seconds to wait for ``min_size``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
        >>> stream = BufferStream(rb, batch_size=2, min_size=4, wait_timeout=0.05)
        >>> _ = rb.extend(TensorDict({"x": torch.arange(4)}, batch_size=[4]))
        >>> stream.wait_until_ready()
        >>> stream.sample()["x"].shape, stream.batches_drawn
        (torch.Size([2]), 1)
    """

    def __init__(
        self,
        replay_buffer: ReplayBuffer,
        batch_size: int,
        *,
        min_size: int | None = None,
        wait_timeout: float = 600.0,
    ) -> None:
        self._replay_buffer = check_replay_buffer(replay_buffer)
        self._handle: BufferHandle = resolve_buffer(replay_buffer)
        self._batch_size = check_positive_int(batch_size, "batch_size")
        self._min_size = check_positive_int(min_size, "min_size", allow_none=True)
        self._wait_timeout: float = check_seconds(wait_timeout, "wait_timeout")
        #: Whether batches get sampler info attached; None until the first draw decides.
        self._attach_info: bool | None = None
        #: Whether draws go through the sampler and storage directly (see _draw_direct).
        self._direct: bool = False
        #: Whether stored items lack the attached keys (decided by the first direct draw).
        self._direct_keys_free: bool | None = None
        #: Whether the buffer's own sample sets the info over stored keys (TensorDictReplayBuffer).
        self._info_overwrites: bool = False
        #: Batches drawn so far by this copy of the stream.
        self.batches_drawn: int = 0
        self._warned_small: bool = False  # the batch-larger-than-buffer line is said once
        #: Gates each draw on the replay ratio (a ``SamplesPerInsert``); ``None``: no gate.
        self.rate_limiter: SamplesPerInsert | None = None
        #: The learner's policy version, handed to version-gated samplers before each draw.
        self.consumer_version: Callable[[], int] | None = None
        self._versioned: list[Any] = self._handle.version_tracking_samplers()
        #: Sample requests queued at a Ray buffer's actor (created by the first draw).
        self._remote: RemoteSampleQueue | None = None
        self._batches_per_draw: int = 1
        #: Batches of the last draw not handed out yet (``batches_per_draw > 1``).
        self._drawn_ahead: deque[Any] = deque()

    # -- read-only configuration ------------------------------------------------------------
    @property
    def replay_buffer(self) -> ReplayBuffer:
        """The sampled buffer."""
        return self._replay_buffer

    @property
    def batch_size(self) -> int:
        """Items per draw."""
        return self._batch_size

    @property
    def min_size(self) -> int | None:
        """Items the buffer must hold before the first draw (``None``: at least one)."""
        return self._min_size

    @property
    def wait_timeout(self) -> float:
        """Seconds :meth:`wait_until_ready` waits for ``min_size``."""
        return self._wait_timeout

    @property
    def batches_per_draw(self) -> int:
        """Batches drawn by one ``rb.sample(batch_size * batches_per_draw)`` call.

        ``K > 1`` pays ``rb.sample``'s per-call work once per ``K`` steps; the later batches of a
        draw miss writes and priority updates made after it. Only for a ``RandomSampler`` or
        ``PrioritizedSampler`` sampled in this process, without version-gated sampling.
        """
        return self._batches_per_draw

    @batches_per_draw.setter
    def batches_per_draw(self, value: int) -> None:
        self._batches_per_draw = check_batches_per_draw(self._handle, value)

    def drawn_ahead(self) -> list[Any]:
        """Batches of the last draw not handed out yet, in the order they will be."""
        return list(self._drawn_ahead)

    def continue_draw(self, batches: list[Any]) -> None:
        """Hand ``batches`` (a checkpoint's :meth:`drawn_ahead`) out before drawing again."""
        self._drawn_ahead.extend(batches)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_replay_buffer"] = pickled_without_generator(self._replay_buffer)
        del state["_handle"], state["_versioned"]  # rebuilt around the unpickled buffer
        state["consumer_version"] = None  # a worker's copy gets no version updates
        state["_remote"] = None  # a copy sends its own requests
        state["_drawn_ahead"] = deque()  # a copy draws its own batches
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["_replay_buffer"] = unpickle_buffer(state["_replay_buffer"])
        state["_handle"] = resolve_buffer(state["_replay_buffer"])
        state["_versioned"] = state["_handle"].version_tracking_samplers()
        self.__dict__.update(state)

    # -- seeding ----------------------------------------------------------------------------
    def reseed(self, seed: int) -> None:
        """Sample from now on with a new generator seeded with ``seed`` (a Ray buffer's one shared sampler is left alone)."""
        self._handle.reseed(seed)

    def seed_replica(self, shard: Shard | None = None) -> None:
        """Give this copy of the stream its own random stream if other copies (workers, ranks) sample too.

        Args:
            shard: Where this copy runs; default: :func:`~rb_lightning.stream.sharding.current_shard`.
        """
        shard = current_shard() if shard is None else shard
        if shard.is_replica and self._handle.samples_in_process:
            self.reseed(shard.seed(draw_base_seed()))

    def draws_epochs(self) -> bool:
        """Whether the sampler draws epochs without replacement here (copies must then follow one order, :meth:`skip`)."""
        sampler = getattr(self._replay_buffer, "sampler", None)
        return self._handle.samples_in_process and isinstance(sampler, SamplerWithoutReplacement)

    def restart_epoch(self, seed: int) -> None:
        """Reseed with ``seed`` and start a new permutation at the next draw (copies then draw the same order)."""
        self.reseed(seed)
        torchrl_compat.restart_permutation(self._replay_buffer.sampler)

    def skip(self, batches: int) -> None:
        """Advance the sampler by ``batches`` draws without reading the storage (the same generator calls as ``rb.sample``)."""
        rb = self._replay_buffer
        for _ in range(batches):
            rb.sampler.sample(rb.storage, self._batch_size)

    # -- waiting ----------------------------------------------------------------------------
    def wait_until_ready(self, *, emptied: bool = False) -> None:
        """Block until the buffer can be sampled, or raise an error that says why not.

        Keyword Args:
            emptied: The buffer was sampled before and is empty now (reworded error).

        Raises:
            RuntimeError: Empty buffer and no ``min_size``; or ``drop_last``
                sampler and fewer items than ``batch_size``.
            TimeoutError: ``min_size`` not reached within ``wait_timeout``.
        """
        rb = self._replay_buffer
        needed = self._min_size
        if needed is None:
            if len(rb) == 0:
                if emptied:
                    raise BufferStateError(
                        f"The replay buffer became empty after {self.batches_drawn} batches "
                        "(rb.empty(), or a collector that resets it), so there is nothing to "
                        "sample. Refill it before the next batch is drawn, or pass min_size=N "
                        "(ReplayBufferDataModule(min_size=N)) to wait up to wait_timeout seconds "
                        "until it holds N items again."
                    )
                raise BufferStateError(
                    "The replay buffer is empty, so there is nothing to sample. Fill it first "
                    "(rb.extend(...)), or pass min_size=N to wait until a collector has written "
                    "N items."
                )
            needed = 1
        deadline = time.monotonic() + self._wait_timeout
        while len(rb) < needed:
            if time.monotonic() > deadline:
                raise SampleTimeoutError(
                    f"Waited {self._wait_timeout:.0f}s for the replay buffer to hold "
                    f"min_size={needed} items, it holds {len(rb)}. Is the collector writing to "
                    "this buffer (a shared or memmap storage when workers are used)? Raise "
                    "wait_timeout or lower min_size."
                )
            time.sleep(0.01)
        sampler = getattr(rb, "sampler", None)
        if len(rb) < self._batch_size and self._min_size is None and not self._warned_small:
            # Legal (a sampler with replacement repeats items), but rarely meant: say it once.
            self._warned_small = True
            logger.warning(
                "batch_size=%d is larger than the %d items the replay buffer holds: each batch "
                "repeats items. Pass min_size=%d to wait until it holds a batch's worth, or "
                "lower batch_size.",
                self._batch_size,
                len(rb),
                self._batch_size,
            )
        if getattr(sampler, "drop_last", False) and len(rb) < self._batch_size:
            raise BufferStateError(
                f"The sampler draws without replacement with drop_last=True, but the buffer "
                f"holds {len(rb)} items, fewer than batch_size={self._batch_size}: no full batch "
                "can be drawn. Lower batch_size, add data, or use drop_last=False."
            )

    # -- drawing ----------------------------------------------------------------------------
    def sample(self) -> Any:
        """Draw one batch; if the buffer was emptied meanwhile, wait (``min_size``) or explain.

        With a :attr:`rate_limiter`, first wait until the replay ratio allows a batch.
        """
        if self.rate_limiter is not None:
            self.rate_limiter.acquire_sample(self._batch_size)
        if self._drawn_ahead:
            self.batches_drawn += 1
            return self._drawn_ahead.popleft()
        if self.consumer_version is not None and self._versioned:
            version = self.consumer_version()
            for sampler in self._versioned:
                sampler.consumer_version = version
        try:
            batch = self._draw()
        except Exception:
            # Checked only on failure, so the per-batch path pays nothing: torchrl raises
            # "Cannot sample from an empty storage" (or a sampler-specific error) then.
            if len(self._replay_buffer) > 0:
                raise
            self.wait_until_ready(emptied=True)
            batch = self._draw()
        if self._batches_per_draw > 1:
            batch = self._keep_drawn_ahead(batch)
        self.batches_drawn += 1
        return batch

    def _keep_drawn_ahead(self, drawn: Any) -> Any:
        """The first batch of a multi-batch draw; the others wait in :meth:`drawn_ahead`."""
        if not isinstance(drawn, TensorDictBase):  # what a checkpoint can keep
            raise UsageError(
                "batches_per_draw",
                f"batches_per_draw={self._batches_per_draw} needs TensorDict batches, to cut "
                f"the draw into batches and checkpoint the rest; this buffer returns "
                f"{type(drawn).__name__}. Use batches_per_draw=1.",
            )
        first, *rest = drawn.split(self._batch_size)
        self._drawn_ahead.extend(rest)
        return first

    def _draw(self) -> Any:
        if not self._handle.samples_in_process and one_actor(self._replay_buffer):
            return self._draw_remote()
        if self._direct and torchrl_compat.direct_sampling_ready(self._replay_buffer):
            return self._draw_direct()
        rb = self._replay_buffer
        if self._attach_info is False:
            # return_info costs ~30% of a small sample (torchrl tree-maps the info
            # to the storage device): skip it once we know nothing would be attached.
            return rb.sample(self._batch_size * self._batches_per_draw)
        batch, info = rb.sample(self._batch_size * self._batches_per_draw, return_info=True)
        attach = False
        if isinstance(batch, TensorDictBase):
            attach = _attach(batch, info)
        # The sampler and the buffer class are fixed, so the first batch decides.
        self._attach_info = attach
        # A TensorDictReplayBuffer attached the info itself; the direct path does it for both.
        self._info_overwrites = torchrl_compat.sets_sampler_info(rb)
        self._direct = (
            attach or self._info_overwrites
        ) and torchrl_compat.supports_direct_sampling(rb)
        return batch

    def _draw_direct(self) -> Any:
        """``rb.sample(B, return_info=True)`` and the attach, without torchrl's wrapping (~20% less time on small items).

        Only where :func:`rb_lightning.torchrl_compat.supports_direct_sampling`: the same generator
        calls, items and columns.
        """
        index, info, batch = torchrl_compat.direct_sample(
            self._replay_buffer, self._batch_size * self._batches_per_draw
        )
        if self._direct_keys_free is None:
            self._direct_keys_free = not any(k in batch.keys() for k in SAMPLER_INFO_KEYS)
        if self._direct_keys_free:
            # Two CPU tensors of the batch's length from a CPU storage: known to fit, so
            # set without tensordict's per-set checks (half the cost of a small batch's sets).
            torchrl_compat.set_known_column(batch, "index", index)
            torchrl_compat.set_known_column(batch, "priority_weight", info["priority_weight"])
        elif self._info_overwrites:
            # As TensorDictReplayBuffer.sample does: the fresh info replaces stored values.
            batch.set("index", index)
            batch.set("priority_weight", info["priority_weight"])
        else:
            info["index"] = index
            _attach(batch, info)
        return batch

    def _draw_remote(self) -> Any:
        """The oldest of the requests queued at the buffer's actor (:mod:`.remote_prefetch`)."""
        if self._remote is None:
            depth, per_request = pipeline_options(self._replay_buffer)
            self._remote = RemoteSampleQueue(
                self._replay_buffer, self._batch_size, depth, per_request
            )
        batch, info = self._remote.next()
        if isinstance(batch, TensorDictBase) and _attach(batch, info):
            if GENERATION_KEY in info and GENERATION_KEY not in batch.keys():
                batch.set(GENERATION_KEY, torch.as_tensor(info[GENERATION_KEY]))
        return batch

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(replay_buffer={type(self._replay_buffer).__name__}"
            f"(len={len(self._replay_buffer)}), batch_size={self._batch_size}, "
            f"min_size={self._min_size})"
        )


def check_batches_per_draw(buffer: BufferHandle, value: int) -> int:
    """``value`` if ``buffer`` can be sampled ``value`` batches per call, else a :class:`UsageError`."""
    value = check_positive_int(value, "batches_per_draw")
    if value == 1:
        return value
    sampler = getattr(buffer.replay_buffer, "sampler", None)
    why = None
    if not buffer.samples_in_process:
        why = "a remote buffer samples in its own process (it pipelines requests instead)"
    elif type(sampler) not in (RandomSampler, PrioritizedSampler):
        why = (
            f"its sampler is a {type(sampler).__name__}, whose batches would change if drawn "
            "together (only RandomSampler and PrioritizedSampler draw items independently)"
        )
    elif buffer.version_tracking_samplers():
        why = "its sampler gates items on the policy version, which changes every step"
    if why is not None:
        raise UsageError(
            "batches_per_draw",
            f"batches_per_draw={value} cannot be used with this buffer: {why}. "
            "Use batches_per_draw=1.",
        )
    return value


def _attach(batch: TensorDictBase, info: dict[str, Any]) -> bool:
    """Set the sampler info missing from ``batch``, if the sampler produced weights."""
    extra = {k: info[k] for k in SAMPLER_INFO_KEYS if k in info and k not in batch.keys()}
    if "priority_weight" not in extra:
        return False
    for name, value in extra.items():
        batch.set(name, torch.as_tensor(value, device=batch.device))
    return True


__all__ = ["SAMPLER_INFO_KEYS", "BufferStream", "check_batches_per_draw"]
