"""Starting a collector's worker process: the start method, and a start that cannot hang.

Examples:
    >>> check_start_method("fork", starts_a_process=True)
    'fork'
    >>> with global_start_method(None):  # None: the program's own, untouched
    ...     pass
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from tensordict.nn import TensorDictSequential
from torchrl.collectors import AsyncCollector
from torchrl.envs import EnvBase

from rb_lightning.errors import CollectorError, UsageError

__all__ = ["StartMethod", "check_start_method", "global_start_method", "start_worker"]

#: ``multiprocessing`` start methods of a collector's worker process.
StartMethod = Literal["spawn", "fork", "forkserver"]


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


def start_worker(
    make_env: Callable[[], EnvBase], policy: TensorDictSequential, timeout: float, **options: Any
) -> AsyncCollector:
    """torchrl's ``AsyncCollector``, or a :class:`CollectorError` if its worker is not up within ``timeout`` (torchrl itself waits forever)."""
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
        with _ctrl_c_left_to_the_trainer():
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
def global_start_method(start_method: StartMethod | None) -> Iterator[None]:
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


@contextlib.contextmanager
def _ctrl_c_left_to_the_trainer() -> Iterator[None]:
    # A terminal's Ctrl-C reaches the whole process group: a worker that took it would die,
    # and the trainer, finishing its step to save, would find it dead. A process started
    # with SIGINT ignored keeps it ignored (through fork and through exec).
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
