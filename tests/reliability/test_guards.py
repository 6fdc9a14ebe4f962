"""Guards against ordinary hostile events: poisoned priorities, a buffer emptied mid-fit, numpy ints."""

from __future__ import annotations

import logging

import lightning as L
import numpy as np
import pytest
import torch
from rb_testdata import make_transitions
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import PrioritizedSampler
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule, ReplayBufferDataset
from rb_lightning.buffers.priorities import InvalidPriorityError, check_priority
from rb_lightning.distributed.ray import RayReplayBufferView

ITEMS = 2_000


def _prioritized_datamodule(**kwargs) -> ReplayBufferDataModule:
    rb = ReplayBuffer(
        storage=LazyTensorStorage(ITEMS),
        sampler=PrioritizedSampler(ITEMS, alpha=0.7, beta=0.5),
        generator=torch.Generator().manual_seed(0),
    )
    rb.extend(make_transitions(ITEMS))
    return ReplayBufferDataModule(rb, batch_size=64, **kwargs)


def _distinct_sampled(rb: ReplayBuffer) -> int:
    return len(
        {i for _ in range(20) for i in rb.sample(256, return_info=True)[1]["index"].tolist()}
    )


def _first_batch(dm: ReplayBufferDataModule):
    return next(iter(dm.train_dataloader()))


@pytest.mark.parametrize(
    ("bad", "count"),
    [
        (float("nan"), "16 NaN, 0 infinite and 0 negative"),
        (float("inf"), "0 NaN, 16 infinite"),
        (-1.0, "0 NaN, 0 infinite and 16 negative"),
    ],
)
def test_invalid_priorities_raise_with_count_and_leave_sampler_intact(bad, count):
    dm = _prioritized_datamodule()
    batch = _first_batch(dm)
    priority = torch.rand(64) + 0.1
    priority[:16] = bad
    with pytest.raises(InvalidPriorityError, match=count) as caught:
        dm.update_priority(batch, priority)
    message = str(caught.value)
    assert "out of 64" in message and "invalid_priority='replace'" in message
    assert "check the loss" in message
    # Refused before torchrl saw it: sampling still covers the buffer.
    assert _distinct_sampled(dm.replay_buffer) > 1_000


def test_integer_priorities_pass_and_negative_integers_are_refused():
    assert check_priority(torch.tensor([1, 2])).tolist() == [1, 2]
    with pytest.raises(InvalidPriorityError, match="1 negative"):
        check_priority([3, -1])


def test_replace_mode_swaps_bad_priorities_for_max_counts_them_and_keeps_coverage(caplog):
    dm = _prioritized_datamodule(invalid_priority="replace")
    batch = _first_batch(dm)
    good = torch.full((64,), 0.5)
    good[0] = 4.0  # the current max priority
    dm.update_priority(batch, good)
    batch = _first_batch(dm)
    priority = torch.full((64,), 0.5)
    priority[:10] = float("nan")
    priority[10:13] = float("inf")
    priority[13:16] = -2.0
    with caplog.at_level(logging.WARNING, logger="rb_lightning.buffers.priorities"):
        dm.update_priority(batch, priority)
    assert dm.replaced_priorities == 16
    assert "replaced 16 invalid priorities" in caplog.text and "4" in caplog.text
    sampler = dm.replay_buffer.sampler
    assert float(sampler.default_priority) == pytest.approx(4.0)  # still finite
    assert _distinct_sampled(dm.replay_buffer) > 1_000


def test_invalid_priority_argument_is_checked():
    rb = ReplayBuffer(storage=LazyTensorStorage(10))
    with pytest.raises(ValueError, match="invalid_priority must be 'raise'"):
        ReplayBufferDataModule(rb, invalid_priority="ignore")


def test_ray_view_refuses_nan_before_anything_reaches_the_actor():
    # The guard runs before the actor is contacted: a view with no actor shows it.
    view = RayReplayBufferView.__new__(RayReplayBufferView)
    view.invalid_priority = "raise"
    with pytest.raises(InvalidPriorityError, match="RayReplayBufferView.update_priority"):
        view.update_priority(torch.arange(2), torch.tensor([1.0, float("nan")]))


# -- a buffer emptied during fit -----------------------------------------------------------------
class _Emptier(L.Callback):
    """Empties the buffer after ``at`` batches; optionally refills it from a thread later."""

    def __init__(self, at: int, refill_after: float | None = None) -> None:
        self.at, self.refill_after = at, refill_after

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx + 1 != self.at:
            return
        rb = trainer.datamodule.replay_buffer
        rb.empty()
        if self.refill_after is not None:
            import threading
            import time

            def refill() -> None:
                time.sleep(self.refill_after)
                rb.extend(make_transitions(100))

            threading.Thread(target=refill, daemon=True).start()


class _Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return self.net(batch["obs"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _trainer(callback: L.Callback, steps: int) -> L.Trainer:
    return quiet_trainer(
        max_steps=steps,
        limit_train_batches=steps,
        callbacks=[callback],
    )


def _buffer() -> ReplayBuffer:
    rb = ReplayBuffer(storage=LazyTensorStorage(500), generator=torch.Generator().manual_seed(0))
    rb.extend(make_transitions(200))
    return rb


def test_buffer_emptied_mid_fit_gets_our_message():
    dm = ReplayBufferDataModule(_buffer(), batch_size=8, num_batches=None)
    with pytest.raises(RuntimeError, match="became empty after") as caught:
        _trainer(_Emptier(at=3), steps=10).fit(_Model(), datamodule=dm)
    assert "min_size" in str(caught.value)
    assert "Cannot sample from an empty storage" not in str(caught.value)


def test_buffer_emptied_mid_fit_waits_for_min_size_then_trains_on():
    dm = ReplayBufferDataModule(
        _buffer(), batch_size=8, num_batches=None, min_size=50, wait_timeout=30
    )
    model = _Model()
    _trainer(_Emptier(at=3, refill_after=0.3), steps=8).fit(model, datamodule=dm)
    assert model.steps == 8


def test_buffer_emptied_mid_fit_with_min_size_times_out_with_our_message():
    dm = ReplayBufferDataModule(
        _buffer(), batch_size=8, num_batches=None, min_size=50, wait_timeout=0.3
    )
    with pytest.raises(TimeoutError, match="min_size=50"):
        _trainer(_Emptier(at=2), steps=6).fit(_Model(), datamodule=dm)


# -- integers of any kind -----------------------------------------------------------------------
def test_numpy_and_tensor_integers_are_accepted_bools_are_not(tensor_rb):
    dataset = ReplayBufferDataset(tensor_rb, np.int64(8), num_batches=np.int32(2))
    assert dataset.batch_size == 8 and type(dataset.batch_size) is int
    assert len(list(dataset)) == 16
    dm = ReplayBufferDataModule(
        tensor_rb, batch_size=torch.tensor(16), num_batches=np.int64(3), num_workers=np.uint8(0)
    )
    assert (dm.batch_size, dm.num_batches, dm.num_workers) == (16, 3, 0)
    assert type(dm.num_batches) is int
    for bad in (True, np.bool_(True), 8.0, torch.tensor(8.0), torch.tensor([8])):
        with pytest.raises(ValueError, match="batch_size must be a positive integer"):
            ReplayBufferDataset(tensor_rb, bad)
