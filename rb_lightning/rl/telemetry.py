"""What an online collector logs: returns, frames, throughput and the replay counters.

Examples:
    >>> telemetry = CollectionTelemetry()
    >>> telemetry.start(step=0)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from tensordict import TensorDictBase

from rb_lightning.policy_version import POLICY_VERSION_KEY, staleness
from rb_lightning.stream.rate_limiter import SamplesPerInsert

__all__ = ["CollectionTelemetry"]


class CollectionTelemetry:
    """Log a collector's numbers through the LightningModule, on Lightning's cadence.

    Each ``pl_module.log`` call costs a metric update (about 0.7 ms on a CPU, as much as a
    small network's training step), so nothing is logged per episode: the mean return is
    logged with the rest every ``log_every_n_steps`` (a written row always has it), and
    also on the last step of an epoch and of the fit, where callbacks such as
    ``EarlyStopping`` read it. The progress bar shows the return as of then.
    """

    def __init__(self) -> None:
        self._clock: tuple[float, int] | None = None

    def start(self, step: int) -> None:
        """Start the throughput clock (done by the first :meth:`log` of this process)."""
        self._clock = (time.perf_counter(), step)

    def log(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        batch: Any,
        batch_idx: int,
        *,
        mean_return: float,
        frames: int,
        buffer_size: Callable[[], int],
        limiter: SamplesPerInsert | None,
    ) -> None:
        """Log this step's numbers (the replay counters only with a rate limiter).

        ``buffer_size`` is called on the logging cadence only: for a Ray buffer it is a
        round trip to the actor, which every step would pay for.
        """

        def log(name: str, value: float, prog_bar: bool = False) -> None:
            pl_module.log(
                name, value, prog_bar=prog_bar, on_step=True, on_epoch=False, batch_size=1
            )

        step = trainer.global_step
        every = trainer.log_every_n_steps  # type: ignore[attr-defined]  # set by Lightning's connectors, undeclared on Trainer
        on_cadence = step % every == 0
        last_of_epoch = batch_idx + 1 == trainer.num_training_batches
        last_of_fit = 0 < trainer.max_steps <= step
        if (on_cadence or last_of_epoch or last_of_fit) and not math.isnan(mean_return):
            log("episode_return", mean_return, prog_bar=True)
        if self._clock is None:
            # Started by the first step of this process: on_fit_start comes before Lightning
            # restores a resumed run's global step (a clock started there counted every step
            # of the run before the resume: samples_per_s 8x too high in its first row).
            self.start(step)
        if not on_cadence:
            return
        assert self._clock is not None
        now, (then, then_step) = time.perf_counter(), self._clock
        rows = batch.batch_size[0] if isinstance(batch, TensorDictBase) and batch.batch_dims else 1
        log("samples_per_s", (step - then_step) * rows / max(now - then, 1e-9))
        log("buffer_size", float(buffer_size()))
        log("frames", float(frames))
        self._clock = (now, step)
        versions = (
            batch.get(POLICY_VERSION_KEY, None) if isinstance(batch, TensorDictBase) else None
        )
        if versions is not None:
            log("replay/staleness_mean", float(staleness(step, versions).float().mean()))
        if limiter is not None:
            log("replay/inserted", float(limiter.inserted))
            log("replay/sampled", float(limiter.sampled))
            # The one replay number worth a place in the progress bar: is the ratio held?
            log("replay/samples_per_insert", limiter.samples_per_insert_observed(), prog_bar=True)
            log("replay/trainer_wait_s", limiter.trainer_wait_s)
            log("replay/collector_wait_s", limiter.collector_wait_s)
