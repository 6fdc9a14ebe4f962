"""One writer thread for checkpoint saves: a save runs while training goes on, one at a time.

A job's exception reaches the caller of the next ``submit``, ``wait`` or ``close``, as in
Lightning's ``AsyncCheckpointIO``. The caller decides what a job writes.

Examples:
    >>> writer = BackgroundWriter()
    >>> done = []
    >>> writer.submit(lambda: done.append(1))
    >>> writer.wait()
    >>> writer.submit(lambda: 1 / 0)
    >>> try:
    ...     writer.wait()
    ... except ZeroDivisionError:
    ...     print("raised in the caller", done)
    raised in the caller [1]
    >>> writer.close()
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["BackgroundWriter"]


class BackgroundWriter:
    """Runs jobs in one thread, one at a time; a job's error is raised by the next call."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future[None] | None = None

    def submit(self, job: Callable[[], None]) -> None:
        """Wait for the previous job (raising its error), then start ``job`` in the thread."""
        self.wait()
        if self._executor is None:
            # Not a daemon: at interpreter exit concurrent.futures joins it, so a save under
            # way is finished rather than cut off (a cut-off save still leaves the previous
            # checkpoint loadable, but loses this one).
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="rb_lightning-save")
        self._future = self._executor.submit(job)

    def wait(self) -> None:
        """Block until the job under way has ended; raise its exception if it failed."""
        future, self._future = self._future, None
        if future is not None:
            future.result()

    def close(self) -> None:
        """Wait for the job under way (raising its error) and stop the thread."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
