"""Policy versions: which update of the policy produced a stored item, and how stale it is.

Producers stamp each item with the acting policy's version (:data:`POLICY_VERSION_KEY`);
the learner counts its optimizer updates. Staleness is ``consumer_version -
policy_version``; a sampler with ``max_staleness=s`` draws only items with staleness
``<= s``. Imports nothing but torch.

Examples:
    >>> import torch
    >>> versions = torch.tensor([0, 1, 2, 3])
    >>> staleness(3, versions).tolist()
    [3, 2, 1, 0]
    >>> fresh_mask(3, versions, max_staleness=1).tolist()
    [False, False, True, True]
"""

from __future__ import annotations

import torch

from rb_lightning.errors import UsageError

#: The column holding the version of the policy that produced an item (int64).
POLICY_VERSION_KEY = "policy_version"


def staleness(consumer_version: int, versions: torch.Tensor) -> torch.Tensor:
    """Updates between each stored item's policy and the consumer's (``consumer - version``).

    Examples:
        >>> staleness(5, torch.tensor([5, 4])).tolist()
        [0, 1]
    """
    return int(consumer_version) - versions.reshape(-1).to(torch.int64)


def fresh_mask(
    consumer_version: int, versions: torch.Tensor, max_staleness: int | None
) -> torch.Tensor:
    """Which items are at most ``max_staleness`` updates old (``None``: all of them).

    Items stamped with a version newer than the consumer's (staleness < 0) are
    kept: a producer may run ahead of a learner that has not counted its last
    update yet.

    Examples:
        >>> fresh_mask(2, torch.tensor([0, 2, 3]), max_staleness=0).tolist()
        [False, True, True]
    """
    if max_staleness is None:
        return torch.ones(versions.numel(), dtype=torch.bool, device=versions.device)
    return staleness(consumer_version, versions) <= int(max_staleness)


def check_max_staleness(value: object, argument: str = "max_staleness") -> int | None:
    """``value`` if it is ``None`` or an int ``>= 0``; otherwise a ``UsageError`` naming ``argument``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(
            argument,
            f"{argument} must be an int >= 0 (0: train only on what the current policy "
            f"produced) or None (no limit), got {value!r}.",
        )
    return value


__all__ = ["POLICY_VERSION_KEY", "check_max_staleness", "fresh_mask", "staleness"]
