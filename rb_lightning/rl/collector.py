"""``OnlineCollector``: grow the replay buffer from a live environment while ``Trainer.fit`` runs."""

from __future__ import annotations

import functools
import math
from collections import deque
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from tensordict import TensorDict
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torchrl.collectors import Collector
from torchrl.data import ReplayBuffer
from torchrl.data.postprocs import MultiStep
from torchrl.envs import EnvBase

from rb_lightning.buffers.handles import resolve_buffer
from rb_lightning.errors import ArgumentTypeError, UsageError
from rb_lightning.policy_version import POLICY_VERSION_KEY
from rb_lightning.rl.acting import (
    EPISODE_RETURN_KEY,
    StoredFrames,
    acting_policy,
    check_policy_fits_env,
    collection_env,
    n_step_transform,
    shares_parameters,
)
from rb_lightning.rl.background import (
    BackgroundCollection,
    CollectionMode,
    Delivery,
    StartMethod,
    WrittenRows,
    check_start_method,
    with_version_stamp,
)
from rb_lightning.rl.randomness import CollectionRandomness, rank_seed
from rb_lightning.rl.telemetry import CollectionTelemetry
from rb_lightning.stream.rate_limiter import SamplesPerInsert
from rb_lightning.validation import (
    check_keys,
    check_non_negative_int,
    check_positive_int,
    check_replay_buffer,
)

WARM_UP_CHUNK = 1_000


class OnlineCollector(Callback):
    """Collect environment frames into the training buffer between gradient steps.

    Wraps a torchrl :class:`~torchrl.collectors.Collector` around the
    LightningModule's acting policy and writes what it collects into the replay
    buffer that the DataModule samples from:

    * ``on_fit_start`` (before the first training batch is drawn): a warm-up
      with uniformly random actions until the buffer holds ``init_random_frames``
      items (rounded up to equal chunks of at most 1000 frames). A buffer that
      already holds them, e.g. restored on resume, gets no warm-up.
    * ``on_train_batch_end`` of every ``every_n_steps``-th batch:
      ``frames_per_step`` frames with the module's policy; with the DataModule's
      ``rate_limiter``, instead, a batch's worth whenever the limiter asks.

    With ``asynchronous=True`` the environment runs beside training instead
    (:mod:`rb_lightning.rl.background`), acting with a copy of the policy that gets the
    weights every ``sync_every_n_steps`` optimizer steps; the DataModule's
    ``rate_limiter`` (if any) holds back whichever side runs ahead. Every frame carries
    ``policy_version``, the optimizer step whose weights acted. The policy is
    ``pl_module.collection_policy()``; its contract is in docs/online-rl.md
    ("Your own module").

    Logged: ``episode_return`` (mean of the last ``return_window`` episodes, in the
    progress bar), ``buffer_size``, ``frames``, ``samples_per_s`` and ``replay/*``.

    Args:
        env: A gymnasium id for torchrl's ``GymEnv`` (e.g. ``"CartPole-v1"``), or
            a torchrl ``EnvBase``. A ``RewardSum`` transform is added when the
            environment does not already write ``"episode_reward"``.

    Keyword Args:
        init_random_frames: Buffer size to reach with random-action frames
            before training starts.
        frames_per_step: Frames collected after each collecting training step
            (asynchronous: frames per batch the collector delivers).
        every_n_steps: Collect after every n-th training batch (synchronous only).
        env_kwargs: Keyword arguments for ``GymEnv`` when ``env`` is a string
            (e.g. ``{"categorical_action_encoding": True}``).
        num_envs: Copies of the environment stepped together in this process
            (gymnasium's ``SyncVectorEnv``); each collector call then writes
            ``frames_per_step`` frames spread over the copies. Cheap environments
            collect several times faster per frame with 8-32 copies.
        max_frames_per_traj: Reset an episode after this many frames (``None``:
            the environment's own limit).
        return_window: Number of most recent episodes averaged in ``episode_return``.
        replay_buffer: The buffer to write to. ``None`` (default): the
            DataModule's ``replay_buffer``.
        member: With a :class:`~rb_lightning.BufferMixture` as the buffer: the
            name of the member to write to (e.g. ``"online"``); the other
            members stay as they are. ``init_random_frames`` then counts that
            member's items.
        seed: Seed of the environment and the exploration, with the DDP rank
            (:mod:`rb_lightning.rl.randomness`). ``None``: drawn from torch's global
            generator, so ``seed_everything`` makes the run reproducible.
        exclude_keys: Keys of collected frames that are not written to the buffer.
        keys: The only keys written to the buffer (nested keys as lists in YAML,
            ``[next, reward]``); ``None``: all. Storing only what the learner
            reads makes every sample (and checkpoint) cheaper: a CartPole
            frame from the collector has some 20 entries, DQN reads 6.
        n_steps: Store n-step transitions (torchrl's ``MultiStep``): the reward
            is the discounted sum of the next ``n_steps`` rewards, ``("next", ...)``
            the state ``n_steps`` later (or the episode's end), and
            ``"steps_to_next_obs"`` how many steps that is, for a target
            discounted by ``gamma ** steps_to_next_obs`` (as :class:`DQN` does).
        gamma: Discount of the n-step rewards. ``None``: the module's
            ``hparams.gamma``.
        asynchronous: Collect beside training instead of between its steps.
        run_in: Where asynchronous collection runs: ``"process"`` (parallel on
            CPU; ``env`` must be a gymnasium id) or ``"thread"``.
        sync_every_n_steps: Asynchronous: send the policy's weights to the
            collector every this many optimizer steps.
        start_method: How ``run_in="process"`` starts its worker (``multiprocessing``'s
            ``"spawn"``, ``"fork"``, ``"forkserver"``); ``None``: torchrl's default
            (``"spawn"``, unless the program set one). ``"fork"`` starts in a fraction
            of a second instead of importing everything anew (seconds); CPU only.

    Examples:
        >>> import lightning as L
        >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        >>> from rb_lightning import ReplayBufferDataModule
        >>> from rb_lightning.rl import DQN, OnlineCollector
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(1_000))
        >>> collector = OnlineCollector(
        ...     "CartPole-v1", env_kwargs={"categorical_action_encoding": True},
        ...     init_random_frames=64, frames_per_step=2, seed=0)
        >>> trainer = L.Trainer(max_steps=5, callbacks=[collector], logger=False,
        ...                     enable_checkpointing=False, enable_progress_bar=False,
        ...                     enable_model_summary=False)
        >>> trainer.fit(DQN(observation_size=4, num_actions=2),
        ...             datamodule=ReplayBufferDataModule(rb, batch_size=32, num_batches=None))
        >>> collector.frames, len(rb)  # 64 warm-up frames + 5 steps x 2 frames
        (74, 74)
    """

    def __init__(
        self,
        env: str | EnvBase,
        *,
        init_random_frames: int = 1_000,
        frames_per_step: int = 1,
        every_n_steps: int = 1,
        env_kwargs: dict[str, Any] | None = None,
        num_envs: int = 1,
        max_frames_per_traj: int | None = None,
        return_window: int = 10,
        replay_buffer: ReplayBuffer | None = None,
        member: str | None = None,
        seed: int | None = None,
        exclude_keys: list[str] | None = None,
        keys: list[NestedKey] | None = None,
        n_steps: int = 1,
        gamma: float | None = None,
        asynchronous: bool = False,
        run_in: CollectionMode = "process",
        sync_every_n_steps: int = 1,
        start_method: StartMethod | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(env, (str, EnvBase)):
            raise ArgumentTypeError(
                "env",
                f"env must be a gymnasium id such as 'CartPole-v1' or a torchrl EnvBase, got "
                f"{type(env).__name__}.",
            )
        if env_kwargs and not isinstance(env, str):
            raise UsageError(
                "env_kwargs", "env_kwargs only applies when env is a gymnasium id (a string)."
            )
        self.env = env
        self.env_kwargs = dict(env_kwargs or {})
        self.num_envs = check_positive_int(num_envs, "num_envs")
        if num_envs > 1 and not isinstance(env, str):
            raise UsageError(
                "num_envs",
                "num_envs applies when env is a gymnasium id (a string); batch a torchrl env "
                "yourself (e.g. torchrl.envs.SerialEnv) and pass it with num_envs=1.",
            )
        self.init_random_frames = check_non_negative_int(init_random_frames, "init_random_frames")
        self.frames_per_step = check_positive_int(frames_per_step, "frames_per_step")
        self.every_n_steps = check_positive_int(every_n_steps, "every_n_steps")
        self.max_frames_per_traj = check_positive_int(
            max_frames_per_traj, "max_frames_per_traj", allow_none=True
        )
        self.return_window = check_positive_int(return_window, "return_window")
        self.replay_buffer = None if replay_buffer is None else check_replay_buffer(replay_buffer)
        self.member = member
        self.seed = seed
        self.exclude_keys = list(exclude_keys or [])
        self.keys = check_keys(keys)
        self.n_steps = check_positive_int(n_steps, "n_steps")
        self.gamma = gamma
        self.asynchronous = bool(asynchronous)
        if run_in not in ("process", "thread"):
            raise UsageError("run_in", f"run_in must be 'process' or 'thread', got {run_in!r}.")
        if asynchronous and run_in == "process" and not isinstance(env, str):
            raise UsageError(
                "run_in",
                "run_in='process' builds the environment in the worker process, from a "
                "gymnasium id: pass env as a string, or use run_in='thread' for a torchrl env "
                "object.",
            )
        self.run_in: CollectionMode = run_in
        self.sync_every_n_steps = check_positive_int(sync_every_n_steps, "sync_every_n_steps")
        self.start_method = check_start_method(start_method, asynchronous and run_in == "process")
        self._background: BackgroundCollection | None = None
        self._multi_step: MultiStep | None = None
        self.frames = 0
        self.episodes = 0
        self.recent_returns: deque[float] = deque(maxlen=self.return_window)
        self.collector: Collector | None = None
        self._iterator: Any = None
        self._policy: TensorDictModuleBase | None = None
        self._copies_policy = False
        self._stored_frames: StoredFrames | None = None
        self._restored_rows_learned: int | None = None
        self._telemetry = CollectionTelemetry()
        self._rate_limiter: SamplesPerInsert | None = None
        self._trainer: Trainer | None = None
        self._randomness: CollectionRandomness | None = None

    # -- setup ------------------------------------------------------------------------------
    def make_env(self, num_envs: int | None = None) -> EnvBase:
        """The collector's environment (a new one for a gymnasium id), with episode returns.

        Args:
            num_envs: Copies stepped together; ``None``: the collector's ``num_envs``.
        """
        copies = self.num_envs if num_envs is None else num_envs
        return collection_env(self.env, copies, self.env_kwargs)

    def _resolve_buffer(self, trainer: Trainer) -> ReplayBuffer:
        # The buffer's handle says where a collector writes (a mixture: the named member).
        return resolve_buffer(self._target_buffer(trainer)).writer(self.member)

    def _target_buffer(self, trainer: Trainer) -> ReplayBuffer:
        if self.replay_buffer is not None:
            return self.replay_buffer
        buffer = getattr(trainer.datamodule, "replay_buffer", None)  # type: ignore[attr-defined]  # set by Lightning's connectors, undeclared on Trainer
        if not isinstance(buffer, ReplayBuffer):
            raise UsageError(
                "replay_buffer",
                "OnlineCollector has no replay buffer to fill: pass replay_buffer=... or train "
                "with a DataModule that has a `replay_buffer` (rb_lightning.ReplayBufferDataModule).",
            )
        return buffer

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Fail at setup, not mid-fit, when there is no buffer to fill or nobody would see it."""
        if stage != "fit":
            return
        self._resolve_buffer(trainer)
        workers = getattr(trainer.datamodule, "num_workers", 0)  # type: ignore[attr-defined]  # set by Lightning's connectors, undeclared on Trainer
        if self.replay_buffer is None and workers:
            raise UsageError(
                "num_workers",
                f"OnlineCollector writes into the buffer in the training process, but the "
                f"DataModule samples it in num_workers={workers} worker processes that hold "
                "their own copy and would never see a collected frame. Use num_workers=0 "
                "(sampling in-process is fast).",
            )

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Build the collector, run the warm-up (before the first batch), join the rate limiter."""
        self._buffer = self._resolve_buffer(trainer)
        self._trainer = trainer
        limiter = getattr(trainer.datamodule, "rate_limiter", None)  # type: ignore[attr-defined]  # set by Lightning's connectors, undeclared on Trainer
        self._rate_limiter = limiter if isinstance(limiter, SamplesPerInsert) else None
        env = self.make_env()
        seed = rank_seed(self.seed, trainer.global_rank)
        env.set_seed(seed)
        if self._randomness is None:  # a resumed run continues its saved stream
            self._randomness = CollectionRandomness(seed)
        self._policy = acting_policy(pl_module)
        self._multi_step = n_step_transform(self.n_steps, self.gamma, pl_module)
        self._stored_frames = StoredFrames(
            multi_step=self._multi_step,
            keys=self.keys,
            exclude_keys=self.exclude_keys,
            n_steps=self.n_steps,
            on_returns=self._record_returns,
        )
        check_policy_fits_env(self._policy, env)
        with self._randomness.active():
            self._warm_up(env, pl_module)
        if len(self._buffer) == 0:  # before a worker starts for nothing
            raise UsageError(
                "init_random_frames",
                "The replay buffer is still empty when training starts: set "
                "init_random_frames >= 1 or fill the buffer before fit.",
            )
        frames_per_call = self.frames_per_step
        if self._rate_limiter is not None and not self.asynchronous:  # a batch's worth, when asked
            batch_size = int(getattr(trainer.datamodule, "batch_size", 1))  # type: ignore[attr-defined]  # set by Lightning's connectors, undeclared on Trainer
            frames_per_call = self._rate_limiter.inserts_per_batch(batch_size, self.num_envs)
        if self.asynchronous:
            self._start_background(env, seed, trainer.global_step)
        else:
            self.collector = self._make_collector(env, pl_module, frames_per_call)
            self._copies_policy = not shares_parameters(self.collector.policy, self._policy)
            self._iterator = iter(self.collector)
        if self._rate_limiter is not None:
            self._rate_limiter.insert_on_demand(self._collect_on_demand)
        self._telemetry = CollectionTelemetry()  # a clock per fit, from its first step

    def _start_background(self, env: EnvBase, seed: int, version: int) -> None:
        assert self._policy is not None
        make_env: Any = (
            functools.partial(collection_env, self.env, self.num_envs, self.env_kwargs)
            if self.run_in == "process"
            else (lambda: env)
        )
        limiter = self._rate_limiter
        self._background = BackgroundCollection(
            make_env,
            with_version_stamp(self._policy),
            frames_per_batch=self.frames_per_step,
            mode=self.run_in,
            seed=seed,
            version=version,
            max_frames_per_traj=self.max_frames_per_traj,
            before_next=None if limiter is None else limiter.wait_for_insert,
            on_stored=None if limiter is None else limiter.wake,
            start_method=self.start_method,
            start_timeout=60.0 if limiter is None else limiter.timeout,
            write_into=self._buffer,
            postproc=self._stored_frames,
            rows_learned=self._restored_rows_learned,
        )
        if self.run_in == "process":  # the worker builds its own; this one did the warm-up
            env.close()

    def _make_collector(
        self, env: EnvBase, pl_module: LightningModule, frames_per_batch: int, **kwargs: Any
    ) -> Collector:
        return Collector(
            env,
            self._policy,
            frames_per_batch=frames_per_batch,
            total_frames=-1,
            max_frames_per_traj=self.max_frames_per_traj,
            policy_device=pl_module.device,
            storing_device="cpu",
            auto_register_policy_transforms=False,
            **kwargs,
        )

    def _warm_up(self, env: EnvBase, pl_module: LightningModule) -> None:
        # A collector of its own, in chunks of up to WARM_UP_CHUNK frames: one frame per
        # rollout costs several times more per frame. It runs the module's policy with
        # random actions, so the stored keys match the frames collected later.
        missing = self.init_random_frames - len(self._buffer)
        if missing <= 0:
            return
        chunks = math.ceil(missing / WARM_UP_CHUNK)
        # Each chunk is whole steps of all the environment copies.
        chunk = math.ceil(missing / chunks / self.num_envs) * self.num_envs
        warm_up = self._make_collector(env, pl_module, chunk, init_random_frames=chunks * chunk)
        iterator = iter(warm_up)
        for _ in range(chunks):
            self._store(next(iterator))
        warm_up.shutdown(close_env=False)

    # -- collection -------------------------------------------------------------------------
    def _collect(self) -> None:
        if self._copies_policy:
            assert self.collector is not None and self._policy is not None
            self.collector.update_policy_weights_(TensorDict.from_module(self._policy))
        assert self._randomness is not None
        with self._randomness.active():
            frames = next(self._iterator)
        self._store(frames)

    def _collect_on_demand(self) -> int:
        """The rate limiter's call for frames: one collector call, or the next batch delivered."""
        before = self.frames
        if self._background is not None and self._rate_limiter is not None:
            self._background.take(self._rate_limiter.timeout, self._store)
        else:
            self._collect()
        return self.frames - before

    def _store(self, delivery: Delivery) -> None:
        if isinstance(delivery, WrittenRows):  # the worker process wrote them itself
            self._record_returns(delivery.returns)
            count = delivery.numel()
        else:
            frames = delivery  # stamped with the step whose weights acted, unless the policy did
            if POLICY_VERSION_KEY not in frames.keys():
                version = torch.full(frames.shape, self._trainer_step(), dtype=torch.int64)
                frames.set(POLICY_VERSION_KEY, version)
            assert self._stored_frames is not None
            rows = self._stored_frames(frames)
            self._buffer.extend(rows)
            count = rows.numel()
        self.frames += count
        if self._rate_limiter is not None:
            self._rate_limiter.record_insert(count)

    def _trainer_step(self) -> int:  # the policy version of what is collected now
        return self._trainer.global_step if self._trainer is not None else 0

    def _record_returns(self, returns: list[float]) -> None:
        self.recent_returns.extend(returns)
        self.episodes += len(returns)

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Sync weights, collect ``frames_per_step`` frames, log progress."""
        if self._background is not None:
            if trainer.global_step % self.sync_every_n_steps == 0:
                self._background.sync(trainer.global_step)
            self._background.ready(self._store)
        elif self.collector is None:
            return
        elif self._rate_limiter is None and trainer.global_step % self.every_n_steps == 0:
            # The optimizer-step count, not a batch counter of this process: a resumed run
            # keeps the collection phase of the run it continues. A rate limiter asks instead.
            self._collect()
        self._telemetry.log(
            trainer, pl_module, batch, batch_idx, mean_return=self.mean_return,
            frames=self.frames, buffer_size=lambda: len(self._buffer), limiter=self._rate_limiter,
        )  # fmt: skip

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Close the environment, the collector's thread and its worker process."""
        self._close()

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        """Close everything on an exception or Ctrl-C too (Lightning skips ``teardown`` then)."""
        self._close()

    def _close(self) -> None:
        if self._background is not None:
            background, self._background = self._background, None
            background.close()
        if self._rate_limiter is not None:
            self._rate_limiter.insert_on_demand(None)
        if self.collector is not None:
            self.collector.shutdown()
            self.collector = None
            self._iterator = None

    # -- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Counters saved in checkpoints (the buffer itself is the DataModule's business)."""
        state = {
            "frames": self.frames,
            "episodes": self.episodes,
            "recent_returns": list(self.recent_returns),
        }
        writes = None if self._background is None else self._background.writes
        if writes is not None:  # a resumed run learns the rows the worker wrote past it first
            state["rows_learned"] = writes.rows_learned
        if self._randomness is not None:
            state["rng_state"] = self._randomness.state.clone()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.frames = int(state_dict["frames"])
        self.episodes = int(state_dict["episodes"])
        self.recent_returns = deque(state_dict["recent_returns"], maxlen=self.return_window)
        self._restored_rows_learned = state_dict.get("rows_learned")
        if "rng_state" in state_dict:
            self._randomness = CollectionRandomness(0)
            self._randomness.state = state_dict["rng_state"]

    @property
    def mean_return(self) -> float:
        """Mean return of the last ``return_window`` finished episodes (NaN before the first)."""
        if not self.recent_returns:
            return math.nan
        return sum(self.recent_returns) / len(self.recent_returns)


__all__ = ["EPISODE_RETURN_KEY", "OnlineCollector"]
