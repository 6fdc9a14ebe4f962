"""``DQN``: deep Q-learning as a LightningModule fed by a replay buffer."""

from __future__ import annotations

import copy
from typing import Literal, cast

import torch
import torch.nn.functional as F
from lightning.fabric.utilities.data import AttributeDict
from lightning.pytorch import LightningModule
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.data import Categorical
from torchrl.modules import MLP, EGreedyModule, QValueModule

from rb_lightning.errors import UsageError
from rb_lightning.rl.evaluation import EvaluatesEpisodes, Evaluation
from rb_lightning.validation import check_positive_int

_ACTIVATIONS: dict[str, type[torch.nn.Module]] = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}
_TD_LOSSES = {"huber": F.smooth_l1_loss, "mse": F.mse_loss}


class DQN(EvaluatesEpisodes, LightningModule):
    """Deep Q-Network with a target network, epsilon-greedy acting and optional Double DQN.

    Batches are torchrl transitions (``observation``, ``action``, ``("next", "reward" |
    "terminated" | "observation")``); only ``terminated`` stops the bootstrap. With a
    ``PrioritizedSampler`` the loss is importance-weighted and ``|TD error|`` goes back as the
    priority through ``trainer.datamodule.update_priority``. Pair it with
    :class:`~rb_lightning.rl.OnlineCollector`, which acts with :meth:`collection_policy`.

    Args:
        observation_size: Length of the flat observation vector.
        num_actions: Number of discrete actions.

    Keyword Args:
        hidden_sizes: Widths of the Q-network's hidden layers.
        activation: ``"tanh"`` (torchrl's ``MLP`` default) or ``"relu"`` (a name, so the
            checkpoint's hyperparameters stay plain data).
        td_loss: Loss on the TD error: ``"huber"`` (bounded gradients) or ``"mse"`` (Lightning's
            DQN template; learns CartPole with a small ReLU network and a high learning rate).
        lr: Adam learning rate.
        gamma: Discount factor.
        target_update_interval: Update the target network every this many steps.
        tau: ``target = tau * online + (1 - tau) * target`` (``1.0``: hard copy).
        double_dqn: Pick the next action with the online network, value it with the target.
        eps_start: Exploration rate at the first training step.
        eps_end: Exploration rate after ``eps_decay_steps`` training steps.
        eps_decay_steps: Training steps of linear epsilon decay.
        observation_key: Observation key in the batch and the environment.
        evaluation: How ``validate``/``test`` score the policy
            (:class:`~rb_lightning.rl.Evaluation`); default: 10 greedy episodes.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> dqn = DQN(observation_size=4, num_actions=2, hidden_sizes=[8])
        >>> td = dqn.collection_policy()(TensorDict({"observation": torch.zeros(4)}, []))
        >>> td["action"].dtype, td["action"].shape
        (torch.int64, torch.Size([]))
    """

    def __init__(
        self,
        observation_size: int,
        num_actions: int,
        *,
        hidden_sizes: list[int] | None = None,
        activation: Literal["tanh", "relu"] = "tanh",
        td_loss: Literal["huber", "mse"] = "huber",
        lr: float = 1e-3,
        gamma: float = 0.99,
        target_update_interval: int = 500,
        tau: float = 1.0,
        double_dqn: bool = True,
        eps_start: float = 1.0,
        eps_end: float = 0.05,
        eps_decay_steps: int = 10_000,
        observation_key: str = "observation",
        evaluation: Evaluation | None = None,
    ) -> None:
        super().__init__()
        check_positive_int(observation_size, "observation_size")
        check_positive_int(num_actions, "num_actions")
        check_positive_int(target_update_interval, "target_update_interval")
        check_positive_int(eps_decay_steps, "eps_decay_steps")
        if activation not in _ACTIVATIONS:
            raise UsageError(
                "activation",
                f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}.",
            )
        if td_loss not in _TD_LOSSES:
            raise UsageError(
                "td_loss", f"td_loss must be one of {sorted(_TD_LOSSES)}, got {td_loss!r}."
            )
        if not 0.0 < tau <= 1.0:
            raise UsageError("tau", f"tau must be in (0, 1], got {tau!r}.")
        if not 0.0 <= eps_end <= eps_start <= 1.0:
            raise UsageError(
                "eps_end",
                f"Need 0 <= eps_end <= eps_start <= 1, got eps_start={eps_start}, "
                f"eps_end={eps_end}.",
            )
        # The evaluation settings are an object, not a hyperparameter: checkpoints stay
        # plain data (loadable with weights_only=True).
        self.save_hyperparameters(ignore=["evaluation"])
        self.evaluation = evaluation if evaluation is not None else Evaluation()
        hidden = [128, 128] if hidden_sizes is None else list(hidden_sizes)
        self.q_net = MLP(
            in_features=observation_size,
            out_features=num_actions,
            num_cells=hidden,
            activation_class=_ACTIVATIONS[activation],
        )
        self.target_net = copy.deepcopy(self.q_net).requires_grad_(False)
        self.exploration = EGreedyModule(
            Categorical(num_actions), eps_init=float(eps_start), eps_end=float(eps_end)
        )

    @property
    def _hp(self) -> AttributeDict:
        # save_hyperparameters() stores an AttributeDict; hparams is typed as any mapping.
        return cast(AttributeDict, self.hparams)

    def collection_policy(self) -> TensorDictSequential:
        """Epsilon-greedy acting policy that shares ``q_net`` (used by ``OnlineCollector``)."""
        key = self._hp.observation_key
        return TensorDictSequential(
            TensorDictModule(self.q_net, in_keys=[key], out_keys=["action_value"]),
            QValueModule(action_space="categorical"),
            self.exploration,
        )

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        """Q-values of every action."""
        return self.q_net(observation)

    def _epsilon(self) -> float:
        hp = self._hp
        progress = min(self.global_step / hp.eps_decay_steps, 1.0)
        return hp.eps_start + progress * (hp.eps_end - hp.eps_start)

    def on_train_batch_start(self, batch: TensorDictBase, batch_idx: int) -> None:
        self.exploration.eps.fill_(self._epsilon())

    def training_step(self, batch: TensorDictBase, batch_idx: int) -> torch.Tensor:
        hp = self._hp
        key = hp.observation_key
        action = batch["action"].long().reshape(-1, 1)
        q_taken = self.q_net(batch[key]).gather(-1, action).squeeze(-1)
        with torch.no_grad():
            next_obs = batch["next", key]
            next_target = self.target_net(next_obs)
            chooser = self.q_net(next_obs) if hp.double_dqn else next_target
            next_value = next_target.gather(-1, chooser.argmax(-1, keepdim=True)).squeeze(-1)
            reward = batch["next", "reward"].reshape(-1)
            alive = (~batch["next", "terminated"]).reshape(-1).to(reward.dtype)
            # n-step transitions (OnlineCollector(n_steps=n)) bootstrap n steps later.
            steps = batch.get("steps_to_next_obs", None)
            discount = hp.gamma if steps is None else hp.gamma ** steps.reshape(-1).to(reward.dtype)
            target = reward + discount * alive * next_value
        td_error = q_taken - target
        per_item = _TD_LOSSES[hp.td_loss](q_taken, target, reduction="none")
        if "priority_weight" in batch.keys():
            loss = (batch["priority_weight"].to(per_item.dtype) * per_item).mean()
            datamodule = self.trainer.datamodule  # type: ignore[attr-defined]  # set by Lightning's connectors, undeclared on Trainer
            datamodule.update_priority(batch, td_error.abs())
        else:
            loss = per_item.mean()
        # Lightning writes the logs after steps with (step + 1) % log_every_n_steps == 0.
        every = self.trainer.log_every_n_steps  # type: ignore[attr-defined]  # set by Lightning's connectors, undeclared on Trainer
        if (self.global_step + 1) % every == 0:
            # self.log costs a metric update per call; log only when the logger writes.
            self.log("loss", loss.detach(), batch_size=q_taken.shape[0])
            self.log("epsilon", self.exploration.eps.item(), batch_size=q_taken.shape[0])
        return loss

    def on_train_batch_end(self, outputs: object, batch: TensorDictBase, batch_idx: int) -> None:
        if self.global_step % self._hp.target_update_interval == 0:
            tau = self._hp.tau
            with torch.no_grad():
                for online, target in zip(
                    self.q_net.parameters(), self.target_net.parameters(), strict=True
                ):
                    target.lerp_(online, tau)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # One fused kernel per step instead of a loop over parameters: the optimizer is a
        # visible share of a small network's step.
        return torch.optim.Adam(self.q_net.parameters(), lr=self._hp.lr, fused=True)


__all__ = [
    "DQN",
]
