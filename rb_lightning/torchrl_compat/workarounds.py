"""Workarounds of torchrl 0.14.1 bugs: delete each once the pin moves past its bug.

Each function names the bug and the test of ``tests/unit/test_torchrl_compat.py`` that checks
the bug is still there: when a new torchrl fixes it, that test fails, and the function (and its
callers' use of it) can go.

Examples:
    >>> import tempfile
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> from rb_lightning.torchrl_compat import loads_with_strings
    >>> saved = ReplayBuffer(storage=LazyTensorStorage(4))
    >>> _ = saved.extend(TensorDict({"x": torch.arange(2), "s": ["a", "b"]}, batch_size=[2]))
    >>> path = tempfile.mkdtemp()
    >>> saved.dumps(path)
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
    >>> loads_with_strings(rb, path)
    >>> list(rb[:2]["s"])
    ['a', 'b']
"""

from __future__ import annotations

import contextlib
import os
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tensordict import TensorDict, TensorDictBase, is_non_tensor
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.storages import Storage

from rb_lightning.torchrl_compat.internals import storage_content

__all__ = [
    "ignore_last_cursor_warning",
    "is_empty_prefetch_pickle",
    "loads_with_strings",
    "overwriting_scratch_files",
    "restore_non_tensor_columns",
]


def restore_non_tensor_columns(
    replay_buffer: ReplayBuffer, storage_dir: str | os.PathLike[str]
) -> list[str]:
    """Put the string (non-tensor) columns saved in ``storage_dir`` back into ``replay_buffer``.

    torchrl 0.14.1: ``ReplayBuffer.loads`` / ``TensorStorage.loads`` copy tensors
    only; a ``NonTensorStack`` column keeps what the live buffer held, or gets the
    first item's value in every row of a fresh buffer. The files are right:
    ``TensorDict.load_memmap`` reads them correctly. Call right after ``loads``.
    Fails once fixed: ``test_loads_still_breaks_strings_so_the_fix_is_needed``.

    Returns:
        The restored columns, as ``"a.b"`` names (empty when there were none).
    """
    data = storage_content(replay_buffer.storage)
    if not isinstance(data, TensorDictBase) or data.is_locked:
        return []
    saved = TensorDict.load_memmap(Path(storage_dir), allow_pickle=False)
    restored = []
    for key in saved.keys(include_nested=True):
        value = saved.get(key)
        if is_non_tensor(value):
            data.set(key, value)
            restored.append(key if isinstance(key, str) else ".".join(key))
    return restored


def loads_with_strings(replay_buffer: ReplayBuffer, path: str | os.PathLike[str]) -> None:
    """``replay_buffer.loads(path)``, with string columns restored (torchrl 0.14.1 bug).

    See :func:`restore_non_tensor_columns`; once the pin moves past the bug this
    is ``replay_buffer.loads(path)``.
    """
    replay_buffer.loads(path)
    restore_non_tensor_columns(replay_buffer, Path(path) / "storage")


@contextlib.contextmanager
def ignore_last_cursor_warning() -> Iterator[None]:
    """Silence torchrl 0.14.1's "last_cursor is None" warning around a storage ``dumps``.

    It is raised when a storage restored by ``loads`` is saved before its next
    write. The cursor only shifts the rows of save hooks (the compressing
    checkpointers); the default checkpointer writes the storage as it is, so the
    dump is complete and the warning misleads.
    Fails once fixed: ``test_dumps_after_loads_still_warns_about_last_cursor``.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="last_cursor is None")
        yield


def is_empty_prefetch_pickle(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is the ``prefetch.pkl`` torchrl 0.14.1's ``dumps`` writes for no prefetch.

    ``ReplayBuffer.dumps`` pickles the prefetch state even when there is none, so
    every dump holds a pickle a safe reader must vet. It is read with an
    unpickler that resolves no global name at all, so nothing can be called: a
    pickle that needs one (anything but plain containers and numbers) is rejected.
    Fails once fixed: ``test_dumps_still_pickles_an_empty_prefetch_state``.
    """

    class _NoGlobals(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise pickle.UnpicklingError(f"global {module}.{name} refused")

    try:
        with open(path, "rb") as file:
            state = _NoGlobals(file).load()
    except Exception:
        return False
    return state is None or (isinstance(state, dict) and not state.get("queue"))


@contextlib.contextmanager
def overwriting_scratch_files(storage: Storage) -> Iterator[None]:
    """Let a restore create a ``LazyMemmapStorage``'s files over those already in its ``scratch_dir``.

    torchrl 0.14.1: a storage built with a fixed ``scratch_dir`` refuses to create a
    file that exists (``existsok=False``), and a resumed run always finds its
    previous process's files there. A restore replaces the buffer's content anyway,
    so for its duration the storage may overwrite (and resize) them.
    Fails once fixed: ``test_lazy_memmap_still_refuses_its_scratch_files``.
    """
    scratch_dir = getattr(storage, "scratch_dir", None)
    if getattr(storage, "initialized", True) or not scratch_dir or not hasattr(storage, "existsok"):
        yield
        return
    existsok = storage.existsok
    storage.existsok = True
    try:
        yield
    finally:
        storage.existsok = existsok
