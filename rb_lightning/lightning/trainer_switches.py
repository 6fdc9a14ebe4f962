"""How :class:`~rb_lightning.ReplayBufferDataModule` answers the Trainer's switches.

A sampled stream is not a map-style dataset, so a few Trainer switches need an
answer of their own (docs/datasets.md, "Trainer switches", has the table):
``overfit_batches`` repeats the same sampled batches, a model's own
``transfer_batch_to_device`` moves the batches, ``validate``/``test``/``predict``
without data are refused naming the argument, and a weights-only checkpoint,
which holds no buffer, is refused as a place to resume ``fit`` from.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader, IterableDataset

from rb_lightning.errors import UsageError
from rb_lightning.stream.loader import keep_batch

__all__ = [
    "RepeatedBatches",
    "check_stage_has_data",
    "model_dataloader",
    "model_moves_batches",
    "overfit_batch_count",
    "refuse_weights_only_resume",
]


def check_stage_has_data(stage: Any, defined_loaders: set[str]) -> None:
    """Refuse ``validate``/``test``/``predict`` with no loader to read, naming the argument.

    Lightning would ask for the loader later and say only that ``<stage>_dataloader``
    "must be implemented"; the fix is an argument of the DataModule.

    Examples:
        >>> check_stage_has_data("test", {"test_dataloader"})  # a test_buffer: fine
        >>> check_stage_has_data("test", set())
        Traceback (most recent call last):
        ...
        rb_lightning.errors.UsageError: Trainer.test with a ReplayBufferDataModule that has no test_buffer: ...
    """
    stage = str(getattr(stage, "value", stage))  # Lightning passes a TrainerFn
    hook = {"validate": "val", "test": "test", "predict": "predict"}.get(stage)
    if hook is None or f"{hook}_dataloader" in defined_loaders:
        return
    if stage == "predict":
        raise UsageError(
            "eval_from_model",
            "Trainer.predict with a ReplayBufferDataModule: the DataModule has no predict data "
            "(a DataModule given to predict replaces the model's predict_dataloader()). Pass "
            "ReplayBufferDataModule(eval_from_model=True) to predict with the LightningModule's "
            "own predict_dataloader(), or call trainer.predict(model, dataloaders=<your "
            "loader>) without the DataModule.",
        )
    argument = f"{hook}_buffer"
    raise UsageError(
        argument,
        f"Trainer.{stage} with a ReplayBufferDataModule that has no {argument}: there is "
        f"nothing to {stage} on. Give the DataModule a {argument} (a replay buffer read once "
        f"per run, in storage order; a {hook}_source can fill it), or eval_from_model=True to "
        f"use the LightningModule's own {hook}_dataloader() (in a config: "
        f"data.init_args.{argument} or data.init_args.eval_from_model).",
    )


def model_moves_batches(trainer: Any, *, prefetch_to_device: Any) -> bool:
    """Whether the LightningModule overrides ``transfer_batch_to_device``: the DataModule then steps aside (and refuses ``prefetch_to_device``)."""
    model = trainer.lightning_module if trainer is not None else None
    if model is None or not is_overridden("transfer_batch_to_device", model):
        return False
    if prefetch_to_device:
        raise UsageError(
            "prefetch_to_device",
            f"{type(model).__name__} overrides transfer_batch_to_device, so it moves every "
            "batch to the device itself, and prefetch_to_device asks the DataModule to copy "
            "batches ahead: only one of them can. Leave prefetch_to_device off (in a config: "
            "data.init_args.prefetch_to_device: false), or remove the model's "
            "transfer_batch_to_device.",
        )
    return True


def overfit_batch_count(overfit: int | float, num_batches: int | None) -> int:
    """Batches ``Trainer(overfit_batches=overfit)`` repeats: a count, or a fraction of the epoch.

    Examples:
        >>> overfit_batch_count(2, None), overfit_batch_count(0.25, 10)
        (2, 2)
    """
    if isinstance(overfit, int):
        return overfit
    if num_batches is None:
        raise UsageError(
            "overfit_batches",
            f"Trainer(overfit_batches={overfit}) is a fraction of an epoch, and "
            "ReplayBufferDataModule(num_batches=None) streams epochs without a length. Give a "
            "number of batches instead: Trainer(overfit_batches=<int>) (in a config: "
            "trainer.overfit_batches: 4).",
        )
    return max(1, int(num_batches * overfit))


def refuse_weights_only_resume(trainer: Any) -> None:
    """A weights-only checkpoint holds no buffer: refuse it for ``fit``; eval needs none."""
    if trainer is not None and trainer.state.fn != "fit":
        return
    raise UsageError(
        "ckpt_path",
        "This checkpoint was saved with save_weights_only=True: it holds the model's weights "
        "and no replay buffer, optimizer or loop state, so a fit cannot resume from it. "
        "Resume from a full checkpoint (ModelCheckpoint(save_weights_only=False), e.g. "
        "last.ckpt), or start a new fit from these weights by loading them into the model "
        "(model.load_state_dict(torch.load(path)['state_dict'])) and leaving ckpt_path out.",
    )


class RepeatedBatches:
    """``Trainer(overfit_batches=N)``: the same N sampled batches, in order, every epoch.

    Lightning turns shuffling off for overfitting, which a sampled stream has no
    switch for; the batches are drawn once per fit (a resumed fit draws its own).

    Args:
        sample: Makes a dataset of ``n`` sampled batches.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> from rb_lightning.stream.datasets import ReplayBufferBatchDataset
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(100))
        >>> _ = rb.extend(TensorDict({"x": torch.arange(100)}, batch_size=[100]))
        >>> repeated = RepeatedBatches(lambda n: ReplayBufferBatchDataset(rb, 4, num_batches=n))
        >>> first, second = repeated.loader(2), repeated.loader(2)
        >>> [b["x"].tolist() for b in first] == [b["x"].tolist() for b in second]
        True
    """

    def __init__(self, sample: Callable[[int], IterableDataset]) -> None:
        self.sample = sample
        self.batches: list[Any] = []

    def loader(self, count: int, length: int | None = None) -> DataLoader:
        """A loader of the ``count`` batches drawn first (drawn now if not yet), repeated to ``length`` when Lightning takes a fraction of it."""
        if len(self.batches) != count:
            self.batches = list(self.sample(count))
        batches = self.batches * math.ceil((length or count) / count)
        return DataLoader(batches[: length or count], batch_size=None, collate_fn=keep_batch)  # type: ignore[arg-type]


def model_dataloader(trainer: Any, hook: str, argument: str) -> Any:
    """The LightningModule's own ``hook()`` loader (``eval_from_model=True``); ``argument`` is the DataModule buffer named in the error."""
    module = trainer.lightning_module if trainer is not None else None
    if module is None or not is_overridden(hook, module):
        raise UsageError(
            "eval_from_model",
            f"ReplayBufferDataModule(eval_from_model=True) hands {hook}() over to the "
            f"LightningModule, but {type(module).__name__} does not define {hook}(). "
            f"Give the DataModule a {argument} (and a source to fill it) instead, or "
            "use a module that evaluates itself (rb_lightning.rl.DQN / SAC).",
        )
    return getattr(module, hook)()
