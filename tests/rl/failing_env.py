"""A CartPole that raises after a number of steps, for the asynchronous collector's error tests.

Reached from a collector's worker process by its gymnasium id
``tests.rl.failing_env:FailingCartPole-v0`` (gymnasium imports the module first).
"""

from __future__ import annotations

import gymnasium
from gymnasium.envs.classic_control import CartPoleEnv

FAIL_AFTER = 300


class FailingCartPole(CartPoleEnv):
    """CartPole whose ``FAIL_AFTER``-th step raises ``RuntimeError``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps >= FAIL_AFTER:
            raise RuntimeError("the cart left the track (a test environment's failure)")
        return super().step(action)


gymnasium.register("FailingCartPole-v0", entry_point=FailingCartPole, max_episode_steps=500)
