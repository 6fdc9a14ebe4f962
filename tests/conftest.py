"""Shared fixtures: small real replay buffers built in the test itself."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from leftovers import left_behind, semaphores
from rb_testdata import make_transitions
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ListStorage, ReplayBuffer

# Two cores: keep torch from oversubscribing them while tests run side by side.
torch.set_num_threads(1)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture
def tensor_rb() -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(1_000))
    rb.extend(make_transitions(200))
    return rb


@pytest.fixture
def list_rb() -> ReplayBuffer:
    rb = ReplayBuffer(storage=ListStorage(100))
    for i in range(20):
        rb.add(
            TensorDict(
                {
                    "input_ids": torch.full((8,), i),
                    "attention_mask": torch.ones(8, dtype=torch.long),
                },
                batch_size=[],
            )
        )
    return rb


@pytest.fixture
def workers_from_a_forkserver():
    """DataLoader workers started from a forkserver that imported torch and rb_lightning once.

    A worker still gets the dataset pickled into a fresh process, as under spawn (torchrl's
    default start method), but does not spend seconds importing torch, torchrl and
    rb_lightning again: each worker start under spawn did.
    """
    previous = mp.get_start_method(allow_none=True)
    mp.set_forkserver_preload(["rb_lightning", "rb_lightning.stream.datasets", "torchrl"])
    mp.set_start_method("forkserver", force=True)
    yield
    mp.set_start_method(previous, force=True)


#: A test file that shares a fixture among its tests (see below) says so in its source.
_MODULE_SCOPE = 'scope="module"'


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Which tests pytest-xdist runs in the same test process (``--dist loadgroup``).

    The tests of a file with a module-scoped fixture (a DDP run shared by its tests) stay
    together, so the fixture runs once; every other test goes wherever a process is free
    (a file of long end-to-end runs would otherwise keep one process busy while the other
    waits). Every Ray test runs in one process, one after another: ``ray.init()`` joins a
    cluster another test started with ``ray start`` on this machine instead of starting
    its own.
    """
    shares_fixtures: dict[Path, bool] = {}
    for item in items:
        path = Path(str(item.fspath))
        if path not in shares_fixtures:
            shares_fixtures[path] = path.suffix == ".py" and _MODULE_SCOPE in path.read_text()
        if item.get_closest_marker("ray"):
            group = "ray"
        elif shares_fixtures[path]:
            group = item.nodeid.split("::")[0]
        else:
            group = item.nodeid
        item.add_marker(pytest.mark.xdist_group(group))
        if group != item.nodeid:  # a group of one test is scheduled alone anyway
            _name_group_in_id(config, item, group)


def _name_group_in_id(config: pytest.Config, item: pytest.Item, group: str) -> None:
    """Append ``@<group>`` to the test's id in a pytest-xdist worker, as pytest-xdist means to.

    pytest-xdist (3.8) tells its scheduler a test's group by appending ``@<group>`` to
    ``item._nodeid``; pytest 9 keeps the id in ``item._id``, so that append is lost and
    ``--dist loadgroup`` grouped nothing: the tests of one file ran on both processes and
    a module-scoped fixture ran once in each (a shared DDP or killed-runs fixture twice).
    """
    if not getattr(config.option, "loadgroup", False):
        return  # not a worker of --dist loadgroup
    try:
        from _pytest.nodeid import coerce_node_id  # pytest 9; pytest-xdist handles pytest 8
    except ImportError:
        return
    item._id = coerce_node_id(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]


#: ``/dev/shm/sem.mp-*`` when the session started (tests/leftovers.py).
_SEMAPHORES_BEFORE = pytest.StashKey[dict[str, int]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_SEMAPHORES_BEFORE] = semaphores()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Say how many named semaphores the session left in ``/dev/shm`` (a process that ended
    without removing them: a killed one whose resource tracker died too, a Ray actor).

    Reported, not failed: another session on this machine may leave some meanwhile.
    """
    before = config.stash.get(_SEMAPHORES_BEFORE, None)
    if before is None:
        return
    left = left_behind(before)
    if left:
        terminalreporter.write_line(
            f"/dev/shm: {len(left)} named semaphores (sem.mp-*) made during this session are "
            "left with no process holding them (by this session's processes, or another's "
            "on this machine; tests/leftovers.py)",
            yellow=True,
        )
