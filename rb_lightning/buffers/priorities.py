"""One guard for every place priorities enter a replay buffer.

One NaN or negative priority poisons a ``PrioritizedSampler``'s sum tree for good (it then
samples index 0 over and over). :func:`check_priority` refuses them (``invalid="raise"``)
or replaces them with the current max priority (``"replace"``); call it before
``rb.update_priority`` anywhere the DataModule does not.

Examples:
    >>> import torch
    >>> check_priority(torch.tensor([0.5, float("nan")]), invalid="replace", replacement=3.0)
    tensor([0.5000, 3.0000])
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Literal

import torch

from rb_lightning.errors import InvalidPriorityError, UsageError

logger = logging.getLogger(__name__)

#: What to do with a NaN, infinite or negative priority.
InvalidPriority = Literal["raise", "replace"]
INVALID_PRIORITY_MODES = ("raise", "replace")


def check_invalid_priority_mode(value: Any, name: str = "invalid_priority") -> InvalidPriority:
    """Validate the ``invalid_priority`` argument (``"raise"`` or ``"replace"``)."""
    if value not in INVALID_PRIORITY_MODES:
        raise UsageError(
            name,
            f"{name} must be 'raise' (refuse NaN, infinite and negative priorities) or "
            f"'replace' (swap them for the current max priority and log how many), got {value!r}.",
        )
    return value


def current_max_priority(replay_buffer: Any) -> float:
    """The priority a new item would get: the sampler's max priority so far, else ``1.0``.

    ``1.0`` too when the sampler has none (not prioritized, remote) or its max is
    itself not a finite non-negative number.
    """
    try:
        sampler = replay_buffer.sampler
    except AttributeError:  # a Ray-backed buffer keeps its sampler in the actor
        return 1.0
    raw = getattr(sampler, "default_priority", None)
    if raw is None:
        return 1.0
    try:
        value = float(raw)
    except (TypeError, ValueError, RuntimeError):
        return 1.0
    return value if math.isfinite(value) and value >= 0 else 1.0


def check_priority(
    priority: Any,
    *,
    invalid: InvalidPriority = "raise",
    replacement: float | Callable[[], float] = 1.0,
    where: str = "update_priority",
) -> torch.Tensor:
    """Return ``priority`` as a tensor, refusing or replacing NaN, infinite and negative values.

    Args:
        priority: New priorities (a tensor, number or sequence).

    Keyword Args:
        invalid: ``"raise"``: raise :class:`InvalidPriorityError` counting the
            bad values. ``"replace"``: put ``replacement`` in their place and log
            a warning with the count.
        replacement: The value used by ``"replace"``, or a function returning
            it, called only when something is replaced (usually
            :func:`current_max_priority`).
        where: Name of the caller, for the messages.
    """
    priority = torch.as_tensor(priority).detach()
    if not priority.dtype.is_floating_point:
        # Integers are always finite: only the sign can be wrong.
        bad = priority < 0
        if not bool(bad.any()):
            return priority
        priority = priority.double()
    else:
        bad = ~torch.isfinite(priority) | (priority < 0)
        if not bool(bad.any()):  # one reduction and one sync on the common path
            return priority
    n_nan = int(torch.isnan(priority).sum())
    n_inf = int(torch.isinf(priority).sum())
    n_neg = int((priority < 0).sum())
    counts = f"{n_nan} NaN, {n_inf} infinite and {n_neg} negative values out of {priority.numel()}"
    if invalid == "replace":
        if callable(replacement):
            replacement = replacement()
        logger.warning(
            "%s: replaced %d invalid priorities (%s) with the current max priority %.4g.",
            where,
            int(bad.sum()),
            counts,
            replacement,
        )
        return torch.where(bad, torch.as_tensor(replacement, dtype=priority.dtype), priority)
    raise InvalidPriorityError(
        f"{where} got invalid priorities: {counts}. One NaN poisons a PrioritizedSampler for "
        "good (sampling then returns the same item every time), and a negative one corrupts "
        "its sum tree. Usually the loss or TD error diverged: check the loss for NaN/inf "
        "(lower the learning rate, clip gradients), and pass finite non-negative priorities "
        "such as td_error.abs().nan_to_num(0.0).clamp(max=100.0). To keep running and replace "
        "them with the current max priority instead, pass "
        "ReplayBufferDataModule(invalid_priority='replace')."
    )


def in_sampler_dtype(priority: Any, sampler: Any) -> torch.Tensor:
    """``priority`` as a tensor of the type of ``sampler``'s sum tree (mixed precision computes TD errors in another type; torchrl's trees take their own only).

    Examples:
        >>> from torchrl.data import PrioritizedSampler
        >>> in_sampler_dtype(torch.ones(2, dtype=torch.bfloat16), PrioritizedSampler(4, 0.6, 0.4))
        tensor([1., 1.])
    """
    priority = torch.as_tensor(priority).detach()
    dtype = getattr(sampler, "dtype", None)
    if isinstance(dtype, torch.dtype) and priority.dtype != dtype:
        return priority.to(dtype)
    return priority


__all__ = [
    "INVALID_PRIORITY_MODES",
    "in_sampler_dtype",
    "InvalidPriorityError",
    "check_invalid_priority_mode",
    "check_priority",
    "current_max_priority",
]
