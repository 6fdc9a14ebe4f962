"""The resumable position of a training stream: what the loop took, what was read ahead.

:class:`StreamState` lives in the training process and is what a checkpoint
saves of the stream; :class:`StreamCursor` carries the position of each new
epoch to the processes that sample (DataLoader workers) through shared memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from rb_lightning.errors import BufferStateError

#: Batches a StreamState remembers: the last one handed out. Lightning reads one batch ahead
#: of the step (when a checkpoint is written, that one was not taken yet); more is an error.
READ_AHEAD_LIMIT = 1


class StreamCursor:
    """Where an epoch of a training stream starts: stream seed, epoch, position, in a small shared tensor that persistent workers read."""

    def __init__(self, seed: int) -> None:
        self._values = torch.tensor([int(seed), 0, 0], dtype=torch.int64).share_memory_()

    def read(self) -> tuple[int, int, int]:
        """``(stream seed, epoch, batches of the epoch already handed out)``."""
        seed, epoch, position = self._values.tolist()
        return seed, epoch, position

    def write(self, seed: int, epoch: int, position: int) -> None:
        """Set the values the next iterator of the dataset starts from."""
        self._values.copy_(torch.tensor([int(seed), int(epoch), int(position)]))


class StreamState:
    """The resumable state of a training stream, kept in the training process.

    Loaders number the batches they hand out; ``progress`` says how many the loop took.
    The rest was read ahead (Lightning fetches batch ``n+1`` before step ``n``): a checkpoint
    saves those (:meth:`read_ahead`) and the resumed iterator hands them out first.

    Args:
        seed: Base of the per-epoch, per-rank, per-worker seeds of replica streams.

    Keyword Args:
        progress: Returns ``(batches of this epoch taken, whether the epoch is complete)``, or
            ``None`` outside a training loop.
        keep_read_ahead: Keep the batches handed out and not yet taken (in-process loaders;
            loaders with workers redraw instead).
    """

    def __init__(
        self,
        seed: int,
        *,
        progress: Callable[[], tuple[int, bool] | None] | None = None,
        keep_read_ahead: bool = True,
    ) -> None:
        self._seed = int(seed) % (2**63 - 1)  # torch.initial_seed() may not fit an int64
        self.cursor = StreamCursor(self._seed)
        self._progress = progress
        self._keep_read_ahead = keep_read_ahead
        self._epoch = -1  # no iterator yet
        self._handed = 0  # next position of the current epoch
        self._handed_total = 0
        # The last batches handed out, by position: the read-ahead is among them. Bounded,
        # so the per-batch path never asks the loop what it took (checkpoints do), and no
        # batch is kept alive that Lightning has let go of.
        self._records: deque[tuple[int, Any]] = deque(maxlen=READ_AHEAD_LIMIT)
        self._resume_at: tuple[int, int] | None = None
        self._replay: list[Any] = []

    # -- iteration (ResumableBatchLoader) ---------------------------------------------------
    def begin_iterator(self) -> list[Any]:
        """Start the next epoch (or continue a restored one); return batches to replay first."""
        if self._resume_at is not None:
            self._epoch, self._handed = self._resume_at
            self._resume_at = None
        else:
            self._epoch, self._handed = self._epoch + 1, 0
        replay, self._replay = self._replay, []
        self._records.clear()  # what an earlier iterator read ahead was dropped with it
        self.cursor.write(self._seed, self._epoch, self._handed + len(replay))
        return replay

    def handed_out(self, batch: Any) -> None:
        """Record one batch given to the training loop (the oldest record drops out)."""
        if self._keep_read_ahead:
            self._records.append((self._handed, batch))
        self._handed += 1
        self._handed_total += 1

    # -- checkpoint -------------------------------------------------------------------------
    def _position(self) -> tuple[int, int, bool]:
        """(epoch, batches the loop took of it, epoch complete)."""
        progress = self._progress() if self._progress is not None else None
        consumed, done = (self._handed, False) if progress is None else progress
        return max(self._epoch, 0), min(consumed, self._handed), done

    @property
    def batches_served(self) -> int:
        """Training batches the loop has taken, counted across resumed runs."""
        if self._resume_at is not None:
            return self._handed_total
        _, consumed, _ = self._position()
        # Handed out and not taken: read ahead (an epoch that ended drops it).
        return self._handed_total - max(self._handed - consumed, 0)

    def read_ahead(self) -> list[Any]:
        """Batches handed out for the current epoch that the loop has not taken yet."""
        if self._resume_at is not None:
            return list(self._replay)  # restored and not handed out yet: still ahead
        _, consumed, done = self._position()
        if done or not self._keep_read_ahead:
            return []
        ahead = [batch for position, batch in self._records if position >= consumed]
        if len(ahead) != self._handed - consumed:
            raise BufferStateError(
                f"The training loop read {self._handed - consumed} batches ahead of its step, "
                f"more than the {READ_AHEAD_LIMIT} a checkpoint can keep, so the resumed "
                "stream could not continue exactly. This happens when a loop prefetches more "
                "than Lightning's one batch; report it with the Trainer's settings."
            )
        return ahead

    def state_dict(self) -> dict[str, int]:
        """Where the next iterator starts: plain ints (``torch.load(weights_only=True)``)."""
        if self._resume_at is not None:  # restored, not iterated yet: still there
            epoch, position = self._resume_at
            return {
                "seed": self._seed,
                "epoch": epoch,
                "position": position,
                "batches_served": self._handed_total,
            }
        epoch, consumed, done = self._position()
        if self._epoch < 0:
            epoch, consumed = 0, 0
        elif done:
            epoch, consumed = epoch + 1, 0
        return {
            "seed": self._seed,
            "epoch": epoch,
            "position": consumed,
            "batches_served": self.batches_served,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from :meth:`state_dict`: the next iterator resumes the saved epoch."""
        self._seed = int(state["seed"]) % (2**63 - 1)
        self._resume_at = (int(state["epoch"]), int(state["position"]))
        self._handed_total = int(state["batches_served"])
        self._epoch, self._handed = -1, 0
        self._records.clear()

    def replay_first(self, batches: list[Any]) -> None:
        """Batches restored from a checkpoint's read-ahead: the next iterator hands them out first."""
        self._replay = list(batches)


def fit_loop_progress(trainer: Any) -> tuple[int, bool] | None:
    """Batches of the current epoch the fit loop has taken (Lightning's ``ready`` counter), and whether it is done; ``None`` outside a Trainer."""
    if trainer is None:
        return None
    ready = trainer.fit_loop.epoch_loop.batch_progress.current.ready
    return ready, ready >= trainer.num_training_batches


__all__ = ["READ_AHEAD_LIMIT", "StreamCursor", "StreamState", "fit_loop_progress"]
