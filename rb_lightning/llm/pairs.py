"""Stored GRPO groups as TRL rows: their text (:func:`with_text`) and preference pairs.

:func:`preference_pairs` turns stored groups into one ``{"prompt", "chosen", "rejected"}``
row per group whose rewards differ (best against worst).

Examples:
    >>> rows = [
    ...     {"prompt": "1+2=", "completion": "3", "reward": 1.0, "group": 0},
    ...     {"prompt": "1+2=", "completion": "4", "reward": 0.0, "group": 0},
    ...     {"prompt": "2+2=", "completion": "4", "reward": 1.0, "group": 1},
    ...     {"prompt": "2+2=", "completion": "4", "reward": 1.0, "group": 1},
    ... ]
    >>> preference_pairs(rows)
    [{'prompt': '1+2=', 'chosen': '3', 'rejected': '4', 'margin': 1.0, 'group': 0}]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rb_lightning.llm.generation import decode_text


def with_text(rows: Iterable[Mapping[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    """``rows`` with ``prompt`` and ``completion`` strings decoded from their token ids.

    Each row needs ``input_ids``, ``attention_mask`` and ``completion_mask``; rows that have
    both strings are kept as they are.

    Args:
        rows: Rows such as those of ``to_hf_dataset(run, streaming=False)``.
        tokenizer: The tokenizer the run used (another one decodes other text, silently).

    Examples:
        >>> from rb_lightning.llm.data import make_tokenizer
        >>> tok = make_tokenizer()
        >>> ids = [0, 0] + tok("1+2=")["input_ids"] + tok("3")["input_ids"] + [1, 0]
        >>> row = {"input_ids": ids, "attention_mask": [0, 0, 1, 1, 1, 1, 1, 1, 0],
        ...        "completion_mask": [1, 1, 0]}
        >>> with_text([row], tok)[0]["prompt"], with_text([row], tok)[0]["completion"]
        ('1+2=', '3')
    """
    out = []
    for row in rows:
        row = dict(row)
        if "prompt" not in row or "completion" not in row:
            width = len(row["completion_mask"])
            ids, attended = list(row["input_ids"]), list(row["attention_mask"])
            prompt = [t for t, a in zip(ids[:-width], attended[:-width], strict=True) if a]
            completion = [t for t, m in zip(ids[-width:], row["completion_mask"], strict=True) if m]
            row["prompt"] = decode_text(tokenizer, prompt, until_eos=False)
            row["completion"] = decode_text(tokenizer, completion)
        out.append(row)
    return out


def preference_pairs(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One (best, worst) completion pair per group with unequal rewards, in group order.

    Each row needs ``prompt``, ``completion``, ``reward`` and ``group``; groups
    whose completions all earned the same reward teach no preference and are left out.
    """
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    pairs = []
    for group, members in sorted(groups.items(), key=lambda item: item[0]):
        best = max(members, key=lambda row: float(row["reward"]))
        worst = min(members, key=lambda row: float(row["reward"]))
        margin = float(best["reward"]) - float(worst["reward"])
        if margin <= 0:
            continue
        pairs.append(
            {
                "prompt": best["prompt"],
                "chosen": best["completion"],
                "rejected": worst["completion"],
                "margin": margin,
                "group": group,
            }
        )
    return pairs


__all__ = ["preference_pairs", "with_text"]
