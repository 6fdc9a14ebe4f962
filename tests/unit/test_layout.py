"""The package's shape stays readable: small modules, a thin DataModule, one place that asks
what kind of buffer it was given, no frame inspection.

Read from the source, so a change that breaks the shape fails here, not in a review.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rb_lightning"
MAX_LINES = 500
#: One concept that needs more room: the sharded buffer with its handle and its checkpoints,
#: cut in three modules that imported each other to fit 500 (issue 46 allows ~650 for that).
ONE_CONCEPT_MAX_LINES = {
    "distributed/sharded.py": 650,
    # The one reader of saved buffers (issue 46): what a path is, which dumps, into which buffer.
    "buffers/reader.py": 650,
    # The chunk store of incremental saves (issue 48): chunks, their manifest, collection.
    "persist/chunks.py": 650,
}
# 400: the answers to Trainer switches grew it; their logic is in trainer_switches.py.
DATAMODULE_MAX_LINES = 400
#: Only the buffer handles decide what kind of buffer they were given.
KIND_TESTS = re.compile(
    r"service_backend\b.*!=|isinstance\([^)]*\bBufferMixture\b|ReplayBufferEnsemble\)"
)
#: The resolver, and the plugin that registers the Ray kind.
KIND_RESOLVER = {"buffers/handles.py", "distributed/__init__.py"}
#: A source given to FillMembers must be a mixture to have members: a check of its argument.
ARGUMENT_CHECKS = {"sources/fill_members.py"}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _line_cap(path: Path) -> int:
    return ONE_CONCEPT_MAX_LINES.get(str(path.relative_to(PACKAGE)), MAX_LINES)


def test_no_module_is_over_500_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > _line_cap(p)
    }
    assert not long, f"split these modules by job: {long}"


def test_the_datamodule_is_thin():
    lines = len((PACKAGE / "lightning" / "datamodule.py").read_text().splitlines())
    assert lines < DATAMODULE_MAX_LINES, f"datamodule.py has {lines} lines"


def test_only_the_handles_ask_which_kind_of_buffer_it_is():
    found = [
        f"{p.relative_to(PACKAGE)}:{number}"
        for p in _modules()
        if str(p.relative_to(PACKAGE)) not in KIND_RESOLVER | ARGUMENT_CHECKS
        for number, line in enumerate(p.read_text().splitlines(), 1)
        if KIND_TESTS.search(line) and not line.lstrip().startswith(("#", "class "))
    ]
    assert not found, f"ask the buffer handle (rb_lightning.buffers.handles) instead: {found}"


def test_no_frame_inspection():
    found = [str(p.relative_to(PACKAGE)) for p in _modules() if "_getframe" in p.read_text()]
    assert not found, found
