"""BufferMixture through ReplayBufferDataModule: flat batches, exact fractions, weights, priorities."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from mixture_helpers import ONLINE_ID0, items, make_mixture, member
from trainers import quiet_trainer

from rb_lightning import BufferMixture, BufferStream, ReplayBufferDataModule, UsageError


class Record(L.LightningModule):
    """Keeps each batch's shape, sources and ids; optionally updates priorities."""

    def __init__(self, priority: float | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.priority = priority
        self.batches: list[tuple[torch.Size, list[int], list[int]]] = []

    def training_step(self, batch, batch_idx):
        self.batches.append((batch.batch_size, batch["source"].tolist(), batch["id"].tolist()))
        if self.priority is not None:
            self.trainer.datamodule.update_priority(batch, torch.full((len(batch),), self.priority))
        return self.net(batch["obs"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("fractions", [(0.5, 0.5), (0.25, 0.75)])
def test_fit_gets_flat_batches_with_exact_fractions_and_source_ids(fractions):
    mix = make_mixture(fractions=dict(zip(["offline", "online"], fractions, strict=True)))
    dm = ReplayBufferDataModule(mix, batch_size=16, num_batches=None)
    model = Record()
    quiet_trainer(max_steps=5).fit(model, datamodule=dm)
    assert dm.source_names == ["offline", "online"]
    assert len(model.batches) == 5
    for shape, sources, ids in model.batches:
        assert shape == torch.Size([16])
        assert sources.count(0) == 16 * fractions[0] and sources.count(1) == 16 * fractions[1]
        # Each item's source id names the member it came from.
        assert all((i >= ONLINE_ID0) == (s == 1) for s, i in zip(sources, ids, strict=True))


def test_weights_draw_each_item_s_member_at_random():
    mix = make_mixture(weights={"offline": 1.0, "online": 3.0})
    batch = BufferStream(mix, batch_size=4000).sample()
    assert batch.batch_size == torch.Size([4000])
    share = batch["source"].float().mean().item()
    assert 0.72 < share < 0.78
    assert set(batch.keys()) == {
        "id", "obs", "index", "source", "priority_weight", "index_generation"
    }  # fmt: skip
    # Items of the uniform member weigh 1; the prioritized member's carry its weights.
    assert (batch["priority_weight"][batch["source"] == 0] == 1).all()


def test_auto_epoch_is_one_pass_over_all_members():
    mix = make_mixture(offline=60, online=40)
    dm = ReplayBufferDataModule(mix, batch_size=10)
    model = Record()
    quiet_trainer(max_epochs=1).fit(model, datamodule=dm)
    assert len(model.batches) == 10  # ceil((60 + 40) / 10)


def test_update_priority_changes_only_the_member_of_the_items():
    on_a, on_b = member(True), member(True)
    on_a.extend(items(50, 0))
    on_b.extend(items(50, ONLINE_ID0))
    off = member(False)
    off.extend(items(50, 500))
    mix = BufferMixture({"a": on_a, "b": on_b, "off": off})
    dm = ReplayBufferDataModule(mix, batch_size=12)
    batch = BufferStream(mix, batch_size=12).sample()
    before_a = on_a.sampler._sum_tree[torch.arange(50)].clone()
    before_b = on_b.sampler._sum_tree[torch.arange(50)].clone()
    only_a = batch[batch["source"] == 0]
    dm.update_priority(only_a, torch.full((len(only_a),), 5.0))
    after_a = on_a.sampler._sum_tree[torch.arange(50)]
    assert not torch.equal(after_a, before_a)
    assert torch.equal(on_b.sampler._sum_tree[torch.arange(50)], before_b)
    # A whole batch, uniform member's items included, updates both prioritized members.
    dm.update_priority(batch, torch.full((12,), 2.0))
    assert not torch.equal(on_b.sampler._sum_tree[torch.arange(50)], before_b)


def test_training_step_updates_priorities_of_the_mixture():
    mix = make_mixture()
    online = mix.member("online")
    before = online.sampler._sum_tree[torch.arange(40)].clone()
    quiet_trainer(max_steps=3).fit(
        Record(priority=7.0), datamodule=ReplayBufferDataModule(mix, batch_size=8)
    )
    assert not torch.equal(online.sampler._sum_tree[torch.arange(40)], before)


def test_fractions_that_do_not_split_the_batch_say_so():
    mix = make_mixture(fractions={"offline": 1 / 3, "online": 2 / 3})
    with pytest.raises(ValueError, match="not whole numbers.*batch_size=3"):
        mix.sample(16)
    assert mix.sample(15)["source"].tolist().count(1) == 10


def test_workers_with_a_mixture_name_the_argument():
    with pytest.raises(UsageError, match="num_workers=0") as err:
        ReplayBufferDataModule(make_mixture(), batch_size=8, num_workers=1)
    assert err.value.argument == "num_workers"


def test_a_plain_torchrl_ensemble_points_to_buffer_mixture():
    from torchrl.data import ReplayBufferEnsemble

    mix = make_mixture()
    ensemble = ReplayBufferEnsemble(mix.member("offline"), mix.member("online"))
    with pytest.raises(UsageError, match="BufferMixture") as err:
        ReplayBufferDataModule(ensemble, batch_size=8)
    assert err.value.argument == "replay_buffer"


def test_composition_names_must_be_members():
    with pytest.raises(ValueError, match="not members"):
        make_mixture(fractions={"offline": 0.5, "replay": 0.5})
