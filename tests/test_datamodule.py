"""ReplayBufferDataModule inside a real lightning.Trainer."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from rb_testdata import make_transitions
from tensordict import TensorDictBase
from torchrl.data import (
    LazyTensorStorage,
    ListStorage,
    PrioritizedSampler,
    ReplayBuffer,
)
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.errors import UsageError


class Recorder(L.LightningModule):
    """A tiny regressor that records what reaches each step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.seen_ids: list[list[int]] = []
        self.batch_types: set[type] = set()
        self.val_ids: list[int] = []

    def training_step(self, batch, batch_idx):
        self.batch_types.add(type(batch))
        self.seen_ids.append(batch["id"].tolist())
        loss = torch.nn.functional.mse_loss(self.net(batch["obs"]), batch["next", "reward"])
        self.log("loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.val_ids.extend(batch["id"].tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def trainer(**kwargs) -> L.Trainer:
    return quiet_trainer(**kwargs)


def test_fit_just_works_with_defaults(tensor_rb):
    model = Recorder()
    dm = ReplayBufferDataModule(tensor_rb, batch_size=64)
    trainer(max_epochs=2).fit(model, datamodule=dm)
    # "auto": an epoch is one buffer's worth, ceil(200 / 64) = 4 batches.
    assert len(model.seen_ids) == 8
    assert model.batch_types and all(issubclass(t, TensorDictBase) for t in model.batch_types)


def test_unbounded_stream_without_trainer_bound_raises(tensor_rb):
    dm = ReplayBufferDataModule(tensor_rb, batch_size=8, num_batches=None)
    with pytest.raises(ValueError, match=r"limit_train_batches=<int>.*max_steps"):
        trainer(max_epochs=1).fit(Recorder(), datamodule=dm)


def test_unbounded_stream_bounded_by_limit_train_batches(tensor_rb):
    model = Recorder()
    dm = ReplayBufferDataModule(tensor_rb, batch_size=8, num_batches=None)
    t = trainer(max_epochs=3, limit_train_batches=5)
    t.fit(model, datamodule=dm)
    assert len(model.seen_ids) == 15 and t.num_training_batches == 5


def test_unbounded_stream_bounded_by_max_steps(tensor_rb):
    model = Recorder()
    dm = ReplayBufferDataModule(tensor_rb, batch_size=8, num_batches=None)
    t = trainer(max_steps=7)
    t.fit(model, datamodule=dm)
    assert t.global_step == 7 and len(model.seen_ids) == 7


def test_int_num_batches_sets_epoch_length(tensor_rb):
    model = Recorder()
    t = trainer(max_epochs=2)
    t.fit(model, datamodule=ReplayBufferDataModule(tensor_rb, batch_size=8, num_batches=3))
    assert len(model.seen_ids) == 6 and t.num_training_batches == 3


def test_transfer_batch_to_device_hook_is_used(tensor_rb):
    calls: list[tuple[type, str]] = []

    class Watched(ReplayBufferDataModule):
        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            moved = super().transfer_batch_to_device(batch, device, dataloader_idx)
            calls.append((type(moved), str(device)))
            return moved

        def on_after_batch_transfer(self, batch, dataloader_idx):
            batch["obs"] = batch["obs"] * 0  # overridable, and it reaches the step
            return batch

    seen_obs = []

    class ObsWatcher(Recorder):
        def training_step(self, batch, batch_idx):
            seen_obs.append(batch["obs"].abs().sum().item())
            return super().training_step(batch, batch_idx)

    model = ObsWatcher()
    trainer(max_steps=2).fit(model, datamodule=Watched(tensor_rb, batch_size=8, num_batches=2))
    assert len(calls) == 2 and all(issubclass(t, TensorDictBase) and d == "cpu" for t, d in calls)
    assert seen_obs == [0.0, 0.0]


def test_val_buffer_is_read_once_in_order(tensor_rb):
    val_rb = ReplayBuffer(storage=LazyTensorStorage(100))
    val_rb.extend(make_transitions(30, start=1000))
    model = Recorder()
    dm = ReplayBufferDataModule(tensor_rb, batch_size=8, num_batches=2, val_buffer=val_rb)
    trainer(max_epochs=1, num_sanity_val_steps=0).fit(model, datamodule=dm)
    assert model.val_ids == list(range(1000, 1030))


def test_no_val_loop_without_val_buffer(tensor_rb):
    dm = ReplayBufferDataModule(tensor_rb, batch_size=8)
    assert "val_dataloader" not in vars(dm)  # Lightning runs no validation loop


def test_priority_updates_from_training_step():
    rb = ReplayBuffer(storage=LazyTensorStorage(256), sampler=PrioritizedSampler(256, 1.0, 0.4))
    rb.extend(make_transitions(256))

    class Prioritizing(Recorder):
        def training_step(self, batch, batch_idx):
            assert "priority_weight" in batch.keys()
            # Items with id 5 get a huge priority; all others a tiny one.
            priority = torch.where(batch["id"] == 5, 1e6, 1e-6)
            self.trainer.datamodule.update_priority(batch, priority)
            return super().training_step(batch, batch_idx)

    model = Prioritizing()
    dm = ReplayBufferDataModule(rb, batch_size=256, num_batches=6)
    trainer(max_epochs=1).fit(model, datamodule=dm)
    last = torch.tensor(model.seen_ids[-1])
    assert (last == 5).float().mean() > 0.9


def test_update_priority_without_index_explains():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    rb.extend(make_transitions(10))
    dm = ReplayBufferDataModule(rb, batch_size=4)
    with pytest.raises(KeyError, match="PrioritizedSampler"):
        dm.update_priority(rb.sample(4), torch.ones(4))


def test_empty_buffer_with_auto_epoch_explains():
    dm = ReplayBufferDataModule(ReplayBuffer(storage=LazyTensorStorage(10)), batch_size=4)
    with pytest.raises(RuntimeError, match="buffer is empty.*num_batches=None"):
        trainer(max_epochs=1).fit(Recorder(), datamodule=dm)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"replay_buffer": {"not": "a buffer"}}, TypeError, "replay_buffer must be a torchrl"),
        ({"batch_size": 0}, ValueError, "batch_size must be a positive integer"),
        ({"batch_size": "8"}, ValueError, "batch_size must be a positive integer"),
        ({"num_batches": 0}, ValueError, "num_batches must be a positive integer"),
        ({"num_batches": "forever"}, ValueError, "num_batches must be a positive integer"),
        ({"num_workers": -1}, ValueError, "num_workers must be a non-negative integer"),
        ({"persistent_workers": True}, ValueError, "persistent_workers=True needs num_workers"),
        ({"val_buffer": [1]}, TypeError, "val_buffer must be a torchrl"),
        ({"keys": "obs"}, TypeError, "keys must be a list"),
    ],
)
def test_bad_arguments_fail_at_construction(tensor_rb, kwargs, error, match):
    args = {"replay_buffer": tensor_rb, "batch_size": 8, **kwargs}
    rb = args.pop("replay_buffer")
    with pytest.raises(error, match=match):
        ReplayBufferDataModule(rb, **args)


def test_workers_with_prioritized_sampler_rejected():
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=PrioritizedSampler(10, 0.6, 0.4))
    with pytest.raises(ValueError, match="PrioritizedSampler.*num_workers=0"):
        ReplayBufferDataModule(rb, num_workers=2)


def test_workers_with_list_storage_under_spawn_rejected():
    with pytest.raises(ValueError, match="ListStorage.*LazyTensorStorage"):
        ReplayBufferDataModule(ReplayBuffer(storage=ListStorage(10)), num_workers=2)


def test_repr_is_readable(tensor_rb):
    text = repr(ReplayBufferDataModule(tensor_rb, batch_size=32))
    assert "LazyTensorStorage" in text and "batch_size=32" in text and "len=200" in text


def test_unknown_keys_fail_at_setup(tensor_rb):
    dm = ReplayBufferDataModule(tensor_rb, batch_size=8, keys=["obs", ("next", "rewrd")])
    with pytest.raises(ValueError, match=r"\('next', 'rewrd'\)\] not found in the replay buffer"):
        dm.setup("fit")
    ReplayBufferDataModule(tensor_rb, batch_size=8, keys=["obs", "index"]).setup("fit")


def test_unbounded_stream_error_comes_at_setup(tensor_rb):
    dm = ReplayBufferDataModule(tensor_rb, batch_size=8, num_batches=None)
    dm.trainer = trainer(max_epochs=1)
    with pytest.raises(ValueError, match="unbounded stream"):
        dm.setup("fit")


def test_workers_make_a_tensor_storage_buffer_shared_and_say_so(caplog):
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    rb.extend(make_transitions(10))
    with caplog.at_level("INFO", logger="rb_lightning.buffers.handles"):
        ReplayBufferDataModule(rb, batch_size=4, num_batches=None, num_workers=0).setup("fit")
    assert not rb.shared and "rb.share()" not in caplog.text

    with caplog.at_level("INFO", logger="rb_lightning.buffers.handles"):
        dm = ReplayBufferDataModule(rb, batch_size=4, num_batches=None, num_workers=2)
        assert not rb.shared  # building the DataModule changes nothing: setup does
        dm.setup("fit")
    assert rb.shared
    assert "num_workers=2) called rb.share()" in caplog.text


@pytest.mark.parametrize("bad", [0, -1.5, "10", True, None])
def test_a_bad_wait_timeout_fails_at_construction(bad):
    # Before, the DataModule stored it unchecked and it failed once train_dataloader ran.
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    with pytest.raises(
        UsageError, match="wait_timeout must be a positive number of seconds"
    ) as err:
        ReplayBufferDataModule(rb, batch_size=2, wait_timeout=bad)
    assert err.value.argument == "wait_timeout"
