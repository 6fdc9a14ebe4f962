"""A priority update never lands on an item written into the slot after the draw.

The online member is a full circular buffer written while training: between the
draw of a batch (one step ahead of its ``training_step``) and its priority update,
new items take some of its slots. Their updates are dropped and counted.
"""

from __future__ import annotations

import lightning as L
import torch
from mixture_helpers import ONLINE_ID0, items, member
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    RoundRobinWriter,
    TensorDictReplayBuffer,
)
from trainers import quiet_trainer

from rb_lightning import BufferMixture, ReplayBufferDataModule

CAPACITY = 40
NEW_ID0 = 500_000


def full_mixture(seed: int = 0, **online) -> BufferMixture:
    offline = member(False)
    offline.extend(items(60, 0))
    on = online.pop("buffer", None) or member(True, capacity=CAPACITY)
    on.extend(items(CAPACITY, ONLINE_ID0))  # full: the next write takes slot 0
    mix = BufferMixture({"offline": offline, "online": on})
    mix.set_rng(torch.Generator().manual_seed(seed))
    return mix


def tree(mix: BufferMixture) -> torch.Tensor:
    sampler = mix.member("online").sampler
    return torch.tensor([sampler._sum_tree[i] for i in range(CAPACITY)])


def check_update_skips_rewritten_slots(mix: BufferMixture, written: int) -> None:
    dm = ReplayBufferDataModule(mix, batch_size=32)
    batch = mix.sample(32)
    mix.member("online").extend(items(written, NEW_ID0))  # slots 0 .. written-1, max priority
    online = batch[batch["source"] == 1]
    rewritten = online["index"] < written
    assert 0 < int(rewritten.sum()) < len(online)  # both kinds in this batch (seeded)
    before = tree(mix)
    dm.update_priority(batch, torch.full((32,), 0.01))
    after = tree(mix)
    stale = online["index"][rewritten]
    live = online["index"][~rewritten]
    assert torch.equal(after[stale], before[stale])  # the new items keep their priority
    sampler = mix.member("online").sampler
    updated = (0.01 + sampler._eps) ** sampler._alpha
    assert torch.allclose(after[live], torch.full((len(live),), updated))
    # One per item (two items of a batch may share a slot); uniform members are not updated.
    assert mix.dropped_priority_updates == {"offline": 0, "online": int(rewritten.sum())}


def test_an_update_for_a_rewritten_slot_is_dropped_and_counted():
    check_update_skips_rewritten_slots(full_mixture(), written=10)


def test_a_writer_tracking_generations_is_asked_for_them():
    sampler = PrioritizedSampler(CAPACITY, alpha=0.8, beta=0.5)
    online = TensorDictReplayBuffer(
        storage=LazyTensorStorage(CAPACITY),
        sampler=sampler,
        writer=RoundRobinWriter(track_generations=True),
    )
    check_update_skips_rewritten_slots(full_mixture(buffer=online), written=10)


def test_a_slot_rewritten_twice_around_the_ring_is_dropped_too():
    # More writes than the capacity: every slot holds a newer item than the draw's.
    mix = full_mixture()
    dm = ReplayBufferDataModule(mix, batch_size=32)
    batch = mix.sample(32)
    mix.member("online").extend(items(CAPACITY + 5, NEW_ID0))
    before = tree(mix)
    dm.update_priority(batch, torch.full((32,), 0.01))
    assert torch.equal(tree(mix), before)
    assert mix.dropped_priority_updates["online"] == int((batch["source"] == 1).sum())


class Learner(L.LightningModule):
    """Writes 3 online items a step (a collector), then updates the batch's priorities."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.updates = self.stale = self.wrong = 0

    def training_step(self, batch, batch_idx):
        mix = self.trainer.datamodule.replay_buffer
        online = mix.member("online")
        is_online = batch["source"] == 1
        index = batch["index"][is_online]
        # Which slots hold another item than the one drawn (a write since the draw).
        moved = online[index]["id"] != batch["id"][is_online]
        before = tree(mix)
        self.trainer.datamodule.update_priority(batch, torch.full((len(batch),), 1e-3))
        after = tree(mix)
        self.updates += int(is_online.sum())
        self.stale += int(moved.sum())
        # A rewritten slot keeps the newer item's priority.
        self.wrong += int((after[index[moved]] != before[index[moved]]).sum())
        online.extend(items(3, NEW_ID0 + 3 * self.global_step))
        return self.net(batch["obs"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_fit_with_a_member_written_online_keeps_new_items_priorities():
    mix = full_mixture(seed=1)
    dm = ReplayBufferDataModule(mix, batch_size=16, num_batches=None)
    model = Learner()
    quiet_trainer(max_steps=60).fit(model, datamodule=dm)
    assert model.stale > 0  # the batch read ahead saw the previous step's writes
    assert model.wrong == 0
    assert mix.dropped_priority_updates["online"] == model.stale
    assert model.updates == 60 * 8


def test_a_batch_keeps_one_stamp_per_item_and_items_keep_theirs():
    mix = full_mixture()
    batch = mix.sample(16)
    assert batch["index_generation"].dtype == torch.int64
    assert batch["index_generation"].shape == torch.Size([16])
    # Stamps say nothing about data: the stored items are untouched.
    assert "index_generation" not in mix.member("online")[torch.arange(3)].keys()
    assert isinstance(mix.member("online")[torch.arange(3)], TensorDict)
