"""Kill a save at any point: fork, count the child's filesystem changes, SIGKILL it before one.

Shared by the kill-point tests of the full save and of the chunked save: the child counts
every change under ``root`` (files opened for writing, directories made, renames and
removals) through an audit hook, and dies by ``SIGKILL`` just before change ``kill_at``.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import torch

#: Audit events that change the filesystem, besides ``open`` for writing (a save also opens
#: files read-only, to fsync them: not a change).
CHANGES = {"os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree", "shutil.move"}


def changes_files(root: Path, event: str, args: tuple) -> bool:
    """Whether audit ``event`` with ``args`` changes something under ``root``."""
    if not any(str(root) in str(arg) for arg in args if isinstance(arg, (str, os.PathLike))):
        return False
    if event == "open":  # (path, mode, flags): writes only
        mode, flags = args[1], args[2]
        writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT
        return (isinstance(mode, str) and mode[:1] in "wax+") or (
            isinstance(flags, int) and flags & writes
        )
    return event in CHANGES


def run_killed_at(root: Path, kill_at: int, work: Callable[[], None]) -> int:
    """Fork; the child runs ``work``, dying before its change ``kill_at`` under ``root`` (0: never).

    Returns how many changes the child made (when it was not killed), else -9.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            torch.set_num_threads(1)
            seen = [0]

            def hook(event: str, args: tuple) -> None:
                if changes_files(root, event, args):
                    seen[0] += 1
                    if seen[0] == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)

            sys.addaudithook(hook)
            work()
            os.write(write, str(seen[0]).encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        reported = pipe.read()
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return -9
    assert os.WEXITSTATUS(status) == 0 and reported, "the child's save failed"
    return int(reported)
