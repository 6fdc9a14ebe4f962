"""Reference agents for ``benchmarks/time_to_goal.py``: what our configs are timed against.

Two small, self-contained implementations, written for this benchmark:

``dqn``
    A DQN on gymnasium ``CartPole-v1`` with the structure and hyperparameters of
    Lightning's domain template ``examples/pytorch/domain_templates/reinforce_learn_Qnet.py``
    (Lightning-AI/pytorch-lightning), on gymnasium's API instead of old gym: a
    ``LightningModule`` with a one-hidden-layer MLP of 128 units, a ``deque`` replay
    buffer of 1,000 transitions, an ``IterableDataset`` that samples 200 transitions
    from it per pass and a ``DataLoader`` batching them by 16 (the template's
    ``RLDataset``), one environment frame per training step (the agent steps the
    environment inside ``training_step``), Adam lr 1e-2, the target network copied
    every 10 steps, epsilon-greedy from 1.0 to 0.01 linearly over the first 1,000
    steps, 1,000 random warm-start frames, gamma 0.99, MSE loss.
    Differences from the template: bootstrapping is cut on ``terminated`` only, not on
    the 500-step time limit, which old gym's single ``done`` could not tell apart
    (``--old-gym-done`` cuts it on both, as the template on old gym does: slower to the
    goal), and the buffer stacks numpy arrays when sampling instead of building tensors
    from lists.

``sac``
    A soft actor-critic on gymnasium ``Pendulum-v1`` in plain PyTorch, CleanRL-style
    (one file, one loop), with the SAC paper's hyperparameters (Haarnoja et al. 2018,
    v2 with automatic entropy tuning): two Q networks and an actor of 256-256 ReLU MLPs,
    a tanh-squashed Gaussian policy, Adam lr 3e-4 for actor, critics and temperature,
    target entropy -|A| = -1, Polyak tau 0.005, gamma 0.99, batch 256, a 1e6-transition
    buffer, one gradient step per environment frame. Warm-up: 1,000 uniformly random
    frames (``--warmup``), the same as ``configs/pendulum_sac.yaml`` (CleanRL uses 5,000,
    the paper 10,000; with 1,000 the frame counts compare like for like).

Both stop when the mean return of the last 10 finished episodes (warm-up episodes
included, a full window of 10 required) reaches the goal (475 for CartPole, -200 for
Pendulum), checked at every episode end, or after ``--max-steps`` gradient steps. Both
run with their faster torch thread count on a 2-core machine (``--threads``): one for
the template DQN (batch 16, 128 units; 15,000 steps, six runs each: median 31.4 s with
one thread, 36.6 s with two), two for SAC (batch 256, 256x256 networks; seed 0 to the
goal, two alternating pairs: 92.7 and 93.8 s of training with one thread, 70.4 and
78.7 s with two). Our configs likewise: one thread for CartPole, two for Pendulum.

Each run ends by printing the same summary lines as our ``train.py fit`` (``RunReport``)::

    fit stopped at step 49,584 after 102.5 s: goal reached, episode_return 492.50 >= 475.0
      episode_return 492.50 | frames 50,584

where the seconds run from the start of :func:`run_dqn` / :func:`run_sac` (environment
and network construction and the warm start included, interpreter start-up and imports
excluded) to the moment the goal was reached. Run one directly::

    python benchmarks/reference_agents.py dqn --seed 0
    python benchmarks/reference_agents.py sac --seed 0 --max-steps 50000
"""

from __future__ import annotations

import argparse
import math
import random
import time
import warnings
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

GOALS = {"dqn": 475.0, "sac": -200.0}
RETURN_WINDOW = 10


@dataclass
class Outcome:
    """Where a reference run got: what the summary lines print."""

    reached: bool
    steps: int
    frames: int
    seconds: float
    mean_return: float
    goal: float

    def summary(self) -> str:
        """The two summary lines, in the format of our ``RunReport``."""
        if self.reached:
            reason = f"goal reached, episode_return {self.mean_return:.2f} >= {self.goal}"
        else:
            reason = f"max_steps={self.steps:,} reached"
        return (
            f"fit stopped at step {self.steps:,} after {self.seconds:.1f} s: {reason}\n"
            f"  episode_return {self.mean_return:.2f} | frames {self.frames:,}"
        )


def _mean(values: deque[float]) -> float:
    return sum(values) / len(values) if values else math.nan


# --------------------------------------------------------------------------------------
# DQN on CartPole-v1, shaped like Lightning's reinforce_learn_Qnet.py domain template
# --------------------------------------------------------------------------------------


class Transitions:
    """A ``deque`` of ``(obs, action, reward, terminated, next_obs)`` tuples, uniformly sampled."""

    def __init__(self, capacity: int) -> None:
        self.items: deque[tuple[np.ndarray, int, float, bool, np.ndarray]] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self.items)

    def add(
        self, obs: np.ndarray, action: int, reward: float, terminated: bool, next_obs: np.ndarray
    ) -> None:
        self.items.append((obs, action, reward, terminated, next_obs))

    def sample(self, size: int) -> tuple[torch.Tensor, ...]:
        picked = [self.items[i] for i in random.sample(range(len(self.items)), size)]
        obs, actions, rewards, terminated, next_obs = zip(*picked, strict=True)
        return (
            torch.from_numpy(np.stack(obs).astype(np.float32)),
            torch.tensor(actions, dtype=torch.int64),
            torch.tensor(rewards, dtype=torch.float32),
            torch.tensor(terminated, dtype=torch.bool),
            torch.from_numpy(np.stack(next_obs).astype(np.float32)),
        )


class SampledTransitions(torch.utils.data.IterableDataset):
    """Each pass draws ``pass_size`` transitions from the (growing) buffer and yields them one by one."""

    def __init__(self, buffer: Transitions, pass_size: int = 200) -> None:
        self.buffer = buffer
        self.pass_size = pass_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        columns = self.buffer.sample(self.pass_size)
        for i in range(self.pass_size):
            yield tuple(column[i] for column in columns)


def _q_network(obs_size: int, num_actions: int, hidden: int = 128) -> nn.Module:
    return nn.Sequential(nn.Linear(obs_size, hidden), nn.ReLU(), nn.Linear(hidden, num_actions))


def _lightning_dqn_class() -> type:
    """Build the LightningModule class (Lightning imported only when the DQN runs)."""
    import gymnasium as gym
    import lightning as L

    class ReferenceDQN(L.LightningModule):
        """DQN whose ``training_step`` takes one environment frame, then one gradient step."""

        def __init__(
            self,
            seed: int = 0,
            replay_size: int = 1_000,
            warm_start_frames: int = 1_000,
            batch_size: int = 16,
            pass_size: int = 200,
            lr: float = 1e-2,
            gamma: float = 0.99,
            sync_every: int = 10,
            eps_start: float = 1.0,
            eps_end: float = 0.01,
            eps_frames: int = 1_000,
            goal: float = GOALS["dqn"],
            old_gym_done: bool = False,
        ) -> None:
            super().__init__()
            self.started = time.perf_counter()
            self.batch_size, self.pass_size = batch_size, pass_size
            self.lr, self.gamma, self.sync_every = lr, gamma, sync_every
            self.eps_start, self.eps_end, self.eps_frames = eps_start, eps_end, eps_frames
            self.goal = goal
            self.old_gym_done = old_gym_done
            self.env = gym.make("CartPole-v1")
            self.env.action_space.seed(seed)
            self.obs, _ = self.env.reset(seed=seed)
            obs_size = self.env.observation_space.shape[0]
            num_actions = int(self.env.action_space.n)
            self.net = _q_network(obs_size, num_actions)
            self.target_net = _q_network(obs_size, num_actions)
            self.target_net.load_state_dict(self.net.state_dict())
            self.buffer = Transitions(replay_size)
            self.episode_return = 0.0
            self.returns: deque[float] = deque(maxlen=RETURN_WINDOW)
            self.frames = 0
            self.outcome: Outcome | None = None
            for _ in range(warm_start_frames):
                self.act(epsilon=1.0)

        @torch.no_grad()
        def act(self, epsilon: float) -> bool:
            """One epsilon-greedy frame into the buffer; True when an episode ended."""
            if random.random() < epsilon:
                action = int(self.env.action_space.sample())
            else:
                q_values = self.net(torch.as_tensor(self.obs, dtype=torch.float32)[None])
                action = int(q_values.argmax(dim=1).item())
            next_obs, reward, terminated, truncated, _ = self.env.step(action)
            cut = terminated or (truncated and self.old_gym_done)
            self.buffer.add(self.obs, action, float(reward), bool(cut), next_obs)
            self.frames += 1
            self.episode_return += float(reward)
            if terminated or truncated:
                self.returns.append(self.episode_return)
                self.episode_return = 0.0
                self.obs, _ = self.env.reset()
                return True
            self.obs = next_obs
            return False

        def epsilon(self) -> float:
            fraction = min(1.0, self.global_step / self.eps_frames)
            return self.eps_start + fraction * (self.eps_end - self.eps_start)

        def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
            episode_ended = self.act(self.epsilon())
            obs, actions, rewards, terminated, next_obs = batch
            q_taken = self.net(obs).gather(1, actions[:, None]).squeeze(1)
            with torch.no_grad():
                next_value = self.target_net(next_obs).max(dim=1).values
                target = rewards + self.gamma * next_value * (~terminated).float()
            loss = nn.functional.mse_loss(q_taken, target)
            if self.global_step % self.sync_every == 0:
                self.target_net.load_state_dict(self.net.state_dict())
            if episode_ended and self.outcome is None and len(self.returns) == RETURN_WINDOW:
                mean = _mean(self.returns)
                if mean >= self.goal:
                    self.outcome = Outcome(
                        True,
                        self.global_step + 1,
                        self.frames,
                        time.perf_counter() - self.started,
                        mean,
                        self.goal,
                    )
                    self.trainer.should_stop = True
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.net.parameters(), lr=self.lr)

        def train_dataloader(self) -> torch.utils.data.DataLoader:
            dataset = SampledTransitions(self.buffer, self.pass_size)
            return torch.utils.data.DataLoader(dataset, batch_size=self.batch_size)

    return ReferenceDQN


def run_dqn(seed: int, max_steps: int = 200_000, old_gym_done: bool = False) -> Outcome:
    """Train the reference DQN until the goal or ``max_steps`` gradient steps.

    ``old_gym_done``: treat the time limit as terminal (no bootstrapping past it).
    """
    import lightning as L

    started = time.perf_counter()
    L.seed_everything(seed, verbose=False)
    model = _lightning_dqn_class()(seed=seed, old_gym_done=old_gym_done)
    model.started = started
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    if model.outcome is not None:
        return model.outcome
    return Outcome(
        False,
        trainer.global_step,
        model.frames,
        time.perf_counter() - started,
        _mean(model.returns),
        model.goal,
    )


# --------------------------------------------------------------------------------------
# SAC on Pendulum-v1, CleanRL-style, the SAC paper's hyperparameters
# --------------------------------------------------------------------------------------


def _mlp(inputs: int, outputs: int, hidden: int = 256) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inputs, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, outputs),
    )


class SquashedGaussianActor(nn.Module):
    """A Gaussian over pre-tanh actions, squashed by tanh and scaled to the action bounds."""

    LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0

    def __init__(
        self, obs_size: int, action_size: int, low: np.ndarray, high: np.ndarray, hidden: int = 256
    ) -> None:
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Linear(obs_size, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.mean = nn.Linear(hidden, action_size)
        self.log_std = nn.Linear(hidden, action_size)
        self.register_buffer("scale", torch.as_tensor((high - low) / 2, dtype=torch.float32))
        self.register_buffer("center", torch.as_tensor((high + low) / 2, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action sample and its log-probability (summed over dims)."""
        features = self.trunk(obs)
        mean = self.mean(features)
        log_std = self.log_std(features).clamp(self.LOG_STD_MIN, self.LOG_STD_MAX)
        normal = torch.distributions.Normal(mean, log_std.exp())
        pre_tanh = normal.rsample()
        squashed = torch.tanh(pre_tanh)
        log_prob = normal.log_prob(pre_tanh) - torch.log(self.scale * (1 - squashed.pow(2)) + 1e-6)
        return squashed * self.scale + self.center, log_prob.sum(-1)


class ArrayBuffer:
    """A preallocated ring buffer of transitions, sampled uniformly with replacement."""

    def __init__(self, capacity: int, obs_size: int, action_size: int) -> None:
        self.capacity, self.size, self.cursor = capacity, 0, 0
        self.obs = np.zeros((capacity, obs_size), np.float32)
        self.next_obs = np.zeros((capacity, obs_size), np.float32)
        self.actions = np.zeros((capacity, action_size), np.float32)
        self.rewards = np.zeros(capacity, np.float32)
        self.terminated = np.zeros(capacity, np.float32)

    def add(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: float,
        terminated: bool,
        next_obs: np.ndarray,
    ) -> None:
        i = self.cursor
        self.obs[i], self.actions[i], self.rewards[i] = obs, action, reward
        self.terminated[i], self.next_obs[i] = terminated, next_obs
        self.cursor = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, size: int) -> tuple[torch.Tensor, ...]:
        idx = np.random.randint(0, self.size, size)
        return tuple(
            torch.from_numpy(column[idx])
            for column in (self.obs, self.actions, self.rewards, self.terminated, self.next_obs)
        )


def run_sac(
    seed: int,
    max_steps: int = 100_000,
    warmup: int = 1_000,
    batch_size: int = 256,
    buffer_size: int = 1_000_000,
    lr: float = 3e-4,
    gamma: float = 0.99,
    tau: float = 0.005,
    goal: float = GOALS["sac"],
) -> Outcome:
    """Train the reference SAC until the goal or ``max_steps`` gradient steps."""
    import gymnasium as gym

    started = time.perf_counter()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    env = gym.make("Pendulum-v1")
    env.action_space.seed(seed)
    obs_size = env.observation_space.shape[0]
    action_size = env.action_space.shape[0]
    low, high = env.action_space.low, env.action_space.high

    actor = SquashedGaussianActor(obs_size, action_size, low, high)
    critics = nn.ModuleList([_mlp(obs_size + action_size, 1) for _ in range(2)])
    targets = nn.ModuleList([_mlp(obs_size + action_size, 1) for _ in range(2)])
    targets.load_state_dict(critics.state_dict())
    targets.requires_grad_(False)
    log_alpha = torch.zeros(1, requires_grad=True)
    target_entropy = -float(action_size)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=lr)
    critic_opt = torch.optim.Adam(critics.parameters(), lr=lr)
    alpha_opt = torch.optim.Adam([log_alpha], lr=lr)
    buffer = ArrayBuffer(buffer_size, obs_size, action_size)

    def q_values(nets: nn.ModuleList, obs: torch.Tensor, act: torch.Tensor) -> list[torch.Tensor]:
        joined = torch.cat([obs, act], dim=-1)
        return [net(joined).squeeze(-1) for net in nets]

    obs, _ = env.reset(seed=seed)
    episode_return, returns = 0.0, deque(maxlen=RETURN_WINDOW)
    frames = steps = 0
    while steps < max_steps:
        if frames < warmup:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                action = actor(torch.as_tensor(obs)[None])[0][0].numpy()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buffer.add(obs, action, float(reward), bool(terminated), next_obs)
        frames += 1
        episode_return += float(reward)
        if terminated or truncated:
            returns.append(episode_return)
            episode_return = 0.0
            obs, _ = env.reset()
            if len(returns) == RETURN_WINDOW and _mean(returns) >= goal:
                return Outcome(
                    True, steps, frames, time.perf_counter() - started, _mean(returns), goal
                )
        else:
            obs = next_obs
        if frames < warmup:
            continue

        # One gradient step per frame: critics, then actor, then temperature, then targets.
        b_obs, b_act, b_rew, b_term, b_next = buffer.sample(batch_size)
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_act, next_logp = actor(b_next)
            next_q = torch.min(*q_values(targets, b_next, next_act)) - alpha * next_logp
            target = b_rew + gamma * (1.0 - b_term) * next_q
        q1, q2 = q_values(critics, b_obs, b_act)
        critic_loss = nn.functional.mse_loss(q1, target) + nn.functional.mse_loss(q2, target)
        critic_opt.zero_grad()
        critic_loss.backward()
        critic_opt.step()

        new_act, logp = actor(b_obs)
        actor_loss = (alpha * logp - torch.min(*q_values(critics, b_obs, new_act))).mean()
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()

        alpha_loss = -(log_alpha * (logp.detach() + target_entropy)).mean()
        alpha_opt.zero_grad()
        alpha_loss.backward()
        alpha_opt.step()

        with torch.no_grad():
            for target_param, param in zip(targets.parameters(), critics.parameters(), strict=True):
                target_param.lerp_(param, tau)
        steps += 1
    return Outcome(False, steps, frames, time.perf_counter() - started, _mean(returns), goal)


def main(argv: list[str] | None = None) -> Outcome:
    """Command line: ``python benchmarks/reference_agents.py {dqn,sac} --seed N [--max-steps N]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("agent", choices=sorted(GOALS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="gradient-step cap (default: 200,000 DQN, 100,000 SAC)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1_000,
        help="SAC: random warm-up frames before the first gradient step",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: the agent's faster setting, 1 DQN, 2 SAC)",
    )
    parser.add_argument(
        "--old-gym-done",
        action="store_true",
        help="DQN: no bootstrapping past the time limit either (old gym's done)",
    )
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be a positive integer, got {args.threads}.")
    torch.set_num_threads(args.threads or (1 if args.agent == "dqn" else 2))
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*IterableDataset.*")
    kwargs: dict[str, Any] = {"seed": args.seed}
    if args.max_steps is not None:
        kwargs["max_steps"] = args.max_steps
    if args.agent == "dqn":
        outcome = run_dqn(old_gym_done=args.old_gym_done, **kwargs)
    else:
        outcome = run_sac(warmup=args.warmup, **kwargs)
    print(outcome.summary(), flush=True)
    return outcome


if __name__ == "__main__":
    main()
