"""OnlineCollector + DQN on a real CartPole through a real Trainer and real buffers."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torchrl.data import (
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    TensorDictReplayBuffer,
)
from torchrl.envs import GymEnv
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.rl import DQN, OnlineCollector

pytest.importorskip("gymnasium")

CARTPOLE = {"categorical_action_encoding": True}


def _trainer(max_steps: int, *callbacks: L.Callback) -> L.Trainer:
    return quiet_trainer(
        max_steps=max_steps,
        callbacks=list(callbacks),
    )


def _buffer(prioritized: bool = False) -> TensorDictReplayBuffer:
    sampler = PrioritizedSampler(2_000, alpha=0.6, beta=0.4) if prioritized else RandomSampler()
    return TensorDictReplayBuffer(storage=LazyTensorStorage(2_000), sampler=sampler)


class RecordingDQN(DQN):
    """DQN that records the buffer length each training step sees."""

    def __init__(self, replay_buffer: TensorDictReplayBuffer, **kwargs) -> None:
        super().__init__(observation_size=4, num_actions=2, hidden_sizes=[16], **kwargs)
        self._rb = replay_buffer
        self.seen_sizes: list[int] = []

    def training_step(self, batch, batch_idx):
        self.seen_sizes.append(len(self._rb))
        return super().training_step(batch, batch_idx)


def _fit(model, rb, collector, steps: int, batch_size: int = 16) -> L.Trainer:
    trainer = _trainer(steps, collector)
    dm = ReplayBufferDataModule(rb, batch_size=batch_size, num_batches=None)
    trainer.fit(model, datamodule=dm)
    return trainer


def test_warm_up_before_first_step_then_frames_per_step_each_step():
    rb = _buffer()
    model = RecordingDQN(rb)
    collector = OnlineCollector(
        "CartPole-v1", env_kwargs=CARTPOLE, init_random_frames=50, frames_per_step=3, seed=0
    )
    _fit(model, rb, collector, steps=6)
    assert model.seen_sizes == [50 + 3 * i for i in range(6)]
    assert collector.frames == len(rb) == 50 + 3 * 6
    assert collector.episodes >= 1  # random CartPole episodes last ~20 frames


def test_every_n_steps_sets_the_collection_ratio():
    rb = _buffer()
    model = RecordingDQN(rb)
    collector = OnlineCollector(
        "CartPole-v1",
        env_kwargs=CARTPOLE,
        init_random_frames=20,
        frames_per_step=4,
        every_n_steps=2,
        seed=0,
    )
    _fit(model, rb, collector, steps=6)
    # global_step is counted after the optimizer step: 4 frames after steps 2, 4 and 6.
    assert model.seen_sizes == [20, 20, 24, 24, 28, 28]
    assert len(rb) == 32


def test_priorities_follow_td_error():
    rb = _buffer(prioritized=True)
    collector = OnlineCollector(
        "CartPole-v1", env_kwargs=CARTPOLE, init_random_frames=200, frames_per_step=1, seed=0
    )
    warm_up = torch.arange(200)
    seen: dict[str, torch.Tensor] = {}
    sampled: list[torch.Tensor] = []

    def priorities() -> torch.Tensor:
        # The sampler's sum tree holds each item's priority (|TD error| + eps) ** alpha.
        return torch.as_tensor(rb.sampler._sum_tree[warm_up])

    class Watch(L.Callback):
        def on_train_start(self, trainer, pl_module):
            seen["before"] = priorities()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            sampled.append(batch["index"])

    trainer = _trainer(6, collector, Watch())
    model = DQN(observation_size=4, num_actions=2, hidden_sizes=[16])
    trainer.fit(model, datamodule=ReplayBufferDataModule(rb, batch_size=16, num_batches=None))
    before, after = seen["before"], priorities()
    assert torch.all(before == before[0])  # the warm-up entered at one priority
    was_sampled = torch.zeros(200, dtype=torch.bool)
    was_sampled[torch.cat(sampled)[torch.cat(sampled) < 200]] = True
    changed = ~torch.isclose(after, before)
    assert changed.any()
    # Only items that were in a batch got a new priority; the rest kept theirs.
    assert not (changed & ~was_sampled).any()
    # Six batches of 16 touch well over 16 distinct items.
    assert changed.sum() >= 16


def test_collector_acts_with_the_modules_current_weights():
    rb = _buffer()
    model = DQN(observation_size=4, num_actions=2, hidden_sizes=[16])
    initial = [p.detach().clone() for p in model.q_net.parameters()]
    collector = OnlineCollector(
        "CartPole-v1", env_kwargs=CARTPOLE, init_random_frames=32, frames_per_step=1, seed=0
    )
    trainer = _trainer(5, collector)
    weights_at_step_end: list[bool] = []

    class Check(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            used = list(collector.collector.policy.parameters())
            weights_at_step_end.append(
                all(
                    torch.equal(u, p)
                    for u, p in zip(used, pl_module.q_net.parameters(), strict=True)
                )
            )

    trainer.callbacks.append(Check())
    trainer.fit(model, datamodule=ReplayBufferDataModule(rb, batch_size=16, num_batches=None))
    assert weights_at_step_end == [True] * 5
    assert not all(
        torch.equal(a, b) for a, b in zip(initial, model.q_net.parameters(), strict=True)
    )


def test_episode_return_reaches_the_progress_bar():
    rb = _buffer()
    collector = OnlineCollector(
        "CartPole-v1", env_kwargs=CARTPOLE, init_random_frames=100, frames_per_step=1, seed=0
    )
    trainer = _fit(DQN(observation_size=4, num_actions=2, hidden_sizes=[16]), rb, collector, 3)
    assert trainer.progress_bar_metrics["episode_return"] == pytest.approx(collector.mean_return)
    assert 5 < collector.mean_return < 100  # random play on CartPole


class ReturnLogRecordingDQN(DQN):
    """DQN that records the steps at which ``episode_return`` is logged."""

    def __init__(self) -> None:
        super().__init__(observation_size=4, num_actions=2, hidden_sizes=[16])
        self.return_logged_at: list[int] = []

    def log(self, name, value, *args, **kwargs):
        if name == "episode_return":
            self.return_logged_at.append(self.trainer.global_step)
        return super().log(name, value, *args, **kwargs)


def test_the_return_is_logged_where_lightning_reads_it_not_at_every_episode_end():
    # A log call costs about as much as a training step of a small network: one per ended
    # episode was 93 calls, 0.08 s, of benchmarks/async_overlap.py's 1,500 steps.
    class EpochEnds(L.Callback):
        def __init__(self) -> None:
            self.seen: list[tuple[float, float]] = []

        def on_train_epoch_end(self, trainer, pl_module):
            self.seen.append(
                (trainer.callback_metrics["episode_return"].item(), collector.mean_return)
            )

    rb = _buffer()
    collector = OnlineCollector(
        "CartPole-v1", env_kwargs=CARTPOLE, init_random_frames=100, frames_per_step=8, seed=0
    )
    model, epoch_ends = ReturnLogRecordingDQN(), EpochEnds()
    trainer = quiet_trainer(
        max_steps=45, limit_train_batches=10, log_every_n_steps=20,
        callbacks=[collector, epoch_ends],
    )  # fmt: skip
    trainer.fit(model, datamodule=ReplayBufferDataModule(rb, batch_size=16, num_batches=None))
    # log_every_n_steps (20, 40), the ends of the 10-step epochs (10, 20, 30, 40), the last step
    assert model.return_logged_at == [10, 20, 30, 40, 45]
    assert collector.episodes >= 10, "more episodes ended than the return was logged"
    # What EarlyStopping reads at the end of each epoch is the return at that moment.
    assert len(epoch_ends.seen) == 5  # the fit ends a fifth, 5-step epoch
    for logged, current in epoch_ends.seen:
        assert logged == pytest.approx(current)
    assert trainer.progress_bar_metrics["episode_return"] == pytest.approx(collector.mean_return)


def test_seeded_collection_is_reproducible():
    def run() -> torch.Tensor:
        L.seed_everything(3)
        rb = _buffer()
        collector = OnlineCollector("CartPole-v1", env_kwargs=CARTPOLE, init_random_frames=40)
        _fit(DQN(observation_size=4, num_actions=2, hidden_sizes=[16]), rb, collector, 4)
        return rb[:][("next", "observation")]

    assert torch.equal(run(), run())


# -- errors ---------------------------------------------------------------------------------
def test_one_hot_env_with_integer_policy_is_refused_with_the_fix():
    collector = OnlineCollector("CartPole-v1", init_random_frames=8, seed=0)
    with pytest.raises(ValueError, match="categorical_action_encoding"):
        _fit(DQN(observation_size=4, num_actions=2, hidden_sizes=[8]), _buffer(), collector, 1)


def test_module_without_collection_policy_is_refused():
    class Plain(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            return self.net(batch["observation"]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    collector = OnlineCollector("CartPole-v1", env_kwargs=CARTPOLE, init_random_frames=8)
    with pytest.raises(TypeError, match="collection_policy"):
        _fit(Plain(), _buffer(), collector, 1)


def test_no_buffer_to_fill_is_refused_at_setup():
    class Data(L.LightningDataModule):
        def train_dataloader(self):
            return torch.utils.data.DataLoader([0])

    trainer = _trainer(1, OnlineCollector("CartPole-v1", env_kwargs=CARTPOLE))
    with pytest.raises(ValueError, match="replay_buffer"):
        trainer.fit(DQN(observation_size=4, num_actions=2), datamodule=Data())


def test_dataloader_workers_are_refused_at_setup():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
    dm = ReplayBufferDataModule(rb, batch_size=4, num_batches=None, num_workers=1)
    trainer = _trainer(1, OnlineCollector("CartPole-v1", env_kwargs=CARTPOLE))
    with pytest.raises(ValueError, match="never see a collected frame"):
        trainer.fit(DQN(observation_size=4, num_actions=2), datamodule=dm)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"frames_per_step": 0}, "frames_per_step"),
        ({"every_n_steps": -1}, "every_n_steps"),
        ({"init_random_frames": -5}, "init_random_frames"),
        ({"env": 3}, "gymnasium id"),
        ({"env": GymEnv("CartPole-v1"), "env_kwargs": {"a": 1}}, "env_kwargs"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, match):
    kwargs = {"env": "CartPole-v1", **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        OnlineCollector(**kwargs)
