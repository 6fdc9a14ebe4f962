"""How the command line tells a user's mistake: one paragraph on stderr, exit code 2.

Imports nothing heavy: ``rb-lightning`` and ``python train.py`` tell mistakes found
before torch is imported (:mod:`rb_lightning.runs.preflight`) the same way as the
ones the CLI finds later (:mod:`rb_lightning.runs.cli`).

Examples:
    >>> from rb_lightning.errors import UsageError
    >>> paragraph(UsageError("--config", "'x' is not a file.\\nPass one."))
    "'x' is not a file. Pass one. (argument: --config)"
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

from rb_lightning.errors import ConfigError, RBLightningError, SourceError

__all__ = ["CONFIG_ERROR_EXIT_CODE", "DEBUG_ENV", "exit_with", "one_paragraph", "paragraph",
           "program"]  # fmt: skip

#: Exit code of a run stopped by a user's mistake (argparse's code for usage errors).
CONFIG_ERROR_EXIT_CODE = 2
#: Set to ``1`` to get the traceback instead of the paragraph.
DEBUG_ENV = "RB_LIGHTNING_DEBUG"


def one_paragraph(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def paragraph(err: RBLightningError) -> str:
    """``err`` as the command line prints it: one paragraph, naming the argument at fault."""
    message = one_paragraph(str(err))
    if isinstance(err, SourceError):
        return f"config error at data.init_args.{err.argument}: {message}"
    if err.argument is not None and not isinstance(err, ConfigError):
        return f"{message} (argument: {err.argument})"
    return message


def exit_with(err: RBLightningError) -> NoReturn:
    """Print ``err`` as one paragraph on stderr and exit with code 2 (re-raise it when debugging)."""
    if os.environ.get(DEBUG_ENV):
        raise err
    print(f"error: {paragraph(err)} (set {DEBUG_ENV}=1 for the traceback)", file=sys.stderr)
    raise SystemExit(CONFIG_ERROR_EXIT_CODE) from None


def program() -> str:
    """How the user started this process: the console script or ``python train.py``."""
    return "rb-lightning" if Path(sys.argv[0]).name == "rb-lightning" else "python train.py"
