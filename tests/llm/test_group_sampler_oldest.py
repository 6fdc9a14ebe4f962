"""``GroupSampler(order="oldest")``: each group drawn once, in id order, stale ones counted."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from rb_lightning.errors import UsageError
from rb_lightning.llm.groups import GroupSampler


def _buffer(sampler: GroupSampler, versions: list[int]) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64), sampler=sampler)
    n = len(versions)
    rb.extend(TensorDict({
        "group": torch.arange(n).repeat_interleave(2),
        "policy_version": torch.tensor(versions).repeat_interleave(2),
    }, batch_size=[2 * n]))  # fmt: skip
    return rb


def test_groups_come_once_in_order_and_stale_ones_are_counted_as_dropped():
    sampler = GroupSampler(group_size=2, max_staleness=1, order="oldest")
    rb = _buffer(sampler, [0, 0, 1, 1, 2, 2, 3, 3])  # groups 0..7, two per version
    sampler.consumer_version = 1
    assert rb.sample(4)["group"].tolist() == [0, 0, 1, 1]
    assert rb.sample(4)["group"].tolist() == [2, 2, 3, 3]
    sampler.consumer_version = 4  # versions 0..2 are now too old: groups 4 and 5 are passed over
    assert rb.sample(4)["group"].tolist() == [6, 6, 7, 7]
    assert (sampler.next_group, sampler.groups_dropped) == (8, 2)
    # The cursor and the count are saved with the buffer's sampler.
    restored = GroupSampler(group_size=2, max_staleness=1, order="oldest")
    restored.load_state_dict(sampler.state_dict())
    assert (restored.next_group, restored.groups_dropped) == (8, 2)


def test_an_unknown_order_names_the_argument():
    with pytest.raises(UsageError, match="order must be 'uniform'") as err:
        GroupSampler(group_size=2, order="newest")
    assert err.value.argument == "order"
