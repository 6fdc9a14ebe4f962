"""The Trainer switches a Lightning user turns on, each with a real ``Trainer``: what it does
with a ``ReplayBufferDataModule`` (docs/datasets.md, "Trainer switches", one row per test).

The buffer is a ``TensorDictReplayBuffer`` with a ``PrioritizedSampler`` unless a test says
otherwise; every model updates priorities from its error, as a DQN does.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from lightning.pytorch.tuner import Tuner
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, PrioritizedSampler, RandomSampler
from torchrl.data import TensorDictReplayBuffer as Buffer
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule
from rb_lightning.errors import UsageError

N = 200


def make_rb(n: int = N, *, prioritized: bool = True, seed: int = 0) -> Buffer:
    sampler = PrioritizedSampler(n, alpha=0.8, beta=0.5) if prioritized else RandomSampler()
    rb = Buffer(
        storage=LazyTensorStorage(n), sampler=sampler, generator=torch.Generator().manual_seed(seed)
    )
    ids = torch.arange(n)
    rb.extend(TensorDict({"id": ids, "x": (ids.float() / n).unsqueeze(-1)}, batch_size=[n]))
    return rb


def tree_total(rb: Buffer) -> float:
    return float(rb.sampler._sum_tree.query(0, len(rb)))


class TD(L.LightningModule):
    """A one-weight "Q-network": TD error ``q(x) - x``, priorities ``|error|`` every step."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.q = torch.nn.Linear(1, 1)
        self.lr = lr
        self.seen: list[list[int]] = []
        self.epochs: list[int] = []
        self.val_batches = 0

    def td_error(self, batch: Any) -> torch.Tensor:
        self.seen.append(batch["id"].tolist())
        self.epochs.append(self.current_epoch)
        error = (self.q(batch["x"]) - batch["x"]).squeeze(-1)
        if "index" in batch.keys():
            self.trainer.datamodule.update_priority(batch, error.detach().abs() + 0.01)
        return error

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.td_error(batch).pow(2).mean()
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_batches += 1
        self.log("val_loss", (self.q(batch["x"]) - batch["x"]).pow(2).mean())

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", (self.q(batch["x"]) - batch["x"]).pow(2).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def fit(model: L.LightningModule | None = None, dm: Any = None, **trainer: Any) -> Any:
    model = model if model is not None else TD()
    dm = dm if dm is not None else ReplayBufferDataModule(make_rb(), batch_size=10)
    t = quiet_trainer(**trainer)
    t.fit(model, datamodule=dm)
    return model, dm, t


# -- precision --------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "bf16-true", "64-true"])
def test_precision_priority_updates_take_any_float_type(precision):
    rb = make_rb()
    before = tree_total(rb)
    model, _, trainer = fit(dm=ReplayBufferDataModule(rb, 10), precision=precision, max_steps=3)
    assert trainer.global_step == 3
    assert tree_total(rb) != pytest.approx(before)  # the priorities were written


# -- how long a run is ---------------------------------------------------------------------
def test_max_epochs_counts_buffer_sized_epochs():
    model, dm, _ = fit(max_epochs=2)
    assert model.epochs == [0] * 20 + [1] * 20  # ceil(200 / 10) batches per epoch
    assert dm.batches_served == 40


def test_max_steps_bounds_an_unbounded_stream():
    model, _, trainer = fit(dm=ReplayBufferDataModule(make_rb(), 10, num_batches=None), max_steps=7)
    assert trainer.global_step == len(model.seen) == 7


def test_max_time_bounds_an_unbounded_stream():
    dm = ReplayBufferDataModule(make_rb(), 10, num_batches=None)
    model, _, trainer = fit(dm=dm, max_time={"seconds": 1})
    timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
    assert len(model.seen) > 0 and set(model.epochs) == {0}  # stopped inside the first epoch
    assert timer.time_elapsed("train") >= 1


@pytest.mark.timeout(120)  # accepted, the endless epoch would never end
def test_a_timer_checked_only_at_epoch_ends_does_not_bound_an_unbounded_stream():
    dm = ReplayBufferDataModule(make_rb(), 10, num_batches=None)
    with pytest.raises(UsageError, match="max_time") as err:
        fit(dm=dm, callbacks=[Timer(duration={"seconds": 1}, interval="epoch")])
    assert err.value.argument == "num_batches"


@pytest.mark.parametrize("limit", [3, 0.25])
def test_limit_train_batches(limit):
    model, _, _ = fit(max_epochs=2, limit_train_batches=limit)
    assert len(model.seen) == 2 * (3 if limit == 3 else 5)


def test_limit_val_batches_and_check_val_every_n_epoch():
    dm = ReplayBufferDataModule(make_rb(), 10, val_buffer=make_rb(50))
    model, _, _ = fit(
        dm=dm, max_epochs=4, limit_val_batches=2, check_val_every_n_epoch=2, num_sanity_val_steps=0
    )
    assert model.val_batches == 2 * 2  # epochs 2 and 4, two batches each


def test_val_check_interval_on_an_unbounded_stream():
    dm = ReplayBufferDataModule(make_rb(), 10, num_batches=None, val_buffer=make_rb(50))
    model, _, _ = fit(dm=dm, max_steps=9, val_check_interval=3, num_sanity_val_steps=0)
    assert model.val_batches == 3 * 5  # after steps 3, 6 and 9: the 50-item buffer in 5 batches


def test_fast_dev_run_runs_one_batch_of_an_unbounded_stream():
    dm = ReplayBufferDataModule(make_rb(), 10, num_batches=None, val_buffer=make_rb(50))
    model, _, trainer = fit(dm=dm, fast_dev_run=True)
    assert (len(model.seen), model.val_batches, trainer.global_step) == (1, 1, 1)


def test_reload_dataloaders_every_epoch_continues_the_stream():
    rb = make_rb(prioritized=False)
    model, dm, _ = fit(
        dm=ReplayBufferDataModule(rb, 10), max_epochs=3, reload_dataloaders_every_n_epochs=1
    )
    straight, _, _ = fit(dm=ReplayBufferDataModule(make_rb(prioritized=False), 10), max_epochs=3)
    assert dm.batches_served == 60
    assert model.seen == straight.seen  # a new loader each epoch, the same stream


# -- optimization ------------------------------------------------------------------------------
def test_accumulate_grad_batches():
    model, dm, trainer = fit(max_steps=5, accumulate_grad_batches=4)
    assert trainer.global_step == 5 and dm.batches_served == len(model.seen) == 20


def test_gradient_clip_val_clips_the_steps():
    torch.manual_seed(0)
    model = TD(lr=1.0)
    start = model.q.weight.detach().clone()
    fit(model, max_steps=1, gradient_clip_val=1e-3, gradient_clip_algorithm="value")
    assert (model.q.weight.detach() - start).abs().max() <= 1e-3 + 1e-7


class ManualTD(TD):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(self.td_error(batch).pow(2).mean())
        optimizer.step()


def test_manual_optimization():
    rb = make_rb()
    before = tree_total(rb)
    model, _, trainer = fit(ManualTD(), ReplayBufferDataModule(rb, 10), max_steps=6)
    assert trainer.global_step == len(model.seen) == 6
    assert tree_total(rb) != pytest.approx(before)


# -- what the batches are ------------------------------------------------------------------------
def test_overfit_batches_repeats_the_same_batches_every_epoch():
    model, _, _ = fit(overfit_batches=2, max_epochs=3)
    assert len(model.seen) == 6
    assert model.seen[0:2] == model.seen[2:4] == model.seen[4:6]
    assert model.seen[0] != model.seen[1]


def test_overfit_batches_as_a_fraction():
    model, _, _ = fit(overfit_batches=0.1, max_epochs=2)  # 10% of 20 batches
    assert len(model.seen) == 4 and model.seen[:2] == model.seen[2:]


def test_overfit_batches_as_a_fraction_of_an_endless_epoch_is_refused():
    dm = ReplayBufferDataModule(make_rb(), 10, num_batches=None)
    with pytest.raises(UsageError, match="overfit_batches=<int>") as err:
        fit(dm=dm, overfit_batches=0.5, max_steps=4)
    assert err.value.argument == "overfit_batches"


@pytest.mark.parametrize("use_distributed_sampler", [True, False])
def test_use_distributed_sampler_changes_nothing(use_distributed_sampler):
    model, _, _ = fit(
        dm=ReplayBufferDataModule(make_rb(prioritized=False), 10),
        max_steps=5,
        use_distributed_sampler=use_distributed_sampler,
    )
    reference, _, _ = fit(dm=ReplayBufferDataModule(make_rb(prioritized=False), 10), max_steps=5)
    assert model.seen == reference.seen


def test_deterministic_runs_repeat():
    runs = []
    for _ in range(2):
        L.seed_everything(3)
        model, _, _ = fit(
            TD(), ReplayBufferDataModule(make_rb(seed=3), 10), max_steps=6, deterministic=True
        )
        runs.append((model.seen, model.q.weight.item()))
    assert runs[0] == runs[1]


# -- device placement ------------------------------------------------------------------------------
class OwnTransfer(TD):
    """Moves only the keys it trains on, as a model that overrides the hook means to."""

    def __init__(self) -> None:
        super().__init__()
        self.moved = 0

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        self.moved += 1
        return batch.select("id", "x", "index", "priority_weight").to(device)


def test_a_models_own_transfer_batch_to_device_moves_the_batches():
    model, _, _ = fit(OwnTransfer(), max_steps=4)
    assert model.moved == 4


def test_a_models_own_transfer_hook_and_prefetch_to_device_are_refused_together():
    dm = ReplayBufferDataModule(make_rb(), 10, prefetch_to_device=True)
    with pytest.raises(UsageError, match="transfer_batch_to_device") as err:
        fit(OwnTransfer(), dm, max_steps=2)
    assert err.value.argument == "prefetch_to_device"


# -- tuner ----------------------------------------------------------------------------------------
def test_tuner_scale_batch_size_trains_with_the_size_it_found():
    # A model with a validation_step needs validation data here: Lightning's tuner asks
    # for val_dataloader() whether or not a fit would validate.
    dm = ReplayBufferDataModule(make_rb(), batch_size=2, val_buffer=make_rb(50))
    model = TD()
    trainer = quiet_trainer(max_steps=2)
    found = Tuner(trainer).scale_batch_size(
        model, datamodule=dm, mode="power", max_trials=3, steps_per_trial=1
    )
    assert found == dm.batch_size == 8  # 2 -> 4 -> 8: three trials, all fit
    model.seen.clear()
    trainer.fit(model, datamodule=dm)
    assert [len(ids) for ids in model.seen] == [8, 8]


def test_tuner_lr_find_sets_a_learning_rate():
    model = TD(lr=1e-6)
    dm = ReplayBufferDataModule(make_rb(), 10, num_batches=None, val_buffer=make_rb(50))
    trainer = quiet_trainer(max_steps=30)
    Tuner(trainer).lr_find(model, datamodule=dm, num_training=20, min_lr=1e-4, max_lr=1.0)
    assert model.lr != 1e-6 and 1e-4 <= model.lr <= 1.0


# -- checkpoints ------------------------------------------------------------------------------------
def test_weights_only_checkpoints_hold_no_buffer(tmp_path):
    big = make_rb(50_000)
    dm = ReplayBufferDataModule(big, 10, checkpoint_inline_max_bytes=0)
    weights = ModelCheckpoint(
        tmp_path / "w", save_weights_only=True, every_n_train_steps=2, save_top_k=-1
    )
    full = ModelCheckpoint(tmp_path / "f", every_n_train_steps=4)
    fit(dm=dm, max_steps=4, callbacks=[weights, full])
    files = sorted((tmp_path / "w").iterdir())
    assert [f.name for f in files] == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]  # no .buffer/
    weights_size = files[0].stat().st_size
    assert weights_size < 10_000, weights_size  # two parameters and Lightning's bookkeeping
    assert any(p.name.endswith(".buffer") for p in (tmp_path / "f").iterdir())  # full: kept
    # A weights-only file cannot resume a fit, and says so; test/validate read it fine.
    with pytest.raises(UsageError, match="save_weights_only=True") as err:
        quiet_trainer(max_steps=6).fit(
            TD(), ReplayBufferDataModule(make_rb(), 10), ckpt_path=files[0]
        )
    assert err.value.argument == "ckpt_path"
    tested = ReplayBufferDataModule(make_rb(), 10, test_buffer=make_rb(20))
    (result,) = quiet_trainer().test(TD(), datamodule=tested, ckpt_path=files[0], verbose=False)
    assert math.isfinite(result["test_loss"])


# -- stages without data -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("stage", "argument"),
    [("test", "test_buffer"), ("validate", "val_buffer"), ("predict", "eval_from_model")],
)
def test_a_stage_without_data_names_the_argument(stage, argument):
    class WithPredict(TD):
        def forward(self, x: Any) -> Any:
            return x

        def predict_step(self, batch: Any, batch_idx: int) -> Any:
            return batch

    trainer = quiet_trainer()
    with pytest.raises(UsageError, match=argument) as err:
        getattr(trainer, stage)(WithPredict(), datamodule=ReplayBufferDataModule(make_rb(), 10))
    assert err.value.argument == argument
