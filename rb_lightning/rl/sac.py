"""``SAC``: soft actor-critic for continuous actions as a LightningModule."""

from __future__ import annotations

import copy
import math
from typing import cast

import torch
import torch.nn.functional as F
from lightning.fabric.utilities.data import AttributeDict
from lightning.pytorch import LightningModule
from tensordict import TensorDictBase
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal

from rb_lightning.errors import UsageError
from rb_lightning.rl.evaluation import EvaluatesEpisodes, Evaluation
from rb_lightning.validation import check_positive_int


class SAC(EvaluatesEpisodes, LightningModule):
    """Soft actor-critic with twin Q-networks, target critics and a learned temperature.

    One optimizer with three parameter groups (critics, actor, temperature) keeps automatic
    optimization and one ``global_step`` per batch; each loss reads the other parts detached,
    so every group gets only its own gradient. Batches are torchrl transitions; pair it with
    :class:`~rb_lightning.rl.OnlineCollector` (a tanh-Gaussian within the action bounds).

    Args:
        observation_size: Length of the flat observation vector.
        action_size: Length of the action vector.

    Keyword Args:
        action_low: Lower action bound (every dimension).
        action_high: Upper action bound (every dimension).
        hidden_sizes: Hidden widths of the actor and each critic.
        actor_lr: Learning rate of the actor.
        critic_lr: Learning rate of the critics.
        alpha_lr: Learning rate of the log-temperature.
        gamma: Discount factor.
        tau: Soft update rate of the target critics, each step.
        init_alpha: Initial temperature.
        target_entropy: Entropy the temperature steers towards; ``None``: ``-action_size``.
        observation_key: Observation key in the batch and the environment.
        evaluation: How ``validate``/``test`` score the policy
            (:class:`~rb_lightning.rl.Evaluation`); default: 10 greedy episodes.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> sac = SAC(observation_size=3, action_size=1, action_low=-2.0, action_high=2.0,
        ...           hidden_sizes=[8])
        >>> td = sac.collection_policy()(TensorDict({"observation": torch.zeros(5, 3)}, [5]))
        >>> td["action"].shape, bool(td["action"].abs().max() <= 2.0)
        (torch.Size([5, 1]), True)
    """

    def __init__(
        self,
        observation_size: int,
        action_size: int,
        *,
        action_low: float = -1.0,
        action_high: float = 1.0,
        hidden_sizes: list[int] | None = None,
        actor_lr: float = 3e-4,
        critic_lr: float = 3e-4,
        alpha_lr: float = 3e-4,
        gamma: float = 0.99,
        tau: float = 0.005,
        init_alpha: float = 1.0,
        target_entropy: float | None = None,
        observation_key: str = "observation",
        evaluation: Evaluation | None = None,
    ) -> None:
        super().__init__()
        check_positive_int(observation_size, "observation_size")
        check_positive_int(action_size, "action_size")
        if not action_low < action_high:
            raise UsageError(
                "action_low", f"Need action_low < action_high, got {action_low}, {action_high}."
            )
        if not 0.0 < tau <= 1.0:
            raise UsageError("tau", f"tau must be in (0, 1], got {tau!r}.")
        if init_alpha <= 0:
            raise UsageError("init_alpha", f"init_alpha must be positive, got {init_alpha!r}.")
        # The evaluation settings are an object, not a hyperparameter: checkpoints stay
        # plain data (loadable with weights_only=True).
        self.save_hyperparameters(ignore=["evaluation"])
        self.evaluation = evaluation if evaluation is not None else Evaluation()
        hidden = [256, 256] if hidden_sizes is None else list(hidden_sizes)
        self.actor_net = nn.Sequential(
            MLP(in_features=observation_size, out_features=2 * action_size, num_cells=hidden),
            NormalParamExtractor(),
        )
        self.critics = nn.ModuleList(
            MLP(in_features=observation_size + action_size, out_features=1, num_cells=hidden)
            for _ in range(2)
        )
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_alpha)))
        self.target_entropy = float(-action_size if target_entropy is None else target_entropy)

    # -- acting -----------------------------------------------------------------------------
    def _distribution(self, observation: torch.Tensor) -> TanhNormal:
        loc, scale = self.actor_net(observation)
        hp = self._hp
        return TanhNormal(loc, scale, low=hp.action_low, high=hp.action_high)

    @property
    def _hp(self) -> AttributeDict:
        # save_hyperparameters() stores an AttributeDict; hparams is typed as any mapping.
        return cast(AttributeDict, self.hparams)

    def collection_policy(self) -> ProbabilisticActor:
        """Stochastic acting policy sharing ``actor_net`` (used by ``OnlineCollector``)."""
        hp = self._hp
        return ProbabilisticActor(
            TensorDictModule(
                self.actor_net, in_keys=[hp.observation_key], out_keys=["loc", "scale"]
            ),
            in_keys=["loc", "scale"],
            distribution_class=TanhNormal,
            distribution_kwargs={"low": hp.action_low, "high": hp.action_high},
        )

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        """Deterministic action (the distribution's mode)."""
        return self._distribution(observation).deterministic_sample

    # -- learning ---------------------------------------------------------------------------
    @staticmethod
    def _min_q(critics: nn.ModuleList, observation: torch.Tensor, action: torch.Tensor):
        inputs = torch.cat([observation, action], dim=-1)
        return torch.minimum(critics[0](inputs), critics[1](inputs)).squeeze(-1)

    def training_step(self, batch: TensorDictBase, batch_idx: int) -> torch.Tensor:
        hp = self._hp
        obs, action = batch[hp.observation_key], batch["action"]
        alpha = self.log_alpha.exp().detach()

        with torch.no_grad():
            next_obs = batch["next", hp.observation_key]
            next_dist = self._distribution(next_obs)
            next_action = next_dist.rsample()
            next_log_prob = next_dist.log_prob(next_action)
            soft_next = self._min_q(self.target_critics, next_obs, next_action)
            soft_next = soft_next - alpha * next_log_prob
            reward = batch["next", "reward"].reshape(-1)
            alive = (~batch["next", "terminated"]).reshape(-1).to(reward.dtype)
            target = reward + hp.gamma * alive * soft_next
        inputs = torch.cat([obs, action], dim=-1)
        critic_1, critic_2 = self.critics
        critic_loss = F.mse_loss(critic_1(inputs).squeeze(-1), target) + F.mse_loss(
            critic_2(inputs).squeeze(-1), target
        )

        dist = self._distribution(obs)
        new_action = dist.rsample()
        log_prob = dist.log_prob(new_action)
        self.critics.requires_grad_(False)  # the actor's loss must not move the critics
        actor_loss = (alpha * log_prob - self._min_q(self.critics, obs, new_action)).mean()
        self.critics.requires_grad_(True)

        alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        loss = critic_loss + actor_loss + alpha_loss
        # Lightning writes the logs after steps with (step + 1) % log_every_n_steps == 0.
        every = self.trainer.log_every_n_steps  # type: ignore[attr-defined]  # set by Lightning's connectors, undeclared on Trainer
        if (self.global_step + 1) % every == 0:
            size = obs.shape[0]
            self.log("critic_loss", critic_loss.detach(), batch_size=size)
            self.log("actor_loss", actor_loss.detach(), batch_size=size)
            self.log("alpha", alpha, batch_size=size)
        return loss

    def on_train_batch_end(self, outputs: object, batch: TensorDictBase, batch_idx: int) -> None:
        with torch.no_grad():
            for online, target in zip(
                self.critics.parameters(), self.target_critics.parameters(), strict=True
            ):
                target.lerp_(online, self._hp.tau)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self._hp
        return torch.optim.Adam(
            [
                {"params": self.critics.parameters(), "lr": hp.critic_lr},
                {"params": self.actor_net.parameters(), "lr": hp.actor_lr},
                {"params": [self.log_alpha], "lr": hp.alpha_lr},
            ],
            fused=True,  # one kernel per step instead of a loop over parameters
        )


__all__ = [
    "SAC",
]
