"""Environments for the collectors: gymnasium ids through torchrl, batched in one process."""

from __future__ import annotations

from typing import Any

from torchrl.envs import EnvBase


def make_gym_env(env_name: str, num_envs: int = 1, **kwargs: Any) -> EnvBase:
    """A gymnasium environment through torchrl's ``GymEnv`` (imports gymnasium lazily).

    ``num_envs > 1`` steps that many copies in one call, in this process (gymnasium's
    ``SyncVectorEnv``): for cheap environments such as CartPole the cost of a frame is
    torchrl's per-call bookkeeping, which a batch of environments shares. torchrl's own
    ``GymEnv(num_envs=k)`` runs them in ``k`` subprocesses, whose pipe round trip per
    step costs more than CartPole itself on a few cores.
    """
    from torchrl.envs import GymEnv, GymWrapper

    if num_envs == 1:
        return GymEnv(env_name, **kwargs)
    import gymnasium

    wrapper_keys = {"categorical_action_encoding", "device", "batch_size", "allow_done_after_reset"}
    wrapper_kwargs = {k: v for k, v in kwargs.items() if k in wrapper_keys}
    make_kwargs = {k: v for k, v in kwargs.items() if k not in wrapper_keys}
    vector_env = gymnasium.vector.SyncVectorEnv(
        [lambda: gymnasium.make(env_name, **make_kwargs)] * num_envs,
        # torchrl reads the final observation of an episode in the same step as the reset.
        autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP,
    )
    return GymWrapper(vector_env, **wrapper_kwargs)


__all__ = ["make_gym_env"]
