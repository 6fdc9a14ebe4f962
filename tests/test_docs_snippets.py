"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs on its own: a fresh namespace, a temporary working directory. A block that
cannot run in a test (it needs a cluster, a GPU, a long run or a multi-process launcher) is
marked on the nearest non-blank line above its fence:

    <!-- not-run: needs a Ray cluster -->

The reason is required. Use the marker sparingly; shrink sizes in the snippet instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(?P<reason>\S.*?)\s*-->$")
NOT_RUN_PREFIX = "<!-- not-run"
# Extras whose absence skips a snippet (a core-only install) instead of failing it.
OPTIONAL_MODULES = {"datasets", "transformers", "trl", "gymnasium", "ray"}


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    skip_reason: str | None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks(page: Path) -> list[Snippet]:
    """The ```python blocks of one Markdown page, with their not-run reasons."""
    lines = page.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```python") and line != "```python":
            raise AssertionError(
                f"{page.relative_to(ROOT)}:{i + 1}: write python fences as a bare '```python' "
                f"at the start of a line (got {line!r}), so this test finds them."
            )
        if line != "```python":
            i += 1
            continue
        end = lines.index("```", i + 1)
        above = next((prev.strip() for prev in reversed(lines[:i]) if prev.strip()), "")
        reason = None
        if above.startswith(NOT_RUN_PREFIX):
            match = NOT_RUN.match(above)
            assert match, f"{page.relative_to(ROOT)}:{i}: write '<!-- not-run: <reason> -->'"
            reason = match["reason"]
        blocks.append(Snippet(page, i + 1, "\n".join(lines[i + 1 : end]) + "\n", reason))
        i = end + 1
    return blocks


SNIPPETS = [snippet for page in PAGES for snippet in python_blocks(page)]


def test_the_docs_have_snippets():
    assert len(SNIPPETS) >= 5, [s.name for s in SNIPPETS]
    assert any(s.page.name == "README.md" for s in SNIPPETS)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.name for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, tmp_path, monkeypatch):
    if snippet.skip_reason:
        pytest.skip(f"not run: {snippet.skip_reason}")
    monkeypatch.chdir(tmp_path)
    code = compile(snippet.code, snippet.name, "exec")
    namespace: dict = {"__name__": "docs_snippet"}
    try:
        exec(code, namespace)
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] in OPTIONAL_MODULES:
            pytest.skip(f"needs the optional module {err.name!r}")
        raise
