"""A replay buffer another process extends while this one samples it; this one learns the new rows.

An asynchronous collector or GRPO generation worker writes into the buffer through
torchrl's shared state (rows in shared memory, length and cursors in
``multiprocessing.Value``s, one lock around every write and sample). The training process
*learns* the rows written since it last looked (:meth:`WorkerWrites.learn`) and hands them
to its sampler (a ``PrioritizedSampler`` gives them the max priority). A save holds the
lock, and a resumed run learns unlearned rows first. :class:`WriterLock` turns a writer
that died holding the lock into a :class:`~rb_lightning.errors.CollectorError`.

Examples:
    >>> import multiprocessing, torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8))
    >>> _ = rb.extend(TensorDict(x=torch.zeros(3), batch_size=[3]))
    >>> writes = WorkerWrites(rb, multiprocessing.get_context("fork"))
    >>> _ = writes.view.extend(TensorDict(x=torch.ones(2), batch_size=[2]))  # "the worker"
    >>> writes.unlearned(), writes.learn().tolist(), writes.unlearned()
    (2, [3, 4], 0)
    >>> writes.close()
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torchrl.data import ReplayBuffer

from rb_lightning.errors import CollectorError
from rb_lightning.torchrl_compat import stop_sharing_writes, writer_view, writes_held

__all__ = ["WorkerWrites", "WriterLock"]

#: How often a wait for the buffer's lock checks whether its holder is still alive.
_HOLDER_CHECK_S = 0.5


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child stays a zombie until its parent reaps it
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class WriterLock:
    """A process-shared lock that raises, instead of waiting forever, when its holder died.

    ``with lock:`` as torchrl's ``_write_lock``; it records the holder's pid, and a
    waiter that finds the holder gone raises :class:`~rb_lightning.errors.CollectorError`.
    """

    def __init__(self, context: Any) -> None:
        self._lock = context.Lock()
        self._holder = context.Value("q", 0, lock=False)

    def __enter__(self) -> WriterLock:
        if self._lock.acquire(block=False):  # the common case: nobody writes now
            self._holder.value = os.getpid()
            return self
        while not self._lock.acquire(timeout=_HOLDER_CHECK_S):
            holder = self._holder.value
            if holder and holder != os.getpid() and not _alive(holder):
                raise CollectorError(
                    f"The worker process (pid {holder}) that writes into the replay buffer "
                    "died while it was writing, so the rows of that write may be half written: "
                    "the run stops here instead of training on them. Its traceback, if it "
                    "raised, is above; resume from the last checkpoint (saved before that write).",
                    argument="env",
                )
        self._holder.value = os.getpid()
        return self

    def __exit__(self, *exc: object) -> None:
        self._holder.value = 0
        self._lock.release()


class WorkerWrites:
    """The training process's side of a buffer that a worker process extends.

    Args:
        replay_buffer: The buffer the trainer samples (see
            :func:`~rb_lightning.torchrl_compat.can_share_writes`).
        context: The ``multiprocessing`` context the worker starts with.
        rows_learned: The buffer's ``write_count`` the trainer had learned (a resume);
            ``None``: all of it.
    """

    def __init__(
        self, replay_buffer: ReplayBuffer, context: Any, rows_learned: int | None = None
    ) -> None:
        self.replay_buffer = replay_buffer
        self._was_shared = bool(getattr(replay_buffer, "shared", False))
        self.lock = WriterLock(context)
        #: What the worker extends: the same storage and writer, a uniform sampler.
        self.view = writer_view(replay_buffer, self.lock)
        written = replay_buffer.write_count
        self.rows_learned = written if rows_learned is None else min(rows_learned, written)
        self._capacity = int(replay_buffer.storage.max_size)

    def unlearned(self) -> int:
        """Rows the worker wrote that the trainer has not learned yet."""
        return max(self.replay_buffer.write_count - self.rows_learned, 0)

    def learn(self, up_to: int | None = None) -> torch.Tensor:
        """The storage indices written since the last call, handed to the buffer's sampler.

        ``up_to``: learn the rows up to this ``write_count`` only (``None``: all written).
        """
        with writes_held(self.replay_buffer):  # the sampler's tree, not a sample's read of it
            written = self.replay_buffer.write_count
            if up_to is not None:
                written = min(written, up_to)
            if written <= self.rows_learned:
                return torch.arange(0)
            first = max(self.rows_learned, written - self._capacity)
            index = torch.arange(first, written) % self._capacity
            if len(index):
                # What this process's own extend would have done after writing them.
                self.replay_buffer.mark_update(index)
                self.replay_buffer.sampler.extend(index)
            self.rows_learned = written
        return index

    def close(self) -> None:
        """The buffer alone again: unshared as it was, without the worker's view."""
        stop_sharing_writes(self.replay_buffer, self.view, shared=self._was_shared)
