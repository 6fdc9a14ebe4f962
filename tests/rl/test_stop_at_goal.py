"""``StopAtGoal``: a run stops at the goal only when the policy without exploration reaches it.

The rule a user reads into "goal reached": ``test`` will show it. A training return that
reaches the goal only triggers the greedy evaluation episodes; they decide.
"""

from __future__ import annotations

import pytest
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.rl import DQN, Evaluation, OnlineCollector, StopAtGoal

pytest.importorskip("gymnasium")


def _fit(goal: StopAtGoal, max_steps: int = 40):
    collector = OnlineCollector(
        "CartPole-v1", env_kwargs={"categorical_action_encoding": True},
        init_random_frames=64, frames_per_step=4, seed=0,
    )  # fmt: skip
    model = DQN(observation_size=4, num_actions=2, evaluation=Evaluation(num_episodes=3))
    trainer = quiet_trainer(
        max_steps=max_steps,
        limit_train_batches=10,
        max_epochs=-1,
        log_every_n_steps=1,
        callbacks=[collector, goal],
    )
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(1_000))
    trainer.fit(model, datamodule=ReplayBufferDataModule(rb, batch_size=16, num_batches=None))
    return trainer


def test_a_training_signal_at_the_goal_does_not_stop_an_untrained_greedy_policy():
    # The trigger is reached at every epoch end (frames >= 104), the greedy return of an
    # untrained CartPole policy (~10) is not 100: the run goes on to max_steps.
    goal = StopAtGoal(100.0, monitor="frames")
    trainer = _fit(goal)
    assert trainer.global_step == 40
    assert goal.evaluations == 4 and goal.last_return < 100
    assert goal.stop_reason is None


def test_the_run_stops_when_the_greedy_episodes_reach_the_goal():
    goal = StopAtGoal(5.0, monitor="frames")  # any CartPole episode lasts 8+ steps
    trainer = _fit(goal)
    assert trainer.global_step == 10 and goal.evaluations == 1
    assert goal.stop_reason.startswith("goal reached, greedy return ")
    assert "over 3 evaluation episodes" in goal.stop_reason
    assert trainer.callback_metrics["goal_return"] == pytest.approx(goal.last_return)
