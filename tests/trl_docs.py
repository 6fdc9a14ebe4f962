"""docs/trl.md's chain from a Lightning run to TRL, as the commands a user types there.

``chain()`` reads the ``bash`` block of the section "From a finished Lightning run, one
command" (the fit, the export, the TRL script), so the tests run what the page says;
``runnable(words)`` turns one of them into the command line of this checkout.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from console_scripts import command

REPO = Path(__file__).resolve().parents[1]
SECTION = "## From a finished Lightning run, one command"


def chain() -> list[list[str]]:
    """The section's commands, split as a shell splits them (comments dropped)."""
    text = (REPO / "docs" / "trl.md").read_text()
    assert SECTION in text, f"docs/trl.md has no section {SECTION!r}"
    block = text.split(SECTION, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def runnable(words: list[str]) -> list[str]:
    """``words`` as this checkout runs them.

    ``python`` is this interpreter, ``train.py`` and ``configs/...`` are the repository's,
    and a console script runs this checkout's entry point (``console_scripts.command``).
    """
    if words[0] != "python":
        return [*command(words[0]), *words[1:]]
    repo_paths = ("train.py", "configs/")
    return [sys.executable] + [
        str(REPO / word) if word == "train.py" or word.startswith(repo_paths) else word
        for word in words[1:]
    ]
