"""What a run leaves behind: named semaphores in ``/dev/shm`` and processes still alive.

A multiprocessing ``Lock`` or ``Value`` made under the spawn or forkserver start method
(torchrl sets spawn) is a named POSIX semaphore, ``/dev/shm/sem.mp-<random>``. Its name is
removed when the object is collected, when its process exits normally, or by the process's
resource tracker when the process was killed; a process that ends without its finalizers
and whose tracker dies with it (a Ray worker killed with its children) leaves the entry
there until the machine restarts.

An entry counts as left behind when no live process has it mapped (the inode in some
``/proc/<pid>/maps``): the semaphores of processes that still run, another test's, are
not counted. A test that watches its run's processes (:class:`ProcessTree`) counts only
what they held, not what another process on the machine leaves meanwhile.

``left_behind(before, tree.mapped)`` after a run, with ``before = semaphores()`` taken
before it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

SHM = Path("/dev/shm")


def semaphores() -> dict[str, int]:
    """``/dev/shm/sem.mp-*`` now: name -> inode."""
    found = {}
    for path in SHM.glob("sem.mp-*"):
        try:
            found[path.name] = path.stat().st_ino
        except FileNotFoundError:  # removed while listing
            pass
    return found


def mapped_inodes(pids: Iterable[int] | None = None) -> set[int]:
    """Inodes of the ``/dev/shm/sem.*`` files the processes ``pids`` (default: every live
    process) have mapped.

    glibc's ``sem_open`` maps a temporary file and links it to the final name, so a map
    shows another name (``sem.XXXXXX (deleted)``) with the same inode.
    """
    paths = (
        Path("/proc").glob("[0-9]*/maps")
        if pids is None
        else (Path(f"/proc/{pid}/maps") for pid in pids)
    )
    inodes = set()
    for maps in paths:
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        for line in text.splitlines():
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/sem."):
                inodes.add(int(fields[4]))
    return inodes


def left_behind(before: dict[str, int], made_by: set[int] | None = None) -> list[str]:
    """Entries made since ``before`` that no live process holds, of those whose inodes are in
    ``made_by`` (:attr:`ProcessTree.mapped`: what a run's processes held, not what another
    process on the machine leaves meanwhile); default: of all. Checked twice, 1 s apart: a
    semaphore being made right now is linked before it is mapped."""

    def unheld() -> set[str]:
        held = mapped_inodes()
        return {
            name
            for name, inode in semaphores().items()
            if name not in before and inode not in held and (made_by is None or inode in made_by)
        }

    first = unheld()
    if not first:
        return []
    time.sleep(1.0)
    return sorted(first & unheld())


class ProcessTree:
    """The processes under ``root`` (its descendants, seen each time :meth:`look` runs, and
    those given to :meth:`add`), and the named semaphores they hold.

    ``seen`` maps each one (pid and start time: a pid may be reused) to its command line;
    ``mapped`` holds the inodes of the ``/dev/shm/sem.*`` files they had mapped.
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[tuple[int, float], str] = {}
        self.mapped: set[int] = set()
        self.look()

    def look(self) -> None:
        try:
            processes = [psutil.Process(self.root)]
            processes += processes[0].children(recursive=True)
        except psutil.NoSuchProcess:
            processes = []
        for process in processes:
            self.add(process)
        self.mapped |= mapped_inodes(pid for pid, started in self.seen if _running(pid, started))

    def add(self, process: psutil.Process) -> None:
        try:
            key = (process.pid, process.create_time())
            self.seen.setdefault(key, " ".join(process.cmdline())[:160])
        except psutil.Error:  # ended meanwhile
            pass


def still_alive(
    processes: dict[tuple[int, float], str], timeout: float = 30.0
) -> dict[tuple[int, float], str]:
    """Those of ``processes`` (:attr:`ProcessTree.seen`) still running after up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        alive = {key: what for key, what in processes.items() if _running(*key)}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def _running(pid: int, started: float) -> bool:
    try:
        process = psutil.Process(pid)
        return process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(condition: Callable[[], bool], timeout: float, every: float = 0.5) -> bool:
    """Poll ``condition`` until true or ``timeout`` seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True
