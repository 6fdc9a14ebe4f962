"""Reward functions that fail in the GRPO generation worker, for the tests of its failures.

Each writes its process id to ``$RB_TEST_WORKER_PID`` on its first call, scores like
:func:`rb_lightning.llm.data.arithmetic_reward`, and fails on call ``$RB_TEST_FAULT_AT``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from rb_lightning.llm.data import arithmetic_reward

_calls = 0


def _count() -> bool:
    global _calls
    _calls += 1
    if _calls == 1:
        Path(os.environ["RB_TEST_WORKER_PID"]).write_text(str(os.getpid()))
    return _calls >= int(os.environ["RB_TEST_FAULT_AT"])


def raising_reward(completions: list[str], prompts: list[str]) -> list[float]:
    """Raises ``ConnectionError`` on call ``$RB_TEST_FAULT_AT`` (a remote grader gone)."""
    if _count():
        raise ConnectionError("the grading server at 10.0.0.7 refused the connection")
    return arithmetic_reward(completions, prompts=prompts)


def killed_reward(completions: list[str], prompts: list[str]) -> list[float]:
    """Kills its own process (SIGKILL, as the out-of-memory killer) on call ``$RB_TEST_FAULT_AT``."""
    if _count():
        os.kill(os.getpid(), signal.SIGKILL)
    return arithmetic_reward(completions, prompts=prompts)
