"""The project's console scripts as pyproject.toml declares them, runnable without installing.

``command("rb-lightning-export-hf")`` is what pip's wrapper runs (``from module import
function; sys.exit(function())``), so a test runs the entry point of this checkout, not
the wrapper an earlier install left in the environment.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def entry_point(name: str) -> tuple[str, str]:
    """``(module, function)`` of console script ``name`` in ``[project.scripts]``."""
    scripts = PYPROJECT.read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    found = re.search(rf'^{re.escape(name)}\s*=\s*"([\w.]+):(\w+)"', scripts, re.MULTILINE)
    assert found, f"pyproject.toml declares no console script {name!r}"
    return found.group(1), found.group(2)


def command(name: str) -> list[str]:
    """The command line that runs console script ``name``."""
    module, function = entry_point(name)
    code = f"import sys; from {module} import {function}; sys.argv[0] = {name!r}; sys.exit({function}())"
    return [sys.executable, "-c", code]
