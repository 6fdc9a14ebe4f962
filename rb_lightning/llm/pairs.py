"""Preference pairs from stored GRPO groups, for ``trl.DPOTrainer``.

:func:`preference_pairs` turns the rows of stored groups (``prompt``,
``completion``, ``reward``, ``group``, e.g. ``to_hf_dataset(run, streaming=False)``
of a ``configs/llm_grpo.yaml`` run) into one ``{"prompt", "chosen", "rejected"}``
row per group whose rewards differ: the best completion against the worst.

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


__all__ = ["preference_pairs"]
