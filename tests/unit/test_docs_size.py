"""Docs a user reads in minutes (issue 55): at most 130 KB in all, no page over 20 KB."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_docs_stay_short():
    sizes = {page.name: page.stat().st_size for page in DOCS.glob("*.md")}
    assert sum(sizes.values()) <= 130_000, f"docs/ holds {sum(sizes.values()):,} bytes"
    assert [name for name, size in sizes.items() if size > 20_000] == []
