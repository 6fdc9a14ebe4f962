"""Does asynchronous collection overlap acting with learning? Same frames, same steps, four ways.

An environment with a fixed CPU cost per step (CartPole plus a busy loop of
``--env-ms``) and a DQN whose training step costs ``--train-ms`` more (a busy loop)
run ``--steps`` gradient steps on one frame per step:

1. ``collect_only``: a torchrl ``Collector`` collects ``--steps`` frames, nothing trains;
2. ``train_only``: the Trainer runs ``--steps`` steps on a filled buffer, nothing collects;
3. ``sync``: ``OnlineCollector`` collects one frame after every step (the sum of both);
4. ``async``: ``OnlineCollector(asynchronous=True, run_in=...)`` with
   ``SamplesPerInsert(samples_per_insert=batch_size)``: the same frames per step, collected
   in a worker process (or a thread) while the trainer trains.

Timed from the first training step to the last (start-up, the worker's spawn and the
warm-up are excluded and reported apart), medians of ``--repeats``, interleaved.
The goal is ``async <= 1.10 x max(collect_only, train_only)`` (issue 47).

Run from the repository root::

    python benchmarks/async_overlap.py                       # ~2 minutes
    python benchmarks/async_overlap.py --run-in thread       # the thread (shares the GIL)
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import gymnasium
import lightning as L
import torch
from gymnasium.envs.classic_control import CartPoleEnv
from lightning.pytorch import Callback
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from rb_lightning import ReplayBufferDataModule, SamplesPerInsert
from rb_lightning.rl import DQN, OnlineCollector
from rb_lightning.rl.acting import collection_env
from rb_lightning.rl.background import with_version_stamp

BATCH = 16
ENV_ID = (
    "async_overlap:BurnCartPole-v0"  # importable by the worker (this file's folder is on sys.path)
)


def burn(seconds: float) -> None:
    """Hold the CPU (and the GIL) for ``seconds``: the cost of a simulator step or a big model."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class BurnCartPole(CartPoleEnv):
    """CartPole whose every step costs ``burn_ms`` of CPU."""

    def __init__(self, burn_ms: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.burn_s = burn_ms / 1e3

    def step(self, action):
        burn(self.burn_s)
        return super().step(action)


gymnasium.register("BurnCartPole-v0", entry_point=BurnCartPole, max_episode_steps=500)


class BurnDQN(DQN):
    """DQN whose training step costs ``train_ms`` more."""

    def __init__(self, train_ms: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.burn_s = train_ms / 1e3

    def training_step(self, batch, batch_idx):
        burn(self.burn_s)
        return super().training_step(batch, batch_idx)


class StepClock(Callback):
    """Wall time from the first training step's start to the last one's end."""

    def on_train_batch_start(self, trainer, *args):
        if not hasattr(self, "start"):
            self.start = time.perf_counter()

    def on_train_end(self, trainer, *args):
        self.seconds = time.perf_counter() - self.start


def _model(args) -> BurnDQN:
    return BurnDQN(train_ms=args.train_ms, observation_size=4, num_actions=2, eps_decay_steps=200)


def _trainer(args, callbacks) -> L.Trainer:
    return L.Trainer(
        max_steps=args.steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def _env_kwargs(args) -> dict:
    return {"categorical_action_encoding": True, "burn_ms": args.env_ms}


def collect_only(args) -> float:
    env = collection_env(ENV_ID, env_kwargs=_env_kwargs(args))
    collector = Collector(
        env,
        _model(args).collection_policy(),
        frames_per_batch=8,
        total_frames=args.steps,
        auto_register_policy_transforms=False,
    )
    start = time.perf_counter()
    for _ in collector:
        pass
    seconds = time.perf_counter() - start
    collector.shutdown()
    return seconds


def train_only(args) -> float:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10_000))
    # Frames with the keys the online runs store (the policy's action values, the trajectory
    # ids, the policy version): a sample then reads as many columns as theirs does.
    env = collection_env(ENV_ID, env_kwargs={**_env_kwargs(args), "burn_ms": 0.0})
    policy = with_version_stamp(_model(args).collection_policy())
    collector = Collector(
        env,
        policy,
        frames_per_batch=1_000,
        total_frames=1_000,
        auto_register_policy_transforms=False,
    )
    for frames in collector:
        rb.extend(frames.reshape(-1))
    collector.shutdown()
    clock = StepClock()
    _trainer(args, [clock]).fit(
        _model(args), datamodule=ReplayBufferDataModule(rb, batch_size=BATCH, num_batches=None)
    )
    return clock.seconds


def online(args, asynchronous: bool) -> float:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10_000))
    options = dict(init_random_frames=500, seed=0, env_kwargs=_env_kwargs(args))
    if asynchronous:
        collector = OnlineCollector(
            ENV_ID,
            asynchronous=True,
            run_in=args.run_in,
            frames_per_step=args.frames_per_batch,
            sync_every_n_steps=args.sync_every,
            **options,
        )
        limiter = SamplesPerInsert(
            samples_per_insert=BATCH, min_size=500, error_buffer=args.error_batches * BATCH
        )
    else:
        collector = OnlineCollector(ENV_ID, frames_per_step=1, **options)
        limiter = None
    clock = StepClock()
    dm = ReplayBufferDataModule(rb, batch_size=BATCH, num_batches=None, rate_limiter=limiter)
    _trainer(args, [collector, clock]).fit(_model(args), datamodule=dm)
    if limiter is not None and args.verbose:
        print(
            f"  trainer waited {limiter.trainer_wait_s:.2f} s, collector {limiter.collector_wait_s:.2f} s"
        )
    return clock.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1_500)
    parser.add_argument("--env-ms", type=float, default=1.0)
    parser.add_argument("--train-ms", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run-in", choices=["process", "thread"], default="process")
    parser.add_argument("--sync-every", type=int, default=10, help="sync_every_n_steps")
    parser.add_argument(
        "--frames-per-batch", type=int, default=8, help="frames the worker delivers at a time"
    )
    parser.add_argument(
        "--error-batches", type=int, default=2, help="the limiter's error_buffer, in batches"
    )
    parser.add_argument("--verbose", action="store_true", help="print each side's waits")
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = {
        "collect_only": functools.partial(collect_only, args),
        "train_only": functools.partial(train_only, args),
        "sync": functools.partial(online, args, False),
        "async": functools.partial(online, args, True),
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            seconds[name].append(run())
    median = {name: statistics.median(values) for name, values in seconds.items()}
    bound = max(median["collect_only"], median["train_only"])
    print(
        f"{args.steps} steps, 1 frame per step; env {args.env_ms:g} ms/step, "
        f"train +{args.train_ms:g} ms/step; async in a {args.run_in}; "
        f"medians of {args.repeats}"
    )
    print(f"{'run':<14}{'seconds':>9}{'x max(collect, train)':>24}")
    for name, value in median.items():
        print(f"{name:<14}{value:>9.2f}{value / bound:>24.2f}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
