"""Where a replay buffer's data comes from before training: a saved directory or a function.

A source has one method, :meth:`BufferSource.fill`, called once by the DataModule in
``setup``. Sources check what they can at construction, so a typo in a YAML config fails
before training starts. Data collected during fit comes from a collector callback instead.

Examples:
    >>> import tempfile
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
    >>> saved = ReplayBuffer(storage=LazyTensorStorage(10))
    >>> _ = saved.extend(TensorDict({"x": torch.arange(4)}, batch_size=[4]))
    >>> path = tempfile.mkdtemp()
    >>> saved.dumps(path)
    >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
    >>> LoadDirectory(path).fill(rb)
    >>> more = TensorDict({"x": torch.arange(3)}, batch_size=[3])
    >>> CallSource("torchrl.data:ReplayBuffer.extend", kwargs={"data": more}).fill(rb)
    >>> len(rb)
    7
"""

from __future__ import annotations

import importlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrl.data import ReplayBuffer

from rb_lightning.errors import ArgumentTypeError, PathNotFoundError, SourceError, UsageError
from rb_lightning.persist.manifest import MANIFEST
from rb_lightning.torchrl_compat import DUMPS_MARKER, is_dumps_directory, loads_with_strings


class BufferSource(ABC):
    """Fills a replay buffer once, before training. Subclass it and implement :meth:`fill`."""

    @abstractmethod
    def fill(self, replay_buffer: ReplayBuffer) -> None:
        """Write this source's items into ``replay_buffer``."""


class LoadDirectory(BufferSource):
    """Load a buffer saved earlier with ``ReplayBuffer.dumps(path)``.

    The receiving buffer must be built like the saved one; string columns come back as saved
    (torchrl 0.14.1's ``loads`` alone gets them wrong).

    Args:
        path: The directory ``dumps`` wrote.

    Keyword Args:
        make_with: The command that writes this directory, told to the user when ``path``
            does not exist.

    Raises:
        FileNotFoundError: At construction, when ``path`` is not a ``dumps`` directory.
    """

    def __init__(self, path: str | os.PathLike[str], *, make_with: str | None = None) -> None:
        self.path = Path(path).expanduser()
        self.make_with = make_with
        if not self.path.is_dir():
            how = (
                f"Make it first: `{make_with}`, or point path at another directory written by "
                "ReplayBuffer.dumps(path)."
                if make_with
                else "Point path at a directory written by ReplayBuffer.dumps(path), e.g. one "
                "made by `python -m rb_lightning.llm.make_offline_buffer <dir>`."
            )
            raise PathNotFoundError(
                f"LoadDirectory(path={str(path)!r}): no such directory. {how}", argument="path"
            )
        if (self.path / MANIFEST).is_file():
            raise PathNotFoundError(
                f"LoadDirectory(path={str(path)!r}): the directory holds {MANIFEST}, so it was "
                "written by rb_lightning.checkpoint.dump_buffer, not by ReplayBuffer.dumps(path), "
                "the format LoadDirectory reads. Fill the buffer from it with a CallSource "
                "instead: {class_path: rb_lightning.sources.CallSource, init_args: {function: "
                f"'rb_lightning.checkpoint:load_buffer', kwargs: {{path: {str(path)!r}}}}}}} (in "
                "Python: rb_lightning.checkpoint.load_buffer(rb, path)).",
                argument="path",
            )
        if not is_dumps_directory(self.path):
            raise PathNotFoundError(
                f"LoadDirectory(path={str(path)!r}): the directory has no {DUMPS_MARKER}, so it "
                "was not written by ReplayBuffer.dumps(path). Point path at the directory that "
                "dumps wrote (the one holding storage/, sampler/ and writer/).",
                argument="path",
            )

    def fill(self, replay_buffer: ReplayBuffer) -> None:
        """Restore the saved storage, sampler and writer state into ``replay_buffer``; :class:`SourceError` when they do not match."""
        saved = self.saved_capacity()
        capacity = getattr(replay_buffer.storage, "max_size", None)
        if saved is not None and isinstance(capacity, int) and saved != capacity:
            raise SourceError(
                f"LoadDirectory(path={str(self.path)!r}) holds a buffer saved with capacity "
                f"{saved}, but the receiving storage has max_size={capacity}. Give the storage "
                f"max_size: {saved} (a saved buffer loads only into one built like it)."
            )
        try:
            loads_with_strings(replay_buffer, self.path)
        except Exception as err:
            raise SourceError(
                f"LoadDirectory(path={str(self.path)!r}) could not load into "
                f"{_describe(replay_buffer)}: {type(err).__name__}: {err}. The receiving buffer "
                "must be built like the saved one (storage kind and capacity, sampler kind); "
                "see buffer_metadata.json and storage/storage_metadata.json in the directory."
            ) from err

    def saved_capacity(self) -> int | None:
        """The capacity of the saved storage (``None`` if the directory does not say)."""
        try:
            meta = json.loads((self.path / "storage" / "meta.json").read_text())
            return int(meta["shape"][0])
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return None

    def non_tensor_keys(self) -> list[str]:
        """Saved columns that hold Python objects (strings) rather than tensors, as ``"a.b"``."""
        storage = self.path / "storage"
        keys = []
        for meta_file in sorted(storage.rglob("meta.json")):
            try:
                kind = json.loads(meta_file.read_text()).get("_type", "")
            except (OSError, ValueError, AttributeError):
                continue
            if "NonTensor" in str(kind):
                keys.append(".".join(meta_file.parent.relative_to(storage).parts))
        return keys

    def __repr__(self) -> str:
        return f"LoadDirectory(path={str(self.path)!r})"


class CallSource(BufferSource):
    """Call ``function(replay_buffer, **kwargs)`` to fill the buffer (its return value is ignored).

    Args:
        function: ``"package.module:function"`` (``"package.module:Class.method"`` works too).
        kwargs: Keyword arguments for the function (plain YAML values).

    Raises:
        ValueError: At construction, when ``function`` is not ``"module:name"``.
        ImportError: At construction, when the module or the name cannot be imported.
        TypeError: At construction, when the name is not callable.
    """

    def __init__(self, function: str, kwargs: dict[str, Any] | None = None) -> None:
        self.function = function
        self.kwargs = dict(kwargs or {})
        self._callable = resolve_callable(function)

    def fill(self, replay_buffer: ReplayBuffer) -> None:
        """Call ``function(replay_buffer, **kwargs)``."""
        self._callable(replay_buffer, **self.kwargs)

    def __repr__(self) -> str:
        return f"CallSource(function={self.function!r}, kwargs={self.kwargs!r})"


def resolve_callable(spec: str, argument: str = "function") -> Callable[..., Any]:
    """Import ``"package.module:attr.path"`` and return the callable it names.

    ``argument``: the argument the path was given as, named in the errors.

    Examples:
        >>> resolve_callable("os.path:join")("a", "b")
        'a/b'
    """
    module_name, sep, attr_path = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not (sep and module_name and attr_path):
        raise UsageError(
            argument,
            f"{argument}={spec!r} must be 'package.module:function', with a colon between the "
            "module to import and the name in it, e.g. 'rb_lightning.llm.data:fill_arithmetic_buffer'.",
        )
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(
            f"{argument}={spec!r}: cannot import module {module_name!r} ({err}). Check the "
            "spelling, and that the module is on PYTHONPATH (run from the project root)."
        ) from None
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise ImportError(
                f"{argument}={spec!r}: {getattr(target, '__name__', target)!r} has no attribute "
                f"{part!r}. Check the name after the colon."
            )
        target = getattr(target, part)
    if not callable(target):
        raise ArgumentTypeError(
            argument, f"{argument}={spec!r} names a {type(target).__name__}, not a callable."
        )
    return target


@dataclass
class PendingFill:
    """A source that still has to fill its buffer, and the argument that named it."""

    argument: str
    source: BufferSource
    replay_buffer: ReplayBuffer

    def fill(self) -> bool:
        """Fill the buffer; a :class:`SourceError` names :attr:`argument`. Returns ``True``."""
        try:
            self.source.fill(self.replay_buffer)
        except SourceError as err:
            if err.argument == self.argument:
                raise
            raise SourceError(str(err), argument=self.argument) from err
        return True


#: Which DataModule sources each Lightning stage fills.
SOURCES_FOR_STAGE = {
    "fit": ("source", "val_source"),
    "validate": ("val_source",),
    "test": ("test_source",),
}


def fill_for_stage(pending: list[PendingFill], stage: str) -> list[PendingFill]:
    """Run the fills ``stage`` reads from (:data:`SOURCES_FOR_STAGE`); return the others."""
    wanted = SOURCES_FOR_STAGE.get(stage, ())
    return [fill for fill in pending if not (fill.argument in wanted and fill.fill())]


def fill_sources(**sources: tuple[Any, ReplayBuffer | None, str]) -> list[PendingFill]:
    """Check ``argument=(source, buffer, buffer_argument)`` triples; return the fills to run.

    A source must be a :class:`BufferSource` and must have a buffer to fill.

    Examples:
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4))
        >>> [f.argument for f in fill_sources(source=(None, rb, "replay_buffer"))]
        []
        >>> fill_sources(val_source=(CallSource("math:sqrt"), None, "val_buffer"))
        Traceback (most recent call last):
        ...
        rb_lightning.errors.UsageError: val_source fills val_buffer, but no val_buffer was given.
    """
    pending = []
    for argument, (source, buffer, buffer_argument) in sources.items():
        if source is None:
            continue
        if not isinstance(source, BufferSource):
            raise ArgumentTypeError(
                argument,
                f"{argument} must be a rb_lightning.sources.BufferSource (LoadDirectory, "
                f"CallSource), got {type(source).__name__}.",
            )
        if buffer is None:
            raise UsageError(
                argument, f"{argument} fills {buffer_argument}, but no {buffer_argument} was given."
            )
        pending.append(PendingFill(argument, source, buffer))
    return pending


def _describe(replay_buffer: ReplayBuffer) -> str:
    storage = replay_buffer.storage
    sampler = replay_buffer.sampler
    capacity = getattr(storage, "max_size", "?")
    return (
        f"{type(replay_buffer).__name__}(storage={type(storage).__name__}(max_size={capacity}), "
        f"sampler={type(sampler).__name__})"
    )


__all__ = [
    "BufferSource",
    "CallSource",
    "LoadDirectory",
    "SourceError",
    "SOURCES_FOR_STAGE",
    "PendingFill",
    "fill_for_stage",
    "fill_sources",
    "resolve_callable",
]
