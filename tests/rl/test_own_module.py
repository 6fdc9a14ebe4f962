"""A user's own module, written as docs/online-rl.md shows, under both kinds of collection.

The module is the page's own (its ``MyQLearner`` block, run up to the loop that trains it).
What the page promises: the run works, every step starts from the weights its optimizer
produced (``invariants.OptimizerOnlyMoves``), and every frame carries the version of the
weights that acted.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from invariants import OptimizerOnlyMoves
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.rl import OnlineCollector

pytest.importorskip("gymnasium")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "online-rl.md"


def _module_class():
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "class MyQLearner" in b]
    namespace: dict = {}
    exec(block.split("\nfor asynchronous in")[0], namespace)  # the definitions, not the runs
    return namespace["MyQLearner"]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_the_pages_module_learns_only_by_its_optimizer(asynchronous):
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(5_000))
    collector = OnlineCollector(
        "CartPole-v1", env_kwargs={"categorical_action_encoding": True}, seed=0,
        init_random_frames=200, frames_per_step=8, asynchronous=asynchronous,
        start_method="fork" if asynchronous else None,
    )  # fmt: skip
    moves = OptimizerOnlyMoves()
    trainer = quiet_trainer(max_steps=400, callbacks=[collector, moves])
    trainer.fit(
        _module_class()(), datamodule=ReplayBufferDataModule(rb, batch_size=32, num_batches=None)
    )
    assert moves.steps_checked == 399 and moves.moved_at == []
    versions = rb[: len(rb)]["policy_version"]
    # Frames are written in the order they were collected, each with the version that acted.
    assert int(versions.max()) > 0
    assert torch.all(versions[1:] >= versions[:-1])
