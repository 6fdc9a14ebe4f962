"""Sample requests in flight to a Ray-served buffer, and priority updates that skip rewritten slots.

One local Ray cluster on loopback for the module; each test owns its own buffer actor.
"""

from __future__ import annotations

from functools import partial

import lightning as L
import pytest
import torch
from rb_testdata import id_items
from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    ReplayBuffer,
    RoundRobinWriter,
    SamplerWithoutReplacement,
)
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.errors import UsageError
from rb_lightning.stream.remote_prefetch import RemoteSampleQueue, drained

ray = pytest.importorskip("ray")
from rb_lightning.distributed.ray import (  # noqa: E402
    RayReplayBufferView,
    named_actor_config,
    release_semaphore_names,
)

pytestmark = pytest.mark.ray


def _owner(name: str, capacity: int, *, generations: bool = True, sampler=None) -> ReplayBuffer:
    owner = ReplayBuffer(
        storage=partial(LazyTensorStorage, capacity),
        sampler=sampler or partial(PrioritizedSampler, capacity, alpha=1.0, beta=0.5),
        writer=partial(RoundRobinWriter, track_generations=generations),
        service_backend="ray",
        service_backend_options={"remote_config": named_actor_config(name)},
    )
    release_semaphore_names(owner)  # an owner outside a DataModule, as a script's
    return owner


@pytest.fixture(scope="module")
def shared(cluster):
    """One prioritized buffer of 128 items (item i in slot i), for the tests that only read."""
    owner = _owner("prefetch_shared", 128)
    owner.extend(id_items(torch.arange(128)))
    yield "prefetch_shared", owner
    owner.close()


def test_queue_keeps_requests_in_flight_and_splits_each_reply(shared):
    owner = shared[1]
    queue = RemoteSampleQueue(owner, batch_size=16, requests_in_flight=3, batches_per_request=2)
    assert queue.batches_per_request == 2
    batches = [queue.next() for _ in range(3)]
    assert len(queue) == 2  # the third reply is read; two calls are still at the actor
    for batch, info in batches:
        assert batch.batch_size == torch.Size([16])
        assert torch.equal(batch["id"], info["index"])  # item i sits in slot i
        assert info["priority_weight"].shape == (16,)
    queue.drop()
    assert len(queue) == 0


def test_a_sampler_without_replacement_draws_one_batch_per_call(cluster):
    owner = _owner("prefetch_epoch", 64, sampler=SamplerWithoutReplacement)
    try:
        owner.extend(id_items(torch.arange(64)))
        queue = RemoteSampleQueue(owner, batch_size=16, requests_in_flight=2, batches_per_request=4)
        assert queue.batches_per_request == 1
        ids = torch.cat([queue.next()[0]["id"] for _ in range(4)])
        assert sorted(ids.tolist()) == list(range(64))  # one epoch: every item once
    finally:
        owner.close()


@pytest.mark.parametrize(("in_flight", "per_request"), [(1, 1), (4, 4)])
def test_datamodule_draws_from_a_view_with_requests_in_flight(shared, in_flight, per_request):
    view = RayReplayBufferView(
        shared[0], requests_in_flight=in_flight, batches_per_request=per_request
    )
    dm = ReplayBufferDataModule(view, batch_size=32, num_batches=5)
    batches = list(dm.train_dataloader())
    assert len(batches) == 5
    for batch in batches:
        assert torch.equal(batch["id"], batch["index"])
        assert batch["obs"].squeeze(-1).tolist() == batch["id"].float().tolist()
        assert batch.batch_size == torch.Size([32])
        assert {"priority_weight", "index_generation"} <= set(batch.keys())


class _Prioritize(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        error = self.layer(batch["obs"]).squeeze(-1)
        self.trainer.datamodule.update_priority(batch, error.abs().detach() + 1.0)
        return error.pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def test_the_end_of_fit_waits_for_the_updates_sent_during_it(shared):
    dm = ReplayBufferDataModule(RayReplayBufferView(shared[0]), batch_size=16, num_batches=3)
    quiet_trainer(max_epochs=1).fit(_Prioritize(), datamodule=dm)
    assert drained(dm.replay_buffer) == []  # nothing left unconfirmed after fit


def test_priority_update_for_a_rewritten_slot_is_dropped(cluster):
    owner = _owner("prefetch_stale", 8)
    try:
        owner.extend(id_items(torch.arange(8)))
        dm = ReplayBufferDataModule(owner, batch_size=64, num_batches=1)
        batch = next(iter(dm.train_dataloader()))
        assert set(batch["index"].tolist()) == set(range(8))
        # A collector rewrites slots 0-3 (with the max priority so far, 1.0) before the update.
        owner.extend(id_items(torch.arange(100, 104)))
        dm.update_priority(batch, torch.full((64,), 1000.0))
        dropped = drained(owner)
        rewritten = int((batch["index"] < 4).sum())
        assert dropped == [rewritten]
        # Only slots 4-7 got 1000: the rewritten ones keep 1.0 (applied: half the draws).
        ids = owner.sample(4000)["id"]
        assert int((ids >= 100).sum()) < 40
        assert set(ids.tolist()) <= {4, 5, 6, 7, 100, 101, 102, 103}
    finally:
        owner.close()


def test_without_generation_tracking_updates_apply_as_torchrl_applies_them(cluster):
    owner = _owner("prefetch_untracked", 8, generations=False)
    try:
        owner.extend(id_items(torch.arange(8)))
        dm = ReplayBufferDataModule(owner, batch_size=64, num_batches=1)
        batch = next(iter(dm.train_dataloader()))
        assert "index_generation" not in batch.keys()
        owner.extend(id_items(torch.arange(100, 104)))
        dm.update_priority(batch, torch.where(batch["index"] < 4, 1000.0, 1.0))
        assert drained(owner) == [0]
        ids = owner.sample(4000)["id"]
        assert int((ids >= 100).sum()) > 3900  # the new items got the old items' priority
    finally:
        owner.close()


def test_pipeline_options_must_be_positive_ints(cluster):
    # Checked before the actor is looked up: no buffer needed.
    with pytest.raises(UsageError, match="requests_in_flight"):
        RayReplayBufferView("prefetch_none", requests_in_flight=0, timeout=0.1)
    with pytest.raises(UsageError, match="batches_per_request"):
        RayReplayBufferView("prefetch_none", batches_per_request=-1, timeout=0.1)
