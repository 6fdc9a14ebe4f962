"""``SamplesPerInsert``: the replay ratio, enforced by the data source (Reverb's rate limiter).

Counted in items: nothing is sampled before ``min_size`` inserts; then the trainer waits
while it is more than ``error_buffer / 2`` samples ahead of
``(inserted - min_size) * samples_per_insert``, and the collector while it is that far
behind. A synchronous collector is asked for frames when the trainer would wait. The
counters are checkpointed with the DataModule.

Examples:
    >>> limiter = SamplesPerInsert(samples_per_insert=4.0, min_size=100, error_buffer=64)
    >>> limiter.can_sample(32)  # 0 of min_size=100 inserted
    False
    >>> limiter.record_insert(108)  # 8 past min_size: 32 samples due, +- 32
    >>> limiter.can_sample(32), limiter.can_sample(65)
    (True, False)
    >>> limiter.record_sample(32)
    >>> limiter.samples_per_insert_observed()
    4.0
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from rb_lightning.errors import ArgumentTypeError, SampleTimeoutError, UsageError

__all__ = ["SamplesPerInsert", "check_rate_limiter"]


class SamplesPerInsert:
    """Keep ``sampled ≈ (inserted - min_size) * samples_per_insert`` within ``error_buffer``.

    Args:
        samples_per_insert: Items sampled per item inserted: how often each frame is replayed.
        min_size: Items inserted before the first sample (Reverb's ``min_size_to_sample``).
        error_buffer: Slack around the target, in items; at least
            ``2 * max(1, samples_per_insert)`` and a batch. ``None``: two batches.
        timeout: Seconds a side may wait before the run stops with
            :class:`~rb_lightning.errors.SampleTimeoutError` naming the side that stalled.
    """

    def __init__(
        self,
        samples_per_insert: float = 1.0,
        min_size: int = 1,
        error_buffer: float | None = None,
        timeout: float = 60.0,
    ) -> None:
        if not (isinstance(samples_per_insert, (int, float)) and samples_per_insert > 0):
            raise UsageError(
                "samples_per_insert",
                f"samples_per_insert must be a positive number (items sampled per item "
                f"inserted), got {samples_per_insert!r}.",
            )
        if not isinstance(min_size, int) or isinstance(min_size, bool) or min_size < 1:
            raise UsageError("min_size", f"min_size must be an integer >= 1, got {min_size!r}.")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise UsageError(
                "timeout", f"timeout must be a positive number of seconds, got {timeout!r}."
            )
        self.samples_per_insert = float(samples_per_insert)
        self.min_size = min_size
        self.error_buffer = None if error_buffer is None else float(error_buffer)
        if self.error_buffer is not None:
            self._check_error_buffer(self.error_buffer, batch_size=None)
        self.timeout = float(timeout)
        self.inserted = 0
        self.sampled = 0
        #: Seconds the trainer and the collector spent waiting, since the start of this process.
        self.trainer_wait_s = 0.0
        self.collector_wait_s = 0.0
        self._changed = threading.Condition()
        # A waiting collector is woken when `sampled` reaches this, not at every batch:
        # a thread woken per training step would take the GIL from the trainer each time.
        self._wake_collector_at = math.inf
        self._insert_on_demand: Callable[[], int] | None = None

    def _check_error_buffer(self, error_buffer: float, batch_size: int | None) -> None:
        floor = 2 * max(1.0, self.samples_per_insert)
        if error_buffer < floor:
            raise UsageError(
                "error_buffer",
                f"SamplesPerInsert(error_buffer={error_buffer:g}) is below 2 * max(1, "
                f"samples_per_insert) = {floor:g}: one insert moves the target by "
                f"samples_per_insert, so a narrower window would stall both sides. Raise "
                f"error_buffer to at least {floor:g}.",
            )
        if batch_size is not None and error_buffer < batch_size:
            raise UsageError(
                "error_buffer",
                f"SamplesPerInsert(error_buffer={error_buffer:g}) is smaller than a batch "
                f"({batch_size} items): the trainer draws a whole batch at once, which the "
                f"window could never admit. Raise error_buffer to at least {batch_size}.",
            )

    # -- setup ------------------------------------------------------------------------------
    def check(self, *, batch_size: int, capacity: int | None) -> None:
        """Fit the limiter to the DataModule: error buffer (default two batches), capacity."""
        if self.error_buffer is None:
            self.error_buffer = float(max(2 * batch_size, 2 * max(1.0, self.samples_per_insert)))
        self._check_error_buffer(self.error_buffer, batch_size)
        if capacity is not None and self.min_size > capacity:
            raise UsageError(
                "min_size",
                f"SamplesPerInsert(min_size={self.min_size}) is more than the replay buffer "
                f"holds ({capacity} items): sampling could never start. Lower min_size or "
                "give the buffer a larger storage.",
            )

    def inserts_per_batch(self, batch_size: int, multiple: int = 1) -> int:
        """Inserts that pay for one batch, rounded up to whole ``multiple``s (environment copies).

        A collector asked for frames on demand collects this many at a time, so the
        ratio never strays by more than a batch from its target.

        Examples:
            >>> SamplesPerInsert(samples_per_insert=4.0).inserts_per_batch(16, multiple=3)
            6
        """
        frames = max(1, math.ceil(batch_size / self.samples_per_insert))
        return math.ceil(frames / multiple) * multiple

    def insert_on_demand(self, collect: Callable[[], int] | None) -> None:
        """Register (or remove) a collector in the training process, called when the trainer
        would wait: it collects some frames and returns how many it inserted."""
        self._insert_on_demand = collect

    # -- the two sides ----------------------------------------------------------------------
    def _target(self) -> float:
        return (self.inserted - self.min_size) * self.samples_per_insert

    def can_sample(self, n: int) -> bool:
        """Whether ``n`` more samples keep the trainer within the window."""
        if self.inserted < self.min_size:
            return False
        half = (self.error_buffer or 0.0) / 2
        return self.sampled + n <= self._target() + half

    def can_insert(self, n: int) -> bool:
        """Whether ``n`` more inserts keep the collector within the window."""
        if self.inserted + n <= self.min_size:
            return True
        half = (self.error_buffer or 0.0) / 2
        return (self.inserted + n - self.min_size) * self.samples_per_insert <= self.sampled + half

    def inserts_needed(self, n: int) -> int:
        """Inserts still missing before ``n`` samples are allowed."""
        half = (self.error_buffer or 0.0) / 2
        needed = self.min_size + math.ceil((self.sampled + n - half) / self.samples_per_insert)
        return max(0, max(needed, self.min_size) - self.inserted)

    def acquire_sample(self, n: int) -> None:
        """Block until ``n`` samples are allowed (collecting on demand), then count them."""
        start = time.monotonic()
        while not self.can_sample(n):
            if self._insert_on_demand is not None:
                if self._insert_on_demand() == 0:
                    raise SampleTimeoutError(
                        "The synchronous collector inserted nothing although the rate limiter "
                        f"needs {self.inserts_needed(n)} more frames before the next batch; "
                        "check its environment.",
                        argument="rate_limiter",
                    )
                continue
            self._wait_for_the_other_side(
                start,
                lambda: (
                    f"The trainer waited {self.timeout:g}s for the collector: the rate limiter "
                    f"(samples_per_insert={self.samples_per_insert:g}, min_size={self.min_size}) "
                    f"needs {self.inserts_needed(n)} more inserted frames before the next batch "
                    f"of {n}, and none arrived (inserted {self.inserted}, sampled "
                    f"{self.sampled}). Is the collector running? Raise timeout, or lower "
                    "samples_per_insert's demand on the collector."
                ),
            )
        self.trainer_wait_s += time.monotonic() - start
        self.record_sample(n)

    def acquire_insert(self, n: int) -> None:
        """Block until ``n`` inserts are allowed, then count them."""
        self.wait_for_insert(n)
        self.record_insert(n)

    def wait_for_insert(
        self, n: int | Callable[[], int], stop: threading.Event | None = None
    ) -> None:
        """Block until ``n`` inserts are allowed (or ``stop`` is set), without counting them; ``n`` may be a callable, asked again after each wait."""
        start = time.monotonic()
        count = n if callable(n) else (lambda: n)
        while not self.can_insert(count()):
            if stop is not None and stop.is_set():
                return
            half = (self.error_buffer or 0.0) / 2
            needed = self.inserted + count() - self.min_size
            self._wake_collector_at = needed * self.samples_per_insert - half
            self._wait_for_the_other_side(
                start,
                lambda: (
                    f"The collector waited {self.timeout:g}s for the trainer: the rate limiter "
                    f"(samples_per_insert={self.samples_per_insert:g}) lets it run only "
                    f"{(self.error_buffer or 0) / 2:g} samples ahead, and the trainer drew "
                    f"nothing meanwhile (inserted {self.inserted}, sampled {self.sampled}). "
                    "Is training stuck? Raise timeout or error_buffer."
                ),
            )
        self._wake_collector_at = math.inf
        self.collector_wait_s += time.monotonic() - start

    def _wait_for_the_other_side(self, start: float, stalled: Callable[[], str]) -> None:
        """Wait briefly for a count to change; past ``timeout``, raise what ``stalled`` says."""
        with self._changed:
            self._changed.wait(0.05)
        if time.monotonic() - start > self.timeout:
            raise SampleTimeoutError(stalled(), argument="rate_limiter")

    def record_sample(self, n: int) -> None:
        """Count ``n`` sampled items."""
        with self._changed:
            self.sampled += n
            if self.sampled >= self._wake_collector_at:
                self._changed.notify_all()

    def wake(self) -> None:
        """Make a waiting side look at the counts again (something it counts changed)."""
        with self._changed:
            self._changed.notify_all()

    def record_insert(self, n: int) -> None:
        """Count ``n`` inserted items."""
        with self._changed:
            self.inserted += n
            self._changed.notify_all()

    def samples_per_insert_observed(self) -> float:
        """Items sampled per item inserted past ``min_size`` so far (``nan`` before any)."""
        past = self.inserted - self.min_size
        return self.sampled / past if past > 0 else math.nan

    # -- checkpoint -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The counters (plain numbers: ``torch.load(weights_only=True)`` reads them)."""
        return {"inserted": self.inserted, "sampled": self.sampled}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the ratio of the saved run."""
        self.inserted = int(state["inserted"])
        self.sampled = int(state["sampled"])

    def __repr__(self) -> str:
        return (
            f"SamplesPerInsert(samples_per_insert={self.samples_per_insert:g}, "
            f"min_size={self.min_size}, error_buffer={self.error_buffer}, "
            f"inserted={self.inserted}, sampled={self.sampled})"
        )


def check_rate_limiter(rate_limiter: Any, num_workers: int) -> SamplesPerInsert | None:
    """The DataModule's ``rate_limiter`` argument, checked against its ``num_workers``."""
    if rate_limiter is None:
        return None
    if not isinstance(rate_limiter, SamplesPerInsert):
        raise ArgumentTypeError(
            "rate_limiter",
            "rate_limiter must be a rb_lightning.stream.rate_limiter.SamplesPerInsert, got "
            f"{type(rate_limiter).__name__}.",
        )
    if num_workers > 0:
        raise UsageError(
            "num_workers",
            f"A rate_limiter with num_workers={num_workers}: worker processes sample their own "
            "copies, so the limiter in the training process would count none of their "
            "samples. Use num_workers=0 with a rate limiter.",
        )
    return rate_limiter
