"""Two DDP ranks (gloo, CPU), each with an ``OnlineCollector`` filling its own buffer.

Run by tests/scale/test_scale_ddp_collectors.py: ``python ddp_collectors.py OUT_DIR sync|async|goal``.
Both ranks call ``seed_everything(0)``, as users do; each writes what its buffer holds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.rl import DQN, Evaluation, OnlineCollector, StopAtGoal

torch.set_num_threads(1)


class RankSignal(L.Callback):
    """Logs ``rank_signal`` = 1,000 x rank: a training signal at the goal on rank 1 only."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.log("rank_signal", 1000.0 * trainer.global_rank)


def main(out_dir: Path, mode: str) -> None:
    L.seed_everything(0)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2_000))
    collector = OnlineCollector(
        "CartPole-v1",
        env_kwargs={"categorical_action_encoding": True},
        init_random_frames=64,
        frames_per_step=4,
        asynchronous=mode == "async",
        start_method="fork" if mode == "async" else None,
    )
    callbacks: list = [collector]
    if mode == "goal":  # one rank triggers the greedy check: all ranks must stop together
        callbacks += [RankSignal(), StopAtGoal(5.0, monitor="rank_signal")]
    trainer = quiet_trainer(
        strategy="ddp", devices=2, max_steps=20, callbacks=callbacks,
        limit_train_batches=10, max_epochs=-1,
    )  # fmt: skip
    trainer.fit(
        DQN(
            observation_size=4,
            num_actions=2,
            eps_decay_steps=10,
            evaluation=Evaluation(num_episodes=2),
        ),
        datamodule=ReplayBufferDataModule(rb, batch_size=16, num_batches=None),
    )
    rows = rb[: len(rb)]
    result = {
        "rank": trainer.global_rank,
        "global_step": trainer.global_step,
        "observations": rows["observation"][:160].flatten().tolist(),
        "actions": rows["action"][:160].tolist(),
    }
    (out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
