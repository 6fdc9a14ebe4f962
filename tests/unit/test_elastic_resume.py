"""Per-rank buffers restored on another number of ranks (rb_lightning.persist.elastic).

Each saved rank's buffer is dumped the way a DDP checkpoint does (``<ckpt>.buffer/<version>/
rank<r>``) and restored here once per new rank, in one process: the union of the new ranks'
buffers must be the saved items, each once, with its priority, spread evenly and written
oldest first. The same under a real DDP Trainer: tests/scale/test_scale_ddp_elastic.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
)
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, RandomSampler, SliceSampler

from rb_lightning import ReplayBufferDataModule, UsageError
from rb_lightning.buffers.state import buffer_state, restore_buffer_state
from rb_lightning.errors import BufferCheckpointError
from rb_lightning.persist.beside import beside_reference, buffer_dir_for
from rb_lightning.persist.dumps import dump_buffer
from rb_lightning.persist.elastic import plan_redistribution
from rb_lightning.persist.record import BufferRecord
from rb_lightning.torchrl_compat import saved_priority_tree

TAG = 1_000  # item ids: saved rank * TAG + n, in write order


def _restore(rb, state, ckpt=None, *, rank: int, world_size: int, keep="all", seed=None):
    """Restore as a resumed rank does: the redistribution decided once, then the restore."""
    record = BufferRecord.of(state)
    plan = plan_redistribution(record, rank, world_size, keep=keep)
    if plan is not None and seed is not None:
        plan = dataclasses.replace(plan, seed=seed)
    return restore_buffer_state(rb, record, ckpt, rank=rank, redistribution=plan)


def _priority(ids: torch.Tensor) -> torch.Tensor:
    return 0.5 + (ids % 7).float()


def _saved_rank(rank: int, written: int, capacity: int = 16) -> ReplayBuffer:
    """A prioritized buffer that had ``written`` items written (wrapped past ``capacity``)."""
    rb = ReplayBuffer(
        storage=LazyTensorStorage(capacity),
        sampler=PrioritizedSampler(capacity, alpha=0.7, beta=0.5),
    )
    for start in range(0, written, 5):
        ids = rank * TAG + torch.arange(start, min(start + 5, written))
        index = rb.extend(TensorDict({"id": ids}, batch_size=[len(ids)]))
        rb.update_priority(index, _priority(ids))
    return rb


def _checkpoint(tmp_path: Path, buffers: list[ReplayBuffer]) -> tuple[dict, Path]:
    """The buffer state a DDP checkpoint of ``buffers`` (one per rank) holds, and its path."""
    ckpt = tmp_path / "last.ckpt"
    version = buffer_dir_for(ckpt) / "v1"
    for rank, rb in enumerate(buffers):
        manifest = dump_buffer(
            rb, version / f"rank{rank}", extra={"rank": rank, "world_size": len(buffers)}
        )
    state = beside_reference(
        buffer_dir_for(ckpt), "v1", manifest, kind="ranks", world_size=len(buffers)
    )
    return state, ckpt


def _held(rb: ReplayBuffer, tmp_path: Path) -> tuple[list[int], dict[int, float]]:
    """Ids in storage order, and each id's priority-tree value (read back from a dump)."""
    ids = rb[torch.arange(len(rb))]["id"].tolist()
    dump = tmp_path / f"held-{id(rb)}"
    dump_buffer(rb, dump)
    tree, _ = saved_priority_tree(dump / "sampler")
    return ids, dict(zip(ids, tree[: len(ids)].tolist(), strict=True))


def _restore_on(state, ckpt, world_size: int, capacity: int, **options) -> list[ReplayBuffer]:
    shares = []
    for rank in range(world_size):
        rb = ReplayBuffer(
            storage=LazyTensorStorage(capacity),
            sampler=PrioritizedSampler(capacity, alpha=0.7, beta=0.5),
        )
        assert _restore(rb, state, ckpt, rank=rank, world_size=world_size, **options) == []
        shares.append(rb)
    return shares


@pytest.mark.parametrize(
    ("written", "new_world", "capacity"),
    [((30, 9), 1, 32), ((30, 9), 3, 9), ((12, 7, 20), 2, 18), ((11,), 2, 8)],
    ids=["2->1", "2->3 smaller buffers", "3->2", "1->2"],
)
def test_every_saved_item_is_on_exactly_one_rank_with_its_priority(
    tmp_path, written, new_world, capacity
):
    saved = [_saved_rank(rank, n) for rank, n in enumerate(written)]
    state, ckpt = _checkpoint(tmp_path, saved)
    before = {}
    for rb in saved:
        before.update(_held(rb, tmp_path)[1])
    shares = _restore_on(state, ckpt, new_world, capacity)
    held = [_held(rb, tmp_path) for rb in shares]
    ids = [i for rank_ids, _ in held for i in rank_ids]
    assert sorted(ids) == sorted(before) and len(ids) == len(set(ids))
    sizes = [len(rank_ids) for rank_ids, _ in held]
    assert max(sizes) - min(sizes) <= 1
    for rank_ids, priorities in held:
        assert priorities == {i: before[i] for i in rank_ids}
        # Written oldest first: each saved rank's items keep their write order.
        for saved_rank in range(len(written)):
            mine = [i for i in rank_ids if i // TAG == saved_rank]
            assert mine == sorted(mine)


def test_the_oldest_items_are_the_first_overwritten(tmp_path):
    state, ckpt = _checkpoint(tmp_path, [_saved_rank(0, 20), _saved_rank(1, 20)])
    (rb,) = _restore_on(state, ckpt, 1, 32)
    first = rb[torch.arange(len(rb))]["id"].tolist()
    assert first[:2] == [4, TAG + 4]  # the oldest of each saved rank (16 of 20 kept each)
    rb.extend(TensorDict({"id": torch.tensor([-1, -2])}, batch_size=[2]))
    assert set(rb[torch.arange(len(rb))]["id"].tolist()) == (set(first) - {4, TAG + 4}) | {-1, -2}


def test_too_little_room_stops_before_anything_is_loaded(tmp_path):
    state, ckpt = _checkpoint(tmp_path, [_saved_rank(0, 16), _saved_rank(1, 12)])
    rb = ReplayBuffer(storage=LazyTensorStorage(20), sampler=PrioritizedSampler(20, 0.7, 0.5))
    rb.extend(TensorDict({"id": torch.tensor([-5])}, batch_size=[1]))
    with pytest.raises(
        BufferCheckpointError,
        match=r"(?s)28 replay-buffer items saved by 2 process\(es\) \(16, 12\).*on 1 process"
        r".*max_size=20.*so 8 of them would not fit.*max_size of at least 28.*at least 2 "
        r"processes.*resume_keep='newest'.*Nothing was loaded",
    ):
        _restore(rb, state, ckpt, rank=0, world_size=1)
    assert rb[torch.arange(len(rb))]["id"].tolist() == [-5]


def test_keep_newest_drops_the_oldest_items_of_every_saved_rank(tmp_path):
    state, ckpt = _checkpoint(tmp_path, [_saved_rank(0, 6), _saved_rank(1, 6)])
    (rb,) = _restore_on(state, ckpt, 1, 10, keep="newest", seed=0)
    # Ids 0 and TAG, the oldest, are gone; the rest written oldest first from slot 0.
    newest = [i for n in range(1, 6) for i in (n, TAG + n)]
    assert rb[torch.arange(len(rb))]["id"].tolist() == newest


def test_a_buffer_built_differently_is_refused(tmp_path):
    state, ckpt = _checkpoint(tmp_path, [_saved_rank(0, 6), _saved_rank(1, 6)])
    rb = ReplayBuffer(storage=LazyTensorStorage(16), sampler=RandomSampler())
    with pytest.raises(BufferCheckpointError, match="saved sampler=PrioritizedSampler"):
        _restore(rb, state, ckpt, rank=0, world_size=1)
    assert len(rb) == 0


def test_the_new_ranks_sample_with_seeds_of_the_saved_stream_and_the_world_size(tmp_path):
    state, ckpt = _checkpoint(tmp_path, [_saved_rank(0, 12), _saved_rank(1, 12)])

    def draws(rank: int, seed: int) -> list[int]:
        rb = _restore_on(state, ckpt, 3, 16, keep="all", seed=seed)[rank]
        return rb.sample(6)["id"].tolist()

    assert draws(1, seed=5) == draws(1, seed=5)
    assert draws(1, seed=5) != draws(1, seed=6)


def test_a_single_process_buffer_is_dealt_to_ranks_list_storage_included():
    rb = ReplayBuffer(storage=ListStorage(8))
    rb.extend([torch.tensor(i) for i in range(7)])
    state = buffer_state(rb)  # inline, no world size: one process
    shares = []
    for rank in range(3):
        share = ReplayBuffer(storage=ListStorage(4))
        _restore(share, state, rank=rank, world_size=3)
        shares.append([int(share[i]) for i in range(len(share))])
    assert shares == [[0, 3, 6], [1, 4], [2, 5]]


def test_resume_keep_names_the_argument_and_its_values():
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    with pytest.raises(UsageError, match=r"resume_keep='oldest'.*'all'.*'newest'"):
        ReplayBufferDataModule(rb, batch_size=2, resume_keep="oldest")


def test_a_datamodule_resumed_on_other_ranks_samples_from_the_saved_stream_seed(tmp_path):
    state, ckpt = _checkpoint(tmp_path, [_saved_rank(0, 12), _saved_rank(1, 12)])
    located = {**state, "resolved": str(buffer_dir_for(ckpt) / "v1")}  # no Trainer: no ckpt_path

    def draws(stream_seed: int) -> list[int]:
        rb = ReplayBuffer(storage=LazyTensorStorage(32), sampler=PrioritizedSampler(32, 0.7, 0.5))
        datamodule = ReplayBufferDataModule(rb, batch_size=4)
        stream = {"seed": stream_seed, "epoch": 0, "position": 3, "batches_served": 3}
        datamodule.load_state_dict({"batches_served": 3, "stream": stream, "buffer": located})
        assert len(rb) == 24  # one process: every saved item
        return rb.sample(8)["id"].tolist()

    assert draws(11) == draws(11) != draws(12)


def test_a_tensordict_prioritized_buffer_keeps_its_priorities(tmp_path):
    saved = []
    for rank in range(2):
        rb = TensorDictPrioritizedReplayBuffer(storage=LazyTensorStorage(16), alpha=0.7, beta=0.5)
        ids = rank * TAG + torch.arange(10)
        rb.extend(TensorDict({"id": ids, "td_error": _priority(ids)}, batch_size=[10]))
        saved.append(rb)
    state, ckpt = _checkpoint(tmp_path, saved)
    before = {**_held(saved[0], tmp_path)[1], **_held(saved[1], tmp_path)[1]}
    restored = TensorDictPrioritizedReplayBuffer(storage=LazyTensorStorage(32), alpha=0.7, beta=0.5)
    _restore(restored, state, ckpt, rank=0, world_size=1)
    assert _held(restored, tmp_path)[1] == before


def test_trajectories_are_not_dealt_out(tmp_path):
    def sliced(rank: int) -> ReplayBuffer:
        rb = ReplayBuffer(storage=LazyTensorStorage(16), sampler=SliceSampler(num_slices=2))
        ids = rank * TAG + torch.arange(8)
        rb.extend(TensorDict({"id": ids, "episode": ids // 4}, batch_size=[8]))
        return rb

    state, ckpt = _checkpoint(tmp_path, [sliced(0), sliced(1)])
    rb = ReplayBuffer(storage=LazyTensorStorage(16), sampler=SliceSampler(num_slices=2))
    with pytest.raises(BufferCheckpointError, match="trajectories.*number of processes it was"):
        _restore(rb, state, ckpt, rank=0, world_size=1)
    assert len(rb) == 0
