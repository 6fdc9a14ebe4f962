"""Save the offline CartPole transitions that the ``cartpole_dqn_offline_to_online`` config mixes in.

    rb-lightning fit --config cartpole_dqn --seed_everything 100 \
        --trainer.logger.init_args.name=cartpole_demo_policy       # a policy that solves it
    python -m rb_lightning.rl.make_cartpole_demos runs/cartpole_demos \
        --checkpoint runs/cartpole_demo_policy/version_0/checkpoints/last.ckpt
    rb-lightning fit --config cartpole_dqn_offline_to_online

Plays the checkpoint's DQN policy epsilon-greedy (so the data shows some recoveries) with
``OnlineCollector``'s n-step machinery and writes ``--frames`` transitions with
``ReplayBuffer.dumps``: the config's ``offline`` member, of the same ``max_size``. Without
``--checkpoint`` the policy is untrained (fast, for tests).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.postprocs import MultiStep

from rb_lightning.rl import DQN, OnlineCollector
from rb_lightning.runs.run_log import quiet_run_log

#: What configs/cartpole_dqn*.yaml store: the keys DQN reads.
KEYS = [
    "observation",
    "action",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "terminated"),
    "steps_to_next_obs",
]


def make_cartpole_demos(
    path: str | Path,
    *,
    checkpoint: str | Path | None = None,
    frames: int = 10_000,
    capacity: int = 10_000,
    epsilon: float = 0.1,
    num_envs: int = 16,
    n_steps: int = 3,
    seed: int = 0,
) -> tuple[TensorDictReplayBuffer, list[float]]:
    """Play the policy for ``frames`` transitions, ``dumps`` them to ``path``; return episodes.

    Returns:
        The buffer written, and the returns of the episodes that finished.

    Examples:
        >>> import tempfile
        >>> rb, returns = make_cartpole_demos(tempfile.mkdtemp(), frames=64, capacity=64, num_envs=2)
        >>> len(rb)
        64
    """
    torch.manual_seed(seed)
    if checkpoint is not None:
        module = DQN.load_from_checkpoint(str(checkpoint), map_location="cpu", weights_only=False)
    else:
        module = DQN(observation_size=4, num_actions=2)
    module.eval()
    policy = module.collection_policy()
    module.exploration.eps.fill_(epsilon)
    # The collector's own environment: CartPole-v1 in num_envs copies, with episode returns.
    env = OnlineCollector(
        "CartPole-v1", env_kwargs={"categorical_action_encoding": True}, num_envs=num_envs
    ).make_env()
    env.set_seed(seed)
    chunk = 256 if num_envs <= 256 else num_envs
    collector = Collector(
        env,
        policy,
        frames_per_batch=chunk,
        total_frames=-1,
        storing_device="cpu",
        auto_register_policy_transforms=False,
    )
    multi_step = MultiStep(gamma=float(module.hparams["gamma"]), n_steps=n_steps)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity))
    returns: list[float] = []
    with torch.no_grad():
        for batch in collector:
            flat = batch.reshape(-1)
            done = flat.get(("next", "done")).reshape(flat.shape[0], -1).any(-1)
            if done.any():
                episode = flat.get(("next", "episode_reward")).reshape(flat.shape[0], -1)
                returns += episode[done].sum(-1).tolist()
            stepped = multi_step(batch.rename(*[None] * batch.batch_dims)).reshape(-1)
            rb.extend(stepped.select(*KEYS).rename(None)[: frames - len(rb)])
            if len(rb) >= frames:
                break
    collector.shutdown()
    Path(path).mkdir(parents=True, exist_ok=True)
    rb.dumps(path)
    return rb, returns


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rb_lightning.rl.make_cartpole_demos",
        description=(__doc__ or "").splitlines()[0],
    )
    parser.add_argument("path", nargs="?", default="runs/cartpole_demos", help="output directory")
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a DQN .ckpt of the cartpole_dqn config (runs/.../checkpoints/last.ckpt)",
    )
    parser.add_argument("--frames", type=int, default=10_000, help="transitions to save")
    parser.add_argument(
        "--capacity", type=int, default=10_000, help="storage max_size; must match the config"
    )
    parser.add_argument("--epsilon", type=float, default=0.1, help="random-action probability")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--n-steps", type=int, default=3, help="as the config's n_steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    quiet_run_log()  # torchrl's INFO lines (storage initialised, spec checks)
    if args.frames > args.capacity:
        parser.error(f"--frames {args.frames} does not fit in --capacity {args.capacity}.")
    if args.checkpoint is not None and not Path(args.checkpoint).is_file():
        parser.error(
            f"--checkpoint {args.checkpoint!r} is not a file. Pass a .ckpt of the cartpole_dqn "
            "config (runs/<name>/version_<N>/checkpoints/last.ckpt), or leave --checkpoint out "
            "for an untrained policy."
        )
    torch.set_num_threads(1)
    rb, returns = make_cartpole_demos(
        args.path,
        checkpoint=args.checkpoint,
        frames=args.frames,
        capacity=args.capacity,
        epsilon=args.epsilon,
        num_envs=args.num_envs,
        n_steps=args.n_steps,
        seed=args.seed,
    )
    mean = sum(returns) / len(returns) if returns else float("nan")
    print(
        f"saved {len(rb)} transitions (capacity {args.capacity}) to {args.path}; "
        f"{len(returns)} finished episodes, mean return {mean:.1f}"
    )


if __name__ == "__main__":
    main()
