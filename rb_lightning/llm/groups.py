"""``GroupSampler``: batches of whole groups (all completions of a prompt), fresh enough.

Group-relative objectives normalise a completion's reward against its group's, so a batch
holds its groups whole. The sampler keeps the groups (stored ``group`` id) whose items are
all present and at most ``max_staleness`` versions older than
:attr:`GroupSampler.consumer_version` (saved with the buffer), and draws
``batch_size // group_size`` of them without replacement.

Examples:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    >>> sampler = GroupSampler(group_size=4, max_staleness=0)
    >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64), sampler=sampler)
    >>> _ = rb.extend(TensorDict({
    ...     "group": torch.arange(4).repeat_interleave(4),         # 4 groups of 4
    ...     "policy_version": torch.tensor([0] * 8 + [1] * 8),     # 2 old, 2 new
    ... }, batch_size=[16]))
    >>> sampler.consumer_version = 1
    >>> sorted(rb.sample(8)["group"].tolist())                     # the 2 fresh groups, whole
    [2, 2, 2, 2, 3, 3, 3, 3]
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from torchrl.data.replay_buffers import Sampler
from torchrl.data.replay_buffers.storages import Storage

from rb_lightning import torchrl_compat
from rb_lightning.errors import ArgumentTypeError, BufferStateError, UsageError
from rb_lightning.policy_version import POLICY_VERSION_KEY, check_max_staleness, fresh_mask

#: The column holding each item's group id (int64), by default.
GROUP_KEY = "group"
_STATE_FILE = "group_sampler.json"


class GroupSampler(Sampler):
    """Sample ``batch_size // group_size`` whole groups per batch, at most ``max_staleness`` old.

    Eligible groups are drawn uniformly without replacement (again with replacement when too
    few are eligible); a group with overwritten items is never drawn.

    Args:
        group_size: Items per group (GRPO's ``num_generations``); divides the batch size.

    Keyword Args:
        group_key: Column of the group ids (int64, one value per item).
        max_staleness: Draw only groups at most this many versions before
            :attr:`consumer_version` (``0``: on-policy; ``None``: no limit).
        version_key: Column of the producing policy's version.
        order: ``"uniform"``, or ``"oldest"``: each group once, lowest ids first, the stale
            ones passed over counted in :attr:`groups_dropped` (the asynchronous GRPO loop).
    """

    def __init__(
        self,
        group_size: int,
        *,
        group_key: str = GROUP_KEY,
        max_staleness: int | None = None,
        version_key: str = POLICY_VERSION_KEY,
        order: str = "uniform",
    ) -> None:
        if isinstance(group_size, bool) or not isinstance(group_size, int):
            raise ArgumentTypeError(
                "group_size", f"group_size must be an int >= 1, got {group_size!r}."
            )
        if group_size < 1:
            raise UsageError("group_size", f"group_size must be >= 1, got {group_size}.")
        self.group_size = group_size
        self.group_key = group_key
        self.max_staleness = check_max_staleness(max_staleness)
        self.version_key = version_key
        if order not in ("uniform", "oldest"):
            raise UsageError(
                "order",
                f"order must be 'uniform' (draw among the eligible groups) or 'oldest' (each "
                f"group once, in generation order), got {order!r}.",
            )
        self.order = order
        #: ``order="oldest"``: groups of lower ids were drawn or dropped already.
        self.next_group = 0
        #: ``order="oldest"``: groups passed over because they were older than ``max_staleness``.
        self.groups_dropped = 0
        #: The learner's policy version: items older than ``consumer_version - max_staleness``
        #: are not drawn. Set it before each draw (``sampler.consumer_version = global_step``).
        self.consumer_version = 0
        #: Mean staleness (``consumer_version - policy_version``) of the last batch drawn.
        self.last_staleness_mean = 0.0

    # -- checks -----------------------------------------------------------------------------
    def check_batch_size(self, batch_size: int, argument: str = "batch_size") -> None:
        """Raise a :class:`UsageError` naming ``argument`` unless ``batch_size`` holds whole groups."""
        if batch_size % self.group_size:
            lower = batch_size // self.group_size * self.group_size
            raise UsageError(
                argument,
                f"{argument}={batch_size} is not a multiple of GroupSampler(group_size="
                f"{self.group_size}), so a batch cannot hold whole groups of {self.group_size} "
                f"completions. Use {argument}={max(lower, self.group_size)} or "
                f"{lower + self.group_size} (a multiple of the group size), or change "
                "group_size (num_generations) to a divisor of the batch size.",
            )

    # -- sampling ---------------------------------------------------------------------------
    def _column(self, storage: Storage, key: str, n: int) -> torch.Tensor:
        content = torchrl_compat.storage_content(storage)
        if content is not None and hasattr(content, "get") and key in content.keys():
            return content.get(key)[:n].reshape(n, -1)[:, 0]
        data = storage[:n]
        if not hasattr(data, "keys") or key not in data.keys():
            raise BufferStateError(
                f"GroupSampler reads the {key!r} column, and the stored items have none. "
                f"Write items with an int64 {key!r} column (a group id, or the producing "
                "policy's version), or set group_key=/version_key= to the column that holds it."
            )
        return data.get(key).reshape(n, -1)[:, 0]

    def _eligible_groups(self, storage: Storage) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions of the eligible items, sorted by group, and the eligible group ids."""
        n = len(storage)
        groups = self._column(storage, self.group_key, n).cpu()
        keep = torch.ones(n, dtype=torch.bool)
        if self.max_staleness is not None:
            versions = self._column(storage, self.version_key, n).cpu()
            keep = fresh_mask(self.consumer_version, versions, self.max_staleness)
        positions = keep.nonzero().reshape(-1)
        ids, counts = torch.unique(groups[positions], return_counts=True)
        whole = ids[counts == self.group_size]
        inside = torch.isin(groups[positions], whole)
        positions = positions[inside]
        # Stable sort: the items of a group, in storage order, become contiguous.
        order = torch.sort(groups[positions], stable=True).indices
        return positions[order], whole

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        """Positions of ``batch_size // group_size`` whole groups, and ``{}``."""
        self.check_batch_size(batch_size)
        if len(storage) == 0:
            raise BufferStateError("Cannot sample from an empty storage.")
        positions, ids = self._eligible_groups(storage)
        wanted = batch_size // self.group_size
        if ids.numel() == 0:
            limit = (
                "" if self.max_staleness is None else f" within max_staleness={self.max_staleness}"
            )
            raise BufferStateError(
                f"GroupSampler found no whole group of {self.group_size} items{limit} "
                f"(consumer_version={self.consumer_version}) among the buffer's "
                f"{len(storage)} items. Write whole groups of group_size items before the "
                "draw, raise max_staleness, or set consumer_version to the learner's version."
            )
        rng = torchrl_compat.buffer_generator(self)  # what ReplayBuffer.set_rng gave the sampler
        device = rng.device if rng is not None else None
        if self.order == "oldest":
            chosen = self._oldest(storage, ids, wanted, device)
        elif ids.numel() >= wanted:
            chosen = torch.randperm(ids.numel(), generator=rng, device=device)[:wanted]
        else:
            extra = torch.randint(
                ids.numel(), (wanted - ids.numel(),), generator=rng, device=device
            )
            chosen = torch.cat([torch.arange(ids.numel(), device=device), extra])
        # Each eligible group is group_size contiguous positions (sorted by id, as ids are).
        starts = chosen.cpu() * self.group_size
        rows = starts[:, None] + torch.arange(self.group_size)[None, :]
        index = positions[rows.reshape(-1)]
        self._record_staleness(storage, index)
        return index, {}

    def _oldest(
        self, storage: Storage, ids: torch.Tensor, wanted: int, device: Any
    ) -> torch.Tensor:
        """Indices (into ``ids``) of the lowest eligible ids not drawn yet; advances the cursor."""
        unseen = (ids >= self.next_group).nonzero().reshape(-1)[:wanted]
        if unseen.numel():
            new_next = int(ids[unseen[-1]]) + 1
            every = torch.unique(self._column(storage, self.group_key, len(storage)).cpu())
            passed = int(((every >= self.next_group) & (every < new_next)).sum())
            self.groups_dropped += passed - unseen.numel()
            self.next_group = new_next
        if unseen.numel() >= wanted:
            return unseen
        # Not enough new groups (the learner did not wait for them): draw eligible ones again.
        rng = torchrl_compat.buffer_generator(self)
        extra = torch.randint(ids.numel(), (wanted - unseen.numel(),), generator=rng,
                              device=device).cpu()  # fmt: skip
        return torch.cat([unseen, extra])

    def _record_staleness(self, storage: Storage, index: torch.Tensor) -> None:
        content = torchrl_compat.storage_content(storage)
        if (
            content is None
            or not hasattr(content, "keys")
            or self.version_key not in content.keys()
        ):
            return
        versions = content.get(self.version_key)[index.to(content.device)].reshape(-1)
        self.last_staleness_mean = float((self.consumer_version - versions.double()).mean())

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The consumer version (the settings come from the constructor)."""
        state = OrderedDict(consumer_version=int(self.consumer_version))
        if self.order == "oldest":
            state.update(next_group=self.next_group, groups_dropped=self.groups_dropped)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.consumer_version = int(state_dict["consumer_version"])
        self.next_group = int(state_dict.get("next_group", 0))
        self.groups_dropped = int(state_dict.get("groups_dropped", 0))

    def _empty(self) -> None:
        # The consumer's version belongs to the learner, not to the emptied content.
        return

    def dumps(self, path: str | Path) -> None:
        """Write :meth:`state_dict` as JSON into the folder ``path``."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / _STATE_FILE).write_text(json.dumps(dict(self.state_dict())))

    def loads(self, path: str | Path) -> None:
        """Read what :meth:`dumps` wrote."""
        self.load_state_dict(json.loads((Path(path) / _STATE_FILE).read_text()))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(group_size={self.group_size}, group_key={self.group_key!r}, "
            f"max_staleness={self.max_staleness}, order={self.order!r}, "
            f"consumer_version={self.consumer_version})"
        )


__all__ = ["GROUP_KEY", "GroupSampler"]
