"""The acting side of online collection: the environment, the module's policy, their frames.

Examples:
    >>> from rb_lightning.rl import DQN
    >>> from rb_lightning.rl.acting import acting_policy, check_policy_fits_env, collection_env
    >>> env = collection_env("CartPole-v1", num_envs=1,
    ...                      env_kwargs={"categorical_action_encoding": True})
    >>> policy = acting_policy(DQN(observation_size=4, num_actions=2))
    >>> check_policy_fits_env(policy, env)  # raises UsageError when they disagree
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch import LightningModule
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torchrl.data.postprocs import MultiStep
from torchrl.envs import EnvBase, RewardSum, TransformedEnv

from rb_lightning.errors import ArgumentTypeError, UsageError
from rb_lightning.rl.envs import make_gym_env

__all__ = [
    "EPISODE_RETURN_KEY",
    "StoredFrames",
    "acting_policy",
    "check_policy_fits_env",
    "check_stored_keys",
    "collection_env",
    "n_step_transform",
    "shares_parameters",
]

EPISODE_RETURN_KEY = "episode_reward"


def collection_env(
    env: str | EnvBase, num_envs: int = 1, env_kwargs: dict[str, Any] | None = None
) -> EnvBase:
    """The collector's environment (a new one for a gymnasium id), with episode returns; module-level so a ``partial`` of it reaches a worker process."""
    if isinstance(env, str):
        env = make_gym_env(env, num_envs=num_envs, **(env_kwargs or {}))
    if EPISODE_RETURN_KEY not in env.observation_spec.keys():
        # A gymnasium id's env is already transformed: one flat chain, as torchrl's
        # default, said explicitly so that torchrl has nothing to warn about.
        env = TransformedEnv(env, RewardSum(), auto_unwrap=True)
    return env


def acting_policy(pl_module: LightningModule) -> TensorDictModuleBase:
    """``pl_module.collection_policy()``, checked to be a ``TensorDictModuleBase``."""
    make_policy: Callable[[], Any] | None = getattr(pl_module, "collection_policy", None)
    if not callable(make_policy):
        raise ArgumentTypeError(
            "model",
            f"OnlineCollector needs {type(pl_module).__name__}.collection_policy(): a method "
            "returning the acting TensorDictModule (with exploration) that shares the "
            "module's weights. See rb_lightning.rl.DQN for an example.",
        )
    policy = make_policy()
    if not isinstance(policy, TensorDictModuleBase):
        raise ArgumentTypeError(
            "model",
            "collection_policy() must return a tensordict.nn.TensorDictModuleBase, got "
            f"{type(policy).__name__}.",
        )
    return policy


def check_policy_fits_env(policy: TensorDictModuleBase, env: EnvBase) -> None:
    """One dry step now beats a shape error deep inside the first rollout."""
    probe = env.reset()
    with torch.no_grad():
        out = policy(probe.to(next(policy.parameters()).device).clone())
    for key in env.action_keys:
        action = out.get(key, None)
        if action is None:
            raise UsageError(
                "model",
                f"collection_policy() did not write the environment's action key {key!r}.",
            )
        if not env.full_action_spec[key].is_in(action.to(env.device)):
            raise UsageError(
                "model",
                f"collection_policy() wrote {key!r} with shape {tuple(action.shape)} and "
                f"dtype {action.dtype}, outside the environment's action spec "
                f"{env.full_action_spec[key]}. For a discrete gymnasium env with an "
                "integer-action policy pass env_kwargs={'categorical_action_encoding': True}; "
                "check the module's observation/action sizes.",
            )


def check_stored_keys(frames: TensorDictBase, keys: list[NestedKey] | None, n_steps: int) -> None:
    """Every key of ``OnlineCollector(keys=...)`` is in the collected ``frames``."""
    # "steps_to_next_obs" exists with n_steps > 1 only; a config may list it either way.
    present = set(frames.keys(include_nested=True))
    optional = {"steps_to_next_obs"} if n_steps == 1 else set()
    missing = [k for k in keys or [] if k not in present and k not in optional]
    if missing:
        raise UsageError(
            "keys",
            f"OnlineCollector(keys=...): {missing} are not in the collected frames, which "
            f"have {sorted(present, key=str)}. Fix the names (nested keys are lists in YAML, "
            "[next, reward]) or pass keys=None to store every key.",
        )


def n_step_transform(
    n_steps: int, gamma: float | None, pl_module: LightningModule
) -> MultiStep | None:
    """torchrl's ``MultiStep`` for ``n_steps`` > 1, discounting by ``gamma`` or the module's.

    ``gamma=None`` takes ``pl_module.hparams.gamma`` (as :class:`~rb_lightning.rl.DQN` has).
    """
    if n_steps == 1:
        return None
    if gamma is None:
        gamma = pl_module.hparams.get("gamma")
    if gamma is None:
        raise UsageError(
            "gamma",
            f"OnlineCollector(n_steps={n_steps}) discounts n-step rewards, but neither "
            f"gamma= nor {type(pl_module).__name__}.hparams.gamma is set. Pass gamma=...",
        )
    return MultiStep(gamma=float(gamma), n_steps=n_steps)


class StoredFrames:
    """What a collected batch becomes in the buffer, and the returns of the episodes it ends.

    Hands the returns to ``on_returns``, makes n-step transitions, keeps ``keys`` less
    ``exclude_keys`` and flattens to rows; runs in the training process or, as the
    collector's ``postproc``, in its worker (:meth:`reporting_to`).
    """

    def __init__(
        self,
        *,
        multi_step: MultiStep | None,
        keys: list[NestedKey] | None,
        exclude_keys: list[str],
        n_steps: int,
        on_returns: Callable[[list[float]], None],
    ) -> None:
        self.multi_step = multi_step
        self.keys = keys
        self.exclude_keys = exclude_keys
        self.n_steps = n_steps
        self.on_returns = on_returns

    def reporting_to(self, on_returns: Callable[[list[float]], None]) -> StoredFrames:
        """The same conversion, handing the finished episodes' returns to ``on_returns``."""
        return StoredFrames(
            multi_step=self.multi_step,
            keys=self.keys,
            exclude_keys=self.exclude_keys,
            n_steps=self.n_steps,
            on_returns=on_returns,
        )

    def __call__(self, frames: TensorDictBase) -> TensorDictBase:
        flat = frames.reshape(-1)
        done = flat.get(("next", "done")).reshape(flat.shape[0], -1).any(-1)
        if done.any():
            returns = flat.get(("next", EPISODE_RETURN_KEY)).reshape(flat.shape[0], -1)
            self.on_returns(returns[done].sum(-1).tolist())
        if self.multi_step is not None:
            # After the returns: n-step targets move ("next", "done") n steps ahead.
            frames = self.multi_step(frames.rename(*[None] * frames.batch_dims))
        frames = frames.reshape(-1)
        if self.keys is not None:
            check_stored_keys(frames, self.keys, self.n_steps)
            frames = frames.select(*self.keys, strict=False)
        if self.exclude_keys:
            frames = frames.exclude(*self.exclude_keys)
        return frames.rename(None)  # the collector names dim 0 "time"


def shares_parameters(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Whether ``a`` and ``b`` hold the very same parameter tensors (a policy not copied)."""
    pa = [p.data_ptr() for p in a.parameters()]
    pb = [p.data_ptr() for p in b.parameters()]
    return bool(pa) and pa == pb
