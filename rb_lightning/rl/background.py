"""Collection that runs beside training: a torchrl collector in a worker process or a thread.

``mode="process"``: torchrl's :class:`~torchrl.collectors.AsyncCollector`, one worker
process; weights reach it through ``update_policy_weights_``. Given ``write_into`` (a
buffer torchrl can share) the worker extends it itself and each batch arrives as
:class:`WrittenRows` (:mod:`rb_lightning.buffers.shared_writes`); otherwise frames come back
through a small queue. ``mode="thread"``: torchrl's :class:`~torchrl.collectors.Collector`
iterated by a thread (no start-up cost; shares the GIL). Every frame carries the version
of the weights that acted (:class:`VersionStamp` travels with the weights).

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from tensordict.nn import TensorDictModule
    >>> policy = with_version_stamp(
    ...     TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"]))
    >>> set_stamped_version(policy, 7)
    >>> policy(TensorDict(observation=torch.zeros(3, 4), batch_size=[3]))["policy_version"]
    tensor([7, 7, 7])
"""

from __future__ import annotations

import copy
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from torchrl.collectors import AsyncCollector, Collector
from torchrl.data import ReplayBuffer
from torchrl.envs import EnvBase

from rb_lightning.buffers.shared_writes import WorkerWrites
from rb_lightning.errors import ArgumentTypeError, CollectorError, SampleTimeoutError
from rb_lightning.policy_version import POLICY_VERSION_KEY
from rb_lightning.rl.acting import StoredFrames
from rb_lightning.rl.worker_start import (
    StartMethod,
    check_start_method,
    global_start_method,
    start_worker,
)
from rb_lightning.torchrl_compat import can_share_writes, only_view_attached

__all__ = [
    "BackgroundCollection",
    "CollectionMode",
    "StartMethod",
    "VersionStamp",
    "WrittenRows",
    "check_start_method",
    "set_stamped_version",
    "with_version_stamp",
]

CollectionMode = Literal["process", "thread"]


@dataclass(frozen=True)
class WrittenRows:
    """A delivery of rows the worker wrote itself: ``index`` (storage indices, already given to the sampler) and the ``returns`` of episodes they finished."""

    index: torch.Tensor
    returns: list[float]

    def numel(self) -> int:
        """Rows written."""
        return len(self.index)


#: What the training side is handed: frames to write, or rows the worker wrote.
Delivery: TypeAlias = TensorDictBase | WrittenRows


class VersionStamp(TensorDictModuleBase):
    """Writes its ``version`` buffer to every row (a buffer: it travels with the weights)."""

    version: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.in_keys: list = []
        self.out_keys = [POLICY_VERSION_KEY]
        self.register_buffer("version", torch.zeros((), dtype=torch.int64))

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict.set(POLICY_VERSION_KEY, self.version.expand(tensordict.shape).clone())


def with_version_stamp(policy: TensorDictModuleBase) -> TensorDictSequential:
    """``policy`` followed by a :class:`VersionStamp` writing ``policy_version``."""
    return TensorDictSequential(policy, VersionStamp())


def set_stamped_version(policy: TensorDictSequential, version: int) -> None:
    """Set the version that ``policy`` (from :func:`with_version_stamp`) writes."""
    stamp = policy[-1]
    if not isinstance(stamp, VersionStamp):
        raise ArgumentTypeError(
            "policy", "set_stamped_version needs a policy built by with_version_stamp."
        )
    stamp.version.fill_(version)


class BackgroundCollection:
    """Run ``policy`` in ``make_env()`` beside training; hand back what it collected.

    Args:
        make_env: Builds the environment (picklable in ``"process"`` mode).
        policy: The acting policy, stamped (:func:`with_version_stamp`); copied in
            ``"thread"`` mode, so training never changes weights mid-rollout.
        frames_per_batch: Frames per delivered batch.
        mode: ``"process"`` or ``"thread"``.
        seed: Seed of the environment.
        version: The policy version of the weights ``policy`` holds now.
        max_frames_per_traj: As torchrl's collectors.
        before_next: Called before each batch with a count of pending frames and the stop
            event; may block (the rate limiter's ``wait_for_insert``).
        on_stored: Called after each batch was stored (the rate limiter's ``wake``).
        start_method: How ``"process"`` mode starts its worker (:func:`check_start_method`).
        start_timeout: Seconds to wait for the worker to start before killing it and raising
            :class:`~rb_lightning.errors.CollectorError`.
        write_into: ``"process"`` mode: a buffer the worker extends itself (converted by
            ``postproc``) when torchrl can share it; deliveries are then :class:`WrittenRows`,
            otherwise the frames, for the caller to write.
        postproc: What a batch becomes in ``write_into`` (the worker runs it).
        rows_learned: The ``write_count`` of ``write_into`` the trainer had learned (a resumed
            run learns the rest first); ``None``: all of it.
    """

    def __init__(
        self,
        make_env: Callable[[], EnvBase],
        policy: TensorDictSequential,
        *,
        frames_per_batch: int,
        mode: CollectionMode,
        seed: int,
        version: int = 0,
        max_frames_per_traj: int | None = None,
        before_next: Callable[[Callable[[], int], threading.Event], None] | None = None,
        on_stored: Callable[[], None] | None = None,
        start_method: StartMethod | None = None,
        start_timeout: float = 60.0,
        write_into: ReplayBuffer | None = None,
        postproc: StoredFrames | None = None,
        rows_learned: int | None = None,
    ) -> None:
        self.mode = mode
        set_stamped_version(policy, version)  # the weights the collector starts with
        self.frames_per_batch = frames_per_batch
        self._source_policy = policy
        common = dict(
            frames_per_batch=frames_per_batch,
            total_frames=-1,
            max_frames_per_traj=max_frames_per_traj,
            storing_device="cpu",
            auto_register_policy_transforms=False,
        )
        # torchrl's multi-process collectors change this process's torch threads when
        # they start and stop (minus, then plus, their workers); the trainer keeps its own.
        self._torch_threads = torch.get_num_threads()
        #: The worker's writes into ``write_into`` (``None``: deliveries are frames).
        self.writes: WorkerWrites | None = None
        self._returns: Any = None  # with writes: the worker's finished returns (a SimpleQueue)
        if mode == "process":
            with global_start_method(start_method):
                self.collector: Collector | AsyncCollector = self._start_process(
                    make_env, policy, start_timeout, write_into, postproc, rows_learned, common
                )
        else:
            self.collector = Collector(make_env(), copy.deepcopy(policy), **common)
        self.collector.set_seed(seed)
        self._before_next = before_next
        self._on_stored = on_stored
        self._ready: queue.Queue[TensorDictBase] = queue.Queue(maxsize=1)
        self._failure: BaseException | None = None
        self._weights: TensorDictBase | None = None
        # Frames delivered and not yet written (counted until `store` returns): the rate
        # limiter's view of the collector would otherwise miss a batch being written.
        self._pending_frames = 0
        self._pending_lock = threading.Lock()
        self._stop = threading.Event()
        # Worker writes: a batch was written / the trainer learned what was written.
        self._rows_noticed = 0 if self.writes is None else self.writes.rows_learned
        self._arrived = threading.Event()
        self._learned = threading.Event()
        self._thread = threading.Thread(target=self._feed, name="rb-lightning-collection")
        self._thread.daemon = True  # never keeps a dying interpreter alive
        self._thread.start()

    def _start_process(
        self,
        make_env: Callable[[], EnvBase],
        policy: TensorDictSequential,
        timeout: float,
        write_into: ReplayBuffer | None,
        postproc: StoredFrames | None,
        rows_learned: int | None,
        options: dict[str, Any],
    ) -> AsyncCollector:
        options = dict(options, num_threads=self._torch_threads)
        # The worker gets a copy: torchrl moves the policy it is given into shared memory
        # and writes every weight update into it, so given the trainer's own module, a
        # late update would write older weights over what the optimizer had just stepped.
        policy = copy.deepcopy(policy)
        if write_into is None or postproc is None or not can_share_writes(write_into):
            return start_worker(make_env, policy, timeout, **options)
        # torchrl starts its worker with the program's start method, spawn if none is set:
        # the lock and queues the worker shares must come from that context.
        method = multiprocessing.get_start_method(allow_none=True) or "spawn"
        context = multiprocessing.get_context(method)
        writes = WorkerWrites(write_into, context, rows_learned)
        # The returns of the episodes the worker's frames finish, sent by its postproc.
        returns = context.SimpleQueue()
        try:
            with only_view_attached(write_into, writes.view):
                collector = start_worker(
                    make_env,
                    policy,
                    timeout,
                    replay_buffer=writes.view,
                    postproc=postproc.reporting_to(returns.put),
                    # Rollouts into preallocated tensors, as without a buffer: torchrl turns
                    # them off when it is given one, but here its runner does the writing.
                    use_buffers=True,
                    **options,
                )
        except BaseException:
            writes.close()
            returns.close()
            raise
        self.writes = writes
        self._returns = returns
        return collector

    # -- the collecting thread ------------------------------------------------------------
    def _feed(self) -> None:
        try:
            frames: Iterator[TensorDictBase] = iter(self.collector)
            while not self._stop.is_set() and not self._dead_workers():
                # (A dead worker would never acknowledge weights: the training side
                # reports it, this thread just ends.)
                weights, self._weights = self._weights, None
                if weights is not None:
                    self.collector.update_policy_weights_(weights)
                if self._before_next is not None:
                    # Starts a batch unless even one more frame past those delivered
                    # and not yet written would run ahead of the trainer.
                    self._before_next(lambda: self._pending() + 1, self._stop)
                    if self._stop.is_set():
                        return
                batch = next(frames)
                if self.writes is not None:  # the worker wrote it into the buffer
                    self._await_learning()
                    continue
                with self._pending_lock:
                    self._pending_frames += batch.numel()
                while not self._stop.is_set():
                    try:
                        self._ready.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as error:  # handed to the training process by take()
            if not self._stop.is_set():
                self._failure = error

    def _await_learning(self) -> None:
        # Taking a batch's notice asks the worker for the next one (torchrl's AsyncCollector):
        # notices are taken while at most one noticed batch is unlearned, as frames were
        # while at most one delivered batch waited in the queue.
        assert self.writes is not None
        # What the worker has written now: this batch (the next one takes it milliseconds
        # more), however many rows torchrl made of frames_per_batch.
        self._rows_noticed = max(self._rows_noticed, self.writes.replay_buffer.write_count)
        self._arrived.set()
        while not self._stop.is_set() and self._pending() > self.frames_per_batch:
            self._learned.wait(0.05)
            self._learned.clear()

    # -- the training side ----------------------------------------------------------------
    def sync(self, version: int) -> None:
        """Hand the policy's current weights, stamped with ``version``, to the collector.

        The collecting thread sends the copy before its next batch (torchrl's
        ``update_policy_weights_`` waits for the worker, the training loop should not); a newer
        copy replaces an unsent one.
        """
        set_stamped_version(self._source_policy, version)
        self._weights = TensorDict.from_module(self._source_policy).clone()

    def _finished_returns(self) -> list[float]:
        """The returns of the episodes the worker's frames finished since the last call."""
        returns: list[float] = []
        while not self._returns.empty():
            returns.extend(self._returns.get())
        return returns

    def _pending(self) -> int:
        """Frames delivered (written by the worker: noticed) that the trainer has not taken yet.

        Rows the worker wrote before their batch's notice was taken are neither pending
        nor learned: that batch is the one torchrl's collector starts, unasked, as it hands
        back the last, and it counts once its notice is taken, as a delivered one did.
        """
        if self.writes is not None:
            return max(self._rows_noticed - self.writes.rows_learned, 0)
        return self._pending_frames

    def ready(self, store: Callable[[Delivery], None]) -> None:
        """Hand every batch collected since the last call to ``store``, without waiting."""
        self._raise_failure()
        if self.writes is not None:
            if self._pending():
                self._deliver(None, store)
            return
        while True:
            try:
                batch = self._ready.get_nowait()
            except queue.Empty:
                return
            self._deliver(batch, store)

    def take(self, timeout: float, store: Callable[[Delivery], None]) -> None:
        """Hand the next collected batch to ``store``; wait up to ``timeout`` seconds for it."""
        deadline = time.monotonic() + timeout
        while self.writes is not None:
            self._raise_failure()
            if self._pending():
                return self._deliver(None, store)
            if time.monotonic() >= deadline:
                raise SampleTimeoutError(self._stalled(timeout), argument="timeout")
            self._arrived.wait(min(0.1, max(deadline - time.monotonic(), 0)))
            self._arrived.clear()
        while True:
            self._raise_failure()
            try:
                batch = self._ready.get(timeout=min(0.1, max(deadline - time.monotonic(), 0)))
                return self._deliver(batch, store)
            except queue.Empty:
                if time.monotonic() >= deadline:
                    self._raise_failure()
                    raise SampleTimeoutError(self._stalled(timeout), argument="timeout") from None

    def _stalled(self, timeout: float) -> str:
        dead = self._dead_workers()
        if dead:
            why = (
                f"its worker process died (exit code {dead[0].exitcode}); its traceback is "
                "above in the log"
            )
        elif not self._thread.is_alive():
            why = "its thread ended"
        else:
            why = "no frames arrived (an environment step that never returns?)"
        return (
            f"The trainer waited {timeout:g}s for the asynchronous collector ({self.mode}): "
            f"{why}. Check the environment; raise the collector's timeout if its steps are "
            "legitimately that slow."
        )

    def _deliver(self, batch: TensorDictBase | None, store: Callable[[Delivery], None]) -> None:
        try:
            if batch is None:
                assert self.writes is not None
                index = self.writes.learn(self._rows_noticed)
                self._learned.set()
                store(WrittenRows(index, self._finished_returns()))
            else:
                store(batch)
        finally:
            if batch is not None:
                with self._pending_lock:
                    self._pending_frames -= batch.numel()
            if self._on_stored is not None:  # the collector may wait on the pending count
                self._on_stored()

    def _dead_workers(self) -> list:
        return [p for p in getattr(self.collector, "procs", []) if not p.is_alive()]

    def _raise_failure(self) -> None:
        dead = self._dead_workers()
        if dead and self._failure is None:
            raise CollectorError(
                f"The asynchronous collector's worker process died (exit code "
                f"{dead[0].exitcode}): the environment or the acting policy raised; its "
                "traceback is above in the log.",
                argument="env",
            )
        if self._failure is not None:
            failure, self._failure = self._failure, None
            if isinstance(failure, SampleTimeoutError):
                raise failure
            raise CollectorError(
                f"The asynchronous collector ({self.mode}) stopped: "
                f"{type(failure).__name__}: {failure}. The environment or the acting policy "
                "raised; its traceback is above this one.",
                argument="env",
            ) from failure

    def close(self) -> None:
        """Stop collecting; join the thread and the worker process (idempotent); unlearned rows are learned on resume."""
        self._stop.set()
        while True:  # free a feeder blocked on a full queue
            try:
                self._ready.get_nowait()
            except queue.Empty:
                break
        # The collecting thread ends at its next check of the stop event; while the
        # worker lives, whatever it waits on (a batch, a weight acknowledgement) arrives.
        if not self._dead_workers():
            self._thread.join(timeout=10)
        try:
            self.collector.shutdown(raise_on_error=False)
            torch.set_num_threads(self._torch_threads)
            if self.writes is not None:
                self.writes.close()
                self._returns.close()
        finally:
            # torchrl's weight sync waits for the worker's acknowledgement without a
            # timeout: a thread caught in it when the worker died stays blocked. It is a
            # daemon (it ends with the interpreter) and holds nothing the run needs.
            self._thread.join(timeout=1)
