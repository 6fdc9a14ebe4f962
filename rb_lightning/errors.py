"""Errors a user causes with an argument, each naming that argument and its fix.

:class:`UsageError` is the one class the command line turns into a one-paragraph
message and exit code 2 (instead of a traceback): raise it from anything a config
reaches when the cause is an argument the user gave, not a bug.
"""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A wrong or missing argument; ``str(err)`` says what was given and how to fix it.

    Args:
        argument: The argument at fault, as the user spells it in Python or in a
            config relative to its class, e.g. ``"num_batches"``.
        message: One paragraph: what is wrong and the fix.

    Examples:
        >>> err = UsageError("num_batches", "num_batches=None needs a bound: set max_steps.")
        >>> err.argument, isinstance(err, ValueError)
        ('num_batches', True)
    """

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument
