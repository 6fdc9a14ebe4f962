"""The README "Switching to TRL" snippet runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytestmark = pytest.mark.hf

README = Path(__file__).resolve().parents[2] / "README.md"


def trl_snippet() -> str:
    text = README.read_text()
    section = text.split("<!-- section:trl -->")[1].split("<!-- /section:trl -->")[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)[0]


def test_readme_trl_snippet_trains_sft_then_grpo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(trl_snippet(), "README.md#switching-to-trl", "exec"), namespace)
    assert namespace["sft"].state.global_step == 3
    assert namespace["grpo"].state.global_step == 3
