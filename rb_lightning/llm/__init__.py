"""Language-model helpers: a synthetic arithmetic task, a tiny offline tokenizer, online GRPO.

The names below are imported on first use (``rb_lightning.llm.GRPOModule`` imports
``transformers`` then), so ``import rb_lightning.llm`` imports no optional dependency.

Examples:
    >>> import rb_lightning.llm
    >>> rb_lightning.llm.GroupSampler(group_size=8, max_staleness=0)
    GroupSampler(group_size=8, group_key='group', max_staleness=0, consumer_version=0)
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "CausalLMModule": "rb_lightning.llm.module",
    "GRPOModule": "rb_lightning.llm.grpo",
    "GroupSampler": "rb_lightning.llm.groups",
    "preference_pairs": "rb_lightning.llm.pairs",
    "with_text": "rb_lightning.llm.pairs",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rb_lightning.llm' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
