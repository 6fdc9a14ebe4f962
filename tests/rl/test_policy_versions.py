"""Policy versions: every collected frame says which optimizer step's weights acted, and
torchrl's StalenessAwareSampler, as the buffer's sampler, only draws fresh enough frames."""

from __future__ import annotations

import lightning as L
import torch
from torchrl.data import LazyTensorStorage, StalenessAwareSampler, TensorDictReplayBuffer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.rl import DQN, OnlineCollector

MAX_STALENESS = 10


class Staleness(L.Callback):
    """Records, per step, the oldest policy version in the batch and the learner's version."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        sampler = trainer.datamodule.replay_buffer.sampler
        oldest = int(batch["policy_version"].min())
        self.rows.append((trainer.global_step, oldest, sampler.consumer_version))


def test_frames_carry_their_policy_version_and_stale_ones_are_not_drawn():
    torch.manual_seed(0)
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(5_000), sampler=StalenessAwareSampler(max_staleness=MAX_STALENESS)
    )
    collector = OnlineCollector(
        "CartPole-v1",
        env_kwargs={"categorical_action_encoding": True},
        init_random_frames=64,
        frames_per_step=4,
        seed=0,
    )
    staleness = Staleness()
    trainer = L.Trainer(
        max_steps=60,
        callbacks=[collector, staleness],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    datamodule = ReplayBufferDataModule(rb, batch_size=16, num_batches=None)
    trainer.fit(DQN(observation_size=4, num_actions=2), datamodule=datamodule)

    versions = rb[:]["policy_version"]
    assert (versions[:64] == 0).all()  # the warm-up, before any update
    # then 4 frames after every step, acted by that step's weights
    assert versions[64:].tolist() == [step for step in range(1, 61) for _ in range(4)]
    for step, oldest, consumer in staleness.rows:
        # Lightning reads one batch ahead: when step s starts, the batch of step s + 1 was
        # just drawn with the learner's version s, and the batch of step s at version s - 1.
        assert consumer == step
        assert max(step - 1, 0) - oldest <= MAX_STALENESS
    assert any(oldest > 0 for _, oldest, _ in staleness.rows[-10:])  # the warm-up aged out
