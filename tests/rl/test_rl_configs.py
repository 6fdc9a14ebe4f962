"""Each shipped RL config runs end to end through the CLI for a few steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, PrioritizedSampler, RandomSampler

from rb_lightning.rl import DQN, SAC, OnlineCollector, StopAtGoal
from rb_lightning.runs.cli import main

pytest.importorskip("gymnasium")

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _run(config: str, tmp_path: Path, steps: int):
    return main(
        args=[
            "fit",
            "--config",
            str(CONFIGS / config),
            f"--trainer.max_steps={steps}",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ]
    )


def _collector(trainer) -> OnlineCollector:
    (collector,) = [cb for cb in trainer.callbacks if isinstance(cb, OnlineCollector)]
    return collector


def test_cartpole_dqn_config(tmp_path):
    cli = _run("cartpole_dqn.yaml", tmp_path, steps=5)
    trainer, rb = cli.trainer, cli.datamodule.replay_buffer
    assert isinstance(cli.model, DQN)
    assert isinstance(rb.storage, LazyTensorStorage)
    assert isinstance(rb.sampler, PrioritizedSampler)
    assert trainer.global_step == 5
    collector = _collector(trainer)
    assert collector.frames >= collector.init_random_frames
    # A 1,000-item buffer, like the template's: the warm-up alone fills it.
    assert len(rb) == min(collector.frames, rb.storage.max_size) == 1000
    assert trainer.progress_bar_metrics["episode_return"] == pytest.approx(collector.mean_return)
    # The default run stops itself once the greedy policy reaches the goal.
    (stopper,) = [cb for cb in trainer.callbacks if isinstance(cb, StopAtGoal)]
    assert (stopper.monitor, stopper.threshold) == ("episode_return", 475.0)


def test_pendulum_sac_config(tmp_path):
    cli = _run("pendulum_sac.yaml", tmp_path, steps=8)
    trainer, rb = cli.trainer, cli.datamodule.replay_buffer
    assert isinstance(cli.model, SAC)
    assert isinstance(rb.storage, LazyMemmapStorage)
    assert isinstance(rb.sampler, RandomSampler)
    assert trainer.global_step == 8
    collector = _collector(trainer)
    # One frame per step, collected 8 at a time after every 8th step.
    assert len(rb) == collector.frames == collector.init_random_frames + 8
    assert "episode_return" in trainer.progress_bar_metrics
    assert rb[:]["action"].abs().max() <= 2.0
