"""DataLoader workers on a buffer that the main process keeps writing to (spawn start method)."""

from __future__ import annotations

import threading
import time

import lightning as L
import pytest
import torch
import torch.multiprocessing as mp
from tensordict import TensorDict
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
from trainers import quiet_trainer

from rb_lightning import ReplayBufferDataModule


def rows(start: int, n: int, width: int = 8) -> TensorDict:
    """Rows that prove they were written whole: check == 2 * id + 1 and obs == id."""
    ids = torch.arange(start, start + n)
    return TensorDict(
        {
            "id": ids,
            "check": 2 * ids + 1,
            "obs": ids.float().unsqueeze(-1).expand(n, width).clone(),
        },
        batch_size=[n],
    )


def torn_rows(batch: TensorDict) -> int:
    whole = (batch["check"] == 2 * batch["id"] + 1) & (
        batch["obs"] == batch["id"].float().unsqueeze(-1)
    ).all(-1)
    return int((~whole).sum())


def test_workers_never_read_rows_before_they_are_written(workers_from_a_forkserver):
    # torchrl publishes a new length before copying the rows; without a shared lock, a spawned
    # worker reads never-written rows (0-80 per 64k reads here). The DataModule installs it.
    rb = ReplayBuffer(storage=LazyTensorStorage(60_000))
    rb.extend(rows(0, 100, width=128))
    dm = ReplayBufferDataModule(rb, batch_size=256, num_batches=None, num_workers=1)
    dm.setup("fit")  # as Lightning does before it asks for a loader
    assert rb.shared, "num_workers>0 must share the buffer's write lock with the workers"
    batches = iter(dm.train_dataloader())
    next(batches)  # workers are up
    written, stop = [100], threading.Event()

    def collector() -> None:
        while not stop.is_set() and written[0] < 59_000:
            rb.extend(rows(written[0], 1_000, width=128))
            written[0] += 1_000
            time.sleep(0.003)

    thread = threading.Thread(target=collector)
    thread.start()
    torn, newest = 0, 0
    try:
        for _, batch in zip(range(300), batches, strict=False):
            torn += torn_rows(batch)
            newest = max(newest, int(batch["id"].max()))
    finally:
        stop.set()
        thread.join()
    assert torn == 0
    assert newest >= 1_000, "workers did not see rows written after they started"


class _RecordIds(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.ids: list[tuple[int, list[int]]] = []

    def training_step(self, batch, batch_idx):
        self.ids.append((self.current_epoch, batch["id"].tolist()))
        assert torn_rows(batch) == 0
        return self.layer(batch["obs"]).mean()

    def on_train_epoch_end(self) -> None:
        # A collector writing after the first epoch: persistent workers must see it.
        if self.current_epoch == 0:
            self.trainer.datamodule.replay_buffer.extend(rows(100, 100))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_persistent_memmap_workers_across_epochs_see_new_rows(tmp_path, workers_from_a_forkserver):
    rb = ReplayBuffer(storage=LazyMemmapStorage(1_000, scratch_dir=tmp_path))
    rb.extend(rows(0, 100))
    dm = ReplayBufferDataModule(
        rb, batch_size=32, num_batches=4, num_workers=2, persistent_workers=True
    )
    module = _RecordIds()
    trainer = quiet_trainer(
        max_epochs=3,
    )
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 12
    per_epoch = {e: [i for ep, ids in module.ids if ep == e for i in ids] for e in range(3)}
    assert [len(v) for v in per_epoch.values()] == [128, 128, 128]
    # Rows 100-199 were written after the workers started; with 128 draws from 200 rows,
    # missing them all has probability < 2**-100.
    assert max(per_epoch[0]) < 100
    assert max(per_epoch[1]) >= 100
    # Epochs 1 and 2 sample the same 200 rows: the same worker seeds would replay epoch 1.
    assert per_epoch[1] != per_epoch[2], "persistent workers replayed the previous epoch"
    batches = [tuple(ids) for _, ids in module.ids]
    assert len(set(batches)) == len(batches), "two workers or two epochs drew the same batch"


@pytest.fixture
def fork_start_method():
    previous = mp.get_start_method(allow_none=True)
    mp.set_start_method("fork", force=True)
    yield
    mp.set_start_method(previous, force=True)


def test_fork_with_private_memory_storage_is_refused(fork_start_method):
    # Forked workers share the length counter but not the rows: they would read garbage.
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    rb.extend(rows(0, 10))
    with pytest.raises(ValueError, match="fork start method"):
        ReplayBufferDataModule(rb, batch_size=4, num_workers=2)
    rb.storage._storage.share_memory_()
    ReplayBufferDataModule(rb, batch_size=4, num_workers=2)  # shared rows are fine


def test_list_storage_under_fork_is_allowed_as_a_snapshot(fork_start_method, list_rb):
    ReplayBufferDataModule(list_rb, batch_size=4, num_workers=2)
