"""DQN's TD loss (``td_loss``), through a real Trainer on a real buffer, and from the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, RandomSampler, TensorDictReplayBuffer
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.rl import DQN

REPO = Path(__file__).resolve().parents[2]
REWARD = 3.0


def _terminal_transitions(n: int = 32) -> TensorDictReplayBuffer:
    """Every item ends its episode with reward 3: the TD target is 3 whatever the network."""
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(n), sampler=RandomSampler())
    rb.extend(
        TensorDict(
            {
                "observation": torch.randn(n, 4),
                "action": torch.randint(0, 2, (n,)),
                ("next", "observation"): torch.randn(n, 4),
                ("next", "reward"): torch.full((n, 1), REWARD),
                ("next", "terminated"): torch.ones(n, 1, dtype=torch.bool),
            },
            batch_size=[n],
        )
    )
    return rb


def _first_step_loss(td_loss: str) -> float:
    model = DQN(observation_size=4, num_actions=2, hidden_sizes=[8], td_loss=td_loss)
    # A zero output layer: every Q-value is 0, so each item's TD error is exactly -3.
    output_layer = model.q_net[-1]
    torch.nn.init.zeros_(output_layer.weight)
    torch.nn.init.zeros_(output_layer.bias)
    trainer = quiet_trainer(max_steps=1, log_every_n_steps=1)
    datamodule = ReplayBufferDataModule(_terminal_transitions(), batch_size=8, num_batches=None)
    trainer.fit(model, datamodule=datamodule)
    return float(trainer.callback_metrics["loss"])


@pytest.mark.parametrize(("td_loss", "expected"), [("mse", REWARD**2), ("huber", REWARD - 0.5)])
def test_td_loss_is_the_named_loss_of_the_td_error(td_loss, expected):
    assert _first_step_loss(td_loss) == pytest.approx(expected)


def test_unknown_td_loss_is_refused_in_python():
    with pytest.raises(ValueError, match=r"td_loss must be one of \['huber', 'mse'\]"):
        DQN(observation_size=4, num_actions=2, td_loss="l1")  # type: ignore[arg-type]


def test_unknown_td_loss_from_the_cli_names_the_argument(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "RB_LIGHTNING_DEBUG"}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "fit",
            "--config",
            str(REPO / "configs" / "cartpole_dqn.yaml"),
            "--model.init_args.td_loss=l1",
        ],
        cwd=tmp_path,
        env=env,  # the debug switch would print the traceback this test rules out
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: config error at model.init_args.td_loss:"), done.stderr
    assert "'huber', 'mse'" in last_line, done.stderr
