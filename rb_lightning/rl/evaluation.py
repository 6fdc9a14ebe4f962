"""Greedy evaluation episodes: what ``validate`` and ``test`` mean for an RL module.

:class:`Evaluation` runs ``num_episodes`` seeded episodes with exploration off, one per
batch of Lightning's validation/test loop, and logs the mean and standard deviation of
their returns; :class:`EvaluatesEpisodes` wires it into a module's hooks. With
``ReplayBufferDataModule(eval_from_model=True)``::

    python train.py test --config configs/cartpole_dqn.yaml --ckpt_path last
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Protocol, cast

import torch
from lightning.pytorch import LightningModule
from torch.utils.data import DataLoader, Dataset
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rb_lightning.errors import UsageError
from rb_lightning.validation import check_non_negative_int, check_positive_int

__all__ = ["EvaluatesEpisodes", "Evaluation"]


class _EpisodeSeeds(Dataset):
    """Item ``i`` is the environment seed of evaluation episode ``i``."""

    def __init__(self, num_episodes: int, seed: int) -> None:
        self.num_episodes, self.seed = num_episodes, seed

    def __len__(self) -> int:
        return self.num_episodes

    def __getitem__(self, index: int) -> int:
        return self.seed + index


class Evaluation:
    """How an RL module is evaluated: seeded greedy episodes, mean ± std of the return.

    Args:
        num_episodes: Episodes per evaluation.
        seed: Seed of the first ``validate`` episode's environment; episode ``i`` uses
            ``seed + i``, so two evaluations of the same weights give the same returns.
        test_seed: The same for ``test``; ``None``: ``seed + 1_000_000``. ``test`` plays
            other episodes than ``validate``, as a test split holds other examples.
        env: A gymnasium id for the evaluation environment. ``None`` (default):
            the environment of the Trainer's :class:`~rb_lightning.rl.OnlineCollector`.
        env_kwargs: Keyword arguments for ``GymEnv`` when ``env`` is given.
        max_steps: Cut an episode after this many steps (the environment's own
            time limit usually ends it first).
        during_fit: Also evaluate during ``fit`` when Lightning validates
            (``check_val_every_n_epoch`` / ``val_check_interval``). Off by default:
            the training return is the fit-time signal, and evaluation costs
            environment steps.

    Examples:
        >>> Evaluation(num_episodes=5, seed=100).seeds()
        [100, 101, 102, 103, 104]
        >>> Evaluation(num_episodes=2, seed=100, test_seed=7).seeds("test")
        [7, 8]
    """

    def __init__(
        self,
        num_episodes: int = 10,
        seed: int = 1_000_000,
        test_seed: int | None = None,
        *,
        env: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        max_steps: int = 100_000,
        during_fit: bool = False,
    ) -> None:
        self.num_episodes = check_positive_int(num_episodes, "num_episodes")
        self.seed = check_non_negative_int(seed, "seed")
        self.test_seed = check_non_negative_int(
            self.seed + 1_000_000 if test_seed is None else test_seed, "test_seed"
        )
        if env_kwargs and env is None:
            raise UsageError(
                "env_kwargs", "Evaluation(env_kwargs=...) needs env=<gymnasium id> too."
            )
        self.env, self.env_kwargs = env, dict(env_kwargs or {})
        self.max_steps = check_positive_int(max_steps, "max_steps")
        self.during_fit = bool(during_fit)
        self._env: EnvBase | None = None

    def seeds(self, stage: str = "validate") -> list[int]:
        """Environment seeds of the episodes of ``stage`` (``"validate"`` or ``"test"``)."""
        first = self.test_seed if stage == "test" else self.seed
        return [first + i for i in range(self.num_episodes)]

    def dataloader(self, module: LightningModule, stage: str = "validate") -> DataLoader | list:
        """One batch per episode (its seed); empty during ``fit`` unless ``during_fit``.

        ``validate`` and ``test`` from the command line first say which episodes they play.
        """
        trainer = module.trainer
        if trainer.state.fn == "fit" and not self.during_fit:
            # No evaluation during fit: Lightning's note that this loader is empty is expected.
            warnings.filterwarnings("ignore", message="Total length of `list` across ranks is zero")
            return []
        seeds = self.seeds(stage)
        if trainer.state.fn == stage and trainer.is_global_zero:
            print(
                f"{stage}: {self.num_episodes} episodes without exploration, environment seeds "
                f"{seeds[0]:,}-{seeds[-1]:,}",
                flush=True,
            )
        return DataLoader(_EpisodeSeeds(self.num_episodes, seeds[0]), batch_size=None)

    def run_episode(self, module: LightningModule, seed: int) -> float:
        """Return of one episode of ``module.collection_policy()`` without exploration."""
        env = self._environment(module)
        env.set_seed(int(seed))
        policy = cast(_PolicyModule, module).collection_policy()
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            rollout = env.rollout(self.max_steps, policy, break_when_any_done=True)
        return float(rollout.get(("next", "reward")).sum())

    def _environment(self, module: LightningModule) -> EnvBase:
        if self._env is None:
            if self.env is not None:
                from rb_lightning.rl.envs import make_gym_env

                self._env = make_gym_env(self.env, **self.env_kwargs)
            else:
                self._env = _collector_env(module)
        return self._env

    def close(self) -> None:
        """Close the evaluation environment."""
        if self._env is not None:
            self._env.close()
            self._env = None


def _collector_env(module: LightningModule) -> EnvBase:
    from rb_lightning.rl.collector import OnlineCollector

    callbacks = module.trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning's connectors, undeclared on Trainer
    collectors = [cb for cb in callbacks if isinstance(cb, OnlineCollector)]
    if not collectors:
        raise UsageError(
            "evaluation",
            f"{type(module).__name__} evaluates its policy in an environment, but none is "
            "known: the Trainer has no rb_lightning.rl.OnlineCollector callback to borrow it "
            "from. Give the module evaluation=Evaluation(env='<gymnasium id>').",
        )
    return collectors[0].make_env(num_envs=1)


class _PolicyModule(Protocol):
    # What Evaluation needs of a module (nn.Module's __getattr__ hides it from type checkers).
    def collection_policy(self) -> Any: ...


class EvaluatesEpisodes:
    """Mixin for an RL ``LightningModule``: ``validate``/``test`` play :class:`Evaluation` episodes and log ``val_return``/``test_return`` and ``*_return_std``."""

    evaluation: Evaluation

    def val_dataloader(self) -> Any:
        return self.evaluation.dataloader(self, "validate")  # type: ignore[arg-type]

    def test_dataloader(self) -> Any:
        return self.evaluation.dataloader(self, "test")  # type: ignore[arg-type]

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self._episode_returns.append(self.evaluation.run_episode(self, int(batch)))  # type: ignore[arg-type]

    def test_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self._episode_returns.append(self.evaluation.run_episode(self, int(batch)))  # type: ignore[arg-type]

    def on_validation_epoch_start(self) -> None:
        self._episode_returns: list[float] = []

    def on_test_epoch_start(self) -> None:
        self._episode_returns = []

    def on_validation_epoch_end(self) -> None:
        self._log_returns("val")

    def on_test_epoch_end(self) -> None:
        self._log_returns("test")

    def _log_returns(self, stage: str) -> None:
        returns = torch.tensor(self._episode_returns, dtype=torch.float64)
        if not len(returns):
            return
        std = float(returns.std(unbiased=False)) if len(returns) > 1 else 0.0
        log = self.log  # type: ignore[attr-defined]
        log(f"{stage}_return", float(returns.mean()), batch_size=1)
        log(f"{stage}_return_std", std if math.isfinite(std) else 0.0, batch_size=1)
        log(f"{stage}_episodes", float(len(returns)), batch_size=1)
