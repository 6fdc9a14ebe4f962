"""A buffer actor's process keeps no semaphore name in ``/dev/shm`` (rb_lightning.distributed.actor_process).

Each case runs in a fresh interpreter (the function changes its process's start method)
in a session of its own, which ends normally or is killed as Ray ends an actor: SIGKILL
to the process and its children, its resource tracker among them.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[2] / "rb_lightning" / "distributed" / "actor_process.py"

# The module alone (importing rb_lightning would import torch: seconds).
CODE = """
import importlib.util, json, multiprocessing, os, signal, sys
spec = importlib.util.spec_from_file_location("actor_process", sys.argv[1])
actor_process = importlib.util.module_from_spec(spec)
spec.loader.exec_module(actor_process)

spawn = multiprocessing.get_context("spawn")  # torchrl's start method
value, lock = spawn.Value("i", 0), spawn.Lock()  # what a torchrl storage and writer hold
names = [value.get_lock()._semlock.name, lock._semlock.name]
shm = lambda: [os.path.exists("/dev/shm/sem." + name.lstrip("/")) for name in names]
found = {"names": names, "before": shm()}
if sys.argv[2] != "as_before":
    found["removed"] = actor_process.semaphore_names_released()()
    with value.get_lock():
        value.value += 1
    found.update(after=shm(), value=value.value, lock_works=lock.acquire(timeout=1))
    found["later"] = multiprocessing.Lock()._semlock.name
print(json.dumps(found), flush=True)
if sys.argv[2] != "exit":
    os.killpg(0, signal.SIGKILL)  # the process and its resource tracker, as Ray ends an actor
"""


def _run(how: str) -> tuple[subprocess.CompletedProcess, dict, list[Path]]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CODE), str(MODULE), how],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert done.stdout, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    paths = [Path("/dev/shm") / f"sem.{name.lstrip('/')}" for name in found["names"]]
    return done, found, paths


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_the_names_go_at_once_and_the_semaphores_still_work(how):
    done, found, paths = _run(how)
    assert found["before"] == [True, True]  # named, as torchrl's are under spawn
    assert found["removed"] == 2 and found["after"] == [False, False]
    assert found["value"] == 1 and found["lock_works"]
    assert found["later"] is None  # made unnamed from the start
    assert done.returncode == (0 if how == "exit" else -signal.SIGKILL)
    assert "leaked semaphore" not in done.stderr  # the resource tracker had nothing to clean
    assert [path.exists() for path in paths] == [False, False]


def test_without_it_a_killed_process_leaves_its_names():
    """What each buffer actor did: killed with its resource tracker, its names stay."""
    done, found, paths = _run("as_before")
    try:
        assert done.returncode == -signal.SIGKILL
        assert found["before"] == [True, True]
        assert [path.exists() for path in paths] == [True, True]
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
