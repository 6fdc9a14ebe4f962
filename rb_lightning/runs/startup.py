"""The start-up of ``rb-lightning`` and ``python train.py``: Ctrl-C before training, one line.

Until a subcommand starts (:func:`hand_ctrl_c_to_the_trainer`), Ctrl-C ends the process at
once with one line and code 130 (a ``KeyboardInterrupt`` inside an import could surface as
another library's error). Imports nothing heavy, so it can guard the imports themselves.

Examples:
    >>> import signal
    >>> previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    >>> stop_at_once_on_ctrl_c(); signal.getsignal(signal.SIGINT) is exit_on_ctrl_c
    True
    >>> hand_ctrl_c_to_the_trainer(); signal.getsignal(signal.SIGINT) is signal.default_int_handler
    True
    >>> _ = signal.signal(signal.SIGINT, previous)
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

__all__ = [
    "INTERRUPT_EXIT_CODE",
    "STARTUP_INTERRUPT_LINE",
    "exit_on_ctrl_c",
    "send_ray_start_token",
    "hand_ctrl_c_to_the_trainer",
    "stop_at_once_on_ctrl_c",
]

#: Exit code of a run stopped by Ctrl-C (the shell's 128 + SIGINT).
INTERRUPT_EXIT_CODE = 130
STARTUP_INTERRUPT_LINE = "stopped by Ctrl-C before training started: nothing to save or resume"


def exit_on_ctrl_c(signum: int, frame: Any) -> None:
    """The start-up's SIGINT handler: one line on stderr, exit 130, nothing else run."""
    print(STARTUP_INTERRUPT_LINE, file=sys.stderr)
    sys.stderr.flush()
    os._exit(INTERRUPT_EXIT_CODE)


def stop_at_once_on_ctrl_c() -> None:
    """Install :func:`exit_on_ctrl_c`, unless Ctrl-C is ignored or has a handler of the user's."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, exit_on_ctrl_c)


def hand_ctrl_c_to_the_trainer() -> None:
    """Give Ctrl-C back to Python's ``KeyboardInterrupt``: the Trainer handles it from here."""
    if signal.getsignal(signal.SIGINT) is exit_on_ctrl_c:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def send_ray_start_token() -> None:
    """Join a cluster that ``ray start`` made as ``ray start`` would: with its token.

    ``ray start`` (Ray 2.60) turns token authentication on and writes the token to
    ``~/.ray/auth_token``, but a process joining it sends the token only under
    ``RAY_AUTH_MODE=token``; without it the run waits 20 s and fails. Where a token is at
    hand and the mode is unset, set it (a cluster without authentication accepts a
    process that sends one). ``RAY_AUTH_MODE=disabled`` keeps it off. Ray reads the mode
    when it is imported: call this first.
    """
    if "RAY_AUTH_MODE" in os.environ:
        return
    token_file = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.isfile(token_file):
        os.environ["RAY_AUTH_MODE"] = "token"

