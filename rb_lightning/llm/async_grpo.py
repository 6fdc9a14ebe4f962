"""``AsyncGRPOModule``: GRPO whose groups are generated in a worker process beside training.

A :class:`~rb_lightning.llm.generation_worker.GenerationWorker` generates batch ``i + 1``
(up to ``max_staleness`` ahead) while the trainer trains step ``i``. Batch ``i`` is made
with weights of version ``>= i - max_staleness``, and the ``GroupSampler`` refuses anything
older (counted in ``async/groups_dropped``); weights are pushed every ``weight_sync_every``
optimizer steps (at most ``max_staleness + 1``, or the worker could wait forever);
``off_policy_correction="auto"`` is ``"decoupled"`` whenever ``max_staleness > 0``. Groups
received are in the buffer and so in every checkpoint; those in flight when a run stops
are generated again on resume. Runs are not bit-exact; ``configs/llm_grpo.yaml`` is the
exact, synchronous one.

Examples:
    From the command line (docs/llm.md)::

        python train.py fit --config configs/llm_grpo_async.yaml \
            --model.init_from runs/llm_sft/version_0/checkpoints/last.ckpt
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from tensordict import TensorDictBase
from transformers import PretrainedConfig

from rb_lightning.errors import BufferStateError, UsageError
from rb_lightning.llm.generation_worker import GenerationWorker
from rb_lightning.llm.grpo import OFF_POLICY_CORRECTIONS, GRPOModule
from rb_lightning.policy_version import POLICY_VERSION_KEY

__all__ = ["AsyncGRPOModule"]


class _StopsTheWorker(Callback):
    """Stops the worker however the run ends (Lightning calls no module hook on an exception)."""

    def __init__(self, module: AsyncGRPOModule) -> None:
        self.module = module

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        self.module.stop_worker()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.module.stop_worker()


class AsyncGRPOModule(GRPOModule):
    """GRPO with generation in a worker process, at most ``max_staleness`` versions behind.

    Takes every argument of :class:`~rb_lightning.llm.grpo.GRPOModule` (``beta`` must be 0),
    and:

    Keyword Args:
        off_policy_correction: ``"auto"`` (default): ``"decoupled"`` when the sampler's
            ``max_staleness > 0``, else ``"none"``.
        weight_sync_every: Push the weights to the worker every this many optimizer steps
            (``1 <= weight_sync_every <= max_staleness + 1``).
        start_method: How the worker starts: ``"spawn"`` (~6 s of imports on 2 cores) or
            ``"fork"`` (``configs/llm_grpo_async.yaml``: at once, CPU only).
        worker_timeout: Seconds the trainer waits for one batch (the first includes the start).
    """

    def __init__(
        self,
        config: PretrainedConfig,
        *,
        off_policy_correction: str = "auto",
        weight_sync_every: int = 1,
        start_method: str = "spawn",
        worker_timeout: float = 300.0,
        **kwargs: Any,
    ) -> None:
        if off_policy_correction not in (*OFF_POLICY_CORRECTIONS, "auto"):
            raise UsageError(
                "off_policy_correction",
                f"off_policy_correction must be 'auto' or one of {list(OFF_POLICY_CORRECTIONS)}, "
                f"got {off_policy_correction!r}.",
            )
        if (
            isinstance(weight_sync_every, bool)
            or not isinstance(weight_sync_every, int)
            or (weight_sync_every < 1)
        ):
            raise UsageError(
                "weight_sync_every",
                f"weight_sync_every must be an int >= 1 (optimizer steps between weight "
                f"pushes to the generation worker), got {weight_sync_every!r}.",
            )
        if kwargs.get("beta", 0.0):
            raise UsageError(
                "beta",
                f"beta={kwargs['beta']}: AsyncGRPOModule's worker computes no reference "
                "log-probs, so it trains without a KL term. Set beta: 0.0, or use GRPOModule "
                "(configs/llm_grpo.yaml) for a KL to the starting model.",
            )
        super().__init__(
            config,
            off_policy_correction="none"
            if off_policy_correction == "auto"
            else off_policy_correction,
            **kwargs,
        )
        self.save_hyperparameters(ignore=["task"])
        if isinstance(self.hparams.get("config"), PretrainedConfig):  # as GRPOModule
            self.hparams["config"] = self.model.config.to_dict()
        self._correction_setting = off_policy_correction
        self.weight_sync_every = weight_sync_every
        self.start_method = start_method
        self.worker_timeout = float(worker_timeout)
        self.max_staleness = 0
        self._worker: GenerationWorker | None = None
        self._pushed_version = -1
        self._stats: dict[str, float] = {}
        self._reset_stats()
        self._last_groups: TensorDictBase | None = None
        self._received_upto = 0

    def configure_callbacks(self) -> list[Callback]:
        return [_StopsTheWorker(self)]

    # -- setup ------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """The synchronous checks, and those of the asynchronous loop (fit)."""
        super().setup(stage)
        if stage != "fit":
            return
        assert self._sampler is not None
        sampler_arg = "data.init_args.replay_buffer.init_args.sampler.init_args"
        staleness = self._sampler.max_staleness
        if staleness is None:
            raise UsageError(
                f"{sampler_arg}.max_staleness",
                "AsyncGRPOModule needs a staleness bound: the GroupSampler's max_staleness is "
                "null. Set it to the number of policy versions a trained group may lag behind "
                "the learner (1, 2 or 4; configs/llm_grpo_async.yaml uses 2).",
            )
        if self._sampler.order != "oldest":
            raise UsageError(
                f"{sampler_arg}.order",
                f"AsyncGRPOModule trains each generated batch once, in order: the GroupSampler "
                f"needs order: oldest, it has {self._sampler.order!r}.",
            )
        if self.weight_sync_every > staleness + 1:
            raise UsageError(
                "model.init_args.weight_sync_every",
                f"weight_sync_every={self.weight_sync_every} with max_staleness={staleness}: "
                "the worker would wait for weights the trainer does not send yet. Use "
                f"weight_sync_every <= {staleness + 1} (max_staleness + 1).",
            )
        batch_groups = int(self.trainer.datamodule.batch_size) // self.num_generations  # type: ignore[attr-defined]  # set by Lightning's connectors
        if self.prompts_per_step != batch_groups:
            raise UsageError(
                "model.init_args.prompts_per_step",
                f"prompts_per_step={self.prompts_per_step}, but a batch holds {batch_groups} "
                "groups: the asynchronous loop trains each generated batch exactly once. "
                "Leave prompts_per_step unset (null).",
            )
        if self._world_size() > 1:
            raise UsageError(
                "trainer.devices",
                "AsyncGRPOModule runs on one device (one trainer, one generation worker). "
                "Use configs/llm_grpo.yaml for DDP.",
            )
        if self.start_method == "fork" and torch.cuda.is_initialized():
            raise UsageError(
                "model.init_args.start_method",
                "start_method='fork' copies the training process, which has initialised CUDA: "
                "a forked worker cannot use it. Use start_method: spawn on GPU machines.",
            )
        self.max_staleness = staleness
        if self._correction_setting == "auto":
            self.off_policy_correction = "decoupled" if staleness > 0 else "none"

    def on_fit_start(self) -> None:
        super().on_fit_start()
        versions = "version" if self.max_staleness == 1 else "versions"
        rank_zero_info(
            f"asynchronous GRPO: groups generated in a worker process with weights at most "
            f"{self.max_staleness} policy {versions} old (GroupSampler max_staleness), pushed "
            f"every {self.weight_sync_every} step(s); off-policy correction: "
            f"{self.off_policy_correction}. Runs are not bit-exact; configs/llm_grpo.yaml is."
        )

    def on_train_start(self) -> None:
        """Start the worker with the weights the fit starts from (restored on a resume)."""
        assert self._buffer is not None
        storage = self._buffer.storage
        first = 0
        self._received_upto = 0
        if not getattr(storage, "initialized", True):
            # A fresh run: the storage takes its columns from one unscored batch now, so that
            # it exists (in shared memory) before the worker starts writing into it.
            self._buffer.extend(self.generate_groups(0, version=0, scored=False))
            self._buffer.empty()
        if len(storage):
            # A resumed run: generation continues after the last batch in the buffer.
            self._received_upto = int(self._buffer[: len(storage)]["group"].max()) + 1
            first = self._received_upto // int(self.prompts_per_step or 1)
        self._worker = GenerationWorker(
            self._worker_kwargs(),
            max_staleness=self.max_staleness,
            first_batch=first,
            start_method=self.start_method,
            threads=torch.get_num_threads(),
            write_into=self._buffer,
        )
        rank_zero_info(
            "asynchronous GRPO: the worker writes its groups into the replay buffer itself"
            if self._worker.writes is not None
            else "asynchronous GRPO: the worker sends its groups through a pipe (text columns, "
            "or a buffer torchrl cannot share), the trainer writes them"
        )
        self._push(self.policy_version)

    def _worker_kwargs(self) -> dict[str, Any]:
        names = (
            "num_generations", "max_new_tokens", "temperature", "task", "prompt_width",
            "seed", "store_text",
        )  # fmt: skip
        kwargs = {name: getattr(self, name) for name in names}
        kwargs.update(
            seed=self.run_seed,
            config=self.model.config,
            prompts_per_step=self.prompts_per_step,
            rewards=list(self.reward_names),
        )
        return kwargs

    def _push(self, version: int) -> None:
        assert self._worker is not None
        self._worker.push_weights(self.model.state_dict(), version)
        self._pushed_version = version

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        version = self.policy_version
        if self._worker is not None and version != self._pushed_version:
            if version % self.weight_sync_every == 0:
                self._push(version)

    def stop_worker(self) -> None:
        """Stop the generation worker (idempotent); groups it was generating are dropped."""
        worker, self._worker = self._worker, None
        if worker is not None:
            #: CPU seconds the last worker used (benchmarks/grpo_async.py reads it).
            self.worker_cpu_s = worker.cpu_seconds()
            worker.close()

    def on_train_end(self) -> None:
        self.stop_worker()

    # -- training ---------------------------------------------------------------------------
    def _reset_stats(self) -> None:
        self._stats = {"trainer_wait": 0.0, "generation_wait": 0.0, "steps": 0.0, "batches": 0.0}

    def _store(self, received: tuple[int, TensorDictBase, float]) -> None:
        assert self._buffer is not None
        _, groups, waited = received
        if self._worker is None or self._worker.writes is None:  # else the worker wrote them
            self._buffer.extend(groups)
        self._received_upto = int(groups["group"].max()) + 1
        self._last_groups = groups
        self._stats["generation_wait"] += waited
        self._stats["batches"] += 1

    def training_step(self, dataloader_iter: Iterator[Any]) -> torch.Tensor:
        """Take what the worker generated, wait for this step's batch, train on it."""
        if self._buffer is None or self._sampler is None or self._worker is None:
            raise BufferStateError(
                "AsyncGRPOModule has no buffer or generation worker: train it with "
                "Trainer.fit and a ReplayBufferDataModule."
            )
        start = time.perf_counter()
        version = self.policy_version
        self._sampler.consumer_version = version
        wanted = int(self.prompts_per_step or 1)
        while (received := self._worker.receive(None)) is not None:
            self._store(received)
        # Batches arrive whole and in order: the groups received and not drawn yet are those
        # from the sampler's cursor to the last received (the sampler itself then refuses
        # any older than the bound, and counts them).
        while self._received_upto - self._sampler.next_group < wanted:
            self._store(self._worker.receive(self.worker_timeout))  # type: ignore[arg-type]  # a timeout never returns None
        waited = time.perf_counter() - start
        self._stats["trainer_wait"] += waited
        self._stats["steps"] += 1
        batch, _, _ = next(dataloader_iter)
        if isinstance(batch, TensorDictBase) and batch.device != self.device:
            batch = batch.to(self.device)
        loss, stats = self.grpo_loss(batch)
        if self._writes_logs():
            generated = self._last_groups if self._last_groups is not None else batch
            self._log_step(loss, stats, generated, batch, time.perf_counter() - start)
            self._log_async(batch)
        return loss

    def _log_async(self, batch: TensorDictBase) -> None:
        assert self._sampler is not None
        ages = self.policy_version - batch[POLICY_VERSION_KEY].double()
        size = batch.shape[0]
        steps, batches = max(self._stats["steps"], 1.0), max(self._stats["batches"], 1.0)
        values = {
            "async/staleness_mean": float(ages.mean()),
            "async/staleness_max": float(ages.max()),
            "async/trainer_wait_s": self._stats["trainer_wait"] / steps,
            "async/generation_wait_s": self._stats["generation_wait"] / batches,
            "async/groups_dropped": float(self._sampler.groups_dropped),
        }
        for name, value in values.items():
            self.log(name, value, batch_size=size)
        self._reset_stats()
