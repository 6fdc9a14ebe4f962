"""The clipped GRPO objective on stored groups (TRL's ``loss_type="dapo"``: a token mean).

Examples:
    >>> import torch
    >>> logp = torch.zeros(2, 3)
    >>> loss, stats = clipped_objective(
    ...     logp, behaviour=torch.zeros(2, 3), advantage=torch.tensor([1.0, -1.0]),
    ...     mask=torch.ones(2, 3), clip_epsilon=0.2)
    >>> float(loss), float(stats["clip_fraction"])
    (0.0, 0.0)
"""

from __future__ import annotations

import torch

__all__ = ["clipped_objective"]


def clipped_objective(
    logp: torch.Tensor,
    *,
    behaviour: torch.Tensor,
    advantage: torch.Tensor,
    mask: torch.Tensor,
    clip_epsilon: float,
    decoupled: bool = False,
    importance_weight_cap: float = 2.0,
    ref_log_probs: torch.Tensor | None = None,
    beta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of per-token log-probs ``logp`` ``[B, T]`` and what to log about it.

    ``decoupled``: AReaL's decoupled objective (the ratio against the current weights
    before this update, each token weighted by its importance weight against the
    behaviour policy, capped). ``beta > 0`` adds the k3 estimate of the KL to the
    reference log-probs.
    """
    mask = mask.to(logp.dtype)
    advantage = advantage.to(logp.dtype)[:, None]
    tokens = mask.sum().clamp(min=1)
    stats = {}
    if decoupled:
        # The proximal policy is the current one before this update: one update per batch,
        # so its log-probs are this forward's, detached (no second forward pass).
        proximal = logp.detach()
        ratio = (logp - proximal).exp()
        weight = (proximal - behaviour).exp().clamp(max=importance_weight_cap)
        with torch.no_grad():
            stats["importance_weight_mean"] = (weight * mask).sum() / tokens
            capped = (proximal - behaviour).exp() > importance_weight_cap
            stats["importance_weight_capped"] = (capped.to(mask.dtype) * mask).sum() / tokens
    else:
        ratio = (logp - behaviour).exp()
        weight = torch.ones_like(ratio)
    clipped = ratio.clamp(1 - clip_epsilon, 1 + clip_epsilon)
    per_token = -weight * torch.minimum(ratio * advantage, clipped * advantage)
    if ref_log_probs is not None and beta > 0:
        delta = ref_log_probs - logp
        kl = delta.exp() - delta - 1
        per_token = per_token + beta * kl
        stats["kl"] = (kl * mask).sum() / tokens
    loss = (per_token * mask).sum() / tokens
    with torch.no_grad():
        stats["clip_fraction"] = ((ratio != clipped).to(mask.dtype) * mask).sum() / tokens
    return loss, stats
