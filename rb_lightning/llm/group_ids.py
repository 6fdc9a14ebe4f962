"""Group ids of a GRPO run: unique across ranks, micro-batches, resumes and world-size changes.

Each optimizer step has ``slots = world_size x accumulate_grad_batches`` slots of
``prompts`` ids each (rank ``r`` of micro-batch ``m`` takes slot ``m * world_size + r``),
so ids grow with the step, as ``GroupSampler(order="oldest")`` needs. A run resumed with
another number of slots or prompts per step numbers on from the first id its checkpoint
had not used, instead of reusing stored ids.

Examples:
    >>> ids = GroupIds()
    >>> ids.first(step=3, micro=0, rank=1, world_size=2, accumulation=1, prompts=8)
    56
    >>> ids.first(step=4, micro=0, rank=0, world_size=1, accumulation=1, prompts=8)  # one rank now
    64
"""

from __future__ import annotations

from typing import Any

__all__ = ["GroupIds"]


class GroupIds:
    """The numbering of a run's groups (kept in its checkpoints: :meth:`state_dict`)."""

    def __init__(self) -> None:
        # The first id of origin_step, and the slots and prompts of every step since.
        self.origin, self.origin_step, self.slots, self.prompts = 0, 0, 0, 0

    def first(
        self, *, step: int, micro: int, rank: int, world_size: int, accumulation: int, prompts: int
    ) -> int:
        """The id of the first of the ``prompts`` groups this (step, micro-batch, rank) generates."""
        slots = world_size * accumulation
        if self.slots == 0:  # a fresh run: ids from 0 at step 0
            self.slots, self.prompts = slots, prompts
        elif (slots, prompts) != (self.slots, self.prompts):  # resumed otherwise: number on
            self.origin = self.origin + (step - self.origin_step) * self.slots * self.prompts
            self.origin_step, self.slots, self.prompts = step, slots, prompts
        slot = micro * world_size + rank
        return self.origin + ((step - self.origin_step) * slots + slot) * prompts

    def state_dict(self) -> dict[str, int]:
        """What a checkpoint keeps."""
        return {
            "origin": self.origin,
            "origin_step": self.origin_step,
            "slots": self.slots,
            "prompts": self.prompts,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.origin, self.origin_step = int(state["origin"]), int(state["origin_step"])
        self.slots, self.prompts = int(state["slots"]), int(state["prompts"])
