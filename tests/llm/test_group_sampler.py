"""``GroupSampler`` in a real torchrl buffer: whole groups, staleness, errors, exact resume."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from rb_lightning.buffers.reader import load_buffer, open_saved_buffer
from rb_lightning.errors import BufferCheckpointError, BufferStateError, UsageError
from rb_lightning.llm.groups import GroupSampler
from rb_lightning.persist.dumps import dump_buffer


def _groups(first: int, count: int, size: int, version: int) -> TensorDict:
    n = count * size
    return TensorDict(
        {
            "group": torch.arange(first, first + count).repeat_interleave(size),
            "policy_version": torch.full((n,), version),
            "x": torch.arange(n),
        },
        batch_size=[n],
    )


def _buffer(
    capacity: int = 64, generator: torch.Generator | None = None, **kwargs
) -> tuple[TensorDictReplayBuffer, GroupSampler]:
    sampler = GroupSampler(4, **kwargs)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler)
    rb.set_rng(generator if generator is not None else torch.Generator().manual_seed(0))
    return rb, sampler


def test_every_batch_is_whole_groups_in_contiguous_runs():
    rb, _ = _buffer()
    rb.extend(_groups(0, 10, 4, 0))
    for _ in range(20):
        groups = rb.sample(12)["group"].tolist()
        runs = [groups[i : i + 4] for i in range(0, 12, 4)]
        assert all(len(set(run)) == 1 for run in runs)
        assert len({run[0] for run in runs}) == 3  # without replacement


def test_max_staleness_keeps_only_groups_of_recent_versions():
    rb, sampler = _buffer(max_staleness=1)
    for version in range(4):
        rb.extend(_groups(version * 2, 2, 4, version))
    sampler.consumer_version = 3
    seen = set()
    for _ in range(20):
        seen.update(rb.sample(8)["policy_version"].tolist())
    assert seen == {2, 3}
    assert sampler.last_staleness_mean <= 1
    sampler.consumer_version = 10
    with pytest.raises(BufferStateError, match="no whole group of 4 items within max_staleness=1"):
        rb.sample(8)


def test_a_group_cut_by_the_circular_writer_is_never_drawn():
    rb, _ = _buffer(capacity=10)  # not a multiple of 4: writes wrap inside a group
    rb.extend(_groups(0, 3, 4, 0))  # group 2 overwrites 2 items of group 0
    for _ in range(10):
        assert set(rb.sample(4)["group"].tolist()) <= {1, 2}


def test_batch_size_not_a_multiple_of_the_group_size_names_the_argument():
    rb, _ = _buffer()
    rb.extend(_groups(0, 4, 4, 0))
    with pytest.raises(
        UsageError, match=r"batch_size=6 is not a multiple .* Use batch_size=4 or 8"
    ):
        rb.sample(6)


def test_state_dict_and_generator_resume_the_same_draws():
    generator = torch.Generator().manual_seed(0)
    rb, sampler = _buffer(generator=generator, max_staleness=2)
    for version in range(3):
        rb.extend(_groups(version * 3, 3, 4, version))
    sampler.consumer_version = 2
    rb.sample(8)
    state, rng = sampler.state_dict(), generator.get_state()
    expected = [rb.sample(8)["x"].tolist() for _ in range(5)]

    restored = torch.Generator()
    restored.set_state(rng)
    again, other = _buffer(generator=restored, max_staleness=2)
    again.extend(rb[:])
    other.load_state_dict(state)
    assert other.consumer_version == 2
    assert [again.sample(8)["x"].tolist() for _ in range(5)] == expected


def test_dumps_and_loads_round_trip(tmp_path):
    sampler = GroupSampler(8, max_staleness=0)
    sampler.consumer_version = 17
    sampler.dumps(tmp_path / "sampler")
    restored = GroupSampler(8, max_staleness=0)
    restored.loads(tmp_path / "sampler")
    assert restored.consumer_version == 17


def test_a_dump_records_max_staleness_which_a_resume_may_change(tmp_path):
    rb, _ = _buffer(max_staleness=0)
    rb.extend(_groups(0, 4, 4, 0))
    dump_buffer(rb, tmp_path / "dump")
    assert open_saved_buffer(tmp_path / "dump").sampler.max_staleness == 0  # None before
    # Staleness is a setting of the run, not of the stored groups: a resume may loosen it...
    looser, _ = _buffer(max_staleness=2)
    load_buffer(looser, tmp_path / "dump")
    assert len(looser) == 16
    # ...while the group size shapes what is drawn, so another one is refused.
    other = TensorDictReplayBuffer(storage=LazyTensorStorage(64), sampler=GroupSampler(2))
    with pytest.raises(BufferCheckpointError, match=r"saved GroupSampler\(group_size=4\)"):
        load_buffer(other, tmp_path / "dump")


def test_a_dump_records_the_order_and_column_names(tmp_path):
    # An async GRPO run draws its oldest groups first (order="oldest"): a buffer opened from
    # its checkpoint drew uniformly before, the build record keeping numbers only.
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(64), sampler=GroupSampler(4, max_staleness=0, order="oldest")
    )
    rb.extend(_groups(0, 4, 4, 0))
    dump_buffer(rb, tmp_path / "dump")
    sampler = open_saved_buffer(tmp_path / "dump").sampler
    assert (sampler.order, sampler.group_key, sampler.version_key) == (
        "oldest",
        rb.sampler.group_key,
        rb.sampler.version_key,
    )
    # Which groups come first is the run's to choose: a resume may draw them uniformly.
    uniform = TensorDictReplayBuffer(storage=LazyTensorStorage(64), sampler=GroupSampler(4))
    load_buffer(uniform, tmp_path / "dump")
    assert len(uniform) == 16
