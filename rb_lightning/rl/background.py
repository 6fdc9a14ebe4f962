"""Collection that runs beside training: a torchrl collector in a worker process or a thread.

The environment steps and the acting policy run away from the training loop; the
frames come back through a small queue and the *training* process writes them into
the replay buffer. Writes stay in one process because a ``PrioritizedSampler``'s
sum tree and the buffer's write cursor live there: torchrl's ``collector.start()``
would extend the buffer from the worker, which a shared storage can follow but a
priority tree cannot.

* ``mode="process"``: torchrl's :class:`~torchrl.collectors.AsyncCollector`, one
  worker process (real parallelism on CPU). Weights reach it through torchrl's
  ``update_policy_weights_``; the worker collects its next batch while the trainer
  uses the last one.
* ``mode="thread"``: torchrl's :class:`~torchrl.collectors.Collector`, iterated by a
  thread of the training process (no start-up cost; shares the GIL with training).

Every frame carries the policy version of the weights that acted: the acting policy
is followed by a :class:`VersionStamp` whose ``version`` buffer travels with the
weights, so a frame collected just before a weight update keeps the old version.

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

import contextlib
import copy
import gc
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from torchrl.collectors import AsyncCollector, Collector
from torchrl.envs import EnvBase

from rb_lightning.errors import ArgumentTypeError, CollectorError, SampleTimeoutError, UsageError
from rb_lightning.policy_version import POLICY_VERSION_KEY

__all__ = [
    "BackgroundCollection",
    "CollectionMode",
    "StartMethod",
    "VersionStamp",
    "check_start_method",
    "set_stamped_version",
    "with_version_stamp",
]

CollectionMode = Literal["process", "thread"]
#: ``multiprocessing`` start methods of a collector's worker process.
StartMethod = Literal["spawn", "fork", "forkserver"]


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


def check_start_method(
    start_method: StartMethod | None, starts_a_process: bool
) -> StartMethod | None:
    """``start_method``, checked: a ``multiprocessing`` start method, for a worker process only.

    ``"fork"`` copies the training process: it must not have initialised CUDA (a forked
    child cannot use it).
    """
    if start_method is None:
        return None
    if start_method not in multiprocessing.get_all_start_methods():
        raise UsageError(
            "start_method",
            f"start_method must be one of {multiprocessing.get_all_start_methods()} on this "
            f"platform, got {start_method!r}.",
        )
    if not starts_a_process:
        raise UsageError(
            "start_method",
            "start_method applies to asynchronous collection in a worker process "
            "(asynchronous=True, run_in='process'); remove it or collect in a process.",
        )
    if start_method == "fork" and torch.cuda.is_initialized():
        raise UsageError(
            "start_method",
            "start_method='fork' copies the training process, which has initialised CUDA: a "
            "forked worker cannot use it. Use 'spawn' (the default) on GPU machines.",
        )
    return start_method


def _start_worker(
    make_env: Callable[[], EnvBase], policy: TensorDictSequential, timeout: float, **options: Any
) -> AsyncCollector:
    """torchrl's ``AsyncCollector``, or a :class:`CollectorError` if its worker is not up in time.

    torchrl waits for a starting worker without a timeout (a worker that fails while
    importing the main script never answers): the workers started here are killed after
    ``timeout`` seconds, which ends that wait.
    """
    before = set(multiprocessing.active_children())
    late = threading.Event()

    def kill_new_workers() -> None:
        late.set()
        for child in set(multiprocessing.active_children()) - before:
            child.kill()

    timer = threading.Timer(timeout, kill_new_workers)
    timer.daemon = True
    timer.start()
    try:
        return AsyncCollector(make_env, policy, **options)
    except Exception as error:
        if not late.is_set():
            raise
        # The traceback's frames hold the half-built collector, whose weight-sync scheme
        # would be finalized at interpreter exit, where it blocks: free it now.
        error.__traceback__ = None
    finally:
        timer.cancel()
    gc.collect()
    raise CollectorError(
        f"The asynchronous collector's worker process did not start within {timeout:g}s and "
        "was stopped. With start_method 'spawn' or 'forkserver' (spawn is the default) the "
        "worker imports the program's main script again: a script that starts training "
        'outside `if __name__ == "__main__":` makes the worker fail before it can start. '
        "Put the script's training code under that guard (train.py does), use "
        "start_method='fork' on a CPU machine, or raise the rate limiter's timeout if the "
        "worker's imports are that slow.",
        argument="start_method",
    )


@contextlib.contextmanager
def _global_start_method(start_method: StartMethod | None) -> Iterator[None]:
    # torchrl starts its workers with the program's global start method when one is set
    # (spawn otherwise): set it for this one start, then put the program's back.
    if start_method is None:
        yield
        return
    previous = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(start_method, force=True)
    try:
        yield
    finally:
        multiprocessing.set_start_method(previous, force=True)


class BackgroundCollection:
    """Run ``policy`` in ``make_env()`` beside training; hand back what it collected.

    Args:
        make_env: Builds the environment (a picklable callable in ``"process"`` mode).
        policy: The acting policy, stamped (:func:`with_version_stamp`). In
            ``"thread"`` mode it is copied, so that training never changes the
            weights in the middle of a rollout.
        frames_per_batch: Frames per delivered batch.
        mode: ``"process"`` or ``"thread"``.
        seed: Seed of the environment.
        version: The policy version of the weights ``policy`` holds now.
        max_frames_per_traj: As torchrl's collectors.
        before_next: Called before each batch with a callable counting the frames
            that would then be pending (delivered and not yet stored, plus one) and
            the stop event; it may block until either allows (the rate limiter's
            ``wait_for_insert``).
        on_stored: Called after each batch was stored (the rate limiter's ``wake``).
        start_method: How ``"process"`` mode starts its worker (:func:`check_start_method`).
        start_timeout: Seconds ``"process"`` mode waits for its worker to start; then the
            worker is killed and :class:`~rb_lightning.errors.CollectorError` raised.
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
        if mode == "process":
            with _global_start_method(start_method):
                self.collector: Collector | AsyncCollector = _start_worker(
                    make_env, policy, start_timeout, num_threads=self._torch_threads, **common
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
        self._thread = threading.Thread(target=self._feed, name="rb-lightning-collection")
        self._thread.daemon = True  # never keeps a dying interpreter alive
        self._thread.start()

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
                    self._before_next(lambda: self._pending_frames + 1, self._stop)
                    if self._stop.is_set():
                        return
                batch = next(frames)
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

    # -- the training side ----------------------------------------------------------------
    def sync(self, version: int) -> None:
        """Hand the policy's current weights, stamped with ``version``, to the collector.

        A copy is taken now; the collecting thread sends it before its next batch
        (torchrl's ``update_policy_weights_`` waits for the worker's acknowledgement,
        which the training loop should not), and a newer copy replaces an unsent one.
        """
        set_stamped_version(self._source_policy, version)
        self._weights = TensorDict.from_module(self._source_policy).clone()

    def ready(self, store: Callable[[TensorDictBase], None]) -> None:
        """Hand every batch collected since the last call to ``store``, without waiting."""
        self._raise_failure()
        while True:
            try:
                batch = self._ready.get_nowait()
            except queue.Empty:
                return
            self._deliver(batch, store)

    def take(self, timeout: float, store: Callable[[TensorDictBase], None]) -> None:
        """Hand the next collected batch to ``store``; wait up to ``timeout`` seconds for it."""
        deadline = time.monotonic() + timeout
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

    def _deliver(self, batch: TensorDictBase, store: Callable[[TensorDictBase], None]) -> None:
        try:
            store(batch)
        finally:
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
        """Stop collecting; join the thread and the worker process (idempotent)."""
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
        finally:
            # torchrl's weight sync waits for the worker's acknowledgement without a
            # timeout: a thread caught in it when the worker died stays blocked. It is a
            # daemon (it ends with the interpreter) and holds nothing the run needs.
            self._thread.join(timeout=1)
