"""Every error rb_lightning raises on purpose, under one root: :class:`RBLightningError`.

Each class also derives from the built-in exception it stands for, so code that
catches ``ValueError``, ``TypeError``, ``RuntimeError`` or ``TimeoutError`` keeps
working. Every message is one paragraph: what is wrong, why it matters, and the fix.
The command line turns any of them into that paragraph and exit code 2, naming the
argument (:attr:`RBLightningError.argument`) where there is one.

Examples:
    >>> from rb_lightning.errors import RBLightningError, UsageError
    >>> err = UsageError("num_batches", "num_batches=0 draws nothing: pass a positive integer.")
    >>> isinstance(err, RBLightningError), isinstance(err, ValueError), err.argument
    (True, True, 'num_batches')
"""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "BufferCheckpointError",
    "BufferStateError",
    "CollectorError",
    "ConfigError",
    "InvalidPriorityError",
    "MissingKeyError",
    "NotASavedBufferError",
    "NotEnoughDiskSpaceError",
    "PathNotFoundError",
    "PickleRefusedError",
    "RBLightningError",
    "SampleTimeoutError",
    "SavedBufferError",
    "SavedBufferSelectionError",
    "SourceError",
    "UsageError",
]


class RBLightningError(Exception):
    """The root of rb_lightning's errors: ``except RBLightningError`` catches all of them.

    Args:
        message: One paragraph: what is wrong, why, and the fix.
        argument: The argument at fault, as the user spells it in Python or in a
            config relative to its class (``"num_batches"``); ``None`` when no single
            argument is the cause.
    """

    def __init__(self, message: str, *, argument: str | None = None) -> None:
        super().__init__(message)
        self.argument = argument


class UsageError(RBLightningError, ValueError):
    """A wrong or missing argument value; ``str(err)`` says what was given and the fix.

    Args:
        argument: The argument at fault, e.g. ``"num_batches"``.
        message: One paragraph: what is wrong and the fix.

    Examples:
        >>> err = UsageError("num_batches", "num_batches=None needs a bound: set max_steps.")
        >>> err.argument, isinstance(err, ValueError)
        ('num_batches', True)
    """

    argument: str

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message, argument=argument)


class ArgumentTypeError(UsageError, TypeError):
    """An argument of the wrong type (a ``TypeError`` and a :class:`UsageError`).

    Examples:
        >>> err = ArgumentTypeError("keys", "keys must be a list of keys, got 'obs'.")
        >>> isinstance(err, TypeError), isinstance(err, ValueError)
        (True, True)
    """


class MissingKeyError(UsageError, KeyError):
    """A key the call needs is not in the batch or the buffer (also a ``KeyError``).

    Examples:
        >>> err = MissingKeyError("keys", "The batch has no 'index' key. Keep it: keys=None.")
        >>> isinstance(err, KeyError), str(err)  # the message, not KeyError's quoted repr
        (True, "The batch has no 'index' key. Keep it: keys=None.")
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigError(UsageError):
    """A config that cannot be parsed or instantiated, naming the key at fault.

    Args:
        key: The config key, e.g. ``"data.init_args.replay_buffer.init_args.storage"``
            (empty when the whole config is at fault).
        message: What is wrong and the fix.

    Examples:
        >>> str(ConfigError("trainer.max_step", "no such argument; did you mean max_steps?"))
        'config error at trainer.max_step: no such argument; did you mean max_steps?'
    """

    def __init__(self, key: str, message: str) -> None:
        super().__init__(
            key, f"config error at {key}: {message}" if key else f"config error: {message}"
        )
        self.key = key


class PathNotFoundError(RBLightningError, FileNotFoundError):
    """A path given as an argument does not exist or is not what it must be.

    Examples:
        >>> err = PathNotFoundError("no such directory: data/", argument="path")
        >>> isinstance(err, FileNotFoundError), err.argument
        (True, 'path')
    """


class BufferStateError(RBLightningError, RuntimeError):
    """The buffer cannot serve the request in its present state (e.g. empty, too small).

    Examples:
        >>> isinstance(BufferStateError("The replay buffer is empty."), RuntimeError)
        True
    """


class SampleTimeoutError(RBLightningError, TimeoutError):
    """A wait for the buffer (``min_size``, a remote actor) ran past its timeout."""


class CollectorError(RBLightningError, RuntimeError):
    """A collector running beside training stopped (its environment or policy raised)."""


class BufferCheckpointError(RBLightningError, RuntimeError):
    """A checkpointed replay buffer is missing, incomplete or does not match its manifest."""


class NotEnoughDiskSpaceError(BufferCheckpointError):
    """The filesystem a buffer dump goes to has less free space than the dump needs."""


class SavedBufferError(UsageError, BufferCheckpointError):
    """An argument of the saved-buffer reader does not fit what it names (``err.argument``).

    The reader (``load_buffer``, ``open_saved_buffer``, ``to_hf_dataset(path)``,
    ``rb-lightning-export-hf``) raises one subclass per mistake, whichever of
    them was called. A damaged saved buffer is a plain :class:`BufferCheckpointError`.
    """


class NotASavedBufferError(SavedBufferError):
    """``path`` does not exist, or holds no saved replay buffer (says what it holds)."""


class SavedBufferSelectionError(SavedBufferError):
    """``member`` / ``rank`` is missing, unknown, or names a part the saved buffer does not have."""


class PickleRefusedError(SavedBufferError):
    """A file holds pickled objects, which are read only with ``allow_pickle=True``."""


class InvalidPriorityError(RBLightningError, ValueError):
    """Priorities handed to ``update_priority`` hold NaN, infinite or negative values."""


class SourceError(RBLightningError, RuntimeError):
    """A source could not fill the buffer (e.g. a saved directory that does not match it).

    Args:
        message: What went wrong and the fix, in one paragraph.
        argument: The DataModule argument that held the source (``"source"``,
            ``"val_source"``, ``"test_source"``); the command line names it.

    Examples:
        >>> err = SourceError("no such directory", argument="val_source")
        >>> err.argument, str(err)
        ('val_source', 'no such directory')
    """

    def __init__(self, message: str, *, argument: str = "source") -> None:
        super().__init__(message, argument=argument)
