"""The docs/trl.md "SFT, then GRPO" snippet runs as written and trains both trainers.

tests/test_docs_snippets.py runs every snippet; this one also checks what it trained.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytestmark = pytest.mark.hf

TRL_PAGE = Path(__file__).resolve().parents[2] / "docs" / "trl.md"


def trl_snippet() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```$", TRL_PAGE.read_text(), flags=re.M | re.S)
    (snippet,) = [block for block in blocks if "GRPOTrainer(" in block]
    return snippet


def test_docs_trl_snippet_trains_sft_then_grpo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(trl_snippet(), "docs/trl.md#sft-then-grpo-on-one-buffer", "exec"), namespace)
    assert namespace["sft"].state.global_step == 3
    assert namespace["grpo"].state.global_step == 3
