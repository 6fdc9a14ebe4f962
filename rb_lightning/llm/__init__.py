"""Language-model helpers: a synthetic arithmetic task, a tiny offline tokenizer, online GRPO.

The names below are imported on first use (``rb_lightning.llm.GRPOModule`` imports
``transformers`` then), so ``import rb_lightning.llm`` imports no optional dependency.

Examples:
    >>> import rb_lightning.llm
    >>> rb_lightning.llm.GroupSampler(group_size=8, max_staleness=0)
    GroupSampler(group_size=8, group_key='group', max_staleness=0, order='uniform', consumer_version=0)
"""

from __future__ import annotations

from rb_lightning.namespaces import lazy_names

_HOMES = {
    "AsyncGRPOModule": "rb_lightning.llm.async_grpo",
    "CausalLMModule": "rb_lightning.llm.module",
    "GRPOModule": "rb_lightning.llm.grpo",
    "GroupSampler": "rb_lightning.llm.groups",
    "preference_pairs": "rb_lightning.llm.pairs",
    "with_text": "rb_lightning.llm.pairs",
}

__all__ = sorted(_HOMES)


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
