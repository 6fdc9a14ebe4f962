"""A second CartPole anchor: Stable-Baselines3's ``DQN`` with rl-baselines3-zoo's tuned hyperparameters.

The zoo's ``hyperparams/dqn.yml`` for CartPole-v1: ``MlpPolicy`` with two layers of 256,
learning rate 2.3e-3, batch 64, a 100k buffer, 1,000 random frames first, gamma 0.99,
the target copied every 10 steps, 128 gradient steps after every 256 frames,
epsilon 1 -> 0.04 over the first 16% of the zoo's 50k frames.

Stopping is kinder to it than our rule (the mean of the last 10 *training* episodes,
exploration on): every 2,000 frames it plays 10 greedy evaluation episodes and stops when
their mean reaches 475 (SB3's ``EvalCallback`` + ``StopTrainingOnRewardThreshold``).

Prints the summary lines ``benchmarks/time_to_goal.py`` reads. Needs
``pip install stable-baselines3`` (not a dependency of rb_lightning)::

    python benchmarks/sb3_anchor.py --seed 0
"""

from __future__ import annotations

import argparse
import time

import gymnasium
import torch
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold

GOAL = 475.0
ZOO_FRAMES = 50_000  # the zoo's n_timesteps: the exploration schedule is a fraction of it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=200_000, help="frames cap")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as every side of time_to_goal.py
    start = time.perf_counter()
    model = DQN(
        "MlpPolicy",
        gymnasium.make("CartPole-v1"),
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1_000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=0.16 * ZOO_FRAMES / args.max_steps,
        exploration_final_eps=0.04,
        policy_kwargs={"net_arch": [256, 256]},
        seed=args.seed,
        device="cpu",
        verbose=0,
    )
    stop = StopTrainingOnRewardThreshold(reward_threshold=GOAL, verbose=0)
    evaluation = EvalCallback(
        gymnasium.make("CartPole-v1"),
        callback_on_new_best=stop,
        eval_freq=2_000,
        n_eval_episodes=10,
        deterministic=True,
        verbose=0,
    )
    model.learn(total_timesteps=args.max_steps, callback=evaluation)
    seconds = time.perf_counter() - start
    best = float(evaluation.best_mean_reward)
    reached = best >= GOAL
    reason = (
        f"goal reached, episode_return {best:.2f} >= {GOAL}"
        if reached
        else f"max_steps={args.max_steps:,} reached"
    )
    # 128 gradient steps after every 256 frames past the first 1,000.
    steps = max(0, model.num_timesteps - 1_000) // 256 * 128
    print(f"fit stopped at step {steps:,} after {seconds:.1f} s: {reason}")
    print(f"  episode_return {best:.2f} | frames {model.num_timesteps:,}")


if __name__ == "__main__":
    main()
