"""rb_lightning.buffers.priorities: NaN, infinite and negative priorities refused or replaced."""

from __future__ import annotations

import pytest
import torch
from torchrl.data import LazyTensorStorage, PrioritizedSampler, RandomSampler, ReplayBuffer

from rb_lightning.buffers.priorities import (
    InvalidPriorityError,
    check_invalid_priority_mode,
    check_priority,
    current_max_priority,
)


def test_valid_priorities_pass_unchanged():
    p = torch.tensor([0.0, 1.5])
    assert check_priority(p) is not None and torch.equal(check_priority(p), p)
    assert check_priority([1, 2]).tolist() == [1, 2]


def test_invalid_priorities_are_refused_with_counts():
    with pytest.raises(InvalidPriorityError, match="1 NaN, 1 infinite and 1 negative"):
        check_priority(torch.tensor([float("nan"), float("inf"), -1.0, 1.0]))


def test_replace_calls_the_replacement_only_when_needed():
    calls = []

    def replacement() -> float:
        calls.append(1)
        return 7.0

    assert check_priority(
        torch.tensor([1.0]), invalid="replace", replacement=replacement
    ).tolist() == [1.0]
    assert calls == []
    fixed = check_priority(torch.tensor([-1, 2]), invalid="replace", replacement=replacement)
    assert fixed.tolist() == [7.0, 2.0] and calls == [1]


def test_mode_is_checked():
    assert check_invalid_priority_mode("replace") == "replace"
    with pytest.raises(ValueError, match="'raise'.*'replace'"):
        check_invalid_priority_mode("ignore")


def test_current_max_priority_reads_the_sampler():
    rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=PrioritizedSampler(8, 0.6, 0.4))
    assert current_max_priority(rb) == pytest.approx(1.0)
    assert (
        current_max_priority(ReplayBuffer(storage=LazyTensorStorage(8), sampler=RandomSampler()))
        == 1.0
    )
